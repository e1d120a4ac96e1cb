"""LiteLLM's proxy, set up and started by the comparison itself: a venv of its own under
``var/`` with a pinned ``litellm[proxy]``, a config with one model over the paced upstream and
a master key, and an environment in which nothing reaches the network at run time (the model
cost map read from the package, any proxy of the outside pointed at a closed port)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

LITELLM_VERSION = "1.106.12"
"""The pinned release: the newest whose ``litellm-proxy-extras`` the package index serves."""
MASTER_KEY = "sk-litellm-compare"
MODEL = "cost-model"
HOST = "127.0.0.1"
CLOSED_PORT_PROXY = "http://127.0.0.1:9"
"""Where any request for the outside goes: a port nothing listens on, so it fails at once."""


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(venv: Path, version: str = LITELLM_VERSION) -> Path:
    """The venv with ``litellm[proxy]==version``, made (and filled from the package index)
    when it lacks that version; its ``litellm`` command."""
    marker = venv / f".litellm-{version}"
    if not marker.exists():
        if not venv_python(venv).exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv_python(venv)), "-m", "pip", "install", "-q", f"litellm[proxy]=={version}"],
            check=True,
        )
        marker.touch()
    return venv / "bin" / "litellm"


def config_text(upstream_url: str, model: str = MODEL, master_key: str = MASTER_KEY) -> str:
    """The proxy's config: one model, the OpenAI provider at ``upstream_url``, a master key,
    no database (so no spend logs: LiteLLM keeps none without one)."""
    return (
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: openai/{model}\n"
        f"      api_base: {upstream_url.rstrip('/')}/v1\n"
        "      api_key: the-upstream-needs-none\n"
        "general_settings:\n"
        f"  master_key: {master_key}\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
    )


def offline_environment(base: dict[str, str]) -> dict[str, str]:
    """``base`` with LiteLLM's cost map read from the package and every proxy of the outside
    pointed at a closed port (loopback excepted), so nothing reaches the network."""
    env = {k: v for k, v in base.items() if not k.upper().endswith("_PROXY")}
    env.update(
        {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "HTTP_PROXY": CLOSED_PORT_PROXY,
            "HTTPS_PROXY": CLOSED_PORT_PROXY,
            "NO_PROXY": "127.0.0.1,localhost",
            "DO_NOT_TRACK": "1",
        }
    )
    env.pop("DATABASE_URL", None)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def litellm_proxy(workdir: Path, litellm: Path, upstream_url: str) -> Iterator[tuple[int, int]]:
    """LiteLLM's proxy (one uvicorn worker) until the block ends: (its pid, its port)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "litellm.yaml"
    config.write_text(config_text(upstream_url))
    port = free_port()
    command = [str(litellm), "--config", str(config), "--host", HOST, "--port", str(port),
               "--num_workers", "1"]  # fmt: skip
    with (workdir / "litellm.log").open("ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=offline_environment(dict(os.environ))
        )
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                tail = (workdir / "litellm.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"LiteLLM's proxy exited: {tail}")
            with contextlib.suppress(httpx.TransportError):
                url = f"http://{HOST}:{port}/health/readiness"
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("LiteLLM's proxy did not become ready")
            time.sleep(0.5)
        yield process.pid, port
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
