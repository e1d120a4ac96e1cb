"""A version the engine cannot load, met in a shadow run (the scripted engine, with the real
app): the tenant's answer is its own version's, the candidate is audited and marked
unservable, and a later request pinned to it is refused before the engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

from vllm import RequestOutput, SamplingParams

from app.engine.base import AdapterLoadFailed
from app.tenancy.adapters import Adapter
from bench.random_adapters import make_random_adapter
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, ServeFactory, chat, eventually


class BrokenVersionEngine(ScriptedEngine):
    """Version 2 fails to load, as :mod:`app.inside_vllm.load_failures` ends it in vLLM."""

    def __init__(self) -> None:
        super().__init__()
        self.load_failures = 0

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        adapter: Adapter | None,
        cache_salt: str | None = None,
        on_abandoned: Callable[[RequestOutput], None] | None = None,
        trace_headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        if adapter is not None and adapter.version == 2:
            self.load_failures += 1
            raise AdapterLoadFailed("Error while deserializing header: header too large")
        async for output in super().generate(
            prompt_token_ids, params, request_id, adapter, cache_salt, on_abandoned
        ):
            yield output


async def test_a_shadow_that_fails_to_load_marks_its_version_and_the_tenant_is_answered(
    serve: ServeFactory, tiny_model_dir: Path
) -> None:
    engine = BrokenVersionEngine()
    async with serve(engine) as served, served.client() as client:
        for seed in (1, 2):
            make_random_adapter(
                tiny_model_dir,
                served.settings.adapter_root / f"helper-{seed}",
                rank=4,
                target_modules=("q_proj",),
                seed=seed,
            )
            await served.admin("POST", "/adapters", {"name": "helper", "path": f"helper-{seed}"})
        grant = {"adapter": "helper", "version": 1, "shadow": {"version": 2, "percent": 100}}
        await served.admin("PUT", f"/tenants/{TENANT}/adapters/helper", grant)

        body = {**chat(served, max_tokens=3), "model": "helper"}
        answer = await client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200 and answer.headers["x-adapter-version"] == "1"
        await eventually(lambda: engine.load_failures == 1)

        await served.settled(timeout=60)  # the shadow run, and the mark it spawned
        versions = (await served.admin("GET", "/adapters/helper"))["versions"]
        assert [v["unservable"] is not None for v in versions] == [False, True]
        audit = await served.admin("GET", "/audit?action=adapter.unservable")
        assert [(r["actor"], r["target"]) for r in audit["data"]] == [("engine", "helper@v2")]
        assert "header too large" in audit["data"][0]["detail"]

        # A shadow of it is dropped, and a request pinned to it is refused before the engine.
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        pinned = {"adapter": "helper", "version": 2}
        await served.admin("PUT", f"/tenants/{TENANT}/adapters/helper", pinned)
        refused = await client.post("/v1/chat/completions", json=body)
        assert refused.status_code == 500
        error = refused.json()["error"]
        assert error["code"] == "adapter_unservable" and "`helper`" in error["message"]
        assert "header too large" not in error["message"]
        assert engine.load_failures == 1
