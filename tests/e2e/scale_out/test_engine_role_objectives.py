"""Latency objectives from a front to the engine role (the cluster: tests/support/scale_out.py):
a tenant's own objectives, set through the front's admin API, travel in each forwarded body's
``vllm_xargs`` to vLLM's scheduler in the engine's core process, where they take the device
slots' turns (counted by rule on the engine's ``/metrics``), and the front counts each
request's outcome against them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.engine_role import SMALL_ENGINE
from tests.support.front_app import admin_call
from tests.support.harness import ADMIN_TOKEN
from tests.support.scale_out import ADAPTER, SPARES, Cluster

pytestmark = pytest.mark.slow

TENANT = "deadlines"
# Objectives no request meets, whatever the machine: every waiting request is due at once, so
# a request whose adapter holds no slot takes one by a turn as soon as the holders have had a
# token each.
MISSED_MS = 1
# One adapter more than the engine's device slots, two requests each.
MODELS = (ADAPTER, *SPARES[:2])
ANSWER = 24


def sample(exposition: str, name: str, **labels: str) -> float:
    """The value of the series ``name`` with ``labels`` (0 where there is none yet)."""
    return sum(
        s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


def test_a_tenants_own_objectives_take_the_engine_roles_slot_turns(cluster: Cluster) -> None:
    assert len(MODELS) > int(SMALL_ENGINE["LORA_GATEWAY_MAX_LORAS"])
    engine = cluster.engines[0]  # the one the front forwards to
    tenant = {"id": TENANT, "name": TENANT, "slo_ttft_ms": MISSED_MS, "slo_tpot_ms": MISSED_MS}
    admin_call(cluster.front_url, "POST", "/tenants", tenant)
    key = admin_call(cluster.front_url, "POST", f"/tenants/{TENANT}/keys", {})["key"]
    for model in MODELS:
        name = model.split("@")[0]
        admin_call(
            cluster.front_url, "PUT", f"/tenants/{TENANT}/adapters/{name}", {"adapter": name}
        )
    front_metrics = f"{cluster.front_url}/metrics"
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    turns = "lora_gateway_slot_turns_total"
    # Before: no request of the cluster's other tenants carries an objective.
    assert sample(engine.metrics(), turns, rule="objective") == 0
    client = openai.OpenAI(
        base_url=f"{cluster.front_url}/v1", api_key=key, max_retries=0, timeout=300
    )

    def complete(model: str) -> int:
        answer = client.completions.create(
            model=model.split("@")[0],
            prompt="Count to fifty:",
            max_tokens=ANSWER,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert answer.usage is not None
        return answer.usage.completion_tokens

    with ThreadPoolExecutor(2 * len(MODELS)) as pool:
        tokens = list(pool.map(complete, [*MODELS, *MODELS]))
    assert tokens == [ANSWER] * 2 * len(MODELS)
    # The engine's scheduler read them: its turns were taken by objective.
    assert sample(engine.metrics(), turns, rule="objective") >= 1
    # The front judged each answer against the same objectives: none met them.
    outcomes = httpx.get(front_metrics, headers=admin, timeout=30).text
    missed = sample(
        outcomes,
        "lora_gateway_slo_outcomes_total",
        **{"class": "interactive"},
        outcome="missed_ttft",
    )
    assert missed == 2 * len(MODELS)
