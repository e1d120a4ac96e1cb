"""The access log: one line per HTTP request, at INFO, on the ``lora_gateway.access`` logger.

A request's :class:`AccessRecord` is created as it arrives (only while the logger is enabled
for INFO: otherwise nothing here runs), kept in its ASGI scope's ``state`` under
:data:`STATE`, filled by whoever learns a part of it (authentication: the tenant and key id;
the lifecycle: the alias, version, tokens, queue wait and TTFT) and written once, after the
response, by :meth:`AccessRecord.line`: one dict, formatted once by the handler's formatter.

A line holds the request id, the trace id (its request span's, where tracing is on), the
method, path (never the query string), status, client address, tenant, key id (never the
key), the alias and adapter version the request ran on, its outcome, prompt and completion
tokens, queue wait, time to first token and total time. Never a key, a prompt or a query
string. With ``log_format = "text"`` it is ``key=value`` pairs; with ``"json"``,
:class:`JsonFormatter` writes every log record as one JSON object, an access line's fields
at its top level.
"""

from __future__ import annotations

import json
import logging
import re
import time
from datetime import datetime, timezone
from typing import Any, Final

LOGGER: Final = logging.getLogger("lora_gateway.access")
STATE: Final = "access"
"""The key of a request's :class:`AccessRecord` in its ASGI scope's ``state``."""

clock = time.perf_counter


def wanted() -> bool:
    """Whether requests are logged (the access logger is enabled for INFO)."""
    return LOGGER.isEnabledFor(logging.INFO)


class AccessRecord:
    """What the access log says of one request, filled as the request learns it."""

    __slots__ = (
        "began",
        "client",
        "completion_tokens",
        "key_id",
        "method",
        "model",
        "outcome",
        "path",
        "prompt_tokens",
        "queue_wait",
        "request_id",
        "status",
        "tenant",
        "trace_id",
        "ttft_ms",
        "version",
    )

    def __init__(self, request_id: str, method: str, path: str, client: str | None) -> None:
        self.began = clock()
        self.request_id = request_id
        self.method = method
        self.path = path
        self.client = client
        self.status: int | None = None
        self.trace_id: str | None = None
        self.tenant: str | None = None
        self.key_id: str | None = None
        self.model: str | None = None
        self.version: int | None = None
        self.outcome: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.queue_wait: float | None = None
        self.ttft_ms: int | None = None

    def settled(
        self, outcome: str, prompt_tokens: int, completion_tokens: int, ttft_ms: int | None
    ) -> None:
        """The request ran and was settled: how it ended and what it used."""
        self.outcome = outcome
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.ttft_ms = ttft_ms

    def line(self) -> AccessLine:
        """The log line's fields (the total time up to now)."""
        wait = self.queue_wait
        return AccessLine(
            request_id=self.request_id,
            trace_id=self.trace_id,
            method=self.method,
            path=self.path,
            status=self.status,
            client=self.client,
            tenant=self.tenant,
            key_id=self.key_id,
            model=self.model,
            version=self.version,
            outcome=self.outcome,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            queue_wait_ms=None if wait is None else round(wait * 1000, 3),
            ttft_ms=self.ttft_ms,
            total_ms=round((clock() - self.began) * 1000, 3),
        )


_UNSAFE = re.compile(r"[^A-Za-z0-9\-_./:@+]").search
"""Finds a character that makes a text value quoted."""


def _text_value(value: Any) -> str:
    kind = type(value)
    if kind is int or kind is float:
        return str(value)  # digits, a sign, a point, an exponent, inf or nan: never quoted
    if value is None:
        return "-"
    text = value if kind is str else str(value)
    # Quoted (JSON's escapes) unless plainly safe: a client's path cannot forge a field or a
    # line.
    return text if text and _UNSAFE(text) is None else json.dumps(text)


class AccessLine(dict[str, Any]):
    """An access line's fields; as text (``str``, what a plain formatter writes),
    ``key=value`` pairs. Formatted only by the handler that writes it."""

    def __str__(self) -> str:
        return " ".join([f"{name}={_text_value(value)}" for name, value in self.items()])


def write(line: AccessLine) -> None:
    """Log ``line`` at INFO, as ``LOGGER.info(line)`` would, but without looking up the
    caller's source line: the access line's place in the code says nothing, and finding it
    walks the request's whole stack."""
    if LOGGER.isEnabledFor(logging.INFO):
        LOGGER.handle(LOGGER.makeRecord(LOGGER.name, logging.INFO, "", 0, line, (), None))


class JsonFormatter(logging.Formatter):
    """Every record as one JSON object: ``time`` (UTC, ISO 8601), ``level``, ``logger``, and
    ``message``, or an access line's fields in its place; an exception's traceback as
    ``exception``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname,
            "logger": record.name,
        }
        if isinstance(record.msg, AccessLine):
            entry.update(record.msg)
        else:
            entry["message"] = record.getMessage()
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


TEXT_FORMAT: Final = "%(levelname)s %(name)s: %(message)s"


def configure(level: str, log_format: str) -> None:
    """The process's logging: every record to stderr at ``level`` and above, as text or as
    JSON lines (``log_format``)."""
    handler = logging.StreamHandler()
    as_json = log_format == "json"
    handler.setFormatter(JsonFormatter() if as_json else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
