"""The rows of the suite: who attacks, with what quota, sending what.

Attacks 1-3 are issue #23's, each as it was first reported (the tenant held to one request
a minute) and with limits generous enough that the gateway's own bounds are all that stands
in the way; then a slow reader, and output constraints the engine has to compile; then
issue #48's count far past its bound, which the gateway must refuse before anything compiles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tools.abuse.attacks import AttackPlan
from tools.abuse.gateway import GENEROUS
from tools.abuse.payloads import (
    chat_payload,
    constrained_bodies,
    counted_bodies,
    encoded,
    many_messages_body,
    prose,
)
from tools.abuse.wire import http_request, json_post

STAND_IN = "stand-in"
ENGINE = "engine"

CAPPED = {"requests_per_minute": 1, "max_concurrent_requests": 1}
"""Attacks 1 and 2 as first reported: a tenant held to one request a minute, one at a time."""

CHAT = "/v1/chat/completions"
HUGE_PROMPT_CHARS = 3_000_000
LONG_PROMPT_CHARS = 150_000
"""Long, but not refused unread: under the longest a prompt may be and still fit the context
(SmolLM2's longest token is 81 bytes: 81 x 2047 = 165,807 characters at max_model_len 2048),
so the tokenizer's thread works through all of it before the context check refuses it."""

BODY_BYTES = int(7.9 * (1 << 20))  # under max_request_bytes (8 MiB): read, not refused unread
BODY_MESSAGES = 134_000
MESSAGES_BOUND = 4096  # app/protocol/requests.py's MAX_MESSAGES

FLOOD_SOURCES = tuple(f"127.0.0.{n}" for n in range(2, 10))
"""Eight client addresses: a flood spread so that the per-address cap
(max_connections_per_source, 256) does not stop it alone; the deadlines must."""


@dataclass(frozen=True)
class Target:
    port: int
    key: str  # the attacker's ("" for an attacker without one)
    model: str


@dataclass(frozen=True)
class Row:
    name: str
    engine: str  # STAND_IN or ENGINE
    attack: str  # what the table says of it
    attacker_quota: dict[str, Any] | None  # None: the attacker has no key
    plan: Callable[[Target], AttackPlan]
    # The victim's attacked phase is spread over at least this: long enough for the attack's
    # rhythm and the gateway's deadlines (10 s for a request head, 30 s for a stalled reader).
    attack_seconds: float = 10.0
    ramp_seconds: float = 1.0


def _tokenizer_capped(t: Target) -> AttackPlan:
    prompt = encoded(chat_payload(t.model, prose(HUGE_PROMPT_CHARS)))
    return AttackPlan("flood", t.port, (json_post(CHAT, prompt, port=t.port, key=t.key),))


def _tokenizer_generous(t: Target) -> AttackPlan:
    prompts = [encoded(chat_payload(t.model, prose(LONG_PROMPT_CHARS, seed=s))) for s in range(4)]
    requests = tuple(json_post(CHAT, p, port=t.port, key=t.key) for p in prompts)
    return AttackPlan("flood", t.port, requests, concurrency=8)


def _one_short_request(t: Target) -> bytes:
    return json_post(CHAT, chat_payload(t.model, "Hi."), port=t.port, key=t.key)


def _body_capped(t: Target) -> AttackPlan:
    body = many_messages_body(t.model, BODY_MESSAGES, BODY_BYTES)
    return AttackPlan(
        "flood",
        t.port,
        (json_post(CHAT, body, port=t.port, key=t.key),),
        warm_up=(_one_short_request(t),),
    )


def _body_generous(t: Target) -> AttackPlan:
    """At both bounds (as many messages as allowed, as large a body), and as many messages
    with a prompt long but short of refused unread: read, parsed, templated, tokenised."""
    largest = many_messages_body(t.model, MESSAGES_BOUND, BODY_BYTES)
    templated = many_messages_body(t.model, MESSAGES_BOUND, LONG_PROMPT_CHARS)
    requests = tuple(json_post(CHAT, b, port=t.port, key=t.key) for b in (largest, templated))
    return AttackPlan("flood", t.port, requests)


def _unauthenticated_trickle(t: Target) -> AttackPlan:
    # Part of a request line, then a byte a second, never ending it.
    return AttackPlan(
        "trickle",
        t.port,
        (b"GET /v1/models?",),
        concurrency=1100,
        sources=FLOOD_SOURCES,
        drip=b"a",
    )


def _slowloris(t: Target) -> AttackPlan:
    # A whole head with a valid key, then the body a byte a second.
    head = http_request(
        "POST",
        CHAT,
        port=t.port,
        body=b"{",
        headers={"Authorization": f"Bearer {t.key}", "Content-Type": "application/json"},
        declared_length=100_000,
    )
    return AttackPlan(
        "trickle", t.port, (head,), concurrency=1000, sources=FLOOD_SOURCES[:4], drip=b" "
    )


def _slow_reader(t: Target) -> AttackPlan:
    # Four choices of 1,900 tokens, over a megabyte a stream; 15 of them, 60 sequences, fit
    # the fair scheduler's window for one tenant (max_num_seqs 64), so all are streaming at
    # once.
    stream = chat_payload(t.model, "Write a long story.", max_tokens=1900, n=4, stream=True)
    return AttackPlan(
        "slow-read",
        t.port,
        (json_post(CHAT, stream, port=t.port, key=t.key),),
        concurrency=15,
        hold_seconds=45.0,
    )


def _constrained(kind: str) -> Callable[[Target], AttackPlan]:
    def plan(t: Target) -> AttackPlan:
        bodies = constrained_bodies(kind, t.model, 64, max_tokens=16)
        requests = tuple(json_post(CHAT, b, port=t.port, key=t.key) for b in bodies)
        return AttackPlan("flood", t.port, requests, request_timeout=120.0)

    return plan


def _counted(t: Target) -> AttackPlan:
    requests = tuple(json_post(CHAT, b, port=t.port, key=t.key) for b in counted_bodies(t.model))
    return AttackPlan("flood", t.port, requests)


ROWS = (
    Row(
        "tokenizer-capped",
        STAND_IN,
        "1: ~3 MB prompts, 4 at a time, tenant at 1 request/min and 1 concurrent",
        CAPPED,
        _tokenizer_capped,
    ),
    Row(
        "tokenizer-generous",
        STAND_IN,
        "1: 150 KB prompts that pass the length pre-check, 8 at a time, generous limits",
        GENEROUS,
        _tokenizer_generous,
    ),
    Row(
        "body-capped",
        STAND_IN,
        "2: 7.9 MiB bodies of 134k messages, 4 at a time, tenant past its 1 request/min",
        CAPPED,
        _body_capped,
    ),
    Row(
        "body-generous",
        STAND_IN,
        "2: 4096-message bodies (7.9 MiB; 150 KB of text), 4 at a time, generous limits",
        GENEROUS,
        _body_generous,
    ),
    Row(
        "connections-unauthenticated",
        STAND_IN,
        "3: 1,100 connections from 8 addresses trickling a request line, no key",
        None,
        _unauthenticated_trickle,
        attack_seconds=15.0,
        ramp_seconds=3.0,
    ),
    Row(
        "slowloris",
        STAND_IN,
        "3: 1,000 connections from 4 addresses, a valid key, the body a byte a second",
        GENEROUS,
        _slowloris,
        attack_seconds=15.0,
        ramp_seconds=3.0,
    ),
    Row(
        "slow-reader",
        STAND_IN,
        "15 streams of 4 x 1,900 tokens read to their status line, then not at all",
        GENEROUS,
        _slow_reader,
        attack_seconds=40.0,
        ramp_seconds=2.0,
    ),
    Row(
        "constraint-regex",
        ENGINE,
        "structured_outputs.regex: long counted repetitions, deep nesting, 32 KB alternations;"
        " 4 at a time",
        GENEROUS,
        _constrained("regex"),
        attack_seconds=15.0,
        ramp_seconds=2.0,
    ),
    Row(
        "constraint-grammar",
        ENGINE,
        "structured_outputs.grammar: 32 KB rule chains, counted repetitions, ambiguity;"
        " 4 at a time",
        GENEROUS,
        _constrained("grammar"),
        attack_seconds=15.0,
        ramp_seconds=2.0,
    ),
    Row(
        "constraint-json",
        ENGINE,
        "structured_outputs.json: schemas 32 deep, distinct length bounds, long arrays;"
        " 4 at a time",
        GENEROUS,
        _constrained("json"),
        attack_seconds=15.0,
        ramp_seconds=2.0,
    ),
    Row(
        "constraint-counts",
        ENGINE,
        "#48: maxItems 10,000,000 in 177 bytes, through structured_outputs, response_format and"
        " a forced call; 4 at a time",
        GENEROUS,
        _counted,
        attack_seconds=15.0,
        ramp_seconds=2.0,
    ),
)

ROWS_BY_NAME = {row.name: row for row in ROWS}
