"""The access log (app/access_log.py): one line per request, in both roles, with what the
request was and used; refusals without a valid key once a minute per address; JSON that
parses; never a key nor a prompt."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app import access_log
from app.access_log import AccessLine, JsonFormatter
from app.settings import Settings
from tests.support.fake_upstream import UPSTREAM_PROMPT_TOKENS, FakeUpstream, fake_upstream
from tests.support.front_app import front_settings, running_front
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, ServeFactory, eventually

PROMPT = "the words of a prompt nobody may read in a log"
FIELDS = {
    "request_id",
    "trace_id",
    "method",
    "path",
    "status",
    "client",
    "tenant",
    "key_id",
    "model",
    "version",
    "outcome",
    "prompt_tokens",
    "completion_tokens",
    "queue_wait_ms",
    "ttft_ms",
    "total_ms",
}


class Lines:
    """The log records written during the test (the access log enabled)."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self._caplog = caplog

    def __iter__(self) -> Iterator[logging.LogRecord]:
        return iter(self._caplog.records)


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Lines:
    caplog.set_level(logging.INFO, logger=access_log.LOGGER.name)
    return Lines(caplog)


def access(records: Lines) -> list[AccessLine]:
    """The access lines of the OpenAI API's requests (the test's admin calls have theirs)."""
    found = [r.msg for r in records if r.name == access_log.LOGGER.name]
    assert all(isinstance(line, AccessLine) for line in found)
    return [line for line in found if line["path"].startswith("/v1/")]  # type: ignore[index]


def for_request(records: Lines, response: httpx.Response) -> AccessLine:
    [line] = [a for a in access(records) if a["request_id"] == response.headers["x-request-id"]]
    return line


def chat(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}], **fields}


def written(records: Lines) -> list[str]:
    """Every access record as each format writes it."""
    text, as_json = logging.Formatter(access_log.TEXT_FORMAT), JsonFormatter()
    ours = [r for r in records if r.name == access_log.LOGGER.name]
    return [formatter.format(r) for r in ours for formatter in (text, as_json)]


async def test_a_streamed_success_is_one_line_with_what_it_used(
    serve: ServeFactory, lines: Lines
) -> None:
    async with serve(ScriptedEngine()) as served, served.client() as client:
        body = chat(served.model, max_tokens=5, stream=True)
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            await response.aread()
        assert response.status_code == 200
        await eventually(lambda: len(access(lines)) == 1)
        key_id = served.gateway.registry.authenticate(served.key).key_id
    line = for_request(lines, response)
    assert set(line) == FIELDS
    assert line["method"] == "POST" and line["path"] == "/v1/chat/completions"
    assert (line["status"], line["outcome"]) == (200, "ok")
    assert (line["tenant"], line["key_id"], line["model"]) == (TENANT, key_id, served.model)
    assert line["version"] is None  # the base model
    assert line["completion_tokens"] == 5 and line["prompt_tokens"] > 0
    assert line["client"] == "127.0.0.1"
    assert 0 <= line["queue_wait_ms"] <= line["total_ms"]
    assert line["ttft_ms"] is not None and line["ttft_ms"] <= line["total_ms"]
    assert line["trace_id"] is None  # no tracing
    for text in written(lines):
        assert served.key not in text and PROMPT not in text


async def test_refusals_without_a_valid_key_are_logged_once_a_minute_per_address(
    serve: ServeFactory, lines: Lines
) -> None:
    bad_key = "lgw-not-a-key-of-anyone"
    async with serve(ScriptedEngine()) as served:
        for address in ("127.0.0.1", "127.0.0.2"):
            transport = httpx.AsyncHTTPTransport(local_address=address)
            async with httpx.AsyncClient(
                base_url=served.base_url,
                headers={"Authorization": f"Bearer {bad_key}"},
                transport=transport,
            ) as stranger:
                for _ in range(3):
                    refused = await stranger.post("/v1/chat/completions", json=chat("m"))
                    assert refused.status_code == 401
        # A valid key from the throttled address is still logged.
        async with served.client() as client:
            ok = await client.post("/v1/chat/completions", json=chat(served.model, max_tokens=1))
        assert ok.status_code == 200
        await eventually(lambda: len(access(lines)) == 3)
    refusals = [a for a in access(lines) if a["status"] == 401]
    assert sorted(a["client"] for a in refusals) == ["127.0.0.1", "127.0.0.2"]
    assert all(a["tenant"] is None and a["key_id"] is None for a in refusals)
    assert for_request(lines, ok)["outcome"] == "ok"
    for text in written(lines):
        assert bad_key not in text and served.key not in text and PROMPT not in text


async def test_an_engine_error_and_a_refusal_each_have_their_line(
    serve: ServeFactory, lines: Lines
) -> None:
    async with serve(ScriptedEngine(fail_after=2)) as served, served.client() as client:
        failed = await client.post("/v1/chat/completions", json=chat(served.model, max_tokens=5))
        unknown = await client.post("/v1/chat/completions", json=chat("no-such-model"))
        await eventually(lambda: len(access(lines)) == 2)
    # The server error handler answers outside the middleware that sets the request's id.
    assert failed.status_code == 500 and unknown.status_code == 404
    [line] = [a for a in access(lines) if a["status"] == 500]
    assert line["outcome"] == "error"
    assert line["tenant"] == TENANT and line["completion_tokens"] == 2
    refused = for_request(lines, unknown)
    assert refused["status"] == 404 and refused["tenant"] == TENANT
    # A name the tenant may not use stays out of the log, as out of the metrics.
    assert refused["model"] is None and refused["outcome"] is None
    assert "no-such-model" not in "".join(written(lines))


