"""Soak: a real gateway process under mixed load for a while, then its books checked.

``make soak`` (``python -m tools.soak --duration 1200``) starts ``lora-gateway serve`` on a
fresh SQLite store and a throwaway ``redis-server`` as the quota store (so the concurrency
leases and budget counters can be read directly), registers the demo adapters, applies
``tenants/``, gives every tenant a quota (one of them a small requests-per-minute limit),
warms every tenant's models up, and runs the clients of :mod:`tools.soak_load` for
``--duration`` seconds. After a short idle it measures the gateway, stops it with SIGINT,
reads the usage ledger row by row, and checks the invariants of ``docs/reliability.md``
("Soak"). It prints a table, writes it as JSON to ``var/soak/<time>.json`` (the gateway's
log beside it) and exits 1 when an invariant fails, 2 when the run could not be set up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis
from redis.exceptions import RedisError

from tools.soak_checks import (
    Check,
    Rows,
    Samples,
    check_ledger,
    check_log,
    check_metrics,
    check_over_quota,
    check_quota_store,
    check_requests,
    check_rss,
)
from tools.soak_load import PROMPTS, Load, Mix, Outcome, Spec

START_TIMEOUT_S = 600
STOP_TIMEOUT_S = 120
QUOTA_PREFIX = "quota:"
GENEROUS_QUOTA = {
    # Set on every tenant so that every request takes a lease and a budget charge that can be
    # read back from Redis; far above what the soak can use.
    "max_concurrent_requests": 64,
    "token_budget": 1_000_000_000,
    "budget_period": "month",
}


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    base_url: str
    admin_token: str
    metrics_token: str
    database: Path


@dataclass
class Probe:
    """What is sampled every few seconds: the RSS (seconds since the load started, gateway
    process KiB, with its descendants KiB) and the concurrency leases held in the quota store
    (which shows that the lease count read after the run looks where leases are)."""

    pid: int
    redis: Redis
    since: float = 0.0
    rss: list[tuple[float, int, int]] = field(default_factory=list)
    leases: list[int] = field(default_factory=list)

    def take(self) -> None:
        own = rss_kib(self.pid)
        tree = own + sum(rss_kib(child) for child in descendants(self.pid))
        self.rss.append((round(time.monotonic() - self.since, 1), own, tree))
        self.leases.append(sum(leases_held(self.redis).values()))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` (``VmRSS`` in ``/proc/<pid>/status``); 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (field 2) may hold spaces and parentheses: split after it.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


@contextmanager
def redis_server(workdir: Path) -> Iterator[str]:
    """A ``redis-server`` without persistence on a free loopback port; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SetupError("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    command += ["--appendonly", "no", "--dir", str(workdir)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if Redis.from_url(url).ping():
                    break
            except RedisError as exc:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SetupError(f"redis-server did not start: {exc}") from exc
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


class SetupError(Exception):
    """The soak could not be set up (not a finding about the gateway)."""


def gateway_settings(state: Path, args: argparse.Namespace, redis_url: str) -> dict[str, str]:
    """The gateway's settings, by name (the process gets them as ``LORA_GATEWAY_<NAME>``)."""
    return {
        "database_url": f"sqlite+aiosqlite:///{state / 'gateway.db'}",
        "adapter_root": str(state / "adapters"),
        "tenants_dir": str(args.tenants),
        "quota_url": redis_url,
        "admin_token": "lgw-soak-admin-" + secrets.token_urlsafe(16),
        "metrics_token": "lgw-soak-metrics-" + secrets.token_urlsafe(16),
        "host": "127.0.0.1",
        "port": str(free_port()),
        "dtype": args.dtype,
        "max_model_len": "1024",
        "kv_cache_gib": "1",
        "max_loras": "2",  # three demo adapters in two slots: they swap
        "max_cpu_loras": "4",
        "log_level": "warning",
        "docs": "false",
    }


def prepare_store(settings: dict[str, str], adapter_source: Path) -> dict[str, str]:
    """Copy the adapters the manifests grant, register them, apply the manifests and issue
    one key per tenant; the keys by tenant."""
    from app.cli import apply_tenants, create_key, register_adapter
    from app.settings import Settings
    from app.tenancy.manifests import load_manifests

    config = Settings(**settings)  # type: ignore[arg-type]
    manifests = load_manifests(config.tenants_dir)
    adapters = sorted({g.adapter for manifest in manifests for g in manifest.grants().values()})
    for name in adapters:
        shutil.copytree(adapter_source / name, config.adapter_root / name)

    async def prepare() -> dict[str, str]:
        for name in adapters:
            await register_adapter(config, name, name)
        await apply_tenants(config, config.tenants_dir, prune=False)
        return {m.id: await create_key(config, m.id, "soak") for m in manifests}

    return asyncio.run(prepare())


def start_gateway(settings: dict[str, str], log: Path) -> GatewayProcess:
    env = {**os.environ, **{f"LORA_GATEWAY_{k.upper()}": v for k, v in settings.items()}}
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    gateway = GatewayProcess(
        process,
        f"http://127.0.0.1:{settings['port']}",
        settings["admin_token"],
        settings["metrics_token"],
        Path(settings["database_url"].split("///", 1)[1]),
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if httpx.get(f"{gateway.base_url}/readyz").status_code == 200:
                return gateway
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            raise SetupError(f"the gateway exited with {process.returncode}: see {log}")
        if time.monotonic() > deadline:
            stop_gateway(gateway)
            raise SetupError(f"the gateway was not ready within {START_TIMEOUT_S} s: see {log}")
        time.sleep(0.5)


def stop_gateway(gateway: GatewayProcess) -> int | None:
    """SIGINT to the gateway's process group; its exit status (``None``: killed after
    ``STOP_TIMEOUT_S``)."""
    if gateway.process.poll() is None:
        os.killpg(gateway.process.pid, signal.SIGINT)
    try:
        return gateway.process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(gateway.process.pid, signal.SIGKILL)
        gateway.process.wait()
        return None


def admin(gateway: GatewayProcess) -> httpx.Client:
    return httpx.Client(
        base_url=f"{gateway.base_url}/admin/v1",
        headers={"Authorization": f"Bearer {gateway.admin_token}"},
        timeout=60,
    )


def set_quotas(gateway: GatewayProcess, tenants: list[str], over: str, over_rpm: int) -> None:
    with admin(gateway) as client:
        for tenant in tenants:
            quota = {
                **GENEROUS_QUOTA,
                **({"requests_per_minute": over_rpm} if tenant == over else {}),
            }
            client.put(f"/tenants/{tenant}/quota", json=quota).raise_for_status()


def models_by_tenant(gateway: GatewayProcess, keys: dict[str, str]) -> dict[str, list[str]]:
    models = {}
    for tenant, key in keys.items():
        response = httpx.get(
            f"{gateway.base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}
        )
        response.raise_for_status()
        models[tenant] = sorted(card["id"] for card in response.json()["data"])
    return models


async def run_load(
    gateway: GatewayProcess,
    load: Load,
    models: dict[str, list[str]],
    args: argparse.Namespace,
    probe: Probe,
) -> None:
    """Warm every model up, then run the clients for ``args.duration`` s, probing the
    gateway from the end of the warm-up on."""
    over = args.over_quota_tenant
    # No cap on connections: the paced client's requests must not queue in the pool, where
    # their wait would count against the gateway.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=args.clients + 8)
    async with httpx.AsyncClient(timeout=args.request_timeout, limits=limits) as client:
        for tenant, names in models.items():
            for model in names:
                await load.send(client, Spec(tenant, model, "chat", False, 8, PROMPTS[0], 0.0))
        probe.since = time.monotonic()
        probe.take()
        until = probe.since + args.duration
        mix = Mix(
            {t: m for t, m in models.items() if t != over},
            random.Random(args.seed),
            leave_rate=args.leave_rate,
        )
        clients = [load.mixed_client(client, mix, until) for _ in range(args.clients)]
        every = 60 / (args.over_quota_rpm * 3)  # three times its limit
        clients.append(load.paced_client(client, over, models[over][0], every, until))

        async def sample() -> None:
            while True:
                await asyncio.sleep(args.sample_seconds)
                probe.take()

        sampler = asyncio.create_task(sample())
        try:
            await asyncio.gather(*clients)
        finally:
            sampler.cancel()


def scrape_metrics(gateway: GatewayProcess) -> Samples:
    """``/metrics`` samples by name (``lora_gateway_requests_total``...)."""
    response = httpx.get(
        f"{gateway.base_url}/metrics",
        headers={"Authorization": f"Bearer {gateway.metrics_token}"},
    )
    response.raise_for_status()
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def leases_held(client: Redis) -> dict[str, int]:
    """Concurrency leases per subject, expired ones included: a lease a request never
    released is counted until the next request of its subject clears it."""
    return {
        key.removeprefix(f"{QUOTA_PREFIX}cc:"): int(client.zcard(key))
        for key in client.scan_iter(f"{QUOTA_PREFIX}cc:*")
    }


def read_quota_store(client: Redis) -> dict[str, Any]:
    """Leases still held, open reservations, and budget tokens charged per tenant id."""
    leases = leases_held(client)
    open_reservations = sum(1 for _ in client.scan_iter(f"{QUOTA_PREFIX}rs:*"))
    budget: Counter[str] = Counter()
    for key in client.scan_iter(f"{QUOTA_PREFIX}bg:*"):
        subject = key.removeprefix(f"{QUOTA_PREFIX}bg:").rsplit(":", 1)[0]
        # A tenant's subject is `<id>@<uid>` (Tenant.quota_subject): counted under its id.
        budget[subject.partition("@")[0]] += int(client.get(key) or 0)
    return {"leases": leases, "open_reservations": open_reservations, "budget": dict(budget)}


def ledger_totals(gateway: GatewayProcess, tenants: list[str]) -> dict[str, dict[str, int]]:
    """``GET /admin/v1/tenants/{id}/usage`` (which flushes the ledger first) per tenant."""
    totals = {}
    with admin(gateway) as client:
        for tenant in tenants:
            response = client.get(f"/tenants/{tenant}/usage")
            response.raise_for_status()
            data = response.json()["data"]
            row = data[0] if data else {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
            totals[tenant] = {k: row[k] for k in ("requests", "prompt_tokens", "completion_tokens")}
    return totals


def ledger_rows(database: Path) -> Rows:
    """The usage ledger's rows by request id, read straight from the SQLite file."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        db.row_factory = sqlite3.Row
        query = "SELECT request_id, tenant_id, status, prompt_tokens, completion_tokens FROM usage"
        return {row["request_id"]: dict(row) for row in db.execute(query)}


def tenant_table(
    outcomes: list[Outcome], rows: Rows, tenants: list[str]
) -> dict[str, dict[str, int]]:
    table = {}
    for tenant in tenants:
        mine = [o for o in outcomes if o.spec.tenant == tenant]
        ledger = [row for row in rows.values() if row["tenant_id"] == tenant]
        table[tenant] = {
            "sent": len(mine),
            "200": sum(o.status == 200 for o in mine),
            "429": sum(o.status == 429 for o in mine),
            "streams": sum(o.spec.stream for o in mine),
            "left": sum(o.left for o in mine),
            "ledger_cancelled": sum(row["status"] == "cancelled" for row in ledger),
            "chunks_received_left": sum(o.content_chunks for o in mine if o.left),
            "completion_received": sum(o.completion_tokens or 0 for o in mine if o.complete),
            "completion_ledger": sum(row["completion_tokens"] for row in ledger),
            "prompt_ledger": sum(row["prompt_tokens"] for row in ledger),
        }
    return table


def print_report(report: dict[str, Any]) -> None:
    columns = list(next(iter(report["tenants"].values())))
    print(f"\nsoak: {report['config']['duration_s']} s, {report['config']['clients']} clients")
    print(f"{'tenant':<12}" + "".join(f"{c:>{max(len(c), 6) + 2}}" for c in columns))
    for tenant, row in report["tenants"].items():
        print(f"{tenant:<12}" + "".join(f"{row[c]:>{max(len(c), 6) + 2}}" for c in columns))
    rss = report["rss_mib"]
    print(
        f"gateway RSS MiB: start {rss['start']}, end {rss['end']}, max {rss['max']}; "
        f"with children: start {rss['tree_start']}, end {rss['tree_end']}, max {rss['tree_max']}"
    )
    latency = report["latency_s"]
    print(f"latency of complete answers: p50 {latency['p50']} s, p99 {latency['p99']} s")
    for check in report["invariants"]:
        print(f"  {'PASS' if check['ok'] else 'FAIL'}  {check['name']}: {check['detail']}")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def soak(args: argparse.Namespace) -> int:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / f"{stamp}-gateway.log"
    state = Path(tempfile.mkdtemp(prefix="lgw-soak-"))
    try:
        with redis_server(state) as redis_url:
            settings = gateway_settings(state, args, redis_url)
            keys = prepare_store(settings, args.adapter_root)
            tenants = sorted(keys)
            if args.over_quota_tenant not in keys:
                raise SetupError(f"no tenant {args.over_quota_tenant!r} in {args.tenants}")
            redis = Redis.from_url(redis_url, decode_responses=True)
            gateway = start_gateway(settings, log)
            exit_status: int | None = None
            try:
                set_quotas(gateway, tenants, args.over_quota_tenant, args.over_quota_rpm)
                models = models_by_tenant(gateway, keys)
                load = Load(gateway.base_url, keys, args.request_timeout)
                probe = Probe(gateway.process.pid, redis)
                asyncio.run(run_load(gateway, load, models, args, probe))
                during = max(probe.leases)
                time.sleep(args.idle)
                probe.take()
                metrics = scrape_metrics(gateway)
                totals = ledger_totals(gateway, tenants)
                quota = read_quota_store(redis)
            finally:
                exit_status = stop_gateway(gateway)
            rows = ledger_rows(gateway.database)
    finally:
        shutil.rmtree(state, ignore_errors=True)

    outcomes = load.outcomes
    over = args.over_quota_tenant
    checks = [
        *check_requests(outcomes, over),
        check_over_quota(outcomes, over, args.over_quota_rpm),
        *check_ledger(outcomes, rows, totals),
        check_metrics(metrics, outcomes, rows, tenants),
        *check_quota_store(quota, totals, during),
        check_rss(probe.rss, args.max_rss_growth_mib),
        Check("clean exit on SIGINT", exit_status == 0, f"exit status {exit_status}"),
        check_log(log.read_text(errors="replace")),
    ]
    own = [s[1] for s in probe.rss]
    tree = [s[2] for s in probe.rss]
    report = {
        "started_at": stamp,
        "config": {
            "duration_s": args.duration,
            "clients": args.clients,
            "leave_rate": args.leave_rate,
            "over_quota": {"tenant": over, "requests_per_minute": args.over_quota_rpm},
            "seed": args.seed,
            "request_timeout_s": args.request_timeout,
            "dtype": args.dtype,
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "tenants": tenant_table(outcomes, rows, tenants),
        "rss_mib": {
            "start": round(own[0] / 1024),
            "end": round(own[-1] / 1024),
            "max": round(max(own) / 1024),
            "tree_start": round(tree[0] / 1024),
            "tree_end": round(tree[-1] / 1024),
            "tree_max": round(max(tree) / 1024),
        },
        "rss_samples": probe.rss,
        "leases_during_load": {"max": during, "samples": probe.leases},
        "latency_s": {
            "p50": percentile([o.seconds for o in outcomes if o.complete], 0.5),
            "p99": percentile([o.seconds for o in outcomes if o.complete], 0.99),
        },
        "quota_store": quota,
        "ledger_totals": totals,
        "problems": [
            {"tenant": o.spec.tenant, "status": o.status, "hung": o.hung, "problem": o.problem}
            for o in outcomes
            if o.problem or o.hung or (o.status or 0) >= 500
        ][:50],
        "invariants": [check.__dict__ for check in checks],
        "gateway_log": str(log),
    }
    path = args.out / f"{stamp}.json"
    path.write_text(json.dumps(report, indent=2))
    print_report(report)
    print(f"report: {path}")
    return 0 if all(check.ok for check in checks) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--duration", type=float, default=1200, help="seconds of load (1200)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent mixed clients (8)")
    parser.add_argument(
        "--leave-rate", type=float, default=0.1, help="share of streams the client leaves (0.1)"
    )
    parser.add_argument(
        "--over-quota-tenant", default="callcenter", help="the tenant held to a small rpm"
    )
    parser.add_argument("--over-quota-rpm", type=int, default=12, help="its limit (12)")
    parser.add_argument("--seed", type=int, default=0, help="the request mix's seed (0)")
    parser.add_argument(
        "--request-timeout", type=float, default=180, help="a request slower is hung (180 s)"
    )
    parser.add_argument(
        "--idle", type=float, default=5, help="seconds idle before the books are read (5)"
    )
    parser.add_argument("--sample-seconds", type=float, default=5, help="RSS sampling period")
    parser.add_argument(
        "--max-rss-growth-mib", type=float, default=256, help="RSS growth allowed (256 MiB)"
    )
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--tenants", type=Path, default=Path("tenants"), help="manifests")
    parser.add_argument(
        "--adapter-root", type=Path, default=Path("var/adapters"), help="demo adapters"
    )
    parser.add_argument("--out", type=Path, default=Path("var/soak"), help="reports folder")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    try:
        return soak(args)
    except SetupError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
