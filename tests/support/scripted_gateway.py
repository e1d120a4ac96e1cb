"""A gateway over a scripted engine in a process of its own, for the tests that kill it.

:func:`gateway_processes` starts them: each is forked from one server process that imported
the gateway (vLLM and torch among it: most of a process's start) once, so a test that kills
and starts its gateway again pays that import once, not at every start. Each gateway is
still a process of its own, killed for real (SIGKILL) and started afresh on the same store.

Its store and adapters are in ``state_dir`` (kept from one process to the next, as the
harness's settings keep them); each scripted request makes a token every 10 ms.

:func:`run_command` runs ``lora-gateway`` (``app.cli``) in such a process, for the tests of the
command itself: the command as ``python -m app.cli`` runs it, less that import."""

from __future__ import annotations

import multiprocessing
import os
import sys
from multiprocessing.context import ForkServerContext
from pathlib import Path

from app import cli
from app.main import create_app
from tests.support.harness import app_settings, scripted, uvicorn_server
from tests.support.scripted_engine import ScriptedEngine

STEP_SECONDS = 0.01


def run_gateway(state_dir: Path, model_dir: Path, port: int, overrides: dict[str, str]) -> None:
    """Serve a scripted gateway on ``port`` until killed (a forked process's target)."""
    settings = app_settings(state_dir, model=str(model_dir), port=port, **overrides)
    app = create_app(settings, engine_factory=scripted(ScriptedEngine(step_seconds=STEP_SECONDS)))
    uvicorn_server(app, settings).run()


def run_command(argv: list[str], environ: dict[str, str], log: Path) -> None:
    """``lora-gateway *argv`` with ``environ`` as its whole environment and its output
    (stdout and stderr) in ``log``; the process exits with the command's status (a forked
    process's target)."""
    os.environ.clear()
    os.environ.update(environ)
    output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(output, sys.stdout.fileno())
    os.dup2(output, sys.stderr.fileno())
    os.close(output)
    sys.exit(cli.main(argv))


def gateway_processes() -> ForkServerContext:
    """Where to start :func:`run_gateway` processes: a fork server that has this module (so
    the gateway) imported before it forks each of them."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context
