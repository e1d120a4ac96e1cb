"""The front role in front of a real upstream: one engine-role process (vLLM's OpenAI server
with our plugins and LoRA resolver, on the embedded model) and a front on one store, through
the official ``openai`` client. An adapter registered through the front is served by its
tenant's alias; the OpenAI features that work in-process work through the front too."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from app.settings import EMBEDDED_MODEL_DIR
from tests.support.engine_role import (
    BASE_MODEL_ID,
    EngineProcess,
    engine_process,
    front_process,
)
from tests.support.front_app import ADMIN_TOKEN, admin_call

pytestmark = pytest.mark.slow

ALIAS = "contracts"
GLOBAL_NAME = "legal@v1"
MESSAGES = [{"role": "user", "content": "What should a contract say about payment?"}]


@dataclass
class Deployment:
    front_url: str
    engine: EngineProcess
    database: Path
    keys: dict[str, str]
    base_model: str

    def client(self, tenant: str = "tenant-a") -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.front_url}/v1", api_key=self.keys[tenant], timeout=300, max_retries=0
        )

    def usage_row(self, request_id: str) -> tuple[str, int, int]:
        """``(status, prompt_tokens, completion_tokens)`` of a request, once recorded."""
        deadline = time.monotonic() + 10
        while True:
            with sqlite3.connect(self.database) as db:
                row = db.execute(
                    "SELECT status, prompt_tokens, completion_tokens FROM usage "
                    "WHERE request_id = ?",
                    (request_id,),
                ).fetchone()
            if row is not None:
                return (str(row[0]), int(row[1]), int(row[2]))
            assert time.monotonic() < deadline, f"no usage record for {request_id}"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    state = tmp_path_factory.mktemp("front-e2e")
    shutil.copytree(Path("var/adapters/legal_advisor"), state / "adapters" / "legal_advisor")
    database = state / "gateway.db"
    store = {
        "LORA_GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{database}",
        "LORA_GATEWAY_ADAPTER_ROOT": str(state / "adapters"),
    }
    # The engine reads the store only when a request names an adapter it has not loaded.
    with engine_process(
        {**store, "LORA_GATEWAY_ADAPTER_CACHE_DIR": str(state / "engine-cache")}, state / "logs"
    ) as engine:
        front_env = {**store, "LORA_GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN}
        with front_process(engine.base_url, front_env, state / "logs") as front:
            front_url = front.base_url
            admin_call(front_url, "POST", "/adapters", {"name": "legal", "path": "legal_advisor"})
            keys = {}
            for tenant in ("tenant-a", "tenant-b"):
                body = {"id": tenant, "name": tenant, "allow_base_model": True}
                admin_call(front_url, "POST", "/tenants", body)
                key = admin_call(front_url, "POST", f"/tenants/{tenant}/keys", {"name": "k"})
                keys[tenant] = key["key"]
            grant = {"adapter": "legal"}
            admin_call(front_url, "PUT", f"/tenants/tenant-a/adapters/{ALIAS}", grant)
            yield Deployment(front_url, engine, database, keys, BASE_MODEL_ID)


def greedy(deployment: Deployment, model: str = ALIAS, **extra: Any) -> Any:
    return deployment.client().chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=12, temperature=0, **extra
    )


def test_an_alias_is_served_by_its_adapter_under_the_alias(deployment: Deployment) -> None:
    raw = greedy(deployment)
    answer = raw.parse()
    assert answer.model == ALIAS
    text = answer.choices[0].message.content
    assert text
    # The same as the engine gives for the global name: the adapter served it.
    direct = httpx.post(
        f"{deployment.engine.base_url}/v1/chat/completions",
        json={"model": GLOBAL_NAME, "messages": MESSAGES, "max_tokens": 12, "temperature": 0},
        timeout=300,
    ).json()
    assert direct["choices"][0]["message"]["content"] == text
    base = greedy(deployment, deployment.base_model).parse()
    assert base.choices[0].message.content != text, "the adapter changed nothing"
    # Charged what the engine counted.
    assert answer.usage is not None
    usage_row = deployment.usage_row(raw.headers["x-request-id"])
    assert usage_row == ("ok", answer.usage.prompt_tokens, answer.usage.completion_tokens)


def test_a_stream_with_usage(deployment: Deployment) -> None:
    answer = greedy(deployment).parse()
    whole, usage = answer.choices[0].message.content, answer.usage
    chunks = list(
        deployment.client().chat.completions.create(
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
    unasked = list(
        deployment.client().chat.completions.create(
            model=ALIAS, messages=MESSAGES, max_tokens=4, stream=True
        )
    )
    assert all(c.choices and c.usage is None for c in unasked)


def test_json_mode_and_schema(deployment: Deployment) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 20}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    answer = deployment.client().chat.completions.create(
        model=ALIAS,
        messages=MESSAGES,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), schema)
    mode = deployment.client().chat.completions.create(
        model=ALIAS,
        messages=MESSAGES,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert mode.choices[0].finish_reason in ("stop", "length")
    assert (mode.choices[0].message.content or "").lstrip().startswith("{")


def test_logit_bias_n_stop_and_seed(deployment: Deployment) -> None:
    client = deployment.client()
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

    several = client.chat.completions.create(
        model=ALIAS,
        messages=MESSAGES,
        max_tokens=6,
        temperature=1.0,
        n=3,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert several.usage is not None and several.usage.completion_tokens == 18
    again = client.chat.completions.create(
        model=ALIAS,
        messages=MESSAGES,
        max_tokens=6,
        temperature=1.0,
        n=3,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    assert [c.message.content for c in again.choices] == [
        c.message.content for c in several.choices
    ]

    whole = greedy(deployment).parse().choices[0].message.content or ""
    stop = whole.split()[1]
    stopped = greedy(deployment, stop=[stop]).parse().choices[0]
    assert stopped.finish_reason == "stop" and stop not in (stopped.message.content or "")


def test_another_tenant_cannot_reach_the_adapter(deployment: Deployment) -> None:
    for model in (ALIAS, GLOBAL_NAME):
        with pytest.raises(openai.NotFoundError) as refused:
            deployment.client("tenant-b").chat.completions.create(
                model=model, messages=MESSAGES, max_tokens=2
            )
        assert "tenant-a" not in str(refused.value)


def test_text_completions_through_the_front(deployment: Deployment) -> None:
    answer = deployment.client().completions.create(
        model=ALIAS, prompt="The contract says", max_tokens=5, temperature=0, echo=True
    )
    assert answer.model == ALIAS
    assert answer.choices[0].text.startswith("The contract says")
    assert answer.usage is not None and answer.usage.completion_tokens == 5


def test_logprobs_json_and_streamed(deployment: Deployment) -> None:
    client = deployment.client()
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


def test_a_streamed_text_completion(deployment: Deployment) -> None:
    asked: dict[str, Any] = {
        "model": ALIAS,
        "prompt": "The contract says",
        "max_tokens": 5,
        "temperature": 0,
    }
    whole = deployment.client().completions.create(**asked)
    chunks = list(
        deployment.client().completions.create(
            stream=True, stream_options={"include_usage": True}, **asked
        )
    )
    assert {chunk.model for chunk in chunks} == {ALIAS}
    *pieces, last = chunks
    assert "".join(c.choices[0].text for c in pieces) == whole.choices[0].text
    assert last.choices == [] and last.usage == whole.usage


def test_a_client_that_leaves_stops_the_engine_and_is_charged_what_it_produced(
    deployment: Deployment,
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
    headers = {"Authorization": f"Bearer {deployment.keys['tenant-a']}"}
    received = 0
    engine = deployment.engine
    generated_before = engine.metric("vllm:generation_tokens_total")
    with httpx.stream(
        "POST", f"{deployment.front_url}/v1/chat/completions", json=body, headers=headers
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
    status, _, completion_tokens = deployment.usage_row(request_id)
    assert status == "cancelled"
    # Charged what the front was sent: what the engine produced, but for the tokens on their
    # way to the front as it closed.
    assert received <= completion_tokens <= generated < 900
