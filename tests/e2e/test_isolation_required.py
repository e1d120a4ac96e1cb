"""On CPU, ``lora-gateway serve`` refuses to start when vLLM would not load the isolation fix
into its engine processes: it exits with status 3 and says why, before any model loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from uvicorn.config import STARTUP_FAILURE

from tests.support.harness import ADMIN_TOKEN
from tests.support.servers import free_port


def test_serve_refuses_to_start_when_vllm_would_not_load_the_fix(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "LORA_GATEWAY_PORT": str(free_port()),
        "LORA_GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
        "LORA_GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN,
        "LORA_GATEWAY_ADAPTER_ROOT": str(tmp_path / "adapters"),
        # vLLM loads only the plugins this names: ours is left out.
        "VLLM_PLUGINS": "lora_filesystem_resolver",
    }
    served = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert served.returncode == STARTUP_FAILURE, served.stderr
    assert "IsolationFixUnavailable" in served.stderr
    assert "VLLM_PLUGINS='lora_filesystem_resolver' leaves out 'lora_gateway'" in served.stderr
