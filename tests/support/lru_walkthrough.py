"""One request sequence through vLLM's adapter caches, worked out by hand from
vLLM 0.32's LRU code (``LRUCacheWorkerLoRAManager.add_adapter``,
``LRUCacheLoRAModelManager``), shared by the unit test (vLLM's cache code, no
model: ``tests/inside_vllm/test_residency.py``) and the end-to-end test (the real engine:
``tests/e2e/test_metrics.py``).

One device slot, two host slots; requests sent one at a time. Every request
touches its adapter in both caches, so the device slot holds the adapter used
last and the host cache the two used last. The comment after each request is
the host cache, least recently used first, then the device slot.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

from app.metrics import Tier

MAX_LORAS: Final = 1
MAX_CPU_LORAS: Final = 2

# (adapter letter or None for the base model, the tier that serves it)
WALKTHROUGH: Final[tuple[tuple[str | None, Tier | None], ...]] = (
    ("A", "storage"),  # load A, activate into the empty slot    (A)    [A]
    ("A", "device"),  #  hit                                      (A)    [A]
    ("B", "storage"),  # load B; activate, evicting A from slot   (A B)  [B]
    (None, None),  #     base model: no adapter, nothing moves
    ("A", "host"),  #    activate A, evicting B                   (B A)  [A]
    ("C", "storage"),  # evict B from host, load C; evict A slot  (A C)  [C]
    ("B", "storage"),  # evict A from host, load B; evict C slot  (C B)  [B]
    ("C", "host"),  #    activate C, evicting B                   (B C)  [C]
    ("A", "storage"),  # evict B from host, load A; evict C slot  (C A)  [A]
    ("A", "device"),  #  hit                                      (C A)  [A]
)

USES: Final[Counter[tuple[str, Tier]]] = Counter(
    (letter, tier) for letter, tier in WALKTHROUGH if letter is not None and tier is not None
)
# Storage uses load (and activate); host uses activate.
LOADS: Final = sum(n for (_, tier), n in USES.items() if tier == "storage")
ACTIVATIONS: Final = LOADS + sum(n for (_, tier), n in USES.items() if tier == "host")
# Every activation but the first (into the empty slot) evicts the slot's
# adapter; every load beyond the host cache's capacity evicts its oldest.
EVICTIONS: Final = {"device": ACTIVATIONS - MAX_LORAS, "host": LOADS - MAX_CPU_LORAS}
RESIDENT: Final = {"device": MAX_LORAS, "host": MAX_CPU_LORAS}

assert (LOADS, ACTIVATIONS, EVICTIONS) == (5, 7, {"device": 6, "host": 3})
