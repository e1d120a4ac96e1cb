"""Fixtures every layer shares: a gateway over a scripted engine (its harness:
tests/support/serving.py), for the serving, API and console tests; an S3 server, for the tests
of object storage; and how `make test` runs the end-to-end layer on both cores.

pytest-xdist's controller loads this module too and runs no test, so what it imports for the
fixtures (the app, and with it vLLM and torch: about 10 s of CPU) is imported in them."""

from __future__ import annotations

import atexit
import functools
import gc
import os
import ssl
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import httpx._transports.default
import httpx2
import httpx2._transports.default
import pytest
from xdist.scheduler import LoadFileScheduling, LoadScheduling

if TYPE_CHECKING:
    from collections.abc import Iterator
    from multiprocessing.context import ForkServerContext

    from xdist.remote import Producer
    from xdist.workermanage import WorkerController

    from tests.support.serving import ServeFactory

# The end-to-end modules that start engines of their own. Every other module of tests/e2e/
# shares the session's engine (tests/e2e/conftest.py) or the scale-out cluster
# (tests/e2e/scale_out/).
OWN_ENGINES = frozenset(
    f"tests/e2e/{name}.py" for name in ("test_isolation", "test_metrics", "test_serve_command")
)
SCALE_OUT = "tests/e2e/scale_out/"

# The tests that start processes from the fork server (the fork_server fixture): one worker
# runs them all, so that the fast layer's one fork server imports the gateway (vLLM, torch:
# about 10 s of a core), not one on each worker that drew one of them.
FORK_SERVER_TESTS = frozenset(
    {
        "tests/e2e/test_isolation_required.py::"
        "test_serve_refuses_to_start_when_vllm_would_not_load_the_fix",
        "tests/serving/batches/test_batch_restarts.py::"
        "test_a_batch_resumes_after_each_kill_and_runs_each_line_once",
        "tests/serving/front/test_serving_front.py::test_lora_gateway_serve_runs_the_front_role",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker's engines on a core of their own. On a CPU vLLM binds an
    engine's threads to the cores it picks, the same for every engine (on two cores, one of
    them): two workers' engines would share that core while the other stays idle.

    And one default TLS context per test process: httpx builds one for every client, loading
    certifi's whole CA bundle (about 30 ms of CPU), and the tests make thousands of clients,
    nearly all to plain HTTP on loopback. The same context, shared (as httpx advises). The
    same for httpx2, the fork under the official ``openai`` client, which loads the system's
    bundle for each ``AsyncOpenAI`` the serving tests make."""
    httpx._transports.default.create_ssl_context = _shared_default_tls  # type: ignore[assignment]
    httpx2._transports.default.create_ssl_context = _shared_default_tls2  # type: ignore[assignment]
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1...
    if worker is not None and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        cores = sorted(os.sched_getaffinity(0))
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(cores[int(worker[2:]) % len(cores)])
    if worker is not None:
        # Registered before the imports of collection and the fixtures register theirs, so
        # run after them all (atexit runs the last registered first).
        atexit.register(_exit_without_finalizing)


def _exit_without_finalizing() -> None:
    """A pytest-xdist worker's end, once its atexit handlers have run (its fixtures' servers
    stopped, its temporary directories removed): without the interpreter's finalization.
    That is a garbage collection of everything the worker imported and built (vLLM, torch,
    the app: over a million objects, unfrozen for it) and the teardown of every module,
    about 2 s of a core per worker; and the controller waits for every worker to exit, all
    of them at once at the end of a run, before it reports. The worker has reported its
    results by then, and its exit status is not read."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@functools.cache
