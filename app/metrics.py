"""Every Prometheus metric the gateway defines, and the multiprocess plumbing that exports
them from all of the gateway's processes (the gateway, vLLM's engine core and workers) on
one endpoint, as vLLM's own server does (docs/metrics.md, "Across processes").

Contracts: :func:`multiprocess_dir` is entered before the engine's processes are spawned
and before the first sample; every metric carries at least one label (an unlabelled one
would take its storage at import, before the directory exists; ``tests/test_metrics_export.py``
checks it); every metric is listed in :data:`METRICS`, so that a new directory starts empty.
A new metric: define it below, add it to :data:`METRICS`, document it in docs/metrics.md.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from bisect import bisect_left
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, Generic, Literal, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    values,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
# vLLM's own metrics: this process keeps them in memory (:class:`_ValueClass`).
IN_MEMORY_PREFIX: Final = "vllm:"
M = TypeVar("M", bound=MetricWrapperBase)

Tier = Literal["device", "host", "storage"]
CacheTier = Literal["device", "host"]
SwapStage = Literal["load", "activate"]

TIERS: Final[tuple[Tier, ...]] = ("device", "host", "storage")
# The value of lora_gateway_adapter_tier for each tier.
TIER_LEVEL: Final[dict[Tier, int]] = {"storage": 0, "host": 1, "device": 2}
CACHE_TIERS: Final[tuple[CacheTier, ...]] = ("device", "host")
SWAP_STAGES: Final[tuple[SwapStage, ...]] = ("load", "activate")

# From a small adapter's host -> device copy (well under a millisecond) to a
# large adapter read from slow network storage (seconds).
SWAP_BUCKETS_S: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

# -- adapter residency: recorded in vLLM's worker process ----------------------

ADAPTER_USES = Counter(
    "lora_gateway_adapter_uses",
    "Requests naming an adapter, by the tier that held the adapter when the "
    "engine first scheduled the request: device (a slot: hit), host (host "
    "cache, activated into a slot) or storage (loaded).",
    ["tier", "adapter", "version"],
)
ADAPTER_SWAP_SECONDS = Histogram(
    "lora_gateway_adapter_swap_seconds",
    "Time to move one adapter up a tier: load (storage -> host memory) or "
    "activate (host memory -> device slot, device synchronised).",
    ["stage"],
    buckets=SWAP_BUCKETS_S,
)
ADAPTER_EVICTIONS = Counter(
    "lora_gateway_adapter_evictions",
    "Adapters evicted from a tier by LRU capacity pressure (explicit removals excluded).",
    ["tier"],
)
ADAPTERS_RESIDENT = Gauge(
    "lora_gateway_adapters_resident",
    "Adapters resident per tier now: device slots in use, adapters in the host "
    "cache (device-resident ones included).",
    ["tier"],
    multiprocess_mode="livesum",
)

# -- slot turns: recorded in vLLM's engine core process -------------------------
SLOT_TURNS = Counter(
    "lora_gateway_slot_turns",
    "Device slots the engine's scheduler took from a resident adapter for a waiting one, "
    "pausing its running requests, by rule: first_token (a new request would otherwise miss "
    "its TTFT objective; the slot goes back once it has its first token), objective (a "
    "waiting request would otherwise miss its latency objective; for its whole run) or "
    "quantum.",
    ["rule"],
)
HEADROOM_SEATS = Counter(
    "lora_gateway_headroom_seats",
    "Seats the engine's scheduler took back from a running request, of the tenant running "
    "the most, for a request the fair front let in through its headroom while the batch was "
    "full, by how the request was paused: parked (its KV cache kept) or preempted.",
    ["how"],
)
TURN_LEAD_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50)
SLOT_TURN_LEAD_STEPS = Histogram(
    "lora_gateway_slot_turn_lead_steps",
    "Engine steps from a slot turn taken for a waiting request to that request's next token "
    "(its first, for a new one), by the turn's rule: the lead a turn by objective is taken "
    "with must cover it.",
    ["rule"],
    buckets=TURN_LEAD_BUCKETS,
)

# -- requests: recorded in the gateway process ---------------------------------
# Labels hold only registered tenants and the models they were granted (an
# unknown or refused name is recorded as UNKNOWN_MODEL), so cardinality is bounded.

UNKNOWN_MODEL: Final = "(unknown)"
LATENCY_BUCKETS_S: Final = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
TOKEN_GAP_BUCKETS_S: Final = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)

REQUESTS = Counter(
    "lora_gateway_requests",
    "Completion requests by tenant, model (the tenant's alias or the base model), "
    "endpoint and outcome (ok, cancelled, error, or the error code).",
    ["tenant", "model", "endpoint", "status"],
)
PROMPT_TOKENS = Counter(
    "lora_gateway_prompt_tokens",
    "Prompt tokens served (after the chat template).",
    ["tenant", "model"],
)
COMPLETION_TOKENS = Counter(
    "lora_gateway_completion_tokens",
    "Completion tokens generated (cancelled requests too).",
    ["tenant", "model"],
)
TIME_TO_FIRST_TOKEN = Histogram(
    "lora_gateway_time_to_first_token_seconds",
    "From admission to the first generated token.",
    ["tenant", "model"],
    buckets=LATENCY_BUCKETS_S,
)
QUEUE_WAIT = Histogram(
    "lora_gateway_queue_wait_seconds",
    "Time a request waited in the engine's queue before it was first scheduled.",
    ["tenant", "model"],
    buckets=LATENCY_BUCKETS_S,
)
INTER_TOKEN_LATENCY = Histogram(
    "lora_gateway_inter_token_latency_seconds",
    "Time between generated tokens of one request.",
    ["tenant", "model"],
    buckets=TOKEN_GAP_BUCKETS_S,
)
REQUEST_DURATION = Histogram(
    "lora_gateway_request_duration_seconds",
    "From admission to the last token (end-to-end engine latency).",
    ["tenant", "model", "endpoint"],
    buckets=LATENCY_BUCKETS_S,
)
OVERHEAD_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
OVERHEAD = Histogram(
    "lora_gateway_overhead_seconds",
    "Wall time a request spent in the gateway's own code, by phase (app/overhead.py): "
    "authentication, resolution, preparation, engine (the way to the engine and back, every "
    "output included), settlement. The fair queue's wait is not in it.",
    ["role", "phase"],
    buckets=OVERHEAD_BUCKETS_S,
)
# A version label only on aliases served by a split (at most 8 versions each): bounded.
SPLIT_REQUESTS = Counter(
    "lora_gateway_split_requests",
    "Requests to an alias served by a split of adapter versions, by the version that served "
    "them and outcome (ok, cancelled, error).",
    ["tenant", "model", "version", "status"],
)
SPLIT_TIME_TO_FIRST_TOKEN = Histogram(
    "lora_gateway_split_time_to_first_token_seconds",
    "Time to first token of requests to an alias served by a split, by version.",
    ["tenant", "model", "version"],
    buckets=LATENCY_BUCKETS_S,
)
SLO_OUTCOMES = Counter(
    "lora_gateway_slo_outcomes",
    "Requests that ended ok with latency objectives, by class (interactive, batch) and "
    "outcome against them: met, missed_ttft, missed_tpot.",
    ["class", "outcome"],
)
SHADOW_REQUESTS = Counter(
    "lora_gateway_shadow_requests",
    "Shadow requests (a tenant's request run again on a candidate version, answer "
    "discarded) by outcome: ok, error, dropped (no spare capacity), preempted (a request "
    "needed the capacity).",
    ["tenant", "model", "status"],
)
QUOTA_REJECTIONS = Counter(
    "lora_gateway_quota_rejections",
    "Requests refused by a quota, by tenant, limit (requests, tokens, concurrent, "
    "budget, too_large) and scope: whose limit it was, the tenant's or the key's own.",
    ["tenant", "limit", "scope"],
)
QUOTA_UNCHECKED = Counter(
    "lora_gateway_quota_unchecked",
    "Requests admitted without a quota check because the quota store was "
    "unreachable and quota_fail_open is set.",
    ["tenant"],
)
QUOTA_BACKEND_ERRORS = Counter(
    "lora_gateway_quota_backend_errors",
    "Quota store operations (reserve, precheck, reconcile, renew, usage, void, "
    "charge_refused) that failed, by "
    "reason (unreachable, timeout, read_only, out_of_memory, error_reply, unexpected_reply); "
    "each was handled by quota_fail_open.",
    ["operation", "reason"],
)

# -- the usage ledger: recorded in the gateway process -------------------------

USAGE_RECORDS = Counter(
    "lora_gateway_usage_records",
    "Usage records by what became of them: written to the store; dropped (the backlog "
    "reached usage_backlog_max while the store was down); rejected (the store refused the "
    "record itself; logged in full); duplicate (already written); logged (not written at "
    "shutdown; logged in full).",
    ["outcome"],
)
USAGE_PENDING = Gauge(
    "lora_gateway_usage_records_pending",
    "Usage records not yet written: queued, or in the write under way.",
    ["state"],
    multiprocess_mode="livesum",
)

ADAPTER_SWAPS = Counter(
    "lora_gateway_adapter_swaps",
    "Moves of one adapter version up a tier (load or activate); with "
    "lora_gateway_adapter_swap_time_seconds_total, its mean swap time.",
    ["stage", "adapter", "version"],
)
ADAPTER_SWAP_TIME = Counter(
    "lora_gateway_adapter_swap_time_seconds",
    "Time spent moving one adapter version up a tier (load or activate).",
    ["stage", "adapter", "version"],
)
ADAPTER_TIER = Gauge(
    "lora_gateway_adapter_tier",
    "Where an adapter version is now: 2 in a device slot, 1 in the host cache only, "
    "0 in storage only.",
    ["adapter", "version"],
    multiprocess_mode="livemax",
)

# -- fair admission: recorded in the gateway process ----------------------------

SCHEDULER_QUEUE_DEPTH = Gauge(
    "lora_gateway_scheduler_queue_depth",
    "Requests waiting in the gateway for an engine slot, by tenant.",
    ["tenant"],
    multiprocess_mode="livesum",
)
SCHEDULER_QUEUE_WAIT = Histogram(
    "lora_gateway_scheduler_queue_wait_seconds",
    "Time a request waited in the gateway for an engine slot (0 when it found one free).",
    ["tenant"],
    buckets=LATENCY_BUCKETS_S,
)
SCHEDULER_DISPATCHES = Counter(
    "lora_gateway_scheduler_dispatches",
    "Requests let into the engine, by why that one: immediate (a slot was free), "
    "fair_share (its tenant's turn), adapter_affinity (an equal claim whose adapter was "
    "resident or fit went first), age (it waited the adapter-wait bound).",
    ["reason"],
)
SCHEDULER_REJECTIONS = Counter(
    "lora_gateway_scheduler_rejections",
    "Requests refused with 429 by the scheduler, by tenant and reason (queue_full, queue_timeout).",
    ["tenant", "reason"],
)
SCHEDULER_SLOTS = Gauge(
    "lora_gateway_scheduler_slots",
    "The in-flight window: its size (state=window), the sequences in the engine "
    "(state=in_flight), and the engine's latest report of its running batch and its own "
    "queue (state=engine_running, engine_waiting; requests).",
    ["state"],
    multiprocess_mode="livesum",
)

# -- access: recorded in the gateway process -----------------------------------

CONNECTIONS_REFUSED = Counter(
    "lora_gateway_connections_refused",
    "Client connections refused or closed by the connection limits, by reason (server_full, "
    "probes_only, source_full, head_timeout, head_too_large, slow_body, write_timeout).",
    ["reason"],
)

ADMIN_AUTH_FAILURES = Counter(
    "lora_gateway_admin_auth_failures",
    "Admin API requests and console sign-ins refused for a missing or invalid admin token, "
    "by whether an audit record was written (audited: yes, or no when throttled).",
    ["audited"],
)

METRICS: Final[tuple[Counter | Gauge | Histogram, ...]] = (
    ADAPTER_USES,
    ADAPTER_SWAPS,
    ADAPTER_SWAP_TIME,
    ADAPTER_TIER,
    ADAPTER_SWAP_SECONDS,
    ADAPTER_EVICTIONS,
    ADAPTERS_RESIDENT,
    SLOT_TURNS,
    SLOT_TURN_LEAD_STEPS,
    HEADROOM_SEATS,
    REQUESTS,
    PROMPT_TOKENS,
    COMPLETION_TOKENS,
    TIME_TO_FIRST_TOKEN,
    QUEUE_WAIT,
    INTER_TOKEN_LATENCY,
    REQUEST_DURATION,
    OVERHEAD,
    SPLIT_REQUESTS,
    SPLIT_TIME_TO_FIRST_TOKEN,
    SLO_OUTCOMES,
    SHADOW_REQUESTS,
    QUOTA_REJECTIONS,
    QUOTA_UNCHECKED,
    ADMIN_AUTH_FAILURES,
    QUOTA_BACKEND_ERRORS,
    USAGE_RECORDS,
    USAGE_PENDING,
    SCHEDULER_QUEUE_DEPTH,
    SCHEDULER_QUEUE_WAIT,
    SCHEDULER_DISPATCHES,
    SCHEDULER_REJECTIONS,
    SCHEDULER_SLOTS,
    CONNECTIONS_REFUSED,
)


# -- children looked up once ----------------------------------------------------


class Children(Generic[M]):
    """A labelled metric's children by their label values, for writes held until read
    (:func:`held`, :func:`add_held`, :func:`set_held`): each is a :class:`Child` handle, made
    once, whose metric child is made (``labels()``) only when its writes are flushed. In
    multiprocess mode making a child writes a value to the metric's file for each of its
    samples, a histogram's every bucket: the first request of each tenant and model would pay
    for a dozen of them; a scrape pays instead. Follows the metric when its children are
    cleared (a new multiprocess directory: :func:`multiprocess_dir`). Holds as many handles as
    the metric has children."""

    def __init__(self, metric: M) -> None:
        self.metric = metric
        self._of: object = metric._metrics
        self._handles: dict[tuple[str, ...], Child[M]] = {}
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> Child[M]:
        handle = self._handles.get(values)
        if handle is None:
            handle = self._handles[values] = Child(self, values)
        return handle

    def child(self, values: tuple[str, ...]) -> M:
        """The metric's child for ``values``, looked up through ``labels()`` once: it takes a
        lock and formats the values on every call."""
        if self.metric._metrics is not self._of:  # cleared since
            self._of, self._children = self.metric._metrics, {}
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


class Child(Generic[M]):
    """One child of a labelled metric, by its label values; made when first written."""

    __slots__ = ("_children", "values")

    def __init__(self, children: Children[M], values: tuple[str, ...]) -> None:
        self._children = children
        self.values = values

    @property
    def metric(self) -> M:
        """The labelled metric (the parent)."""
        return self._children.metric

    def made(self) -> M:
        """The metric's child, made now if it was not."""
        return self._children.child(self.values)


