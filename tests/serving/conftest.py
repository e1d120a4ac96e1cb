"""What the serving layer's tests share: the gateway's spans, recorded in memory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.traces import recorded_spans


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans of the requests served while the test runs."""
    with recorded_spans() as exporter:
        yield exporter
