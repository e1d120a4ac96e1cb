"""Per adapter version: where it is and how it was served, from the engine's metrics."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from app.metrics import (
    ADAPTER_SWAP_TIME,
    ADAPTER_SWAPS,
    ADAPTER_TIER,
    ADAPTER_USES,
    TIER_LEVEL,
    Tier,
    collection_registry,
    family_name,
)

LEVEL_TIER: dict[int, Tier] = {level: tier for tier, level in TIER_LEVEL.items()}


@dataclass
class Residency:
    tier: Tier | None = None
    uses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIER_LEVEL, 0))
    swaps: dict[str, int] = field(default_factory=dict)
    swap_seconds: dict[str, float] = field(default_factory=dict)

    def mean_swap_ms(self) -> dict[str, float]:
        return {
            stage: round(1000 * self.swap_seconds.get(stage, 0.0) / count, 3)
            for stage, count in self.swaps.items()
            if count
        }


def read_residency(metrics_dir: Path | None) -> dict[tuple[str, str], Residency]:
    """``(adapter, version) -> Residency`` from every process's merged metrics."""
    found: dict[tuple[str, str], Residency] = defaultdict(Residency)
    wanted = {
        family_name(metric): metric
        for metric in (ADAPTER_USES, ADAPTER_SWAPS, ADAPTER_SWAP_TIME, ADAPTER_TIER)
    }
    for family in collection_registry(metrics_dir).collect():
        metric = wanted.get(family.name)
        for sample in family.samples if metric is not None else ():
            labels = sample.labels
            if sample.name.endswith("_created") or "adapter" not in labels:
                continue
            facts = found[labels["adapter"], labels["version"]]
            if metric is ADAPTER_USES:
                facts.uses[labels["tier"]] = int(sample.value)
            elif metric is ADAPTER_SWAPS:
                facts.swaps[labels["stage"]] = int(sample.value)
            elif metric is ADAPTER_SWAP_TIME:
                facts.swap_seconds[labels["stage"]] = sample.value
            else:
                facts.tier = LEVEL_TIER.get(int(sample.value))
    return found
