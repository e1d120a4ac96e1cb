"""The fuzzer's error-shape check tells OpenAI-shaped errors from everything else."""

from __future__ import annotations

import json

import pytest

from tests.fuzz.checks import openai_error_problem

SHAPED = {"error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}}
SSE = "text/event-stream; charset=utf-8"


def _body(document: object) -> bytes:
    return json.dumps(document).encode()


def test_an_openai_shaped_error_and_a_success_pass() -> None:
    assert openai_error_problem(400, _body(SHAPED)) is None
    assert openai_error_problem(200, b"not json at all") is None
    stream = b'data: {"id": "x"}\n\ndata: ' + _body(SHAPED) + b"\n\ndata: [DONE]\n\n"
    assert openai_error_problem(200, stream, SSE) is None


@pytest.mark.parametrize(
    "document",
    [
        {"detail": "Not Found"},  # FastAPI's own
        {"error": "boom"},
        {"error": {"message": "m", "type": "t", "param": None}},
        {**SHAPED, "extra": 1},
        {"error": {**SHAPED["error"], "code": 400}},
        {"error": {**SHAPED["error"], "message": ""}},
    ],
)
def test_anything_else_is_a_problem(document: object) -> None:
    assert openai_error_problem(422, _body(document)) is not None


def test_a_plain_text_error_and_a_misshapen_stream_error_are_problems() -> None:
    assert openai_error_problem(500, b"Internal Server Error") is not None
    stream = b'data: {"error": "engine died"}\n\ndata: [DONE]\n\n'
    assert openai_error_problem(200, stream, SSE) is not None
