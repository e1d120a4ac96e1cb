"""The app's own cost per request, in one process, with no server and no client: the real
gateway app (:mod:`tools.gateway_cost.server`'s, over its paced engine) called as an ASGI
app by the least a server can do, beside the floor's bare ASGI app called the same way.

``python -m tools.gateway_cost.in_process [--streams 16] [--requests 2048] [--rounds 3]
[--tokens 1] [--endpoint chat|responses] [--profile] [--top 40]`` prints each app's CPU per
request (the event loop's thread), median and spread over the rounds, and the difference:
what the gateway's code, its middleware and the framework add to a request. It moves with
no machine load but this process's, so a change's effect shows in a few rounds where
``make gateway-cost`` needs many; ``make gateway-cost`` stays the figure that is reported.
With ``--profile``, one more round of the gateway runs under cProfile.

With ``--baseline CHECKOUT`` (the root of another checkout, such as a ``git worktree add
--detach`` of the commit to compare against), the same measure runs in two processes at the
same time, that checkout's and this one's, and each round's ratio of this gateway's CPU per
request to the baseline's is printed, then their median and spread: whatever else the
machine does in a round falls on both. ``--baseline-endpoint`` measures the baseline on
another endpoint: ``--baseline . --endpoint responses --baseline-endpoint chat`` is this
checkout's Responses against its chat completions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from app import access_log
from app.engine.base import Engine
from app.main import create_app
from app.settings import Settings
from tools.gateway_cost.engine import PacedEngine
from tools.gateway_cost.floor import asgi_app
from tools.gateway_cost.load import CHAT_PATH, RESPONSES_PATH, chat_body, responses_body
from tools.gateway_cost.server import ADMIN_TOKEN, settings_for

App = Callable[..., Any]
CLIENT = ("127.0.0.1", 50000)


def _scope(path: str, key: str, body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": CLIENT,
        "scheme": "http",
        "root_path": "",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "state": {},
    }


async def _call(app: App, scope: dict[str, Any], body: bytes) -> int:
    """One request, as a server calls the app: its body at once, a disconnect only once the
    response has ended. The bytes of body it answered."""
    ended = asyncio.Event()
    sent = 0
    read = False

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": body, "more_body": False}
        await ended.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal sent
        if message["type"] == "http.response.start":
            assert message["status"] == 200, message
        elif message["type"] == "http.response.body":
            sent += len(message.get("body", b""))
            if not message.get("more_body", False):
                ended.set()

    await app(dict(scope, state={}, headers=list(scope["headers"])), receive, send)
    return sent


async def _phase(app: App, scope: dict[str, Any], body: bytes, streams: int, each: int) -> float:
    """CPU seconds of this thread per request, ``streams`` at once, ``each`` in turn."""

    async def stream() -> None:
        for _ in range(each):
            assert await _call(app, scope, body) > 0

    before = time.thread_time()
    await asyncio.gather(*(stream() for _ in range(streams)))
    return (time.thread_time() - before) / (streams * each)


def _body(endpoint: str, model: str, tokens: int) -> tuple[str, bytes]:
    if endpoint == "responses":
        return RESPONSES_PATH, json.dumps(responses_body(model, tokens)).encode()
    return CHAT_PATH, json.dumps(chat_body(model, tokens)).encode()


async def _set_up(app: App) -> tuple[str, str]:
    """A tenant with a quota (every request takes the quota path), its key and its model."""
    transport = httpx.ASGITransport(app=app)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        while (await client.get("/readyz")).status_code != 200:
            await asyncio.sleep(0.05)
        for path, payload in (
            ("/tenants", {"id": "cost", "name": "Cost", "allow_base_model": True}),
            ("/tenants/cost/keys", {"name": "load"}),
        ):
            reply = await client.post(f"/admin/v1{path}", json=payload, headers=admin)
            reply.raise_for_status()
        key = reply.json()["key"]
        quota = {"token_budget": 10**12, "budget_period": "day", "max_concurrent_requests": 10**5}
        reply = await client.put("/admin/v1/tenants/cost/quota", json=quota, headers=admin)
        reply.raise_for_status()
        models = await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
        return key, str(models.json()["data"][0]["id"])


@asynccontextmanager
async def gateway(workdir: Path, rate: float) -> AsyncIterator[App]:
    """The gateway app, started (its lifespan run) over a paced engine."""

    @asynccontextmanager
    async def paced(settings: Settings) -> AsyncIterator[Engine]:
        engine = PacedEngine(rate, stream_interval=settings.stream_interval)
        try:
            yield engine
        finally:
            await engine.close()

    settings = settings_for(workdir, 8000)
    access_log.configure(settings.log_level, settings.log_format)
    app = create_app(settings, engine_factory=paced)
    async with app.router.lifespan_context(app):
        yield app


def _spread(values: list[float]) -> str:
    us = [v * 1e6 for v in values]
    return f"{statistics.median(us):.0f} ({min(us):.0f}-{max(us):.0f})"


async def measure(args: argparse.Namespace, workdir: Path) -> None:
    async with gateway(workdir, args.rate) as app:
        key, model = await _set_up(app)
        path, body = _body(args.endpoint, model, args.tokens)
        scope = _scope(path, key, body)
        floor_body = json.dumps({"max_tokens": args.tokens}).encode()
        floor_scope = _scope(path, key, floor_body)
        each = max(1, args.requests // args.streams)
        await _phase(app, scope, body, args.streams, max(1, each // 8))  # warm up
        gc.collect()
        gc.freeze()  # as the server does once the engine has started
        ours: list[float] = []
        floor: list[float] = []
        for number in range(args.rounds):
            ours.append(await _phase(app, scope, body, args.streams, each))
            floor.append(await _phase(asgi_app, floor_scope, floor_body, args.streams, each))
            print(
                f"round {number + 1}: gateway {ours[-1] * 1e6:.0f} us, bare ASGI "
                f"{floor[-1] * 1e6:.0f} us a request",
                flush=True,
            )
        added = [a - b for a, b in zip(ours, floor, strict=True)]
        print(
            f"{args.endpoint}, {args.streams} streams, max_tokens {args.tokens}, CPU per request:"
            f" gateway {_spread(ours)} us, bare ASGI {_spread(floor)} us, added {_spread(added)}"
            " us (median, min-max)"
        )
        if args.profile:
            profiler = cProfile.Profile(time.thread_time)
            profiler.enable()
            await _phase(app, scope, body, args.streams, each)
            profiler.disable()
            pstats.Stats(profiler).sort_stats(args.sort).print_stats(args.top)


ROUND = re.compile(r"^round \d+: gateway (\d+) us", re.MULTILINE)


def _side_by_side(args: argparse.Namespace, baseline: Path) -> None:
    """This checkout's measure and ``baseline``'s, in two processes at once; per round, the
    ratio of this gateway's CPU per request to the baseline's."""
    here = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "tools.gateway_cost.in_process"]
    for name in ("streams", "requests", "rounds", "tokens", "rate"):
        command += [f"--{name}", str(getattr(args, name))]
    endpoints = (args.baseline_endpoint or args.endpoint, args.endpoint)
    processes = [
        subprocess.Popen(
            [*command, "--endpoint", endpoint],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for root, endpoint in zip((baseline.resolve(), here), endpoints, strict=True)
    ]
    before, after = ([float(us) for us in ROUND.findall(p.communicate()[0])] for p in processes)
    if any(p.returncode for p in processes) or not before or len(before) != len(after):
        raise SystemExit(f"a measure failed: baseline {before}, this checkout {after}")
    ratios = [a / b for a, b in zip(after, before, strict=True)]
    for number, (b, a, ratio) in enumerate(zip(before, after, ratios, strict=True), 1):
        print(f"round {number}: baseline {b:.0f} us, this checkout {a:.0f} us, {ratio:.3f}x")
    against = f" against {endpoints[0]}" if endpoints[0] != endpoints[1] else ""
    print(
        f"{args.endpoint}{against}, {args.streams} streams, CPU per request, this / baseline: "
        f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f}, median and "
        f"min-max of {len(ratios)} rounds); baseline {_spread([b / 1e6 for b in before])} us, "
        f"this checkout {_spread([a / 1e6 for a in after])} us"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2048, help="requests per phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=1, help="max_tokens of each request")
    parser.add_argument("--rate", type=float, default=20_000, help="the engine's tokens/s")
    parser.add_argument("--endpoint", choices=("chat", "responses"), default="chat")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="tottime", help="the profile's order")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument(
        "--baseline", type=Path, help="another checkout's root: both measured at the same time"
    )
    parser.add_argument(
        "--baseline-endpoint",
        choices=("chat", "responses"),
        help="the baseline's endpoint (default: --endpoint's)",
    )
    args = parser.parse_args(argv)
    if args.baseline is not None:
        _side_by_side(args, args.baseline)
        return
    with (
        tempfile.TemporaryDirectory(prefix="gateway-cost-") as workdir,
        open(os.devnull, "w") as quiet,
        contextlib.redirect_stderr(quiet),  # the access log's lines, as a server's would go
    ):
        asyncio.run(measure(args, Path(workdir)))


if __name__ == "__main__":
    main()