# -- batched observations ------------------------------------------------------


class HistogramTally:
    """Observations of one histogram child counted in this process's memory, then added to
    the child in one write per bucket (:meth:`flush`). A histogram observed once per
    streamed token writes two values to its multiprocess file per token, which cost more
    than the rest of the token's way through the gateway; a tally costs a bisection."""

    def __init__(self, histogram: Histogram | Child[Histogram]) -> None:
        self._histogram = histogram
        # The histogram's own bounds, +Inf last: a value lands where Histogram.observe puts it.
        parent = histogram.metric if isinstance(histogram, Child) else histogram
        self._bounds: list[float] = list(parent._upper_bounds)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self.pending = 0

    def observe(self, value: float, count: int = 1) -> None:
        """``count`` observations of ``value``."""
        self._counts[bisect_left(self._bounds, value)] += count
        self._sum += value * count
        self.pending += count

    def flush(self) -> None:
        """Add the observations counted so far to the histogram."""
        if not self.pending:
            return
        histogram = self._histogram
        if isinstance(histogram, Child):
            histogram = histogram.made()
        histogram._sum.inc(self._sum)
        for index, count in enumerate(self._counts):
            if count:
                histogram._buckets[index].inc(count)
                self._counts[index] = 0
        self._sum = 0.0
        self.pending = 0


