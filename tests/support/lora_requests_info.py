"""``vllm:lora_requests_info`` read as the llm-d router's EPP reads it.

A port of the EPP's LoRA extraction (llm-d/llm-d-router,
``pkg/epp/framework/plugins/datalayer/extractor/metrics/``: ``LoRASpec.getLatestMetric`` in
``loraspec.go``, ``populateLoRAMetrics`` and ``addAdapters`` in ``extractor.go``):

* vLLM sets a new series (one per label combination) to the current time whenever its
  adapter lists change; the series with the highest value is the current one (ties keep the
  first seen, as the EPP's strict ``>`` does);
* ``running_lora_adapters`` and ``waiting_lora_adapters`` are comma-separated names, each
  trimmed, empty ones dropped; ``max_lora`` is an integer (empty: 0; not an integer: an
  error, the adapter lists are still read);
* no family, or a family without series, is "no LoRA information" (``None``), not an error
  (the EPP's issue #926).

The tests use it to check what the EPP's ``lora-affinity-scorer`` would see on an engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

LORA_INFO_METRIC = "vllm:lora_requests_info"
RUNNING = "running_lora_adapters"
WAITING = "waiting_lora_adapters"
MAX_LORA = "max_lora"
_GO_ATOI = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.Atoi accepts (no spaces, no _)


@dataclass(frozen=True)
class LoraRequestsInfo:
    """The EPP's ``ActiveModels``, ``WaitingModels`` and ``MaxActiveModels`` of one pod."""

    running: frozenset[str]
    waiting: frozenset[str]
    max_lora: int
    errors: tuple[str, ...] = field(default=())


def _adapters(csv: str) -> frozenset[str]:
    return frozenset(name.strip() for name in csv.split(",") if name.strip())


def parse_lora_requests_info(
    exposition: str, *, labels: dict[str, str] | None = None
) -> LoraRequestsInfo | None:
    """The newest ``vllm:lora_requests_info`` series in ``exposition`` (Prometheus text) among
    those carrying ``labels`` (the EPP's spec labels; none by default), or ``None``."""
    wanted = labels or {}
    latest = None
    recent = -1.0
    for family in text_string_to_metric_families(exposition):
        if family.name != LORA_INFO_METRIC:
            continue
        for sample in family.samples:
            if all(sample.labels.get(k) == v for k, v in wanted.items()) and sample.value > recent:
                recent = sample.value
                latest = sample
    if latest is None:
        return None
    errors: list[str] = []
    max_lora = 0
    if latest.labels.get(MAX_LORA, ""):
        value = latest.labels[MAX_LORA]
        if _GO_ATOI.fullmatch(value):
            max_lora = int(value)
        else:
            errors.append(f"{MAX_LORA}={value!r} is not an integer")
    return LoraRequestsInfo(
        running=_adapters(latest.labels.get(RUNNING, "")),
        waiting=_adapters(latest.labels.get(WAITING, "")),
        max_lora=max_lora,
        errors=tuple(errors),
    )
