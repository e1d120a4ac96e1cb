"""Requests refused at the edge are refused before their body is read: a client
without credentials, or with a body over the limit, cannot make the process read
(and hold) it."""

from __future__ import annotations

import io
import itertools
import json
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.admin import schemas
from app.api.middleware import MULTIPART_OVERHEAD_BYTES
from tests.support.edge_app import TENANT, EdgeApp, body_of, call, running
from tests.support.harness import ADMIN_TOKEN, app_settings

HUGE = 150 << 20
LIMIT = 64 << 10
UPLOAD_LIMIT = 256 << 10
FILE_LIMIT = 512 << 10


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[EdgeApp]:
    settings = app_settings(
        tmp_path,
        max_request_bytes=LIMIT,
        max_adapter_bytes=UPLOAD_LIMIT,
        max_file_bytes=FILE_LIMIT,
    )
    async with running(settings) as live:
        yield live


def sized(size: int, **headers: str) -> dict[str, str]:
    return {"content-type": "application/json", "content-length": str(size), **headers}


def chunked(**headers: str) -> dict[str, str]:
    return {"content-type": "application/json", "transfer-encoding": "chunked", **headers}


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def guarded_paths(edge: EdgeApp) -> list[tuple[str, str]]:
    return [("/v1/chat/completions", edge.tenant_key), ("/admin/v1/tenants", ADMIN_TOKEN)]


