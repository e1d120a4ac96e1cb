"""Rollouts in the front role: two front replicas on one store pick a split's version, send
that version's global name upstream, say it in the response header and the ledger, and both
follow a rollback made through one of them within the registry's poll interval."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.serving.front.upstream import OBJECTIVE_HEADER, SHADOW_OBJECTIVE
from app.tenancy.grants import Grant
from tests.support.fake_upstream import FakeUpstream, Script
from tests.support.front_app import Front, front_settings, running_front
from tests.support.harness import ADMIN_TOKEN
from tests.support.store_polls import store_polls

DEMO_ADAPTERS = Path(__file__).resolve().parents[3] / "var/adapters"
ALIAS = "support"
CANARY = "canary"
SHADOWED = "shadowed"
POLL_SECONDS = 0.2
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclass
class Replicas:
    fronts: list[Front]
    upstream: FakeUpstream
    key: str

    async def post(self, front: Front, **fields: object) -> httpx.Response:
        body = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], **fields}
        async with front.client(self.key) as client:
            response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return response


@pytest.fixture(scope="module")
async def replicas(
    upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Replicas]:
    """Two fronts on one store; the adapter ``helper`` in two versions (two demo adapters),
    granted to tenant ``acme`` as ``support``."""
    state = tmp_path_factory.mktemp("front-rollouts")
    for demo in ("medical_scribe", "legal_advisor"):
        shutil.copytree(DEMO_ADAPTERS / demo, state / "adapters" / demo)
    async with AsyncExitStack() as stack:
        fronts = [
            await stack.enter_async_context(
                running_front(
                    front_settings(
                        upstream.url,
                        state,
                        registry_poll_seconds=POLL_SECONDS,
                        rollback_check_seconds=POLL_SECONDS,
                    )
                )
            )
            for _ in range(2)
        ]
        first = fronts[0]
        for demo in ("medical_scribe", "legal_advisor"):
            await first.admin("POST", "/adapters", {"name": "helper", "path": demo})
        await first.admin("POST", "/tenants", {"id": "acme", "name": "ACME"})
        key = (await first.admin("POST", "/tenants/acme/keys", {"name": "k"}))["key"]
        yield Replicas(fronts, upstream, key)


async def put_grant(replicas: Replicas, grant: dict[str, object], alias: str = ALIAS) -> None:
    """Put the grant through the first replica; return once the second serves it too."""
    first, second = replicas.fronts
    await first.admin("PUT", f"/tenants/acme/adapters/{alias}", grant)
    deadline = time.monotonic() + 60  # bounds a hang only
    while grant_of(second, alias) != grant_of(first, alias):
        assert time.monotonic() < deadline, "the second replica never saw the grant"
        await asyncio.sleep(0.02)


def grant_of(front: Front, alias: str = ALIAS) -> Grant | None:
    """The replica's view of the alias."""
    tenant = front.gateway.registry.tenant("acme")
    return tenant.grants.get(alias) if tenant else None


async def test_each_request_goes_upstream_as_the_picked_version_and_says_which(
    replicas: Replicas,
) -> None:
    await put_grant(replicas, {"adapter": "helper", "versions": {"1": 50, "2": 50}})
    replicas.upstream.requests.clear()
    responses = [await replicas.post(replicas.fronts[n % 2]) for n in range(24)]
    versions = [response.headers["x-adapter-version"] for response in responses]
    assert Counter(versions).keys() == {"1", "2"}
    assert [r.body["model"] for r in replicas.upstream.requests] == [
        f"helper@v{v}" for v in versions
    ]
    assert all(response.json()["model"] == ALIAS for response in responses)
    for front in replicas.fronts:  # each writes its own records to the one store
        await front.settled()
        records = await front.usage_records()
    by_request = {r.request_id: r.adapter_version for r in records}
    assert [by_request[r.headers["x-request-id"]] for r in responses] == [int(v) for v in versions]


async def test_a_sticky_split_keeps_each_user_on_one_version_on_every_replica(
    replicas: Replicas,
) -> None:
    await put_grant(
        replicas, {"adapter": "helper", "versions": {"1": 50, "2": 50}, "sticky": "user"}
    )
    seen: dict[str, set[str]] = {}
    for n in range(32):
        user = f"user-{n % 8}"
        response = await replicas.post(replicas.fronts[n % 2], user=user)
        seen.setdefault(user, set()).add(response.headers["x-adapter-version"])
    assert all(len(versions) == 1 for versions in seen.values())
    assert set().union(*seen.values()) == {"1", "2"}


