"""A test's own metrics count only what the code under test counted while they were installed,
also while a gateway of the same worker keeps the process's metrics in its files."""

from __future__ import annotations

import pytest

from app import metrics
from app.metrics import multiprocess_dir
from tests.support.own_metrics import OwnMetrics

SAMPLE = "lora_gateway_quota_backend_errors_total"


def test_a_copy_reads_its_own_count_not_the_original_s_in_the_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with multiprocess_dir():  # a gateway of the worker's, running for the whole session
        metrics.QUOTA_BACKEND_ERRORS.labels("reserve", "timeout").inc(4)  # earlier tests'
        own = OwnMetrics("QUOTA_BACKEND_ERRORS")
        own.install(monkeypatch)
        metrics.QUOTA_BACKEND_ERRORS.labels("reserve", "timeout").inc()
        assert own.value(SAMPLE, operation="reserve", reason="timeout") == 1
