"""The slot turns on a simulated clock: vLLM's own scheduler, and ours over it, stepped with no
model, each step's time drawn from a cost model, so that a rule is judged over dozens of seeds
in seconds where the real engine takes minutes a run (docs/scheduling.md, "Judged on a
simulated clock").

The schedulers are the real ones (vLLM's ``Scheduler`` and
:class:`~app.inside_vllm.slot_sharing.SlotSharingScheduler`, built as the engine core builds
them); what is simulated is the engine's work: each step takes ``base + per_token x tokens``
seconds, plus ``activation`` for each adapter it runs that none of the device slots held (an
LRU of ``max_loras``), with noise. A closed loop of ``concurrency`` clients, each sending its
next request as its last ends, or an open loop at ``rate``, draws adapters uniformly or by
Zipf; every request counts against the objectives as `vllm bench serve` counts them (TTFT from
its arrival, TPOT over its life after the first token). The same seed runs both schedulers.
It measures the scheduling rules, not the gateway: the front's admission and the API
server's costs are not in it. Run: ``python -m bench.turn_sim --seeds 20``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import types
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from vllm.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from app.inside_vllm import slot_sharing
from app.inside_vllm.objectives import Objectives
from app.metrics import SLOT_TURNS
from app.settings import EMBEDDED_MODEL_DIR

BLOCK = 32


@dataclass(frozen=True)
class Costs:
    """A step's time on the simulated engine, in seconds. The defaults are fitted to the
    embedded model with all-projection adapters on the 2-core machine: ~100 ms a step that
    decodes four streams, 9,216 tokens in 523 steps over 71 s (turn-ab-20261207T175351Z); a
    slot change there is an activation (~15 ms) and, past the host tier's 8 adapters, a load
    (20-40 ms), by the gateway's own counters."""

    base: float = 0.086
    per_token: float = 0.0028
    activation: float = 0.04
    noise: float = 0.05  # the step's time is multiplied by 1 +- this, uniformly

    def step(self, tokens: int, activations: int, rng: random.Random) -> float:
        seconds = self.base + self.per_token * tokens + self.activation * activations
        return seconds * (1 + rng.uniform(-self.noise, self.noise))


@dataclass(frozen=True)
class Load:
    adapters: int = 32
    zipf: float = 0.0  # 0: uniform
    concurrency: int = 16
    rate: float = 0.0  # requests a second, sent as a Poisson process; 0: a closed loop
    requests: int = 96
    prompt_tokens: int = 64
    output_tokens: int = 32
    max_loras: int = 4
    max_num_seqs: int = 64
    ttft: float = 11.775  # the objectives, in seconds (defaults: the grid's at uniform 8x)
    tpot: float = 0.220


@dataclass
class Outcome:
    """One run: each request's TTFT and TPOT, and which objectives it met, by request id."""

    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    met: dict[str, tuple[bool, bool]] = field(default_factory=dict)  # TTFT's, TPOT's
    wall: float = 0.0
    output: int = 0
    steps: int = 0
    turns: Counter[str] = field(default_factory=Counter)  # by rule
    turn_seconds: float = 0.0  # what our scheduler measured a turn to add to its step

    def count(self, request_id: str, ttft: float, streamed: float, tokens: int, load: Load) -> None:
        """A request that ended: its first token ``ttft`` after it was sent, its others over
        ``streamed`` seconds after that, as `vllm bench serve` counts TPOT."""
        tpot = streamed / (tokens - 1) if tokens > 1 else 0.0
        self.ttft.append(ttft)
        self.tpot.append(tpot)
        self.output += tokens
        self.met[request_id] = ttft <= load.ttft, tpot <= load.tpot

    @property
    def within(self) -> int:
        """The requests that met both objectives."""
        return sum(all(met) for met in self.met.values())

    @property
    def goodput(self) -> float:
        return self.within / self.wall


