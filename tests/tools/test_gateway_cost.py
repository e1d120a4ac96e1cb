"""The gateway-cost tool: its engine paces tokens as asked, and a small run over HTTP
measures a real gateway process and writes its figures."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import pytest
from vllm import RequestOutput, SamplingParams

from tests.support.servers import free_port
from tools.gateway_cost.__main__ import Phase, main, per_token_us
from tools.gateway_cost.engine import PacedEngine
from tools.gateway_cost.load import PhaseResult, run_phase
from tools.gateway_cost.upstream import Steps, serve_upstream


async def read_all(engine: PacedEngine, request_id: str, max_tokens: int) -> list[RequestOutput]:
    params = SamplingParams(max_tokens=max_tokens)
    return [output async for output in engine.generate([1, 2], params, request_id, None)]


async def test_every_request_gets_its_tokens_one_per_step_at_the_rate_asked() -> None:
    engine = PacedEngine(tokens_per_second=400)
    started = time.monotonic()
    first, second = await asyncio.gather(read_all(engine, "a", 20), read_all(engine, "b", 20))
    elapsed = time.monotonic() - started
    await engine.close()
    for outputs in (first, second):
        assert [len(o.outputs[0].token_ids) for o in outputs] == [1] * 20
        assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "length"
        assert not any(o.finished for o in outputs[:-1])
    # 40 tokens at 400/s: a tenth of a second, one step at a time.
    assert elapsed >= 0.09
    assert engine.steps == 20


@pytest.mark.parametrize(
    ("engine_interval", "request_interval", "sizes"),
    [
        (4, None, [1, 4, 4, 4, 4, 3]),  # the first token at once, then four at a time
        (4, 8, [1, 8, 8, 3]),  # a request raises the engine's interval
        (4, 2, [1, 4, 4, 4, 4, 3]),  # and never lowers it
    ],
)
async def test_outputs_gather_the_stream_interval_as_vllms_do(
    engine_interval: int, request_interval: int | None, sizes: list[int]
) -> None:
    engine = PacedEngine(tokens_per_second=10_000, stream_interval=engine_interval)
    params = SamplingParams(max_tokens=20, stream_interval=request_interval)
    outputs = [output async for output in engine.generate([1], params, "r", None)]
    await engine.close()
    assert [len(o.outputs[0].token_ids) for o in outputs] == sizes
    assert [o.finished for o in outputs] == [False] * (len(sizes) - 1) + [True]


async def test_a_slow_reader_gets_merged_outputs_and_an_abort_ends_the_stream() -> None:
    engine = PacedEngine(tokens_per_second=10_000)
    stream = engine.generate([1], SamplingParams(max_tokens=1000), "slow", None)
    first = await anext(stream)
    while engine.steps < 10:
        await asyncio.sleep(0.001)
    merged = await anext(stream)
    assert len(first.outputs[0].token_ids) == 1
    assert len(merged.outputs[0].token_ids) >= 9
    assert merged.outputs[0].text == "".join(
        chr(ord("a") + t % 26) for t in merged.outputs[0].token_ids
    )
    await engine.abort("slow")
    rest = [output async for output in stream]
    assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
    assert engine.num_unfinished_requests() == 0
    await engine.close()


def test_a_token_costs_what_a_long_request_adds_over_a_short_one() -> None:
    def phase(max_tokens: int, cpu_seconds: float) -> Phase:
        result = PhaseResult(
            requests=100, completion_tokens=100 * max_tokens, events=0, wall_seconds=1
        )
        return Phase(16, "", max_tokens, cpu_seconds, cpu_seconds / 2, result)

    # 1 ms a request; 63 more tokens at 20 us each.
    short, long = phase(1, 0.1), phase(64, 0.1 + 100 * 63 * 20e-6)
    assert short.cpu_per_request_us == pytest.approx(1000)
    assert per_token_us(short, long) == pytest.approx(20)


# Not the engine, but a gateway process of its own (vLLM's imports): too slow for test-fast.
@pytest.mark.slow
def test_a_small_run_measures_the_gateway_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--streams",
        "2",
        "--rounds",
        "2",
        "--tokens",
        "8",
        "--requests",
        "8",
        "--rate",
        "4000",
        "--idle-seconds",
        "0.5",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    [written] = tmp_path.glob("*.json")
    report = json.loads(written.read_text())
    assert set(report["results"]) == {"2"}
    phases = report["phases"]
    # rounds x (short, long; through the gateway, the engine alone, the reference server,
    # and Responses through the gateway)
    assert len(phases) == 2 * 8
    assert {phase["kind"] for phase in phases} == {
        "short", "long", "engine alone, short", "engine alone, long",
        "reference, short", "reference, long", "Responses, short", "Responses, long",
    }  # fmt: skip
    for phase in phases:
        assert phase["result"]["requests"] == 8
        assert phase["result"]["completion_tokens"] == 8 * phase["max_tokens"]
    for figures in report["results"].values():
        assert figures["request_us"]["min"] <= figures["request_us"]["median"]
        assert figures["request_us"]["median"] <= figures["request_us"]["max"]
        assert "own_token_us" in figures
        # Each a ratio, though a run this short may read no CPU of the reference's.
        assert {"all_in_ratio", "responses_request_ratio", "responses_token_ratio"} <= set(figures)
    assert "Responses / chat" in capsys.readouterr().out


# A gateway process of its own too, and two of the engine alone: too slow for test-fast.
@pytest.mark.slow
def test_a_small_traced_run_reads_tracings_cost_from_phases_of_its_own_size(
    tmp_path: Path,
) -> None:
    # Two rounds: the untraced gateway's streams open first in one, the traced one's in the
    # other, and each phase is still read as its own gateway's.
    argv = ["--streams", "2", "--rounds", "2", "--tokens", "4", "--requests", "4"]
    argv += ["--tracing", "--tracing-requests", "6", "--no-reference", "--no-responses"]
    assert main([*argv, "--idle-seconds", "0.2", "--out", str(tmp_path)]) == 0
    [written] = tmp_path.glob("*.json")
    report = json.loads(written.read_text())
    kinds = [(phase["kind"], phase["result"]["requests"]) for phase in report["phases"]]
    assert kinds == 2 * [
        ("short", 4), ("long", 4), ("engine alone, short", 4), ("engine alone, long", 4),
        ("untraced, beside traced, short", 6), ("traced, short", 6), ("traced, long", 4),
    ]  # fmt: skip
    assert report["settings"]["tracing_requests"] == 6
    assert report["spans_received"] > 0
    assert "tracing_request_us" in report["results"]["2"]


@pytest.mark.parametrize(
    ("server_interval", "request_interval", "content_events"),
    [(1, None, 20), (4, None, 6), (1, 4, 6), (4, 8, 4)],  # 1 + 4 x 4 + 3, 1 + 8 + 8 + 3
)
async def test_the_front_s_upstream_paces_its_streams_and_counts_every_chunk(
    server_interval: int, request_interval: int | None, content_events: int
) -> None:
    steps = Steps(rate=400)
    port = free_port()
    server = asyncio.create_task(serve_upstream(port, steps, server_interval))
    try:
        for _ in range(100):
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            await asyncio.sleep(0.02)
        body = json.dumps(
            {
                "model": "m@v1",
                "messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": 20,
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            }
            | ({"stream_interval": request_interval} if request_interval else {})
        ).encode()
        request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        started = time.monotonic()
        # Two streams of two requests each, on kept-alive connections.
        result = await run_phase("127.0.0.1", port, request, streams=2, requests_per_stream=2)
        elapsed = time.monotonic() - started
    finally:
        server.cancel()
    assert result.requests == 4 and result.completion_tokens == 80
    # role + the tokens' chunks + usage + [DONE] per request, each with its usage so far
    assert result.events == 4 * (content_events + 3)
    assert elapsed >= 80 / 400 * 0.9  # 80 tokens at 400 tokens/s in all
