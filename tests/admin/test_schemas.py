"""Admin request models: names and paths that would fail later are refused up front."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from app.admin import schemas
from app.errors import BadRequestError

BASE = "SmolLM2-135M-Instruct"


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("a\u0000b", "control characters such as NUL"),
        ("legal\nadvisor", "control characters"),
        ("", "at least 1 character"),
        ("x" * 1025, "at most 1024 characters"),
    ],
)
def test_registration_path_is_refused_naming_path(path: str, match: str) -> None:
    body = json.dumps({"name": "legal", "path": path})  # as the route reads it
    with pytest.raises(ValidationError) as caught:
        schemas.AdapterRegister.model_validate_json(body)
    (error,) = caught.value.errors()
    assert error["loc"] == ("path",) and match in error["msg"]


def test_ordinary_registration_paths_pass() -> None:
    for path in ("legal_advisor", "team a/legal v2", "é/ü"):
        assert schemas.AdapterRegister(name="legal", path=path).path == path


@pytest.mark.parametrize(
    "alias", ["legal", "ft:smollm2:acme:legal@2", "Legal_Advisor-v1.2", "a" * 100, "7"]
)
def test_valid_grant_aliases(alias: str) -> None:
    assert schemas.check_grant_alias(alias, BASE) == alias


@pytest.mark.parametrize(
    ("alias", "match"),
    [
        ("a" * 300, r"'aaaa.*\.\.\. \(300 characters\)': an alias is 1 to 100"),
        ("a" * 101, "an alias is 1 to 100"),
        ("", "an alias"),
        ("my legal", "an alias"),
        ("legal,medical", "an alias"),
        ("org/legal", "an alias"),
        ("legal\n", "an alias"),
        ("legal\u0000", "an alias"),
        ("-legal", "an alias"),
        ("légal", "an alias"),
        (BASE, "is the base model's id"),
    ],
)
def test_bad_grant_aliases_are_a_400_naming_alias(alias: str, match: str) -> None:
    with pytest.raises(BadRequestError, match=match) as caught:
        schemas.check_grant_alias(alias, BASE)
    assert caught.value.param == "alias" and caught.value.status_code == 400


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"weight": 0}, "weight"),
        ({"weight": 1001}, "weight"),
        ({"weight": "2"}, "weight"),
        ({"weight": 1.5}, "weight"),
        ({"priority": "urgent"}, "priority"),
        ({"priority": 1}, "priority"),
        ({"slo_ttft_ms": -1}, "slo_ttft_ms"),
        ({"slo_ttft_ms": 86_400_001}, "slo_ttft_ms"),
        ({"slo_tpot_ms": 50.5}, "slo_tpot_ms"),
        ({"slo_tpot_ms": "50"}, "slo_tpot_ms"),
    ],
)
def test_bad_scheduling_attributes_are_refused_naming_the_field(
    body: dict[str, object], field: str
) -> None:
    for model, base in (
        (schemas.TenantCreate, {"id": "acme", "name": "ACME"}),
        (schemas.TenantUpdate, {}),
    ):
        with pytest.raises(ValidationError) as caught:
            model.model_validate_json(json.dumps({**base, **body}))
        assert {error["loc"][0] for error in caught.value.errors()} == {field}


def test_scheduling_attributes_default_to_one_share_interactive() -> None:
    created = schemas.TenantCreate(id="acme", name="ACME")
    assert (created.weight, created.priority) == (1, "interactive")
    assert schemas.TenantUpdate(weight=3, priority="batch").model_dump(exclude_none=True) == {
        "weight": 3,
        "priority": "batch",
    }
