"""Metrics recorded in a spawned process reach ``GET /metrics`` of the parent,
the way the engine's worker process reports to the gateway."""

from __future__ import annotations

import multiprocessing
import os

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY, Counter, Gauge, generate_latest, values
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from app import metrics
from app.api.metrics import router
from app.metrics import (
    METRICS,
    MULTIPROC_ENV,
    collection_registry,
    family_name,
    multiprocess_dir,
)
from tests.support.metrics_child import record_in_child


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_every_metric_is_labelled() -> None:
    # Unlabelled metrics take their storage at import, before the gateway
    # sets up the multiprocess directory (app.metrics' contract).
    for metric in METRICS:
        assert metric._labelnames, metric._name


def test_every_metric_works_in_the_next_gateway_s_directory() -> None:
    # A child made in one gateway's lifetime writes to that directory's file, closed when
    # the lifetime ends: each lifetime starts by clearing the children of every metric.
    defined = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(defined) == len(METRICS)
    for _ in range(2):
        with multiprocess_dir():
            for metric in defined:
                child = metric.labels(*("x" for _ in metric._labelnames))
                if isinstance(child, Counter):
                    child.inc()
                elif isinstance(child, Gauge):
                    child.set(1)
                else:
                    child.observe(1)


def test_the_directory_lives_as_long_as_the_block() -> None:
    before_env, before_class = os.environ.get(MULTIPROC_ENV), values.ValueClass
    with multiprocess_dir() as path:
        assert os.environ[MULTIPROC_ENV] == str(path)
        assert path.is_dir() and not any(path.iterdir())
        assert values.ValueClass.file_backed._multiprocess
        assert collection_registry() is not REGISTRY
    assert not path.exists()
    assert os.environ.get(MULTIPROC_ENV) == before_env
    assert values.ValueClass is before_class


def test_nested_gateways_each_get_their_own_directory() -> None:
    # The e2e suite runs a test's own gateway inside the session's.
    with multiprocess_dir() as outer:
        outer_class = values.ValueClass
        with multiprocess_dir() as inner:
            assert inner != outer
            assert os.environ[MULTIPROC_ENV] == str(inner)
            assert values.ValueClass is not outer_class
        assert os.environ[MULTIPROC_ENV] == str(outer)
        assert values.ValueClass is outer_class
        assert outer.is_dir() and not inner.exists()


def test_vllm_s_own_metrics_stay_in_memory_and_are_exported_once() -> None:
    # vLLM's front end records its metrics at every engine step, in this process: it keeps
    # them in memory, as vLLM's own server does, and ours go to the files.
    with multiprocess_dir() as path:
        engine_tokens = Counter("vllm:test_generation_tokens", "test", ["engine"])
        try:
            engine_tokens.labels("0").inc(3)
            metrics.USAGE_PENDING.labels("queued").inc()
            in_files = {f.name for f in MultiProcessCollector(None, path=str(path)).collect()}
            text = generate_latest(collection_registry(path)).decode()
        finally:
            REGISTRY.unregister(engine_tokens)
    assert in_files == {family_name(metrics.USAGE_PENDING)}
    exported = [family.name for family in text_string_to_metric_families(text)]
    assert len(exported) == len(set(exported))  # no family twice, from a file and memory
    assert {*in_files, "vllm:test_generation_tokens"} <= set(exported)
    samples = _samples(text)
    assert samples["vllm:test_generation_tokens_total", (("engine", "0"),)] == 3
    assert samples["lora_gateway_usage_records_pending", (("state", "queued"),)] == 1


def test_a_value_made_while_a_second_gateway_ran_stays_writable_after_it_ended() -> None:
    # A request of the first gateway, under way while the second one starts and stops, keeps
    # the value it was given meanwhile (its file is in the second gateway's directory).
    gauge = metrics.USAGE_PENDING
    with multiprocess_dir():
        with multiprocess_dir():
            held = gauge.labels("queued")
        held.inc()  # the second gateway's files are released only when no gateway runs
        held.dec()


def test_a_child_process_reports_through_the_parents_endpoint() -> None:
    app = FastAPI()
    app.include_router(router)
    context = multiprocessing.get_context("spawn")  # as vLLM starts its engine
    with multiprocess_dir() as path, TestClient(app) as client:
        app.state.metrics_dir = path  # as the gateway's lifespan does
        done, scraped = context.Event(), context.Event()
        child = context.Process(target=record_in_child, args=(done, scraped))
        child.start()
        assert done.wait(timeout=120)
        response = client.get("/metrics")
        scraped.set()
        child.join(timeout=60)
        assert child.exitcode == 0
        after_exit = _samples(client.get("/metrics").text)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    samples = _samples(response.text)
    uses = "lora_gateway_adapter_uses_total"
    assert samples[uses, (("adapter", "legal"), ("tier", "storage"), ("version", "3"))] == 1
    assert samples[uses, (("adapter", "legal"), ("tier", "device"), ("version", "3"))] == 2
    swap = "lora_gateway_adapter_swap_seconds"
    assert samples[f"{swap}_count", (("stage", "load"),)] == 1
    assert samples[f"{swap}_sum", (("stage", "load"),)] == 0.2
    assert samples[f"{swap}_bucket", (("le", "0.25"), ("stage", "load"))] == 1
    assert samples[f"{swap}_bucket", (("le", "0.1"), ("stage", "load"))] == 0
    assert samples[f"{swap}_count", (("stage", "activate"),)] == 1
    legal_load = (("adapter", "legal"), ("stage", "load"), ("version", "3"))
    assert samples["lora_gateway_adapter_swaps_total", legal_load] == 1
    assert samples["lora_gateway_adapter_swap_time_seconds_total", legal_load] == 0.2
    assert samples["lora_gateway_adapter_tier", (("adapter", "legal"), ("version", "3"))] == 2
    evictions = "lora_gateway_adapter_evictions_total"
    assert samples[evictions, (("tier", "host"),)] == 1
    assert samples[evictions, (("tier", "device"),)] == 0  # published at start
    resident = "lora_gateway_adapters_resident"
    assert samples[resident, (("tier", "device"),)] == 1
    assert samples[resident, (("tier", "host"),)] == 2

    # Counters outlive their process; a 'livesum' gauge does not.
    assert after_exit[evictions, (("tier", "host"),)] == 1
    assert (resident, (("tier", "device"),)) not in after_exit
