"""The request lifecycle over a scripted engine: every request is settled exactly once with
what the engine produced, however it ends, and a refusal holds nothing."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from vllm import SamplingParams

from app.errors import BadRequestError
from app.quota import MemoryBackend, Reservation
from app.serving.preparation.generation import collect
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import (
    TENANT,
    ServeFactory,
    chat,
    eventually,
    quota_usage,
    sse_events,
)


async def test_a_finished_request_is_charged_what_it_used(serve: ServeFactory) -> None:
    engine = ScriptedEngine()
    async with serve(engine) as served:
        await served.set_quota(token_budget=100_000, budget_period="day", max_concurrent_requests=4)
        async with served.client() as client:
            response = await client.post("/v1/chat/completions", json=chat(served, max_tokens=7))
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        assert usage["completion_tokens"] == 7
        await served.settled()
        level = await quota_usage(served)
        assert level.concurrent == 0
        assert level.budget_used == usage["total_tokens"]
        [record] = await served.usage_records()
        assert (record.status, record.completion_tokens) == ("ok", 7)
        assert record.prompt_tokens == usage["prompt_tokens"]


async def test_a_settlement_that_fails_is_logged_not_raised_into_the_request(
    serve: ServeFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The in-memory backend settles in place, in the request's settlement: its failure must
    # not cost the request its answer or its usage record.
    async def broken(self: MemoryBackend, reservation: Reservation, actual_tokens: int) -> None:
        raise RuntimeError("broken")

    monkeypatch.setattr(MemoryBackend, "_reconcile", broken)
    async with serve(ScriptedEngine()) as served:
        await served.set_quota(max_concurrent_requests=4)
        async with served.client() as client:
            response = await client.post("/v1/chat/completions", json=chat(served, max_tokens=3))
        assert response.status_code == 200, response.text
        await served.settled()
        [record] = await served.usage_records()
        assert (record.status, record.completion_tokens) == ("ok", 3)
    assert "could not settle reservation" in caplog.text


async def test_choices_of_n_are_merged_by_index(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served, served.client() as client:
        body = chat(served, max_tokens=5, n=3)
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        choices = response.json()["choices"]
        assert [c["index"] for c in choices] == [0, 1, 2]
        assert all(len(c["message"]["content"]) == 5 for c in choices)
        assert all(c["finish_reason"] == "length" for c in choices)
        assert response.json()["usage"]["completion_tokens"] == 15


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_leaves_is_charged_what_was_produced(
    serve: ServeFactory, stream: bool
) -> None:
    engine = ScriptedEngine(step_seconds=0.01)
    async with serve(engine) as served:
        await served.set_quota(token_budget=100_000, budget_period="day", max_concurrent_requests=1)
        async with served.client() as client:
            body = chat(served, max_tokens=5000, stream=stream)
            call = asyncio.create_task(client.post("/v1/chat/completions", json=body))
            await eventually(lambda: engine.requests and engine.started()[0].produced >= 20)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        request = engine.started()[0]
        await eventually(lambda: request.closed)
        await served.settled()
        assert request.aborted and request.produced < 5000
        [record] = await served.usage_records()
        assert record.status == "cancelled"
        assert record.completion_tokens == request.produced
        level = await quota_usage(served)
        assert level.concurrent == 0
        assert level.budget_used == record.prompt_tokens + request.produced
        assert served.samples("lora_gateway_requests_total", tenant=TENANT, status="cancelled") == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_leaves_is_charged_what_chunks_held_back(
    serve: ServeFactory, stream: bool
) -> None:
    """Chunks of ``stream_interval`` tokens, every choice of ``n``: the tokens each choice
    produced and held back for its next chunk when the client left are charged too."""
    engine = ScriptedEngine(step_seconds=0.001)
    async with serve(engine, max_stream_interval=1000) as served:
        await served.set_quota(token_budget=1_000_000, budget_period="day")
        async with served.client() as client:
            body = chat(
                served,
                max_tokens=5000,
                n=8,
                ignore_eos=True,
                stream_interval=1000,
                stream=stream,
            )
            call = asyncio.create_task(client.post("/v1/chat/completions", json=body))
            await eventually(lambda: engine.requests and engine.started()[0].produced >= 20)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        request = engine.started()[0]
        await eventually(lambda: request.closed)
        await served.settled()
        assert request.aborted and 20 <= request.produced < 1000
        [record] = await served.usage_records()
        assert record.status == "cancelled"
        assert record.completion_tokens == 8 * request.produced
        level = await quota_usage(served)
        assert level.budget_used == record.prompt_tokens + 8 * request.produced


async def test_a_stream_the_client_stopped_reading_is_charged_in_full(
    serve: ServeFactory,
) -> None:
    """The client stops reading, the server's writes block, then the client leaves: the
    tokens the engine produced meanwhile, never sent, are charged too."""
    engine = ScriptedEngine()
    async with serve(engine) as served:
        await served.set_quota(
            token_budget=10_000_000, budget_period="day", max_concurrent_requests=1
        )
        body = json.dumps(chat(served, max_tokens=1_000_000, stream=True)).encode()
        host, port = served.base_url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {served.key}\r\n".encode()
            + b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await eventually(lambda: bool(engine.requests))
        request = engine.started()[0]
        # Writes block once the socket buffers are full: the engine runs ahead of the reader.
        await eventually(lambda: request.produced > request.read + 1000, timeout=30)
        sock.close()
        await eventually(lambda: request.closed)
        await served.settled()
        assert request.aborted
        [record] = await served.usage_records()
        assert record.completion_tokens == request.produced
        level = await quota_usage(served)
        assert level.concurrent == 0
        assert level.budget_used == record.prompt_tokens + request.produced


async def test_a_bad_token_prompt_is_refused_and_holds_nothing(serve: ServeFactory) -> None:
    engine = ScriptedEngine()
    async with serve(engine) as served:
        await served.set_quota(max_concurrent_requests=1)
        async with served.client() as client:
            for prompt in ([-1], [2**70], [256]):
                body = {"model": served.model, "prompt": prompt, "echo": True, "stream": True}
                response = await client.post("/v1/completions", json=body)
                assert response.status_code == 400, response.text
                assert response.json()["error"]["param"] == "prompt"
            ok = await client.post("/v1/completions", json={"model": served.model, "prompt": [1]})
        assert ok.status_code == 200, ok.text
        assert len(engine.requests) == 1
        assert (await quota_usage(served)).concurrent == 0


async def test_rate_limited_requests_are_refused_before_tokenisation(
    serve: ServeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = ScriptedEngine()
    async with serve(engine) as served:
        await served.set_quota(requests_per_minute=1)
        async with served.client() as client:
            first = await client.post("/v1/chat/completions", json=chat(served, max_tokens=2))
            assert first.status_code == 200
            encoded: list[str] = []
            monkeypatch.setattr(engine.tokenizer, "encode", lambda text, **_: encoded.append(text))
            refused = await client.post("/v1/chat/completions", json=chat(served, max_tokens=2))
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert encoded == []
        assert len(engine.requests) == 1
        assert (
            served.samples(
                "lora_gateway_requests_total", tenant=TENANT, status="rate_limit_exceeded"
            )
            == 1
        )


async def test_unknown_models_are_counted_without_their_name(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served, served.client() as client:
        body = chat(served, max_tokens=2) | {"model": "someone-elses-adapter"}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 404
        assert served.samples("lora_gateway_requests_total", model="(unknown)") == 1
        assert served.samples("lora_gateway_requests_total", model="someone-elses-adapter") == 0


async def test_an_engine_failure_mid_stream_is_one_error_event(serve: ServeFactory) -> None:
    engine = ScriptedEngine(fail_after=3)
    async with serve(engine) as served:
        await served.set_quota(max_concurrent_requests=1)
        async with served.client() as client:
            body = chat(served, max_tokens=50, stream=True)
            response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
        events = sse_events(response.text)
        assert events[-1] == "[DONE]"
        assert events[-2]["error"]["type"] == "server_error"
        assert sum(1 for e in events[:-2] if e["choices"][0]["delta"].get("content")) == 3
        await served.settled()
        [record] = await served.usage_records()
        assert (record.status, record.completion_tokens) == ("error", 3)
        assert record.fault == "version"  # counts against the version's rollback rule
        assert (await quota_usage(served)).concurrent == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_an_end_the_engine_calls_an_error_is_a_500_charged_what_it_produced(
    serve: ServeFactory, stream: bool
) -> None:
    engine = ScriptedEngine(last_finish_reason="error")
    async with serve(engine) as served:
        await served.set_quota(max_concurrent_requests=1)
        async with served.client() as client:
            body = chat(served, max_tokens=4, stream=stream)
            response = await client.post("/v1/chat/completions", json=body)
        if stream:
            events = sse_events(response.text)
            error = events[-2]["error"]
        else:
            assert response.status_code == 500
            error = response.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "generation_failed")
        await served.settled()
        [record] = await served.usage_records()
        assert (record.status, record.completion_tokens) == ("error", 4)
        # A grammar the engine gave up on is the request's doing, not the version's.
        assert record.fault == "request"
        assert (await quota_usage(served)).concurrent == 0


async def test_an_engine_refusal_is_a_400_and_holds_nothing(serve: ServeFactory) -> None:
    engine = ScriptedEngine(fail_after=0, error=BadRequestError("bad", param="seed"))
    async with serve(engine) as served:
        await served.set_quota(max_concurrent_requests=1)
        async with served.client() as client:
            response = await client.post("/v1/chat/completions", json=chat(served, max_tokens=5))
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "seed"
        await served.settled()
        assert (await quota_usage(served)).concurrent == 0
        [record] = await served.usage_records()
        assert (record.status, record.fault) == ("error", "request")


async def test_a_long_request_keeps_its_concurrency_lease(serve: ServeFactory) -> None:
    engine = ScriptedEngine(step_seconds=0.01)
    # Renewed every second: a busy machine's stalls of the event loop stay well within it.
    async with serve(engine, quota_lease_seconds=3.0) as served:
        await served.set_quota(max_concurrent_requests=1)
        async with served.client() as client:
            body = chat(served, max_tokens=500, stream=True)
            call = asyncio.create_task(client.post("/v1/chat/completions", json=body))
            await eventually(lambda: bool(engine.requests))
            await asyncio.sleep(3.5)  # past the lease it took: only renewals keep it
            assert not engine.started()[0].finished
            assert (await quota_usage(served)).concurrent == 1
            second = await client.post("/v1/chat/completions", json=chat(served, max_tokens=1))
            assert second.status_code == 429
            assert (await call).status_code == 200


async def test_collect_merges_deltas_of_each_choice() -> None:
    engine = ScriptedEngine()
    outputs = engine.generate([1, 2], SamplingParams(n=2, max_tokens=300), "r", None)
    choices = await collect(outputs, 2)
    assert [len(c.token_ids) for c in choices] == [300, 300]
    assert choices[0].text == choices[1].text and len(choices[0].text) == 300
    assert choices[0].finish_reason == "length"
