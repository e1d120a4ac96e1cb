"""A batch survives its gateway being killed (SIGKILL) in the middle, three times: each time
the gateway starts again on the same store, takes the batch over once the dead process's
lease has lapsed, and resumes it where it stopped. The output then has every ``custom_id``
exactly once, and the ledger one record for each line, marked with the batch: no line lost,
none run into the output twice, none billed twice.

The gateway runs in a process of its own over a scripted engine, forked from a server that
imported it once (tests/support/scripted_gateway.py)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, select

from app.store.tables import UsageRow
from tests.support.batches import chat_line, jsonl
from tests.support.harness import admin_client_options
from tests.support.scripted_gateway import run_gateway
from tests.support.servers import free_port, wait_until_ready

LINES = 40
# Progress (lines finished) at which each of the three kills comes.
KILL_POINTS = (4, 16, 28)
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30
SETTINGS = {
    "batch_poll_seconds": "0.05",
    "batch_lease_seconds": "1.0",
    "batch_concurrency": "4",
}


@contextmanager
def gateway_process(
    fork_server: ForkServerContext, state_dir: Path, model_dir: Path
) -> Iterator[Gateway]:
    """A gateway process on the store in ``state_dir``, and a client of the tenant's."""
    port = free_port()
    process = fork_server.Process(
        target=run_gateway, args=(state_dir, model_dir, port, SETTINGS), daemon=True
    )
    process.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(f"{base_url}/readyz", alive=process.is_alive, timeout=START_TIMEOUT_S)
        yield Gateway(base_url, process)
    finally:
        if process.is_alive():
            process.terminate()
            process.join(STOP_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join()


@dataclass
class Gateway:
    base_url: str
    process: BaseProcess

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: nothing of the gateway runs after it
        self.process.join()
        assert self.process.exitcode == -signal.SIGKILL


def wait_for(http: httpx.Client, batch_id: str, done: Any, timeout: float = 120) -> dict[str, Any]:
    """The batch once ``done(batch)`` (``timeout`` bounds only a hang)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = http.get(f"/v1/batches/{batch_id}")
        answer.raise_for_status()
        batch: dict[str, Any] = answer.json()
        if done(batch):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.01)


def finished_at_least(count: int) -> Any:
    return lambda batch: batch["request_counts"]["completed"] >= count


def started(base_url: str) -> tuple[dict[str, Any], str]:
    """A tenant with a key (its client's options), and a batch of ``LINES`` lines of it."""
    with httpx.Client(**admin_client_options(base_url)) as admin:
        tenant_body = {"id": "t", "name": "T", "allow_base_model": True}
        admin.post("/tenants", json=tenant_body).raise_for_status()
        key = admin.post("/tenants/t/keys", json={"name": "k"}).json()["key"]
    options = {"base_url": base_url, "headers": {"Authorization": f"Bearer {key}"}, "timeout": 30}
    with httpx.Client(**options) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        lines = [chat_line(f"line-{i}", model, max_tokens=20) for i in range(LINES)]
        upload = {"file": ("in.jsonl", jsonl(lines))}
        uploaded = http.post("/v1/files", data={"purpose": "batch"}, files=upload).json()
        body = {
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        batch_id: str = http.post("/v1/batches", json=body).json()["id"]
    return options, batch_id


def test_a_batch_resumes_after_each_kill_and_runs_each_line_once(
    fork_server: ForkServerContext, tiny_model_dir: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with gateway_process(fork_server, state, tiny_model_dir) as gateway:
        options, batch_id = started(gateway.base_url)
        with httpx.Client(**options) as http:
            wait_for(http, batch_id, finished_at_least(KILL_POINTS[0]))
        gateway.kill()
    for point in KILL_POINTS[1:]:
        with gateway_process(fork_server, state, tiny_model_dir) as gateway:
            with httpx.Client(**{**options, "base_url": gateway.base_url}) as http:
                wait_for(http, batch_id, finished_at_least(point))
            gateway.kill()
    with (
        gateway_process(fork_server, state, tiny_model_dir) as gateway,
        httpx.Client(**{**options, "base_url": gateway.base_url}) as http,
    ):
        batch = wait_for(http, batch_id, lambda b: b["status"] in ("completed", "failed"))
        assert batch["status"] == "completed", batch
        assert batch["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
        content = http.get(f"/v1/files/{batch['output_file_id']}/content").content

    output = [json.loads(line) for line in content.splitlines()]
    assert sorted(line["custom_id"] for line in output) == sorted(f"line-{i}" for i in range(LINES))
    # Billed once each: the attempts cut off by the kills left no record.
    engine = create_engine(f"sqlite:///{state / 'gateway.db'}")
    with engine.connect() as connection:
        columns = (UsageRow.request_id, UsageRow.batch_id, UsageRow.status)
        rows = connection.execute(select(*columns)).all()
    engine.dispose()
    every_line = sorted(f"{batch_id}-{n}" for n in range(1, LINES + 1))
    assert sorted(row.request_id for row in rows) == every_line
    assert {(row.batch_id, row.status) for row in rows} == {(batch_id, "ok")}
