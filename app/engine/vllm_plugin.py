"""vLLM general plugin: loaded by vLLM in every process it starts.

vLLM calls :func:`register` (entry point ``vllm.general_plugins`` ->
``lora_gateway``) in the front-end process, the engine core and each worker,
before any model or LoRA wrapper is built. It swaps the CPU punica ops that
``vllm.lora.punica_wrapper.punica_cpu`` looked up at import time for the
tenant-isolating ones in :mod:`app.engine.punica_cpu` (see there for the bug),
and its ``PunicaWrapperCPU`` for :mod:`app.engine.punica_wrapper`'s, which
plans each step's adapter grouping once instead of in every layer. It also
instruments vLLM's LoRA caches for :mod:`app.engine.residency`'s metrics.

Applied only on vLLM 0.32.x on the CPU platform; ``LORA_GATEWAY_ISOLATION_FIX=0``
(or ``false``) turns it off.
"""

from __future__ import annotations

import logging
import os
import re

logger = logging.getLogger("lora_gateway.vllm_plugin")

ENV_VAR = "LORA_GATEWAY_ISOLATION_FIX"
PATCHED_OPS = (
    "bgmv_expand",
    "bgmv_expand_slice",
    "bgmv_shrink",
    "sgmv_expand",
    "sgmv_expand_slice",
    "sgmv_shrink",
)
_AFFECTED_VERSION = re.compile(r"0\.32(\.|$)")

# The outcome in this process; register() acts and logs only on the first call.
_outcome: str | None = None


def _enabled_by_env() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in {"0", "false", "no", "off"}


def _make_visible() -> None:
    # vLLM configures logging for its own loggers only: in its engine and
    # worker processes ours would otherwise drop everything below WARNING.
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter("%(levelname)s %(processName)s %(name)s: %(message)s")
        )
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def register() -> None:
    """Install the adapter residency metrics (:mod:`app.engine.residency`) and
    apply the CPU punica isolation fix where needed; idempotent."""
    global _outcome
    if _outcome is not None:
        return
    _make_visible()
    # Adapter residency metrics: on every platform, whatever the fix's switch.
    from app.engine import residency

    residency.install()

    import vllm
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        _outcome = "not-cpu"
        logger.debug("CPU punica isolation fix not needed on this platform")
        return
    if not _AFFECTED_VERSION.match(vllm.__version__):
        _outcome = "other-version"
        logger.warning(
            "CPU punica isolation fix targets vLLM 0.32.x, not applied to vLLM %s: "
            "check that its CPU LoRA ops skip slot -1 (tests/engine/test_punica_cpu.py)",
            vllm.__version__,
        )
        return
    if not _enabled_by_env():
        _outcome = "disabled"
        logger.info(
            "CPU punica isolation fix DISABLED by %s=%s: base-model requests batched "
            "with adapter requests may be computed with another tenant's adapter",
            ENV_VAR,
            os.environ[ENV_VAR],
        )
        return

    # The wrapper module binds the op names at import, so they are replaced in
    # its namespace; vllm.lora.ops.torch_ops itself is left as shipped.
    import vllm.lora.punica_wrapper.punica_cpu as upstream

    from app.engine import punica_cpu
    from app.engine.punica_wrapper import PlannedPunicaWrapper

    for name in PATCHED_OPS:
        setattr(upstream, name, getattr(punica_cpu, name))
    # The platform names the wrapper class by this qualname and resolves it when the
    # model's LoRA layers are built, after plugins are loaded.
    upstream.PunicaWrapperCPU = PlannedPunicaWrapper  # type: ignore[misc]
    _outcome = "active"
    logger.info(
        "CPU punica isolation fix active (vLLM %s, pid %d): %s.{%s} -> %s, PunicaWrapperCPU -> %s",
        vllm.__version__,
        os.getpid(),
        upstream.__name__,
        ",".join(PATCHED_OPS),
        punica_cpu.__name__,
        PlannedPunicaWrapper.__qualname__,
    )
