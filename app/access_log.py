"""The access log: one line per HTTP request, at INFO, on the ``lora_gateway.access`` logger.

A request's :class:`AccessRecord` is created as it arrives (only while the logger is enabled
for INFO: otherwise nothing here runs), kept in its ASGI scope's ``state`` under
:data:`STATE`, filled by whoever learns a part of it (authentication: the tenant and key id;
the lifecycle: the alias, version, tokens, queue wait and TTFT) and written once, after the
response, by :meth:`AccessRecord.line`: one dict, formatted once (by :func:`configure`'s
handler without a log record where the record would reach that handler alone, :func:`write`).

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
from typing import Any, Final, TextIO

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
    """Log ``line`` at INFO, as ``LOGGER.info(line)`` would. Where the record would reach
    :func:`configure`'s handler alone, the handler writes the line without one (a record and
    logging's dispatch of it cost a line more than its formatting); else the record goes
    through logging, without looking up the caller's source line (the access line's place in
    the code says nothing, and finding it walks the request's whole stack)."""
    if not LOGGER.isEnabledFor(logging.INFO):
        return
    handler = _sole_handler()
    if handler is None or not handler.write_line(line):
        LOGGER.handle(_record(line))


def _record(line: AccessLine) -> logging.LogRecord:
    return LOGGER.makeRecord(LOGGER.name, logging.INFO, "", 0, line, (), None)


def _sole_handler() -> LineHandler | None:
    """:func:`configure`'s handler, where an access line's record would reach it and no
    other handler, through no filter."""
    root = logging.root
    if (
        LOGGER.handlers
        or LOGGER.filters
        or LOGGER.disabled
        or not LOGGER.propagate
        or LOGGER.parent is not root
        or root.filters
        or len(root.handlers) != 1
    ):
        return None
    handler = root.handlers[0]
    return handler if type(handler) is LineHandler else None


def _json_entry(created: float, level: str, logger: str) -> dict[str, Any]:
    return {
        "time": datetime.fromtimestamp(created, timezone.utc).isoformat(),
        "level": level,
        "logger": logger,
    }


class JsonFormatter(logging.Formatter):
    """Every record as one JSON object: ``time`` (UTC, ISO 8601), ``level``, ``logger``, and
    ``message``, or an access line's fields in its place; an exception's traceback as
    ``exception``."""

    def format(self, record: logging.LogRecord) -> str:
        entry = _json_entry(record.created, record.levelname, record.name)
        if isinstance(record.msg, AccessLine):
            entry.update(record.msg)
        else:
            entry["message"] = record.getMessage()
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


TEXT_FORMAT: Final = "%(levelname)s %(name)s: %(message)s"
_TEXT_HEAD: Final = TEXT_FORMAT.removesuffix("%(message)s") % {
    "levelname": logging.getLevelName(logging.INFO),
    "name": LOGGER.name,
}
"""What :data:`TEXT_FORMAT` writes of an access line's record before its message."""


class LineHandler(logging.StreamHandler[TextIO]):
    """:func:`configure`'s handler: to stderr, as text or as JSON lines, and an access line
    written as its record would be, without the record."""

    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter() if as_json else logging.Formatter(TEXT_FORMAT))
        self._configured = self.formatter
        self._as_json = as_json

    def write_line(self, line: AccessLine) -> bool:
        """Write ``line`` as :meth:`handle` writes a record of it; ``False``, writing nothing,
        where the handler has been given a filter, a level above INFO or another formatter
        since."""
        if self.filters or self.level > logging.INFO or self.formatter is not self._configured:
            return False
        created = time.time()
        self.acquire()
        try:
            if self._as_json:
                entry = _json_entry(created, logging.getLevelName(logging.INFO), LOGGER.name)
                entry.update(line)
                text = json.dumps(entry, default=str)
            else:
                text = _TEXT_HEAD + str(line)
            self.stream.write(text + self.terminator)
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(_record(line))
        finally:
            self.release()
        return True


def configure(level: str, log_format: str) -> None:
    """The process's logging: every record to stderr at ``level`` and above, as text or as
    JSON lines (``log_format``)."""
    handler = LineHandler(as_json=log_format == "json")
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
