"""The console's pages and forms over a gateway with the scripted engine: every mutation goes
through the admin service (what the REST API then reads, audited alike), refusals are shown
next to their form naming the field, and the charts come from the store."""

from __future__ import annotations

import html
import re
from datetime import datetime, timezone
from pathlib import Path

import httpx
from sqlalchemy import insert, select

from app.api.admin.deps import actor_name
from app.store.tables import AdapterVersionRow, StoredResponseRow, TenantRow
from app.tenancy.manifests import MAX_OBJECTIVE_MS
from tests.support.archives import tiny_adapter_archive
from tests.support.console import Console, console
from tests.support.fake_upstream import fake_upstream
from tests.support.front_app import front_settings, running_front
from tests.support.harness import ADMIN_TOKEN
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, Served, ServeFactory, chat

NEW_KEY = re.compile(r'<code id="new-key">([^<]+)</code>')


async def upload(ui: Console, name: str, archive: bytes, *, script: bool = False) -> httpx.Response:
    headers = {"accept": "application/json", "x-csrf-token": ui.csrf} if script else {}
    return await ui.client.post(
        "/admin/ui/adapters",
        data={"name": name, **({} if script else {"csrf": ui.csrf})},
        files={"file": ("adapter.tar.gz", archive, "application/gzip")},
        headers=headers,
    )


def adapter_row(name: str) -> AdapterVersionRow:
    """A version as the store lists it (its files are not needed to list it)."""
    return AdapterVersionRow(
        name=name,
        version=1,
        sha256="0" * 64,
        path=name,
        rank=8,
        target_modules=["q_proj"],
        size_bytes=1,
        created_at=datetime.now(timezone.utc),
    )


async def models_of(served: Served, key: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=served.base_url) as client:
        return await client.get("/v1/models", headers={"authorization": f"Bearer {key}"})


