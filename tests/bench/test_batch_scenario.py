"""Scenario (f), batches, without a server: the batch's lines and file, the records read back
from its output and error files, the capacity a load leaves, the targets' verdicts, the
command line, and the open loop that stops sending when told."""

from __future__ import annotations

import asyncio
import json

import pytest

from bench.batch_workload import (
    BatchSizes,
    batch_file,
    batch_line,
    batch_records,
    custom_id,
    index_of,
)
from bench.batches import parse, probe_plan, render
from bench.client import CHAT_PATH, Call, RequestRecord, run_workload
from bench.config import (
    BATCH_ALONE,
    BATCH_BESIDE,
    BATCH_ONLINE,
    CAPACITY_LEFT,
    GATEWAY,
    INTERACTIVE_WITH,
    INTERACTIVE_WITHOUT,
)
from bench.stats import BATCH_ALONE_TPS, BATCH_SHARE_TPS, SATURATION_TPS, Sample
from bench.targets import evaluate_batches
from bench.workload import PROMPTS, PlannedRequest
from tests.bench.stream_server import serving


def model_of(planned: PlannedRequest) -> str:
    return "base" if planned.adapter is None else f"bench-{planned.adapter:03d}"


def test_the_batch_lines_are_as_mixes_prompts_with_their_own_output_tokens() -> None:
    sizes = BatchSizes(lines=300, line_tokens=3)
    lines = sizes.batch_plan()
    assert [p.index for p in lines] == list(range(300))
    assert {p.max_tokens for p in lines} == {3}
    assert {p.prompt for p in lines} <= set(PROMPTS)
    adapters = [p.adapter for p in lines]
    # (a)'s mix: a share of base-model lines, Zipf popularity (adapter 0 the most asked).
    assert 0.1 < adapters.count(None) / 300 < 0.3
    assert adapters.count(0) > adapters.count(5) > 0
    assert lines == sizes.batch_plan()  # seeded: every round uploads the same file
    # Not the interactive requests over again.
    interactive = sizes.saturation_plan()
    assert [p.adapter for p in lines[:20]] != [p.adapter for p in interactive[:20]]
    assert {p.max_tokens for p in interactive} == {32}


def test_the_interactive_arrivals_change_by_round_at_the_rate_given() -> None:
    sizes = BatchSizes()
    first, second = sizes.interactive_plan(2.0, 100.0, 0), sizes.interactive_plan(2.0, 100.0, 1)
    assert first != second
    assert 150 < len(first) < 250 and all(p.at < 100.0 for p in first)


@pytest.mark.parametrize(
    "change",
    [{"lines": 0}, {"line_tokens": 0}, {"load": 0.0}, {"load": 1.0}, {"online_concurrency": 0}],
)
def test_sizes_refuse_what_cannot_run(change: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BatchSizes(**change)  # type: ignore[arg-type]


def test_a_line_is_the_online_request_unstreamed() -> None:
    planned = PlannedRequest(7, 0.0, 2, 2, "Say hi.", 4)
    line = batch_line(planned, "bench-002")
    assert line == {
        "custom_id": "line-00007",
        "method": "POST",
        "url": CHAT_PATH,
        "body": {
            "model": "bench-002",
            "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 4,
            "temperature": 0.0,
            "ignore_eos": True,
        },
    }
    assert "stream" not in line["body"]
    assert index_of(custom_id(1234)) == 1234 and index_of("other-1") is None


def test_the_file_has_one_json_line_per_planned_line() -> None:
    lines = BatchSizes(lines=5).batch_plan()
    text = batch_file(lines, model_of).decode()
    parsed = [json.loads(raw) for raw in text.splitlines()]
    assert [p["custom_id"] for p in parsed] == [custom_id(i) for i in range(5)]
    assert [p["body"]["model"] for p in parsed] == [model_of(p) for p in lines]
    assert text.endswith("\n")


def _answer(index: int, tokens: int) -> str:
    body = {
        "object": "chat.completion",
        "usage": {"prompt_tokens": 20, "completion_tokens": tokens},
    }
    return json.dumps(
        {"id": f"batch_req_{index}", "custom_id": custom_id(index),
         "response": {"status_code": 200, "request_id": "r", "body": body}, "error": None}
    )  # fmt: skip


def test_records_read_back_one_per_line_with_their_tokens_and_errors() -> None:
    lines = BatchSizes(lines=4, line_tokens=4).batch_plan()
    failed = json.dumps(
        {"id": "batch_req_x", "custom_id": custom_id(2),
         "response": {"status_code": 500, "body": {"error": {"message": "engine failed"}}},
         "error": None}
    )  # fmt: skip
    output = "\n".join([_answer(0, 4), _answer(1, 4), _answer(1, 4)]) + "\n"
    records = batch_records(GATEWAY, BATCH_ALONE, lines, model_of, output, failed + "\n")
    assert [r.index for r in records] == [0, 1, 2, 3]
    assert records[0].ok and records[0].output_tokens == 4 and records[0].prompt_tokens == 20
    assert records[0].model == model_of(lines[0])
    assert records[1].error == "came back 2 times"  # each line comes back exactly once
    assert records[2].error == "HTTP 500: engine failed" and records[2].output_tokens == 0
    assert records[3].error == "came back 0 times"


def test_an_expired_line_in_the_error_file_is_an_error() -> None:
    lines = BatchSizes(lines=1).batch_plan()
    expired = json.dumps(
        {"id": "batch_req_y", "custom_id": custom_id(0), "response": None,
         "error": {"code": "batch_expired", "message": "not run"}}
    )  # fmt: skip
    [record] = batch_records(GATEWAY, BATCH_ALONE, lines, model_of, "", expired)
    assert record.error == "HTTP None: not run"


def records(
    point: str, count: int, tokens: int, ttft: float, tpot: float
) -> tuple[RequestRecord, ...]:
    return tuple(
        RequestRecord(
            GATEWAY, point, i, 0, "m", 0.0, 0.0, ttft=ttft * (1 + i / count),
            itl=[tpot] * (tokens - 1), e2e=1.0, output_tokens=tokens, status=200,
        )
        for i in range(count)
    )  # fmt: skip


def test_the_capacity_left_is_the_batch_alones_rate_times_the_share_the_load_leaves() -> None:
    load = records(INTERACTIVE_WITH, 10, 32, 0.1, 0.05)  # 320 tokens over 10 s: 32 tok/s
    counters = {BATCH_ALONE_TPS: 40.0, SATURATION_TPS: 128.0}
    left = Sample(GATEWAY, CAPACITY_LEFT, 0, load, 10.0, counters)
    assert BATCH_SHARE_TPS.of(left) == pytest.approx(40.0 * (1 - 32 / 128))
    # Without the counters, the figure is the sample's own output tok/s.
    assert BATCH_SHARE_TPS.of(Sample(GATEWAY, BATCH_BESIDE, 0, load, 10.0)) == pytest.approx(32)


def run(
    *, with_ttft: float = 0.1, with_tpot: float = 0.05, beside_wall: float = 40.0,
    alone_wall: float = 20.0, batch_errors: int = 0,
) -> list[Sample]:  # fmt: skip
    """Three rounds: 200 lines of 4 tokens (800 tokens), (a) at 128 tok/s saturation and the
    load at 32 tok/s: the capacity left is 3/4 of the batch alone's output tok/s."""
    samples = []
    for r in range(3):
        jitter = 1 + (r - 1) * 0.01
        batch = records(BATCH_ALONE, 200, 4, 0.0, 0.0)
        failed = tuple(
            RequestRecord(GATEWAY, BATCH_BESIDE, i, 0, "m", 0.0, error="HTTP 500")
            for i in range(batch_errors)
        )
        load = records(INTERACTIVE_WITH, 40, 32, with_ttft * jitter, with_tpot)
        alone_tps = 800 / (alone_wall * jitter)
        samples += [
            Sample(GATEWAY, BATCH_ONLINE, r, records(BATCH_ONLINE, 200, 4, 0.1, 0.01), 20.0),
            Sample(GATEWAY, BATCH_ALONE, r, batch, alone_wall * jitter),
            Sample(GATEWAY, BATCH_BESIDE, r, batch[batch_errors:] + failed, beside_wall),
            Sample(GATEWAY, INTERACTIVE_WITHOUT, r, records("x", 40, 32, 0.1, 0.05), 40.0),
            Sample(GATEWAY, INTERACTIVE_WITH, r, load, 40.0),
            Sample(GATEWAY, CAPACITY_LEFT, r, load, 40.0,
                   {BATCH_ALONE_TPS: alone_tps, SATURATION_TPS: 128.0}),
        ]  # fmt: skip
    return samples


def verdicts(samples: list[Sample]) -> dict[str, str]:
    return {t.name.split(":")[0]: t.verdict for t in evaluate_batches(samples, 0, 200)}


def test_all_four_met() -> None:
    results = evaluate_batches(run(), 0, 200)
    assert [t.name.split(":")[0] for t in results] == [
        "batches.ttft", "batches.tpot", "batches.share", "batches.alone",
    ]  # fmt: skip
    assert [t.verdict for t in results] == ["met"] * 4
    # The batch beside the load: 800 tokens in 40 s = 20 tok/s, against 3/4 of 40 tok/s.
    share = results[2].estimate
    assert share is not None and share.median == pytest.approx(20 / 30, rel=0.02)
    alone = results[3].estimate
    assert alone is not None and alone.median == pytest.approx(1.0, rel=0.02)


def test_a_slowed_load_and_a_starved_batch_miss() -> None:
    got = verdicts(run(with_ttft=0.2, with_tpot=0.06, beside_wall=100.0, alone_wall=25.0))
    # TTFT 2x (> 1.25x), TPOT 1.2x (> 1.15x), the share 8 / 24 tok/s, alone 0.8x the online.
    assert got == {n: "missed" for n in ("batches.ttft", "batches.tpot", "batches.share",
                                         "batches.alone")}  # fmt: skip


def test_a_failed_batch_line_misses_the_batch_targets_but_not_the_loads() -> None:
    got = verdicts(run(batch_errors=1))
    assert got["batches.share"] == "missed" and got["batches.alone"] == "missed"
    assert got["batches.ttft"] == "met" and got["batches.tpot"] == "met"


def test_alone_only_judges_the_batch_alone_and_reports_no_load() -> None:
    samples = [s for s in run() if s.point in (BATCH_ONLINE, BATCH_ALONE)]
    assert verdicts(samples) == {
        "batches.ttft": "not measured", "batches.tpot": "not measured",
        "batches.share": "not measured", "batches.alone": "met",
    }  # fmt: skip
    context = {
        "command": "python -m bench.batches --alone-only", "started": "now", "wall_seconds": 1.0,
        "machine": "m", "sizes": "s", "rate": None, "load": 0.5, "alone_seconds": "20, 20, 20",
        "beside_seconds": "-", "seed": 0, "draws": 200,
    }  # fmt: skip
    text, targets = render(samples, context)
    assert "no interactive load (`--alone-only`)" in text and len(targets) == 4
    assert f"| {BATCH_ALONE} |" in text and f"| {INTERACTIVE_WITH} |" not in text
    assert parse(["--alone-only"]).alone_only and not parse([]).alone_only


def test_the_probes_are_the_interactive_arrivals_cut_to_one_token() -> None:
    sizes = BatchSizes()
    probes, load = probe_plan(sizes, 0.5, 100.0, 1), sizes.interactive_plan(0.5, 100.0, 1)
    assert [(p.at, p.adapter, p.prompt) for p in probes] == [
        (p.at, p.adapter, p.prompt) for p in load
    ]
    assert probes and {p.max_tokens for p in probes} == {1}
    assert parse(["--alone-only", "--probe-rate", "0.2"]).probe_rate == 0.2
    assert parse([]).probe_rate == 0.0


def test_nothing_measured_is_not_measured() -> None:
    assert set(verdicts([]).values()) == {"not measured"}


def test_the_command_line_sets_the_sizes() -> None:
    config = parse(["--quick", "--batch-lines", "500", "--line-tokens", "2", "--rounds", "3"])
    assert (config.sizes.lines, config.sizes.line_tokens, config.rounds) == (500, 2, 3)
    assert parse([]).sizes.lines == 2000 and parse([]).rounds == 3
    assert parse(["--quick"]).sizes.lines == 50
    # The issue's lines: (a)'s output tokens, as its interactive requests have.
    assert parse([]).sizes.line_tokens == parse([]).sizes.output_tokens == 32
    with pytest.raises(SystemExit):
        parse(["--load", "1.5"])
    settings = parse(["--gateway-settings", "BATCH_CONCURRENCY=64"]).gateway_settings
    assert settings == (("BATCH_CONCURRENCY", "64"),)
    with pytest.raises(SystemExit):
        parse(["--gateway-settings", "BATCH_CONCURRENCY"])


async def test_an_open_loop_stops_sending_once_told() -> None:
    # Two arrivals at once, the rest a minute later: told to stop when the first answer
    # comes, the loop sends no more (and does not wait for the later arrivals).
    planned = [PlannedRequest(i, 0.0 if i < 2 else 60.0 + i, 0, None, "hi", 2) for i in range(9)]
    until = asyncio.Event()
    async for server, url in serving(0.01):
        sent, _ = await run_workload(
            url, "s", "p", planned, lambda _: Call("base", None), drain_seconds=10,
            on_finished=lambda _: until.set(), until=until,
        )  # fmt: skip
        assert [r.index for r in sent] == [0, 1]
        assert all(r.ok for r in sent) and server.served == 2
