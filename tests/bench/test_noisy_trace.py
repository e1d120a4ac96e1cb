"""bench.noisy_trace reads tenant B's share of the gateway's /metrics, and splits the growth of
its histograms between two readings into B's requests."""

from __future__ import annotations

import pytest

from bench.noisy_trace import per_request, read

PAGE = """\
# TYPE lora_gateway_scheduler_slots gauge
lora_gateway_scheduler_slots{state="window"} 64.0
lora_gateway_scheduler_slots{state="engine_waiting"} 0.0
# TYPE lora_gateway_scheduler_queue_depth gauge
lora_gateway_scheduler_queue_depth{tenant="tenant-000"} 38.0
lora_gateway_scheduler_queue_depth{tenant="tenant-001"} 0.0
# TYPE lora_gateway_scheduler_queue_wait_seconds histogram
lora_gateway_scheduler_queue_wait_seconds_sum{tenant="tenant-001"} 0.5
lora_gateway_scheduler_queue_wait_seconds_count{tenant="tenant-001"} 3.0
lora_gateway_scheduler_queue_wait_seconds_sum{tenant="tenant-000"} 99.0
lora_gateway_scheduler_queue_wait_seconds_count{tenant="tenant-000"} 99.0
# TYPE lora_gateway_time_to_first_token_seconds histogram
lora_gateway_time_to_first_token_seconds_sum{tenant="tenant-001",model="m"} 1.5
lora_gateway_time_to_first_token_seconds_count{tenant="tenant-001",model="m"} 3.0
"""


def test_it_reads_the_gauges_and_the_victims_histograms() -> None:
    figures = read(PAGE, "tenant-001", "tenant-000")
    assert figures["window"] == 64 and figures["engine_waiting"] == 0
    assert figures["a_queued"] == 38
    assert figures["scheduler_wait_sum"] == 0.5 and figures["scheduler_wait_count"] == 3
    assert figures["gateway_ttft_sum"] == 1.5
    assert "engine_queue_wait_count" not in figures


def reading(count: float, *sums: float) -> dict[str, float]:
    keys = ("scheduler_wait", "engine_queue_wait", "gateway_ttft")
    out = {f"{key}_count": count for key in keys}
    out.update({f"{key}_sum": value for key, value in zip(keys, sums, strict=True)})
    return out


def test_each_request_is_the_growth_since_the_last_reading_after_the_first() -> None:
    timeline = [
        reading(4, 0.0, 0.0, 0.4),  # the warm-up's: the baseline
        reading(4, 0.0, 0.0, 0.4),
        reading(5, 0.0, 0.1, 3.4),
        reading(7, 0.2, 0.1, 4.4),  # two between readings: their mean, twice
    ]
    rows = per_request(timeline)
    assert len(rows) == 3
    assert rows[0] == {"scheduler_wait": 0.0, "engine_queue_wait": 0.1, "gateway_ttft": 3.0}
    assert rows[1] == rows[2]
    assert rows[1] == pytest.approx(
        {"scheduler_wait": 0.1, "engine_queue_wait": 0.0, "gateway_ttft": 0.5}
    )