# -- writes held until read ----------------------------------------------------

_held_tallies: dict[Child[Histogram], HistogramTally] = {}
_held_amounts: dict[Child[Counter] | Child[Gauge], float] = {}
_held_values: dict[Child[Gauge], float] = {}


def held(histogram: Child[Histogram]) -> HistogramTally:
    """This process's tally for ``histogram`` (a child): observations counted in memory and
    written by :func:`flush_held`. Every write to a multiprocess file costs more than the
    bookkeeping around it, and a request makes dozens; the files are read by this process
    alone (``GET /metrics``), which flushes first. Only on the event loop, as the flush."""
    tally = _held_tallies.get(histogram)
    if tally is None:
        tally = _held_tallies[histogram] = HistogramTally(histogram)
    return tally


def add_held(metric: Child[Counter] | Child[Gauge], amount: float = 1.0) -> None:
    """``metric`` (a counter's or a gauge's child) goes up by ``amount``, written by
    :func:`flush_held` (see :func:`held`)."""
    _held_amounts[metric] = _held_amounts.get(metric, 0.0) + amount


def set_held(gauge: Child[Gauge], value: float) -> None:
    """``gauge`` (a child) reads ``value``, written by :func:`flush_held` (see :func:`held`)."""
    _held_values[gauge] = value


