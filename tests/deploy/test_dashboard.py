"""The Grafana dashboard is valid JSON and only queries metrics we export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import Histogram

from app.metrics import METRICS

DASHBOARD = Path("deploy/grafana/lora-gateway.json")


def exported_series() -> set[str]:
    names = set()
    for metric in METRICS:
        base = metric._name  # type: ignore[attr-defined]
        if isinstance(metric, Histogram):
            names |= {f"{base}_bucket", f"{base}_count", f"{base}_sum"}
        elif metric._type == "counter":  # type: ignore[attr-defined]
            names.add(f"{base}_total")
        else:
            names.add(base)
    return names


def test_every_panel_queries_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"]
    exported = exported_series()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            named = set(re.findall(r"\b(lora_gateway_[a-z_]+|vllm:[a-z_:]+)", target["expr"]))
            assert named, (panel["title"], target["expr"])
            assert named <= exported, (panel["title"], named - exported)
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in (
        "hit rate",
        "swap latency",
        "tokens per tenant",
        "first token",
        "quota",
        "latency objectives",
        "slot turns",
    ):
        assert topic in titles


def queries(dashboard: dict[str, Any], metric: str) -> list[str]:
    return [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel["targets"]
        if metric in target["expr"]
    ]


def test_objectives_are_shown_by_class_and_outcome_as_shares_and_rates_and_turns_by_rule() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    outcomes = queries(dashboard, "lora_gateway_slo_outcomes_total")
    # A share: met (or each miss) over all, per class; and the rates, met being goodput.
    assert any("by (class, outcome)" in q and "/" not in q for q in outcomes), outcomes
    assert any('outcome="met"' in q and "/ sum by (class)" in q for q in outcomes), outcomes
    assert any('outcome!="met"' in q and "group_left sum by (class)" in q for q in outcomes)
    turns = queries(dashboard, "lora_gateway_slot_turns_total")
    assert turns == ["sum by (rule) (rate(lora_gateway_slot_turns_total[5m]))"]
    units = {
        panel["title"]: panel["fieldConfig"]["defaults"].get("unit")
        for panel in dashboard["panels"]
        if any("slo_outcomes" in t["expr"] or "slot_turns" in t["expr"] for t in panel["targets"])
    }
    assert sorted(units.values()) == ["ops", "percentunit", "reqps"], units
