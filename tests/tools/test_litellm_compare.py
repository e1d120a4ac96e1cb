"""The LiteLLM comparison's pure parts: the loads, a point's figures, the added latency, the
cost per token, the summary over rounds, the report, the proxy's config and environment, and
the client's reading of a response."""

from __future__ import annotations

import itertools

import pytest

from tools.litellm_compare.client import Target, completion_tokens
from tools.litellm_compare.figures import (
    DIRECT,
    LITELLM,
    OURS,
    Point,
    added_latency_ms,
    format_report,
    load_order,
    load_rates,
    per_token_us,
    point_figures,
    poisson_arrivals,
    ratios,
    summarise,
)
from tools.litellm_compare.litellm_proxy import config_text, offline_environment
from tools.litellm_compare.processes import parse_cpus


def point(system: str, latencies: list[float], cpu: float = 0.5, errors: int = 0) -> Point:
    return Point(system, "50%", 10.0, len(latencies) + errors, errors, 2.0, cpu, cpu / 5,
                 latencies)  # fmt: skip


def test_loads_are_fractions_of_the_lower_capacity() -> None:
    rates = load_rates({OURS: 400.0, LITELLM: 100.0}, [0.25, 0.5, 0.9])
    assert rates == {"25%": 25.0, "50%": 50.0, "90%": 90.0}
    with pytest.raises(ValueError):
        load_rates({OURS: 400.0, LITELLM: 0.0}, [0.5])
    with pytest.raises(ValueError):
        load_rates({OURS: 400.0}, [1.5])


def test_arrivals_are_reproducible_rising_and_near_the_rate() -> None:
    times = poisson_arrivals(100.0, 5000, seed=3)
    assert times == poisson_arrivals(100.0, 5000, seed=3)
    assert times != poisson_arrivals(100.0, 5000, seed=4)
    assert all(b > a for a, b in itertools.pairwise(times))
    assert 45 < times[-1] < 55  # 5,000 arrivals at 100 a second: about 50 s


def test_a_points_cpu_and_rate_count_only_answered_requests() -> None:
    p = point(OURS, [0.01] * 8, cpu=0.8, errors=2)
    assert p.cpu_per_request_us == pytest.approx(0.8 / 8 * 1e6)
    assert p.achieved_rate == pytest.approx(8 / 2.0)


def test_added_latency_is_the_percentile_less_the_upstream_alones() -> None:
    direct = point(DIRECT, [0.001 * i for i in range(1, 101)])
    system = point(OURS, [0.001 * i + 0.004 for i in range(1, 101)])
    assert added_latency_ms(system, direct, 50) == pytest.approx(4.0)
    assert added_latency_ms(system, direct, 99) == pytest.approx(4.0)
    assert added_latency_ms(point(OURS, []), direct, 50) is None
    figures = point_figures(system, direct)
    assert figures["added_p99_ms"] == pytest.approx(4.0)
    assert point_figures(system, None)["added_p50_ms"] is None


def test_a_tokens_cost_is_the_long_requests_extra_over_its_extra_tokens() -> None:
    assert per_token_us(1000.0, 1630.0, 64) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        per_token_us(1000.0, 1100.0, 1)


def round_of(ours_cpu: float, theirs_cpu: float, ours_p99: float, theirs_p99: float) -> dict:
    return {
        OURS: {"50%": {"cpu_per_request_us": ours_cpu, "added_p99_ms": ours_p99}},
        LITELLM: {"50%": {"cpu_per_request_us": theirs_cpu, "added_p99_ms": theirs_p99}},
    }


def test_rounds_summarise_to_median_and_spread_and_ratios_pair_by_round() -> None:
    rounds = [round_of(100, 400, 2, 5), round_of(300, 400, 9, 5), round_of(200, 1000, 3, 4)]
    summarised = summarise(rounds)
    assert summarised[OURS]["50%"]["cpu_per_request_us"] == {
        "median": 200, "min": 100, "max": 300,
    }  # fmt: skip
    paired = ratios(rounds)["50%"]
    assert paired["cpu_ratio"] == {"median": 0.25, "min": 0.2, "max": 0.75}
    assert paired["p99_gap_ms"] == {"median": -1, "min": -3, "max": 4}


def test_the_report_orders_loads_rising_with_the_maximum_last_and_shows_spreads() -> None:
    assert sorted(["max", "90%", "25%", "50%"], key=load_order) == ["25%", "50%", "90%", "max"]
    rounds = [round_of(100, 400, 2, 5), round_of(300, 400, 9, 5)]
    report = {
        "results": summarise(rounds),
        "ratios": ratios(rounds),
        "tokens": {OURS: {"token_us": {"median": 12.5, "min": 12.0, "max": 13.0}}},
        "capacities": {OURS: 900.0, LITELLM: 120.0},
        "settings": {"rounds": 2},
    }
    text = format_report(report)
    assert "| 50% | lora-gateway front | - | 200 (100-300) |" in text
    assert "| 50% | litellm proxy | - | 400 |" in text
    assert "| lora-gateway front | 12.5 (12.0-13.0) | - |" in text
    assert "| 50% | 0.50 (0.25-0.75) |" in text
    assert "lora-gateway front 900, litellm proxy 120" in text
    assert "of 2 rounds" in text


def test_the_proxys_config_names_one_model_over_the_upstream_and_a_master_key() -> None:
    text = config_text("http://127.0.0.1:9000/", model="m", master_key="sk-x")
    assert "model_name: m\n" in text
    assert "model: openai/m\n" in text
    assert "api_base: http://127.0.0.1:9000/v1\n" in text
    assert "master_key: sk-x\n" in text


def test_the_proxys_environment_keeps_it_offline() -> None:
    env = offline_environment(
        {"PATH": "/bin", "https_proxy": "http://corp:3128", "DATABASE_URL": "postgres://x"}
    )
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["HTTPS_PROXY"] == env["HTTP_PROXY"] == "http://127.0.0.1:9"
    assert "127.0.0.1" in env["NO_PROXY"]
    assert "https_proxy" not in env and "DATABASE_URL" not in env
    assert env["PATH"] == "/bin"


def test_core_lists_parse() -> None:
    assert parse_cpus("1") == {1}
    assert parse_cpus("0,2-3") == {0, 2, 3}
    with pytest.raises(ValueError):
        parse_cpus("one")


def test_the_client_reads_the_usage_and_refuses_what_is_not_a_whole_stream() -> None:
    body = (
        b'HTTP/1.1 200 OK\r\n\r\n1\r\ndata: {"usage": {"completion_tokens": 3}}\n\n'
        b"data: [DONE]\n\n\r\n0\r\n\r\n"
    )
    assert completion_tokens(body) == 3
    with pytest.raises(RuntimeError):
        completion_tokens(body.replace(b"200 OK", b"401 Unauthorized"))
    with pytest.raises(RuntimeError):
        completion_tokens(body.replace(b"data: [DONE]", b""))
    request = Target("127.0.0.1", 80, "sk-1", "m").request(7)
    head, _, payload = request.partition(b"\r\n\r\n")
    assert b"Authorization: Bearer sk-1" in head
    assert f"Content-Length: {len(payload)}".encode() in head
    assert b'"max_tokens": 7' in payload and b'"include_usage": true' in payload
