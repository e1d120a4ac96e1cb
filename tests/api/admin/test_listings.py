"""The admin API's listings take the console's search, filters and pages: tenants and adapters
by ``q``, ``offset`` and ``limit`` with ``X-Total-Count``; the audit log by actor, action and
time."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import httpx

from app.api.admin.deps import actor_name
from tests.support.harness import ADMIN_TOKEN
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, ServeFactory

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


async def test_tenants_are_searched_and_paged(serve: ServeFactory) -> None:
    async with (
        serve(ScriptedEngine()) as served,
        httpx.AsyncClient(base_url=f"{served.base_url}/admin/v1", headers=ADMIN) as admin,
    ):
        for n in range(5):
            await admin.post("/tenants", json={"id": f"shop-{n}", "name": f"Shop_{n} 100%"})
        everyone = await admin.get("/tenants")
        assert everyone.headers["x-total-count"] == "6" and len(everyone.json()) == 6
        page = await admin.get("/tenants", params={"q": "SHOP", "offset": 1, "limit": 2})
        assert [t["id"] for t in page.json()] == ["shop-1", "shop-2"]
        assert page.headers["x-total-count"] == "5"
        # LIKE's wildcards are taken literally.
        assert (await admin.get("/tenants", params={"q": "_"})).headers["x-total-count"] == "5"
        assert (await admin.get("/tenants", params={"q": "1%0"})).json() == []
        assert [t["id"] for t in (await admin.get("/tenants", params={"q": "0%"})).json()] == [
            f"shop-{n}" for n in range(5)
        ]
        refused = await admin.get("/tenants", params={"limit": 0})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "limit"


async def test_the_audit_log_is_filtered_by_actor_action_and_time(serve: ServeFactory) -> None:
    async with (
        serve(ScriptedEngine()) as served,
        httpx.AsyncClient(base_url=f"{served.base_url}/admin/v1", headers=ADMIN) as admin,
    ):
        await admin.post(f"/tenants/{TENANT}/keys", json={"name": "second"})
        await admin.post("/tenants", json={"id": "Bad Id", "name": "x"})
        keys = (await admin.get("/audit", params={"action": "key.create"})).json()["data"]
        assert len(keys) == 2 and all(r["action"] == "key.create" for r in keys)
        mine = (await admin.get("/audit", params={"actor": actor_name(ADMIN_TOKEN)})).json()
        assert {r["action"] for r in mine["data"]} >= {"tenant.create", "key.create"}
        later = (datetime.now(timezone.utc) + timedelta(minutes=1)).isoformat()
        assert (await admin.get("/audit", params={"since": later})).json()["data"] == []
        assert len((await admin.get("/audit", params={"until": later})).json()["data"]) >= 3
        one = (await admin.get("/audit", params={"action": "key.create", "limit": 1})).json()
        assert len(one["data"]) == 1 and one["next_offset"] == 1
        refused = await admin.get("/audit", params={"since": "1700000000"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "since"
