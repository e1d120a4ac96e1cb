"""Scenario (e), the grid that judges the slot turns: what it measures, point by point.

One workload cannot judge a scheduling rule (issue #49), so the gateway and vLLM's server
with the same ops run a grid of them: adapter popularity (uniform, Zipf), adapters per device
slot (1x, 2x, 3x, 8x), adapter targets (attention only, all seven projections) and load
(closed loops at two concurrencies, an open loop at a share of saturation). Every point
reports goodput, the requests per second that met both latency objectives (DistServe's
term). The objectives are the benchmark's, never tuned: at each load, and for each adapter
target, they are a multiple of what vLLM's server gives at one adapter per slot in the same
round (:data:`TTFT_FACTOR` x its TTFT p50, :data:`TPOT_FACTOR` x its TPOT p50), and the
gateway runs with exactly those as every tenant's objectives, otherwise on its defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench.random_adapters import ALL_PROJECTIONS, BENCH_TARGET_MODULES
from bench.workload import Mix, PlannedRequest, WorkloadSpec, closed_plan, plan

TTFT_FACTOR = 5.0
TPOT_FACTOR = 1.5
POPULARITIES = ("uniform", "zipf")
# Adapter targets: a pool of adapters each; "mixed" takes them in turns (even: attention).
TARGET_MODULES = {"attention": BENCH_TARGET_MODULES, "all": ALL_PROJECTIONS}
TARGETS = (*TARGET_MODULES, "mixed")


@dataclass(frozen=True, order=True)
class Load:
    """A closed loop at ``concurrency``, or an open loop at ``share`` of the saturation that
    vLLM's server measured at one adapter per slot, at the grid's highest concurrency."""

    concurrency: int = 0
    share: float = 0.0

    def __post_init__(self) -> None:
        if (self.concurrency > 0) == (self.share > 0):
            raise ValueError("a load is a closed loop's concurrency or an open loop's share")

    @property
    def closed(self) -> bool:
        return self.concurrency > 0

    @property
    def name(self) -> str:
        if self.closed:
            return f"concurrency {self.concurrency}"
        return f"open loop at {self.share:.0%} of saturation"


@dataclass(frozen=True)
class GridPoint:
    targets: str  # attention, all or mixed
    popularity: str  # uniform or zipf (at 1x: uniform, as popularity changes nothing there)
    multiple: int  # adapters per device slot
    load: Load

    def __post_init__(self) -> None:
        if self.targets not in TARGETS or self.popularity not in POPULARITIES:
            raise ValueError(f"targets among {TARGETS}, popularity among {POPULARITIES}")
        if self.multiple < 1:
            raise ValueError("adapters per slot must be at least 1")
        if self.multiple == 1 and self.popularity != "uniform":
            raise ValueError("one adapter per slot is one point: uniform")

    @property
    def group(self) -> tuple[str, Load]:
        """The points that share objectives: same targets, same load."""
        return self.targets, self.load

    @property
    def reference(self) -> GridPoint:
        """The point that fixes this one's objectives: one adapter per slot, uniform."""
        return GridPoint(self.targets, "uniform", 1, self.load)

    def name(self, slots: int) -> str:
        spread = "" if self.multiple == 1 else f"{self.popularity} "
        return (
            f"e: {self.targets}, {spread}{self.multiple}x ({self.multiple * slots} adapters on "
            f"{slots} slots), {self.load.name}"
        )


