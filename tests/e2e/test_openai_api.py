"""The OpenAI surface, driven by the official client (sync and async)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest

from tests.support.live_gateway import MAX_MODEL_LEN, LiveGateway, long_stream

pytestmark = pytest.mark.slow

BASE = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "Tell me about the moon."}]


def prompt_tokens(gateway: LiveGateway, messages: list[dict[str, str]]) -> int:
    tokenizer = gateway.engine.tokenizer
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer.encode(text, add_special_tokens=False))


def test_non_streaming_usage_is_exact(gateway: LiveGateway) -> None:
    response = gateway.client("demo-all").chat.completions.create(
        model="legal_advisor", messages=MESSAGES, temperature=0, max_tokens=8
    )
    choice = response.choices[0]
    assert choice.finish_reason == "length"
    assert response.usage is not None
    assert response.usage.completion_tokens == 8
    assert response.usage.prompt_tokens == prompt_tokens(gateway, MESSAGES)
    assert response.usage.total_tokens == response.usage.prompt_tokens + 8
    assert response.model == "legal_advisor"
    assert response.id.startswith("chatcmpl-")


@pytest.mark.parametrize("interval", [None, 4])
def test_stream_reassembles_to_the_non_streamed_answer(
    gateway: LiveGateway, interval: int | None
) -> None:
    """Also with chunks of ``stream_interval`` tokens (vLLM's extension): the first token at
    once, then four at a time, the same text."""
    client = gateway.client("demo-all")
    whole = client.chat.completions.create(
        model="medical_scribe", messages=MESSAGES, temperature=0, max_tokens=24
    )
    chunks = list(
        client.chat.completions.create(
            model="medical_scribe",
            messages=MESSAGES,
            temperature=0,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"stream_interval": interval} if interval else None,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) <= (7 if interval else 24)  # the first token, then 23 four at a time
    finished = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finished == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()  # type: ignore[union-attr]


async def test_async_client_streams(gateway: LiveGateway) -> None:
    client = gateway.async_client("callcenter")
    stream = await client.chat.completions.create(
        model="telephony_support", messages=MESSAGES, temperature=0, max_tokens=10, stream=True
    )
    pieces = [chunk async for chunk in stream]
    assert sum(1 for c in pieces if c.choices and c.choices[0].delta.content) >= 1
    assert all(c.usage is None for c in pieces)  # no usage chunk unless asked


def test_stop_sequence_ends_the_answer_before_it(gateway: LiveGateway) -> None:
    client = gateway.client("demo-all")
    free = client.chat.completions.create(
        model=BASE, messages=MESSAGES, temperature=0, max_tokens=40
    )
    text = free.choices[0].message.content or ""
    words = text.split()
    assert len(words) > 4, text
    stop = words[3]
    stopped = client.chat.completions.create(
        model=BASE, messages=MESSAGES, temperature=0, max_tokens=40, stop=[stop]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[: text.index(stop)]


def test_ignore_eos_runs_to_max_tokens(gateway: LiveGateway) -> None:
    """vLLM's extension, as its own server takes it: exactly max_tokens, however the answer
    would have ended (the benchmark relies on it)."""
    client = gateway.client("demo-all")
    response = client.chat.completions.create(
        model=BASE,
        messages=[{"role": "user", "content": "Say OK."}],
        max_tokens=48,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert response.usage is not None and response.usage.completion_tokens == 48
    assert response.choices[0].finish_reason == "length"


def test_n_choices_seed_and_logprobs(gateway: LiveGateway) -> None:
    client = gateway.client("demo-all")

    def sample() -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(
            model="legal_advisor",
            messages=MESSAGES,
            temperature=1.0,
            seed=7,
            n=2,
            max_tokens=6,
            logprobs=True,
            top_logprobs=3,
        )

    first, again = sample(), sample()
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    assert first.usage is not None
    generated = 0
    for choice in first.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        generated += len(choice.logprobs.content)
        for token in choice.logprobs.content:
            assert token.logprob <= 0
            assert len(token.top_logprobs) == 3
            assert token.top_logprobs[0].logprob >= token.logprob - 1e-4
    assert first.usage.completion_tokens == generated


def test_penalties_and_top_p_are_accepted(gateway: LiveGateway) -> None:
    response = gateway.client("demo-all").chat.completions.create(
        model=BASE,
        messages=MESSAGES,
        temperature=0.7,
        top_p=0.9,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        max_completion_tokens=5,
    )
    assert response.usage is not None and response.usage.completion_tokens <= 5


def test_text_completions(gateway: LiveGateway) -> None:
    client = gateway.client("demo-all")
    prompt = "The three primary colours are"
    response = client.completions.create(
        model=BASE, prompt=prompt, max_tokens=8, temperature=0, logprobs=2, echo=True
    )
    choice = response.choices[0]
    assert choice.text.startswith(prompt)
    assert choice.logprobs is not None and len(choice.logprobs.tokens or []) == 8
    assert response.usage is not None
    assert response.usage.prompt_tokens == len(gateway.engine.tokenizer.encode(prompt))
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=BASE, prompt=prompt, max_tokens=8, temperature=0, stream=True
        )
        if c.choices
    )
    assert prompt + streamed == choice.text


def test_context_too_long_is_a_400(gateway: LiveGateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.client("demo-all").chat.completions.create(
            model=BASE, messages=MESSAGES, max_tokens=MAX_MODEL_LEN
        )
    assert caught.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    assert gateway.wait_idle() == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": BASE, "messages": MESSAGES, "temperature": 5}, "temperature"),
        ({"model": BASE}, "messages"),
        ({"model": BASE, "messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"model": BASE, "messages": MESSAGES, "n": 0}, "n"),
    ],
)
def test_invalid_requests_get_openai_shaped_400(
    gateway: LiveGateway, body: dict[str, object], param: str
) -> None:
    response = httpx.post(
        f"{gateway.base_url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {gateway.keys['demo-all']}"},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert param.split(".")[0] in error["message"]
    assert response.headers["x-request-id"]


def test_malformed_json_and_unknown_routes(gateway: LiveGateway) -> None:
    headers = {"Authorization": f"Bearer {gateway.keys['demo-all']}"}
    bad = httpx.post(
        f"{gateway.base_url}/v1/chat/completions", content=b"{not json", headers=headers
    )
    assert bad.status_code == 400 and "error" in bad.json()
    missing = httpx.get(f"{gateway.base_url}/v1/nope", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["message"]


def test_every_response_carries_a_request_id(gateway: LiveGateway) -> None:
    ids = set()
    for path in ("/healthz", "/readyz", "/v1/models"):
        response = httpx.get(f"{gateway.base_url}{path}")
        ids.add(response.headers["x-request-id"])
    assert len(ids) == 3


def test_client_disconnect_mid_stream_aborts_the_engine_request(gateway: LiveGateway) -> None:
    body = long_stream(BASE)
    headers = {"Authorization": f"Bearer {gateway.keys['demo-all']}"}
    with httpx.stream(
        "POST", f"{gateway.base_url}/v1/chat/completions", json=body, headers=headers
    ) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in received)
        assert gateway.engine.num_unfinished_requests() == 1
    assert gateway.wait_idle() == 0


def test_client_disconnect_while_waiting_aborts_the_engine_request(gateway: LiveGateway) -> None:
    body = {**long_stream(BASE), "stream": False}
    headers = {"Authorization": f"Bearer {gateway.keys['demo-all']}"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{gateway.base_url}/v1/chat/completions", json=body, headers=headers, timeout=2.0
        )
    assert gateway.wait_idle() == 0


def test_a_client_that_leaves_a_chunked_stream_pays_what_the_engine_produced(
    gateway: LiveGateway,
) -> None:
    """Chunks as long as a request may ask, two choices: what the engine produced for each
    when the client left, held back for the next chunk, is what is charged. vLLM's output
    processor counts it (its detokenizer holds every token produced) until the abort."""
    processor = gateway.engine._llm.output_processor  # type: ignore[attr-defined]
    at_abort: list[int] = []

    def produced() -> int:
        states = list(processor.request_states.values())
        return sum(state.detokenizer.num_output_tokens() for state in states)

    async def produced_now() -> int:
        return produced()

    def counting_abort(request_ids: Any, internal: bool) -> list[str]:
        at_abort.append(produced())
        return abort(request_ids, internal)

    body = {
        **long_stream(BASE),
        "n": 2,
        "temperature": 0.8,
        "ignore_eos": True,
        "stream_interval": gateway.settings.max_stream_interval,
    }
    headers = {"Authorization": f"Bearer {gateway.keys['demo-all']}"}
    abort = processor.abort_requests
    processor.abort_requests = counting_abort
    try:
        with httpx.stream(
            "POST", f"{gateway.base_url}/v1/chat/completions", json=body, headers=headers
        ) as response:
            assert response.status_code == 200, response.read()
            lines = response.iter_lines()  # dropped, it would close the response
            assert next(lines).startswith("data: ")
            deadline = time.monotonic() + 120
            # Until the choices hold tokens back (only their first went at once).
            while gateway.run(produced_now()) < 2 * 16:
                assert time.monotonic() < deadline, "the engine produced too little"
                time.sleep(0.05)
        assert gateway.wait_idle() == 0
    finally:
        del processor.abort_requests
    gateway.run(gateway.settled())
    [*_, record] = gateway.run(gateway.usage_records())
    assert record.status == "cancelled"
    # What the engine had produced at its first abort (later ones find nothing left).
    assert record.completion_tokens == at_abort[0]
    assert 2 * 16 <= record.completion_tokens < 2 * 900


async def test_concurrent_streams_all_complete(gateway: LiveGateway) -> None:
    client = gateway.async_client("demo-all")

    async def one(model: str) -> int:
        stream = await client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            temperature=0.8,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert chunks[-1].usage is not None
        return chunks[-1].usage.completion_tokens

    models = [BASE, "legal_advisor", "medical_scribe", "telephony_support"] * 3
    tokens = await asyncio.gather(*(one(m) for m in models))
    assert all(0 < t <= 12 for t in tokens)
