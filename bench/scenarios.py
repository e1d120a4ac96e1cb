"""The scenarios, each run against one started system, each giving samples.

(a) many adapters with Zipf popularity: closed-loop saturation at fixed
concurrencies, then open-loop points at shares of the saturation rate;
(b) noisy neighbour: tenant B's requests alone, then under tenant A's flood;
(c) many registered adapters: the same closed loop over 1 adapter and over
all of them, alternated;
(d) the cold-start cliff: open loops over as many adapters as device slots, and
multiples of that, at one rate below saturation.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from bench.client import ClosedLoop, RequestRecord, run_closed_loop, run_workload
from bench.config import (
    FLOOD,
    ONE_ADAPTER,
    SOLO,
    BenchConfig,
    cliff_saturation_point,
    curve_point,
    many_adapters_point,
    saturation_point,
)
from bench.random_adapters import BenchAdapter
from bench.stats import (
    ACTIVATION_SECONDS,
    ACTIVATIONS,
    ENGINE_STEPS,
    ENGINE_TOKENS,
    FIRST_TOKEN_TURNS,
    HEADROOM_SEATS,
    LOAD_SECONDS,
    LOADS,
    PREEMPTIONS,
    REQUESTS_PS,
    TURN_LEAD,
    TURNS,
    Sample,
)
from bench.swap_counters import parse_swap_counters
from bench.systems import System
from bench.workload import PlannedRequest, WorkloadSpec, closed_plan, plan, tenant_requests

# Requests still running this long after the last open-loop arrival count as errors.
MIN_DRAIN_SECONDS = 60.0
# Tenants of the noisy-neighbour scenario (each owns the adapter of its index).
FLOODER, VICTIM = 0, 1
FLOOD_FLOWING_TIMEOUT_SECONDS = 600.0
FLOOD_COMPLETED = "flood_completed"  # tenant A's requests that ran to their end
FLOOD_REFUSED = "flood_refused"  # ... and those the system turned away (429)

Measure = Callable[[], Awaitable[tuple[list[RequestRecord], float]]]
Progress = Callable[[RequestRecord], None]
Prompts = Callable[[str], str]  # a prompt for a request's label (bench.prompts.SizedPrompts)


async def sample_of(system: System, point: str, round_: int, measure: Measure) -> Sample:
    """Run ``measure``; with what the system's engine computed over it (its steps, and the
    requests it paused), and the gateway's adapter loads, activations, turns and seats where
    it counts them."""
    before = await system.metrics_text()
    records, wall = await measure()
    after = await system.metrics_text()
    counters: dict[str, float] = {}
    if before is not None and after is not None:
        delta = parse_swap_counters(after) - parse_swap_counters(before)
        counters = {
            ENGINE_TOKENS: delta.engine_tokens,
            ENGINE_STEPS: delta.engine_steps,
            PREEMPTIONS: delta.preemptions,
        }
        if system.counts_adapters:
            counters |= {
                LOADS: delta.swaps["load"],
                ACTIVATIONS: delta.swaps["activate"],
                LOAD_SECONDS: delta.swap_seconds["load"],
                ACTIVATION_SECONDS: delta.swap_seconds["activate"],
                TURNS: delta.turns,
                FIRST_TOKEN_TURNS: delta.first_token_turns,
                HEADROOM_SEATS: delta.headroom_seats,
                **{f"{TURN_LEAD}{bound}": n for bound, n in delta.turn_lead_buckets.items()},
            }
    return Sample(system.name, point, round_, tuple(records), wall, counters)


async def saturation(
    system: System,
    adapters: Sequence[BenchAdapter],
    config: BenchConfig,
    round_: int,
    progress: Progress,
) -> list[Sample]:
    samples = []
    for concurrency in config.concurrencies:
        requests = closed_plan(config.mix(), config.waves * concurrency)

        async def measure(
            concurrency: int = concurrency, requests: Sequence[PlannedRequest] = requests
        ) -> tuple[list[RequestRecord], float]:
            return await run_closed_loop(
                system.base_url, system.name, saturation_point(concurrency), requests,
                lambda p: system.call_for(p, adapters), concurrency=concurrency,
                timeout_seconds=config.timeout_seconds, on_finished=progress,
            )  # fmt: skip

        samples.append(await sample_of(system, saturation_point(concurrency), round_, measure))
    return samples


async def curve(
    system: System,
    adapters: Sequence[BenchAdapter],
    config: BenchConfig,
    rates: dict[float, float],
    round_: int,
    progress: Progress,
) -> list[Sample]:
    """Open-loop points at the run's fixed rates (fraction of saturation -> req/s)."""
    samples = []
    for fraction, rate in rates.items():
        spec = config.curve_spec(rate)

        async def measure(
            spec: WorkloadSpec = spec, fraction: float = fraction
        ) -> tuple[list[RequestRecord], float]:
            return await run_workload(
                system.base_url, system.name, curve_point(fraction), plan(spec),
                lambda p: system.call_for(p, adapters),
                drain_seconds=max(MIN_DRAIN_SECONDS, spec.duration), on_finished=progress,
            )  # fmt: skip

        samples.append(await sample_of(system, curve_point(fraction), round_, measure))
    return samples


