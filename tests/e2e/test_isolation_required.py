"""On CPU, ``lora-gateway serve`` refuses to start when vLLM would not load the isolation fix
into its engine processes: it exits with status 3 and says why, before any model loads.

The command runs in a process forked from one that imported the gateway already
(tests/support/scripted_gateway.py), with this environment as its own."""

from __future__ import annotations

import os
from multiprocessing.context import ForkServerContext
from pathlib import Path

from uvicorn.config import STARTUP_FAILURE

from tests.support.harness import ADMIN_TOKEN
from tests.support.scripted_gateway import run_command
from tests.support.servers import free_port

TIMEOUT_S = 120


def test_serve_refuses_to_start_when_vllm_would_not_load_the_fix(
    fork_server: ForkServerContext, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "LORA_GATEWAY_PORT": str(free_port()),
        "LORA_GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
        "LORA_GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN,
        "LORA_GATEWAY_ADAPTER_ROOT": str(tmp_path / "adapters"),
        # vLLM loads only the plugins this names: ours is left out.
        "VLLM_PLUGINS": "lora_filesystem_resolver",
    }
    log = tmp_path / "serve.log"
    served = fork_server.Process(target=run_command, args=(["serve"], env, log))
    served.start()
    served.join(TIMEOUT_S)
    if served.exitcode is None:
        served.kill()
        served.join()
    stderr = log.read_text()
    assert served.exitcode == STARTUP_FAILURE, stderr
    assert "IsolationFixUnavailable" in stderr
    assert "VLLM_PLUGINS='lora_filesystem_resolver' leaves out 'lora_gateway'" in stderr
