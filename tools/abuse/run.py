"""One row, measured: each round the victim alone, then the victim while the attacker (a
process of its own) attacks, then the gateway left to go quiet before the next round."""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tools.abuse.attacks import AttackPlan, attack_process
from tools.abuse.gateway import GENEROUS, GatewayProcess
from tools.abuse.rows import Row, Target
from tools.abuse.stats import Round, RowSummary, summarize
from tools.abuse.victim import VictimRequest, victim_phase

READY_SECONDS = 60.0
"""Longest wait for the attacker's first wave (1,100 connections, 8 MiB bodies built)."""
TALLY_SECONDS = 60.0
SETTLE_LIMIT_SECONDS = 60.0


@dataclass(frozen=True)
class Measure:
    rounds: int
    victim_requests: int
    victim_timeout: float


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def measure_row(
    row: Row, gateway: GatewayProcess, measure: Measure
) -> tuple[RowSummary, list[Round]]:
    # Tenants of the row's own: a gateway may serve several rows.
    victim = gateway.add_tenant(f"victim-{row.name}", GENEROUS)
    key = ""
    if row.attacker_quota is not None:
        key = gateway.add_tenant(f"attacker-{row.name}", row.attacker_quota).key
    plan = row.plan(Target(gateway.port, key, gateway.model))
    # Past its phase's end, the attacker stops by itself (if this process could not stop it).
    limit = _attacked_limit(row)
    plan = replace(plan, max_seconds=row.ramp_seconds + limit + READY_SECONDS)

    def phase(spread: float, limit_seconds: float) -> list[VictimRequest]:
        return asyncio.run(
            victim_phase(
                gateway.port,
                victim.key,
                gateway.model,
                count=measure.victim_requests,
                spread_seconds=spread,
                timeout=measure.victim_timeout,
                limit_seconds=limit_seconds,
            )
        )

    # Warm-up: the first requests pay for lazy imports and caches in the gateway.
    phase(0.0, 30.0)
    rounds: list[Round] = []
    for number in range(measure.rounds):
        solo = phase(0.0, limit)
        attacked, tally = under_attack(
            plan, row.ramp_seconds, lambda: phase(row.attack_seconds, limit)
        )
        settled = gateway.settle(limit=SETTLE_LIMIT_SECONDS)
        result = Round(solo, attacked, tally.get("outcomes", {}), tally.get("attempts", 0), settled)
        rounds.append(result)
        progress(
            f"{row.name} round {number + 1}: victim p99 {_s(result.solo_p99)} alone, "
            f"{_s(result.attacked_p99)} under attack ({len(attacked)} requests, "
            f"{sum(not r.ok for r in attacked)} failed); attacker {_top(result.attacker)}; "
            + ("gateway quiet again" if settled >= 0 else "gateway still busy after the attack")
        )
        if not gateway.alive():
            progress(f"{row.name}: the gateway exited ({gateway.process.returncode})")
            break
    return summarize(row.name, rounds), rounds


def _attacked_limit(row: Row) -> float:
    """The longest a phase may run: a generous multiple of the attacked phase's spread; then
    it ends with the requests it has (the report shows how many)."""
    return max(3 * row.attack_seconds, 60.0)


def under_attack(
    plan: AttackPlan, ramp_seconds: float, measure: Callable[[], list[VictimRequest]]
) -> tuple[list[VictimRequest], dict[str, Any]]:
    """``measure()`` while ``plan`` runs in an attacker process; the victim's requests and the
    attacker's tally."""
    # spawn: a fresh interpreter, nothing of this process's threads or loops carried over.
    context = multiprocessing.get_context("spawn")
    stop, ready = context.Event(), context.Event()
    results: multiprocessing.Queue[dict[str, Any]] = context.Queue()
    attacker = context.Process(
        target=attack_process, args=(plan, stop, ready, results), name="abuse-attacker"
    )
    started = time.monotonic()
    attacker.start()
    tally: dict[str, Any] = {}
    try:
        if not ready.wait(READY_SECONDS):
            progress("the attacker's first wave was not out in time; measuring anyway")
        time.sleep(ramp_seconds)
        progress(f"  attacking for {time.monotonic() - started:.1f} s; the victim starts")
        measured = measure()
    finally:
        progress(f"  the victim is done after {time.monotonic() - started:.1f} s; stopping")
        stop.set()
        try:
            tally = results.get(timeout=TALLY_SECONDS)
        except queue.Empty:
            tally = {"outcomes": {"attacker gave no tally": 1}, "attempts": 0}
        attacker.join(timeout=10)
        if attacker.is_alive():
            attacker.kill()
            attacker.join()
    return measured, tally


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f} s"


def _top(outcomes: dict[str, int], shown: int = 4) -> str:
    ranked = sorted(outcomes.items(), key=lambda item: -item[1])[:shown]
    return ", ".join(f"{name} x{count}" for name, count in ranked) or "nothing"
