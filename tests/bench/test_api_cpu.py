"""bench.api_cpu's pure parts: the figures of a sample, the ratio by round, the verdict, the
order of the systems, the report; and the CPU it reads is the process's own, its children's
apart."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.api_cpu import (
    CpuSample,
    api_server_times,
    children_seconds,
    ratios_by_round,
    render,
    round_order,
    summary,
)
from bench.config import GATEWAY, VLLM


def sample(system: str, round_: int, api_seconds: float, tokens: int = 10_000) -> CpuSample:
    return CpuSample(system, round_, api_seconds * 0.75, api_seconds * 0.25, 4.0, tokens,
                     100, 0, 20.0)  # fmt: skip


def test_a_samples_figures_are_per_output_token() -> None:
    s = sample(GATEWAY, 0, 2.0, tokens=10_000)
    assert s.api_us_per_token == pytest.approx(200.0)
    assert s.api_system_us_per_token == pytest.approx(50.0)
    assert s.engine_us_per_token == pytest.approx(400.0)
    assert s.tokens_per_second == pytest.approx(500.0)


def test_ratios_pair_the_systems_by_round_and_skip_a_round_missing_one() -> None:
    samples = [
        sample(VLLM, 0, 2.0), sample(GATEWAY, 0, 2.4),
        sample(GATEWAY, 1, 1.8), sample(VLLM, 1, 2.0),
        sample(GATEWAY, 2, 9.0),
    ]  # fmt: skip
    assert ratios_by_round(samples) == pytest.approx([1.2, 0.9])


@pytest.mark.parametrize(
    ("gateway_seconds", "verdict"),
    [((1.8, 1.9, 2.0), "met"), ((2.2, 2.4, 2.6), "missed"), ((1.8, 2.2, 2.4), "unresolved")],
)
def test_the_verdict_needs_every_round_on_one_side_of_one(
    gateway_seconds: tuple[float, ...], verdict: str
) -> None:
    samples = [sample(VLLM, r, 2.0) for r in range(3)]
    samples += [sample(GATEWAY, r, seconds) for r, seconds in enumerate(gateway_seconds)]
    result = summary(samples)
    assert result["verdict"] == verdict
    assert result["ratio"]["median"] == pytest.approx(sorted(gateway_seconds)[1] / 2.0)
    assert summary([])["verdict"] == "not measured"


def test_the_first_system_alternates_by_round() -> None:
    assert round_order(0) == [GATEWAY, VLLM]
    assert round_order(1) == [VLLM, GATEWAY]
    assert round_order(2) == [GATEWAY, VLLM]


def test_the_report_gives_each_systems_figures_and_the_ratio() -> None:
    samples = [sample(VLLM, 0, 2.0), sample(GATEWAY, 0, 2.4)]
    text = render(summary(samples), 1)
    assert "| gateway | 240.0 | 60.0 | 400.0 | 500.0 | 0 |" in text
    assert "| vllm | 200.0 | 50.0 | 400.0 | 500.0 | 0 |" in text
    assert "1.200x" in text and "missed" in text


def test_the_api_servers_cpu_excludes_its_childrens() -> None:
    """A parent that sleeps while its child spins: the child's CPU is the children's, and
    the parent's own stays near nothing."""
    spin = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    parent_code = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', {spin!r}])\n"
        "time.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        deadline = time.monotonic() + 60
        while children_seconds(parent.pid) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert children_seconds(parent.pid) >= 0.4
        user, kernel = api_server_times(parent.pid)
        assert user + kernel < 0.3
    finally:
        parent.kill()
        parent.wait()
