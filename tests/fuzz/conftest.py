"""The whole HTTP surface under a property-based fuzzer (schemathesis over ``/openapi.json``).

The real app (routes, middleware, store, quotas, ledger) runs in uvicorn on loopback over
the scripted engine, in a thread of its own: schemathesis calls it synchronously. The store
holds real objects for the fuzzer to hit: a tenant whose key authenticates ``/v1``, an
adapter granted to it, and a second tenant ("victim") that admin routes are pointed at
half of the time; whatever the fuzzer deletes of those is put back after each case.

``FUZZ_MAX_EXAMPLES`` sets the examples per operation and phase (``make fuzz``); without it
the run is small and derandomised, for the normal suite (see ``tests/fuzz/schema.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fuzz.schema import KNOWN_MODELS, KNOWN_PATH_PARAMETERS, openapi_document
from tests.support.fuzz_target import (
    ADAPTER,
    ALIAS,
    MAX_MODEL_LEN,
    TALLY,
    FuzzTarget,
    Seeds,
    write_tiny_adapter,
)
from tests.support.harness import ADMIN_TOKEN, app_settings, scripted, serve_on_thread
from tests.support.scripted_engine import ScriptedEngine
from tools.gateway_cost.server import write_tiny_model


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TALLY.cases:
        terminalreporter.write_sep("=", "schemathesis fuzz totals")
        for line in TALLY.lines():
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def fuzz_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTarget]:
    root = tmp_path_factory.mktemp("fuzz")
    write_tiny_model(root / "model")
    write_tiny_adapter(root / "adapters" / ADAPTER)
    # The self-service calls' rate limit high enough that the fuzzer reaches their validation.
    settings = app_settings(
        root, model=str(root / "model"), docs=True, self_service_requests_per_minute=100_000
    )
    engine = ScriptedEngine(max_model_len=MAX_MODEL_LEN)
    with serve_on_thread(settings, scripted(engine), timeout=30) as (served, _):
        base_url = served.base_url
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        with httpx.Client(base_url=f"{base_url}/admin/v1", headers=headers, timeout=30) as admin:
            # The first /openapi.json builds the schema (about a second of CPU): past httpx's
            # 5-second default on a loaded machine, which is no latency this suite asserts.
            served_document = httpx.get(f"{base_url}/openapi.json", timeout=30).json()
            assert served_document == openapi_document(), "the fuzzed schema is not the served one"
            seeds = Seeds(admin)
            seeds.restore()
            base_model = _base_model_id(base_url, seeds.tenant_key)
            KNOWN_MODELS[:] = [base_model, ALIAS]
            KNOWN_PATH_PARAMETERS["model"] = base_model
            yield FuzzTarget(base_url, seeds, base_model)


def _base_model_id(base_url: str, key: str) -> str:
    listed = httpx.get(
        f"{base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    assert listed.status_code == 200, listed.text
    parents = [m["id"] for m in listed.json()["data"] if m["parent"] is None]
    assert len(parents) == 1, listed.text
    return str(parents[0])
