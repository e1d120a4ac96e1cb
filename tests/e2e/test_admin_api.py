"""The admin REST API on the live gateway: changes serve traffic at once."""

from __future__ import annotations

import asyncio
import io
import zipfile
from pathlib import Path

import httpx
import openai
import pytest

from app.settings import EMBEDDED_MODEL_DIR
from app.tenancy.storage import STORE_DIR
from bench.random_adapters import make_random_adapter
from tests.support.live_gateway import LiveGateway, long_stream
from tests.support.store_polls import store_polls

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Say hello."}]


def zipped(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for file in directory.iterdir():
            archive.write(file, f"adapter/{file.name}")
    return buffer.getvalue()


def error_of(response: httpx.Response) -> dict[str, object]:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def store_entries(gateway: LiveGateway) -> set[str]:
    return {p.name for p in (gateway.settings.adapter_root / STORE_DIR).iterdir()}


def test_admin_routes_need_an_admin_token(gateway: LiveGateway) -> None:
    url = f"{gateway.base_url}/admin/v1/tenants"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    tenant_key = gateway.keys["demo-all"]
    refused = httpx.get(url, headers={"Authorization": f"Bearer {tenant_key}"})
    assert refused.status_code == 401 and error_of(refused)["code"] == "invalid_api_key"


def test_onboard_a_tenant_with_an_uploaded_adapter(gateway: LiveGateway, tmp_path: Path) -> None:
    source = make_random_adapter(
        EMBEDDED_MODEL_DIR, tmp_path / "src", rank=8, target_modules=("q_proj", "v_proj"), seed=3
    )
    with gateway.admin_client() as admin:
        created = admin.post("/tenants", json={"id": "newco", "name": "NewCo"})
        assert created.status_code == 201, created.text
        issued = admin.post("/tenants/newco/keys", json={"name": "prod"})
        assert issued.status_code == 201
        key = issued.json()["key"]
        assert key.startswith(issued.json()["prefix"])
        listed = admin.get("/tenants/newco/keys").json()
        assert [k["prefix"] for k in listed] == [issued.json()["prefix"]]
        assert key not in admin.get("/tenants/newco/keys").text

        uploaded = admin.post(
            "/adapters",
            data={"name": "newco-support"},
            files={"file": ("adapter.zip", zipped(source), "application/zip")},
        )
        assert uploaded.status_code == 201, uploaded.text
        assert uploaded.json()["version"] == 1 and uploaded.json()["rank"] == 8
        assert uploaded.json()["target_modules"] == ["q_proj", "v_proj"]
        granted = admin.put("/tenants/newco/adapters/support", json={"adapter": "newco-support"})
        assert granted.status_code == 200 and granted.json()["resolved_version"] == 1

    # The very next request is served: the grant is live before its response.
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0)
    answer = client.chat.completions.create(model="support", messages=MESSAGES, max_tokens=4)
    assert answer.usage is not None and answer.usage.completion_tokens >= 1
    assert [m.id for m in client.models.list()] == ["support"]
    with pytest.raises(openai.NotFoundError):  # granted to newco only
        gateway.client("demo-all").chat.completions.create(
            model="support", messages=MESSAGES, max_tokens=4
        )

    with gateway.admin_client() as admin:
        refused = admin.delete("/adapters/newco-support")
        assert refused.status_code == 409 and error_of(refused)["code"] == "conflict"
        assert admin.delete("/adapters/newco-support", params={"force": "true"}).status_code == 204
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="support", messages=MESSAGES, max_tokens=4)


def test_revoked_keys_and_disabled_tenants_are_refused_at_once(gateway: LiveGateway) -> None:
    with gateway.admin_client() as admin:
        admin.post("/tenants", json={"id": "revokee", "name": "R", "allow_base_model": True})
        issued = admin.post("/tenants/revokee/keys", json={}).json()
        client = openai.OpenAI(
            base_url=f"{gateway.base_url}/v1", api_key=issued["key"], max_retries=0
        )
        assert [m.id for m in client.models.list()] == [gateway.settings.base_model_id]

        assert admin.patch("/tenants/revokee", json={"enabled": False}).status_code == 200
        with pytest.raises(openai.PermissionDeniedError):
            client.models.list()
        assert admin.patch("/tenants/revokee", json={"enabled": True}).status_code == 200
        assert client.models.list()

        assert admin.delete(f"/tenants/revokee/keys/{issued['id']}").status_code == 204
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
        assert admin.get("/tenants/revokee/keys").json()[0]["revoked_at"] is not None


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"adapter/adapter_model.bin": b"\x80\x04pickle"}, "pickle"),
        ({"../escape/adapter_config.json": b"{}"}, ".."),
        ("rank-64", "rank"),
    ],
)
def test_malicious_uploads_are_rejected_without_a_trace(
    gateway: LiveGateway, files: dict[str, bytes] | str, message: str, tmp_path: Path
) -> None:
    if files == "rank-64":  # well-formed, but beyond the engine's max_lora_rank of 32
        source = make_random_adapter(
            EMBEDDED_MODEL_DIR, tmp_path, rank=64, target_modules=("q_proj",), seed=1
        )
        files = {f"adapter/{f.name}": f.read_bytes() for f in source.iterdir()}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    before = store_entries(gateway)
    with gateway.admin_client() as admin:
        rejected = admin.post(
            "/adapters",
            data={"name": "evil"},
            files={"file": ("evil.zip", buffer.getvalue(), "application/zip")},
        )
        assert rejected.status_code == 400, rejected.text
        assert message in str(error_of(rejected)["message"])
        assert admin.get("/adapters/evil").status_code == 404
        latest = admin.get("/audit", params={"limit": 1}).json()["data"][0]
    assert (latest["action"], latest["outcome"]) == ("adapter.register", "rejected")
    assert store_entries(gateway) == before


