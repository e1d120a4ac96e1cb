"""Nothing a tenant makes the gateway do is free: a request refused once its body was parsed
or its prompt tokenised (a 400) counts against its requests per minute, a request its rate
limits refuse anyway is refused before its body is read, and a prompt that cannot fit the
context is refused before it is tokenised."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import ServeFactory
from tools.gateway_cost.engine import CharTokenizer

CONTEXT = 1000


class CountingTokenizer(CharTokenizer):
    """The scripted engine's tokenizer, counting the characters it tokenises."""

    def __init__(self) -> None:
        self.encoded = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encoded += len(text)
        return super().encode(text, add_special_tokens)


def chat(content: str = "hi", **fields: Any) -> dict[str, Any]:
    message = {"role": "user", "content": content}
    return {"model": "base", "messages": [message], "max_tokens": 4, **fields}


async def test_400s_and_404s_count_as_requests_and_429s_do_not(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(max_model_len=CONTEXT)) as served, served.client() as client:
        await served.set_quota(requests_per_minute=4, token_budget=10**6, budget_period="day")
        chat_url = "/v1/chat/completions"
        model = served.model
        # A body that does not parse, a prompt too long for the context, a model not granted.
        bad_json = await client.post(
            chat_url, content=b"{not json", headers={"content-type": "application/json"}
        )
        assert bad_json.status_code == 400
        too_long = await client.post(chat_url, json={**chat("x " * CONTEXT), "model": model})
        assert too_long.status_code == 400
        assert too_long.json()["error"]["code"] == "context_length_exceeded"
        not_granted = await client.post(chat_url, json={**chat(), "model": "someone-elses"})
        assert not_granted.status_code == 404
        answered = await client.post(chat_url, json={**chat(), "model": model})
        assert answered.status_code == 200
        for _ in range(3):
            refused = await client.post(chat_url, json={**chat(), "model": model})
            assert refused.status_code == 429
        # The refusals were charged no tokens.
        await served.settled()
        usage = await served.admin("GET", "/tenants/tenant-a/quota/usage")
        assert usage["budget_used"] == answered.json()["usage"]["total_tokens"]


async def test_a_tenant_at_its_rate_limit_is_refused_before_its_body_is_read(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served, served.client() as client:
        await served.set_quota(requests_per_minute=1)
        first = await client.post("/v1/chat/completions", json={**chat(), "model": served.model})
        assert first.status_code == 200
        host, port = served.base_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            # A 1 MB body announced, none of it sent: the answer cannot wait for it.
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
                b"content-type: application/json\r\ncontent-length: 1000000\r\n"
                + f"authorization: Bearer {served.key}\r\n\r\n".encode()
            )
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), timeout=60)
        finally:
            writer.close()
        assert status_line.split()[1] == b"429"
        refused = served.samples(
            "lora_gateway_requests_total", tenant="tenant-a", status="rate_limit_exceeded"
        )
        assert refused == 1


async def test_a_prompt_that_cannot_fit_is_refused_without_being_tokenised(
    serve: ServeFactory,
) -> None:
    engine = ScriptedEngine(max_model_len=CONTEXT)
    tokenizer = CountingTokenizer()
    engine._tokenizer = tokenizer
    async with serve(engine) as served, served.client() as client:
        model = served.model
        # The scripted tokenizer's longest token is 2 bytes: 2,000 characters cannot fit.
        for body in (
            {**chat("y" * 2 * CONTEXT), "model": model},
            {"model": model, "prompt": "y" * 2 * CONTEXT, "max_tokens": 4},
        ):
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            answer = await client.post(path, json=body)
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "context_length_exceeded"
            assert answer.json()["error"]["param"] in {"messages", "prompt"}
        assert tokenizer.encoded == 0
        # One that may fit is tokenised, and refused for what it really is.
        fits_not = await client.post(
            "/v1/completions", json={"model": model, "prompt": "y" * CONTEXT, "max_tokens": 4}
        )
        assert fits_not.status_code == 400
        assert tokenizer.encoded == CONTEXT
