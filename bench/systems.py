"""The systems under test, each a subprocess on loopback with its own port.

All run the same engine with the same settings, in the same environment, so
that the difference between them is the serving layer: our gateway (tenants,
keys, quotas, metrics, its admission scheduler or plain FCFS) against vLLM's
own OpenAI server. Our vLLM plugin is installed in the venv and therefore
loads in vLLM's server too (it replaces the CPU LoRA ops with our
isolation-fixed ones): with the same ops, both run the same kernels. vLLM's
server as shipped runs with the plugin's ops off
(``LORA_GATEWAY_ISOLATION_FIX=0``): what users get today, including vLLM's
no-adapter slot bug, so its base-model outputs may be wrong.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import httpx

from app.engine.vllm_engine import engine_block_size, engine_dtype
from app.inside_vllm.plugin import ENV_VAR as ISOLATION_FIX_ENV
from app.settings import Settings
from bench.client import Call
from bench.random_adapters import BenchAdapter
from bench.workload import PlannedRequest

GIB = 1 << 30
HOST = "127.0.0.1"
READY_TIMEOUT_SECONDS = 600.0
STOP_TIMEOUT_SECONDS = 30.0
BENCH_ADMIN_TOKEN = "bench-admin-token"
ADMIN_HEADERS = {"Authorization": f"Bearer {BENCH_ADMIN_TOKEN}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def tenant_id(index: int) -> str:
    return f"tenant-{index:03d}"


def base_environment(isolation_fix: bool = True) -> dict[str, str]:
    """The environment every system starts from: ours without any gateway or
    engine-sizing overrides of the caller's shell; our ops on or off."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("LORA_GATEWAY_")
        and name not in {"VLLM_CPU_KVCACHE_SPACE", "PROMETHEUS_MULTIPROC_DIR"}
    }
    env[ISOLATION_FIX_ENV] = "1" if isolation_fix else "0"
    return env


@dataclass
class Process:
    """A started server: its process (group leader) and log file."""

    process: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    def log_tail(self, lines: int = 30) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGINT, like Ctrl-C (both servers shut their engine down on it), then
        SIGKILL to the whole group if that hangs: the engine core is a child."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


def start_process(command: Sequence[str], env: dict[str, str], log_path: Path) -> Process:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("ab")
    log.write(f"$ {' '.join(command)}\n".encode())
    log.flush()
    process = subprocess.Popen(
        list(command),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: stopped as one
    )
    return Process(process, log_path, log)


async def wait_ready(process: Process, url: str, *, name: str) -> float:
    """Poll ``url`` until it answers 200; the seconds it took."""
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=5.0) as client:
        while time.perf_counter() - started < READY_TIMEOUT_SECONDS:
            if process.process.poll() is not None:
                raise RuntimeError(f"{name} exited while starting:\n{process.log_tail()}")
            try:
                if (await client.get(url)).status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(
        f"{name} not ready after {READY_TIMEOUT_SECONDS:.0f}s:\n{process.log_tail()}"
    )


@dataclass(frozen=True)
class EngineConfig:
    """The engine settings both systems get (ours: ``engine_args(settings)``), the dtype and
    the KV block size resolved as the gateway resolves them, so that vLLM's server runs the
    same ones."""

    settings: Settings

    def __post_init__(self) -> None:
        resolved = {
            "dtype": engine_dtype(self.settings.dtype),
            "kv_block_size": engine_block_size(self.settings.kv_block_size),
        }
        object.__setattr__(self, "settings", self.settings.model_copy(update=resolved))

    @property
    def kv_cache_bytes(self) -> int | None:
        gib = self.settings.kv_cache_gib
        return int(gib * GIB) if gib is not None else None


