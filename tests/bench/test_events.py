"""Reading a recorded chat-completions stream."""

from __future__ import annotations

import pytest

from bench.events import StreamTiming, sse_data

# As vLLM's server sends it (abridged): a role-only opening chunk, one chunk
# per token, the finish chunk, a usage-only chunk, then [DONE].
RECORDED = """\
data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}

data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"The"},"finish_reason":null}]}

: keep-alive comment

data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" capital"},"finish_reason":null}]}

data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" is"},"finish_reason":"length"}]}

data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":31,"completion_tokens":3,"total_tokens":34}}

data: [DONE]

"""  # noqa: E501


def feed(text: str, times: list[float]) -> StreamTiming:
    timing = StreamTiming()
    clock = iter(times)
    for line in text.splitlines():
        payload = sse_data(line)
        if payload is not None:
            timing.feed(payload, next(clock))
    return timing


def test_sse_data_takes_data_lines_only() -> None:
    assert sse_data('data: {"a":1}') == '{"a":1}'
    assert sse_data("data:[DONE]") == "[DONE]"
    assert sse_data("") is None
    assert sse_data(": comment") is None
    assert sse_data("event: ping") is None


def test_recorded_stream_gives_tokens_gaps_and_usage() -> None:
    timing = feed(RECORDED, [0.10, 0.25, 0.30, 0.38, 0.39, 0.40])
    assert timing.done and timing.error is None
    assert timing.token_times == [0.25, 0.30, 0.38]  # the role-only chunk is no token
    assert timing.gaps() == pytest.approx([0.05, 0.08])
    assert (timing.prompt_tokens, timing.output_tokens) == (31, 3)


def test_without_usage_tokens_are_counted_from_chunks() -> None:
    text = "\n".join(line for line in RECORDED.splitlines() if "usage" not in line)
    timing = feed(text, [0.1, 0.2, 0.3, 0.4, 0.5])
    assert timing.completion_tokens is None
    assert timing.output_tokens == 3


def test_an_error_event_is_reported() -> None:
    text = (
        'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
        'data: {"error":{"message":"The server had an error while streaming.",'
        '"type":"server_error"}}\n\n'
        "data: [DONE]\n\n"
    )
    timing = feed(text, [0.1, 0.2, 0.3])
    assert timing.error == "The server had an error while streaming."
    assert timing.done
    assert timing.output_tokens == 1


def test_text_completion_chunks_count_too() -> None:
    timing = feed('data: {"choices":[{"index":0,"text":"Hello"}]}\n', [1.0])
    assert timing.token_times == [1.0]
