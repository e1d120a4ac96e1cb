"""What the fuzzer found, pinned: each case made a 500 (or broke the error contract) once."""

from __future__ import annotations

import httpx

from tests.support.fuzz_target import FuzzTarget
from tests.support.harness import ADMIN_TOKEN


def _admin(target: FuzzTarget) -> httpx.Client:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    return httpx.Client(base_url=f"{target.base_url}/admin/v1", headers=headers, timeout=30)


def test_a_registration_path_with_a_name_over_255_bytes_is_a_400(fuzz_target: FuzzTarget) -> None:
    # The filesystem refuses such a name (ENAMETOOLONG): it was an unhandled OSError.
    with _admin(fuzz_target) as admin:
        for path in ("0" * 256, f"ok/{'é' * 128}"):
            answer = admin.post("/adapters", json={"name": "long_path", "path": path})
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["param"] == "path"
            assert "at most 255 bytes" in answer.json()["error"]["message"]


def test_admin_flags_and_counts_are_not_coerced(fuzz_target: FuzzTarget) -> None:
    # The schema says boolean and integer: 0 was read as false, "5" and 5.0 as 5.
    with _admin(fuzz_target) as admin:
        for body, param in (
            ({"id": "coerced", "name": "C", "allow_base_model": 0}, "allow_base_model"),
            ({"id": "coerced", "name": "C", "allow_base_model": "true"}, "allow_base_model"),
        ):
            answer = admin.post("/tenants", json=body)
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["param"] == param
        for value in ("5", 5.0, True):
            answer = admin.put("/tenants/coerced/quota", json={"requests_per_minute": value})
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["param"] == "requests_per_minute"


def test_counts_beyond_int64_are_a_400(fuzz_target: FuzzTarget) -> None:
    # SQLite's INTEGER is int64: a larger quota or audit offset was an OverflowError.
    huge = 2**63
    with _admin(fuzz_target) as admin:
        assert admin.post("/tenants", json={"id": "huge", "name": "H"}).status_code == 201
        answer = admin.put("/tenants/huge/quota", json={"tokens_per_minute": huge})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "tokens_per_minute"
        answer = admin.get("/audit", params={"offset": huge})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "offset"
        answer = admin.put(
            "/tenants/huge/quota", json={"token_budget": huge - 1, "budget_period": "day"}
        )
        assert answer.status_code == 200, answer.text


def test_v1_numbers_and_flags_take_json_types_only(fuzz_target: FuzzTarget) -> None:
    # Lax parsing read `"logprobs": true` as 1, `"n": "2"` as 2 and `"stream": 0` or
    # `"echo": "no"` as false; /openapi.json says integer, number, boolean.
    headers = fuzz_target.auth("/v1/completions")
    base = {"model": fuzz_target.base_model, "prompt": "hi", "max_tokens": 2}
    with httpx.Client(base_url=fuzz_target.base_url, headers=headers, timeout=30) as client:
        for field, value in (
            ("logprobs", True),
            ("n", "2"),
            ("temperature", "0.5"),
            ("seed", False),
            ("stream", 0),
            ("echo", "no"),
        ):
            answer = client.post("/v1/completions", json={**base, field: value})
            assert answer.status_code == 400, (field, answer.text)
            assert answer.json()["error"]["param"] == field
        # A JSON integer may be written 16.0, and a number 1.
        answer = client.post("/v1/completions", json={**base, "max_tokens": 2.0, "temperature": 1})
        assert answer.status_code == 200, answer.text


def test_times_are_rfc3339_not_unix_numbers(fuzz_target: FuzzTarget) -> None:
    # `?to=-8.1e-196` was read as a Unix time (1970) and answered 200.
    with _admin(fuzz_target) as admin:
        answer = admin.get("/tenants/fuzz-victim/usage", params={"to": "-8.1e-196"})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "to"
        answer = admin.post("/tenants/fuzz-victim/keys", json={"expires_at": 1700000000})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "expires_at"
        answer = admin.get("/tenants/fuzz-victim/usage", params={"from": "2026-01-01T00:00:00Z"})
        assert answer.status_code == 200, answer.text
