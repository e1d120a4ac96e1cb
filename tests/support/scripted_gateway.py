"""A gateway over a scripted engine in a process of its own, for the tests that kill it:

    python -m tests.support.scripted_gateway STATE_DIR MODEL_DIR PORT [SETTING=VALUE ...]

Its store and adapters are in STATE_DIR (kept from one process to the next, as the harness's
settings keep them); each scripted request makes a token every 10 ms."""

from __future__ import annotations

import sys
from pathlib import Path

from app.main import create_app
from tests.support.harness import app_settings, scripted, uvicorn_server
from tests.support.scripted_engine import ScriptedEngine

STEP_SECONDS = 0.01


def main() -> None:
    state_dir, model_dir, port, *pairs = sys.argv[1:]
    overrides = dict(pair.split("=", 1) for pair in pairs)
    settings = app_settings(Path(state_dir), model=model_dir, port=int(port), **overrides)
    app = create_app(settings, engine_factory=scripted(ScriptedEngine(step_seconds=STEP_SECONDS)))
    uvicorn_server(app, settings).run()


if __name__ == "__main__":
    main()
