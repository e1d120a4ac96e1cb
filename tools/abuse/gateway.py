"""The gateway under attack, as a process of its own on loopback: the stand-in engine's
(:mod:`tools.abuse.stand_in`) or ``lora-gateway serve`` with the real engine; its tenants,
keys and quotas made over the admin API, as an operator would."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from tools.abuse.wire import HOST

STAND_IN_START_SECONDS = 300  # vLLM's imports, on a machine others load too
ENGINE_START_SECONDS = 600
STOP_SECONDS = 60

GENEROUS = {"requests_per_minute": 1_000_000, "max_concurrent_requests": 1_000}
"""A quota that never binds in a run (every request still takes the quota path)."""


class SetupError(RuntimeError):
    """The gateway could not be started or set up: not a finding about it."""


@dataclass
class Tenant:
    id: str
    key: str


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    port: int
    admin_token: str
    log: Path
    model: str = ""

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def add_tenant(self, tenant_id: str, quota: dict[str, Any]) -> Tenant:
        """A tenant allowed the base model, with ``quota`` and one key."""
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        with httpx.Client(
            base_url=f"{self.base_url}/admin/v1", headers=headers, timeout=60
        ) as admin:
            created = admin.post(
                "/tenants", json={"id": tenant_id, "name": tenant_id, "allow_base_model": True}
            )
            created.raise_for_status()
            admin.put(f"/tenants/{tenant_id}/quota", json=quota).raise_for_status()
            key = admin.post(f"/tenants/{tenant_id}/keys", json={"name": "abuse"}).json()["key"]
        if not self.model:
            models = httpx.get(
                f"{self.base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}
            )
            models.raise_for_status()
            self.model = str(models.json()["data"][0]["id"])
        return Tenant(tenant_id, str(key))

    def cpu_seconds(self) -> float:
        """CPU time of the gateway and its children (the engine core is one)."""
        total = 0.0
        try:
            root = psutil.Process(self.process.pid)
            for proc in [root, *root.children(recursive=True)]:
                times = proc.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            pass
        return total

    def settle(
        self, *, quiet_share: float = 0.15, window: float = 1.0, limit: float = 60.0
    ) -> float:
        """Wait until the gateway's processes use under ``quiet_share`` of a core over a
        ``window`` (what an attack left queued has run out), at most ``limit`` seconds; the
        seconds waited, or -1 if it never went quiet."""
        started = time.monotonic()
        while time.monotonic() - started < limit:
            before = self.cpu_seconds()
            time.sleep(window)
            if (self.cpu_seconds() - before) / window < quiet_share:
                return time.monotonic() - started
        return -1.0

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@contextmanager
def stand_in_gateway(workdir: Path) -> Iterator[GatewayProcess]:
    """The real app, tokenizer and uvicorn over the stand-in engine."""
    port, token = free_port(), "abuse-admin-" + secrets.token_urlsafe(12)
    command = [
        sys.executable,
        "-m",
        "tools.abuse.stand_in",
        f"--workdir={workdir}",
        f"--port={port}",
        f"--admin-token={token}",
    ]
    with _serving(command, dict(os.environ), workdir, port, token, STAND_IN_START_SECONDS) as gw:
        yield gw


@contextmanager
def engine_gateway(workdir: Path) -> Iterator[GatewayProcess]:
    """``lora-gateway serve`` with the real vLLM engine on the embedded model: settings at
    their defaults but for where the state goes (``LORA_GATEWAY_*`` from the environment
    apply to the rest)."""
    port, token = free_port(), "abuse-admin-" + secrets.token_urlsafe(12)
    (workdir / "tenants").mkdir(parents=True, exist_ok=True)
    settings = {
        "database_url": f"sqlite+aiosqlite:///{workdir / 'gateway.db'}",
        "adapter_root": str(workdir / "adapters"),
        "adapter_cache_dir": str(workdir / "adapter-cache"),
        "tenants_dir": str(workdir / "tenants"),
        "admin_token": token,
        "host": HOST,
        "port": str(port),
        "log_level": "warning",
        "kv_cache_gib": "1",
    }
    env = {**os.environ, **{f"LORA_GATEWAY_{k.upper()}": v for k, v in settings.items()}}
    command = [sys.executable, "-m", "app.cli", "serve"]
    with _serving(command, env, workdir, port, token, ENGINE_START_SECONDS) as gw:
        yield gw


@contextmanager
def _serving(
    command: list[str], env: dict[str, str], workdir: Path, port: int, token: str, limit: float
) -> Iterator[GatewayProcess]:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "gateway.log"
    with log.open("ab") as out:
        # A session of its own: its engine processes are stopped with it, by group.
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    gateway = GatewayProcess(process, port, token, log)
    try:
        _wait_ready(gateway, limit)
        yield gateway
    finally:
        _stop(process)


def _wait_ready(gateway: GatewayProcess, limit: float) -> None:
    deadline = time.monotonic() + limit
    while True:
        try:
            if httpx.get(f"{gateway.base_url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if not gateway.alive():
            raise SetupError(
                f"the gateway exited with status {gateway.process.returncode}; "
                f"the end of its log:\n{gateway.log_tail()}"
            )
        if time.monotonic() > deadline:
            raise SetupError(f"the gateway was not ready within {limit:.0f} s: see {gateway.log}")
        time.sleep(0.5)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT to the gateway's group, as an operator stops it; SIGKILL if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