def placeholder_scheduler(
    options: dict[str, Any],
    *,
    max_loras: int,
    max_num_seqs: int,
    blocks: int,
    max_model_len: int = 1024,
    max_num_batched_tokens: int = 2048,
    asynchronous: bool = False,
) -> Any:
    """The scheduler the engine core builds from ``options`` (:func:`engine_options`) over the
    embedded model's config and a KV cache of ``blocks`` placeholder blocks: nothing is
    computed. ``asynchronous`` schedules as on a GPU (the CPU platform turns it off)."""
    model = ModelConfig(
        model=str(EMBEDDED_MODEL_DIR), dtype="float32", seed=0, skip_tokenizer_init=True
    )
    config = VllmConfig(
        model_config=model,
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            is_encoder_decoder=False,
            scheduler_cls=options.get("scheduler_cls"),
        ),
        cache_config=CacheConfig(block_size=BLOCK),
        lora_config=LoRAConfig(max_loras=max_loras, max_lora_rank=16),
        additional_config=options.get("additional_config", {}),
    )
    config.cache_config.num_gpu_blocks = blocks
    config.scheduler_config.async_scheduling = asynchronous
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache = KVCacheConfig(
        num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    return config.scheduler_config.get_scheduler_cls()(  # type: ignore[call-arg]
        vllm_config=config,
        kv_cache_config=kv_cache,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
    )


def build(load: Load, *, turns: bool) -> Any:
    """vLLM's scheduler, or ours where ``turns``, with room in its KV cache for every request
    at once."""
    tokens = load.prompt_tokens + load.output_tokens
    return placeholder_scheduler(
        slot_sharing.engine_options(0, objectives=turns),
        max_loras=load.max_loras,
        max_num_seqs=load.max_num_seqs,
        blocks=load.max_num_seqs * (-(-tokens // BLOCK) + 1),
    )


class Run:
    """One run of a load on the simulated engine, its clock standing in for the scheduler's."""

    def __init__(self, load: Load, costs: Costs, seed: int, *, turns: bool) -> None:
        self.load, self.costs, self.turns = load, costs, turns
        self.rng = random.Random(seed)
        weights = [1 / (rank + 1) ** load.zipf for rank in range(load.adapters)]
        self.adapters = self.rng.choices(range(1, load.adapters + 1), weights, k=load.requests)
        self.now = self.start = 1_000_000.0
        self.sched = build(load, turns=turns)
        self.objectives = Objectives(interactive=True, ttft=load.ttft, tpot=load.tpot)
        self.sent: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.tokens: Counter[str] = Counter()
        self.slots: OrderedDict[int, None] = OrderedDict()  # the device's, least recent first
        self.outcome = Outcome()

    def __call__(self) -> Outcome:
        load = self.load
        if load.rate:
            arrivals = [self.start]
            while len(arrivals) < load.requests:
                arrivals.append(arrivals[-1] + self.rng.expovariate(load.rate))
        else:
            arrivals = [self.start] * min(load.concurrency, load.requests)
        clock = types.SimpleNamespace(time=lambda: self.now, monotonic=lambda: self.now)
        turns_before = _turns()
        init_none_hash(sha256)
        with mock.patch.object(slot_sharing, "time", clock):
            sent = 0
            while True:
                if not self.sched.has_requests() and sent < len(arrivals):
                    self.now = max(self.now, arrivals[sent])
                while sent < len(arrivals) and arrivals[sent] <= self.now:
                    self.send(sent, arrivals[sent])
                    sent += 1
                if not self.sched.has_requests():
                    break
                for _ in range(self.step()):  # a closed loop's client sends its next
                    if not load.rate and sent < load.requests:
                        self.send(sent, self.now)
                        sent += 1
        self.outcome.wall = self.now - self.start
        self.outcome.turns = _turns() - turns_before
        self.outcome.turn_seconds = getattr(self.sched, "turn_seconds", 0.0)
        return self.outcome

    def send(self, number: int, at: float) -> None:
        request_id = f"r{number}"
        adapter = self.adapters[number]
        self.sent[request_id] = at
        extra_args = self.objectives.extra_args() if self.turns else None
        self.sched.add_request(
            Request(
                request_id=request_id,
                prompt_token_ids=[number + 1] * self.load.prompt_tokens,
                sampling_params=SamplingParams(
                    max_tokens=self.load.output_tokens, ignore_eos=True, extra_args=extra_args
                ),
                pooling_params=None,
                lora_request=LoRARequest(f"a{adapter}", adapter, "/unused"),
                arrival_time=at,
                block_hasher=get_request_block_hasher(BLOCK, sha256),
            )
        )

    def step(self) -> int:
        """One engine step; how many requests it ended."""
        output = self.sched.schedule()
        requests = {r: self.sched.requests[r] for r in sorted(output.num_scheduled_tokens)}
        activations = 0
        for request in requests.values():
            adapter = request.lora_request.lora_int_id
            if adapter in self.slots:
                self.slots.move_to_end(adapter)
                continue
            activations += 1
            self.slots[adapter] = None
            if len(self.slots) > self.load.max_loras:
                self.slots.popitem(last=False)
        self.now += self.costs.step(output.total_num_scheduled_tokens, activations, self.rng)
        self.outcome.steps += 1
        # A request samples a token where the step computed all it has.
        result = ModelRunnerOutput(
            req_ids=list(requests),
            req_id_to_index={r: i for i, r in enumerate(requests)},
            sampled_token_ids=[
                [7] if r.num_computed_tokens >= r.num_tokens else [] for r in requests.values()
            ],
        )
        ended = 0
        for outputs in self.sched.update_from_output(output, result).values():
            for out in outputs.outputs:
                request_id = out.request_id
                if out.new_token_ids:
                    self.first.setdefault(request_id, self.now)
                    self.tokens[request_id] += len(out.new_token_ids)
                if out.finished:
                    first = self.first[request_id]
                    ttft, streamed = first - self.sent[request_id], self.now - first
                    self.outcome.count(
                        request_id, ttft, streamed, self.tokens[request_id], self.load
                    )
                    ended += 1
        return ended


def simulate(load: Load, costs: Costs, seed: int, *, turns: bool) -> Outcome:
    """One run of ``load`` on the simulated engine: vLLM's scheduler, or ours where ``turns``
    (every request carrying the load's objectives)."""
    return Run(load, costs, seed, turns=turns)()


def _turns() -> Counter[str]:
    """The turns taken so far in this process, by rule."""
    return Counter(
        {
            sample.labels["rule"]: int(sample.value)
            for metric in SLOT_TURNS.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        }
    )


def _p50_p99(values: list[float]) -> str:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return f"{statistics.median(values):.1f}, {cuts[98]:.1f}"


def _missed(outcome: Outcome, which: int) -> int:
    return sum(not met[which] for met in outcome.met.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--adapters", type=int, default=Load.adapters)
    parser.add_argument("--zipf", type=float, default=Load.zipf)
    parser.add_argument("--concurrency", type=int, default=Load.concurrency)
    parser.add_argument("--rate", type=float, default=Load.rate, help="0: a closed loop")
    parser.add_argument("--requests", type=int, default=Load.requests)
    parser.add_argument("--ttft-ms", type=float, default=Load.ttft * 1000)
    parser.add_argument("--tpot-ms", type=float, default=Load.tpot * 1000)
    parser.add_argument("--activation-ms", type=float, default=Costs.activation * 1000)
    parser.add_argument("--noise", type=float, default=Costs.noise)
    args = parser.parse_args(argv)
    load = Load(
        adapters=args.adapters,
        zipf=args.zipf,
        concurrency=args.concurrency,
        rate=args.rate,
        requests=args.requests,
        ttft=args.ttft_ms / 1000,
        tpot=args.tpot_ms / 1000,
    )
    costs = Costs(activation=args.activation_ms / 1000, noise=args.noise)
    print(f"{load}\n{costs}\n")
    print(
        "| seed | goodput, ours / vLLM's | turns (first token) | past TTFT, ours / vLLM's "
        "| past TPOT, ours / vLLM's | TTFT p50, p99 (s), ours / vLLM's "
        "| output tok/s, ours / vLLM's |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for seed in range(args.seeds):
        vllm = simulate(load, costs, seed, turns=False)
        ours = simulate(load, costs, seed, turns=True)
        ratio = ours.goodput / vllm.goodput if vllm.goodput else float("inf")
        ratios.append(ratio)
        print(
            f"| {seed} | {ratio:.2f}x | {ours.turns.total()} ({ours.turns['first_token']}) "
            f"| {_missed(ours, 0)} / {_missed(vllm, 0)} | {_missed(ours, 1)} / {_missed(vllm, 1)} "
            f"| {_p50_p99(ours.ttft)} / {_p50_p99(vllm.ttft)} "
            f"| {ours.output / ours.wall:.1f} / {vllm.output / vllm.wall:.1f} |"
        )
    print(
        f"\ngoodput, ours over vLLM's scheduler: median {statistics.median(ratios):.2f}x, "
        f"{min(ratios):.2f}x-{max(ratios):.2f}x, below 1.0x on "
        f"{sum(r < 1 for r in ratios)} of {len(ratios)} seeds"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
