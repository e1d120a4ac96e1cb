"""The benchmark's workloads: who calls what, and when.

Every plan is fixed before any request is sent (seeded), so every system
receives exactly the same requests. Open-loop plans also fix when each request
leaves (Poisson arrivals that never wait for earlier responses, which exposes
queueing when a system falls behind); closed-loop plans are only the sequence
of requests that a fixed number of clients work through, each sending its next
request when its last one finished (saturation throughput).
"""

from __future__ import annotations

import bisect
import itertools
import random
from dataclasses import dataclass

# Short, open-ended questions (the client also sends ignore_eos, so every request
# runs to max_tokens on every system).
PROMPTS = (
    "Write a detailed essay about the history of the printing press.",
    "Explain step by step how a compiler turns source code into machine code.",
    "Describe a long walk through a busy city market in the morning.",
    "List many practical tips for keeping a small vegetable garden healthy.",
    "Tell a long story about a lighthouse keeper and a storm at sea.",
    "Explain in depth how the human immune system fights an infection.",
    "Describe the water cycle and every stage of it in great detail.",
    "Write a thorough guide to planning a week-long hiking trip.",
)


@dataclass(frozen=True)
class Mix:
    """What the requests ask for: which adapters, how popular, how long."""

    adapters: int  # distinct adapters the traffic spreads over
    zipf: float  # popularity exponent: adapter k (0-based) has weight 1/(k+1)**zipf
    base_share: float  # share of requests for the bare base model
    output_tokens: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.adapters < 0 or not 0 <= self.base_share <= 1:
            raise ValueError("adapters must be >= 0 and base_share within [0, 1]")
        if self.adapters == 0 and self.base_share < 1:
            raise ValueError("with no adapters every request must be for the base model")
        if self.output_tokens < 1 or self.zipf < 0:
            raise ValueError("output_tokens must be >= 1 and zipf >= 0")


@dataclass(frozen=True)
class WorkloadSpec(Mix):
    """An open-loop point: the mix, arriving as a Poisson process."""

    rate: float = 1.0  # requests per second (mean of the Poisson process)
    duration: float = 10.0  # seconds of arrivals

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rate <= 0 or self.duration <= 0:
            raise ValueError("rate and duration must be positive")


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    at: float  # seconds after the workload's start (0 in a closed loop)
    tenant: int  # which tenant sends it (tenant i owns adapter i)
    adapter: int | None  # adapter index, or None for the base model
    prompt: str
    max_tokens: int


def zipf_weights(count: int, exponent: float) -> list[float]:
    """Normalised popularity of ``count`` adapters, most popular first."""
    raw = [1.0 / (rank + 1) ** exponent for rank in range(count)]
    total = sum(raw)
    return [weight / total for weight in raw]


class _Draws:
    """One request's random choices after another, from one seeded generator."""

    def __init__(self, mix: Mix) -> None:
        self.mix = mix
        self.rng = random.Random(mix.seed)
        self.cumulative = list(itertools.accumulate(zipf_weights(mix.adapters, mix.zipf)))

    def request(self, index: int, at: float) -> PlannedRequest:
        mix, rng = self.mix, self.rng
        # Draw every random choice for every request, used or not, so a change
        # of one parameter (say base_share) does not reshuffle the others.
        is_base = rng.random() < mix.base_share
        pick = rng.random()
        tenant_pick = rng.random()
        prompt = PROMPTS[rng.randrange(len(PROMPTS))]
        adapter: int | None = None
        if mix.adapters and not is_base:
            adapter = min(
                bisect.bisect_left(self.cumulative, pick * self.cumulative[-1]), mix.adapters - 1
            )
        # A base-model request comes from any of the active tenants alike.
        tenant = adapter if adapter is not None else int(tenant_pick * max(mix.adapters, 1))
        return PlannedRequest(index, at, tenant, adapter, prompt, mix.output_tokens)


def plan(spec: WorkloadSpec) -> list[PlannedRequest]:
    """An open-loop point's requests, in arrival order (deterministic)."""
    draws = _Draws(spec)
    arrivals = random.Random(f"arrivals-{spec.seed}")  # independent of the mix
    requests: list[PlannedRequest] = []
    at = arrivals.expovariate(spec.rate)
    while at < spec.duration:
        requests.append(draws.request(len(requests), at))
        at += arrivals.expovariate(spec.rate)
    return requests


def closed_plan(mix: Mix, count: int) -> list[PlannedRequest]:
    """``count`` requests of ``mix`` for a closed loop, in the order clients take them."""
    if count < 1:
        raise ValueError("a closed loop needs at least one request")
    draws = _Draws(mix)
    return [draws.request(index, 0.0) for index in range(count)]


def tenant_requests(
    count: int, *, tenant: int, adapter: int | None, output_tokens: int, seed: int
) -> list[PlannedRequest]:
    """``count`` requests of one tenant on one model (the noisy-neighbour scenario)."""
    rng = random.Random(f"tenant-{tenant}-{seed}")
    return [
        PlannedRequest(i, 0.0, tenant, adapter, PROMPTS[rng.randrange(len(PROMPTS))], output_tokens)
        for i in range(count)
    ]
