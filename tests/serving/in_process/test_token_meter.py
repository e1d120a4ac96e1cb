"""Per-token metrics counted in memory and written in batches record what observing every
token did: the same buckets, sum and count."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram
from vllm import CompletionOutput, RequestOutput
from vllm.v1.metrics.stats import RequestStateStats

from app import metrics
from app.serving.in_process import token_meter
from app.serving.in_process.token_meter import TokenMeter
from tests.support.own_metrics import OwnMetrics


def histogram_samples(histogram: Histogram) -> dict[str, float]:
    return {
        f"{s.name}{s.labels.get('le', '')}": s.value
        for family in histogram.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_a_tally_records_what_observing_each_value_records() -> None:
    buckets = metrics.TOKEN_GAP_BUCKETS_S
    direct = Histogram("direct", "d", registry=CollectorRegistry(), buckets=buckets)
    tallied = Histogram("tallied", "t", registry=CollectorRegistry(), buckets=buckets)
    tally = metrics.HistogramTally(tallied)
    values = [random.Random(7).uniform(0, 3) for _ in range(500)]
    values += list(buckets)  # on a bound: le is inclusive
    for i, value in enumerate(values):
        count = 1 + i % 3
        for _ in range(count):
            direct.observe(value)
        tally.observe(value, count)
        if i % 97 == 0:
            tally.flush()
    tally.flush()
    tally.flush()  # nothing pending: writes nothing
    expected = {k.replace("direct", "tallied"): v for k, v in histogram_samples(direct).items()}
    got = histogram_samples(tallied)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key


def output(tokens: int, *, finished: bool = False) -> RequestOutput:
    choice = CompletionOutput(
        index=0,
        text="x" * tokens,
        token_ids=list(range(tokens)),
        cumulative_logprob=None,
        logprobs=None,
        finish_reason="length" if finished else None,
    )
    return RequestOutput("r", None, [1], None, [choice], finished=finished)


# Counted in metrics of this module's own: the process's move to a new storage whenever a
# gateway of another test starts or stops (tests/support/own_metrics.py).
TOKEN_METRICS = OwnMetrics("INTER_TOKEN_LATENCY", "TIME_TO_FIRST_TOKEN")


@pytest.fixture(autouse=True)
def token_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    TOKEN_METRICS.install(monkeypatch, token_meter)


def itl(tenant: str, suffix: str) -> float:
    metrics.flush_held()
    return TOKEN_METRICS.value(
        f"lora_gateway_inter_token_latency_seconds_{suffix}", tenant=tenant, model="m"
    )


def test_the_meter_observes_each_token_after_the_first_held_until_the_metrics_are_read() -> None:
    clock = [100.0]
    meter = TokenMeter("meter-test", "m", started=99.0, clock=lambda: clock[0])
    meter.observe(output(1))  # the first token: time to first token, no gap
    clock[0] += 0.02
    meter.observe(output(1))
    clock[0] += 0.09
    meter.observe(output(3))  # merged: three gaps of 0.03
    assert meter.completion_tokens == 5
    assert (
        TOKEN_METRICS.value(
            "lora_gateway_inter_token_latency_seconds_count", tenant="meter-test", model="m"
        )
        == 0
    ), "written before the metrics were read"
    assert itl("meter-test", "count") == 4
    assert itl("meter-test", "sum") == pytest.approx(0.02 + 0.09)
    clock[0] += 0.008
    meter.observe(output(2, finished=True))
    assert itl("meter-test", "count") == 6 == meter.completion_tokens - 1
    labels = {"tenant": "meter-test", "model": "m", "le": "0.005"}
    bucket = TOKEN_METRICS.value("lora_gateway_inter_token_latency_seconds_bucket", **labels)
    assert bucket == 2  # the last delta's two gaps of 0.004
    ttft = TOKEN_METRICS.value(
        "lora_gateway_time_to_first_token_seconds_sum", tenant="meter-test", model="m"
    )
    assert ttft == pytest.approx(1.0)


def test_a_merged_first_delta_spreads_the_engines_first_to_last_token_time_over_its_gaps() -> None:
    # A consumer slower than the engine gets its first outputs merged: every token after the
    # request's first is still one gap, timed on the engine core's clock.
    clock = [100.0]
    meter = TokenMeter("merged-first", "m", started=99.0, clock=lambda: clock[0])
    first = output(3)
    first.metrics = RequestStateStats(first_token_ts=50.0, last_token_ts=50.08)
    meter.observe(first)
    clock[0] += 0.01
    meter.observe(output(1, finished=True))
    assert itl("merged-first", "count") == 3 == meter.completion_tokens - 1
    assert itl("merged-first", "sum") == pytest.approx(0.08 + 0.01)


def test_a_tenant_and_models_first_tokens_make_no_metric_child_until_the_metrics_are_read() -> None:
    # A child is made in the metric's storage, a value per bucket: by the read, not the request.
    def made() -> set[tuple[str, ...]]:
        return set(metrics.TIME_TO_FIRST_TOKEN._metrics) | set(metrics.INTER_TOKEN_LATENCY._metrics)

    clock = [100.0]
    meter = TokenMeter("first-of-its-kind", "m", started=99.0, clock=lambda: clock[0])
    meter.observe(output(1))
    clock[0] += 0.02
    meter.observe(output(2))
    assert ("first-of-its-kind", "m") not in made()
    metrics.flush_held()
    assert ("first-of-its-kind", "m") in made()
    assert itl("first-of-its-kind", "count") == 2
