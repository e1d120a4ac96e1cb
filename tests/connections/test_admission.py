"""The caps' arithmetic and the reading of X-Forwarded-For, without a server."""

from __future__ import annotations

import configparser
import resource
from pathlib import Path

import pytest

from app.connections.admission import (
    Admission,
    ConnectionGuard,
    ConnectionLimits,
    default_max_connections,
    parse_networks,
    source_key,
)
from app.server import connection_limits
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def guard(**overrides: object) -> ConnectionGuard:
    values: dict[str, object] = {
        "head_timeout": 10.0,
        "max_head_bytes": 65536,
        "body_min_rate": 1024,
        "body_rate_window": 10.0,
        "write_timeout": 30.0,
        "tls_handshake_timeout": 10.0,
        "max_connections": 3,
        "probe_reserve": 1,
        "max_per_source": 2,
        "trusted_proxies": parse_networks("10.0.0.0/8, 2001:db8::/32"),
        **overrides,
    }
    return ConnectionGuard(ConnectionLimits(**values))  # type: ignore[arg-type]


def test_connections_are_served_then_kept_for_probes_then_refused() -> None:
    counts = guard(max_per_source=10)
    assert [counts.admit("192.0.2.1") for _ in range(5)] == [
        Admission.SERVE,
        Admission.SERVE,
        Admission.SERVE,
        Admission.PROBES_ONLY,
        Admission.SERVER_FULL,
    ]
    counts.leave("192.0.2.1")
    assert counts.admit("192.0.2.1") is Admission.PROBES_ONLY


def test_a_source_past_its_cap_is_refused_a_trusted_proxy_is_not() -> None:
    counts = guard(max_connections=100)
    assert counts.admit("192.0.2.1") is counts.admit("192.0.2.1") is Admission.SERVE
    assert counts.admit("192.0.2.1") is Admission.SOURCE_FULL
    assert counts.admit(source_key("::ffff:192.0.2.1")) is Admission.SOURCE_FULL  # the same
    assert all(counts.admit("10.1.2.3") is Admission.SERVE for _ in range(5))
    counts.leave("192.0.2.1")
    assert counts.admit("192.0.2.1") is Admission.SERVE


@pytest.mark.parametrize(
    ("header", "client"),
    [
        ([b"203.0.113.7"], "203.0.113.7"),
        # Each proxy appends whom it was reached from: trust ends at the first untrusted one.
        ([b"198.51.100.1, 203.0.113.7, 10.0.0.5"], "203.0.113.7"),
        ([b"198.51.100.1", b"203.0.113.7"], "203.0.113.7"),
        ([b"[2001:db8::1]:443, 203.0.113.7:5000"], "203.0.113.7"),
        ([b"10.0.0.9, 10.0.0.5"], "10.0.0.9"),  # only proxies: the first
        ([], "10.0.0.1"),  # no header: the proxy itself
        ([b"unknown"], "unknown"),
    ],
)
def test_the_forwarded_client_is_the_last_address_no_trusted_proxy_added(
    header: list[bytes], client: str
) -> None:
    assert guard().forwarded_client("10.0.0.1", header) == client


def test_forwarded_requests_share_their_clients_cap_with_its_connections() -> None:
    counts = guard()
    assert counts.admit("203.0.113.7") is Admission.SERVE
    assert counts.enter_forwarded("203.0.113.7")
    assert not counts.enter_forwarded("203.0.113.7")
    counts.leave_forwarded("203.0.113.7")
    assert counts.enter_forwarded("203.0.113.7")


def test_addresses_have_one_spelling() -> None:
    assert source_key("::ffff:192.0.2.1") == source_key("192.0.2.1") == "192.0.2.1"
    assert source_key("2001:DB8:0::1") == "2001:db8::1"


def test_the_default_cap_is_half_the_descriptor_limit_less_the_reserve() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert default_max_connections(32) == soft // 2 - 32
    limits = connection_limits(Settings(_env_file=None))
    assert limits.max_connections + limits.probe_reserve < soft
    explicit = Settings(_env_file=None, max_connections=100)
    assert connection_limits(explicit).max_connections == 100


def test_a_malformed_trusted_proxy_stops_the_start() -> None:
    settings = Settings(_env_file=None, trusted_proxies="10.0.0")
    with pytest.raises(ValueError, match=r"^trusted_proxies: '10\.0\.0'"):
        connection_limits(settings)


def test_the_systemd_unit_raises_the_descriptor_limit() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(ROOT / "deploy/systemd/lora-gateway.service")
    assert int(unit["Service"]["LimitNOFILE"]) >= 65536
