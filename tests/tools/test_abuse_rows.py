"""The suite's rows: every attack builds its plan, sends with the attacker's key where it has
one, and the trickles never finish what they start."""

from __future__ import annotations

import json

import pytest

from tools.abuse.rows import CAPPED, ENGINE, ROWS, ROWS_BY_NAME, STAND_IN, Target

TARGET = Target(port=8123, key="attacker-key", model="SmolLM2-135M-Instruct")


def test_the_rows_cover_the_issues_attacks_on_the_engines_they_need() -> None:
    assert len(ROWS_BY_NAME) == len(ROWS)
    for name in ("tokenizer-capped", "tokenizer-generous", "body-capped", "body-generous"):
        assert ROWS_BY_NAME[name].engine == STAND_IN
    assert ROWS_BY_NAME["tokenizer-capped"].attacker_quota == CAPPED
    assert ROWS_BY_NAME["connections-unauthenticated"].attacker_quota is None
    constraint_rows = [row for row in ROWS if row.name.startswith("constraint-")]
    assert {row.engine for row in constraint_rows} == {ENGINE}
    assert len(constraint_rows) == 4


def test_the_counts_row_sends_the_red_teams_177_bytes_first() -> None:
    target = Target(port=8123, key="attacker-key", model="legal_advisor")
    plan = ROWS_BY_NAME["constraint-counts"].plan(target)
    assert len(_body(plan.requests[0])) == 177
    bodies = [json.loads(_body(request)) for request in plan.requests]
    assert bodies[0]["structured_outputs"]["json"]["maxItems"] == 10_000_000
    assert {"structured_outputs", "response_format", "tools"} == {
        next(key for key in body if key not in ("model", "messages", "max_tokens"))
        for body in bodies
    }


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_every_row_builds_a_plan_against_the_target(row: object) -> None:
    plan = ROWS_BY_NAME[row.name].plan(TARGET)  # type: ignore[attr-defined]
    assert plan.port == TARGET.port and plan.requests
    for request in plan.requests:
        head = request.split(b"\r\n\r\n", 1)[0]
        if plan.kind == "trickle" and b"\r\n" not in head:
            continue  # part of a request line: nothing more
        keyed = b"Authorization: Bearer attacker-key" in head
        assert keyed == (row.attacker_quota is not None)  # type: ignore[attr-defined]
    if plan.kind == "trickle":
        # Nothing it sends ever completes a request: not the head, not the declared body.
        assert all(
            not r.endswith(b"\r\n\r\n") or int(_header(r, b"Content-Length")) > len(_body(r))
            for r in plan.requests
        )


def _header(request: bytes, name: bytes) -> bytes:
    for line in request.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(name.lower() + b":"):
            return line.split(b":", 1)[1].strip()
    raise KeyError(name)


def _body(request: bytes) -> bytes:
    return request.split(b"\r\n\r\n", 1)[1]


def test_the_capped_body_attack_spends_its_quota_first_then_sends_what_was_reported() -> None:
    plan = ROWS_BY_NAME["body-capped"].plan(TARGET)
    assert len(plan.warm_up) == 1
    body = json.loads(_body(plan.requests[0]))
    assert len(body["messages"]) == 134_000
    assert len(_body(plan.requests[0])) == int(7.9 * (1 << 20))