def test_admin_errors_are_openai_shaped(gateway: LiveGateway) -> None:
    with gateway.admin_client() as admin:
        missing = admin.get("/tenants/nobody")
        assert missing.status_code == 404 and error_of(missing)["code"] == "not_found"
        invalid = admin.post("/tenants", json={"id": "Bad Id", "name": "x"})
        assert invalid.status_code == 400 and error_of(invalid)["param"] == "id"
        page = admin.get("/audit", params={"limit": 2}).json()
        assert len(page["data"]) == 2 and page["next_offset"] == 2
        assert page["data"][0]["id"] > page["data"][1]["id"]


def test_admin_api_is_documented(gateway: LiveGateway) -> None:
    spec = httpx.get(f"{gateway.base_url}/openapi.json").json()
    for path in (
        "/admin/v1/tenants",
        "/admin/v1/adapters",
        "/admin/v1/audit",
        "/admin/v1/tenants/{tenant_id}/adapters/{alias}",
    ):
        assert path in spec["paths"], path
    upload = spec["paths"]["/admin/v1/adapters"]["post"]["requestBody"]["content"]
    assert {"application/json", "multipart/form-data"} <= set(upload)


def test_changes_made_elsewhere_apply_by_the_next_poll(gateway: LiveGateway) -> None:
    """Another replica (here: the CLI's service on the same store) revokes a key."""
    from app.cli import admin_service

    with gateway.admin_client() as admin:
        admin.post("/tenants", json={"id": "elsewhere", "name": "E", "allow_base_model": True})
        issued = admin.post("/tenants/elsewhere/keys", json={}).json()
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=issued["key"], max_retries=0)
    assert client.models.list()

    def revoked() -> bool:
        try:
            gateway.gateway.registry.authenticate(issued["key"])
        except Exception:
            return True
        return False

    async def revoke() -> None:
        async with admin_service(gateway.settings) as other_replica:
            await other_replica.revoke_key("admin:other", "elsewhere", issued["id"])

    with store_polls(gateway.gateway) as polls:
        asyncio.run(revoke())
        polls.expect(revoked)
        # By its next poll (the one under way may have read the store before the change).
        assert polls.seen() <= 2
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_usage_ledger_counts_every_request_including_cancelled_ones(
    gateway: LiveGateway,
) -> None:
    with gateway.admin_client() as admin:
        admin.post("/tenants", json={"id": "metered", "name": "M", "allow_base_model": True})
        key = admin.post("/tenants/metered/keys", json={"name": "k"}).json()
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key["key"], max_retries=0)
    base = gateway.settings.base_model_id
    answers = [
        client.chat.completions.create(model=base, messages=MESSAGES, max_tokens=n, temperature=0)
        for n in (3, 5)
    ]
    body = long_stream(base)
    with httpx.stream(
        "POST",
        f"{gateway.base_url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key['key']}"},
    ) as response:
        lines = response.iter_lines()
        for _ in range(8):
            next(lines)
    assert gateway.wait_idle() == 0

    with gateway.admin_client() as admin:
        report = admin.get("/tenants/metered/usage").json()
        by_key = admin.get("/tenants/metered/usage", params={"group_by": "key"}).json()
        empty = admin.get("/tenants/metered/usage", params={"from": "2100-01-01T00:00:00Z"})
    (total,) = report["data"]
    assert total["requests"] == 3
    finished = sum(a.usage.completion_tokens for a in answers if a.usage)
    assert finished < total["completion_tokens"] < finished + 900  # the cancelled one: partial
    assert total["prompt_tokens"] > sum(a.usage.prompt_tokens for a in answers if a.usage)
    assert [(g["group"], g["requests"]) for g in by_key["data"]] == [(key["id"], 3)]
    assert empty.json()["data"][0]["requests"] == 0
