"""vLLM's processes never outlive the engine role's launcher (issue #23, item 7): the launcher
(serve_engine) starts a stand-in for vLLM's server (a process that, as vLLM's does, stops its
own child, a stand-in engine core, on SIGTERM) as it starts vLLM's; killing the launcher
outright ends both, and a server killed outright has its orphaned child killed by the
launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.engine_role import parent_death

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"
)

# vLLM's server in miniature: a child of its own (the engine core), stopped on SIGTERM.
STAND_IN_SERVER = """
import json, os, signal, subprocess, sys, time
core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
def stop(*_):
    core.kill()
    core.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
ready = sys.argv[1]
with open(ready + ".part", "w") as out:
    json.dump({"server": os.getpid(), "core": core.pid}, out)
os.rename(ready + ".part", ready)
time.sleep(120)
"""
# The engine role's launcher, serve_engine, with the stand-in for vLLM's server's command line
# and no plugin check (the stand-in loads none).
LAUNCHER = """
import sys
from app.engine_role import server as engine_server
from app.settings import Settings
engine_server.check_plugins = lambda *args, **kwargs: "active"
engine_server.vllm_server_argv = lambda _: [sys.executable, "-c", sys.argv[1], sys.argv[2]]
sys.exit(engine_server.serve_engine(Settings(_env_file=None, role="engine")))
"""


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie waiting for init to reap it has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_until_gone(pids: list[int], timeout: float = 10) -> list[int]:
    """The pids still running after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(gone(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if not gone(pid)]


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, int]]]:
    """A launcher (in a session of its own, as an orchestrator starts it) running the stand-in
    server, once the server has started its child; whatever is left is killed afterwards."""
    ready = tmp_path / "ready.json"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, STAND_IN_SERVER, str(ready)], start_new_session=True
    )
    pids: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert launcher.poll() is None, "the launcher exited before the server was ready"
            assert time.monotonic() < deadline, "the stand-in server never became ready"
            time.sleep(0.05)
        pids = json.loads(ready.read_text())
        yield launcher, pids
    finally:
        for pid in (launcher.pid, *pids.values()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        launcher.wait()


@pytest.mark.parametrize("group", [False, True], ids=["the launcher alone", "its group"])
def test_a_launcher_killed_outright_takes_the_server_and_its_children(
    launched: tuple[subprocess.Popen[bytes], dict[str, int]], group: bool
) -> None:
    launcher, pids = launched
    if group:
        os.killpg(launcher.pid, signal.SIGKILL)
    else:
        launcher.kill()
    launcher.wait()
    assert wait_until_gone([pids["server"], pids["core"]]) == []


def test_a_server_killed_outright_leaves_no_child_behind(
    launched: tuple[subprocess.Popen[bytes], dict[str, int]],
) -> None:
    launcher, pids = launched
    os.kill(pids["server"], signal.SIGKILL)
    # The launcher ends with the server's status once it has killed the orphaned child.
    assert launcher.wait(timeout=10) == 256 - signal.SIGKILL
    assert wait_until_gone([pids["core"]]) == []


def test_the_launchers_sigterm_is_passed_on_and_the_servers_status_is_its_own(
    launched: tuple[subprocess.Popen[bytes], dict[str, int]],
) -> None:
    launcher, pids = launched
    launcher.terminate()
    assert launcher.wait(timeout=10) == 0  # the stand-in's status after a clean stop
    assert wait_until_gone([pids["server"], pids["core"]]) == []


def test_the_wrapped_command_runs_in_the_wrappers_place() -> None:
    argv = [sys.executable, "-c", "import os, sys; print(os.getppid()); sys.exit(7)"]
    done = subprocess.run(
        parent_death.dying_with_this_process(argv), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 7, done.stderr
    assert int(done.stdout) == os.getpid()  # exec'd: no process left in between


def test_nothing_starts_when_the_parent_died_first(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    argv = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    # Started by this process on behalf of a parent (pid 1) it is not the child of: as when
    # the real parent died before the wrapper asked for the signal.
    wrapped = [sys.executable, "-m", parent_death.__name__, "1", *argv]
    done = subprocess.run(wrapped, capture_output=True, text=True, timeout=30)
    assert done.returncode == parent_death.PARENT_GONE_STATUS, done.stderr
    assert not marker.exists()
