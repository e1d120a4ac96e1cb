"""A process's CPU time (all its threads, user and kernel), read to the nanosecond.

``psutil``'s reading (``/proc/PID/stat``) counts in the kernel's clock ticks, 10 ms each: a
phase of 512 requests reads to ±20 µs a request, more than a difference of two phases is
asked to show. Linux keeps every process's CPU time to the nanosecond and reads it out on
``clock_gettime`` of the process's CPU clock, which any process may read; elsewhere the
ticks stand. A thread running as it is read may not have its latest slice counted yet: the
tool reads a gateway after its phase has settled, with nothing running."""

from __future__ import annotations

import time

import psutil

_CPUCLOCK_SCHED = 2
"""Linux's CPU clock of a process's scheduled time (``MAKE_PROCESS_CPUCLOCK``)."""


def process_clock(pid: int) -> int:
    """The id of process ``pid``'s CPU clock, for ``time.clock_gettime`` (Linux)."""
    return ((~pid) << 3) | _CPUCLOCK_SCHED


def cpu_seconds(pid: int) -> float:
    """Process ``pid``'s CPU seconds so far, all its threads, user and kernel: to the
    nanosecond where the kernel reads them out, else to its ticks."""
    try:
        return time.clock_gettime(process_clock(pid))
    except (AttributeError, OSError):
        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system)
