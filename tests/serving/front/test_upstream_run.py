"""What the front makes of each answer or event body the upstream sends."""

from __future__ import annotations

import pytest

from app.errors import GatewayError, UpstreamError
from app.protocol import ChatCompletionChunk
from app.serving.front.http1 import ConnectFailed
from app.serving.front.upstream import refusal, transport_error
from app.serving.front.upstream_run import read_answer
from app.serving.lifecycle.runs import fault_of

NAMES = {"helper@v2": "helper"}


def test_a_chunk_is_read_as_the_model_with_the_engines_extra_fields_dropped() -> None:
    body = (
        b'{"id":"x","object":"chat.completion.chunk","created":1,"model":"helper@v2",'
        b'"choices":[{"index":0,"delta":{"content":"hi"}}],"prompt_token_ids":[1,2]}'
    )
    chunk = read_answer(ChatCompletionChunk, body, NAMES)
    assert chunk.choices[0].delta.content == "hi"
    assert "prompt_token_ids" not in chunk.model_dump_json()


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"<html>", 502, "not JSON"),
        (b'{"id":"x","choices":"none"}', 502, "shape this gateway does not know"),
        # vLLM's error event: the status it would have answered in `code`, the global name
        # written back as the tenant's.
        (b'{"error":{"message":"helper@v2 is too long","code":400}}', 400, "helper is too"),
        (b'{"error":{"message":"engine died","code":"oops"}}', 502, "HTTP 500"),
    ],
)
def test_what_is_not_a_chunk_is_the_gateways_error(body: bytes, status: int, message: str) -> None:
    with pytest.raises(GatewayError, match=message) as raised:
        read_answer(ChatCompletionChunk, body, NAMES)
    assert raised.value.status_code == status
    assert "helper@v2" not in str(raised.value.body())
    if status == 502:
        assert isinstance(raised.value, UpstreamError)


@pytest.mark.parametrize(
    ("status", "fault"),
    [
        # The upstream refused the request as it was asked: the request's doing.
        (400, "request"),
        (404, "request"),
        (422, "request"),
        # The engine tier failed it: counted against the version's rollback rule.
        (500, "version"),
        (502, "version"),
        (503, "version"),
        (504, "version"),
    ],
)
def test_an_upstream_error_is_the_versions_fault_unless_the_request_was_refused(
    status: int, fault: str
) -> None:
    error = refusal(status, b'{"error":{"message":"no","code":%d}}' % status, NAMES)
    assert fault_of(error) == fault


def test_a_failure_that_is_no_gateway_error_is_the_versions_fault() -> None:
    assert fault_of(transport_error(ConnectFailed("refused"))) == "version"
    assert fault_of(RuntimeError("the engine died")) == "version"
