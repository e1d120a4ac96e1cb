"""A tenant reads its own usage (OpenAI's Usage API shape) and limits with its own key: every
key of its tenant, nothing of another tenant's, no tokens used, a small rate limit of its own."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai

from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, Served, ServeFactory, chat

USAGE = "/v1/organization/usage/completions"


async def second_key(served: Served, tenant: str = TENANT, name: str = "ci") -> dict[str, Any]:
    key: dict[str, Any] = await served.admin("POST", f"/tenants/{tenant}/keys", {"name": name})
    return key


async def other_tenant(served: Served) -> str:
    await served.admin("POST", "/tenants", {"id": "globex", "name": "G", "allow_base_model": True})
    return str((await second_key(served, "globex", "globex-key"))["key"])


async def complete(served: Served, key: str, max_tokens: int) -> None:
    async with httpx.AsyncClient(
        base_url=served.base_url, headers={"Authorization": f"Bearer {key}"}
    ) as client:
        answer = await client.post("/v1/chat/completions", json=chat(served, max_tokens=max_tokens))
    assert answer.status_code == 200, answer.text


async def test_usage_covers_every_key_of_the_tenant_and_no_other_tenant(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served:
        ci = await second_key(served)
        globex = await other_tenant(served)
        await complete(served, served.key, 3)
        await complete(served, ci["key"], 5)
        await complete(served, ci["key"], 2)
        await complete(served, globex, 7)
        records = [r for r in await served.usage_records() if r.tenant_id == TENANT]
        start = int(time.time()) - 600

        # The official client, as a tenant would call it.
        client = openai.AsyncOpenAI(api_key=served.key, base_url=f"{served.base_url}/v1")
        page = await client.get(
            "/organization/usage/completions",
            cast_to=object,
            options={"params": {"start_time": start, "bucket_width": "1h"}},
        )
        assert isinstance(page, dict) and page["object"] == "page"
        (bucket,) = page["data"]
        # From start_time to now (the default end_time): shorter than an hour.
        assert bucket["start_time"] == start and 600 <= bucket["end_time"] - start < 660
        (total,) = bucket["results"]
        assert total["num_model_requests"] == 3
        assert total["input_tokens"] == sum(r.prompt_tokens for r in records)
        assert total["output_tokens"] == sum(r.completion_tokens for r in records) == 10

        async with served.client() as tenant:
            by_key = (
                await tenant.get(
                    USAGE,
                    params={"start_time": start, "bucket_width": "1h", "group_by": "api_key_id"},
                )
            ).json()
            (bucket,) = by_key["data"]
            keys = {
                r["api_key_id"]: (r["api_key_name"], r["output_tokens"]) for r in bucket["results"]
            }
            own = {
                row["id"]: row["name"]
                for row in await served.admin("GET", f"/tenants/{TENANT}/keys")
            }
            assert keys == {ci["id"]: ("ci", 7), **{k: (n, 3) for k, n in own.items() if n == "k"}}
            assert "globex" not in str(by_key) and globex[:12] not in str(by_key)
            assert served.key not in str(by_key) and ci["key"] not in str(by_key)

            by_model = await tenant.get(
                USAGE,
                params={"start_time": start, "group_by": "model", "api_key_ids": ci["id"]},
            )
            (day,) = by_model.json()["data"]
            assert [(r["model"], r["num_model_requests"]) for r in day["results"]] == [
                (served.model, 2)
            ]


async def test_minute_buckets_page_through_the_report(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served, served.client() as tenant:
        # Taken before the request: its record is then in the last bucket, however close to
        # a second's end it was written.
        start = int(time.time()) - 240
        await complete(served, served.key, 1)
        params: dict[str, Any] = {
            "start_time": start,
            "end_time": start + 300,
            "bucket_width": "1m",
        }
        pages, buckets = 0, []
        while True:
            page = (await tenant.get(USAGE, params={**params, "limit": 2})).json()
            pages += 1
            buckets += page["data"]
            if not page["has_more"]:
                assert page["next_page"] is None
                break
            params["page"] = page["next_page"]
        assert pages == 3
        assert [b["start_time"] - start for b in buckets] == [0, 60, 120, 180, 240]
        assert [len(b["results"]) for b in buckets] == [0, 0, 0, 0, 1]


BAD_PARAMETERS: list[tuple[dict[str, Any], str]] = [
    ({}, "start_time"),
    ({"start_time": "yesterday"}, "start_time"),
    ({"start_time": 100, "end_time": 100}, "end_time"),
    ({"start_time": 100, "bucket_width": "2h"}, "bucket_width"),
    ({"start_time": 100, "bucket_width": "1d", "limit": 32}, "limit"),
    ({"start_time": 100, "bucket_width": "1m", "limit": 1441}, "limit"),
    ({"start_time": 100, "limit": 0}, "limit"),
    ({"start_time": 100, "group_by": "project_id"}, "group_by.0"),
    ({"start_time": 100, "project_ids": "p"}, "project_ids"),
    ({"start_time": 100, "page": "page_bm90LWEtcGFnZQ=="}, "page"),
    ({"start_time": 100, "end_time": 200, "page": "page_MTUw"}, "page"),  # not a bucket's start
]


async def test_bad_usage_parameters_are_400s_naming_the_field(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served, served.client() as tenant:
        for params, field in BAD_PARAMETERS:
            answer = await tenant.get(USAGE, params=params)
            assert answer.status_code == 400, (params, answer.text)
            assert answer.json()["error"]["param"] == field, params


def utc_day() -> str:
    """Today in UTC, as a daily budget's period is named."""
    return time.strftime("%Y-%m-%d", time.gmtime())


