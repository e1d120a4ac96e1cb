"""The tracing cost tool: a small run measures every part of a traced request's cost (its
batches decoded by the receiver, or the run fails) and leaves tracing off."""

from __future__ import annotations

import math

import pytest

from app import tracing
from tools.trace_cost import main


def test_a_small_run_measures_each_part_and_leaves_tracing_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    medians = main(["--requests", "60", "--rounds", "1"])
    assert set(medians) == {
        "recorded",
        "unsampled",
        "encoded",
        "sent",
        "sdk_spans",
        "sdk_encoded",
    }
    for part in ("encoded", "sent", "sdk_spans", "sdk_encoded"):
        assert math.isfinite(medians[part]) and medians[part] > 0, part
    assert "all of it, sampled" in capsys.readouterr().out
    assert tracing.request.current() is None
