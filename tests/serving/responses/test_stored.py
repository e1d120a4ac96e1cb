"""Stored responses: read, listed and deleted by the tenant that made them alone (another
tenant's id is a 404 exactly like an unknown one), continued on any replica from the shared
store, on the adapter version that answered the chain, and refused before anything runs when
the chain outgrows the model's context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import Engine, event

from app.store import responses as stored_responses
from bench.random_adapters import make_random_adapter
from tests.support.responses import client, other_tenants_key, strict
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, Served, ServeFactory, eventually


def register_versions(served_root: Path, model_dir: Path) -> None:
    for seed in (1, 2):
        make_random_adapter(
            model_dir, served_root / f"helper-{seed}", rank=4, target_modules=("q_proj",), seed=seed
        )


async def create(served: Served, **fields: Any) -> dict[str, Any]:
    async with served.client() as http:
        body = {"model": served.model, "input": "hi", "max_output_tokens": 3, **fields}
        answer = await http.post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def test_retrieve_list_and_delete_a_stored_response(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served:
        tenant = client(served)
        messages = [{"role": "user", "content": f"part {n}"} for n in range(3)]
        created = await tenant.responses.create(
            model=served.model, input=messages, max_output_tokens=2, metadata={"run": "7"}
        )
        retrieved = strict(await tenant.responses.retrieve(created.id))
        assert retrieved.to_dict() == strict(created).to_dict()
        assert retrieved.metadata == {"run": "7"}

        first = await tenant.responses.input_items.list(created.id, limit=2, order="asc")
        assert [item.content[0].text for item in first.data] == ["part 0", "part 1"]  # type: ignore[union-attr]
        assert first.has_more and first.first_id == first.data[0].id
        assert first.last_id == first.data[1].id
        rest = await tenant.responses.input_items.list(
            created.id, limit=2, order="asc", after=first.last_id
        )
        assert [item.content[0].text for item in rest.data] == ["part 2"]  # type: ignore[union-attr]
        assert not rest.has_more
        newest_first = await tenant.responses.input_items.list(created.id)
        assert [i.id for i in newest_first.data] == [i.id for i in [*first.data, *rest.data]][::-1]

        await tenant.responses.delete(created.id)
        with pytest.raises(openai.NotFoundError):
            await tenant.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            await tenant.responses.delete(created.id)


async def test_store_false_keeps_nothing(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served:
        created = await create(served, store=False)
        assert created["store"] is False
        with pytest.raises(openai.NotFoundError):
            await client(served).responses.retrieve(created["id"])


async def test_another_tenants_response_is_not_found_like_an_unknown_one(
    serve: ServeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A young id missed is looked for again until it is this old (it may be on its way from
    # another replica): not found, after that, whoever's it is.
    monkeypatch.setattr(stored_responses, "ARRIVAL_WAIT", 0.05)
    async with serve(ScriptedEngine()) as served:
        created = await create(served)
        theirs, unknown = created["id"], "resp_" + "0" * 32
        key = await other_tenants_key(served)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=served.base_url, headers=headers) as other:
            for method, path, body in [
                ("GET", "/v1/responses/{}", None),
                ("DELETE", "/v1/responses/{}", None),
                ("GET", "/v1/responses/{}/input_items", None),
                ("POST", "/v1/responses", {"previous_response_id": "{}"}),
            ]:
                answers = []
                for response_id in (theirs, unknown):
                    sent = None
                    if body is not None:
                        sent = {
                            "model": served.model,
                            "input": "hi",
                            "previous_response_id": response_id,
                        }
                    answer = await other.request(method, path.format(response_id), json=sent)
                    answers.append((answer.status_code, answer.text.replace(response_id, "ID")))
                assert answers[0] == answers[1] and answers[0][0] == 404, (method, path)
        # Still there for its own tenant.
        assert strict(await client(served).responses.retrieve(theirs)).id == theirs
        assert len(served.engine.requests) == 1


async def test_a_chain_continues_on_another_replica(serve: ServeFactory) -> None:
    first_engine, second_engine = ScriptedEngine(), ScriptedEngine()
    async with serve(first_engine) as first, serve(second_engine) as second:
        started = await create(first, input="The code word is mango.")
        continued = await create(
            second, input="What was the code word?", previous_response_id=started["id"]
        )
        assert continued["previous_response_id"] == started["id"]
        [request] = second_engine.requests.values()
        prompt = second_engine.tokenizer.decode(request.prompt_token_ids)
        answer = started["output"][0]["content"][0]["text"]
        assert prompt.index("mango") < prompt.index(answer) < prompt.index("What was")
        # Read on the first replica, which did not run it.
        assert strict(await client(first).responses.retrieve(continued["id"])).id == continued["id"]


async def test_a_chain_stays_on_its_adapter_version(
    serve: ServeFactory, tiny_model_dir: Path
) -> None:
    engine = ScriptedEngine()
    async with serve(engine) as served, served.client() as http:
        register_versions(served.settings.adapter_root, tiny_model_dir)
        for seed in (1, 2):
            await served.admin("POST", "/adapters", {"name": "helper", "path": f"helper-{seed}"})
        grant = f"/tenants/{TENANT}/adapters/helper"
        await served.admin("PUT", grant, {"adapter": "helper", "version": 1})
        body = {"model": "helper", "input": "hi", "max_output_tokens": 2}
        started = await http.post("/v1/responses", json=body)
        assert started.headers["x-adapter-version"] == "1"

        # The split sends every new request to version 2; the chain stays on version 1.
        await served.admin("PUT", grant, {"adapter": "helper", "versions": {"1": 0, "2": 100}})
        chained = {**body, "previous_response_id": started.json()["id"]}
        continued = await http.post("/v1/responses", json=chained)
        fresh = await http.post("/v1/responses", json=body)
        assert continued.headers["x-adapter-version"] == "1"
        assert fresh.headers["x-adapter-version"] == "2"
        # A background response runs on the version drawn when it is created, named then.
        queued = await http.post("/v1/responses", json={**body, "background": True})
        assert queued.headers["x-adapter-version"] == "2"
        await eventually(lambda: len(engine.requests) == 4)
        ran = [request.adapter.version for request in engine.requests.values()]  # type: ignore[union-attr]
        assert ran == [1, 1, 2, 2]

        # Version 1 gone from the alias: continuing its chain is refused, naming the field,
        # in the background too, before it is accepted.
        await served.admin("PUT", grant, {"adapter": "helper", "version": 2})
        for background in ({}, {"background": True}):
            refused = await http.post("/v1/responses", json={**chained, **background})
            assert refused.status_code == 400
            assert refused.json()["error"]["param"] == "previous_response_id"
        assert len(engine.requests) == 4


async def test_a_chain_is_read_with_one_query(serve: ServeFactory) -> None:
    engine = ScriptedEngine()
    async with serve(engine) as served:
        previous = (await create(served, input="turn 0"))["id"]
        for turn in (1, 2):
            previous = (await create(served, input=f"turn {turn}", previous_response_id=previous))[
                "id"
            ]
        await served.gateway.responses.written()  # read from the store, not this replica's memory
        reads: list[str] = []

        def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            # The chain's reads (the tenant's stored bytes are a total of their own).
            if "stored_responses" in statement and statement.lstrip().startswith("SELECT"):
                reads.append(statement)

        bind = served.gateway.sessions.kw["bind"].sync_engine
        event.listen(bind, "before_cursor_execute", count)
        try:
            await create(served, input="turn 3", previous_response_id=previous)
        finally:
            event.remove(bind, "before_cursor_execute", count)
        assert len(reads) == 1
        last = engine.started()[-1]
        prompt = engine.tokenizer.decode(last.prompt_token_ids)
        assert [prompt.index(f"turn {n}") for n in range(4)] == sorted(
            prompt.index(f"turn {n}") for n in range(4)
        )


async def test_a_chain_past_the_context_is_refused_before_it_runs(serve: ServeFactory) -> None:
    engine = ScriptedEngine(max_model_len=256)
    async with serve(engine) as served:
        started = await create(served, input="x" * 120)
        async with served.client() as http:
            body = {
                "model": served.model,
                "input": "y" * 120,
                "previous_response_id": started["id"],
            }
            refused = await http.post("/v1/responses", json=body)
            # In the background, refused the same before it is accepted: nothing queued.
            in_background = await http.post("/v1/responses", json={**body, "background": True})
        for answer in (refused, in_background):
            assert answer.status_code == 400
            error = answer.json()["error"]
            assert (error["code"], error["param"]) == ("context_length_exceeded", "input")
        assert len(engine.requests) == 1
        tenant = served.gateway.registry.tenant(TENANT)
        assert tenant is not None
        queued = f"resp_{in_background.headers['x-request-id']}"
        assert await served.gateway.responses.get(tenant.uid, queued) is None


async def test_storing_a_response_is_one_write(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served:
        writes: list[str] = []  # a statement's first word for each row it writes

        def count(
            _conn: Any, _cursor: Any, statement: str, rows: Any, _context: Any, many: bool
        ) -> None:
            if "stored_responses" in statement and not statement.lstrip().startswith("SELECT"):
                writes.extend([statement.split()[0]] * (len(rows) if many else 1))

        # Any engine's: the store writes through a connection of its own.
        event.listen(Engine, "before_cursor_execute", count)
        try:
            await create(served)
            await create(served, store=False)
            async with served.client() as http:
                body = {"model": served.model, "input": "hi", "max_output_tokens": 3}
                streamed = await http.post("/v1/responses", json={**body, "stream": True})
            assert "response.completed" in streamed.text or "response.incomplete" in streamed.text
            await served.gateway.responses.written()
        finally:
            event.remove(Engine, "before_cursor_execute", count)
        assert writes == ["INSERT", "INSERT"]
