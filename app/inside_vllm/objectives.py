"""What a request carries to vLLM's engine core for its scheduler: its latency objectives, and
whether it came in through the front's headroom. They travel in its
``SamplingParams.extra_args`` (in-process), or its body's ``vllm_xargs``, which vLLM's server
turns into them (from a front to the engine role). The slot turns and the seats read them
there (:mod:`app.inside_vllm.slot_sharing`). No vLLM import: the gateway builds them too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

CLASS_KEY = "lora_gateway_class"
TTFT_KEY = "lora_gateway_ttft_ms"
TPOT_KEY = "lora_gateway_tpot_ms"
INTERACTIVE = "interactive"
# A request the fair front let in beyond the batch its tenants share, for a tenant below its
# share (docs/scheduling.md, "Headroom"): the engine core gives it a seat at once.
HEADROOM_KEY = "lora_gateway_headroom"


class Objectives(NamedTuple):
    """One request's class and objectives, in seconds (None: no objective)."""

    interactive: bool
    ttft: float | None = None  # time to its first token, from its arrival in the engine
    tpot: float | None = None  # time per output token after the first, over its life so far

    @property
    def any(self) -> bool:
        return self.ttft is not None or self.tpot is not None

    def extra_args(self) -> dict[str, Any]:
        """What the request carries: its class, and each objective it has, in milliseconds."""
        args: dict[str, Any] = {CLASS_KEY: INTERACTIVE if self.interactive else "batch"}
        for key, seconds in ((TTFT_KEY, self.ttft), (TPOT_KEY, self.tpot)):
            if seconds is not None:
                args[key] = round(seconds * 1000, 3)
        return args

    @classmethod
    def of(cls, extra_args: Mapping[str, Any] | None) -> Objectives | None:
        """A request's class and objectives from its ``extra_args``, its class alone where it
        carries no objective (``any`` is false: the turns by objectives still need its class,
        so that a batch request never pauses an interactive stream); None where it carries no
        class (a request that did not come through the gateway). A value that is not a
        positive number counts as no objective."""
        if not extra_args or CLASS_KEY not in extra_args:
            return None
        return cls(
            interactive=extra_args[CLASS_KEY] == INTERACTIVE,
            ttft=_seconds(extra_args.get(TTFT_KEY)),
            tpot=_seconds(extra_args.get(TPOT_KEY)),
        )


def _seconds(milliseconds: object) -> float | None:
    if isinstance(milliseconds, bool) or not isinstance(milliseconds, int | float):
        return None
    return milliseconds / 1000 if milliseconds > 0 else None


def through_headroom(extra_args: Mapping[str, Any] | None) -> bool:
    """Whether a request carries the headroom's mark."""
    return extra_args is not None and extra_args.get(HEADROOM_KEY) == 1
