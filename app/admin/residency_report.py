"""Per adapter version: where it is and how it was served, from the engine's metrics."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from app.metrics import TIER_LEVEL, Tier, collection_registry

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
    for family in collection_registry(metrics_dir).collect():
        for sample in family.samples:
            labels = sample.labels
            if "adapter" not in labels:
                continue
            facts = found[labels["adapter"], labels["version"]]
            if sample.name == "lora_gateway_adapter_uses_total":
                facts.uses[labels["tier"]] = int(sample.value)
            elif sample.name == "lora_gateway_adapter_swaps_total":
                facts.swaps[labels["stage"]] = int(sample.value)
            elif sample.name == "lora_gateway_adapter_swap_time_seconds_total":
                facts.swap_seconds[labels["stage"]] = sample.value
            elif sample.name == "lora_gateway_adapter_tier":
                facts.tier = LEVEL_TIER.get(int(sample.value))
    return found
