"""``GET /metrics`` counts every adapter use at the tier that served it.

A gateway with one device slot and two host slots serves a known sequence of
requests for three random adapters, one request at a time, through the HTTP
API (:mod:`tests.support.lru_walkthrough` works the expected tiers out from
vLLM's LRU code). The counters measured inside the engine's worker process
must match it exactly, and vLLM's own engine metrics must be on the same
endpoint.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from vllm import SamplingParams

from app.cli import register_adapter
from app.engine.base import Engine, EngineLoad, ReportsLoad
from app.settings import EMBEDDED_MODEL_DIR
from bench.random_adapters import make_random_adapter
from tests.support.harness import ADMIN_TOKEN
from tests.support.live_gateway import LiveGateway, make_settings, prepare_store, running_gateway
from tests.support.lru_walkthrough import (
    ACTIVATIONS,
    EVICTIONS,
    LOADS,
    MAX_CPU_LORAS,
    MAX_LORAS,
    RESIDENT,
    USES,
    WALKTHROUGH,
)

pytestmark = pytest.mark.slow

BASE = "SmolLM2-135M-Instruct"
TENANT = "metrics"
# Letter -> (model alias, adapter, version): B is served at its second version.
ADAPTERS = {
    "A": ("alpha", "alpha", "1"),
    "B": ("bravo", "bravo", "2"),
    "C": ("charlie", "charlie", "1"),
}
# (directory under the adapter root, adapter name, seed), in registration order.
VERSIONS = (
    ("alpha", "alpha", 1),
    ("bravo-v1", "bravo", 2),
    ("bravo", "bravo", 3),
    ("charlie", "charlie", 4),
)
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def build(root: Path) -> Path:
    """Every adapter version under ``root/adapters``, and the tenant manifest
    granting the aliases; the adapter root."""
    adapters, tenants = root / "adapters", root / "tenants"
    tenants.mkdir(parents=True)
    for directory, _, seed in VERSIONS:
        make_random_adapter(
            EMBEDDED_MODEL_DIR, adapters / directory, rank=8, target_modules=ATTENTION, seed=seed
        )
    grants = {alias: name for alias, name, _ in ADAPTERS.values()}
    manifest = {"id": TENANT, "name": "Metrics", "allow_base_model": True, "adapters": grants}
    (tenants / f"{TENANT}.yaml").write_text(yaml.safe_dump(manifest))
    return adapters


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    root = tmp_path_factory.mktemp("metrics")
    adapters = build(root)
    settings = make_settings(
        root / "state",
        adapter_root=adapters,
        tenants_dir=root / "tenants",
        max_loras=MAX_LORAS,
        max_cpu_loras=MAX_CPU_LORAS,
        max_num_seqs=4,
    )

    async def register() -> None:
        for directory, name, _ in VERSIONS:
            await register_adapter(settings, name, directory)

    asyncio.run(register())
    keys = prepare_store(settings, [], [TENANT])
    with running_gateway(settings, keys) as gateway:
        yield gateway


def scrape(live: LiveGateway) -> tuple[str, Samples]:
    # /metrics names every tenant: only for the metrics token or an admin token.
    credentials = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    response = httpx.get(f"{live.base_url}/metrics", headers=credentials)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    return response.text, samples


def named(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (sample, labels), value in samples.items() if sample == name}


def test_metrics_follow_the_walkthrough(live: LiveGateway) -> None:
    client = live.client(TENANT)
    for letter, _ in WALKTHROUGH:
        model = BASE if letter is None else ADAPTERS[letter][0]
        completion = client.completions.create(
            model=model, prompt="Name a colour.", max_tokens=3, temperature=0
        )
        assert completion.choices[0].text is not None
    assert live.wait_idle() == 0

    text, samples = scrape(live)

    uses = named(samples, "lora_gateway_adapter_uses_total")
    expected_uses = {}
    for (letter, tier), n in USES.items():
        _, adapter, version = ADAPTERS[letter]
        expected_uses[("adapter", adapter), ("tier", tier), ("version", version)] = float(n)
    assert uses == expected_uses

    swap = "lora_gateway_adapter_swap_seconds"
    counts = named(samples, f"{swap}_count")
    assert counts == {(("stage", "load"),): LOADS, (("stage", "activate"),): ACTIVATIONS}
    sums = named(samples, f"{swap}_sum")
    load_s, activate_s = sums[(("stage", "load"),)], sums[(("stage", "activate"),)]
    assert load_s > 0 and activate_s > 0
    print(
        f"\nswap latency: load mean {1e3 * load_s / LOADS:.2f} ms over {LOADS}, "
        f"activate mean {1e3 * activate_s / ACTIVATIONS:.2f} ms over {ACTIVATIONS}"
    )

    evictions = named(samples, "lora_gateway_adapter_evictions_total")
    assert evictions == {((("tier", t),)): float(n) for t, n in EVICTIONS.items()}
    resident = named(samples, "lora_gateway_adapters_resident")
    assert resident == {((("tier", t),)): float(n) for t, n in RESIDENT.items()}

    # vLLM's own engine metrics, from its front end, on the same endpoint: each family once,
    # from this process's memory, none from the files.
    families = [family.name for family in text_string_to_metric_families(text)]
    assert len(families) == len(set(families))
    in_files = MultiProcessCollector(None, path=str(live.app.state.metrics_dir)).collect()
    assert not [family.name for family in in_files if family.name.startswith("vllm:")]
    lora_info = named(samples, "vllm:lora_requests_info")
    assert lora_info, text
    assert all(dict(labels)["max_lora"] == str(MAX_LORAS) for labels in lora_info)
    assert named(samples, "vllm:num_requests_running")


def test_admin_residency_view_per_adapter_version(live: LiveGateway) -> None:
    # Runs after the walkthrough above (same gateway): host (C A), slot [A].
    with live.admin_client() as admin:
        response = admin.get("/adapters/residency")
    assert response.status_code == 200, response.text
    view = {(r["name"], r["version"]): r for r in response.json()}
    assert set(view) == {
        (name, i) for name, i in [("alpha", 1), ("bravo", 1), ("bravo", 2), ("charlie", 1)]
    }
    final_tier = {"A": "device", "B": "storage", "C": "host"}
    loads = Counter("ABCBA")  # the walkthrough's loads and activations, in order
    activations = Counter("ABACBCA")
    for letter, (_, adapter, version) in ADAPTERS.items():
        row = view[adapter, int(version)]
        assert row["tier"] == final_tier[letter], (letter, row)
        assert row["hits"] == USES[letter, "device"]
        assert row["misses"] == USES[letter, "storage"]
        assert row["uses"]["host"] == USES[letter, "host"]
        assert row["last_used_at"] is not None
        assert row["mean_swap_ms"]["load"] > 0 and row["mean_swap_ms"]["activate"] > 0
        _, samples = scrape(live)
        per_stage = named(samples, "lora_gateway_adapter_swaps_total")
        labels = (("adapter", adapter), ("stage", "load"), ("version", version))
        assert per_stage[labels] == loads[letter]
        labels = (("adapter", adapter), ("stage", "activate"), ("version", version))
        assert per_stage[labels] == activations[letter]
    unused = view["bravo", 1]  # superseded by v2 before any request
    assert unused["tier"] == "storage" and unused["last_used_at"] is None
    assert unused["hits"] == unused["misses"] == 0


def test_the_engine_reports_its_running_batch_and_its_own_queue(live: LiveGateway) -> None:
    """``VLLMEngine.load``, from the SchedulerStats vLLM hands our stat logger after every
    step: with four seats (``max_num_seqs``), six requests sent to the engine directly run
    four at a time while two wait in vLLM's own queue, then none. Last in this module: its
    requests use no adapter, and come after the walkthrough's counts."""
    live.run(six_requests_on_four_seats(live.engine))


async def six_requests_on_four_seats(engine: Engine) -> None:
    assert isinstance(engine, ReportsLoad)
    params = SamplingParams(max_tokens=24, ignore_eos=True)

    async def run(number: int) -> None:
        async for _ in engine.generate([1, 2, 3, number], params, f"load-{number}", None):
            pass

    seen: list[EngineLoad] = []
    runs = asyncio.gather(*(run(n) for n in range(6)))
    while not runs.done():
        if (load := engine.load()) is not None and (not seen or load.step != seen[-1].step):
            seen.append(load)
        await asyncio.sleep(0.005)
    await runs
    assert any(s.running == 4 and s.waiting == 2 for s in seen), seen
    assert all(s.running <= 4 and 0.0 <= s.kv_cache_usage <= 1.0 for s in seen)
    final = engine.load()
    assert final is not None and final.running == 0 and final.waiting == 0
    assert [s.step for s in seen] == sorted({s.step for s in seen})