class System(Protocol):
    """What the runner needs of a system under test."""

    name: str
    base_url: str
    engine: EngineConfig
    # Its /metrics has the gateway's adapter loads, activations, turns and seats (both
    # systems report vLLM's own metrics, the engine's steps among them).
    counts_adapters: bool

    async def start(self, adapters: Sequence[BenchAdapter], log_path: Path) -> float: ...

    def call_for(self, planned: PlannedRequest, adapters: Sequence[BenchAdapter]) -> Call: ...

    async def metrics_text(self) -> str | None: ...

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (vLLM's processes are below it)."""
        ...

    def stop(self) -> None: ...


# Registrations in flight at once while provisioning (each copies an adapter).
PROVISION_CONCURRENCY = 8


class GatewaySystem:
    """Our gateway: ``lora-gateway serve`` with a fresh store; adapter ``i``
    granted to tenant ``i % tenants`` (one tenant per adapter by default)."""

    counts_adapters = True

    def __init__(
        self,
        engine: EngineConfig,
        adapter_root: Path,
        work_dir: Path,
        *,
        name: str = "gateway",
        scheduler: str = "fair",
        tenants: int | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        """``extra``: more ``LORA_GATEWAY_*`` settings (name without the prefix -> value)."""
        self.name = name
        self.engine = engine
        self.scheduler = scheduler
        self.tenants = tenants
        self.extra = dict(extra or {})
        self._adapter_root = adapter_root
        self._work_dir = work_dir
        self.port = free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        self.keys: dict[int, str] = {}
        self._process: Process | None = None

    def environment(self) -> dict[str, str]:
        s = self.engine.settings
        db = self._work_dir / f"gateway-{self.port}.db"
        empty_tenants = self._work_dir / "no-tenants"
        empty_tenants.mkdir(parents=True, exist_ok=True)
        values: dict[str, Any] = {
            "MODEL": s.model,
            "SERVED_MODEL_NAME": s.base_model_id,
            "DTYPE": s.dtype,
            "MAX_MODEL_LEN": s.max_model_len,
            "MAX_NUM_SEQS": s.max_num_seqs,
            "MAX_LORAS": s.max_loras,
            "MAX_CPU_LORAS": s.max_cpu_loras,
            "MAX_LORA_RANK": s.max_lora_rank,
            "LORA_SLOT_QUANTUM_TOKENS": s.lora_slot_quantum_tokens,
            "KV_CACHE_GIB": s.kv_cache_gib,
            "KV_BLOCK_SIZE": s.kv_block_size,
            "ENFORCE_EAGER": s.enforce_eager,
            "SEED": s.seed,
            "ISOLATION_FIX": True,
            "SCHEDULER": self.scheduler,
            "HOST": HOST,
            "PORT": self.port,
            "DATABASE_URL": f"sqlite+aiosqlite:///{db.resolve()}",
            "ADAPTER_ROOT": self._adapter_root.resolve(),
            "ADMIN_TOKEN": BENCH_ADMIN_TOKEN,
            "TENANTS_DIR": empty_tenants.resolve(),
        }
        env = base_environment()
        env.update({f"LORA_GATEWAY_{k}": str(v) for k, v in values.items() if v is not None})
        env.update({f"LORA_GATEWAY_{k}": v for k, v in self.extra.items()})
        return env

    async def start(self, adapters: Sequence[BenchAdapter], log_path: Path) -> float:
        # `-m` from the working directory, not the installed `lora-gateway` script: the
        # editable install resolves `app` to the checkout it was installed from, and a bench
        # run from another worktree must serve that worktree's code.
        command = [sys.executable, "-m", "app.cli", "serve"]
        self._process = start_process(command, self.environment(), log_path)
        seconds = await wait_ready(self._process, f"{self.base_url}/readyz", name=self.name)
        await self._provision(adapters)
        return seconds

    def tenant_count(self, adapters: int) -> int:
        return max(1, min(self.tenants or adapters, adapters or 1))

    async def _provision(self, adapters: Sequence[BenchAdapter]) -> None:
        """Register every adapter, create the tenants (base model allowed) with a key
        each, and grant adapter ``i`` to tenant ``i % tenants`` under its own name,
        over the admin API."""
        tenants = self.tenant_count(len(adapters))
        limit = asyncio.Semaphore(PROVISION_CONCURRENCY)
        async with httpx.AsyncClient(
            base_url=f"{self.base_url}/admin/v1", headers=ADMIN_HEADERS, timeout=300.0
        ) as admin:

            async def checked(method: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
                async with limit:
                    response = await admin.request(method, url, json=body)
                if response.status_code >= 300:
                    raise RuntimeError(f"{method} {url}: {response.status_code} {response.text}")
                result: dict[str, Any] = response.json()
                return result

            async def tenant(index: int) -> None:
                name = tenant_id(index)
                await checked(
                    "POST", "/tenants", {"id": name, "name": name, "allow_base_model": True}
                )
                self.keys[index] = (
                    await checked("POST", f"/tenants/{name}/keys", {"name": "bench"})
                )["key"]

            async def adapter(index: int, adapter: BenchAdapter) -> None:
                path = str(adapter.path.resolve().relative_to(self._adapter_root.resolve()))
                await checked("POST", "/adapters", {"name": adapter.name, "path": path})
                await checked(
                    "PUT",
                    f"/tenants/{tenant_id(index % tenants)}/adapters/{adapter.name}",
                    {"adapter": adapter.name},
                )

            await asyncio.gather(*(tenant(i) for i in range(tenants)))
            await asyncio.gather(*(adapter(i, a) for i, a in enumerate(adapters)))
        # Requests never read the store: wait until the gateway's in-memory view
        # has every grant (it is rebuilt after each admin change, but be sure).
        await asyncio.sleep(self.engine.settings.registry_poll_seconds * 2)

    async def set_objectives(self, ttft_ms: int, tpot_ms: int) -> None:
        """Give every tenant these latency objectives (``slo_ttft_ms``, ``slo_tpot_ms``), over
        the admin API, and wait until the gateway serves with them."""
        async with httpx.AsyncClient(
            base_url=f"{self.base_url}/admin/v1", headers=ADMIN_HEADERS, timeout=60.0
        ) as admin:
            for index in self.keys:
                response = await admin.patch(
                    f"/tenants/{tenant_id(index)}",
                    json={"slo_ttft_ms": ttft_ms, "slo_tpot_ms": tpot_ms},
                )
                if response.status_code >= 300:
                    raise RuntimeError(f"objectives of {tenant_id(index)}: {response.text}")
        await asyncio.sleep(self.engine.settings.registry_poll_seconds * 2)

    def call_for(self, planned: PlannedRequest, adapters: Sequence[BenchAdapter]) -> Call:
        model = (
            adapters[planned.adapter].name
            if planned.adapter is not None
            else self.engine.settings.base_model_id
        )
        return Call(model, self.keys[planned.tenant % len(self.keys)])

    async def metrics_text(self) -> str | None:
        # /metrics names every tenant: the API port serves it to an admin token only.
        async with httpx.AsyncClient(headers=ADMIN_HEADERS, timeout=30.0) as client:
            response = await client.get(f"{self.base_url}/metrics")
            response.raise_for_status()
            return response.text

    @property
    def pid(self) -> int | None:
        return self._process.process.pid if self._process is not None else None

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None


class VLLMServer:
    """vLLM's own OpenAI server with every adapter as a ``--lora-modules`` entry,
    with our ops (``isolation_fix``) or as shipped."""

    counts_adapters = False

    def __init__(
        self, engine: EngineConfig, *, name: str = "vllm", isolation_fix: bool = True
    ) -> None:
        self.name = name
        self.engine = engine
        self.isolation_fix = isolation_fix
        self.port = free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        self._process: Process | None = None

    def command(self, adapters: Sequence[BenchAdapter]) -> list[str]:
        s = self.engine.settings
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--host", HOST,
            "--port", str(self.port),
            "--model", s.model,
            "--served-model-name", s.base_model_id,
            "--dtype", s.dtype,
            "--max-model-len", str(s.max_model_len),
            "--max-num-seqs", str(s.max_num_seqs),
            "--enable-lora",
            "--max-loras", str(s.max_loras),
            "--max-cpu-loras", str(s.max_cpu_loras),
            "--max-lora-rank", str(s.max_lora_rank),
            "--gpu-memory-utilization", str(s.gpu_memory_utilization),
            "--seed", str(s.seed),
        ]  # fmt: skip
        command.append("--enforce-eager" if s.enforce_eager else "--no-enforce-eager")
        if self.engine.kv_cache_bytes is not None:
            command += ["--kv-cache-memory-bytes", str(self.engine.kv_cache_bytes)]
        if s.kv_block_size is not None:
            command += ["--block-size", str(s.kv_block_size)]
        if adapters:
            command += ["--lora-modules", *(f"{a.name}={a.path.resolve()}" for a in adapters)]
        return command

    async def start(self, adapters: Sequence[BenchAdapter], log_path: Path) -> float:
        self._process = start_process(
            self.command(adapters), base_environment(self.isolation_fix), log_path
        )
        return await wait_ready(self._process, f"{self.base_url}/health", name=self.name)

    def call_for(self, planned: PlannedRequest, adapters: Sequence[BenchAdapter]) -> Call:
        model = (
            adapters[planned.adapter].name
            if planned.adapter is not None
            else self.engine.settings.base_model_id
        )
        # Our gateway salts every prompt's prefix-cache entries with the
        # tenant's id; vLLM takes the same salt per request, so both engines
        # share (and miss) exactly the same cached prefixes.
        return Call(model, None, {"cache_salt": tenant_id(planned.tenant)})

    async def metrics_text(self) -> str | None:
        async with httpx.AsyncClient(timeout=30.0) as client:
            response = await client.get(f"{self.base_url}/metrics")
            response.raise_for_status()
            return response.text

    @property
    def pid(self) -> int | None:
        return self._process.process.pid if self._process is not None else None

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None
