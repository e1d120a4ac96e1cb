"""Engine-role processes for tests: ``LORA_GATEWAY_ROLE=engine lora-gateway serve`` (vLLM's
OpenAI server with our plugins) on a free loopback port, small enough for two on two cores.

    with engine_process({"LORA_GATEWAY_ADAPTER_STORE": "s3://bucket/prefix"}, log_dir) as engine:
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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from app.settings import Settings
from tests.support.servers import free_port, wait_until_ready

ENGINE_START_TIMEOUT_S = 600
BASE_MODEL_ID = Settings(_env_file=None).base_model_id

# float32 for exact (token-identical) greedy output; short contexts and a small KV cache.
SMALL_ENGINE: dict[str, str] = {
    "LORA_GATEWAY_DTYPE": "float32",
    "LORA_GATEWAY_MAX_MODEL_LEN": "512",
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

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self) -> str:
        """The exposition text of the engine's ``/metrics`` (open: no token on engines)."""
        response = httpx.get(f"{self.base_url}/metrics", timeout=10)
        response.raise_for_status()
        return response.text


def engine_environment(env: Mapping[str, str], port: int) -> dict[str, str]:
    return {
        **os.environ,
        **SMALL_ENGINE,
        **env,
        "LORA_GATEWAY_ROLE": "engine",
        "LORA_GATEWAY_HOST": "127.0.0.1",
        "LORA_GATEWAY_PORT": str(port),
    }


@contextmanager
def engine_process(
    env: Mapping[str, str], log_dir: Path, *, timeout: float = ENGINE_START_TIMEOUT_S
) -> Iterator[EngineProcess]:
    """Start an engine-role process with ``env`` (on top of :data:`SMALL_ENGINE`), wait
    until its ``/health`` answers 200, and stop it (SIGTERM, then SIGKILL for whatever of
    it is left) when the block ends."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"engine-{port}.log"
    environment = engine_environment(env, port)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve"],
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    engine = EngineProcess(f"http://127.0.0.1:{port}", process, log, environment)
    try:
        wait_until_ready(
            f"{engine.base_url}/health", alive=lambda: process.poll() is None, timeout=timeout
        )
        yield engine
    except BaseException:
        print(engine.log_text()[-6000:], file=sys.stderr)
        raise
    finally:
        stop_engine(process)


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
