"""The benchmark's open-loop workload: who calls what, and when.

A plan is fixed before any request is sent (seeded), so both systems receive
exactly the same requests at exactly the same offsets, however fast they
answer: arrivals never wait for earlier responses (open loop), which is what
exposes queueing when a system falls behind.
"""

from __future__ import annotations

import bisect
import itertools
import random
from dataclasses import dataclass

# Short, open-ended questions (the client also sends ignore_eos, so every request
# runs to max_tokens on both systems).
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
class WorkloadSpec:
    rate: float  # requests per second (mean of the Poisson process)
    duration: float  # seconds of arrivals
    adapters: int  # distinct adapters the traffic spreads over
    zipf: float  # popularity exponent: adapter k (0-based) has weight 1/(k+1)**zipf
    base_share: float  # share of requests for the bare base model
    output_tokens: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.duration <= 0:
            raise ValueError("rate and duration must be positive")
        if self.adapters < 0 or not 0 <= self.base_share <= 1:
            raise ValueError("adapters must be >= 0 and base_share within [0, 1]")
        if self.adapters == 0 and self.base_share < 1:
            raise ValueError("with no adapters every request must be for the base model")
        if self.output_tokens < 1 or self.zipf < 0:
            raise ValueError("output_tokens must be >= 1 and zipf >= 0")


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    at: float  # seconds after the workload's start
    tenant: int  # which tenant sends it (tenant i owns adapter i)
    adapter: int | None  # adapter index, or None for the base model
    prompt: str
    max_tokens: int


def zipf_weights(count: int, exponent: float) -> list[float]:
    """Normalised popularity of ``count`` adapters, most popular first."""
    raw = [1.0 / (rank + 1) ** exponent for rank in range(count)]
    total = sum(raw)
    return [weight / total for weight in raw]


def plan(spec: WorkloadSpec) -> list[PlannedRequest]:
    """The requests of one workload point, in arrival order (deterministic)."""
    rng = random.Random(spec.seed)
    cumulative = list(itertools.accumulate(zipf_weights(spec.adapters, spec.zipf)))
    requests: list[PlannedRequest] = []
    at = rng.expovariate(spec.rate)
    while at < spec.duration:
        # Draw every random choice for every request, used or not, so a change
        # of one parameter (say base_share) does not reshuffle the others.
        is_base = rng.random() < spec.base_share
        pick = rng.random()
        tenant_pick = rng.random()
        prompt = PROMPTS[rng.randrange(len(PROMPTS))]
        adapter: int | None = None
        if spec.adapters and not is_base:
            adapter = min(bisect.bisect_left(cumulative, pick * cumulative[-1]), spec.adapters - 1)
        # A base-model request comes from any of the active tenants alike.
        tenant = adapter if adapter is not None else int(tenant_pick * max(spec.adapters, 1))
        requests.append(
            PlannedRequest(len(requests), at, tenant, adapter, prompt, spec.output_tokens)
        )
        at += rng.expovariate(spec.rate)
    return requests
