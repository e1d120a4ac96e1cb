"""``make bench-lora``: what mixing adapters in a batch costs on the CPU engine, with vLLM's
own punica ops and with ours, side by side in one run.

Each engine runs in its own process (the ops are chosen when vLLM loads our plugin, so a
process serves one kind): ``vllm`` is vLLM 0.32 as shipped (our plugin's ops switched off),
``ours`` is what the gateway runs, ``no-lora`` the base model without LoRA support, the cost
of one model. Every engine runs the same fixed batches, greedy with ``ignore_eos`` so each
request generates exactly its token count, and each batch is timed after a warm-up:

* base-only: every request on the base model;
* mixed, with 1, 3, 8 and 16 distinct adapters: a quarter of the requests on the base model,
  the rest spread evenly over the adapters (all resident: ``max_loras`` = 16);

in a decode-heavy shape (short prompts, long answers) and a prefill-heavy one (long prompts,
two tokens). Throughput is tokens (prompt + generated) per second; the ratios that matter are
mixed over base-only on the same engine, and ours over vLLM's.

A machine's speed can drift between minutes by more than the effects measured, so each mixed
batch is timed right after a base-only one, ``--repeats`` rounds for our ops (one for vLLM's,
the reference), and a mixed/base ratio is the median of its rounds' ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from app.inside_vllm.plugin import ENV_VAR as ISOLATION_FIX_ENV
from app.settings import EMBEDDED_MODEL_DIR
from bench.random_adapters import make_random_adapter

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_COUNTS = (1, 3, 8, 16)
RANKS = (16, 8)
BASE_SHARE = 0.25
ENGINES: dict[str, dict[str, str]] = {
    "no-lora": {},
    "vllm": {ISOLATION_FIX_ENV: "0"},
    "ours": {ISOLATION_FIX_ENV: "1"},
}
RESULTS_DIR = Path("bench/results")
PERFORMANCE_DOC = Path("docs/performance.md")
DOC_START, DOC_END = "<!-- bench-lora:start -->", "<!-- bench-lora:end -->"


@dataclass(frozen=True)
class Shape:
    name: str
    requests: int
    prompt_tokens: int
    output_tokens: int

    @property
    def tokens(self) -> int:
        return self.requests * (self.prompt_tokens + self.output_tokens)


SHAPES = (
    Shape("decode-heavy", requests=24, prompt_tokens=16, output_tokens=64),
    Shape("prefill-heavy", requests=24, prompt_tokens=128, output_tokens=2),
)


@dataclass(frozen=True)
class Timing:
    engine: str
    shape: str
    adapters: int  # 0: base-only
    seconds: list[float]  # each timed run
    base_seconds: list[float]  # the base-only run timed just before each (none for base-only)
    tokens: int

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / min(self.seconds)

    @property
    def over_base(self) -> float:
        """Throughput over base-only: the median of the rounds' ratios."""
        if not self.base_seconds:
            return 1.0
        return statistics.median(
            b / s for b, s in zip(self.base_seconds, self.seconds, strict=True)
        )


# -- one engine (runs in its own process) --------------------------------------------------------


