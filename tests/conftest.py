"""Fixtures every layer shares: a gateway over a scripted engine (its harness:
tests/support/serving.py), for the serving, API and console tests; and how `make test` runs
the end-to-end layer on both cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling

from tests.support.serving import ServeFactory, serving
from tools.gateway_cost.server import write_tiny_model

# The end-to-end modules that start engines of their own. Every other module of tests/e2e/
# shares the session's engine (tests/e2e/conftest.py) or the scale-out cluster
# (tests/e2e/scale_out/), and one scale-out test compares the two.
OWN_ENGINES = frozenset(
    f"tests/e2e/{name}.py" for name in ("test_isolation", "test_metrics", "test_serve_command")
)
SHARED_ENGINES = "tests/e2e: the session's engine and the scale-out cluster"


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker's engines on a core of their own. On a CPU vLLM binds an
    engine's threads to the cores it picks, the same for every engine (on two cores, one of
    them): two workers' engines would share that core while the other stays idle."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1...
    if worker is not None and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        cores = sorted(os.sched_getaffinity(0))
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(cores[int(worker[2:]) % len(cores)])


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadFileScheduling | None:
    """`make test` runs the end-to-end layer with ``-n 2 --dist loadfile``: its tests leave
    much of a core idle (their waits, an engine's start), which the other worker fills."""
    return EngineScheduling(config, log) if config.getoption("dist") == "loadfile" else None


class EngineScheduling(LoadFileScheduling):
    """pytest-xdist's ``loadfile``, with the files that share engines as one unit, so that
    each engine starts on one worker, once."""

    def _split_scope(self, nodeid: str) -> str:
        path = super()._split_scope(nodeid)
        return SHARED_ENGINES if path.startswith("tests/e2e/") and path not in OWN_ENGINES else path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        shares = {"gateway", "cluster"} & set(getattr(item, "fixturenames", ()))
        if shares and item.nodeid.split("::", 1)[0] in OWN_ENGINES:
            raise pytest.UsageError(
                f"{item.nodeid} uses {', '.join(sorted(shares))}: its module is in "
                "OWN_ENGINES (tests/conftest.py), whose tests run apart from the shared engines"
            )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-model")


@pytest.fixture
def serve(tiny_model_dir: Path, tmp_path: Path) -> ServeFactory:
    """``async with serve(engine, **settings) as served``: a gateway over ``engine``."""
    return serving(tiny_model_dir, tmp_path)