@dataclass(frozen=True)
class GridConfig:
    """The grid and its sizes. The defaults keep a round of both systems within 90 minutes on
    the 2-core CPU machine; on a GPU, raise them."""

    rounds: int = 3
    max_loras: int = 4
    seed: int = 0
    draws: int = 2000
    targets: tuple[str, ...] = ("attention", "all")
    popularities: tuple[str, ...] = POPULARITIES
    zipf: float = 1.0
    multiples: tuple[int, ...] = (1, 2, 3, 8)
    concurrencies: tuple[int, ...] = (16, 64)
    open_share: float = 0.7  # 0: no open-loop load
    waves: int = 2  # a closed loop sends waves x concurrency requests ...
    # ... and no fewer than this: at concurrency 16, two waves (32 requests) end within 15 s
    # on the 2-core machine, where the loop's start and its drain weigh more than any rule
    # (docs/performance-log.md, "the grid's short points").
    min_closed_requests: int = 96
    open_requests: int = 48  # per open-loop point
    prompt_tokens: int = 64
    output_tokens: int = 32
    # The points to run, where not the whole grid (the quick run's).
    only: tuple[GridPoint, ...] = ()
    out: Path = Path("bench/results")
    adapter_cache: Path = Path("var/bench")
    gateway_settings: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.waves < 1 or not self.concurrencies:
            raise ValueError("rounds, waves and concurrencies must be positive")
        if 1 not in self.multiples or min(self.multiples) < 1:
            raise ValueError("adapters per slot: whole multiples, 1 among them")
        if set(self.targets) - set(TARGETS) or set(self.popularities) - set(POPULARITIES):
            raise ValueError(f"targets among {TARGETS}, popularities among {POPULARITIES}")
        if not 0 <= self.open_share <= 2:
            raise ValueError("the open loop's share of saturation is within (0, 2]")

    @classmethod
    def quick(cls) -> GridConfig:
        """One round: uniform 3x over attention-only and all-projection adapters mixed, and
        Zipf 8x over attention-only ones, at concurrency 16 (with their 1x references)."""
        c16 = Load(concurrency=16)
        return cls(
            rounds=1,
            concurrencies=(16,),
            open_share=0.0,
            only=(
                GridPoint("mixed", "uniform", 3, c16),
                GridPoint("attention", "zipf", 8, c16),
            ),
        )

    @property
    def loads(self) -> tuple[Load, ...]:
        closed = tuple(Load(concurrency=c) for c in sorted(self.concurrencies))
        return closed + ((Load(share=self.open_share),) if self.open_share else ())

    @property
    def saturation_load(self) -> Load:
        """The closed loop whose 1x rate the open loop takes its share of."""
        return Load(concurrency=max(self.concurrencies))

    def points(self) -> list[GridPoint]:
        """Every point to run, in running order: by targets and load (closed loops first, so
        the open loop's saturation is known when it runs), each group's 1x reference first."""
        wanted = self.only or [
            GridPoint(targets, popularity if multiple > 1 else "uniform", multiple, load)
            for targets in self.targets
            for load in self.loads
            for multiple in self.multiples
            for popularity in (self.popularities if multiple > 1 else ("uniform",))
        ]
        needed = list(dict.fromkeys(p for w in wanted for p in (w.reference, w)))
        if any(not p.load.closed for p in needed):  # its rate comes from the saturation
            needed += [GridPoint(p.targets, "uniform", 1, self.saturation_load) for p in needed]
        order = {load: i for i, load in enumerate(sorted({p.load for p in needed}, key=_order))}
        targets = list(dict.fromkeys(p.targets for p in needed))
        return sorted(
            dict.fromkeys(needed),
            key=lambda p: (targets.index(p.targets), order[p.load], p.multiple, p.popularity),
        )

    def pool_size(self) -> int:
        """Adapters each pool needs: the largest multiple of the slots."""
        return max(p.multiple for p in self.points()) * self.max_loras

    def adapter_index(self, point: GridPoint, nth: int) -> int:
        """The ``nth`` adapter of ``point`` in the systems' adapter list: the attention pool,
        then the all-projection pool, each :meth:`pool_size` long."""
        pool = self.pool_size()
        if point.targets == "attention" or (point.targets == "mixed" and nth % 2 == 0):
            return nth
        return pool + nth

    def closed_requests(self, load: Load) -> int:
        """How many requests a closed loop at ``load`` sends."""
        return max(self.waves * load.concurrency, self.min_closed_requests)

    def mix(self, point: GridPoint) -> Mix:
        zipf = self.zipf if point.popularity == "zipf" else 0.0
        return Mix(point.multiple * self.max_loras, zipf, 0.0, self.output_tokens, self.seed)

    def requests(self, point: GridPoint, rate: float | None = None) -> list[PlannedRequest]:
        """``point``'s requests (prompts still to be sized), each naming its adapter in the
        systems' list and sent by that adapter's tenant; an open loop at ``rate`` req/s."""
        mix = self.mix(point)
        if point.load.closed:
            planned = closed_plan(mix, self.closed_requests(point.load))
        else:
            if rate is None or rate <= 0:
                raise ValueError("an open-loop point needs its rate")
            planned = plan(
                WorkloadSpec(
                    mix.adapters, mix.zipf, 0.0, mix.output_tokens, mix.seed,
                    rate=rate, duration=self.open_requests / rate,
                )
            )  # fmt: skip
        placed = []
        for request in planned:
            assert request.adapter is not None  # no base-model share in the grid
            index = self.adapter_index(point, request.adapter)
            placed.append(
                PlannedRequest(
                    request.index, request.at, index, index, request.prompt, request.max_tokens
                )
            )
        return placed


def _order(load: Load) -> tuple[int, int, float]:
    return (0 if load.closed else 1, load.concurrency, load.share)


@dataclass(frozen=True)
class Objectives:
    """A group's objectives, in seconds."""

    ttft: float
    tpot: float

    @classmethod
    def from_reference(cls, ttft_p50: float, tpot_p50: float) -> Objectives:
        return cls(TTFT_FACTOR * ttft_p50, TPOT_FACTOR * tpot_p50)

    def milliseconds(self) -> tuple[int, int]:
        """As a tenant's objectives are set: whole milliseconds, at least 1."""
        return max(1, round(self.ttft * 1000)), max(1, round(self.tpot * 1000))