async def test_a_huge_body_with_a_wrong_key_gets_401_unread(edge: EdgeApp) -> None:
    answer = await call(
        edge.app,
        "POST",
        "/v1/chat/completions",
        headers=sized(HUGE, **bearer("sk-wrong")),
        body=body_of(HUGE),
    )
    assert answer.status == 401
    assert answer.delivered == 0
    assert answer.json() == {
        "error": {
            "message": "Incorrect API key provided.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert answer.headers["connection"] == "close"  # the server drops the rest unread
    assert "x-request-id" in answer.headers


async def test_a_chunked_body_without_a_key_gets_401_unread(edge: EdgeApp) -> None:
    answer = await call(edge.app, "POST", "/v1/completions", headers=chunked(), body=body_of(HUGE))
    assert answer.status == 401
    assert answer.delivered == 0
    assert answer.json()["error"]["message"].startswith("You didn't provide an API key.")


async def test_the_early_401_is_the_dependencys_401(edge: EdgeApp) -> None:
    # GET /v1/models has no body: what the route's own authentication says.
    early = await call(edge.app, "GET", "/v1/models", headers=bearer("sk-wrong"))
    early_post = await call(
        edge.app, "POST", "/v1/chat/completions", headers=sized(2, **bearer("sk-wrong")), body=b"{}"
    )
    assert early.status == early_post.status == 401
    assert early.json() == early_post.json()


async def test_a_disabled_tenant_is_refused_unread(edge: EdgeApp) -> None:
    await edge.gateway.admin.update_tenant("test", TENANT, schemas.TenantUpdate(enabled=False))
    answer = await call(
        edge.app,
        "POST",
        "/v1/chat/completions",
        headers=sized(HUGE, **bearer(edge.tenant_key)),
        body=body_of(HUGE),
    )
    assert answer.status == 403
    assert answer.delivered == 0
    assert answer.json()["error"]["code"] == "permission_denied"


async def test_a_huge_admin_body_with_a_wrong_token_gets_401_unread(edge: EdgeApp) -> None:
    for headers in (sized(HUGE, **bearer("wrong")), chunked(), chunked(**bearer(""))):
        answer = await call(
            edge.app, "POST", "/admin/v1/tenants", headers=headers, body=body_of(HUGE)
        )
        assert answer.status == 401
        assert answer.delivered == 0
        assert answer.json()["error"] == {
            "message": "Invalid admin token.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }


async def test_a_declared_size_over_the_limit_gets_413_unread(edge: EdgeApp) -> None:
    for path, token in (
        ("/v1/chat/completions", edge.tenant_key),
        ("/admin/v1/tenants", ADMIN_TOKEN),
    ):
        answer = await call(
            edge.app,
            "POST",
            path,
            headers=sized(LIMIT + 1, **bearer(token)),
            body=body_of(LIMIT + 1),
        )
        assert answer.status == 413
        assert answer.delivered == 0
        assert answer.json()["error"] == {
            "message": f"The request body is larger than the limit of {LIMIT} bytes (the "
            "gateway's `max_request_bytes`).",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }


async def test_a_chunked_body_is_cut_off_at_the_limit(edge: EdgeApp) -> None:
    for path, token in (
        ("/v1/chat/completions", edge.tenant_key),
        ("/admin/v1/tenants", ADMIN_TOKEN),
    ):
        answer = await call(
            edge.app, "POST", path, headers=chunked(**bearer(token)), body=body_of(HUGE)
        )
        assert answer.status == 413, answer.body
        assert answer.json()["error"]["code"] == "request_too_large"
        # Read up to the chunk that crossed the limit, and no further.
        assert LIMIT < answer.delivered <= LIMIT + (1 << 20)
        starts = [m for m in answer.messages if m["type"] == "http.response.start"]
        assert len(starts) == 1


async def test_a_body_within_the_limit_reaches_the_route(edge: EdgeApp) -> None:
    body = json.dumps({"id": "newco", "name": "x" * 100}).encode()
    answer = await call(
        edge.app,
        "POST",
        "/admin/v1/tenants",
        headers=chunked(**bearer(ADMIN_TOKEN)),
        body=iter([body[:50], body[50:]]),
    )
    assert answer.status == 201, answer.body
    assert answer.delivered == len(body)


async def test_probes_need_no_credentials(edge: EdgeApp) -> None:
    answer = await call(edge.app, "GET", "/healthz")
    assert answer.status == 200


def _zip_upload(payload_size: int) -> tuple[bytes, str]:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as handle:
        handle.writestr("adapter/adapter_config.json", "{}")
        handle.writestr("adapter/adapter_model.safetensors", b"\0" * payload_size)
    boundary = "edgeboundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\nedge\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.zip"\r\n'
            "Content-Type: application/zip\r\n\r\n"
        ).encode()
        + archive.getvalue()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


async def test_an_upload_has_its_own_limit(edge: EdgeApp) -> None:
    # Larger than max_request_bytes, smaller than max_adapter_bytes: the route reads it
    # (and refuses it as an adapter, not as a body too large).
    body, content_type = _zip_upload(UPLOAD_LIMIT // 2)
    assert LIMIT < len(body) < UPLOAD_LIMIT
    headers = {"content-type": content_type, **bearer(ADMIN_TOKEN)}
    answer = await call(edge.app, "POST", "/admin/v1/adapters", headers=headers, body=body)
    assert answer.status == 400, answer.body
    assert answer.json()["error"]["code"] != "request_too_large"
    assert answer.delivered == len(body)

    # A file over max_adapter_bytes but within the multipart allowance: the upload's
    # own limit, applied as it is spooled to disk.
    body, content_type = _zip_upload(UPLOAD_LIMIT + 1)
    headers = {"content-type": content_type, **bearer(ADMIN_TOKEN)}
    answer = await call(edge.app, "POST", "/admin/v1/adapters", headers=headers, body=body)
    assert answer.status == 413
    assert answer.json()["error"]["param"] == "file"
    named = f"The adapter archive is larger than the limit of {UPLOAD_LIMIT} bytes (the gateway's"
    assert answer.json()["error"]["message"] == f"{named} `max_adapter_bytes`)."

    # A declared size past the allowance: refused unread, naming the same limit.
    headers = {"content-type": content_type, "content-length": str(HUGE), **bearer(ADMIN_TOKEN)}
    answer = await call(edge.app, "POST", "/admin/v1/adapters", headers=headers, body=body_of(HUGE))
    assert answer.status == 413
    assert answer.delivered == 0
    assert answer.json()["error"]["message"] == f"{named} `max_adapter_bytes`)."

    # A file streamed past the allowance without a size: cut off as it streams.
    opening = body[: body.index(b"PK")]  # the parts up to the file's first byte
    headers = {"content-type": content_type, **bearer(ADMIN_TOKEN)}
    endless = itertools.chain([opening], body_of(HUGE))
    answer = await call(edge.app, "POST", "/admin/v1/adapters", headers=headers, body=endless)
    assert answer.status == 413, answer.body
    assert answer.delivered <= UPLOAD_LIMIT + MULTIPART_OVERHEAD_BYTES + (1 << 20)

    # JSON registration on the same route is an ordinary request.
    headers = sized(LIMIT + 1, **bearer(ADMIN_TOKEN))
    answer = await call(
        edge.app, "POST", "/admin/v1/adapters", headers=headers, body=body_of(LIMIT + 1)
    )
    assert answer.status == 413
    assert answer.delivered == 0


def _file_upload(payload: bytes) -> tuple[bytes, str]:
    boundary = "fileboundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        + payload
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


async def test_a_tenants_file_upload_has_its_own_limit(edge: EdgeApp) -> None:
    # Past max_request_bytes, within max_file_bytes: stored.
    body, content_type = _file_upload(b"{}\n" * (LIMIT // 2))
    assert LIMIT < len(body) < FILE_LIMIT
    headers = {"content-type": content_type, **bearer(edge.tenant_key)}
    answer = await call(edge.app, "POST", "/v1/files", headers=headers, body=body)
    assert answer.status == 200, answer.body
    assert answer.json()["bytes"] == 3 * (LIMIT // 2)

    # A file past max_file_bytes but within the multipart allowance: the file's own 413.
    body, content_type = _file_upload(b"x" * (FILE_LIMIT + 1))
    headers = {"content-type": content_type, **bearer(edge.tenant_key)}
    answer = await call(edge.app, "POST", "/v1/files", headers=headers, body=body)
    assert answer.status == 413
    assert answer.json()["error"]["param"] == "file"

    # A declared size past the allowance: refused unread, naming the file's limit itself.
    headers = {"content-type": content_type, "content-length": str(HUGE), **bearer(edge.tenant_key)}
    answer = await call(edge.app, "POST", "/v1/files", headers=headers, body=body_of(HUGE))
    assert answer.status == 413
    assert answer.delivered == 0
    assert answer.json()["error"]["message"] == (
        f"The file is larger than the limit of {FILE_LIMIT} bytes (the gateway's `max_file_bytes`)."
    )
    assert answer.json()["error"]["param"] == "file"