async def noisy_neighbour(
    system: System,
    adapters: Sequence[BenchAdapter],
    config: BenchConfig,
    round_: int,
    progress: Progress,
) -> list[Sample]:
    """Tenant B, one request at a time: alone, then while tenant A keeps
    ``flood_streams`` streams open (each replaced as soon as it ends)."""
    victim = tenant_requests(
        config.victim_requests, tenant=VICTIM, adapter=VICTIM,
        output_tokens=config.victim_tokens, seed=config.seed,
    )  # fmt: skip
    flood = tenant_requests(
        config.flood_streams, tenant=FLOODER, adapter=FLOODER,
        output_tokens=config.flood_tokens, seed=config.seed,
    )  # fmt: skip

    async def alone() -> tuple[list[RequestRecord], float]:
        return await run_closed_loop(
            system.base_url, system.name, SOLO, victim, lambda p: system.call_for(p, adapters),
            concurrency=1, timeout_seconds=config.timeout_seconds, on_finished=progress,
        )  # fmt: skip

    samples = [await sample_of(system, SOLO, round_, alone)]
    flowing = asyncio.Event()
    flooder = ClosedLoop(
        system.base_url, system.name, "b: tenant A's flood", flood,
        lambda p: system.call_for(p, adapters), concurrency=config.flood_streams, cycle=True,
        on_finished=lambda record: flowing.set() if record.ok else None,
    )  # fmt: skip

    async def under_flood() -> tuple[list[RequestRecord], float]:
        flooder.start()
        try:
            # B starts once A's streams flow: one of them has run to its end, so
            # the engine's batch is full of A and A's next requests queue.
            await asyncio.wait_for(flowing.wait(), FLOOD_FLOWING_TIMEOUT_SECONDS)
            return await run_closed_loop(
                system.base_url, system.name, FLOOD, victim,
                lambda p: system.call_for(p, adapters), concurrency=1,
                timeout_seconds=config.timeout_seconds, on_finished=progress,
            )  # fmt: skip
        finally:
            await flooder.stop()

    sample = await sample_of(system, FLOOD, round_, under_flood)
    tallies = {
        FLOOD_COMPLETED: float(sum(1 for r in flooder.records if r.ok)),
        FLOOD_REFUSED: float(sum(1 for r in flooder.records if r.status == 429)),
    }
    samples.append(
        Sample(
            sample.system, sample.point, sample.round, sample.records, sample.wall_seconds,
            {**sample.counters, **tallies},
        )
    )  # fmt: skip
    return samples


async def registered_adapters(
    system: System,
    adapters: Sequence[BenchAdapter],
    config: BenchConfig,
    rounds: int,
    progress: Progress,
) -> list[Sample]:
    """The same closed loop over 1 adapter and over all of ``adapters``, alternated
    ``rounds`` times on one gateway (registering them all takes minutes)."""
    samples = []
    points = {
        ONE_ADAPTER: config.registered_mix(1),
        many_adapters_point(len(adapters)): config.registered_mix(len(adapters)),
    }
    for round_ in range(rounds):
        for point, mix in points.items():
            requests = closed_plan(mix, config.registered_requests)

            async def measure(
                point: str = point, requests: Sequence[PlannedRequest] = requests
            ) -> tuple[list[RequestRecord], float]:
                return await run_closed_loop(
                    system.base_url, system.name, point, requests,
                    lambda p: system.call_for(p, adapters),
                    concurrency=config.registered_concurrency,
                    timeout_seconds=config.timeout_seconds, on_finished=progress,
                )  # fmt: skip

            samples.append(await sample_of(system, point, round_, measure))
    return samples


async def cliff(
    system: System,
    adapters: Sequence[BenchAdapter],
    config: BenchConfig,
    rate: float | None,
    round_: int,
    progress: Progress,
    prompts: Prompts,
) -> tuple[list[Sample], float]:
    """(d) A closed loop over as many adapters as the engine has device slots (its
    saturation), then an open loop at ``rate`` over 1x that many adapters and, per
    popularity, over each larger multiple (``config.cliff_points``). ``rate`` None: this
    system is the round's first, and the rate is ``config.cliff_load`` of the saturation it
    measured. Returns the samples and the rate."""
    slots = system.engine.settings.max_loras

    def sized(requests: Sequence[PlannedRequest], point: str) -> list[PlannedRequest]:
        return [dataclasses.replace(r, prompt=prompts(f"{point} #{r.index}")) for r in requests]

    point = cliff_saturation_point(slots)
    saturating = sized(
        closed_plan(config.cliff_mix(slots), config.waves * config.cliff_concurrency), point
    )

    async def saturate() -> tuple[list[RequestRecord], float]:
        return await run_closed_loop(
            system.base_url, system.name, point, saturating,
            lambda p: system.call_for(p, adapters), concurrency=config.cliff_concurrency,
            timeout_seconds=config.timeout_seconds, on_finished=progress,
        )  # fmt: skip

    samples = [await sample_of(system, point, round_, saturate)]
    if rate is None:
        saturated = REQUESTS_PS.of(samples[0])
        if not saturated:
            raise RuntimeError(f"{system.name} completed nothing over {slots} adapters")
        rate = config.cliff_load * saturated
    for point, (popularity, count) in config.cliff_points(slots).items():
        spec = config.cliff_spec(count, popularity, rate)
        requests = sized(plan(spec), point)

        async def measure(
            point: str = point,
            requests: Sequence[PlannedRequest] = requests,
            spec: WorkloadSpec = spec,
        ) -> tuple[list[RequestRecord], float]:
            return await run_workload(
                system.base_url, system.name, point, requests,
                lambda p: system.call_for(p, adapters),
                drain_seconds=max(MIN_DRAIN_SECONDS, spec.duration), on_finished=progress,
            )  # fmt: skip

        samples.append(await sample_of(system, point, round_, measure))
    return samples, rate
