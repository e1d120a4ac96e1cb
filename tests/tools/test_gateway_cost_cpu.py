"""The gateway-cost tool's CPU clock (tools/gateway_cost/cpu.py): another process's CPU time,
all its threads, read finer than the kernel's 10 ms ticks and agreeing with them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

from tools.gateway_cost.cpu import cpu_seconds

BURNER = """import time
for line in iter(input, "end"):
    began = time.process_time()
    while time.process_time() - began < float(line):
        pass
    print("done", flush=True)
"""


@contextmanager
def burner() -> Iterator[subprocess.Popen[str]]:
    """A process that spends the CPU seconds it is sent, then says so and waits."""
    child = subprocess.Popen(
        [sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def burn(child: subprocess.Popen[str], seconds: float) -> None:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(f"{seconds}\n")
    child.stdin.flush()
    assert child.stdout.readline() == "done\n"


def test_a_processs_cpu_time_reads_finer_than_the_kernels_ticks() -> None:
    with burner() as child:
        burn(child, 0.001)
        before = cpu_seconds(child.pid)
        burn(child, 0.003)
        spent = cpu_seconds(child.pid) - before
    assert 0.003 <= spent < 1
    ticks = spent * 100
    assert abs(ticks - round(ticks)) > 1e-6  # not a whole number of 10 ms ticks


def test_another_processs_cpu_time_agrees_with_its_ticks() -> None:
    with burner() as child:
        burn(child, 0.2)
        fine = cpu_seconds(child.pid)
        times = psutil.Process(child.pid).cpu_times()
    assert fine >= 0.2
    assert abs(fine - (times.user + times.system)) <= 0.03  # the ticks' rounding, user and system