async def test_forms_change_what_the_api_serves_and_are_audited_as_rest_calls(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served, console(served.base_url) as ui:
        created = await ui.post(
            "/tenants", {"id": "acme", "name": "ACME", "weight": "3", "priority": "batch"}
        )
        assert created.headers["location"] == "/admin/ui/tenants/acme?notice=created"
        key_page = await ui.post("/tenants/acme/keys", {"name": "prod"})
        assert key_page.status_code == 201 and "shown this once" in key_page.text
        key = NEW_KEY.search(key_page.text).group(1)  # type: ignore[union-attr]
        assert key not in (await ui.get("/tenants/acme")).text  # never shown again

        for version in (1, 2):
            assert (await upload(ui, "helper", tiny_adapter_archive(version))).status_code == 303
        split = {"alias": "helper", "adapter": "helper", "versions": "1:50, 2:50", "sticky": "on"}
        assert (await ui.post("/tenants/acme/grants", split)).status_code == 303
        assert (
            await ui.post("/tenants/acme/grants/helper/rollback", {"version": "1"})
        ).status_code == 303
        quota = {"requests_per_minute": "100", "token_budget": "5000", "budget_period": "day"}
        assert (await ui.post("/tenants/acme/quota", quota)).status_code == 303
        key_id = (await served.admin("GET", "/tenants/acme/keys"))[0]["id"]
        assert (
            await ui.post(f"/tenants/acme/keys/{key_id}/quota", {"tokens_per_minute": "900"})
        ).status_code == 303
        settings = {"name": "ACME Corp", "weight": "2", "priority": "interactive", "enabled": "on"}
        assert (await ui.post("/tenants/acme/settings", settings)).status_code == 303

        assert (await models_of(served, key)).json()["data"][0]["id"] == "helper"
        tenant = await served.admin("GET", "/tenants/acme")
        assert (tenant["name"], tenant["weight"], tenant["priority"]) == (
            "ACME Corp",
            2,
            "interactive",
        )
        grant = (await served.admin("GET", "/tenants/acme/adapters"))[0]
        assert (grant["version"], grant["versions"], grant["rolled_back"]["replaced"]) == (
            1,
            None,
            "helper {v1: 50, v2: 50} sticky per user",
        )
        assert (await served.admin("GET", "/tenants/acme/quota"))["token_budget"] == 5000
        assert (await served.admin("GET", f"/tenants/acme/keys/{key_id}/quota"))[
            "tokens_per_minute"
        ] == 900

        assert (await ui.post(f"/tenants/acme/keys/{key_id}/revoke")).status_code == 303
        assert (await models_of(served, key)).status_code == 401
        assert (await ui.post("/tenants/acme/grants/helper/delete")).status_code == 303
        assert await served.admin("GET", "/tenants/acme/adapters") == []

        audit = (await served.admin("GET", "/audit?limit=50"))["data"]
        console_actions = [
            (r["action"], r["outcome"]) for r in audit if r["actor"] == actor_name(ADMIN_TOKEN)
        ]
        for action in (
            "tenant.create",
            "key.create",
            "adapter.register",
            "grant.put",
            "grant.rollback",
            "quota.put",
            "key.quota.put",
            "tenant.update",
            "key.revoke",
            "grant.delete",
        ):
            assert (action, "ok") in console_actions, action


async def test_a_refused_form_names_the_field_next_to_it_and_is_audited(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served, console(served.base_url) as ui:
        bad_id = await ui.post("/tenants", {"id": "Not An Id", "name": "x"})
        assert (
            bad_id.status_code == 400
            and 'id="create-error"' in bad_id.text
            and "`id`" in bad_id.text
        )
        no_period = await ui.post(f"/tenants/{TENANT}/quota", {"token_budget": "10"})
        assert no_period.status_code == 400 and 'id="quota-error"' in no_period.text
        not_a_number = await ui.post(f"/tenants/{TENANT}/quota", {"requests_per_minute": "ten"})
        assert "`requests_per_minute` must be a whole number" in not_a_number.text
        no_adapter = await ui.post(
            f"/tenants/{TENANT}/grants", {"alias": "a", "adapter": "missing"}
        )
        assert no_adapter.status_code == 404 and 'id="grants-error"' in no_adapter.text
        assert [t["id"] for t in await served.admin("GET", "/tenants")] == [TENANT]
        assert await served.admin("GET", f"/tenants/{TENANT}/adapters") == []
        unknown = await ui.get("/tenants/nobody")
        assert unknown.status_code == 404 and "No tenant `nobody`." in unknown.text
        assert unknown.headers["content-type"].startswith("text/html")
        audit = (await served.admin("GET", "/audit?limit=50"))["data"]
        rejected = {r["action"] for r in audit if r["outcome"] == "rejected"}
        assert {"tenant.create", "quota.put", "grant.put"} <= rejected


def input_value(page: str, field: str) -> str:
    found = re.search(rf'<input id="{field}" name="{field}"[^>]* value="([^"]*)"', page)
    assert found is not None, field
    return found.group(1)


async def test_a_tenants_own_objectives_are_set_shown_and_validated_as_over_rest(
    serve: ServeFactory,
) -> None:
    async with (
        serve(ScriptedEngine(), slo_ttft_ms_interactive=700) as served,
        console(served.base_url) as ui,
    ):
        new = {"id": "acme", "name": "ACME", "slo_ttft_ms": "800", "slo_tpot_ms": "0"}
        assert (await ui.post("/tenants", new)).status_code == 303
        tenant = await served.admin("GET", "/tenants/acme")
        assert (tenant["slo_ttft_ms"], tenant["slo_tpot_ms"]) == (800, 0)
        listed = (await ui.get("/tenants")).text
        assert "<td>TTFT 800 ms, TPOT of its class</td>" in listed
        assert "<td>of its class</td>" in listed  # the other tenant's: none of its own
        shown = (await ui.get("/tenants/acme")).text
        assert (input_value(shown, "slo_ttft_ms"), input_value(shown, "slo_tpot_ms")) == (
            "800",
            "0",
        )
        # What 0 means for this tenant: its class's objectives, from the settings.
        assert "its interactive class's (time to first token 700 ms" in shown
        assert "no per output token objective" in shown

        settings = {"name": "ACME", "priority": "interactive", "enabled": "on"}
        changed = {**settings, "slo_ttft_ms": "", "slo_tpot_ms": "40"}
        assert (await ui.post("/tenants/acme/settings", changed)).status_code == 303
        tenant = await served.admin("GET", "/tenants/acme")
        assert (tenant["slo_ttft_ms"], tenant["slo_tpot_ms"]) == (0, 40)  # emptied: the class's

        for field, value, reason in [
            ("slo_ttft_ms", "-5", "greater than or equal to 0"),
            ("slo_tpot_ms", "fast", "must be a whole number"),
            ("slo_ttft_ms", "1.5", "must be a whole number"),
            ("slo_tpot_ms", str(MAX_OBJECTIVE_MS + 1), "less than or equal to"),
        ]:
            refused = await ui.post("/tenants/acme/settings", {**settings, field: value})
            assert refused.status_code == 400, (field, value)
            assert 'id="settings-error"' in refused.text and f"`{field}`" in refused.text
            assert reason in refused.text, refused.text
            refused = await ui.post("/tenants", {"id": "other", "name": "x", field: value})
            assert refused.status_code == 400 and f"`{field}`" in refused.text
        tenant = await served.admin("GET", "/tenants/acme")
        assert (tenant["slo_ttft_ms"], tenant["slo_tpot_ms"]) == (0, 40)  # nothing changed
        assert "other" not in {t["id"] for t in await served.admin("GET", "/tenants")}


async def test_an_upload_refusal_shows_the_validators_reason_with_or_without_script(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served, console(served.base_url) as ui:
        page = await upload(ui, "broken", b"this is not an archive")
        assert page.status_code == 400
        shown = re.search(r'id="upload-error">([^<]+)<', page.text)
        assert shown is not None and "archive" in shown.group(1).lower()
        scripted = await upload(ui, "broken", b"this is not an archive", script=True)
        assert scripted.status_code == 400 and scripted.json()["error"]["message"] == html.unescape(
            shown.group(1)
        )
        good = await upload(ui, "fine", tiny_adapter_archive(), script=True)
        assert good.status_code == 201 and good.json() == {
            "redirect": "/admin/ui/adapters/fine?notice=uploaded"
        }
        assert [a["name"] for a in await served.admin("GET", "/adapters")] == ["fine"]
        detail = await ui.get("/adapters/fine")
        assert "q_proj" in detail.text and "v1" in detail.text
        assert "<td>storage</td>" in detail.text  # in-process: where it is now, not yet used


async def test_deleting_a_granted_version_is_refused_with_the_grants_named(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served, console(served.base_url) as ui:
        await upload(ui, "helper", tiny_adapter_archive())
        await ui.post(
            f"/tenants/{TENANT}/grants", {"alias": "assist", "adapter": "helper", "version": "1"}
        )
        refused = await ui.post("/adapters/helper/versions/1/delete")
        assert (
            refused.status_code == 409
            and "assist" in refused.text
            and 'id="delete-error"' in refused.text
        )
        assert len(await served.admin("GET", "/adapters")) == 1


async def test_ten_thousand_tenants_are_searched_and_paged_in_the_store(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served, console(served.base_url) as ui:
        now = datetime.now(timezone.utc)
        async with served.gateway.sessions.begin() as session:
            await session.execute(
                insert(TenantRow),
                [
                    {"id": f"t{n:05d}", "name": f"Tenant {n}", "created_at": now}
                    for n in range(10_000)
                ],
            )
            session.add_all(adapter_row(f"a{n:04d}") for n in range(1000))
        first = await ui.get("/tenants")
        assert "10,001 tenants" in first.text and first.text.count("<tr>") == 51  # head + 50
        second = await ui.get("/tenants?offset=50")
        assert "t00050" in second.text and "t00099" in second.text and "t00049" not in second.text
        found = await ui.get("/tenants?q=TENANT%209999")
        assert "1 tenant matching" in found.text and "t09999" in found.text
        adapters = await ui.get("/adapters?q=a09")
        assert "100 adapters" in adapters.text
        assert "1,000 adapters" in (await ui.get("/adapters")).text


async def test_the_charts_and_csv_hold_the_tenants_requests_and_refusals(
    serve: ServeFactory,
) -> None:
    async with (
        serve(ScriptedEngine()) as served,
        console(served.base_url) as ui,
        served.client() as tenant,
    ):
        await served.set_quota(requests_per_minute=2)
        statuses = [
            (await tenant.post("/v1/chat/completions", json=chat(served, max_tokens=3))).status_code
            for _ in range(3)
        ]
        assert statuses == [200, 200, 429]
        records = await served.usage_records()
        tokens = sum(r.prompt_tokens + r.completion_tokens for r in records)
        overview = await ui.get("/")
        assert f">{TENANT}</a></td><td>2</td>" in overview.text  # top tenants
        hour = re.findall(r"<title>\d\d:\d\d: ([\d,]+)</title>", overview.text)
        assert sum(int(v.replace(",", "")) for v in hour[:60]) == 2  # requests, last hour
        assert sum(int(v.replace(",", "")) for v in hour[60:120]) == tokens
        assert sum(int(v.replace(",", "")) for v in hour[120:180]) == 1  # the refusal
        page = await ui.get(f"/tenants/{TENANT}")
        day = re.findall(r"<title>\d{4}-\d\d-\d\d: ([\d,]+)</title>", page.text)
        assert sum(int(v.replace(",", "")) for v in day[:31]) == tokens
        csv = (await ui.get(f"/tenants/{TENANT}/usage.csv")).text.splitlines()
        assert csv[0] == "day,model,api_key_id,requests,input_tokens,output_tokens"
        (row,) = csv[1:]
        assert row.split(",")[1:4] == [served.model, records[0].key_id, "2"]


async def test_in_the_front_role_residency_is_said_to_be_in_the_engines(tmp_path: Path) -> None:
    with fake_upstream() as upstream:
        async with (
            running_front(front_settings(upstream.url, tmp_path)) as front,
            console(front.base_url) as ui,
        ):
            async with front.gateway.sessions.begin() as session:
                session.add(adapter_row("helper"))
            for page in (await ui.get("/"), await ui.get("/adapters/helper")):
                assert "lives in the engines" in page.text
                assert "Storage only" not in page.text and "<td>storage</td>" not in page.text
            rest = await ui.client.get(
                "/admin/v1/adapters/residency", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}
            )
            assert rest.status_code == 404 and "/metrics" in rest.json()["error"]["message"]


async def test_inputs_the_rest_api_refuses_are_400s_naming_the_field_in_the_console(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served, console(served.base_url) as ui:
        past_int64 = str(2**63)
        for path in ("/tenants", "/adapters", "/audit"):
            answer = await ui.get(f"{path}?offset={past_int64}")
            assert answer.status_code == 400, path
            assert "Invalid value for 'offset'" in html.unescape(answer.text), path
            assert answer.headers["content-type"].startswith("text/html"), path
        for version in (1, 2):
            assert (await upload(ui, "helper", tiny_adapter_archive(version))).status_code == 303
        split = {"alias": "helper", "adapter": "helper", "versions": "1:50, 2:50"}
        assert (await ui.post(f"/tenants/{TENANT}/grants", split)).status_code == 303
        rollback = await ui.post(
            f"/tenants/{TENANT}/grants/helper/rollback", {"version": past_int64}
        )
        assert rollback.status_code == 400 and "`version`" in rollback.text
        nested = {"alias": "deep", "adapter": "helper", "rollback": "[" * 50_000}
        deep = await ui.post(f"/tenants/{TENANT}/grants", nested)
        assert deep.status_code == 400 and "`rollback`" in deep.text
        grants = await served.admin("GET", f"/tenants/{TENANT}/adapters")
        assert [(g["alias"], g["versions"]) for g in grants] == [("helper", {"1": 50, "2": 50})]


async def test_the_tenant_page_shows_its_stored_bytes_against_its_storage_cap(
    serve: ServeFactory,
) -> None:
    async with (
        serve(ScriptedEngine(), default_storage_bytes=10**9) as served,
        console(served.base_url) as ui,
        served.client() as tenant,
    ):
        page = await ui.get(f"/tenants/{TENANT}")
        assert stored_line(page.text) == ("0", "1,000,000,000", True)

        line = '{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"}\n'
        upload = await tenant.post(
            "/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", line)}
        )
        assert upload.status_code == 200, upload.text
        body = {"model": served.model, "input": "hi", "max_output_tokens": 3}
        answer = await tenant.post("/v1/responses", json=body)
        assert answer.status_code == 200, answer.text
        await served.gateway.responses.written()
        async with served.gateway.sessions() as session:
            [response_bytes] = (await session.scalars(select(StoredResponseRow.size_bytes))).all()
        await served.set_quota(storage_bytes=123_456_789)

        page = await ui.get(f"/tenants/{TENANT}")
        used = len(line.encode()) + response_bytes
        assert response_bytes > 0
        assert stored_line(page.text) == (f"{used:,}", "123,456,789", False)


def stored_line(text: str) -> tuple[str, str, bool]:
    """The tenant page's stored bytes, its cap, and whether the cap is the default."""
    found = re.search(
        r'<p id="storage">Stored: <strong>([\d,]+)</strong> of ([\d,]+) bytes'
        r"\s*\(<code>storage_bytes</code>(, the default)?\)",
        text,
    )
    assert found is not None, text
    return found[1], found[2], found[3] is not None
