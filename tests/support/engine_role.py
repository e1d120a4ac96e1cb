"""Engine-role processes for tests: ``LORA_GATEWAY_ROLE=engine lora-gateway serve`` (vLLM's
OpenAI server with our plugins) on a free loopback port, small enough for two on two cores;
and front-role processes (``LORA_GATEWAY_ROLE=front``) before them. A front runs in a process
of its own, as in a deployment: in the test process its metrics storage would be switched
under the session's in-process gateway (prometheus_client's is per process).

    with engine_processes([{"LORA_GATEWAY_ADAPTER_STORE": "s3://..."}], log_dir) as (engine,):
        httpx.post(f"{engine.base_url}/v1/completions", json={"model": "name@v1", ...})

The process's environment is this process's, plus :data:`SMALL_ENGINE`, plus ``env``; the
role, host and port are set last. Its output (the launcher's and every vLLM process's) goes
to ``engine.log``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from app.settings import Settings
from tests.support.servers import free_port, wait_until_ready

ENGINE_START_TIMEOUT_S = 600
BASE_MODEL_ID = Settings(_env_file=None).base_model_id

# float32 for exact (token-identical) greedy output; short contexts and a small KV cache.
SMALL_ENGINE: dict[str, str] = {
    "LORA_GATEWAY_DTYPE": "float32",
    "LORA_GATEWAY_MAX_MODEL_LEN": "1024",
    "LORA_GATEWAY_MAX_NUM_SEQS": "16",
    "LORA_GATEWAY_KV_CACHE_GIB": "0.25",
    "LORA_GATEWAY_MAX_LORAS": "2",
    "LORA_GATEWAY_MAX_CPU_LORAS": "4",
    "LORA_GATEWAY_LOG_LEVEL": "info",
}


@dataclass
class EngineProcess:
    base_url: str
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str]

    def running(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self) -> str:
        """The exposition text of the engine's ``/metrics`` (open: no token on engines)."""
        response = httpx.get(f"{self.base_url}/metrics", timeout=10)
        response.raise_for_status()
        return response.text

    def metric(self, name: str) -> float:
        """A metric of the engine's ``/metrics``, summed over its series."""
        return sum(
            sample.value
            for family in text_string_to_metric_families(self.metrics())
            for sample in family.samples
            if sample.name == name
        )


@contextmanager
def engine_processes(
    envs: Sequence[Mapping[str, str]], log_dir: Path, *, timeout: float = ENGINE_START_TIMEOUT_S
) -> Iterator[list[EngineProcess]]:
    """Start one engine-role process per ``env`` (each on top of :data:`SMALL_ENGINE`), side
    by side so that their start-ups overlap, wait until each ``/health`` answers 200, and stop
    them (SIGTERM, then SIGKILL for whatever is left) when the block ends."""
    environments = [{**SMALL_ENGINE, **env} for env in envs]
    with _role_processes("engine", environments, log_dir, "/health", timeout) as engines:
        yield engines


@contextmanager
def front_process(
    upstream_url: str, env: Mapping[str, str], log_dir: Path, *, timeout: float = 120
) -> Iterator[EngineProcess]:
    """Start a front-role process forwarding to ``upstream_url``, with ``env`` (its store,
    admin token...) and the engines' context length, wait until its ``/readyz`` answers
    200, and stop it when the block ends."""
    front_env = {
        "LORA_GATEWAY_UPSTREAM_URL": upstream_url,
        "LORA_GATEWAY_MAX_MODEL_LEN": SMALL_ENGINE["LORA_GATEWAY_MAX_MODEL_LEN"],
        **env,
    }
    with _role_processes("front", [front_env], log_dir, "/readyz", timeout) as (front,):
        yield front


@contextmanager
def _role_processes(
    role: str, envs: Sequence[Mapping[str, str]], log_dir: Path, ready_path: str, timeout: float
) -> Iterator[list[EngineProcess]]:
    log_dir.mkdir(parents=True, exist_ok=True)
    started: list[EngineProcess] = []
    try:
        for env in envs:
            started.append(_start(role, env, log_dir))
        for process in started:
            wait_until_ready(
                f"{process.base_url}{ready_path}",
                alive=process.running,
                timeout=timeout,
            )
        yield started
    except BaseException:
        for process in started:
            print(process.log_text()[-6000:], file=sys.stderr)
        raise
    finally:
        for process in started:
            stop_engine(process.process)


def _start(role: str, env: Mapping[str, str], log_dir: Path) -> EngineProcess:
    port = free_port()
    log = log_dir / f"{role}-{port}.log"
    environment = {
        **os.environ,
        **env,
        "LORA_GATEWAY_ROLE": role,
        "LORA_GATEWAY_HOST": "127.0.0.1",
        "LORA_GATEWAY_PORT": str(port),
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve"],
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return EngineProcess(f"http://127.0.0.1:{port}", process, log, environment)


def stop_engine(process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """SIGTERM to the launcher (which passes it to vLLM's server); whatever of the process
    tree is still alive after ``timeout`` seconds is killed."""
    try:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(True)]
    except psutil.NoSuchProcess:
        tree = []
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=timeout)
    for leftover in alive:
        try:
            leftover.kill()
        except psutil.NoSuchProcess:
            continue
    process.wait()