def flush_held() -> None:
    """Write everything held (:func:`held`, :func:`add_held`, :func:`set_held`): before this
    process reads its metrics, and before their children are cleared."""
    for tally in _held_tallies.values():
        tally.flush()
    amounts, values = list(_held_amounts.items()), list(_held_values.items())
    _held_amounts.clear()
    _held_values.clear()
    for metric, amount in amounts:
        if amount:
            metric.made().inc(amount)
    for gauge, value in values:
        gauge.made().set(value)


# -- multiprocess plumbing -----------------------------------------------------


def _clear_children() -> None:
    flush_held()  # into the storage of the children it holds, before they go
    _held_tallies.clear()
    # prometheus_client warns that clearing leaves the samples already in the
    # files; here the files go with their directory, fresh or deleted.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Clearing labels", UserWarning)
        for metric in METRICS:
            metric.clear()


def family_name(metric: MetricWrapperBase) -> str:
    """The name ``metric`` is exported under (a counter's samples add ``_total``)."""
    (family,) = metric.describe()
    return family.name


_open_dirs: list[Path] = []
_to_close: list[type] = []


@contextmanager
def multiprocess_dir() -> Iterator[Path]:
    """A fresh, empty ``PROMETHEUS_MULTIPROC_DIR`` for this gateway's lifetime.

    On entry: creates the directory, sets the environment variable (child
    processes spawned from now on write there) and switches this process's
    metric storage to it. On exit: restores the previous variable and storage
    and deletes the directory. Enter it before the engine starts; leave it
    after the engine has shut down. The environment is process-wide: two
    gateways in one process (tests) must nest their lifetimes; each reads
    its own directory (the path yielded).
    """
    previous_dir = os.environ.get(MULTIPROC_ENV)
    previous_class = values.ValueClass
    path = Path(tempfile.mkdtemp(prefix="lora-gateway-metrics-"))
    os.environ[MULTIPROC_ENV] = str(path)
    # prometheus_client picks its storage class once, at import, from the
    # environment; vLLM has imported it long before a gateway starts. Metrics
    # look the class up whenever they create a value, so switching it here
    # sends every value created from now on to ``path``, but vLLM's own.
    ours = values.get_value_class()  # type: ignore[no-untyped-call]
    values.ValueClass = _ValueClass(ours)
    _open_dirs.append(path)
    _clear_children()
    try:
        yield path
    finally:
        _clear_children()
        # Release the files this process opened in ``path`` (only ours: metrics living on
        # from before keep theirs) once no gateway of this process runs: another's request
        # under way may still hold a value created while ours was current.
        _to_close.append(ours)
        _open_dirs.remove(path)
        if not _open_dirs:
            for value_class in _to_close:
                close = getattr(value_class, "close_all_files", None)
                if close is not None:
                    close()
            _to_close.clear()
        values.ValueClass = previous_class
        if previous_dir is None:
            os.environ.pop(MULTIPROC_ENV, None)
        else:
            os.environ[MULTIPROC_ENV] = previous_dir
        shutil.rmtree(path, ignore_errors=True)


