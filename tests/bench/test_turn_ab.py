"""``bench.turn_ab``: its run order, what it reads of the engine's metrics, and how it counts
what turns saved against what they broke."""

from __future__ import annotations

import dataclasses

import pytest

from bench.client import RequestRecord
from bench.grid import GridConfig, Load
from bench.stats import (
    ENGINE_STEPS,
    ENGINE_TOKENS,
    HEADROOM_SEATS,
    SLO_TPOT,
    SLO_TTFT,
    TURNS,
    Sample,
)
from bench.turn_ab import (
    CPU,
    VLLM_SERVER,
    WITH,
    WITHOUT,
    build_parser,
    grid_point,
    misses,
    render,
    run_order,
)


def record(ttft: float, tpot: float, *, ok: bool = True) -> RequestRecord:
    return RequestRecord(
        "gateway", "p", 0, 0, "m", 0.0, 0.0, ttft=ttft, itl=[tpot] * 9, e2e=ttft + 9 * tpot,
        output_tokens=10, status=200 if ok else 500, error=None if ok else "HTTP 500",
    )  # fmt: skip


def sample(arm: str, *records: RequestRecord, turns: float = 0.0, seats: float = 0.0) -> Sample:
    counters = {
        SLO_TTFT: 0.5, SLO_TPOT: 0.02, TURNS: turns, HEADROOM_SEATS: seats, ENGINE_TOKENS: 1200.0,
        ENGINE_STEPS: 100.0, f"{CPU}server": 1.5, f"{CPU}Worker": 60.0,
    }  # fmt: skip
    return Sample("gateway", arm, 0, records, 2.0, counters)


def test_each_pair_runs_with_and_without_turns_mirrored():
    assert run_order(1) == [WITH, WITHOUT, WITHOUT, WITH]
    assert run_order(2) == run_order(1) * 2
    assert run_order(1, VLLM_SERVER) == [WITH, VLLM_SERVER, VLLM_SERVER, WITH]


def test_a_request_misses_its_first_tokens_objective_or_its_streams_never_both():
    with_turns = sample(
        WITH,
        record(0.1, 0.01),  # within both
        record(0.6, 0.01),  # first token late
        record(0.6, 0.03),  # both late: counted once, as a first token missed
        record(0.1, 0.03),  # stream past its TPOT objective
        record(0.1, 0.01, ok=False),  # failed: a first token missed
    )
    assert misses(with_turns) == (3, 1)


def test_the_summary_gives_each_run_and_each_pairs_goodput_ratio():
    good, late = record(0.1, 0.01), record(0.6, 0.01)
    runs = [
        sample(WITH, good, good, turns=5, seats=2),
        sample(WITHOUT, good, late),
        sample(WITHOUT, good, late),
        sample(WITH, good, late, turns=3),
    ]
    text = render(runs, "e: attention, uniform 8x", 500, 20)
    assert "| with turns | 5 | 2 | 10.0 | 2 | 0 | 0 | 1200 / 100 | 1.5, 60.0 |" in text
    assert "| without | 0 | 0 | 10.0 | 1 | 1 | 0 |" in text
    # Goodput with turns (1.0 + 0.5 req/s) over without (0.5 + 0.5).
    assert text.rstrip().endswith("per pair: 1.50x")


def test_against_vllms_server_its_runs_show_its_engines_work_and_no_turn():
    good, late = record(0.1, 0.01), record(0.6, 0.01)
    other = dataclasses.replace(
        sample(VLLM_SERVER, good, late), counters={SLO_TTFT: 0.5, SLO_TPOT: 0.02,
        ENGINE_TOKENS: 900.0, ENGINE_STEPS: 80.0, f"{CPU}server": 1.0},
    )  # fmt: skip
    unmeasured = dataclasses.replace(other, counters={SLO_TTFT: 0.5, SLO_TPOT: 0.02})
    runs = [sample(WITH, good, good), other, unmeasured, sample(WITH, good, good)]
    text = render(runs, "e: all, 1x", 500, 20, VLLM_SERVER)
    assert "| vLLM's server | 0 | 0 | 10.0 | 1 | 1 | 0 | 900 / 80 | 1.0 |" in text
    assert "| vLLM's server | 0 | 0 | 10.0 | 1 | 1 | 0 | - |  |" in text
    assert text.rstrip().endswith("with turns over vLLM's server, per pair: 2.00x")


def test_the_objectives_are_required_and_the_point_defaults_to_the_grids_hardest():
    with pytest.raises(SystemExit):
        build_parser().parse_args([])
    args = build_parser().parse_args(["--ttft-ms", "22315", "--tpot-ms", "523"])
    assert (args.targets, args.popularity, args.multiple, args.concurrency, args.against) == (
        "attention", "uniform", 8, 64, "without",
    )  # fmt: skip
    fcfs = [
        "--ttft-ms",
        "1",
        "--tpot-ms",
        "1",
        "--against",
        "vllm",
        "--gateway-settings",
        "SCHEDULER=fcfs",
    ]
    assert build_parser().parse_args(fcfs).gateway_settings == (("SCHEDULER", "fcfs"),)
    # An open loop where a rate is given, at the grid's share of saturation (its name).
    config = GridConfig()
    assert grid_point(args, config).load == Load(concurrency=64)
    open_loop = build_parser().parse_args(["--ttft-ms", "1", "--tpot-ms", "1", "--rate", "1.8"])
    assert grid_point(open_loop, config).load == Load(share=config.open_share)
