"""``python -m bench``: its options become the run's configuration."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.__main__ import CONFIG_OPTIONS, build_parser, config_from
from bench.config import GATEWAY, GATEWAY_FCFS, VLLM, BenchConfig


def config(*argv: str) -> BenchConfig:
    return config_from(build_parser().parse_args(argv))


def test_no_options_is_the_full_run() -> None:
    full = config()
    assert full == BenchConfig()
    assert full.systems == (GATEWAY, GATEWAY_FCFS, VLLM) and full.rounds >= 3  # the targets'
    assert set(full.concurrencies) == {16, 64} and len(full.curve_fractions) >= 2
    assert max(full.curve_fractions) == 1.0 and full.flood_streams >= 100
    assert full.registered == 1000
    assert full.cliff_multiples == (1, 2, 8) and full.cliff_prompt_tokens == 128


def test_quick_is_one_round_of_a_subset() -> None:
    quick = config("--quick")
    assert quick == BenchConfig.quick()
    assert quick.systems == (GATEWAY, VLLM) and quick.rounds == 1
    assert quick.curve_fractions == () and quick.registered == 0  # scenarios a and b only
    assert quick.cliff_multiples == ()
    assert quick.flood_streams >= 100
    again = config("--quick", "--rounds", "3", "--concurrencies", "4,8", "--base-share", "0.5")
    assert again == dataclasses.replace(quick, rounds=3, concurrencies=(4, 8), base_share=0.5)


def test_every_option_reaches_its_config_field() -> None:
    argv = [
        *("--systems", "gateway,gateway-fcfs", "--rounds", "4", "--max-loras", "2"),
        *("--adapters", "7", "--zipf", "0.5", "--base-share", "0.1", "--output-tokens", "9"),
        *("--concurrencies", "2,8", "--waves", "2", "--curve-fractions", "0.5,1"),
        *("--curve-requests", "5", "--flood-streams", "101", "--flood-tokens", "3"),
        *("--victim-requests", "6", "--victim-tokens", "2", "--registered", "10"),
        *("--registered-concurrency", "3", "--registered-requests", "12", "--seed", "11"),
        *("--registered-max-loras", "5", "--gateway-settings", "A=1,B_C=x=y"),
        *("--draws", "99", "--out", "elsewhere", "--cliff-multiples", "1,3"),
        *("--cliff-popularities", "uniform", "--cliff-load", "0.5", "--cliff-concurrency", "4"),
        *("--cliff-requests", "7", "--cliff-prompt-tokens", "64", "--cliff-output-tokens", "8"),
    ]
    got = config(*argv)
    expected = {
        "systems": (GATEWAY, GATEWAY_FCFS), "rounds": 4, "max_loras": 2, "adapters": 7,
        "zipf": 0.5, "base_share": 0.1, "output_tokens": 9, "concurrencies": (2, 8),
        "waves": 2, "curve_fractions": (0.5, 1.0), "curve_requests": 5, "flood_streams": 101,
        "flood_tokens": 3, "victim_requests": 6, "victim_tokens": 2, "registered": 10,
        "registered_concurrency": 3, "registered_requests": 12, "registered_max_loras": 5,
        "gateway_settings": (("A", "1"), ("B_C", "x=y")),
        "seed": 11, "draws": 99,
        "out": Path("elsewhere"), "cliff_multiples": (1, 3), "cliff_popularities": ("uniform",),
        "cliff_load": 0.5, "cliff_concurrency": 4, "cliff_requests": 7, "cliff_prompt_tokens": 64,
        "cliff_output_tokens": 8,
    }  # fmt: skip
    assert set(expected) == set(CONFIG_OPTIONS)
    assert {name: getattr(got, name) for name in expected} == expected


def test_unknown_options_and_systems_are_refused() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--rps", "3"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--systems", "gateway,lorax"])
    with pytest.raises(ValueError):
        BenchConfig(adapters=1)
    with pytest.raises(ValueError):
        BenchConfig(curve_fractions=(0.0, 1.0))
    with pytest.raises(ValueError, match="exceeds the adapters"):
        BenchConfig(adapters=8)  # the cliff's 8x of 4 slots
    with pytest.raises(ValueError, match="1 among them"):
        BenchConfig(cliff_multiples=(2, 4))
    with pytest.raises(ValueError, match="popularities"):
        BenchConfig(cliff_popularities=("pareto",))
    assert BenchConfig(adapters=8, cliff_multiples=()).adapters == 8
