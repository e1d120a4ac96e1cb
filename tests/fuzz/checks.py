"""The fuzzer's own check: every error leaves in OpenAI's shape."""

from __future__ import annotations

import json
from typing import Any

import schemathesis
from schemathesis import Case, CheckContext, Response

ERROR_FIELDS = ("message", "type", "param", "code")


def openai_error_problem(status_code: int, body: bytes, content_type: str = "") -> str | None:
    """Why a response is not an OpenAI-shaped error, or None when it is one (or not an error).

    The shape: ``{"error": {"message": str, "type": str, "param": str|null,
    "code": str|null}}`` and nothing else at the top level. In a stream (server-sent
    events, status 200), an event that carries an error has that shape too; the Responses
    API's events (``"type": "response...."``) carry theirs in ``response.failed``'s Response,
    in the shape OpenAI gives it there.
    """
    if content_type.startswith("text/event-stream"):
        return _stream_error_problem(body)
    if status_code < 400:
        return None
    return _error_document_problem(f"the {status_code}", body)


def _stream_error_problem(body: bytes) -> str | None:
    for line in body.splitlines():
        data = line.removeprefix(b"data: ")
        if line.startswith(b"data: ") and data != b"[DONE]" and b'"error"' in data:
            if data.startswith(b'{"type": "response.'):
                problem = _response_event_problem(data)
                if problem is not None:
                    return problem
                continue
            problem = _error_document_problem("a stream's error event", data)
            if problem is not None:
                return problem
    return None


def _response_event_problem(data: bytes) -> str | None:
    event = json.loads(data)
    if event["type"] != "response.failed":
        return None
    error = event["response"].get("error")
    if not isinstance(error, dict) or not error.get("message") or not error.get("code"):
        return f"a response.failed event without its error: {data[:200]!r}"
    return None


def _error_document_problem(what: str, body: bytes) -> str | None:
    try:
        document: Any = json.loads(body)
    except ValueError:
        return f"{what} body is not JSON: {body[:200]!r}"
    if not isinstance(document, dict) or set(document) != {"error"}:
        return f"{what} body is not {{'error': ...}}: {body[:200]!r}"
    error = document["error"]
    if not isinstance(error, dict) or set(error) != set(ERROR_FIELDS):
        return f"{what} error must have exactly {ERROR_FIELDS}: {body[:200]!r}"
    problems = [
        f"{name} must be a string"
        for name in ("message", "type")
        if not isinstance(error[name], str)
    ]
    problems += [
        f"{name} must be a string or null"
        for name in ("param", "code")
        if error[name] is not None and not isinstance(error[name], str)
    ]
    if not error["message"]:
        problems.append("message must not be empty")
    return f"{what} error: {', '.join(problems)}" if problems else None


@schemathesis.check
def openai_shaped_error(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    content_type = response.headers.get("content-type", [""])[0]
    problem = openai_error_problem(response.status_code, response.content, content_type)
    if problem is not None:
        raise AssertionError(problem)
    return None
