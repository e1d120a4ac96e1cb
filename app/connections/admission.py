"""Who may hold a connection: a global cap with a reserve for the probes, and a cap per source.

* Up to ``max_connections`` open connections are served as usual. The next
  ``probe_reserve`` are served only ``/healthz`` and ``/readyz``, then closed (anything
  else: 503): an orchestrator's probes still get through when the cap is reached. Beyond
  both, a new connection is answered 503 at once and closed. The default cap leaves half
  the process's descriptors for what serving needs besides the client's socket.
* One source (a client address) holds at most ``max_per_source`` of them; more: 429 at
  once, so one client cannot take the cap from the others. A trusted proxy's connections
  count only against the global cap (they carry many clients): each of its requests counts,
  while it runs, against the client its ``X-Forwarded-For`` names. That header is read from
  nobody else.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
import math
import resource
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app import metrics

logger = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# What a connection counted past max_connections may still ask for.
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
# Descriptors the default cap allows per connection: the client's socket, and one for what
# serving it may open (the front role's upstream connection, a file).
DESCRIPTORS_PER_CONNECTION = 2
# A refusal under attack happens thousands of times a second: one log line per kind per
# interval says so.
LOG_INTERVAL_SECONDS = 60.0


@dataclass(frozen=True)
class ConnectionLimits:
    """Every limit one connection is held to (the settings' ``request_*``, ``response_*``,
    ``*connections*``, ``trusted_proxies`` and ``tls_handshake_timeout_seconds``)."""

    head_timeout: float
    max_head_bytes: int
    body_min_rate: int  # bytes per second
    body_rate_window: float  # seconds
    write_timeout: float
    tls_handshake_timeout: float
    max_connections: int
    probe_reserve: int
    max_per_source: int
    trusted_proxies: tuple[Network, ...] = ()


def parse_networks(text: str) -> tuple[Network, ...]:
    """Comma-separated addresses or CIDR blocks (``10.0.0.0/8, 192.0.2.7``)."""
    parts = (part.strip() for part in text.split(","))
    return tuple(ipaddress.ip_network(part, strict=False) for part in parts if part)


def descriptor_limit() -> int:
    """The process's soft limit on open descriptors (systemd's default: 1,024)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def default_max_connections(probe_reserve: int) -> int:
    """Half the descriptor limit, less the probes' reserve."""
    return max(1, descriptor_limit() // DESCRIPTORS_PER_CONNECTION - probe_reserve)


def parse_address(text: str) -> Address | None:
    """An address as a socket or ``X-Forwarded-For`` gives it, perhaps with a port (``[::1]:80``,
    ``192.0.2.7:80``); IPv4 seen through an IPv6 socket as IPv4. None if it is not one."""
    candidate = text.strip()
    if candidate.startswith("["):
        candidate = candidate[1:].partition("]")[0]
    elif candidate.count(":") == 1:
        candidate = candidate.partition(":")[0]
    try:
        parsed = ipaddress.ip_address(candidate)
    except ValueError:
        return None
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return parsed.ipv4_mapped
    return parsed


def source_key(text: str) -> str:
    """One spelling per address, so that each source has one count."""
    parsed = parse_address(text)
    return str(parsed) if parsed is not None else text.strip()


class Admission(enum.Enum):
    SERVE = "serve"
    PROBES_ONLY = "probes only"
    SOURCE_FULL = "source full"  # 429
    SERVER_FULL = "server full"  # 503


class ConnectionGuard:
    """The counts behind the caps, shared by every connection of one server."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open = 0
        self._by_source: Counter[str] = Counter()
        self._logged: dict[str, float] = {}

    def is_trusted_proxy(self, source: str) -> bool:
        parsed = parse_address(source)
        return parsed is not None and any(parsed in net for net in self.limits.trusted_proxies)

    def admit(self, peer: str) -> Admission:
        """Count a new connection from ``peer`` (a :func:`source_key`), or say why not."""
        limits = self.limits
        if self.open >= limits.max_connections + limits.probe_reserve:
            self.refused(
                "server full",
                "%d connections open (max_connections %d + %d for probes): refusing new ones",
                self.open,
                limits.max_connections,
                limits.probe_reserve,
            )
            return Admission.SERVER_FULL
        if not self.is_trusted_proxy(peer) and not self._enter(peer):
            return Admission.SOURCE_FULL
        self.open += 1
        if self.open > limits.max_connections:
            self.refused(
                "probes only",
                "%d connections open, past max_connections (%d): new ones serve only probes",
                self.open,
                limits.max_connections,
            )
            return Admission.PROBES_ONLY
        return Admission.SERVE

    def leave(self, peer: str) -> None:
        """An admitted connection from ``peer`` has closed."""
        self.open -= 1
        if not self.is_trusted_proxy(peer):
            self._leave(peer)

    def forwarded_client(self, peer: str, forwarded_for: Iterable[bytes]) -> str:
        """Whom a trusted proxy's request comes from: the last ``X-Forwarded-For`` entry
        that is not a trusted proxy (each proxy appends the address it was reached from);
        the first entry if all are; the proxy itself without the header."""
        entries = [
            entry.strip()
            for value in forwarded_for
            for entry in value.decode("latin-1").split(",")
            if entry.strip()
        ]
        for entry in reversed(entries):
            if not self.is_trusted_proxy(entry):
                return source_key(entry)
        return source_key(entries[0]) if entries else peer

    def enter_forwarded(self, source: str) -> bool:
        """Count a request a trusted proxy forwards for ``source``, or refuse it."""
        return self._enter(source)

    def leave_forwarded(self, source: str) -> None:
        self._leave(source)

    def refused(self, kind: str, message: str, *args: Any) -> None:
        """Count a refusal of this kind, and log a warning of its kind at most once per
        ``LOG_INTERVAL_SECONDS``."""
        metrics.CONNECTIONS_REFUSED.labels(kind.replace(" ", "_")).inc()
        now = time.monotonic()
        if now - self._logged.get(kind, -math.inf) >= LOG_INTERVAL_SECONDS:
            self._logged[kind] = now
            logger.warning(message, *args)

    def _enter(self, source: str) -> bool:
        if self._by_source[source] >= self.limits.max_per_source:
            self.refused(
                "source full",
                "%s holds %d connections (max_connections_per_source): refusing more",
                source,
                self.limits.max_per_source,
            )
            return False
        self._by_source[source] += 1
        return True

    def _leave(self, source: str) -> None:
        self._by_source[source] -= 1
        if self._by_source[source] <= 0:
            del self._by_source[source]