async def test_limits_show_what_is_left_of_the_tenant_and_the_key(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served:
        await served.set_quota(
            requests_per_minute=10,
            tokens_per_minute=600,
            max_concurrent_requests=2,
            token_budget=50_000,
            budget_period="day",
        )
        own = await served.admin("GET", f"/tenants/{TENANT}/keys")
        await served.admin(
            "PUT", f"/tenants/{TENANT}/keys/{own[0]['id']}/quota", {"requests_per_minute": 5}
        )
        began = time.monotonic()
        charged_on = utc_day()
        await complete(served, served.key, 4)
        await served.settled()
        (record,) = await served.usage_records()
        used = record.prompt_tokens + record.completion_tokens
        async with served.client() as tenant:
            limits = (await tenant.get("/v1/organization/limits")).json()
        elapsed = time.monotonic() - began  # what the levels drained for, at most
        read_on = utc_day()
        mine = limits["tenant"]
        assert mine["requests_per_minute"]["limit"] == 10
        requests = mine["requests_per_minute"]
        # One request, drained at one every 6 s: gone only if a busy machine took that long.
        if elapsed < 6:
            assert requests["remaining"] == 9 and 0 < requests["reset_seconds"] <= 6
        else:
            assert requests["remaining"] in (9, 10) and 0 <= requests["reset_seconds"] <= 6
        # The level drains at 10 tokens a second: by no more than that since the request.
        tokens_left = mine["tokens_per_minute"]["remaining"]
        assert 600 - used <= tokens_left <= min(600, 600 - used + 10 * elapsed + 1)
        assert mine["concurrent_requests"] == {"limit": 2, "in_use": 0, "remaining": 2}
        budget = mine["token_budget"]
        if charged_on == read_on:
            assert (budget["current_period"], budget["used"]) == (read_on, used)
        else:  # midnight (UTC) came between: the new day's budget may hold the charge or not
            assert budget["current_period"] in (charged_on, read_on)
            assert budget["used"] in (0, used)
        assert budget["remaining"] == 50_000 - budget["used"]
        assert limits["api_key_id"] == own[0]["id"]
        assert limits["api_key"]["requests_per_minute"]["remaining"] == 4
        assert limits["api_key"]["token_budget"] is None


async def test_self_service_calls_have_their_own_rate_limit_and_use_no_quota(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine(), self_service_requests_per_minute=3) as served:
        await served.set_quota(requests_per_minute=2)
        async with served.client() as tenant:
            statuses = [(await tenant.get("/v1/organization/limits")).status_code for _ in range(3)]
            refused = await tenant.get(USAGE, params={"start_time": 0})
            other_key = (await second_key(served))["key"]
            other = await tenant.get(
                "/v1/organization/limits", headers={"Authorization": f"Bearer {other_key}"}
            )
            # The tenant's own two requests a minute are untouched by the five calls above.
            limits = other.json()["tenant"]["requests_per_minute"]
        assert statuses == [200, 200, 200]
        assert (
            refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
        )
        assert 0 < int(refused.headers["retry-after-ms"]) <= 20_000
        assert other.status_code == 200 and limits["remaining"] == 2
        assert await served.usage_records() == []


async def test_without_a_valid_key_nothing_is_shown(serve: ServeFactory) -> None:
    async with (
        serve(ScriptedEngine()) as served,
        httpx.AsyncClient(base_url=served.base_url) as anyone,
    ):
        for path in (USAGE + "?start_time=0", "/v1/organization/limits"):
            answer = await anyone.get(path, headers={"Authorization": "Bearer sk-not-a-key"})
            assert answer.status_code == 401
            assert answer.json()["error"]["code"] == "invalid_api_key"
