"""Rollouts in the ``all`` role, over the scripted engine: the engine runs each request with
the version the response header and the ledger name, and a shadow runs the request again on
its candidate, in spare capacity, never answered nor billed."""

from __future__ import annotations

from pathlib import Path

from bench.random_adapters import make_random_adapter
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, ServeFactory, chat, eventually


def register_versions(served_root: Path, model_dir: Path) -> None:
    for seed in (1, 2):
        make_random_adapter(
            model_dir, served_root / f"helper-{seed}", rank=4, target_modules=("q_proj",), seed=seed
        )


async def test_the_engine_runs_the_version_in_the_header_and_shadows_unseen(
    serve: ServeFactory, tiny_model_dir: Path
) -> None:
    engine = ScriptedEngine()
    async with serve(engine) as served, served.client() as client:
        register_versions(served.settings.adapter_root, tiny_model_dir)
        for seed in (1, 2):
            await served.admin("POST", "/adapters", {"name": "helper", "path": f"helper-{seed}"})
        grant = {"adapter": "helper", "version": 1, "shadow": {"version": 2, "percent": 100}}
        await served.admin("PUT", f"/tenants/{TENANT}/adapters/helper", grant)
        await served.set_quota(token_budget=10**6, budget_period="day")

        body = {**chat(served, max_tokens=3), "model": "helper", "stream": True}
        answer = await client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200 and answer.headers["x-adapter-version"] == "1"
        await eventually(lambda: len(engine.requests) == 2)
        tenant_run, shadow_run = engine.requests.values()
        assert (tenant_run.adapter.version, shadow_run.adapter.version) == (1, 2)  # type: ignore[union-attr]
        assert shadow_run.prompt_token_ids == tenant_run.prompt_token_ids
        await eventually(lambda: engine.num_unfinished_requests() == 0)
        await served.settled()
        records = await served.usage_records()
        assert [(r.adapter_version, r.shadow) for r in records] == [(1, False), (2, True)]
        usage = await served.admin("GET", f"/tenants/{TENANT}/quota/usage")
        assert usage["budget_used"] == records[0].prompt_tokens + records[0].completion_tokens
        assert (
            served.samples(
                "lora_gateway_shadow_requests_total", tenant=TENANT, model="helper", status="ok"
            )
            == 1
        )
