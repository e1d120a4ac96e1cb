"""What the comparison reads and sets of processes: CPU time of a process tree, and the
cores a process (every thread of it) may run on."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil


def tree_cpu_times(pid: int) -> tuple[float, float]:
    """CPU seconds so far of ``pid`` and every process below it, user and system apart
    (the children it has reaped included)."""
    root = psutil.Process(pid)
    times = root.cpu_times()
    user = times.user + times.children_user
    system = times.system + times.children_system
    for child in root.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            t = child.cpu_times()
            user, system = user + t.user, system + t.system
    return float(user), float(system)


def pin(pid: int, cpus: set[int], *, children: bool) -> None:
    """Let every thread of ``pid`` (and of the processes below it, with ``children``) run on
    ``cpus`` only. Threads started later inherit it from the thread that starts them."""
    pids = [pid]
    if children:
        pids += [p.pid for p in psutil.Process(pid).children(recursive=True)]
    for each in pids:
        with contextlib.suppress(FileNotFoundError):
            for task in os.listdir(Path("/proc") / str(each) / "task"):
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(int(task), cpus)


def parse_cpus(text: str) -> set[int]:
    """``"0"``, ``"1,3"`` or ``"2-3"`` as a set of core numbers."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"not a core list: {text!r}")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus
