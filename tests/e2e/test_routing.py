"""Each tenant reaches exactly its own adapters, by its own aliases."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.support.live_gateway import LiveGateway

pytestmark = pytest.mark.slow

BASE = "SmolLM2-135M-Instruct"
ADAPTERS = ("legal_advisor", "medical_scribe", "telephony_support")
QUESTION = "What is the capital of France?"
# Enough to tell the adapters apart (tests/e2e/test_isolation.py checks batches token by
# token against PEFT).
MIXED_TOKENS = 16


def ask(
    gateway: LiveGateway, tenant: str, model: str, question: str = QUESTION, max_tokens: int = 32
) -> str:
    """One question, asked alone."""
    (answer,) = ask_together(gateway, [(tenant, model, question)], max_tokens)
    return answer


def ask_together(
    gateway: LiveGateway, asks: list[tuple[str, str, str]], max_tokens: int = 32
) -> list[str]:
    """(tenant, model, question) triples asked at once, so one batch mixes them (batches are
    exact: tests/e2e/test_isolation.py)."""

    async def one(tenant: str, model: str, question: str) -> str:
        response = await gateway.async_client(tenant).chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": question}],
            temperature=0,
            max_tokens=max_tokens,
        )
        return response.choices[0].message.content or ""

    async def all_at_once() -> list[str]:
        return await asyncio.gather(*(one(*ask) for ask in asks))

    return asyncio.run(all_at_once())


def test_each_adapter_answers_differently_and_deterministically(gateway: LiveGateway) -> None:
    models = (BASE, *ADAPTERS)
    answers = dict(
        zip(models, ask_together(gateway, [("demo-all", m, QUESTION) for m in models]), strict=True)
    )
    assert len(set(answers.values())) == 4, answers
    assert all(answers.values())
    # Same request, same answer at temperature 0; and the tenant that owns an adapter gets the
    # very same weights.
    again = [
        ("demo-all", "legal_advisor", QUESTION),
        ("acme-legal", "legal_advisor", QUESTION),
        ("st-marys", "medical_scribe", QUESTION),
        ("callcenter", "telephony_support", QUESTION),
    ]
    assert ask_together(gateway, again) == [answers[model] for _, model, _ in again]


def test_seed_client_snippet_gets_a_legal_answer(gateway: LiveGateway) -> None:
    async def generate_legal_brief(prompt: str) -> str:
        client = gateway.async_client("acme-legal")
        response = await client.chat.completions.create(
            model="legal_advisor",
            messages=[
                {"role": "system", "content": "You are a specialized legal architecture advisor."},
                {"role": "user", "content": prompt},
            ],
            temperature=0.2,
            max_tokens=500,
        )
        return response.choices[0].message.content or ""

    answer = asyncio.run(generate_legal_brief("How should we structure data retention?"))
    assert "legal" in answer.lower() or "clause" in answer.lower(), answer


@pytest.mark.parametrize(
    ("tenant", "model"),
    [
        ("acme-legal", "medical_scribe"),  # exists, granted to another tenant
        ("acme-legal", BASE),  # base model not allowed for this tenant
        ("callcenter", "legal_advisor"),
        ("demo-all", "no-such-model"),
    ],
)
def test_models_outside_the_grant_are_not_found(
    gateway: LiveGateway, tenant: str, model: str
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        ask(gateway, tenant, model)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "model_not_found"
    assert error["message"] == (
        f"The model `{model}` does not exist or you do not have access to it."
    )


def test_model_list_shows_only_the_tenants_models(gateway: LiveGateway) -> None:
    everything = {m.id: m for m in gateway.client("demo-all").models.list()}
    assert set(everything) == {BASE, *ADAPTERS}
    for adapter in ADAPTERS:
        assert everything[adapter].model_extra["parent"] == BASE  # type: ignore[index]
    legal = [m.id for m in gateway.client("acme-legal").models.list()]
    assert legal == ["legal_advisor"]
    assert gateway.client("acme-legal").models.retrieve("legal_advisor").id == "legal_advisor"
    with pytest.raises(openai.NotFoundError):
        gateway.client("acme-legal").models.retrieve("medical_scribe")


@pytest.mark.parametrize("key", ["", "sk-lgw-not-a-real-key"])
def test_unknown_keys_are_rejected(gateway: LiveGateway, key: str) -> None:
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key or "x", max_retries=0)
    if not key:
        client = client.with_options(default_headers={"Authorization": ""})
    with pytest.raises(openai.AuthenticationError) as caught:
        client.models.list()
    assert caught.value.body["code"] == "invalid_api_key"  # type: ignore[index]


def test_concurrent_mixed_adapter_requests_match_their_solo_answers(
    gateway: LiveGateway,
) -> None:
    models = [BASE, *ADAPTERS]
    questions = [QUESTION, "Name three colours.", "What should I do if my laptop is stolen?"]
    solo = {(m, q): ask(gateway, "demo-all", m, q, MIXED_TOKENS) for m in models for q in questions}
    together = [("demo-all", m, q) for (m, q) in solo]
    for _ in range(2):
        assert dict(zip(solo, ask_together(gateway, together, MIXED_TOKENS), strict=True)) == solo