async def test_json_lines_parse_and_carry_the_fields(serve: ServeFactory, lines: Lines) -> None:
    async with serve(ScriptedEngine()) as served, served.client() as client:
        response = await client.post("/v1/chat/completions", json=chat(served.model, max_tokens=3))
        await eventually(lambda: len(access(lines)) == 1)
    [record] = [r for r in lines if r.name == access_log.LOGGER.name and r.msg in access(lines)]
    entry = json.loads(JsonFormatter().format(record))
    assert FIELDS | {"time", "level", "logger"} == set(entry)
    assert entry["level"] == "INFO" and entry["logger"] == "lora_gateway.access"
    assert entry["request_id"] == response.headers["x-request-id"]
    assert (entry["status"], entry["completion_tokens"], entry["tenant"]) == (200, 3, TENANT)
    text = logging.Formatter("%(message)s").format(record)
    assert f"request_id={entry['request_id']} trace_id=- method=POST" in text
    assert "status=200" in text and "completion_tokens=3" in text


def test_a_client_path_cannot_forge_a_field_or_a_line() -> None:
    line = AccessLine(path='/v1/x status=200\nforged="1"', status=404, tenant=None)
    assert str(line) == 'path="/v1/x status=200\\nforged=\\"1\\"" status=404 tenant=-'


def test_numbers_and_missing_values_are_written_as_they_are() -> None:
    line = AccessLine(status=200, queue_wait_ms=1e-05, total_ms=-0.5, version=None, ok=True)
    assert str(line) == "status=200 queue_wait_ms=1e-05 total_ms=-0.5 version=- ok=True"


def test_the_log_format_setting_picks_the_formatter() -> None:
    root = logging.getLogger()
    kept = root.handlers[:], root.level
    try:
        for log_format, formatter in (("json", JsonFormatter), ("text", logging.Formatter)):
            settings = Settings(_env_file=None, log_format=log_format)  # type: ignore[call-arg]
            access_log.configure(settings.log_level, settings.log_format)
            assert type(root.handlers[-1].formatter) is formatter
    finally:
        root.handlers[:], level = kept
        root.setLevel(level)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_line_written_without_a_record_is_the_records_own(
    monkeypatch: pytest.MonkeyPatch, log_format: str
) -> None:
    # Alone on the root logger, configure()'s handler writes an access line without a log
    # record; beside another handler, the record goes through logging. The same bytes.
    monkeypatch.setattr(access_log.time, "time", lambda: 1_700_000_000.25)
    line = AccessLine(request_id="r1", path='/v1/x "y"', status=200, tenant=None, total_ms=1.5)
    root = logging.getLogger()
    kept = root.handlers[:], root.level
    try:
        access_log.configure("info", log_format)
        [handler] = root.handlers
        assert isinstance(handler, logging.StreamHandler)
        written: list[str] = []
        for beside in ([], [logging.NullHandler()]):
            root.handlers[1:] = beside
            assert (access_log._sole_handler() is handler) == (not beside)
            handler.setStream(io.StringIO())
            access_log.write(line)
            written.append(handler.stream.getvalue())
        alone, through_logging = written
        assert alone == through_logging
        if log_format == "text":
            expected = 'request_id=r1 path="/v1/x \\"y\\"" status=200 tenant=- total_ms=1.5'
            assert alone == f"INFO lora_gateway.access: {expected}\n"
        else:
            assert json.loads(alone) == {
                "time": "2023-11-14T22:13:20.250000+00:00",
                "level": "INFO",
                "logger": "lora_gateway.access",
                **line,
            }
    finally:
        root.handlers[:], level = kept
        root.setLevel(level)


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with fake_upstream() as fake:
        yield fake


async def test_the_front_role_logs_its_requests_alike(
    upstream: FakeUpstream, tmp_path: Path, lines: Lines
) -> None:
    async with running_front(front_settings(upstream.url, tmp_path)) as front:
        await front.admin("POST", "/tenants", {"id": "t", "name": "t", "allow_base_model": True})
        key = (await front.admin("POST", "/tenants/t/keys", {"name": "k"}))["key"]
        model = front.gateway.registry.base_model_id
        async with front.client(key) as client:
            body = chat(model, max_tokens=4, stream=True)
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                await response.aread()
        await eventually(lambda: any(a["tenant"] == "t" for a in access(lines)))
    line = for_request(lines, response)
    assert (line["status"], line["outcome"], line["model"]) == (200, "ok", model)
    assert line["prompt_tokens"] == UPSTREAM_PROMPT_TOKENS
    assert line["completion_tokens"] == upstream.script.completion_tokens
    assert line["ttft_ms"] is not None and line["queue_wait_ms"] is not None
    for text in written(lines):
        assert key not in text and PROMPT not in text
