"""One real gateway per test session: the vLLM engine on the embedded model with the demo
adapters, served by uvicorn over loopback HTTP (the harness: tests/support/live_gateway.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.live_gateway import (
    LiveGateway,
    make_settings,
    prepare_store,
    running_gateway,
)
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
    with running_gateway(settings, keys) as live:
        yield live