class _ValueClass:
    """What makes this process's metric values in multiprocess mode: ``file_backed`` values
    for ours, memory for vLLM's own (``vllm:*``). vLLM's front end records those at every
    engine step, on the event loop, and its server keeps them in memory (it turns multiprocess
    mode on only for several API servers): a file-backed value makes each update a locked
    write to a memory-mapped file, which multiplied the logger's CPU. No process but this one
    makes ``vllm:*`` metrics, so nothing of them is lost from the files;
    :func:`collection_registry` exports them from this process's registry."""

    def __init__(self, file_backed: type) -> None:
        self.file_backed = file_backed

    def __call__(self, kind: str, metric_name: str, *args: Any, **kwargs: Any) -> object:
        if metric_name.startswith(IN_MEMORY_PREFIX):
            return values.MutexValue(kind, metric_name, *args, **kwargs)  # type: ignore[no-untyped-call]
        return self.file_backed(kind, metric_name, *args, **kwargs)


class _InMemoryFamilies(Collector):
    """The families of this process's registry that keep their values in memory
    (:class:`_ValueClass`), and so are in no file."""

    def collect(self) -> Iterator[Metric]:
        return (family for family in REGISTRY.collect() if family.name.startswith(IN_MEMORY_PREFIX))


def collection_registry(path: Path | None = None) -> CollectorRegistry:
    """What ``GET /metrics`` exports: every process's files in ``path``
    (default: ``PROMETHEUS_MULTIPROC_DIR``) merged, this process's included, and the
    families this process keeps in memory (vLLM's); without either, this process's
    registry."""
    directory = str(path) if path is not None else os.environ.get(MULTIPROC_ENV)
    if directory is None:
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    registry.register(_InMemoryFamilies())
    return registry


def render(path: Path | None = None) -> tuple[bytes, str]:
    """The exposition (Prometheus text format) of :func:`collection_registry`
    and its content type."""
    return generate_latest(collection_registry(path)), CONTENT_TYPE_LATEST
