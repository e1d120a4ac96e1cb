"""Run a command that is sent SIGTERM when the process that started it dies, however it dies
(SIGKILL, the OOM killer): ``python -m app.engine_role.parent_death PARENT_PID COMMAND...``.

Linux's ``prctl(PR_SET_PDEATHSIG)`` asks for the signal; it is kept across ``exec``, so this
sets it and then becomes ``COMMAND``. Setting it here, in a process of its own, rather than
in a ``preexec_fn`` keeps the parent's fork free of Python code (unsafe where the parent has
threads). Should the parent die before the request is made, the command is not started.

The signal comes when the *thread* that started this process ends: start it from a thread
that lives as long as the parent (the main thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
PARENT_DEATH_SIGNAL = signal.SIGTERM
PARENT_GONE_STATUS = 1


def dying_with_this_process(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that it is sent SIGTERM when this process dies."""
    return [sys.executable, "-m", __name__, str(os.getpid()), *argv]


def _ask_for_signal_on_parent_death() -> None:
    if not sys.platform.startswith("linux"):
        return  # no such request elsewhere: the command runs as it would unwrapped
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")


def main(args: Sequence[str]) -> int:
    parent, command = int(args[0]), list(args[1:])
    _ask_for_signal_on_parent_death()
    # A parent that died before the request leaves this process to another one (init): no
    # signal would ever come, so nothing is started.
    if os.getppid() != parent:
        return PARENT_GONE_STATUS
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
