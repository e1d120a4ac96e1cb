"""Admin requests the admin service never sees still leave an audit record: a
refused token (throttled per source address, counted), a refusal by validation,
a server error. No record holds a token or the request's data."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.api.admin.deps import actor_name
from app.api.admin.failure_audit import AuthFailureThrottle
from app.store.tables import AuditRow
from tests.support.edge_app import TENANT, EdgeApp, call, running
from tests.support.harness import ADMIN_TOKEN, app_settings

WRONG_TOKEN = "lgw-wrong-token-that-must-never-be-recorded"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"}


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[EdgeApp]:
    async with running(app_settings(tmp_path)) as live:
        yield live


async def audit(edge: EdgeApp) -> list[AuditRow]:
    rows_page = await edge.gateway.admin.audit_page(limit=500)
    rows, _ = rows_page.items, rows_page.next_offset
    return [row for row in reversed(rows) if row.actor != "test"]  # the fixture's own set-up


def no_secrets(rows: list[AuditRow]) -> None:
    for row in rows:
        text = " ".join([row.actor, row.action, row.target, row.outcome, row.detail])
        assert WRONG_TOKEN not in text and ADMIN_TOKEN not in text


def failures_counted(edge: EdgeApp, audited: str) -> float:
    from app.metrics import render

    body, _ = render(edge.app.state.metrics_dir)
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if (
                sample.name == "lora_gateway_admin_auth_failures_total"
                and sample.labels["audited"] == audited
            ):
                return sample.value
    return 0.0


async def test_a_refused_admin_token_is_audited_once_per_source(edge: EdgeApp) -> None:
    wrong = {"authorization": f"Bearer {WRONG_TOKEN}"}
    for _ in range(3):
        answer = await call(edge.app, "GET", "/admin/v1/tenants?secret=x", headers=wrong)
        assert answer.status == 401
    await call(edge.app, "DELETE", "/admin/v1/tenants/x", client=("198.51.100.9", 1))

    rows = await audit(edge)
    assert [(r.actor, r.action, r.target, r.outcome) for r in rows] == [
        ("unauthenticated", "admin.auth", "GET /admin/v1/tenants", "denied"),
        ("unauthenticated", "admin.auth", "DELETE /admin/v1/tenants/x", "denied"),
    ]
    assert rows[0].detail == "invalid admin token from 203.0.113.7"
    assert rows[1].detail == "no admin token from 198.51.100.9"
    no_secrets(rows)
    assert failures_counted(edge, "yes") == 2
    assert failures_counted(edge, "no") == 2


def test_the_throttle_bounds_records_per_source_and_in_all() -> None:
    now = [0.0]
    throttle = AuthFailureThrottle(window_seconds=60, per_window=3, clock=lambda: now[0])
    assert throttle.allow("a")
    assert not throttle.allow("a")
    assert throttle.allow("b") and throttle.allow("c")
    assert not throttle.allow("d")  # addresses cycled: capped in all
    now[0] = 59.9
    assert not throttle.allow("a")
    now[0] = 60.0
    assert throttle.allow("a") and throttle.allow("d")


async def test_a_refusal_by_validation_is_audited(edge: EdgeApp) -> None:
    body = json.dumps({"id": "Not A Valid Id!", "name": "x"}).encode()
    answer = await call(edge.app, "POST", "/admin/v1/tenants", headers=ADMIN, body=body)
    assert answer.status == 400
    broken = await call(edge.app, "POST", "/admin/v1/tenants", headers=ADMIN, body=b"{")
    assert broken.status == 400
    # Refused by a route before the service runs (a key that expired already).
    past = json.dumps({"name": "k", "expires_at": "2001-01-01T00:00:00Z"}).encode()
    expired = await call(
        edge.app, "POST", f"/admin/v1/tenants/{TENANT}/keys", headers=ADMIN, body=past
    )
    assert expired.status == 400

    rows = await audit(edge)
    actor = actor_name(ADMIN_TOKEN)
    assert [(r.actor, r.action, r.target, r.outcome) for r in rows] == [
        (actor, "admin.request", "POST /admin/v1/tenants", "rejected"),
        (actor, "admin.request", "POST /admin/v1/tenants", "rejected"),
        (actor, "admin.request", f"POST /admin/v1/tenants/{TENANT}/keys", "rejected"),
    ]
    assert rows[0].detail.startswith("Invalid value for 'id'")
    assert "Not A Valid Id!" not in rows[0].detail  # the message, not the data
    assert rows[2].detail == expired.json()["error"]["message"]
    no_secrets(rows)


async def test_a_rejection_the_service_audited_is_not_audited_again(edge: EdgeApp) -> None:
    body = json.dumps({"id": TENANT, "name": "again"}).encode()
    answer = await call(edge.app, "POST", "/admin/v1/tenants", headers=ADMIN, body=body)
    assert answer.status == 409
    rows = await audit(edge)
    assert [(r.action, r.outcome) for r in rows] == [("tenant.create", "rejected")]


async def test_a_server_error_is_audited_without_its_text(
    edge: EdgeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: object) -> None:
        raise RuntimeError(f"the store said {WRONG_TOKEN}")

    monkeypatch.setattr(edge.gateway.admin, "tenants_page", broken)
    with pytest.raises(RuntimeError):  # re-raised for the server's log, after the answer
        await call(edge.app, "GET", "/admin/v1/tenants", headers=ADMIN)

    rows = await audit(edge)
    assert [(r.actor, r.action, r.target, r.outcome, r.detail) for r in rows] == [
        (
            actor_name(ADMIN_TOKEN),
            "admin.request",
            "GET /admin/v1/tenants",
            "error",
            "unhandled RuntimeError",
        )
    ]
    no_secrets(rows)


async def test_a_body_over_the_limit_on_an_admin_route_is_audited(tmp_path: Path) -> None:
    async with running(app_settings(tmp_path, max_request_bytes=1024)) as edge:
        declared = {**ADMIN, "content-length": "5000"}
        answer = await call(edge.app, "POST", "/admin/v1/tenants", headers=declared)
        assert answer.status == 413
        streamed = await call(
            edge.app, "POST", "/admin/v1/tenants", headers=ADMIN, body=iter([b" " * 5000])
        )
        assert streamed.status == 413
        rows = await audit(edge)
        assert [(r.action, r.outcome) for r in rows] == [("admin.request", "rejected")] * 2
        assert all("larger than the limit of 1024 bytes" in r.detail for r in rows)
