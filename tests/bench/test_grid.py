"""Scenario (e), the grid: its points and their order, the requests of a point, the objectives
and goodput, and the targets' verdicts on samples."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench.client import RequestRecord
from bench.config import GATEWAY, VLLM
from bench.grid import GridConfig, GridPoint, Load, Objectives
from bench.grid_report import evaluate_grid, offered_load, render_grid, turn_lead
from bench.grid_run import (
    ARGUMENTS_FILE,
    SAMPLES_FILE,
    Round,
    append_samples,
    build_parser,
    config_from,
    resumed_arguments,
    round_plan,
    whole_rounds,
)
from bench.stats import (
    ATTAINMENT,
    ENGINE_STEPS,
    ENGINE_TOKENS,
    FIRST_TOKEN_TURNS,
    GOODPUT,
    SLO_TPOT,
    SLO_TTFT,
    TURN_LEAD,
    TURNS,
    Sample,
)

C16, C64, OPEN = Load(concurrency=16), Load(concurrency=64), Load(share=0.7)
SLOTS = 4


def test_the_full_grid_runs_each_groups_reference_first_and_closed_loops_before_the_open_one():
    points = GridConfig().points()
    # 2 targets x 3 loads x (1x + 2 popularities x 3 multiples)
    assert len(points) == 2 * 3 * 7
    assert len(set(points)) == len(points)
    for index, point in enumerate(points):
        assert point.reference in points[: index + 1]
        if not point.load.closed:  # its rate: the 1x closed loop at the highest concurrency
            assert GridPoint(point.targets, "uniform", 1, C64) in points[:index]
    assert GridPoint("all", "zipf", 8, OPEN) in points


def test_the_quick_grid_is_its_two_points_with_their_references():
    names = [p.name(SLOTS) for p in GridConfig.quick().points()]
    assert names == [
        "e: mixed, 1x (4 adapters on 4 slots), concurrency 16",
        "e: mixed, uniform 3x (12 adapters on 4 slots), concurrency 16",
        "e: attention, 1x (4 adapters on 4 slots), concurrency 16",
        "e: attention, zipf 8x (32 adapters on 4 slots), concurrency 16",
    ]


def test_both_systems_run_each_point_back_to_back_vllm_first_at_references_alternating_elsewhere():
    points = GridConfig().points()
    for round_ in range(2):
        plan = round_plan(points, round_)
        assert [point for point, _ in plan] == points
        assert all(sorted(order) == sorted((VLLM, GATEWAY)) for _, order in plan)
        assert all(order[0] == VLLM for point, order in plan if point == point.reference)
        firsts = [order[0] for point, order in plan if point != point.reference]
        assert firsts[::2] == [(VLLM, GATEWAY)[round_]] * len(firsts[::2])
        assert firsts[1::2] == [(GATEWAY, VLLM)[round_]] * len(firsts[1::2])
    # Each point's order flips from one round to the next.
    assert all(
        a[1] == tuple(reversed(b[1]))
        for a, b in zip(round_plan(points, 0), round_plan(points, 1), strict=True)
        if a[0] != a[0].reference
    )


def test_a_points_requests_name_adapters_of_its_pools_each_sent_by_its_own_tenant():
    config = GridConfig.quick()
    pool = config.pool_size()
    assert pool == 8 * SLOTS
    mixed = config.requests(GridPoint("mixed", "uniform", 3, C16))
    assert len(mixed) == max(config.waves * 16, config.min_closed_requests) == 96
    assert {r.adapter for r in mixed} <= {*range(0, 12, 2), *(pool + i for i in range(1, 12, 2))}
    assert any(r.adapter >= pool for r in mixed) and any(r.adapter < pool for r in mixed)
    assert all(r.tenant == r.adapter for r in mixed)
    everything = config.requests(GridPoint("all", "uniform", 2, C16))
    assert all(pool <= r.adapter < pool + 8 for r in everything)


def test_a_closed_loop_sends_its_waves_and_no_fewer_than_the_least_a_point_may():
    config = GridConfig()
    assert config.closed_requests(C64) == config.waves * 64 > config.min_closed_requests
    assert config.closed_requests(C16) == config.min_closed_requests > config.waves * 16
    more = dataclasses.replace(config, waves=10)
    assert len(more.requests(GridPoint("attention", "uniform", 2, C16))) == 160


def test_an_open_loop_point_needs_the_rate_its_round_measured():
    config = GridConfig()
    point = GridPoint("attention", "zipf", 2, OPEN)
    with pytest.raises(ValueError, match="rate"):
        config.requests(point)
    at = [r.at for r in config.requests(point, rate=10.0)]
    assert at == sorted(at) and 0 < at[-1] < config.open_requests / 10.0


@pytest.mark.parametrize(
    "point",
    [
        lambda: GridPoint("attention", "zipf", 1, C16),  # 1x is one point: uniform
        lambda: GridPoint("lora", "uniform", 2, C16),
        lambda: Load(concurrency=16, share=0.5),
        lambda: Load(),
    ],
)
def test_points_the_grid_cannot_run_are_refused(point):
    with pytest.raises(ValueError):
        point()


def record(ttft: float, tpot: float, *, ok: bool = True) -> RequestRecord:
    return RequestRecord(
        "s", "p", 0, 0, "m", 0.0, 0.0, ttft=ttft, itl=[tpot] * 9, e2e=ttft + 9 * tpot,
        output_tokens=10, status=200 if ok else 500, error=None if ok else "HTTP 500",
    )  # fmt: skip


def test_goodput_counts_the_requests_within_both_objectives_per_second():
    records = (record(0.1, 0.01), record(0.6, 0.01), record(0.1, 0.03), record(0.1, 0.01, ok=False))
    sample = Sample("s", "p", 0, records, 2.0, {SLO_TTFT: 0.5, SLO_TPOT: 0.02})
    assert GOODPUT.of(sample) == pytest.approx(0.5)  # one of four, over 2 s
    assert ATTAINMENT.of(sample) == pytest.approx(0.25)
    assert ATTAINMENT.of(dataclasses.replace(sample, counters={})) is None


def test_the_objectives_are_the_benchmarks_multiples_of_vllms_one_adapter_per_slot():
    objectives = Objectives.from_reference(ttft_p50=0.2, tpot_p50=0.04)
    assert objectives == Objectives(pytest.approx(1.0), pytest.approx(0.06))
    assert objectives.milliseconds() == (1000, 60)


def test_a_round_takes_the_objectives_and_the_saturation_from_the_reference_only():
    config = GridConfig()
    this_round = Round(config, SLOTS)
    reference = GridPoint("all", "uniform", 1, C64)
    records = tuple(record(0.2, 0.04) for _ in range(10))
    this_round.learn(GridPoint("all", "zipf", 8, C64), Sample(VLLM, "x", 0, records, 1.0))
    assert this_round.objectives == {}
    this_round.learn(reference, Sample(VLLM, "x", 0, records, 2.0))
    assert this_round.objectives[reference.group] == Objectives.from_reference(0.2, 0.04)
    assert this_round.rate(GridPoint("all", "uniform", 2, OPEN)) == pytest.approx(0.7 * 5.0)
    assert this_round.rate(GridPoint("all", "uniform", 2, C16)) is None


def grid_samples(gateway_ttft: float, gateway_tpot: float, vllm_ttft: float = 0.1):
    """Three rounds of the quick grid: vLLM at the given TTFT and 10 ms per token, the gateway
    as given (its TTFT doubled past 1x), both with objectives 0.5 s and 15 ms."""
    samples = []
    for point in GridConfig.quick().points():
        name = point.name(SLOTS)
        for r in range(3):
            for system, ttft, tpot in (
                (VLLM, vllm_ttft, 0.010),
                (GATEWAY, gateway_ttft * min(point.multiple, 2), gateway_tpot),
            ):
                records = tuple(record(ttft * (1 + i / 20), tpot) for i in range(20))
                samples.append(
                    Sample(system, name, r, records, 10.0, {SLO_TTFT: 0.5, SLO_TPOT: 0.015})
                )
    return samples


def test_the_gateway_within_objectives_where_vllm_meets_them_meets_every_target():
    points = GridConfig.quick().points()
    targets = evaluate_grid(grid_samples(0.02, 0.010), points, SLOTS, 0, 200)
    assert targets and all(t.verdict == "met" for t in targets), [t.row() for t in targets]
    # goodput on all 4 points, tok/s and TPOT on all 4 (vLLM within objectives), cliff at 8x
    assert len(targets) == 4 + 8 + 1


def test_a_gateway_that_slows_streams_vllm_serves_in_time_misses_tpot_and_goodput():
    points = GridConfig.quick().points()
    targets = evaluate_grid(grid_samples(0.02, 0.020), points, SLOTS, 0, 200)
    missed = {t.name.rsplit(": ", 1)[1].split(",")[0] for t in targets if t.verdict == "missed"}
    assert missed == {"goodput", "TPOT p50"}


def test_where_vllm_misses_its_objectives_only_goodput_and_the_cliff_are_judged():
    points = GridConfig.quick().points()
    targets = evaluate_grid(grid_samples(0.02, 0.010, vllm_ttft=0.6), points, SLOTS, 0, 200)
    assert {t.name.rsplit(": ", 1)[1].split(" ")[0] for t in targets} == {"goodput,", "TTFT"}
    text = render_grid(
        grid_samples(0.02, 0.010), points, SLOTS, targets,
        {"command": "c", "machine": "m", "engine": "e", "rounds": 3, "wall_seconds": 1}, 0, 200,
    )  # fmt: skip
    assert "## mixed adapters, concurrency 16" in text
    assert "| uniform 3x (12 adapters on 4 slots) | gateway |" in text


def test_the_command_line_builds_the_quick_or_the_full_grid():
    quick = config_from(build_parser().parse_args(["--quick", "--rounds", "2"]))
    assert quick.rounds == 2 and quick.only
    full = config_from(build_parser().parse_args(["--gateway-settings", "SEED=1"]))
    assert full.gateway_settings == (("SEED", "1"),) and not full.only


def test_the_turns_lead_is_read_from_the_gateways_histogram_over_every_point():
    def with_leads(*cumulative: tuple[float, float]) -> Sample:
        counters = {f"{TURN_LEAD}{bound}": count for bound, count in cumulative}
        return Sample(GATEWAY, "p", 0, (), 1.0, counters)

    assert turn_lead([with_leads()]) == "no slot turn delivered a token"
    # 10 turns: 8 within 1 step, 2 more within 2, 0 past 3 (cumulative buckets, two points)
    text = turn_lead(
        [with_leads((1.0, 5), (2.0, 5), (3.0, 5)), with_leads((1.0, 3), (2.0, 5), (3.0, 5))]
    )
    assert text.startswith("10 turns") and "0.6 steps" in text and "2.0 at p99" in text


def test_a_runs_saved_rounds_are_read_back_whole_and_a_round_cut_short_is_left_to_run_again(
    tmp_path,
):
    config = GridConfig.quick()
    names = [p.name(SLOTS) for p in config.points()]

    def visit(system: str, round_: int, points: list[str]) -> list[Sample]:
        return [
            Sample(system, name, round_, (record(1.0, 0.1),), 12.5, {"turns": 3.0})
            for name in points
        ]

    saved = tmp_path / SAMPLES_FILE
    whole = visit(VLLM, 0, names) + visit(GATEWAY, 0, names)
    append_samples(saved, whole)
    append_samples(saved, visit(VLLM, 1, names) + visit(GATEWAY, 1, names[:1]))  # cut short
    assert whole_rounds(saved, config, SLOTS) == whole
    assert whole_rounds(tmp_path / "none.jsonl", config, SLOTS) == []


def test_a_run_is_resumed_with_its_own_grid_arguments_and_the_rounds_asked_for_now(tmp_path):
    (tmp_path / ARGUMENTS_FILE).write_text(json.dumps(["--quick", "--rounds", "1"]))
    parser = build_parser()
    arguments = resumed_arguments(["--resume", str(tmp_path), "--rounds", "3"], parser)
    args = parser.parse_args(arguments)
    assert args.resume == tmp_path
    config = config_from(args)
    assert config.rounds == 3 and config.only == GridConfig.quick().only
    as_saved = config_from(
        parser.parse_args(resumed_arguments(["--resume", str(tmp_path)], parser))
    )
    assert as_saved.rounds == 1


def test_an_open_loops_offered_load_is_set_against_what_the_same_point_delivered_closed():
    """vLLM's server completes 2 req/s at 1x closed, so the open loop offers 0.7 x 2 = 1.4;
    closed at 8x the gateway completed 1.25 req/s, vLLM's server 1.0: offered 1.12x the
    most delivered there, a queue that grows over the open loop's run."""
    config = GridConfig(targets=("attention",), multiples=(1, 8), popularities=("uniform",))
    points = [p for p in config.points() if p.load != C16]

    def completing(per_second: float) -> tuple[RequestRecord, ...]:
        return tuple(record(0.1, 0.01) for _ in range(round(per_second * 20)))

    delivered = {(VLLM, 1): 2.0, (GATEWAY, 1): 1.8, (VLLM, 8): 1.0, (GATEWAY, 8): 1.25}
    # 16 tokens and 200 ms a step; 5 turns, 2 of them for a first token
    engine = {ENGINE_STEPS: 100.0, ENGINE_TOKENS: 1600.0, TURNS: 5.0, FIRST_TOKEN_TURNS: 2.0}
    samples = [
        Sample(
            system, point.name(SLOTS), 0, completing(delivered[system, point.multiple]), 20.0,
            engine if system == GATEWAY else {},
        )
        for point in points
        for system in (VLLM, GATEWAY)
        if point.load == C64
    ]  # fmt: skip
    assert offered_load(samples, GridPoint("attention", "uniform", 8, OPEN), SLOTS, C64) == (
        pytest.approx(1.12)
    )
    assert offered_load(samples, GridPoint("attention", "uniform", 1, OPEN), SLOTS, C64) == (
        pytest.approx(0.7)
    )
    assert offered_load(samples, GridPoint("attention", "uniform", 8, OPEN), SLOTS, C16) is None
    text = render_grid(
        samples, points, SLOTS, [],
        {"command": "c", "machine": "m", "engine": "e", "rounds": 1, "wall_seconds": 1}, 0, 50,
    )  # fmt: skip
    assert "at concurrency 64 (the higher system" in text
    assert ": 1x 0.70, uniform 8x 1.12." in text
    # The engine's steps, where the system reports them.
    assert "| 1x (4 adapters on 4 slots) | gateway |" in text
    gateway_8x = next(
        line for line in text.splitlines() if "uniform 8x" in line and "gateway" in line
    )
    assert gateway_8x.endswith("| 5 (2 first token) | - | 16.0 | 200 |")
    vllm_8x = next(
        line for line in text.splitlines() if "uniform 8x" in line and "| vllm |" in line
    )
    assert vllm_8x.endswith("| - | - |")
