"""The benchmark's plan of points, warm-up, pooling over rounds and the written report."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.client import RequestRecord
from bench.report import (
    MAIN_POINT,
    PointRun,
    aggregate,
    plot,
    render_markdown,
    summary_json,
    sweep_points,
)
from bench.runner import BenchConfig, warmup_plan


def records(
    system: str, point: str, tokens: int, ttft: float, count: int = 4
) -> list[RequestRecord]:
    return [
        RequestRecord(
            system=system,
            point=point,
            index=i,
            tenant=0,
            model="m",
            scheduled=float(i),
            started=float(i),
            ttft=ttft,
            itl=[0.05] * (tokens - 1),
            e2e=ttft + 0.05 * (tokens - 1),
            output_tokens=tokens,
            prompt_tokens=40,
            status=200,
        )
        for i in range(count)
    ]


def run(system: str, point: str, round_: int, tokens: int, ttft: float) -> PointRun:
    config = BenchConfig(adapters=8, sweep=(1, 8))
    spec = config.points()[point]
    return PointRun(system, point, round_, spec, records(system, point, tokens, ttft), 10.0)


def test_points_reuse_the_main_workload_for_its_own_adapter_count() -> None:
    points = BenchConfig(adapters=32, sweep=(1, 8, 32, 128)).points()
    assert list(points) == [MAIN_POINT, "adapters=1", "adapters=8", "adapters=128"]
    assert points["adapters=128"].adapters == 128
    assert points["adapters=8"].rate == points[MAIN_POINT].rate
    assert points["adapters=8"].duration == BenchConfig().sweep_duration
    quick = BenchConfig.quick()
    assert quick.rounds == 1 and set(quick.sweep) <= {1, 8}


def test_warmup_touches_the_host_cached_adapters_in_order_a_group_at_a_time() -> None:
    batches = warmup_plan(adapters=10, group=4, cached=8)
    assert [r.adapter for r in batches[0]] == [None]
    # Only the last 8 (what vLLM's host cache holds after its start-up loads).
    assert [[r.adapter for r in b] for b in batches[1:]] == [[2, 3, 4, 5], [6, 7, 8, 9]]
    assert [[r.adapter for r in b] for b in warmup_plan(3, 4, 8)[1:]] == [[0, 1, 2]]
    assert all(r.tenant == r.adapter for b in batches[1:] for r in b)


def test_rounds_are_pooled_and_compared() -> None:
    runs = [
        run("gateway", MAIN_POINT, 0, tokens=30, ttft=0.2),
        run("vllm", MAIN_POINT, 0, tokens=32, ttft=0.1),
        run("gateway", MAIN_POINT, 1, tokens=32, ttft=0.2),
        run("vllm", MAIN_POINT, 1, tokens=32, ttft=0.1),
        run("gateway", "adapters=1", 0, tokens=32, ttft=0.1),
        run("vllm", "adapters=1", 0, tokens=32, ttft=0.1),
    ]
    results = aggregate(runs)
    main = results[MAIN_POINT]
    assert main.summaries["gateway"].requests == 8
    assert main.summaries["gateway"].wall_seconds == 20.0
    # (4*30 + 4*32) / 20 s against 8*32 / 20 s
    assert main.ratios["output_tokens_per_second"] == pytest.approx(248 / 256)
    assert main.round_throughput_ratios == pytest.approx([30 / 32, 1.0])
    assert [t.met for t in main.targets()] == [False, False, True]
    assert [n for n, _ in sweep_points(results, (1, 8))] == [1, 8]
    assert sweep_points(results, (1, 8))[1][1] is main

    context = {
        "command": "python -m bench",
        "started": "now",
        "wall_seconds": 1.0,
        "machine": "test",
        "engine": "e",
        "rounds": 2,
        "order": ["gateway", "vllm"],
    }
    text = render_markdown(results, (1, 8), context, "bench.png")
    assert "| output tok/s | 12.40 | 12.80 | 0.969 |" in text
    assert "**missed**" in text and "![" in text
    doc = summary_json(results, context)
    assert doc["points"][MAIN_POINT]["ratios"]["ttft_p50"] == pytest.approx(2.0)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    runs = [
        run(system, point, 0, tokens=32, ttft=0.1)
        for system in ("gateway", "vllm")
        for point in (MAIN_POINT, "adapters=1")
    ]
    out = tmp_path / "bench.png"
    plot(out, aggregate(runs), (1, 8))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
