"""Our gateway's adapter residency figures, read from its ``/metrics``: the adapters' loads and
activations, and the requests vLLM paused (``vllm:num_preemptions``, where a slot turn pauses
its holder's requests), the slot turns and the seats taken back for the headroom. And the
engine's work, which vLLM's server reports too (``vllm:iteration_tokens_total``): the tokens
its steps computed (prompts and outputs) and how many steps.

The counters are cumulative since the engine started, and one engine serves
every workload point of a round: each point's figures are the difference of
a scrape before and after it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from app.metrics import (
    ADAPTER_SWAP_SECONDS,
    ADAPTER_USES,
    HEADROOM_SEATS,
    SLOT_TURN_LEAD_STEPS,
    SLOT_TURNS,
    SWAP_STAGES,
    TIERS,
    family_name,
)

USES = family_name(ADAPTER_USES)
SWAP = family_name(ADAPTER_SWAP_SECONDS)
PREEMPTIONS_METRIC = "vllm:num_preemptions_total"
STEP_TOKENS_METRIC = "vllm:iteration_tokens_total"
TURNS = family_name(SLOT_TURNS)
TURN_LEAD = family_name(SLOT_TURN_LEAD_STEPS)
SEATS = family_name(HEADROOM_SEATS)
STAGES: tuple[str, ...] = SWAP_STAGES


@dataclass
class SwapCounters:
    uses: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIERS, 0.0))
    swaps: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    swap_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    # stage -> {upper bound: cumulative count}
    swap_buckets: dict[str, dict[float, float]] = field(default_factory=lambda: defaultdict(dict))
    preemptions: float = 0.0
    turns: float = 0.0  # slot turns taken, by any rule
    first_token_turns: float = 0.0  # ... of them, for a first token only (rule first_token)
    headroom_seats: float = 0.0  # seats taken back for the headroom, parked or preempted
    # {upper bound: cumulative count} of the steps each turn took to deliver its token
    turn_lead_buckets: dict[float, float] = field(default_factory=dict)
    engine_tokens: float = 0.0  # computed by the engine's steps, prompts and outputs
    engine_steps: float = 0.0

    def combined(self, other: SwapCounters, sign: float) -> SwapCounters:
        """``self + sign * other``, key by key (a scrape difference, or a sum of rounds)."""

        def merge(mine: dict[Any, float], theirs: dict[Any, float]) -> dict[Any, float]:
            return {k: mine.get(k, 0.0) + sign * theirs.get(k, 0.0) for k in {*mine, *theirs}}

        stages = {*self.swap_buckets, *other.swap_buckets}
        return SwapCounters(
            uses=merge(self.uses, other.uses),
            swaps=merge(self.swaps, other.swaps),
            swap_seconds=merge(self.swap_seconds, other.swap_seconds),
            swap_buckets=defaultdict(
                dict,
                {
                    s: merge(self.swap_buckets.get(s, {}), other.swap_buckets.get(s, {}))
                    for s in stages
                },
            ),
            preemptions=self.preemptions + sign * other.preemptions,
            turns=self.turns + sign * other.turns,
            first_token_turns=self.first_token_turns + sign * other.first_token_turns,
            headroom_seats=self.headroom_seats + sign * other.headroom_seats,
            turn_lead_buckets=merge(self.turn_lead_buckets, other.turn_lead_buckets),
            engine_tokens=self.engine_tokens + sign * other.engine_tokens,
            engine_steps=self.engine_steps + sign * other.engine_steps,
        )

    def __sub__(self, before: SwapCounters) -> SwapCounters:
        return self.combined(before, -1.0)

    def __add__(self, other: SwapCounters) -> SwapCounters:
        return self.combined(other, 1.0)

    def swap_quantile(self, stage: str, q: float) -> float | None:
        return histogram_quantile(self.swap_buckets.get(stage, {}), q)

    def to_json(self) -> dict[str, Any]:
        uses = sum(self.uses.values())
        return {
            "uses": dict(self.uses),
            "device_hit_rate": self.uses["device"] / uses if uses else None,
            "swaps": dict(self.swaps),
            "swap_mean_seconds": {
                s: self.swap_seconds[s] / self.swaps[s] if self.swaps[s] else None for s in STAGES
            },
            "swap_p50_seconds": {s: self.swap_quantile(s, 0.5) for s in STAGES},
            "swap_p99_seconds": {s: self.swap_quantile(s, 0.99) for s in STAGES},
            "preemptions": self.preemptions,
            "turns": self.turns,
            "headroom_seats": self.headroom_seats,
        }


def parse_swap_counters(text: str) -> SwapCounters:
    counters = SwapCounters()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == f"{USES}_total" and labels.get("tier") in counters.uses:
                counters.uses[labels["tier"]] += sample.value
            elif sample.name == f"{SWAP}_count" and labels.get("stage") in STAGES:
                counters.swaps[labels["stage"]] += sample.value
            elif sample.name == f"{SWAP}_sum" and labels.get("stage") in STAGES:
                counters.swap_seconds[labels["stage"]] += sample.value
            elif sample.name == f"{SWAP}_bucket" and labels.get("stage") in STAGES:
                bound = float(labels["le"])
                buckets = counters.swap_buckets[labels["stage"]]
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
            elif sample.name == PREEMPTIONS_METRIC:
                counters.preemptions += sample.value
            elif sample.name == f"{TURNS}_total":
                counters.turns += sample.value
                if labels.get("rule") == "first_token":
                    counters.first_token_turns += sample.value
            elif sample.name == f"{SEATS}_total":
                counters.headroom_seats += sample.value
            elif sample.name == f"{STEP_TOKENS_METRIC}_sum":
                counters.engine_tokens += sample.value
            elif sample.name == f"{STEP_TOKENS_METRIC}_count":
                counters.engine_steps += sample.value
            elif sample.name == f"{TURN_LEAD}_bucket":
                bound = float(labels["le"])
                buckets = counters.turn_lead_buckets
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return counters


def histogram_quantile(cumulative: Mapping[float, float], q: float) -> float | None:
    """Prometheus' ``histogram_quantile`` over ``{upper bound: cumulative count}``: linear
    within the bucket holding rank q."""
    buckets = sorted(cumulative.items())
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            share = (rank - lower_count) / (count - lower_count) if count > lower_count else 0
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound
