"""The measured process: the real gateway app (routes, authentication, quotas, ledger,
metrics, uvicorn as ``lora-gateway serve`` runs it) over a :class:`PacedEngine`, or, with
``--upstream-url``, in the front role over that upstream (:mod:`tools.gateway_cost.upstream`;
the embedded model's tokenizer, as a front has).

``python -m tools.gateway_cost.server --workdir DIR --port P --rate R [--upstream-url URL]
[--profile FILE]`` serves until SIGINT; with ``--profile`` it runs under cProfile (the event
loop's thread, by its CPU time) and writes the statistics to FILE on the way out.

One route of its own, ``POST /cost/engine-alone``, reads streams from the engine in this
process with nothing of the gateway around them: what the stand-in engine costs on its own,
to tell apart from the gateway's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI
from safetensors.numpy import save_file
from vllm import SamplingParams

from app import access_log
from app.engine.base import Engine
from app.main import create_app
from app.server import run
from app.settings import EMBEDDED_MODEL_DIR, Settings
from tools.gateway_cost.engine import PacedEngine

ADMIN_TOKEN = "gateway-cost-admin-token"


def write_tiny_model(directory: Path) -> Path:
    """What the gateway reads of a base model: its config and a safetensors header."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"num_hidden_layers": 1}))
    weights = {
        f"model.layers.0.self_attn.{name}.weight": np.zeros((8, 8), dtype=np.float32)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj")
    }
    save_file(weights, str(directory / "model.safetensors"))
    return directory


def settings_for(
    workdir: Path, port: int, upstream_url: str | None = None, stream_interval: int = 1
) -> Settings:
    role: dict[str, Any] = (
        {"role": "front", "upstream_url": upstream_url, "model": str(EMBEDDED_MODEL_DIR)}
        if upstream_url
        else {"model": str(write_tiny_model(workdir / "model"))}
    )
    return Settings(
        _env_file=None,
        database_url=f"sqlite+aiosqlite:///{workdir / 'gateway.db'}",
        adapter_root=workdir / "adapters",
        admin_token=ADMIN_TOKEN,
        port=port,
        stream_interval=stream_interval,
        **role,
    )


def add_engine_alone_route(app: FastAPI, engines: list[PacedEngine]) -> None:
    @app.post("/cost/engine-alone")
    async def engine_alone(streams: int, requests_per_stream: int, max_tokens: int) -> int:
        """``streams`` readers of the engine at once, each reading ``requests_per_stream``
        requests in turn, as the gateway's requests do; the tokens they read."""
        engine = engines[0]
        params = SamplingParams(max_tokens=max_tokens)

        async def read(stream: int) -> int:
            tokens = 0
            for number in range(requests_per_stream):
                request_id = f"engine-alone-{stream}-{number}"
                async for output in engine.generate([1, 2, 3], params, request_id, None):
                    tokens += len(output.outputs[0].token_ids)
            return tokens

        return sum(await asyncio.gather(*(read(stream) for stream in range(streams))))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True, help="tokens/s the engine makes")
    parser.add_argument("--upstream-url", help="serve in the front role over this upstream")
    parser.add_argument("--profile", type=Path, help="write cProfile statistics here")
    parser.add_argument("--stream-interval", type=int, default=1, help="tokens a chunk gathers")
    args = parser.parse_args(argv)

    engines: list[PacedEngine] = []

    @asynccontextmanager
    async def paced(settings: Settings) -> AsyncIterator[Engine]:
        engine = PacedEngine(args.rate, stream_interval=settings.stream_interval)
        engines.append(engine)
        try:
            yield engine
        finally:
            await engine.close()

    settings = settings_for(args.workdir, args.port, args.upstream_url, args.stream_interval)
    # Logging as `lora-gateway serve` sets it up: the access log at its default (INFO) costs
    # what it costs in production.
    access_log.configure(settings.log_level, settings.log_format)
    app = create_app(settings, engine_factory=paced)
    if not args.upstream_url:
        add_engine_alone_route(app, engines)
    if args.profile is None:
        run(app, settings)
        return
    # The event loop thread's CPU time, not wall time: on a shared machine a profile by the
    # clock charges whatever function was running when the process was descheduled.
    profiler = cProfile.Profile(time.thread_time)
    try:
        profiler.runcall(run, app, settings)
    finally:
        profiler.dump_stats(str(args.profile))


if __name__ == "__main__":
    main()
