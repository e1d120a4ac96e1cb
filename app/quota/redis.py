"""The Redis backend (``redis://host:port/db``): one quota state shared by every replica.

Each operation is one Lua script (``app/quota/lua``), so check-and-commit across all limits is
atomic, and its clock is Redis ``TIME``, so replicas agree whatever their own clocks say.

Keys, under ``key_prefix``: ``rq:<subject>`` / ``tk:<subject>`` (requests / tokens buckets,
hashes), ``cc:<subject>`` (concurrency leases: a sorted set of reservation ids scored by expiry),
``bg:<subject>:<period>`` (tokens charged in a budget period), ``rs:<id>`` (an open reservation,
which makes reconcile idempotent and lets a reservation whose reply was lost be voided),
``vd:<id>`` (a voided id, which no reservation may take for a while). Every key expires on its
own.

Every failure of Redis becomes :class:`QuotaBackendUnavailable` with a ``reason``: not only an
unreachable server or a timeout, but a replica that became read-only in a failover, a server
out of memory, any error reply, and a reply the scripts would never give.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.quota.backend import (
    PRECHECK_TOKENS,
    RECONCILE_WINDOW_S,
    VOID_MEMORY_S,
    VOID_TIMEOUT_S,
    QuotaBackend,
)
from app.quota.errors import QuotaBackendUnavailable
from app.quota.limits import Limits, QuotaUsage
from app.quota.outcomes import Admitted, Levels, Refused, Reservation, Subjects, Violation

SCRIPTS = ("reserve", "void", "precheck", "reconcile", "renew", "charge_refused", "usage")


def lua_source(name: str) -> str:
    """A script from ``app/quota/lua``, with the shared ``common.lua`` in front (after the
    script's ``#!lua`` flags line, which Redis reads only as the first line)."""
    folder = resources.files("app.quota").joinpath("lua")
    common = folder.joinpath("common.lua").read_text(encoding="utf-8")
    script = folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    if script.startswith("#!"):
        flags, _, body = script.partition("\n")
        return f"{flags}\n{common}\n{body}"
    return common + "\n" + script


def failure_reason(exc: BaseException) -> str:
    """A bounded name for what went wrong, for the metric's ``reason`` label."""
    if isinstance(exc, RedisTimeoutError):
        return "timeout"
    if isinstance(exc, (RedisConnectionError, OSError)):
        return "unreachable"
    if isinstance(exc, ReadOnlyError) or str(exc).find("READONLY") >= 0:
        return "read_only"
    if isinstance(exc, OutOfMemoryError) or str(exc).find("OOM") >= 0:
        return "out_of_memory"
    if isinstance(exc, ResponseError):
        return "error_reply"
    return "unexpected_reply"


@contextmanager
def _store_failures() -> Iterator[None]:
    """Re-raise every failure of Redis, or of a reply, as :class:`QuotaBackendUnavailable`."""
    try:
        yield
    except (RedisError, OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise QuotaBackendUnavailable(reason=failure_reason(exc)) from exc


class RedisBackend(QuotaBackend):
    """Quota state in Redis (a single server or a primary; not Redis Cluster).

    The client does not retry, so a request waits at most ``socket_timeout`` before the
    fail-open or fail-closed policy applies. Voids run on ``void_client`` (by default
    ``client``), which should wait longer for a reply: :meth:`from_url` gives it a socket
    timeout of ``VOID_TIMEOUT_S``.
    """

    def __init__(
        self,
        client: Redis,
        *,
        fail_open: bool = False,
        lease_seconds: float = 60.0,
        key_prefix: str = "quota:",
        void_client: Redis | None = None,
    ) -> None:
        super().__init__(fail_open=fail_open, lease_seconds=lease_seconds)
        self._client = client
        self._void_client = void_client
        self._prefix = key_prefix
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(lua_source(name)) for name in SCRIPTS
        }
        if void_client is not None:
            self._scripts["void"] = void_client.register_script(lua_source("void"))

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        fail_open: bool = False,
        lease_seconds: float = 60.0,
        key_prefix: str = "quota:",
        socket_timeout: float = 1.0,
    ) -> RedisBackend:
        """A backend on new clients for ``url``; the URL's own query options take precedence
        (for example ``?socket_timeout=0.2``), except the voids' longer socket timeout."""
        client = _client(url, socket_timeout)
        void_client = _client(url, socket_timeout)
        # A reply too slow for a request must not be too slow for the void that undoes it.
        void_client.connection_pool.connection_kwargs["socket_timeout"] = VOID_TIMEOUT_S
        return cls(
            client,
            fail_open=fail_open,
            lease_seconds=lease_seconds,
            key_prefix=key_prefix,
            void_client=void_client,
        )

    async def _close(self) -> None:
        await self._client.aclose()
        if self._void_client is not None:
            await self._void_client.aclose()

    def _key(self, kind: str, name: str) -> str:
        return f"{self._prefix}{kind}:{name}"

    async def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        with _store_failures():
            return await self._scripts[script](keys=keys, args=args)

    def _subject_keys(self, subjects: Subjects) -> tuple[list[str], list[Any]]:
        """The keys and arguments ``check_subjects`` (``lua/common.lua``) reads per subject."""
        keys: list[str] = []
        args: list[Any] = []
        for subject, limits in subjects:
            keys += [
                self._key("rq", subject),
                self._key("tk", subject),
                self._key("cc", subject),
                self._key("bg", subject) + ":",
            ]
            args += [
                limits.requests_per_minute or 0,
                limits.tokens_per_minute or 0,
                limits.max_concurrent or 0,
                limits.token_budget or 0,
                limits.budget_period or "",
            ]
        return keys, args

    async def _reserve(
        self, rid: str, attempt: str, tokens: int, subjects: Subjects
    ) -> Admitted | Refused:
        subject_keys, subject_args = self._subject_keys(subjects)
        keys = [self._key("rs", rid), self._key("vd", rid), *subject_keys]
        args: list[Any] = [rid, attempt, tokens, round(self.lease_seconds * 1_000_000)]
        args += [RECONCILE_WINDOW_S * 1000, *subject_args]
        result = _decode(await self._run("reserve", keys, args))
        if result.get("duplicate"):
            raise ValueError(f"reservation id {rid!r} is in use")
        with _store_failures():
            refused = _refused(result, subjects)
            if refused is not None:
                return refused
            periods = tuple(period or None for period in result["periods"])
            if len(periods) != len(subjects):
                raise ValueError(f"{len(periods)} periods for {len(subjects)} subjects")
            return Admitted(int(result["now"]), periods, _levels(result, subjects))

    async def _void(self, rid: str, attempt: str, tokens: int, subjects: Subjects) -> bool:
        subject_keys, subject_args = self._subject_keys(subjects)
        keys = [self._key("rs", rid), self._key("vd", rid), *subject_keys]
        args: list[Any] = [rid, attempt, tokens, VOID_MEMORY_S * 1000, *subject_args]
        undone = await self._run("void", keys, args)
        with _store_failures():
            return int(undone) == 1

    async def _precheck(self, subjects: Subjects) -> Refused | None:
        keys, args = self._subject_keys(subjects)
        result = _decode(await self._run("precheck", keys, [PRECHECK_TOKENS, *args]))
        with _store_failures():
            return _refused(result, subjects)

    async def _reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        keys = [self._key("rs", reservation.id)]
        args: list[Any] = [
            reservation.id,
            reservation.tokens,
            actual_tokens,
            reservation.reserved_at_us,
        ]
        for charge in reservation.charges:
            budget = "" if charge.period is None else self._key("bg", charge.subject)
            keys += [
                self._key("tk", charge.subject),
                self._key("cc", charge.subject),
                f"{budget}:{charge.period}" if budget else "",
            ]
            args.append(charge.limits.tokens_per_minute or 0)
        await self._run("reconcile", keys, args)

    async def _renew(self, reservation: Reservation) -> bool:
        keys = [
            self._key("cc", charge.subject)
            for charge in reservation.charges
            if charge.limits.max_concurrent is not None
        ]
        if not keys:
            return True
        lease_us = round(self.lease_seconds * 1_000_000)
        held = await self._run("renew", keys, [reservation.id, lease_us])
        with _store_failures():
            return int(held) == len(keys)

    async def _charge_refused(self, subjects: Subjects) -> None:
        keys = [self._key("rq", subject) for subject, _ in subjects]
        args = [limits.requests_per_minute for _, limits in subjects]
        await self._run("charge_refused", keys, args)

    async def _usage(self, subject: str, limits: Limits) -> QuotaUsage:
        keys = [
            self._key("rq", subject),
            self._key("tk", subject),
            self._key("cc", subject),
            self._key("bg", subject) + ":",
        ]
        period = limits.budget_period if limits.token_budget is not None else None
        args = [limits.requests_per_minute or 0, limits.tokens_per_minute or 0, period or ""]
        result = _decode(await self._run("usage", keys, args))
        with _store_failures():
            return QuotaUsage(
                requests=result.get("requests"),
                tokens=result.get("tokens"),
                concurrent=int(result["concurrent"]),
                budget_used=result.get("budget_used"),
                budget_period=result.get("period"),
            )


def _client(url: str, socket_timeout: float) -> Redis:
    return Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 0),
    )


def _decode(reply: Any) -> dict[str, Any]:
    """A script's JSON reply, as an object."""
    with _store_failures():
        result = json.loads(reply)
        if not isinstance(result, dict):
            raise TypeError(f"not a JSON object: {reply!r}")
        return result


def _levels(result: dict[str, Any], subjects: Subjects) -> tuple[Levels, ...]:
    levels = tuple(Levels(requests, tokens) for requests, tokens in result["levels"])
    if len(levels) != len(subjects):
        raise ValueError(f"{len(levels)} levels for {len(subjects)} subjects")
    return levels


def _refused(result: dict[str, Any], subjects: Subjects) -> Refused | None:
    """The refusal a script reported, ``None`` when every limit passed."""
    levels = _levels(result, subjects)
    if "violations" not in result:
        return None
    violations = tuple(
        Violation(index - 1, limit, wait, used) for index, limit, wait, used in result["violations"]
    )
    if not violations or not all(0 <= v.index < len(subjects) for v in violations):
        raise ValueError(f"violations out of range: {result['violations']!r}")
    return Refused(violations, levels)
