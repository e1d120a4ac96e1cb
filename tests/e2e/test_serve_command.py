"""``lora-gateway serve`` as an operator runs it: settings from the environment, HTTPS with a
certificate, adapters and tenants set up and a key issued by the CLI, the key used with the
``openai`` client.

Then its engine core process is killed (``kill -9``) under load: every request in flight ends
at once with an error (a 503, or a stream's error event then ``[DONE]``), ``/readyz`` turns
503, new requests are refused, and the gateway process exits with a failure status within
seconds, so that its supervisor starts a new one. Never a hang, never a 200 with wrong
content. (One process for both: each start of the real engine costs most of a minute. A
clean stop on SIGINT is checked on the front role's ``lora-gateway serve``, in
tests/serving/front/test_serving_front.py, and the engine's shutdown in the lifespan by
every in-process gateway of the e2e suite.)

Run with ``-s`` to see the measured times."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from app.server import ENGINE_DEAD
from tests.support.live_gateway import ENGINE_START_TIMEOUT_S, MAX_MODEL_LEN, long_stream
from tests.support.servers import free_port, wait_until_ready
from tests.support.tls import self_signed_certificate
from tools.demo.training import DEMO_ADAPTERS

pytestmark = pytest.mark.slow

MODEL = "legal_advisor"  # acme-legal's (tenants/acme-legal.yaml)
STREAMS, PLAIN = 3, 3
SETTLE_S = 15.0  # in-flight requests must have ended by then
EXIT_S = 45.0  # and the process must have exited


@dataclass
class Outcome:
    stream: bool
    status: int | None = None
    events: list[str] = field(default_factory=list)
    body: Any = None
    ended_at: float | None = None
    error: str | None = None

    def verdict(self, killed_at: float) -> str:
        """``refused``: the error the client should see; ``finished``: a complete answer
        that ended before the kill; anything else is wrong."""
        if self.ended_at is None:
            return "hung"
        if self.error is not None:
            return f"transport error: {self.error}"
        if self.ended_at < killed_at and self.status == 200:
            return "finished"
        if not self.stream:
            code = (self.body or {}).get("error", {}).get("code")
            return "refused" if self.status == 503 and code == "engine_unavailable" else "wrong"
        if self.status == 503:
            return "refused"
        errors = [e for e in self.events if e != "[DONE]" and "error" in json.loads(e)]
        ends_well = self.events[-2:-1] == errors[-1:] and self.events[-1:] == ["[DONE]"]
        return "refused" if self.status == 200 and len(errors) == 1 and ends_well else "wrong"


def engine_core(gateway_pid: int) -> psutil.Process:
    for child in psutil.Process(gateway_pid).children(recursive=True):
        title = " ".join(child.cmdline()) or child.name()
        if "EngineCore" in title or child.name().startswith("VLLM::Engine"):
            return child
    raise AssertionError("no VLLM::EngineCore process under the gateway")


async def ask(client: httpx.AsyncClient, key: str, stream: bool, outcome: Outcome) -> None:
    body = {**long_stream(MODEL), "stream": stream, "max_tokens": 900 if stream else 600}
    headers = {"Authorization": f"Bearer {key}"}
    try:
        async with client.stream(
            "POST", "/v1/chat/completions", json=body, headers=headers
        ) as answer:
            outcome.status = answer.status_code
            if stream and answer.status_code == 200:
                async for line in answer.aiter_lines():
                    if line.startswith("data: "):
                        outcome.events.append(line.removeprefix("data: "))
            else:
                outcome.body = json.loads(await answer.aread())
    except httpx.HTTPError as exc:
        outcome.error = repr(exc)
    outcome.ended_at = time.monotonic()


async def first_503(client: httpx.AsyncClient, deadline: float) -> float | None:
    while time.monotonic() < deadline:
        try:
            if (await client.get("/readyz")).status_code == 503:
                return time.monotonic()
        except httpx.TransportError:
            return None  # already gone: the listener closed before a probe saw the 503
        await asyncio.sleep(0.05)
    return None


async def kill_under_load(
    base_url: str, tls: ssl.SSLContext, key: str, gateway_pid: int
) -> dict[str, Any]:
    timeout = httpx.Timeout(SETTLE_S + 60, connect=5)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, verify=tls) as client:
        outcomes = [Outcome(stream=n < STREAMS) for n in range(STREAMS + PLAIN)]
        requests = [asyncio.create_task(ask(client, key, o.stream, o)) for o in outcomes]
        # Every stream has produced tokens: the requests are in the engine.
        deadline = time.monotonic() + 120
        while not all(len(o.events) >= 3 for o in outcomes if o.stream):
            assert not any(r.done() for r in requests), outcomes
            assert time.monotonic() < deadline, outcomes
            await asyncio.sleep(0.1)
        core = engine_core(gateway_pid)
        core.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        ready_503 = asyncio.create_task(first_503(client, killed_at + SETTLE_S))
        late = Outcome(stream=False)
        await asyncio.sleep(0.5)
        await ask(client, key, False, late)  # a new request, after the kill
        await asyncio.wait(requests, timeout=SETTLE_S)
        verdicts = [o.verdict(killed_at) for o in outcomes]
        late_verdict = "refused" if late.error is not None else late.verdict(killed_at)
        readyz_at = await ready_503
        return {
            "killed_at": killed_at,
            "verdicts": verdicts,
            "late": late_verdict,
            "ended_after_s": [
                None if o.ended_at is None else round(o.ended_at - killed_at, 2) for o in outcomes
            ],
            "readyz_503_after_s": None if readyz_at is None else round(readyz_at - killed_at, 2),
        }


def test_serve_over_https_then_lose_the_engine_core_under_load(tmp_path: Path) -> None:
    cert, key_file = self_signed_certificate(tmp_path)
    tls = ssl.create_default_context(cafile=cert)
    port = free_port()
    base_url = f"https://127.0.0.1:{port}"
    env = {
        **os.environ,
        "LORA_GATEWAY_PORT": str(port),
        "LORA_GATEWAY_SSL_CERTFILE": str(cert),
        "LORA_GATEWAY_SSL_KEYFILE": str(key_file),
        "LORA_GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
        "LORA_GATEWAY_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
        "LORA_GATEWAY_KV_CACHE_GIB": "1",
    }

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", *args],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout.strip()

    for adapter in DEMO_ADAPTERS:
        cli("adapters", "register", adapter)
    assert "granted acme-legal:legal_advisor" in cli("tenants", "apply", "tenants/")
    assert cli("tenants", "apply", "tenants/").endswith("no change")
    tenant_key = cli("keys", "create", "acme-legal")

    gateway = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve"], env=env, start_new_session=True
    )
    try:
        with httpx.Client(verify=tls) as http:
            wait_until_ready(
                f"{base_url}/readyz",
                alive=lambda: gateway.poll() is None,
                timeout=ENGINE_START_TIMEOUT_S,
                http=http,
            )
            with pytest.raises(httpx.TransportError):
                httpx.get(f"http://127.0.0.1:{port}/healthz")  # plaintext is refused
            client = openai.OpenAI(
                base_url=f"{base_url}/v1", api_key=tenant_key, http_client=http, max_retries=0
            )
            response = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=5
            )
            assert response.usage is not None and response.usage.completion_tokens >= 1

        report = asyncio.run(kill_under_load(base_url, tls, tenant_key, gateway.pid))
        status = gateway.wait(timeout=EXIT_S)
        report["exit_after_s"] = round(time.monotonic() - report.pop("killed_at"), 2)
        report["exit_status"] = status
        print("\nengine kill under load:", json.dumps(report))

        assert status == ENGINE_DEAD
        assert all(v in ("refused", "finished") for v in report["verdicts"]), report
        assert report["verdicts"].count("refused") >= STREAMS, report  # the kill hit them
        assert report["late"] == "refused", report
        assert all(t is not None and t < SETTLE_S for t in report["ended_after_s"]), report
    finally:
        if gateway.poll() is None:
            os.killpg(gateway.pid, signal.SIGKILL)
            gateway.wait()
