"""``python -m bench``: its options become the run's configuration."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.__main__ import CONFIG_OPTIONS, build_parser, config_from
from bench.runner import BenchConfig


def config(*argv: str) -> BenchConfig:
    return config_from(build_parser().parse_args(argv))


def test_no_options_is_the_full_run() -> None:
    assert config() == BenchConfig()


def test_quick_is_the_short_run_and_options_override_it() -> None:
    assert config("--quick") == BenchConfig.quick()
    quick = config("--quick", "--rounds", "3", "--sweep", "1,4,16", "--base-share", "0.5")
    assert quick == dataclasses.replace(
        BenchConfig.quick(), rounds=3, sweep=(1, 4, 16), base_share=0.5
    )


def test_every_option_reaches_its_config_field() -> None:
    argv = [
        *("--rate", "2", "--duration", "5", "--sweep-duration", "6", "--adapters", "7"),
        *("--zipf", "0.5", "--base-share", "0.1", "--output-tokens", "9", "--rounds", "4"),
        *("--sweep", "2,8", "--seed", "11", "--out", "elsewhere"),
    ]
    got = config(*argv)
    expected = {
        "rate": 2.0,
        "duration": 5.0,
        "sweep_duration": 6.0,
        "adapters": 7,
        "zipf": 0.5,
        "base_share": 0.1,
        "output_tokens": 9,
        "rounds": 4,
        "sweep": (2, 8),
        "seed": 11,
        "out": Path("elsewhere"),
    }
    assert set(expected) == set(CONFIG_OPTIONS)
    assert {name: getattr(got, name) for name in expected} == expected


def test_an_unknown_option_is_refused() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--rps", "3"])
