"""The Grafana dashboard is valid JSON and only queries metrics we export."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
    for topic in ("hit rate", "swap latency", "tokens per tenant", "first token", "quota"):
        assert topic in titles
