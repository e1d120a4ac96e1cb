"""What the front makes of each answer or event body the upstream sends."""

from __future__ import annotations

import pytest

from app.errors import GatewayError, UpstreamError
from app.protocol import ChatCompletionChunk
from app.serving.front.upstream_run import read_answer

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
