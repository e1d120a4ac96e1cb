"""Admin routes over the serving app: inputs the schemas cannot see alone (a grant alias
travels in the path), and what the quota store holds."""

from __future__ import annotations

import httpx
import pytest

from tests.support.harness import ADMIN_TOKEN
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, ServeFactory


@pytest.mark.parametrize(
    "alias", ["a" * 300, "two words", "a,b", "tiny-model"], ids=["long", "space", "comma", "base"]
)
async def test_a_bad_grant_alias_is_a_400_naming_alias(serve: ServeFactory, alias: str) -> None:
    async with (
        serve(ScriptedEngine()) as served,
        httpx.AsyncClient(
            base_url=f"{served.base_url}/admin/v1",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as admin,
    ):
        response = await admin.put(
            f"/tenants/{TENANT}/adapters/{alias}", json={"adapter": "some_adapter"}
        )
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "alias"


async def test_quota_usage_of_an_unknown_tenant_is_a_404(serve: ServeFactory) -> None:
    async with (
        serve(ScriptedEngine()) as served,
        httpx.AsyncClient(
            base_url=f"{served.base_url}/admin/v1",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as admin,
    ):
        response = await admin.get("/tenants/nobody/quota/usage")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


async def test_scheduling_attributes_over_the_admin_api(serve: ServeFactory) -> None:
    async with (
        serve(ScriptedEngine()) as served,
        httpx.AsyncClient(
            base_url=f"{served.base_url}/admin/v1",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as admin,
    ):
        created = await admin.post(
            "/tenants", json={"id": "batchy", "name": "B", "weight": 3, "priority": "batch"}
        )
        assert created.status_code == 201, created.text
        assert (created.json()["weight"], created.json()["priority"]) == (3, "batch")
        for body, field in (({"weight": 0}, "weight"), ({"priority": "urgent"}, "priority")):
            refused = await admin.patch("/tenants/batchy", json=body)
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["param"] == field
        patched = await admin.patch("/tenants/batchy", json={"priority": "interactive"})
        assert patched.json()["priority"] == "interactive"
        read = (await admin.get("/tenants/batchy")).json()
        assert (read["weight"], read["priority"]) == (3, "interactive")
        assert served.gateway.registry.tenant("batchy").weight == 3