async def test_a_rollback_through_one_replica_reaches_the_other_by_its_next_poll(
    replicas: Replicas,
) -> None:
    await put_grant(replicas, {"adapter": "helper", "versions": {"1": 10, "2": 90}})
    first, second = replicas.fronts
    with store_polls(second.gateway) as polls:
        path = f"/tenants/acme/adapters/{ALIAS}/rollback"
        rolled = await first.admin("POST", path, {"version": 1})
        assert rolled["version"] == 1 and rolled["versions"] is None
        assert rolled["rolled_back"]["replaced"] == "helper {v1: 10, v2: 90}"
        pinned = grant_of(first)
        assert pinned is not None and [w.adapter.version for w in pinned.versions] == [1]
        polls.expect(lambda: grant_of(second) == pinned)
        # By its next poll (the one under way may have read the store before the change).
        assert await polls.seen_async() <= 2
    answers = [await replicas.post(front) for front in replicas.fronts * 8]
    assert {answer.headers["x-adapter-version"] for answer in answers} == {"1"}


@pytest.mark.parametrize(
    ("grant", "param", "message"),
    [
        ({"versions": {"1": 0, "2": 0}}, "versions", "weight above 0"),
        ({"versions": {str(v): 1 for v in range(1, 10)}}, "versions", "2 to 8 versions"),
        ({"versions": {"1": 1}}, "versions", "2 to 8 versions"),
        ({"version": 1, "versions": {"1": 1, "2": 1}}, "versions", "not both"),
        ({"versions": {"1": 1, "7": 1}}, "versions", "no version 7"),
        ({"versions": {"1": 1001, "2": 1}}, "versions.1", "less than or equal to 1000"),
        ({"versions": {"1": 1.5, "2": 1}}, "versions.1", "integer"),
        ({"versions": {"one": 1, "2": 1}}, "versions.one.[key]", "integer"),
        ({"versions": {"1": 1, "2": 1}, "sticky": "session"}, "sticky", "'request' or 'user'"),
        ({"version": 3}, "version", "no version 3"),
    ],
)
async def test_a_bad_split_is_a_400_naming_the_field_and_changes_nothing(
    replicas: Replicas, grant: dict[str, object], param: str, message: str
) -> None:
    first = replicas.fronts[0]
    before = await first.admin("GET", "/tenants/acme/adapters")
    async with httpx.AsyncClient(base_url=first.base_url, headers=ADMIN) as admin:
        response = await admin.put(
            "/admin/v1/tenants/acme/adapters/support", json={"adapter": "helper", **grant}
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"], error
    assert await first.admin("GET", "/tenants/acme/adapters") == before


async def test_a_version_in_a_split_cannot_be_deleted_and_the_409_names_the_alias(
    replicas: Replicas,
) -> None:
    await put_grant(replicas, {"adapter": "helper", "versions": {"1": 90, "2": 10}})
    async with httpx.AsyncClient(base_url=replicas.fronts[0].base_url, headers=ADMIN) as admin:
        response = await admin.delete("/admin/v1/adapters/helper/versions/2")
    assert response.status_code == 409
    assert "acme:support" in response.json()["error"]["message"]


async def test_the_versions_side_by_side_count_every_replicas_requests(replicas: Replicas) -> None:
    await put_grant(replicas, {"adapter": "helper", "versions": {"1": 50, "2": 50}})
    before = await replicas.fronts[0].admin("GET", f"/tenants/acme/adapters/{ALIAS}/versions")
    sent: Counter[str] = Counter()
    for n in range(12):
        response = await replicas.post(replicas.fronts[n % 2], stream=True, max_tokens=3)
        sent[response.headers["x-adapter-version"]] += 1
    for front in replicas.fronts:
        await front.settled()
        await front.gateway.ledger.flush()
    after = await replicas.fronts[1].admin("GET", f"/tenants/acme/adapters/{ALIAS}/versions")
    counted = {
        v["version"]: v["requests"] - requests_of(before, v["version"]) for v in after["versions"]
    }
    assert counted == {int(v): n for v, n in sent.items()}
    for version in after["versions"]:
        assert version["finish_reasons"]["length"] >= 1
        assert version["ttft_ms"]["p50"] >= 0 and version["itl_ms"]["mean"] >= 0
        assert version["completion_tokens"]["p50"] >= 1


def requests_of(comparison: dict[str, Any], version: int) -> int:
    return sum(v["requests"] for v in comparison["versions"] if v["version"] == version)


async def test_a_failing_version_is_rolled_back_once_by_its_rule_on_every_replica(
    replicas: Replicas,
) -> None:
    # An alias of its own: the rule's window holds only this test's requests.
    rule = {"to": 1, "error_rate": 0.2, "window_seconds": 60, "min_requests": 4}
    split = {"adapter": "helper", "versions": {"1": 0, "2": 100}, "rollback": rule}
    await put_grant(replicas, split, alias=CANARY)
    replicas.upstream.script = Script(status=500)
    try:
        for n in range(4):
            async with replicas.fronts[n % 2].client(replicas.key) as client:
                body = {"model": CANARY, "messages": [{"role": "user", "content": "hi"}]}
                assert (await client.post("/v1/chat/completions", json=body)).status_code >= 500
    finally:
        replicas.upstream.script = Script()
    deadline = time.monotonic() + 60  # bounds a hang only
    while any(versions_of(front) != [1] for front in replicas.fronts):
        assert time.monotonic() < deadline, "no replica rolled the split back"
        await asyncio.sleep(0.05)
    first, second = replicas.fronts
    with store_polls(first.gateway) as on_first, store_polls(second.gateway) as on_second:
        # Time for a second, wrong, rollback: each replica checks the rules at every poll.
        await asyncio.gather(on_first.run_async(4), on_second.run_async(4))
    audit = (await replicas.fronts[0].admin("GET", "/audit?limit=20"))["data"]
    rollbacks = [
        e for e in audit if e["action"] == "grant.rollback" and e["target"] == f"acme/{CANARY}"
    ]
    latest_put = next(i for i, e in enumerate(audit) if e["action"] == "grant.put")
    automatic = [e for e in audit[:latest_put] if e in rollbacks]
    assert [(e["actor"], e["outcome"]) for e in automatic] == [("rollback-rule", "ok")]
    assert "v2 failed 4 of 4 requests" in automatic[0]["detail"]
    (grant,) = [
        g
        for g in await replicas.fronts[1].admin("GET", "/tenants/acme/adapters")
        if g["alias"] == CANARY
    ]
    assert grant["version"] == 1 and grant["rollback"] is None
    assert grant["rolled_back"]["actor"] == "rollback-rule"
    answer = await replicas.post(replicas.fronts[1], model=CANARY)
    assert answer.headers["x-adapter-version"] == "1"


def versions_of(front: Front) -> list[int]:
    grant = grant_of(front, CANARY)
    return [w.adapter.version for w in grant.versions] if grant else []


async def test_a_shadow_goes_upstream_sheddable_and_is_never_the_tenants(
    replicas: Replicas,
) -> None:
    first = replicas.fronts[0]
    grant = {"adapter": "helper", "version": 1, "shadow": {"version": 2, "percent": 100}}
    await put_grant(replicas, grant, alias=SHADOWED)
    await first.admin("PUT", "/tenants/acme/quota", {"token_budget": 10**6, "budget_period": "day"})
    try:
        used_before = (await first.admin("GET", "/tenants/acme/quota/usage"))["budget_used"]
        replicas.upstream.requests.clear()
        answer = await replicas.post(first, model=SHADOWED, max_tokens=3)
        assert answer.headers["x-adapter-version"] == "1" and answer.json()["model"] == SHADOWED
        await asyncio.to_thread(replicas.upstream.wait_for_requests, 2)
        tenant_call, shadow_call = replicas.upstream.requests
        assert tenant_call.body["model"] == "helper@v1"
        assert shadow_call.body["model"] == "helper@v2" and "stream" not in shadow_call.body
        assert shadow_call.headers[OBJECTIVE_HEADER] == SHADOW_OBJECTIVE
        assert tenant_call.headers[OBJECTIVE_HEADER] == "interactive"
        await first.settled()
        records = [r for r in await first.usage_records() if r.model == SHADOWED]
        assert [(r.adapter_version, r.shadow, r.status) for r in records] == [
            (1, False, "ok"),
            (2, True, "ok"),
        ]
        assert records[1].request_id == f"{records[0].request_id}-shadow"
        # Charged the tenant's own request only, in its budget and its usage report.
        used = (await first.admin("GET", "/tenants/acme/quota/usage"))["budget_used"]
        own = records[0].prompt_tokens + records[0].completion_tokens
        assert used - used_before == own
        report = await first.admin("GET", "/tenants/acme/usage?group_by=adapter")
        assert [g["requests"] for g in report["data"] if g["group"] == SHADOWED] == [1]
        compared = await first.admin("GET", f"/tenants/acme/adapters/{SHADOWED}/versions")
        assert [v["version"] for v in compared["versions"]] == [1, 2]
    finally:
        await first.admin("PUT", "/tenants/acme/quota", {})