def _default_tls() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def _shared_default_tls(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
    if verify is True and cert is None:
        return _default_tls()
    return httpx.create_ssl_context(verify, cert, trust_env)


@functools.cache
def _default_tls2(trust_env: bool) -> ssl.SSLContext:
    return httpx2.create_ssl_context(trust_env=trust_env)


def _shared_default_tls2(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
    if verify is True and cert is None:
        return _default_tls2(trust_env)
    return httpx2.create_ssl_context(verify, cert, trust_env)


def pytest_xdist_make_scheduler(
    config: pytest.Config, log: Producer
) -> LoadFileScheduling | LoadScheduling | None:
    """`make test` runs the end-to-end layer with ``-n 2 --dist loadfile``: its tests leave
    much of a core idle (their waits, an engine's start), which the other worker fills. The
    fast layer (``-n``, pytest-xdist's ``load``) runs the fork server's tests on one worker."""
    dist = config.getoption("dist")
    if dist == "loadfile":
        return EngineScheduling(config, log)
    if dist == "load":
        return ForkServerScheduling(config, log)
    return None


class EngineScheduling(LoadFileScheduling):
    """pytest-xdist's ``loadfile``, with the files that share an engine as one unit (the
    session's, the scale-out cluster's), so that each engine starts on one worker, once."""

    def _split_scope(self, nodeid: str) -> str:
        path = super()._split_scope(nodeid)
        if path.startswith(SCALE_OUT):
            return SCALE_OUT
        if path.startswith("tests/e2e/") and path not in OWN_ENGINES:
            return "tests/e2e/conftest.py"  # the session's engine
        return path


class ForkServerScheduling(LoadScheduling):
    """pytest-xdist's ``load``, with FORK_SERVER_TESTS at the head of the first worker's
    first batch, so that one worker starts one fork server for them all, early in the run.
    (Not ``loadscope``'s units: schemathesis gives all of an API's operations one node id.)"""

    _fork_server_sent = False

    def _send_tests(self, node: WorkerController, num: int) -> None:
        if not self._fork_server_sent:
            self._fork_server_sent = True
            collection = self.collection or []
            first = [i for i in self.pending if collection[i] in FORK_SERVER_TESTS]
            rest = [i for i in self.pending if collection[i] not in FORK_SERVER_TESTS]
            self.pending[:] = first + rest
            num = max(num, len(first))
        super()._send_tests(node, num)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test on the session's engine outside its unit (an engine-role test, or a module of
    OWN_ENGINES) would start a second one on another worker; a test of the fork server's
    outside FORK_SERVER_TESTS, a second fork server."""
    for item in items:
        uses_fork_server = "fork_server" in getattr(item, "fixturenames", ())
        if uses_fork_server != (item.nodeid in FORK_SERVER_TESTS):
            raise pytest.UsageError(
                f"{item.nodeid}: the tests that use the fork_server fixture, and only they, "
                "are FORK_SERVER_TESTS (tests/conftest.py)"
            )
        path = item.nodeid.split("::", 1)[0]
        if "gateway" in getattr(item, "fixturenames", ()) and (
            path in OWN_ENGINES or path.startswith(SCALE_OUT)
        ):
            raise pytest.UsageError(
                f"{item.nodeid} uses the session's engine (the gateway fixture) outside the "
                "tests that share it (tests/conftest.py: OWN_ENGINES, SCALE_OUT)"
            )


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> object:
    """Collection without the cyclic garbage collector, and what it imported (vLLM, torch,
    the app: nearly a million objects, which live as long as the process) frozen out of the
    collector's generations once it is done. Otherwise each full collection, during the
    imports and then every few hundred tests, walks them all for about a second of CPU: the
    app's own start-up does the same (app/server.py)."""
    gc.disable()
    try:
        return (yield)
    finally:
        gc.enable()
        gc.collect()
        gc.freeze()
        # Back in the collector's care for the interpreter's last collection only (nanobind's
        # modules report what is still alive then as leaked): pytest's own collections at
        # the session's end (for unraisable exceptions, in pytest_unconfigure and in its
        # cleanup) would otherwise each walk it all, at the end of every worker's run. A
        # pytest-xdist worker has no last collection (_exit_without_finalizing).
        if "PYTEST_XDIST_WORKER" not in os.environ:
            atexit.register(gc.unfreeze)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tools.gateway_cost.server import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-model")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server (tests/support/s3_server.py), one per test process rather than one
    per module that uses it (each a Python process to start, half a second of a core or
    more): each test makes a bucket of its own, of a random name, and none reads the
    server's other state."""
    from tests.support.s3_server import s3_server

    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def fork_server() -> ForkServerContext:
    """Where the tests start gateway processes: the fork server that imported the gateway
    once (tests/support/scripted_gateway.py). Only FORK_SERVER_TESTS use it."""
    from tests.support.scripted_gateway import gateway_processes

    return gateway_processes()


@pytest.fixture
def serve(tiny_model_dir: Path, tmp_path: Path) -> ServeFactory:
    """``async with serve(engine, **settings) as served``: a gateway over ``engine``."""
    from tests.support.serving import serving

    return serving(tiny_model_dir, tmp_path)