def _prompts(shape: Shape, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    # Ordinary vocabulary ids: no special tokens, so every prompt is exactly its length.
    return [
        [rng.randrange(1000, 40000) for _ in range(shape.prompt_tokens)]
        for _ in range(shape.requests)
    ]


def _assignment(requests: int, adapters: int) -> list[int | None]:
    """Request -> adapter index (``None``: base model); spread, not sorted, like real traffic."""
    if adapters == 0:
        return [None] * requests
    base = round(requests * BASE_SHARE)
    plan: list[int | None] = [None] * base + [i % adapters for i in range(requests - base)]
    random.Random(adapters).shuffle(plan)
    return plan


def run_engine(engine: str, adapter_dirs: Sequence[Path], repeats: int) -> list[Timing]:
    lora = engine != "no-lora"
    llm, requests = _engine(lora, adapter_dirs)
    counts = ADAPTER_COUNTS if lora else ()
    return [t for shape in SHAPES for t in _measure(llm, engine, shape, requests, counts, repeats)]


def _engine(lora: bool, adapter_dirs: Sequence[Path]) -> tuple[Any, list[Any]]:
    """The engine, and a ``LoRARequest`` per adapter (all resident: one slot each)."""
    from vllm import LLM
    from vllm.lora.request import LoRARequest

    llm = LLM(
        model=str(EMBEDDED_MODEL_DIR),
        dtype="float32",
        max_model_len=1024,
        max_num_seqs=32,
        enable_lora=lora,
        max_loras=len(adapter_dirs) if lora else 1,
        max_cpu_loras=len(adapter_dirs) if lora else None,
        max_lora_rank=max(RANKS),
        kv_cache_memory_bytes=1 << 30,
        enforce_eager=True,
        seed=0,
    )
    requests = [
        LoRARequest(f"adapter-{i}", i + 1, str(path)) for i, path in enumerate(adapter_dirs)
    ]
    return llm, requests


def _measure(
    llm: Any,
    engine: str,
    shape: Shape,
    requests: Sequence[Any],
    counts: Sequence[int],
    repeats: int,
) -> list[Timing]:
    """Base-only, and each adapter count in ``counts`` timed in rounds next to base-only."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in _prompts(shape)]
    params = SamplingParams(max_tokens=shape.output_tokens, temperature=0, ignore_eos=True)

    def timed(plan: list[int | None]) -> float:
        # vLLM takes None for a base-model request in the list; its annotation does not.
        loras = [None if i is None else requests[i] for i in plan]
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        elapsed = time.perf_counter() - started
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
        assert generated == shape.requests * shape.output_tokens, generated
        return elapsed

    base = _assignment(shape.requests, 0)
    timed(base)  # warm-up
    timings, all_base = [], []
    for count in counts:
        plan = _assignment(shape.requests, count)
        timed(plan)  # warm-up: loads the adapters into their slots
        seconds, base_seconds = [], []
        for _ in range(repeats):
            base_seconds.append(timed(base))
            seconds.append(timed(plan))
        all_base += base_seconds
        timing = Timing(engine, shape.name, count, seconds, base_seconds, shape.tokens)
        timings.append(timing)
        print(
            f"  {engine:8s} {shape.name:14s} adapters={count:2d} "
            f"{min(seconds):7.2f} s, {timing.over_base:.2f} x base-only",
            flush=True,
        )
    all_base = all_base or [timed(base) for _ in range(repeats)]
    return [*timings, Timing(engine, shape.name, 0, all_base, [], shape.tokens)]


# -- profiles -------------------------------------------------------------------------------------


def profile_steps(adapter_dirs: Sequence[Path]) -> str:
    """Where a decode step's time goes inside the engine: per step of the decode-heavy
    batch, all of it and our wrapper's LoRA projections (timed around each call), base-only
    and mixed. The engine runs in this process, on one core as its worker would."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from app.inside_vllm.punica_wrapper import PlannedPunicaWrapper

    in_lora = [0.0]
    project = PlannedPunicaWrapper.add_lora_linear

    def timed_projection(self: Any, *args: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        project(self, *args, **kwargs)
        in_lora[0] += time.perf_counter() - started

    PlannedPunicaWrapper.add_lora_linear = timed_projection  # type: ignore[method-assign]
    llm, requests = _engine(True, adapter_dirs)
    shape = SHAPES[0]
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in _prompts(shape)]
    params = SamplingParams(max_tokens=shape.output_tokens, temperature=0, ignore_eos=True)
    lines = [
        f"**{shape.name}**, ms per step ({shape.output_tokens} steps)",
        "",
        "| batch | whole step | LoRA projections | rest of the step |",
        "|---|---:|---:|---:|",
    ]
    for count in (0, *ADAPTER_COUNTS):
        loras = [None if i is None else requests[i] for i in _assignment(shape.requests, count)]
        llm.generate(prompts, params, lora_request=loras, use_tqdm=False)  # warm-up, loads
        in_lora[0] = 0.0
        started = time.perf_counter()
        llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        whole = (time.perf_counter() - started) * 1000 / shape.output_tokens
        lora = in_lora[0] * 1000 / shape.output_tokens
        label = "base-only" if count == 0 else f"mixed, {count} adapter{'s' * (count > 1)}"
        lines.append(f"| {label} | {whole:.0f} | {lora:.1f} | {whole - lora:.0f} |")
    return "\n".join(lines)


def profile_ops(tokens: int, adapters: int, steps: int = 3) -> str:
    """Where one decode step's LoRA time goes in our wrapper: every LoRA projection of the
    model's layers (the real shapes, rank 16 on all seven projections), under torch's
    profiler, next to the base projections' own matmuls for scale."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm.lora.layers.utils import LoRAMapping

    from app.inside_vllm.punica_wrapper import PlannedPunicaWrapper

    config = json.loads((EMBEDDED_MODEL_DIR / "config.json").read_text())
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * config.get(
        "head_dim", hidden // config["num_attention_heads"]
    )
    rank, slots = max(RANKS), max(adapters, 1)
    gen = torch.Generator().manual_seed(0)

    def weights(out: int, inp: int) -> torch.Tensor:
        return torch.randn(slots, 1, out, inp, generator=gen) * 0.01

    # (input width, output slices) of qkv, o, gate_up, down
    projections = [(hidden, (hidden, kv, kv)), (hidden, (hidden,)), (hidden, (inner, inner))]
    projections.append((inner, (hidden,)))
    layers = [
        [
            (
                tuple(weights(rank, width) for _ in outs),
                tuple(weights(out, rank) for out in outs),
                outs,
                torch.randn(sum(outs), width, generator=gen) * 0.01,
            )
            for width, outs in projections
        ]
        for _ in range(config["num_hidden_layers"])
    ]
    wrapper = PlannedPunicaWrapper(8192, 8192, "cpu")
    plan = _assignment(tokens, adapters)
    ids = tuple(0 if i is None else i + 1 for i in plan)
    mapping = LoRAMapping(ids, ids, is_prefill=True)
    wrapper.update_metadata(mapping, list(range(1, slots + 1)), slots, 1)

    def step() -> None:
        for layer in layers:
            for a, b, outs, base in layer:
                x = torch.randn(tokens, base.shape[1])
                with torch.profiler.record_function("base projection"):
                    y = torch.nn.functional.linear(x, base)
                with torch.profiler.record_function("lora (ours)"):
                    wrapper.add_lora_linear(y, x, a, b, 1.0, outs)

    torch.set_num_threads(1)  # as the CPU engine's worker runs
    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return str(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def profile_swaps(slots: int, swaps: int = 9) -> str:
    """What one adapter swap costs our ops in a step that batches ``slots`` adapters, over
    every LoRA projection of the model (the real shapes, rank 16 and 8 alternating on all
    seven projections), timed side by side: a new adapter's slot prepared and the stacked
    weights refilled in place, as the wrapper does; the same with every slot stacked again,
    as it did before; and the slot's previous adapter coming back from the host tier, its
    preparation kept with it."""
    import torch

    from app.inside_vllm.lora_weights import LayerLoRA, PreparedLoRA

    config = json.loads((EMBEDDED_MODEL_DIR / "config.json").read_text())
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * config.get(
        "head_dim", hidden // config["num_attention_heads"]
    )
    rank = max(RANKS)
    gen = torch.Generator().manual_seed(0)
    projections = [(hidden, (hidden, kv, kv)), (hidden, (hidden,)), (hidden, (inner, inner))]
    projections.append((inner, (hidden,)))

    def load(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...], slot: int) -> None:
        used = RANKS[slot % len(RANKS)]  # vLLM writes an adapter into its slot, zero-padded
        for a_i, b_i in zip(a, b, strict=True):
            a_i[slot].zero_()
            b_i[slot].zero_()
            a_i[slot, 0, :used] = torch.randn(used, a_i.shape[-1], generator=gen) * 0.01
            b_i[slot, 0, :, :used] = torch.randn(b_i.shape[2], used, generator=gen) * 0.01

    @dataclass(eq=False)
    class HostAdapter:  # vLLM's host-tier copy, a new object at every load
        id: int

    layers = []
    for _ in range(config["num_hidden_layers"]):
        for width, outs in projections:
            a = tuple(torch.zeros(slots, 1, rank, width) for _ in outs)
            b = tuple(torch.zeros(slots, 1, out, rank) for out in outs)
            for slot in range(slots):
                load(a, b, slot)
            layers.append((a, b, outs, PreparedLoRA()))
    hosts = [HostAdapter(slot + 1) for slot in range(slots)]
    torch.set_num_threads(1)  # as the CPU engine's worker runs

    def activate(slot: int, host: HostAdapter) -> None:
        hosts[slot] = host
        ids = [h.id for h in hosts]
        for _, _, _, prepared in layers:
            prepared.activated(slot, host)
            prepared.assign(ids)

    def step() -> float:
        started = time.perf_counter()
        for a, b, outs, prepared in layers:
            prepared.of(a, b, outs).stacked  # noqa: B018 (a step batched every slot)
        return time.perf_counter() - started

    for slot, host in enumerate(hosts):
        activate(slot, host)
    step()
    refill, again, back = [], [], []
    for swap in range(swaps):
        slot = swap % slots
        leaving = hosts[slot]
        before, held = [], []
        for a, b, outs, prepared in layers:
            layer = prepared.of(a, b, outs)  # as the last step left it
            before.append(LayerLoRA(layer.output_slices, layer.width, layer.slots))
            pairs = zip(a, b, strict=True)
            held.append([(a_i[slot].clone(), b_i[slot].clone()) for a_i, b_i in pairs])
            load(a, b, slot)
        activate(slot, HostAdapter(leaving.id + slots))
        refill.append(step())
        started = time.perf_counter()
        for (a, b, outs, _), kept in zip(layers, before, strict=True):
            LayerLoRA.of(a, b, outs, kept, [slot]).stacked  # noqa: B018 (stacked anew)
        again.append(time.perf_counter() - started)
        for (a, b, _, _), weights in zip(layers, held, strict=True):  # the old one is back
            for a_i, b_i, (a_w, b_w) in zip(a, b, weights, strict=True):
                a_i[slot], b_i[slot] = a_w, b_w
        activate(slot, leaving)
        back.append(step())

    def ratio(num: list[float], den: list[float]) -> str:
        ratios = sorted(n / d for n, d in zip(num, den, strict=True))
        return f"{statistics.median(ratios):.3f} [{ratios[0]:.3f}, {ratios[-1]:.3f}]"

    def ms(times: list[float]) -> str:
        return f"{statistics.median(times) * 1000:.1f} ms"

    return (
        f"one swap among {slots} slots, {len(layers)} LoRA projections, {swaps} swaps "
        f"(medians): a new adapter prepared and refilled in place {ms(refill)}, "
        f"prepared and every slot stacked again {ms(again)} (ratio {ratio(refill, again)}), "
        f"an adapter back from the host tier {ms(back)} (ratio to a new one "
        f"{ratio(back, refill)})"
    )


def profile_loads(adapter_dirs: Sequence[Path], loads: int = 30) -> str:
    """What vLLM's adapter load (``LoRAModel.from_local_checkpoint``, files in the page
    cache) costs with safetensors' reader and with ours (:mod:`app.inside_vllm.adapter_files`),
    the two taking turns over the same adapters."""
    import safetensors
    import torch
    from vllm.lora import lora_model
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    from app.inside_vllm.adapter_files import Safetensors

    readers = {"safetensors": safetensors, "ours": Safetensors(safetensors)}
    times: dict[str, list[float]] = {name: [] for name in readers}
    shipped = lora_model.safetensors  # type: ignore[attr-defined]
    torch.set_num_threads(1)  # as the CPU engine's worker runs
    try:
        for load in range(loads + 2):  # the first two warm up
            path = str(adapter_dirs[load % len(adapter_dirs)])
            helper = PEFTHelper.from_local_dir(path, 8192)
            for name, reader in readers.items():
                lora_model.safetensors = reader  # type: ignore[attr-defined,assignment]
                started = time.perf_counter()
                LoRAModel.from_local_checkpoint(
                    path, set(ALL_PROJECTIONS), helper, lora_model_id=1, device="cpu"
                )
                if load >= 2:
                    times[name].append(time.perf_counter() - started)
    finally:
        lora_model.safetensors = shipped  # type: ignore[attr-defined]
    ratios = sorted(o / s for o, s in zip(times["ours"], times["safetensors"], strict=True))
    return (
        f"{loads} loads of {len(adapter_dirs)} adapters, "
        f"medians: safetensors' reader {statistics.median(times['safetensors']) * 1000:.2f} ms, "
        f"ours {statistics.median(times['ours']) * 1000:.2f} ms, ours / safetensors' "
        f"{statistics.median(ratios):.3f} [{ratios[0]:.3f}, {ratios[-1]:.3f}] (min, max)"
    )


# -- the run: adapters, one process per engine, the report -----------------------------------------


def ensure_adapters(root: Path, count: int) -> list[Path]:
    """``count`` deterministic adapters on all seven projections, ranks 16 and 8 alternating."""
    paths = []
    for index in range(count):
        path = root / f"all-proj-{index:02d}"
        if not (path / "adapter_model.safetensors").is_file():
            make_random_adapter(
                EMBEDDED_MODEL_DIR,
                path,
                rank=RANKS[index % len(RANKS)],
                target_modules=ALL_PROJECTIONS,
                seed=1000 + index,
                b_scale=0.5,
            )
        paths.append(path)
    return paths


def _run_worker(engine: str, adapters: Sequence[Path], repeats: int, out: Path) -> list[Timing]:
    env = {**os.environ, **ENGINES[engine]}
    command = [sys.executable, "-m", "bench.lora", "--engine", engine]
    command += ["--repeats", str(repeats), "--worker-output", str(out), *map(str, adapters)]
    subprocess.run(command, env=env, check=True)
    return [Timing(**row) for row in json.loads(out.read_text())]


def report(timings: Sequence[Timing]) -> str:
    by_key = {(t.engine, t.shape, t.adapters): t for t in timings}
    lines = []
    for shape in SHAPES:
        single = by_key[("no-lora", shape.name, 0)].tokens_per_second
        lines += [
            f"**{shape.name}** ({shape.requests} requests x {shape.prompt_tokens} prompt + "
            f"{shape.output_tokens} generated tokens; base model without LoRA support: "
            f"{single:,.0f} tokens/s)",
            "",
            "| batch | vLLM's ops: tok/s | ours: tok/s | vLLM: x base-only | ours: x base-only "
            "| ours / vLLM |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for count in (0, *ADAPTER_COUNTS):
            theirs = by_key[("vllm", shape.name, count)].tokens_per_second
            ours = by_key[("ours", shape.name, count)].tokens_per_second
            over = {e: by_key[(e, shape.name, count)].over_base for e in ("vllm", "ours")}
            label = "base-only" if count == 0 else f"mixed, {count} adapter{'s' * (count > 1)}"
            lines.append(
                f"| {label} | {theirs:,.0f} | {ours:,.0f} | {over['vllm']:.2f} | "
                f"{over['ours']:.2f} | {ours / theirs:.2f} |"
            )
        lines.append("")
    return "\n".join(lines)


def write_doc(table: str, command: str, stamp: str) -> None:
    section = f"{DOC_START}\n_Measured {stamp} with `{command}`._\n\n{table}{DOC_END}"
    text = PERFORMANCE_DOC.read_text() if PERFORMANCE_DOC.is_file() else ""
    if DOC_START in text and DOC_END in text:
        head, rest = text.split(DOC_START, 1)
        text = head + section + rest.split(DOC_END, 1)[1]
    else:
        text = text + ("\n" if text else "") + section + "\n"
    PERFORMANCE_DOC.parent.mkdir(parents=True, exist_ok=True)
    PERFORMANCE_DOC.write_text(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lora", description=__doc__)
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds per batch for our ops (median ratio)"
    )
    parser.add_argument("--adapter-root", type=Path, default=Path("var/bench/lora-adapters"))
    parser.add_argument("--no-doc", action="store_true", help=f"do not update {PERFORMANCE_DOC}")
    parser.add_argument(
        "--profile",
        metavar="TOKENS,ADAPTERS",
        help="only profile our ops for one batch shape outside the engine, e.g. 24,16",
    )
    parser.add_argument(
        "--profile-steps",
        action="store_true",
        help="only time decode steps in the engine, and our LoRA projections in them",
    )
    parser.add_argument(
        "--profile-swaps",
        metavar="SLOTS",
        type=int,
        help="only time what one adapter swap costs our ops with SLOTS adapters batched",
    )
    parser.add_argument(
        "--profile-loads",
        metavar="LOADS",
        type=int,
        help="only time vLLM's adapter load with safetensors' reader and with ours (of the "
        "adapters given after the options, or of this benchmark's own)",
    )
    parser.add_argument("--engine", choices=sorted(ENGINES), help=argparse.SUPPRESS)
    parser.add_argument("--worker-output", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("adapters", nargs="*", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.profile:
        tokens, count = (int(n) for n in args.profile.split(","))
        print(profile_ops(tokens, count))
        return 0
    if args.profile_steps:
        print(profile_steps(ensure_adapters(args.adapter_root, max(ADAPTER_COUNTS))))
        return 0
    if args.profile_swaps:
        print(profile_swaps(args.profile_swaps))
        return 0
    if args.profile_loads:
        adapters = args.adapters or ensure_adapters(args.adapter_root, max(ADAPTER_COUNTS))
        print(profile_loads(adapters, args.profile_loads))
        return 0
    if args.engine:  # one engine, in this process
        measured = run_engine(args.engine, args.adapters, args.repeats)
        args.worker_output.write_text(json.dumps([asdict(t) for t in measured]))
        return 0

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS_DIR / f"lora-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    adapters = ensure_adapters(args.adapter_root, max(ADAPTER_COUNTS))
    timings: list[Timing] = []
    for engine in ENGINES:
        print(f"engine {engine}:", flush=True)
        repeats = args.repeats if engine == "ours" else 1
        timings += _run_worker(engine, adapters, repeats, out / f"{engine}.json")
    table = report(timings)
    (out / "timings.json").write_text(json.dumps([asdict(t) for t in timings], indent=2))
    (out / "summary.md").write_text(table)
    print("\n" + table)
    if not args.no_doc:
        write_doc(table, "make bench-lora", stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
