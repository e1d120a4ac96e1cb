"""One real gateway per test session: the vLLM engine on the embedded model with the demo
adapters, served by uvicorn over loopback HTTP (the harness: tests/support/live_gateway.py)."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest

from app.serving.in_process.backend import start_vllm_engine
from tests.support.live_gateway import (
    LiveGateway,
    make_settings,
    prepare_store,
    running_gateway,
)
from tests.support.traces import engine_spans, otlp_receiver
from tools.demo.keys import demo_tenants
from tools.demo.training import DEMO_ADAPTERS


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """The demo tenants and adapters, as `make serve` sets them up, with a tool-call parser for
    ``tool_choice`` ``auto`` (the Agents SDK's turn after a forced call)."""
    settings = make_settings(
        tmp_path_factory.mktemp("demo"), max_loras=2, max_cpu_loras=4, tool_call_parser="pythonic"
    )
    keys = prepare_store(settings, DEMO_ADAPTERS, demo_tenants(settings.tenants_dir))
    # vLLM traces the requests that come with trace headers (the gateway's, where its tracing
    # is on: tests/e2e/test_vllm_spans.py): its request spans go to this process's provider,
    # which exports them nowhere; its engine processes' own (the model's load) to a receiver
    # that drops them.
    engine_spans()
    with otlp_receiver() as (url, _):
        traced = functools.partial(start_vllm_engine, otlp_traces_endpoint=f"{url}/v1/traces")
        with running_gateway(settings, keys, engine_factory=traced) as live:
            yield live
