"""Which adapters are likely in a device slot, as the scheduler can tell from what it sent.

vLLM keeps ``max_loras`` adapters in device slots and evicts the least recently used. Every
engine step touches the adapters of the running batch, so an adapter with a request in the
engine holds a slot, and the remaining slots hold the adapters whose requests ended most
recently. This model follows the same rule from the requests the scheduler dispatched and saw
end; it cannot see an eviction vLLM makes for another reason, which only costs a load the
model did not predict.

When every slot is busy, a request with another adapter cannot run: vLLM would hold it in its
own queue, where it may wait for ever behind the running adapters' new requests. So the
scheduler holds it instead, and when it has waited long enough, :meth:`AdapterAffinity.make_room`
drains one slot for it: the running adapter with the fewest requests in the engine takes no
more until they end, and the freed slot is kept for the held adapter until it starts. Where the
engine shares its slots in turns (``lora_slot_quantum_tokens``,
:mod:`app.inside_vllm.slot_sharing`) nothing is held: such a request only ranks last.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Literal

Fit = Literal[0, 1, 2]
RESIDENT: Fit = 0  # the base model, or an adapter in a slot: no swap
FITS: Fit = 1  # a slot is free or idle: one load, nobody running is displaced
CROWDS: Fit = 2  # every slot is busy with running requests (or draining): it cannot run now


class AdapterAffinity:
    def __init__(self, max_loras: int, *, hold: bool = True) -> None:
        self.max_loras = max_loras
        # Whether a request that crowds waits here; if not, the engine pauses a slot's
        # requests for it.
        self.hold = hold
        self._running: Counter[int] = Counter()
        # Adapters whose last request ended, most recent last.
        self._idle: OrderedDict[int, None] = OrderedDict()
        # The running adapter that takes no new requests until its slot is free.
        self.draining: int | None = None
        # The adapter that slot is kept for, until one of its requests starts.
        self.reserved: int | None = None

    def crowds(self, adapter: int | None) -> bool:
        """Whether a request for ``adapter`` is held: it cannot run now, needing a slot
        that running requests (or a reservation) hold."""
        return self.hold and self._slots_taken(adapter)

    def _slots_taken(self, adapter: int | None) -> bool:
        if adapter is None:
            return False
        if adapter == self.draining:
            return True
        if adapter in self._running:
            return False
        taken = len(self._running)
        if self.reserved is not None and adapter != self.reserved:
            taken += 1
        return taken >= self.max_loras

    def fit(self, adapter: int | None) -> Fit:
        if self._slots_taken(adapter):
            return CROWDS
        if adapter is None or adapter in self._running:
            return RESIDENT
        free = self.max_loras - len(self._running)
        recent = list(self._idle)[-free:]
        return RESIDENT if adapter in recent else FITS

    def make_room(self, adapter: int) -> None:
        """Free a slot for ``adapter``, which crowds: the running adapter with the fewest
        requests in the engine drains, and its slot is ``adapter``'s (one at a time)."""
        if self.reserved is None and self.crowds(adapter):
            self.reserved = adapter
            if len(self._running) >= self.max_loras:
                self.draining = min(self._running, key=self._running.__getitem__)

    def forgo(self, adapter: int | None) -> None:
        """No request waits for ``adapter`` any more: a slot kept for it is free again."""
        if adapter is not None and adapter == self.reserved:
            self.reserved = None

    def started(self, adapter: int | None) -> None:
        if adapter is None:
            return
        self._running[adapter] += 1
        self._idle.pop(adapter, None)
        self.forgo(adapter)

    def finished(self, adapter: int | None) -> None:
        if adapter is None or not self._running[adapter]:
            return
        self._running[adapter] -= 1
        if not self._running[adapter]:
            del self._running[adapter]
            if adapter == self.draining:
                self.draining = None
            self._idle[adapter] = None
            while len(self._idle) > self.max_loras:
                self._idle.popitem(last=False)
