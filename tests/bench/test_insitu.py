"""The in-situ profile's accounting: each sample to the first account whose frame is on its
stack, per process and (point, system), summed over rounds."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bench.client import RequestRecord
from bench.insitu import OTHER, Profile, read_folded, summary
from bench.stats import Sample

LOOP = ";".join(
    [
        "<module> (<string>:1)",
        "WorkerProc.worker_busy_loop (vllm/v1/executor/multiproc_executor.py:1041)",
    ]
)
GEMM = ";".join(
    [
        LOOP,
        "LlamaMLP.forward (vllm/model_executor/models/llama.py:119)",
        "cpu_unquantized_gemm (vllm/model_executor/layers/utils.py:617)",
    ]
)
PREPARE = ";".join(
    [
        LOOP,
        "PlannedPunicaWrapper.add_lora_linear (app/inside_vllm/punica_wrapper.py:443)",
        "PreparedLoRA.of (app/inside_vllm/lora_weights.py:235)",
    ]
)
PRODUCTS = f"{LOOP};_lora_linear (app/inside_vllm/punica_wrapper.py:279)"
ADAPTERS = f"{LOOP};LRUCacheWorkerLoRAManager.set_active_adapters (vllm/lora/worker_manager.py:80)"
LOAD = ";".join(
    [
        ADAPTERS,
        "LRUCacheWorkerLoRAManager.add_adapter (vllm/lora/worker_manager.py:260)",
        "WorkerLoRAManager._load_adapter (vllm/lora/worker_manager.py:140)",
    ]
)
ACTIVATE = ";".join(
    [
        ADAPTERS,
        "LRUCacheWorkerLoRAManager.add_adapter (vllm/lora/worker_manager.py:270)",
        "LoRAModelManager.activate_adapter (vllm/lora/model_manager.py:389)",
    ]
)


def test_folded_stacks_are_read_with_their_counts(tmp_path: Path) -> None:
    path = tmp_path / "worker.txt"
    path.write_text(f"{GEMM} 7\n{PREPARE} 2\n{GEMM} 1\n\n")
    assert read_folded(path) == Counter({GEMM: 8, PREPARE: 2})
    # A profiler stopped while it wrote leaves a last line of memory, not a count.
    path.write_bytes(f"{GEMM} 7\n{PREPARE} 3(\x00\x01".encode() + b"\xe0\xab\x80 \xff\x00\n")
    assert read_folded(path) == Counter({GEMM: 7})


def test_a_sample_goes_to_the_first_account_on_its_stack() -> None:
    profile = Profile(
        "c: 1000 adapters",
        "gateway",
        "Worker",
        Counter({GEMM: 5, PREPARE: 3, PRODUCTS: 2, LOOP: 1, LOAD: 4, ACTIVATE: 6, ADAPTERS: 1}),
    )
    assert profile.accounted() == Counter(
        {
            "base model matmuls": 5,
            "adapter loads from storage": 4,
            "adapter activations": 6,
            "the step's adapters, the rest": 1,
            # under the wrapper's frame too, but preparing comes first
            "our ops: preparing a changed slot": 3,
            "our ops: the LoRA products": 2,
            OTHER: 1,
        }
    )
    assert profile.samples == 22


def test_the_summary_sums_rounds_per_point_and_system() -> None:
    profiles = [
        Profile("c: 1 adapter", "gateway", "Worker", Counter({GEMM: 6})),
        Profile("c: 1000 adapters", "gateway", "Worker", Counter({GEMM: 6, PREPARE: 2})),
        Profile("c: 1 adapter", "gateway", "Worker", Counter({GEMM: 4})),
    ]
    text = summary(profiles)
    assert "| c: 1 adapter, gateway | c: 1000 adapters, gateway |" in text
    assert "| base model matmuls | 10 (100%) | 6 (75%) |" in text
    assert "| our ops: preparing a changed slot | 0 (0%) | 2 (25%) |" in text
    assert "| all samples | 10 | 8 |" in text


def test_the_summary_opens_with_each_points_output() -> None:
    def run(point: str, seconds: float, tokens: int) -> Sample:
        records = (RequestRecord("gateway", point, 0, 0, "m", 0.0, output_tokens=tokens),)
        return Sample("gateway", point, 0, records, seconds)

    runs = [
        run("c: 1 adapter", 10.0, 320),
        run("c: 1 adapter", 6.0, 320),
        run("c: 1000 adapters", 8.0, 320),
    ]
    text = summary([], runs)
    assert "| c: 1 adapter, gateway | 2 | 16.0 | 640 | 40.0 |" in text
    assert "| c: 1000 adapters, gateway | 1 | 8.0 | 320 | 40.0 |" in text
