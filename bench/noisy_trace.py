"""Where tenant B's time goes under tenant A's flood, on the gateway alone.

``python -m bench.noisy_trace [--victim-requests N] [--env NAME=VALUE ...]`` starts the
gateway (the benchmark's engine settings and adapters), warms it up, runs scenario (b) of the
benchmark and, meanwhile, reads the gateway's /metrics every ``--poll`` seconds. It prints,
for each of B's requests under the flood, its TTFT as the client saw it beside the gateway's
own account of it: the wait for a slot in the gateway's scheduler, the wait in vLLM's queue
(queued to first scheduled, on the engine's clock) and the gateway's TTFT (admission to the
first token); and a time line of the scheduler's window, the sequences it has in flight, the
engine's running batch and its own queue, and A's queue in the gateway. The figures and the
time line go to ``bench/results/noisy-trace-<time>.json`` too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from app.settings import Settings
from bench.config import FLOOD, BenchConfig
from bench.random_adapters import ensure_bench_adapters
from bench.runner import warm_up
from bench.scenarios import FLOOD_COMPLETED, FLOODER, VICTIM, noisy_neighbour
from bench.systems import EngineConfig, GatewaySystem, tenant_id

# The gateway's histograms (their _sum and _count) whose growth is one request of B's.
WAITS = {
    "scheduler_wait": "lora_gateway_scheduler_queue_wait_seconds",
    "engine_queue_wait": "lora_gateway_queue_wait_seconds",
    "gateway_ttft": "lora_gateway_time_to_first_token_seconds",
}


def read(text: str, victim: str, flooder: str) -> dict[str, float]:
    """The figures of one /metrics page this trace follows."""
    out: dict[str, float] = {}
    histograms = {name: key for key, name in WAITS.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "lora_gateway_scheduler_slots":
                out[labels["state"]] = sample.value
            elif sample.name == "lora_gateway_scheduler_queue_depth":
                if labels.get("tenant") == flooder:
                    out["a_queued"] = sample.value
            elif labels.get("tenant") == victim:
                for suffix in ("_sum", "_count"):
                    base = sample.name.removesuffix(suffix)
                    if sample.name.endswith(suffix) and base in histograms:
                        key = histograms[base] + suffix
                        out[key] = out.get(key, 0.0) + sample.value
    return out


async def trace(system: GatewaySystem, poll: float, stop: asyncio.Event) -> list[dict[str, float]]:
    victim, flooder = tenant_id(VICTIM), tenant_id(FLOODER)
    timeline = []
    began = time.monotonic()
    while not stop.is_set():
        text = await system.metrics_text()
        if text is not None:
            timeline.append({"t": time.monotonic() - began, **read(text, victim, flooder)})
        await asyncio.sleep(poll)
    return timeline


def per_request(timeline: Sequence[dict[str, float]]) -> list[dict[str, float]]:
    """Each of B's requests, from the growth of the histograms between two readings."""
    found: dict[str, list[float]] = {key: [] for key in WAITS}
    last: dict[str, tuple[float, float]] = {}
    for point in timeline:
        for key in WAITS:
            count, total = point.get(f"{key}_count", 0.0), point.get(f"{key}_sum", 0.0)
            # The first reading is the baseline (the warm-up's requests).
            before_count, before_total = last.get(key, (count, total))
            if count > before_count:
                found[key] += [(total - before_total) / (count - before_count)] * int(
                    count - before_count
                )
            last[key] = (count, total)
    rows = min(len(values) for values in found.values())
    return [{key: found[key][i] for key in WAITS} for i in range(rows)]


async def main(config: BenchConfig, extra: dict[str, str], poll: float) -> Path:
    settings = Settings()
    settings = settings.model_copy(
        update={"max_loras": config.max_loras, "max_cpu_loras": max(settings.max_cpu_loras, 4)}
    )
    engine = EngineConfig(settings)
    started = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    work = config.out / f"noisy-trace-{started}"
    work.mkdir(parents=True, exist_ok=True)
    adapters = await asyncio.to_thread(
        ensure_bench_adapters, Path(settings.model), config.adapter_cache, config.adapters
    )
    system = GatewaySystem(engine, config.adapter_cache, work, extra=extra)
    await system.start(adapters, work / "gateway.log")
    try:
        await warm_up(system, adapters)
        stop = asyncio.Event()
        tracer = asyncio.create_task(trace(system, poll, stop))
        samples = await noisy_neighbour(system, adapters, config, 0, lambda record: None)
        stop.set()
        timeline = await tracer
    finally:
        await asyncio.to_thread(system.stop)
    flood = next(s for s in samples if s.point == FLOOD)
    alone = next(s for s in samples if s.point != FLOOD)
    rows = per_request(timeline)[len(alone.records) :]
    client = [r.ttft for r in flood.records]
    completed = flood.counters.get(FLOOD_COMPLETED, 0.0)
    a_rate = completed * config.flood_tokens / flood.wall_seconds
    print(f"B alone, client TTFT (s): {[round(r.ttft or 0, 3) for r in alone.records]}")
    print(
        f"A under its flood: {completed:.0f} streams of {config.flood_tokens} tokens completed "
        f"in {flood.wall_seconds:.1f} s ({a_rate:.0f} output tok/s)"
    )
    print("B under the flood (s): client TTFT | gateway scheduler wait | vLLM queue wait | "
          "gateway TTFT")  # fmt: skip
    for ttft, row in zip(client, rows, strict=False):
        print(
            f"  {ttft or 0:6.3f} | {row['scheduler_wait']:6.3f} | "
            f"{row['engine_queue_wait']:6.3f} | {row['gateway_ttft']:6.3f}"
        )
    keys = ("window", "in_flight", "engine_running", "engine_waiting", "a_queued")
    print("time line (s): " + " ".join(keys))
    for point in timeline[:: max(1, len(timeline) // 40)]:
        print(f"  {point['t']:6.1f} " + " ".join(f"{point.get(k, -1):4.0f}" for k in keys))
    out = config.out / f"noisy-trace-{started}.json"
    out.write_text(
        json.dumps(
            {
                "settings": extra,
                "a_output_tokens_per_second": a_rate,
                "alone": [r.ttft for r in alone.records],
                "flood": client,
                "requests": rows,
                "timeline": timeline,
            },
            indent=1,
        )
    )
    return out


def parse() -> tuple[BenchConfig, dict[str, str], float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--victim-requests", type=int, default=10)
    parser.add_argument("--flood-streams", type=int, default=100)
    parser.add_argument("--poll", type=float, default=0.25, help="seconds between readings")
    parser.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE: LORA_GATEWAY_NAME for the gateway"
    )
    args = parser.parse_args()
    config = replace(
        BenchConfig.quick(),
        victim_requests=args.victim_requests,
        flood_streams=args.flood_streams,
    )
    extra = dict(item.split("=", 1) for item in args.env)
    return config, extra, args.poll


if __name__ == "__main__":
    config, extra, poll = parse()
    print(f"written: {asyncio.run(main(config, extra, poll))}")
