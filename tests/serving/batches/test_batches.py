"""The Batch API through the real app over a scripted engine, as the official ``openai``
client calls it: a batch runs to ``completed``, every line once in its output in OpenAI's
line shape, billed once in the ledger (marked with its batch); engine failures go to the
error file; each malformed line fails the batch before anything runs, its line named;
another tenant's batch is a 404; cancel and expiry settle what ran."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types import Batch

from app.quota import Limits
from app.store.batches import BatchStore
from app.store.changes import StoreVersion
from bench.random_adapters import make_random_adapter
from tests.support.batches import FAST_BATCHES, FINAL, chat_line, finished, read_jsonl, submitted
from tests.support.responses import client
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, Served, ServeFactory, eventually, quota_usage

OTHER = "tenant-b"


def strict(batch: Any) -> Batch:
    return Batch.model_validate(batch.to_dict())


async def test_a_batch_runs_every_line_once_and_bills_it_once(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(), **FAST_BATCHES) as served:
        api = client(served)
        lines = [chat_line(f"req-{i}", served.model, max_tokens=3) for i in range(12)]
        created = strict(await submitted(api, lines))
        assert created.status == "validating" and created.completion_window == "24h"
        batch = strict(await finished(api, created.id))
        assert batch.status == "completed", batch
        assert batch.request_counts is not None
        assert (batch.request_counts.total, batch.request_counts.completed) == (12, 12)
        assert batch.request_counts.failed == 0 and batch.error_file_id is None
        assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
        assert batch.output_file_id is not None
        output = read_jsonl((await api.files.content(batch.output_file_id)).read())
        assert [line["custom_id"] for line in output] == [f"req-{i}" for i in range(12)]
        for line in output:
            assert line["error"] is None and line["response"]["status_code"] == 200
            body = line["response"]["body"]
            assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 3
        output_file = await api.files.retrieve(batch.output_file_id)
        assert output_file.purpose == "batch_output"

        # Each line billed once, marked with its batch, and run at the batch class.
        records = await served.usage_records()
        assert sorted(r.request_id for r in records) == sorted(
            f"{batch.id}-{n}" for n in range(1, 13)
        )
        assert {r.batch_id for r in records} == {batch.id}
        assert {r.completion_tokens for r in records} == {3}
        listed = await api.batches.list()
        assert [b.id for b in listed.data] == [batch.id]

        # The usage API tells batch lines from online requests.
        await api.chat.completions.create(
            model=served.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        await served.settled()

        async def usage(**params: Any) -> list[dict[str, Any]]:
            query = {"start_time": int(time.time()) - 600, **params}
            async with served.client() as http:
                page = (await http.get("/v1/organization/usage/completions", params=query)).json()
            return [result for bucket in page["data"] for result in bucket["results"]]

        [batch_only] = await usage(batch="true")
        assert (batch_only["num_model_requests"], batch_only["output_tokens"]) == (12, 36)
        [online_only] = await usage(batch="false")
        assert (online_only["num_model_requests"], online_only["output_tokens"]) == (1, 2)
        grouped = {r["batch"]: r["num_model_requests"] for r in await usage(group_by="batch")}
        assert grouped == {True: 12, False: 1}


async def test_each_alias_runs_on_its_version_at_the_batchs_creation_named_in_each_line(
    serve: ServeFactory, tiny_model_dir: Path
) -> None:
    engine = ScriptedEngine()
    # No poll comes by itself: the batch is validated when the test says, after the split
    # has moved.
    async with serve(engine, batch_poll_seconds=3600) as served:
        for seed in (1, 2):
            make_random_adapter(
                tiny_model_dir, served.settings.adapter_root / f"helper-{seed}", rank=4,
                target_modules=("q_proj",), seed=seed,
            )  # fmt: skip
            await served.admin("POST", "/adapters", {"name": "helper", "path": f"helper-{seed}"})
        split = f"/tenants/{TENANT}/adapters/helper"
        await served.admin("PUT", split, {"adapter": "helper", "versions": {"1": 1000, "2": 0}})
        api = client(served)
        lines = [chat_line(f"q-{i}", "helper", max_tokens=2) for i in range(3)]
        created = await submitted(api, lines)
        await served.admin("PUT", split, {"adapter": "helper", "versions": {"1": 0, "2": 1000}})
        await served.gateway.batch_runner.take_new()
        batch = await finished(api, created.id)
        assert batch.status == "completed" and batch.output_file_id is not None
        output = read_jsonl((await api.files.content(batch.output_file_id)).read())
        assert [line["response"]["headers"] for line in output] == [{"x-adapter-version": "1"}] * 3
        assert [run.adapter.version for run in engine.requests.values()] == [1, 1, 1]  # type: ignore[union-attr]
        # A batch held to version 2 that a rollback takes away before the batch ran: drawn
        # again when it is validated, every line on the version the alias serves then.
        created = await submitted(api, lines)
        await served.admin("PUT", split, {"adapter": "helper", "version": 1})
        await served.gateway.batch_runner.take_new()
        batch = await finished(api, created.id)
        assert batch.status == "completed" and batch.output_file_id is not None
        output = read_jsonl((await api.files.content(batch.output_file_id)).read())
        assert [line["response"]["headers"] for line in output] == [{"x-adapter-version": "1"}] * 3
        await served.admin("PUT", split, {"adapter": "helper", "versions": {"1": 0, "2": 1000}})
        # Online, the alias has moved on.
        async with served.client() as http:
            answer = await http.post(
                "/v1/chat/completions",
                json={
                    "model": "helper",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2,
                },
            )
        assert answer.headers["x-adapter-version"] == "2"


async def test_a_batchs_lines_for_one_adapter_run_together(
    serve: ServeFactory, tiny_model_dir: Path
) -> None:
    engine = ScriptedEngine()
    async with serve(engine, batch_concurrency=1, **FAST_BATCHES) as served:
        make_random_adapter(
            tiny_model_dir, served.settings.adapter_root / "helper", rank=4,
            target_modules=("q_proj",), seed=1,
        )  # fmt: skip
        await served.admin("POST", "/adapters", {"name": "helper", "path": "helper"})
        await served.admin("PUT", f"/tenants/{TENANT}/adapters/helper", {"adapter": "helper"})
        api = client(served)
        models = ["helper", served.model] * 4
        lines = [chat_line(f"q-{i}", model, max_tokens=1) for i, model in enumerate(models)]
        batch = await finished(api, (await submitted(api, lines)).id)
        assert batch.status == "completed"
        ran = [run.adapter is not None for run in engine.requests.values()]
        assert sorted(ran) == sorted(m == "helper" for m in models)
        assert sum(a != b for a, b in itertools.pairwise(ran)) == 1  # one change


async def test_two_replicas_run_a_batch_once_between_them(serve: ServeFactory) -> None:
    first, second = ScriptedEngine(step_seconds=0.01), ScriptedEngine(step_seconds=0.01)
    async with serve(first, **FAST_BATCHES) as one, serve(second, **FAST_BATCHES) as two:
        api = client(one)
        lines = [chat_line(f"req-{i}", one.model, max_tokens=2) for i in range(12)]
        batches = [await submitted(api, lines) for _ in range(2)]
        for created in batches:
            batch = await finished(client(two), created.id)  # read on either replica
            assert batch.status == "completed" and batch.output_file_id is not None
            output = read_jsonl((await api.files.content(batch.output_file_id)).read())
            assert [line["custom_id"] for line in output] == [f"req-{i}" for i in range(12)]
        # Every line of both batches ran once, on one replica or the other, and was billed once.
        assert len(first.requests) + len(second.requests) == 24
        await one.settled()
        await two.settled()
        records = await one.usage_records()
        assert sorted(r.request_id for r in records) == sorted(
            f"{b.id}-{n}" for b in batches for n in range(1, 13)
        )


async def test_engine_failures_go_to_the_error_file(serve: ServeFactory) -> None:
    engine = ScriptedEngine(fail_after=1)
    async with serve(engine, **FAST_BATCHES) as served:
        api = client(served)
        batch = await finished(
            api, (await submitted(api, [chat_line("only", served.model, max_tokens=4)])).id
        )
        assert batch.status == "completed"
        assert batch.request_counts is not None and batch.request_counts.failed == 1
        assert batch.output_file_id is None and batch.error_file_id is not None
        [line] = read_jsonl((await api.files.content(batch.error_file_id)).read())
        assert line["custom_id"] == "only"
        assert line["response"]["status_code"] == 500
        assert line["response"]["body"]["error"]["type"] == "server_error"
        # Billed once, what it produced, as an error.
        [record] = await served.usage_records()
        assert (record.status, record.batch_id) == ("error", batch.id)


MALFORMED: list[tuple[Any, str, str | None]] = [
    (b"{not json", "invalid_json_line", None),
    (
        {"method": "POST", "url": "/v1/chat/completions", "body": {}},
        "missing_required_parameter",
        "custom_id",
    ),
    ("dup", "duplicate_custom_id", "custom_id"),
    (
        {"custom_id": "m", "method": "GET", "url": "/v1/chat/completions", "body": {}},
        "invalid_method",
        "method",
    ),
    (
        {"custom_id": "u", "method": "POST", "url": "/v1/completions", "body": {}},
        "invalid_url",
        "url",
    ),
    ([1, 2], "invalid_json_line", None),  # JSON, not an object
    (
        {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions"},
        "invalid_request",
        "body",
    ),
    (
        {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": "hi"},
        "invalid_request",
        "body",
    ),
    ("no-messages", "invalid_request", "body.messages"),
    ("stream", "invalid_request", "body.stream"),
    ("unknown-model", "model_not_found", "body.model"),
    ("bad-temperature", "invalid_request", "body.temperature"),
]


def malformed_line(served: Served, case: Any) -> Any:
    if case == "dup":
        return chat_line("good", served.model)
    if case == "no-messages":
        line = chat_line("nm", served.model)
        del line["body"]["messages"]
        return line
    if case == "stream":
        return chat_line("s", served.model, stream=True)
    if case == "unknown-model":
        return chat_line("x", "no-such-model")
    if case == "bad-temperature":
        return chat_line("t", served.model, temperature=9)
    return case


@pytest.mark.parametrize(("case", "code", "param"), MALFORMED)
async def test_a_malformed_line_fails_the_batch_naming_it(
    serve: ServeFactory, case: Any, code: str, param: str | None
) -> None:
    async with serve(ScriptedEngine(), **FAST_BATCHES) as served:
        api = client(served)
        lines = [chat_line("good", served.model), malformed_line(served, case)]
        batch = await finished(api, (await submitted(api, lines)).id)
        assert batch.status == "failed"
        assert batch.errors is not None and batch.errors.data is not None
        [error] = batch.errors.data
        assert (error.line, error.code, error.param) == (2, code, param), error
        assert batch.failed_at and batch.output_file_id is None
        assert served.engine.requests == {}, "nothing ran"
        assert await served.usage_records() == []


async def test_a_file_of_blank_lines_fails_the_batch_as_empty(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(), **FAST_BATCHES) as served:
        api = client(served)
        uploaded = await api.files.create(file=("blank.jsonl", b"\n \n\n"), purpose="batch")
        created = await api.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        batch = await finished(api, created.id)
        assert batch.status == "failed" and batch.errors is not None
        assert [(e.code, e.line) for e in batch.errors.data or []] == [("empty_file", None)]


async def test_another_tenants_batch_is_a_404_like_an_unknown_one(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(), **FAST_BATCHES) as served:
        api = client(served)
        mine = await submitted(api, [chat_line("a", served.model, max_tokens=2)])
        await served.admin("POST", "/tenants", {"id": OTHER, "name": "B", "allow_base_model": True})
        key = (await served.admin("POST", f"/tenants/{OTHER}/keys", {"name": "k"}))["key"]
        theirs = openai.AsyncOpenAI(base_url=f"{served.base_url}/v1", api_key=key, max_retries=0)
        messages = []
        for batch_id in (mine.id, "batch_" + "0" * 32):
            for call in (theirs.batches.retrieve, theirs.batches.cancel):
                with pytest.raises(openai.NotFoundError) as refused:
                    await call(batch_id)
                messages.append(refused.value.message.replace(batch_id, "<id>"))
        assert len(set(messages)) == 1
        assert (await theirs.batches.list()).data == []
        # Nor can it batch another tenant's file.
        with pytest.raises(openai.NotFoundError):
            await theirs.batches.create(
                input_file_id=mine.input_file_id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )


async def test_cancel_aborts_lines_in_flight_and_keeps_what_finished(serve: ServeFactory) -> None:
    engine = ScriptedEngine(step_seconds=0.05)
    async with serve(engine, batch_concurrency=2, **FAST_BATCHES) as served:
        api = client(served)
        lines = [chat_line("fast", served.model, max_tokens=1)]
        lines += [chat_line(f"slow-{i}", served.model, max_tokens=100_000) for i in range(4)]
        created = await submitted(api, lines)
        await finished(api, created.id, frozenset({"in_progress"}))

        # The first line finished, and two slow ones are producing tokens.
        def two_under_way() -> bool:
            requests = served.engine.requests.values()
            return sum(1 for r in requests if not r.finished and r.produced > 0) == 2

        await eventually(two_under_way)
        cancelling = await api.batches.cancel(created.id)
        assert cancelling.status in ("cancelling", "cancelled")
        batch = await finished(api, created.id)
        assert batch.status == "cancelled" and batch.cancelled_at
        assert batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 4)
        [done] = read_jsonl((await api.files.content(batch.output_file_id)).read())  # type: ignore[arg-type]
        assert done["custom_id"] == "fast"
        errors = read_jsonl((await api.files.content(batch.error_file_id)).read())  # type: ignore[arg-type]
        assert sorted(e["custom_id"] for e in errors) == [f"slow-{i}" for i in range(4)]
        assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
        # The aborted lines in flight are billed what they produced; the unrun ones nothing.
        records = {r.request_id: r for r in await served.usage_records()}
        assert len(records) == 3  # the fast line and the two in flight
        aborted = [r for r in records.values() if r.status == "cancelled"]
        assert len(aborted) == 2 and all(r.completion_tokens > 0 for r in aborted)


async def test_a_batch_past_its_window_expires_with_its_unrun_lines(serve: ServeFactory) -> None:
    engine = ScriptedEngine(step_seconds=0.05)
    async with serve(
        engine, batch_concurrency=1, batch_window_seconds=1.0, **FAST_BATCHES
    ) as served:
        api = client(served)
        lines = [chat_line("first", served.model, max_tokens=1)]
        lines += [chat_line(f"late-{i}", served.model, max_tokens=100_000) for i in range(3)]
        batch = await finished(api, (await submitted(api, lines)).id)
        assert batch.status == "expired" and batch.expired_at
        assert batch.request_counts is not None
        assert batch.request_counts.completed + batch.request_counts.failed == 4
        errors = read_jsonl((await api.files.content(batch.error_file_id)).read())  # type: ignore[arg-type]
        done = []
        if batch.output_file_id is not None:  # the first line, unless the window passed first
            done = read_jsonl((await api.files.content(batch.output_file_id)).read())
            assert [line["custom_id"] for line in done] == ["first"]
        assert len(done) == batch.request_counts.completed
        late = [e for e in errors if e["custom_id"].startswith("late-")]
        assert sorted(e["custom_id"] for e in late) == [f"late-{i}" for i in range(3)]
        assert {e["error"]["code"] for e in errors} == {"batch_expired"}
        assert all(e["response"] is None for e in errors)
        # A finished batch cannot be cancelled.
        with pytest.raises(openai.BadRequestError):
            await api.batches.cancel(batch.id)


async def test_a_finalizing_batch_cannot_be_cancelled(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(), batch_poll_seconds=3600) as served:  # no runner looks
        api = client(served)
        created = await submitted(api, [chat_line("a", served.model, max_tokens=1)])
        store = served.gateway.batches.store
        assert await store.move(created.id, "finalizing", only_from=("validating",))  # all ran
        with pytest.raises(openai.BadRequestError) as refused:
            await api.batches.cancel(created.id)
        assert "finalizing" in refused.value.message
        assert (await api.batches.retrieve(created.id)).status == "finalizing"


async def test_enqueued_batch_tokens_are_capped_by_the_tenants_quota(
    serve: ServeFactory,
) -> None:
    engine = ScriptedEngine(step_seconds=0.05)
    async with serve(engine, batch_concurrency=1, **FAST_BATCHES) as served:
        api = client(served)
        quota = f"/tenants/{TENANT}/quota"
        await served.admin("PUT", quota, {"batch_tokens_enqueued": 1000})
        # Lines that could use more than the limit at worst fail the batch at validation.
        lines = [chat_line(f"big-{i}", served.model, max_tokens=1000) for i in range(2)]
        batch = await finished(api, (await submitted(api, lines)).id)
        assert batch.status == "failed" and batch.errors is not None
        [error] = batch.errors.data or []
        assert (error.code, error.param) == ("token_limit_exceeded", "batch_tokens_enqueued")
        assert served.engine.requests == {}

        # Within it, a batch runs; while its unrun lines are at the limit, no batch is created.
        await served.admin("PUT", quota, {"batch_tokens_enqueued": 10**6})
        lines = [chat_line(f"long-{i}", served.model, max_tokens=100_000) for i in range(2)]
        running = await submitted(api, lines)
        await finished(api, running.id, frozenset({"in_progress"}))
        await served.admin("PUT", quota, {"batch_tokens_enqueued": 100})
        with pytest.raises(openai.RateLimitError) as refused:
            await submitted(api, [chat_line("more", served.model)])
        assert "batch_tokens_enqueued" in refused.value.message
        await api.batches.cancel(running.id)
        assert (await finished(api, running.id)).status == "cancelled"


async def test_batches_validated_at_once_never_pass_the_enqueued_limit_together(
    serve: ServeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = BatchStore.start

    async def slow_start(self: BatchStore, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.5)  # a loaded store: the other batch's check comes meanwhile
        return await start(self, *args, **kwargs)

    monkeypatch.setattr(BatchStore, "start", slow_start)
    engine = ScriptedEngine(step_seconds=0.05)
    # The runner looks for batches seldom: both are validated in the same turn.
    async with serve(engine, batch_concurrency=1, batch_poll_seconds=2.0) as served:
        api = client(served)
        await served.admin("PUT", f"/tenants/{TENANT}/quota", {"batch_tokens_enqueued": 150_000})
        lines = [chat_line(f"long-{i}", served.model, max_tokens=50_000) for i in range(2)]
        ids = [(await submitted(api, lines)).id for _ in range(2)]
        batches = [await finished(api, i, FINAL | {"in_progress"}) for i in ids]
        assert sorted(b.status for b in batches) == ["failed", "in_progress"], "each fits alone"
        [refused] = [b for b in batches if b.status == "failed"]
        assert refused.errors is not None
        assert [e.code for e in refused.errors.data or []] == ["token_limit_exceeded"]
        for batch in batches:
            if batch.status == "in_progress":
                await api.batches.cancel(batch.id)
                assert (await finished(api, batch.id)).status == "cancelled"


async def test_a_crash_between_keeping_and_recording_the_output_leaves_nothing_counted(
    serve: ServeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashes: list[str] = []
    move = BatchStore.move

    async def crashing_once(self: BatchStore, batch_id: str, status: str, **kw: Any) -> bool:
        if status == "completed" and not crashes:
            crashes.append(batch_id)
            raise RuntimeError("the replica dies after keeping the output file")
        return await move(self, batch_id, status, **kw)

    monkeypatch.setattr(BatchStore, "move", crashing_once)
    async with serve(ScriptedEngine(), **FAST_BATCHES) as served:
        api = client(served)
        lines = [chat_line(f"req-{i}", served.model, max_tokens=3) for i in range(3)]
        batch = await finished(api, (await submitted(api, lines)).id)
        assert crashes == [batch.id] and batch.status == "completed"
        assert batch.output_file_id is not None
        files = [f async for f in api.files.list()]
        assert sorted(f.id for f in files) == sorted([batch.input_file_id, batch.output_file_id])
        tenant = served.gateway.registry.tenant(TENANT)
        assert tenant is not None
        used = await served.gateway.files.store.storage_used(tenant.uid)
        assert used == sum(f.bytes for f in files), "no orphan output file is counted"


async def test_a_batch_whose_input_file_was_deleted_fails(serve: ServeFactory) -> None:
    # No poll comes by itself: the runner looks once the file is deleted.
    async with serve(ScriptedEngine(), batch_poll_seconds=3600) as served:
        api = client(served)
        created = await submitted(api, [chat_line("a", served.model)])
        await api.files.delete(created.input_file_id)
        await served.gateway.batch_runner.take_new()
        batch = await finished(api, created.id)
        assert batch.status == "failed" and batch.errors is not None
        [error] = batch.errors.data or []
        assert (error.code, error.param) == ("invalid_file", "input_file_id")


async def test_a_replica_looks_for_batches_again_only_after_a_commit(
    serve: ServeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks: list[int] = []
    active_ids = BatchStore.active_ids

    async def counted(self: BatchStore, version: StoreVersion | None = None) -> list[str]:
        looks.append(1)
        return await active_ids(self, version)

    monkeypatch.setattr(BatchStore, "active_ids", counted)
    # No poll comes by itself: the test looks.
    async with serve(ScriptedEngine(), batch_poll_seconds=3600) as served:
        runner = served.gateway.batch_runner
        assert runner.store_version is not None and runner.store_version.current() is not None
        await runner.take_new()
        found_none = len(looks)
        await runner.take_new()
        await runner.take_new()
        assert len(looks) == found_none  # no batch, and no commit since: no query
        api = client(served)
        created = await submitted(api, [chat_line("a", served.model, max_tokens=2)])
        await runner.take_new()
        assert len(looks) == found_none + 1
        assert (await finished(api, created.id)).status == "completed"


def responses_line(custom_id: str, model: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": model, "input": "hi", "max_output_tokens": 3, **body},
    }


async def test_a_responses_batch_runs_and_refuses_background_lines(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(), **FAST_BATCHES) as served:
        api = client(served)
        lines = [responses_line("r-0", served.model), responses_line("r-1", served.model)]
        batch = await finished(api, (await submitted(api, lines, "/v1/responses")).id)
        assert batch.status == "completed" and batch.output_file_id is not None
        output = read_jsonl((await api.files.content(batch.output_file_id)).read())
        assert [line["custom_id"] for line in output] == ["r-0", "r-1"]
        assert {line["response"]["body"]["object"] for line in output} == {"response"}
        assert {line["response"]["body"]["status"] for line in output} == {"incomplete"}

        lines = [
            responses_line("ok", served.model),
            responses_line("bg", served.model, background=True),
        ]
        batch = await finished(api, (await submitted(api, lines, "/v1/responses")).id)
        assert batch.status == "failed" and batch.errors is not None
        [error] = batch.errors.data or []
        assert (error.line, error.param) == (2, "body.background")


async def test_lines_skip_the_per_minute_limits_but_pay_the_token_budget(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine(), **FAST_BATCHES) as served:
        api = client(served)
        tokens_per_minute = 60
        await served.set_quota(
            requests_per_minute=1, tokens_per_minute=tokens_per_minute, token_budget=10**6,
            budget_period="day",
        )  # fmt: skip
        lines = [chat_line(f"l-{i}", served.model, max_tokens=2) for i in range(8)]
        batch = await finished(api, (await submitted(api, lines)).id)
        assert batch.status == "completed", batch
        assert batch.request_counts is not None and batch.request_counts.completed == 8
        await served.settled()
        records = await served.usage_records()
        used = await quota_usage(served)
        spent = sum(r.prompt_tokens + r.completion_tokens for r in records)
        assert used.budget_used == spent > tokens_per_minute
        # The tenant's one interactive request a minute, and its tokens a minute, are still
        # its own.
        await api.chat.completions.create(
            model=served.model, messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
        with pytest.raises(openai.RateLimitError):
            await api.chat.completions.create(
                model=served.model, messages=[{"role": "user", "content": "hi"}], max_tokens=1
            )


async def test_a_line_cut_off_runs_again_and_its_lost_attempt_is_charged_nothing(
    serve: ServeFactory,
) -> None:
    engine = ScriptedEngine(step_seconds=0.05)
    # No poll comes by itself: the test drives the batch.
    async with serve(engine, batch_concurrency=2, batch_poll_seconds=3600) as served:
        budget = Limits(token_budget=10**6, budget_period="day")
        await served.set_quota(token_budget=budget.token_budget, budget_period="day")
        api = client(served)
        lines = [chat_line(f"req-{i}", served.model, max_tokens=6) for i in range(4)]
        created = await submitted(api, lines)
        # A replica killed while it ran line 1 left its reservation open (a quota store
        # outlives the replica): its worst case stays charged, and it is in no one's way.
        tenant = served.gateway.registry.tenant(TENANT)
        assert tenant is not None
        killed = [(tenant.quota_subject, budget)]
        await served.gateway.quota.reserve(killed, 50, f"{created.id}-1")
        runner = served.gateway.batch_runner
        await runner.take_new()
        # This replica's drive of the batch stops with lines in flight (as when its lease is
        # lost): they are not committed, and run again once the batch is driven again.
        await eventually(lambda: bool(served.engine.requests))
        runner._driven[created.id].cancel()
        await eventually(lambda: created.id not in runner._driven)
        assert (await api.batches.retrieve(created.id)).status == "in_progress"
        await runner.take_new()
        batch = await finished(api, created.id)
        assert batch.status == "completed", batch
        assert batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (4, 0)
        await served.settled()
        records = await served.usage_records()
        assert sorted(r.request_id for r in records) == [f"{batch.id}-{n}" for n in range(1, 5)]
        used = await quota_usage(served)
        billed = sum(r.prompt_tokens + r.completion_tokens for r in records)
        assert used.budget_used == billed + 50, "the attempts cut off here are charged nothing"
