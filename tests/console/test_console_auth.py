"""Who may use the console: a session made from an admin token, valid on every replica until
sign-out, expiry or the token's removal; CSRF tokens on every mutation; sign-in attempts
limited and audited; strict headers on every answer; whatever a tenant or admin wrote shown
as text."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI
from sqlalchemy import update

from app.server import server_config
from app.settings import Settings
from app.store.tables import ConsoleSessionRow
from tests.support.console import UI, console, sign_in, unlabelled_fields
from tests.support.edge_app import EdgeApp, call, running
from tests.support.harness import ADMIN_TOKEN, app_settings
from tests.support.scripted_engine import ScriptedEngine
from tests.support.servers import PromptServer
from tests.support.serving import TENANT, Served, ServeFactory, eventually

PAGES = [
    "/",
    "/tenants",
    f"/tenants/{TENANT}",
    "/adapters",
    "/audit",
    f"/tenants/{TENANT}/usage.csv",
]
MUTATIONS = [
    "/tenants",
    f"/tenants/{TENANT}/settings",
    f"/tenants/{TENANT}/keys",
    "/adapters",
    "/sign-out",
]


async def audit_records(served: Served, action: str) -> list[dict[str, str]]:
    page = await served.admin("GET", f"/audit?action={action}")
    return list(page["data"])


async def test_no_page_and_no_mutation_without_a_session(serve: ServeFactory) -> None:
    async with (
        serve(ScriptedEngine()) as served,
        httpx.AsyncClient(base_url=served.base_url) as anyone,
    ):
        for path in PAGES:
            answer = await anyone.get(UI + path)
            assert answer.status_code == 303 and answer.headers["location"] == f"{UI}/sign-in", path
        for path in MUTATIONS:
            answer = await anyone.post(UI + path, data={"id": "intruder", "name": "x"})
            assert answer.status_code == 401, path
        forged = await anyone.get(f"{UI}/", cookies={"lgw_console": "not-a-session"})
        assert forged.status_code == 303
        assert [t["id"] for t in await served.admin("GET", "/tenants")] == [TENANT]


async def test_sign_in_sets_a_strict_cookie_and_is_audited(serve: ServeFactory) -> None:
    async with (
        serve(ScriptedEngine()) as served,
        httpx.AsyncClient(base_url=served.base_url) as client,
    ):
        refused = await sign_in(client, "lgw-admin-wrong")
        assert refused.status_code == 401 and "Invalid admin token." in refused.text
        answer = await sign_in(client)
        assert answer.status_code == 303
        cookie = answer.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/admin/ui" in cookie
        assert "secure" not in cookie  # plain HTTP on loopback
        records = await audit_records(served, "console.sign_in")
        assert [(r["actor"], r["outcome"]) for r in records] == [
            (records[0]["actor"], "ok"),
            ("unauthenticated", "denied"),
        ]
        assert records[0]["actor"].startswith("admin:") and ADMIN_TOKEN not in str(records)


def proxied_server(app: FastAPI, settings: Settings) -> uvicorn.Server:
    """The server as `lora-gateway serve` configures it (X-Forwarded-* from trusted proxies)."""
    return PromptServer(server_config(app, settings))


async def test_the_cookie_is_secure_behind_a_trusted_tls_proxy_only(serve: ServeFactory) -> None:
    async with (
        serve(
            ScriptedEngine(), server_factory=proxied_server, trusted_proxies="127.0.0.1/32"
        ) as served,
        httpx.AsyncClient(base_url=served.base_url) as client,
    ):
        via_proxy = await client.post(
            f"{UI}/sign-in", data={"token": ADMIN_TOKEN}, headers={"x-forwarded-proto": "https"}
        )
        assert "secure" in via_proxy.headers["set-cookie"].lower()
    async with (
        serve(ScriptedEngine(), server_factory=proxied_server) as served,
        httpx.AsyncClient(base_url=served.base_url) as client,
    ):
        # Not from a trusted proxy: the header is the client's word, and does not count.
        direct = await client.post(
            f"{UI}/sign-in", data={"token": ADMIN_TOKEN}, headers={"x-forwarded-proto": "https"}
        )
        assert "secure" not in direct.headers["set-cookie"].lower()


async def test_sign_in_attempts_are_limited_per_address(serve: ServeFactory) -> None:
    async with (
        serve(ScriptedEngine(), console_sign_ins_per_minute=2) as served,
        httpx.AsyncClient(base_url=served.base_url) as client,
    ):
        statuses = [(await sign_in(client, f"wrong-{n}")).status_code for n in range(2)]
        limited = await sign_in(client)  # even the right token waits its turn
        assert statuses == [401, 401] and limited.status_code == 429
        assert "Too many sign-in attempts" in limited.text
        # The second refusal from the address is in the audit throttle's window.
        assert len(await audit_records(served, "console.sign_in")) == 1


async def refused_records(edge: EdgeApp) -> list[tuple[str, str]]:
    listed = await edge.gateway.admin.audit_page(limit=500)
    return [(r.action, r.detail) for r in listed.items if r.outcome == "denied"]


async def test_sign_in_failures_share_the_admin_apis_audit_throttle(tmp_path: Path) -> None:
    form = {"content-type": "application/x-www-form-urlencoded"}
    async with running(app_settings(tmp_path)) as edge:
        # Ten wrong tokens from each of a hundred addresses: one record per address, and
        # no more than the admin API's cap in all (60 a window).
        for n in range(100):
            source = (f"198.51.100.{n}", 40000)
            for attempt in range(10):
                body = f"token=lgw-admin-wrong-{attempt}".encode()
                answer = await call(
                    edge.app, "POST", f"{UI}/sign-in", headers=form, body=body, client=source
                )
                assert answer.status == 401
        records = await refused_records(edge)
        assert len(records) == 60
        assert {action for action, _ in records} == {"console.sign_in"}

    async with running(app_settings(tmp_path / "shared")) as edge:
        # One window per address across both: a refusal over REST, then at the console.
        wrong = {"authorization": "Bearer lgw-admin-wrong"}
        rest = await call(edge.app, "GET", "/admin/v1/tenants", headers=wrong)
        console_answer = await call(
            edge.app, "POST", f"{UI}/sign-in", headers=form, body=b"token=lgw-admin-wrong"
        )
        assert (rest.status, console_answer.status) == (401, 401)
        assert [action for action, _ in await refused_records(edge)] == ["admin.auth"]


async def test_a_mutation_without_the_session_csrf_token_changes_nothing(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served, console(served.base_url) as ui:
        new = {"id": "forged", "name": "F"}
        missing = await ui.client.post(f"{UI}/tenants", data=new)
        wrong = await ui.client.post(f"{UI}/tenants", data={**new, "csrf": ui.csrf[:-2] + "xx"})
        other_origin = await ui.post("/tenants", new, headers={"origin": "https://evil.example"})
        assert [r.status_code for r in (missing, wrong, other_origin)] == [403, 403, 403]
        assert [t["id"] for t in await served.admin("GET", "/tenants")] == [TENANT]
        created = await ui.post("/tenants", new, headers={"origin": served.base_url})
        assert created.status_code == 303


async def test_every_page_has_a_strict_policy_no_inline_code_and_labelled_fields(
    serve: ServeFactory,
) -> None:
    async with serve(ScriptedEngine()) as served, console(served.base_url) as ui:
        answers = [await ui.get(path) for path in PAGES]
        answers += [await ui.get("/static/console.js"), await ui.get("/tenants/no-such-tenant")]
        answers.append(await ui.client.get(f"{UI}/sign-in"))
        for answer in answers:
            policy = answer.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "unsafe-inline" not in policy, answer.url
            assert "frame-ancestors 'none'" in policy
            assert answer.headers["x-content-type-options"] == "nosniff"
        assert all("<script>" not in a.text and " style=" not in a.text for a in answers)
        for answer in answers:
            if answer.headers["content-type"].startswith("text/html"):
                assert unlabelled_fields(answer.text) == [], answer.url


async def test_markup_a_tenant_or_admin_wrote_is_shown_as_text(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as served, console(served.base_url) as ui:
        markup = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
        await served.admin("POST", "/tenants", {"id": "mark", "name": markup})
        await served.admin("POST", "/tenants/mark/keys", {"name": markup})
        for path in ("/tenants", "/tenants/mark", "/audit", "/tenants?q=%3Cscript%3E"):
            page = await ui.get(path)
            assert "<script>alert" not in page.text and "<img src=x" not in page.text, path
        assert "&lt;script&gt;alert(2)&lt;/script&gt;" in (await ui.get("/tenants/mark")).text


async def test_sign_out_ends_the_session_on_every_replica(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine()) as first, serve(ScriptedEngine()) as second:
        async with console(first.base_url) as ui:
            cookie = {"lgw_console": ui.client.cookies["lgw_console"]}
            async with httpx.AsyncClient(base_url=second.base_url, cookies=cookie) as elsewhere:
                assert (await elsewhere.get(f"{UI}/tenants")).status_code == 200
                assert (await ui.post("/sign-out")).status_code == 303
                assert (await elsewhere.get(f"{UI}/tenants")).status_code == 303
                assert (await ui.client.get(f"{UI}/tenants")).status_code == 303
        assert [r["outcome"] for r in await audit_records(first, "console.sign_out")] == ["ok"]


async def test_an_expired_session_no_longer_works_on_any_replica(serve: ServeFactory) -> None:
    async with (
        serve(ScriptedEngine()) as first,
        serve(ScriptedEngine()) as second,
        console(first.base_url) as ui,
    ):
        cookie = {"lgw_console": ui.client.cookies["lgw_console"]}
        async with first.gateway.sessions.begin() as session:
            past = datetime.now(timezone.utc) - timedelta(seconds=1)
            await session.execute(update(ConsoleSessionRow).values(expires_at=past))
        assert (await ui.get("/tenants")).status_code == 303
        assert (await ui.post("/tenants", {"id": "late", "name": "L"})).status_code == 401
        async with httpx.AsyncClient(base_url=second.base_url, cookies=cookie) as elsewhere:
            assert (await elsewhere.get(f"{UI}/tenants")).status_code == 303


async def test_removing_the_admin_token_ends_its_sessions_everywhere(
    serve: ServeFactory, tmp_path: Path
) -> None:
    token_file = tmp_path / "admin-tokens"
    token_file.write_text(f"{ADMIN_TOKEN},lgw-admin-second")
    replica = {"admin_token": None, "admin_token_file": token_file, "registry_poll_seconds": 0.1}
    async with (
        serve(ScriptedEngine(), **replica) as first,
        serve(ScriptedEngine(), **replica) as second,
        console(first.base_url, "lgw-admin-second") as ui,
        console(second.base_url) as kept,
    ):
        cookie = {"lgw_console": ui.client.cookies["lgw_console"]}
        token_file.write_text(ADMIN_TOKEN)  # "lgw-admin-second" is removed
        await eventually(lambda: len(first.gateway.admin_tokens) == 1)
        assert (await ui.get("/tenants")).status_code == 303
        async with httpx.AsyncClient(base_url=second.base_url, cookies=cookie) as elsewhere:
            assert (await elsewhere.get(f"{UI}/tenants")).status_code == 303
        assert (await kept.get("/tenants")).status_code == 200  # another token's session
        rest = await ui.client.get(
            "/admin/v1/tenants", headers={"authorization": "Bearer lgw-admin-second"}
        )
        assert rest.status_code == 401


async def test_turned_off_the_console_is_gone_and_nothing_else_changes(serve: ServeFactory) -> None:
    async with serve(ScriptedEngine(), console=False) as off, serve(ScriptedEngine()) as on:
        async with httpx.AsyncClient(base_url=off.base_url) as client:
            for path in ("/admin/ui/", "/admin/ui/sign-in", "/admin/ui/static/console.js"):
                answer = await client.get(path)
                assert (
                    answer.status_code == 404
                    and answer.json()["error"]["type"] == "invalid_request_error"
                )
            assert "content-security-policy" not in answer.headers
            schema_off = (await client.get("/openapi.json")).json()
        async with httpx.AsyncClient(base_url=on.base_url) as client:
            assert (await client.get("/openapi.json")).json() == schema_off
        assert [t["id"] for t in await off.admin("GET", "/tenants")] == [TENANT]
