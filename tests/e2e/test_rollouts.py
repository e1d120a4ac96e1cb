"""A rollout on the real engine: two versions of one adapter (two demo adapters whose answers
differ) behind one alias, split sticky per user; every answer is its version's own, the
response header and the ledger name that version, and a rollback moves everyone at once."""

from __future__ import annotations

import openai
import pytest

from tests.support.live_gateway import LiveGateway

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Describe your work in one sentence."}]


def ask(client: openai.OpenAI, user: str | None = None) -> tuple[str, str, str]:
    """The answer's text, the version header and the request id."""
    raw = client.chat.completions.with_raw_response.create(
        model="helper",
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        **({"user": user} if user else {}),
    )
    answer = raw.parse()
    assert answer.model == "helper"
    text = answer.choices[0].message.content or ""
    return text, raw.headers["x-adapter-version"], raw.headers["x-request-id"]


def test_a_sticky_split_serves_each_user_its_versions_own_answer(gateway: LiveGateway) -> None:
    with gateway.admin_client() as admin:
        for demo in ("medical_scribe", "legal_advisor"):
            registered = admin.post("/adapters", json={"name": "helper", "path": demo})
            assert registered.status_code == 201, registered.text
        admin.post("/tenants", json={"id": "rollout", "name": "Rollout"})
        key = admin.post("/tenants/rollout/keys", json={}).json()["key"]
        client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0)

        own = {}
        for version in (1, 2):
            pin = {"adapter": "helper", "version": version}
            assert admin.put("/tenants/rollout/adapters/helper", json=pin).status_code == 200
            text, header, _ = ask(client)
            assert header == str(version)
            own[header] = text
        assert own["1"] != own["2"]

        split = {"adapter": "helper", "versions": {"1": 50, "2": 50}, "sticky": "user"}
        assert admin.put("/tenants/rollout/adapters/helper", json=split).status_code == 200
        served, by_user = {}, {}
        for n in range(4):
            text, header, request_id = ask(client, user=f"user-{n}")
            assert text == own[header]
            served[request_id], by_user[f"user-{n}"] = int(header), header
        assert set(served.values()) == {1, 2}
        assert ask(client, user="user-0")[1] == by_user["user-0"]

        records = {r.request_id: r.adapter_version for r in gateway.run(gateway.usage_records())}
        assert {rid: records[rid] for rid in served} == served

        rolled = admin.post("/tenants/rollout/adapters/helper/rollback", json={"version": 1})
        assert rolled.status_code == 200 and rolled.json()["rolled_back"]["to"] == 1
        moved = next(user for user, header in by_user.items() if header == "2")
        assert ask(client, user=moved)[:2] == (own["1"], "1")
