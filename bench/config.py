"""What one benchmark run measures: systems, rounds, scenarios and their sizes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.workload import Mix, WorkloadSpec

# The systems a run can compare, by the names the report uses.
GATEWAY = "gateway"  # our gateway, its admission scheduler on
GATEWAY_FCFS = "gateway-fcfs"  # our gateway, LORA_GATEWAY_SCHEDULER=fcfs
VLLM = "vllm"  # vLLM's OpenAI server with our plugin's ops: the reference
VLLM_SHIPPED = "vllm-shipped"  # vLLM's OpenAI server as shipped (ISOLATION_FIX=0)
SYSTEMS = (GATEWAY, GATEWAY_FCFS, VLLM, VLLM_SHIPPED)
# What the targets compare. vLLM's shipped ops are for a run that names them: no target reads
# them, and on a CPU they take hours at these sizes.
TARGET_SYSTEMS = (GATEWAY, GATEWAY_FCFS, VLLM)
REFERENCE = VLLM


def saturation_point(concurrency: int) -> str:
    return f"a: saturation, concurrency {concurrency}"


def curve_point(fraction: float) -> str:
    return f"a: open loop at {fraction:.0%} of saturation"


SOLO = "b: tenant B alone"
FLOOD = "b: tenant B under A's flood"
ONE_ADAPTER = "c: 1 adapter"


def many_adapters_point(count: int) -> str:
    return f"c: {count} adapters"


# Scenario (f), batches (bench/batches.py): one gateway, the batch tenant's lines and (a)'s
# interactive tenants.
BATCH_SATURATION = "f: (a) at saturation"
BATCH_ONLINE = "f: the batch's lines sent online at saturation"
BATCH_ALONE = "f: the batch alone"
BATCH_BESIDE = "f: the batch beside the interactive load"
INTERACTIVE_WITH = "f: interactive load with the batch"
INTERACTIVE_WITHOUT = "f: interactive load without the batch"
CAPACITY_LEFT = "f: the capacity the interactive load leaves"

CLIFF_POPULARITIES = ("zipf", "uniform")


def cliff_saturation_point(slots: int) -> str:
    return f"d: saturation, {slots} adapters on {slots} slots"


def cliff_point(popularity: str, adapters: int, slots: int) -> str:
    if adapters <= slots:  # no adapter waits for a slot, whatever the popularity: one point
        return f"d: {adapters} adapters on {slots} slots"
    return f"d: {popularity}, {adapters} adapters on {slots} slots"


@dataclass(frozen=True)
class BenchConfig:
    """The default sizes keep a round of the target systems under 45 minutes on a 2-core CPU
    machine; on a GPU, raise them."""

    systems: tuple[str, ...] = TARGET_SYSTEMS
    rounds: int = 3
    max_loras: int = 4
    seed: int = 0
    draws: int = 2000  # bootstrap draws per interval
    # (a) many adapters, Zipf popularity, at saturation
    adapters: int = 32
    zipf: float = 1.0
    base_share: float = 0.2
    output_tokens: int = 32
    concurrencies: tuple[int, ...] = (16, 64)
    waves: int = 2  # a closed loop sends waves x concurrency requests
    # (a) open-loop latency against offered load: fractions of the saturation
    # throughput (req/s) that the first system measured at the highest concurrency
    # in round 1; every system then gets the same absolute rates.
    curve_fractions: tuple[float, ...] = (0.5, 1.0)
    curve_requests: int = 24  # per rate (its arrivals last curve_requests / rate s)
    # (b) noisy neighbour: tenant A floods, tenant B sends one request at a time
    flood_streams: int = 128
    flood_tokens: int = 32
    victim_requests: int = 6  # under FCFS's flood, each waits behind A's queue
    victim_tokens: int = 8
    # (c) many registered adapters (0: skipped), on the gateway only
    registered: int = 1000
    registered_tenants: int = 16
    registered_concurrency: int = 16
    registered_requests: int = 64
    # Device slots for (c), both points (0: the concurrency). An operator serving 1,000
    # adapters sizes max_loras to the batch, as S-LoRA's batches hold an adapter per request;
    # with (a)'s 4 slots, a batch over Zipf traffic runs about 4 of its 16 requests at once,
    # and (c) would measure vLLM's slot count, not what 1,000 registered adapters cost.
    registered_max_loras: int = 0
    # (d) the cold-start cliff, on (a)'s engine (max_loras slots, a host cache of
    # max_cpu_loras): open loops over adapters = slots and multiples of them, at a share of
    # the saturation rate over adapters = slots that the round's first system measured, the
    # same absolute rate for every system of the round (empty multiples: skipped)
    cliff_multiples: tuple[int, ...] = (1, 2, 8)
    cliff_popularities: tuple[str, ...] = CLIFF_POPULARITIES
    cliff_load: float = 0.7
    cliff_concurrency: int = 16  # of the closed loop that measures saturation
    cliff_requests: int = 24  # per open-loop point
    cliff_prompt_tokens: int = 128
    cliff_output_tokens: int = 64
    # More LORA_GATEWAY_* settings for every gateway of the run (name without the prefix).
    gateway_settings: tuple[tuple[str, str], ...] = ()
    timeout_seconds: float = 1800.0  # longest a point may run
    out: Path = Path("bench/results")
    adapter_cache: Path = Path("var/bench/adapters")
    registered_cache: Path = Path("var/bench/adapters-rank8")

    def __post_init__(self) -> None:
        unknown = set(self.systems) - set(SYSTEMS)
        if unknown or not self.systems:
            raise ValueError(f"systems must be among {', '.join(SYSTEMS)}; got {unknown or 'none'}")
        if self.rounds < 1 or self.waves < 1 or not self.concurrencies:
            raise ValueError("rounds, waves and concurrencies must be positive")
        if self.adapters < 2:
            raise ValueError("the noisy-neighbour tenants need two adapters")
        if any(not 0 < f <= 2 for f in self.curve_fractions):
            raise ValueError("curve fractions are shares of saturation in (0, 2]")
        if self.cliff_multiples:
            if 1 not in self.cliff_multiples or min(self.cliff_multiples) < 1:
                raise ValueError("cliff multiples are whole multiples of the slots, 1 among them")
            if max(self.cliff_multiples) * self.max_loras > self.adapters:
                raise ValueError("the cliff's largest multiple of max_loras exceeds the adapters")
            if set(self.cliff_popularities) - set(CLIFF_POPULARITIES) or not (
                0 < self.cliff_load <= 2
            ):
                raise ValueError(f"cliff popularities among {CLIFF_POPULARITIES}, load in (0, 2]")

    @classmethod
    def quick(cls) -> BenchConfig:
        """One round of a subset: the gateway against vLLM's server with the same
        ops, scenarios a (one concurrency, no curve) and b, small sizes."""
        return cls(
            systems=(GATEWAY, VLLM),
            rounds=1,
            adapters=8,
            concurrencies=(16,),
            waves=2,
            curve_fractions=(),
            flood_streams=100,
            flood_tokens=16,
            victim_requests=5,
            registered=0,
            cliff_multiples=(),
        )

    def mix(self) -> Mix:
        return Mix(self.adapters, self.zipf, self.base_share, self.output_tokens, self.seed)

    def curve_spec(self, rate: float) -> WorkloadSpec:
        return WorkloadSpec(
            self.adapters, self.zipf, self.base_share, self.output_tokens, self.seed,
            rate=rate, duration=self.curve_requests / rate,
        )  # fmt: skip

    @property
    def registered_slots(self) -> int:
        return self.registered_max_loras or self.registered_concurrency

    def registered_mix(self, adapters: int) -> Mix:
        return Mix(adapters, self.zipf, 0.0, self.output_tokens, self.seed)

    def cliff_mix(self, adapters: int, popularity: str = "zipf") -> Mix:
        zipf = self.zipf if popularity == "zipf" else 0.0  # exponent 0: every adapter alike
        return Mix(adapters, zipf, 0.0, self.cliff_output_tokens, self.seed)

    def cliff_points(self, slots: int) -> dict[str, tuple[str, int]]:
        """(d)'s open-loop points, name -> (popularity, adapters), each once: over as many
        adapters as slots, popularity changes nothing, so that point is measured once."""
        return {
            cliff_point(popularity, multiple * slots, slots): (popularity, multiple * slots)
            for popularity in self.cliff_popularities
            for multiple in sorted(self.cliff_multiples)
        }

    def cliff_spec(self, adapters: int, popularity: str, rate: float) -> WorkloadSpec:
        mix = self.cliff_mix(adapters, popularity)
        return WorkloadSpec(
            mix.adapters, mix.zipf, 0.0, mix.output_tokens, mix.seed,
            rate=rate, duration=self.cliff_requests / rate,
        )  # fmt: skip
