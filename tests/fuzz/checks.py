"""The fuzzer's own check: every error leaves in OpenAI's shape."""

from __future__ import annotations

import json
from typing import Any

import schemathesis
from schemathesis import Case, CheckContext, Response

ERROR_FIELDS = ("message", "type", "param", "code")


def openai_error_problem(status_code: int, body: bytes) -> str | None:
    """Why a response is not an OpenAI-shaped error, or None when it is one (or not an error).

    The shape: ``{"error": {"message": str, "type": str, "param": str|null,
    "code": str|null}}`` and nothing else at the top level.
    """
    if status_code < 400:
        return None
    try:
        document: Any = json.loads(body)
    except ValueError:
        return f"the {status_code} body is not JSON: {body[:200]!r}"
    if not isinstance(document, dict) or set(document) != {"error"}:
        return f"the {status_code} body is not {{'error': ...}}: {body[:200]!r}"
    error = document["error"]
    if not isinstance(error, dict) or set(error) != set(ERROR_FIELDS):
        return f"the {status_code} error must have exactly {ERROR_FIELDS}: {body[:200]!r}"
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
    return f"the {status_code} error: {', '.join(problems)}" if problems else None


@schemathesis.check
def openai_shaped_error(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    problem = openai_error_problem(response.status_code, response.content)
    if problem is not None:
        raise AssertionError(problem)
    return None
