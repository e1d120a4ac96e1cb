"""The front role in front of real engines (the cluster: tests/support/scale_out.py), through
the official ``openai`` client: an adapter registered through the front is served by its
tenant's alias; the OpenAI features that work in-process work through the front too."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from app.settings import EMBEDDED_MODEL_DIR
from tests.support.engine_role import BASE_MODEL_ID
from tests.support.scale_out import ADAPTER, ALIAS, Cluster

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "What should a contract say about payment?"}]


def greedy(cluster: Cluster, model: str = ALIAS, **extra: Any) -> Any:
    return cluster.tenant(timeout=300).chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=12, temperature=0, **extra
    )


def test_an_alias_is_served_by_its_adapter_under_the_alias(cluster: Cluster) -> None:
    raw = greedy(cluster)
    answer = raw.parse()
    assert answer.model == ALIAS
    text = answer.choices[0].message.content
    assert text
    # The same as the engine gives for the global name: the adapter served it.
    direct = httpx.post(
        f"{cluster.engines[0].base_url}/v1/chat/completions",
        json={"model": ADAPTER, "messages": MESSAGES, "max_tokens": 12, "temperature": 0},
        timeout=300,
    ).json()
    assert direct["choices"][0]["message"]["content"] == text
    base = greedy(cluster, BASE_MODEL_ID).parse()
    assert base.choices[0].message.content != text, "the adapter changed nothing"
    # Charged what the engine counted.
    assert answer.usage is not None
    usage_row = cluster.usage_row(raw.headers["x-request-id"])
    assert usage_row == ("ok", answer.usage.prompt_tokens, answer.usage.completion_tokens)


def test_a_stream_with_usage(cluster: Cluster) -> None:
    answer = greedy(cluster).parse()
    whole, usage = answer.choices[0].message.content, answer.usage
    chunks = list(
        cluster.tenant().chat.completions.create(
            model=ALIAS,
            messages=MESSAGES,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert {chunk.model for chunk in chunks} == {ALIAS}
    *content, last = chunks
    assert "".join(c.choices[0].delta.content or "" for c in content) == whole
    assert last.choices == [] and last.usage == usage
    assert all(c.usage is None for c in content)
    # In chunks of 4 tokens (vLLM's stream_interval, asked of the engine by the front).
    gathered = cluster.tenant().chat.completions.create(
        model=ALIAS,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        stream=True,
        extra_body={"stream_interval": 4},
    )
    with_text = [c.choices[0].delta.content for c in gathered if c.choices[0].delta.content]
    assert "".join(with_text) == whole
    assert len(with_text) <= 4  # the first token, then 11 four at a time
    unasked = list(
        cluster.tenant().chat.completions.create(
            model=ALIAS, messages=MESSAGES, max_tokens=4, stream=True
        )
    )
    assert all(c.choices and c.usage is None for c in unasked)


def test_json_mode_and_schema(cluster: Cluster) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 20}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    answer = cluster.tenant().chat.completions.create(
        model=ALIAS,
        messages=MESSAGES,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), schema)
    mode = cluster.tenant().chat.completions.create(
        model=ALIAS,
        messages=MESSAGES,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert mode.choices[0].finish_reason in ("stop", "length")
    assert (mode.choices[0].message.content or "").lstrip().startswith("{")


def test_logit_bias_n_stop_and_seed(cluster: Cluster) -> None:
    client = cluster.tenant()
    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_MODEL_DIR)
    forced_id = tokenizer.encode(" banana", add_special_tokens=False)[0]
    forced = client.chat.completions.create(
        model=ALIAS,
        messages=MESSAGES,
        max_tokens=3,
        temperature=0,
        logit_bias={str(forced_id): 100},
    )
    assert forced.choices[0].message.content == tokenizer.decode([forced_id] * 3)

    def seeded() -> Any:
        return client.chat.completions.create(
            model=ALIAS,
            messages=MESSAGES,
            max_tokens=6,
            temperature=1.0,
            n=3,
            seed=7,
            extra_body={"ignore_eos": True},
        )

    several = seeded()
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert several.usage is not None and several.usage.completion_tokens == 18
    again = seeded()
    assert [c.message.content for c in again.choices] == [
        c.message.content for c in several.choices
    ]

    whole = greedy(cluster).parse().choices[0].message.content or ""
    stop = whole.split()[1]
    stopped = greedy(cluster, stop=[stop]).parse().choices[0]
    assert stopped.finish_reason == "stop" and stop not in (stopped.message.content or "")


def test_another_tenant_cannot_reach_the_adapter(cluster: Cluster) -> None:
    for model in (ALIAS, ADAPTER):
        with pytest.raises(openai.NotFoundError) as refused:
            cluster.tenant("other").chat.completions.create(
                model=model, messages=MESSAGES, max_tokens=2
            )
        assert "acme" not in str(refused.value)


def test_text_completions_through_the_front(cluster: Cluster) -> None:
    answer = cluster.tenant().completions.create(
        model=ALIAS, prompt="The contract says", max_tokens=5, temperature=0, echo=True
    )
    assert answer.model == ALIAS
    assert answer.choices[0].text.startswith("The contract says")
    assert answer.usage is not None and answer.usage.completion_tokens == 5


def test_logprobs_json_and_streamed(cluster: Cluster) -> None:
    client = cluster.tenant()
    asked: dict[str, Any] = {
        "model": ALIAS,
        "messages": MESSAGES,
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    answer = client.chat.completions.create(**asked)
    content = answer.choices[0].logprobs
    assert content is not None and content.content is not None and len(content.content) == 4
    assert all(len(position.top_logprobs) == 2 for position in content.content)
    streamed = [
        position
        for chunk in client.chat.completions.create(stream=True, **asked)
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content
        for position in chunk.choices[0].logprobs.content
    ]
    assert [p.token for p in streamed] == [p.token for p in content.content]
    text = client.completions.create(
        model=ALIAS, prompt="The contract says", max_tokens=3, temperature=0, logprobs=2
    )
    assert text.choices[0].logprobs is not None
    assert len(text.choices[0].logprobs.tokens or []) == 3


def test_a_streamed_text_completion(cluster: Cluster) -> None:
    asked: dict[str, Any] = {
        "model": ALIAS,
        "prompt": "The contract says",
        "max_tokens": 5,
        "temperature": 0,
    }
    whole = cluster.tenant().completions.create(**asked)
    chunks = list(
        cluster.tenant().completions.create(
            stream=True, stream_options={"include_usage": True}, **asked
        )
    )
    assert {chunk.model for chunk in chunks} == {ALIAS}
    *pieces, last = chunks
    assert "".join(c.choices[0].text for c in pieces) == whole.choices[0].text
    assert last.choices == [] and last.usage == whole.usage


def test_a_client_that_leaves_stops_the_engine_and_is_charged_what_it_produced(
    cluster: Cluster,
) -> None:
    # The front closes its upstream connection as its client leaves (against a fake
    # upstream: tests/serving/front/test_serving_front.py); vLLM's server then aborts the
    # request: it stops running, and its generated-token counter stops, long before the 900
    # tokens it was asked for.
    body = {
        "model": ALIAS,
        "messages": MESSAGES,
        "max_tokens": 900,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {cluster.keys['acme']}"}
    received = 0
    engine = cluster.engines[0]
    generated_before = engine.metric("vllm:generation_tokens_total")
    with httpx.stream(
        "POST", f"{cluster.front_url}/v1/chat/completions", json=body, headers=headers
    ) as response:
        request_id = response.headers["x-request-id"]
        for line in response.iter_lines():
            chunk = json.loads(line.removeprefix("data: ")) if line.startswith("data: ") else {}
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                received += 1
                if received == 5:
                    break
    deadline = time.monotonic() + 10
    while engine.metric("vllm:num_requests_running") > 0:
        assert time.monotonic() < deadline, "the engine still runs the request its client left"
        time.sleep(0.1)
    generated = engine.metric("vllm:generation_tokens_total") - generated_before
    time.sleep(2)
    assert engine.metric("vllm:generation_tokens_total") - generated_before == generated
    assert generated < 900
    status, _, completion_tokens = cluster.usage_row(request_id)
    assert status == "cancelled"
    # Charged what the front was sent: what the engine produced, but for the tokens on their
    # way to the front as it closed.
    assert received <= completion_tokens <= generated < 900
