"""vLLM general plugin: loaded by vLLM in every process it starts.

vLLM calls :func:`register` (entry point ``vllm.general_plugins`` ->
``lora_gateway``) in the front-end process, the engine core and each worker,
before any model or LoRA wrapper is built. It swaps the CPU punica ops that
``vllm.lora.punica_wrapper.punica_cpu`` looked up at import time for the
tenant-isolating ones in :mod:`app.inside_vllm.punica_cpu` (see there for the bug),
and its ``PunicaWrapperCPU`` for :mod:`app.inside_vllm.punica_wrapper`'s, which
plans each step's adapter grouping once instead of in every layer (vLLM's model
manager tells it which host-tier adapter each activation writes into which slot), and
keeps vLLM's LoRA layers from zeroing a slot again that is zero already
(:mod:`app.inside_vllm.slot_zeroing`). It also instruments vLLM's LoRA caches for
:mod:`app.inside_vllm.residency`'s metrics, has vLLM read adapter files with
:mod:`app.inside_vllm.adapter_files`, and loads each request's adapter before the scheduler
sees the request, so that a load failure is that request's (:mod:`app.inside_vllm.load_failures`).

Applied only on vLLM 0.32.x on the CPU platform; ``LORA_GATEWAY_ISOLATION_FIX=0``
(or ``false``) turns it off. On CPU the fix is a correctness requirement, so the gateway checks
before it starts the engine that the plugin will be loaded in the engine's processes
(:func:`require_isolation_fix`) and refuses to start otherwise.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata

logger = logging.getLogger("lora_gateway.vllm_plugin")

ENV_VAR = "LORA_GATEWAY_ISOLATION_FIX"
PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "lora_gateway"
PLUGIN_TARGET = f"{__name__}:register"
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
    """Install the adapter residency metrics (:mod:`app.inside_vllm.residency`) and the
    adapter file reader (:mod:`app.inside_vllm.adapter_files`), and apply the CPU punica
    isolation fix where needed; idempotent."""
    global _outcome
    if _outcome is not None:
        return
    _make_visible()
    # Adapter residency metrics and reads: on every platform, whatever the fix's switch.
    from app.inside_vllm import adapter_files, load_failures, residency

    residency.install()
    adapter_files.install()
    load_failures.install()  # after residency: its load wrapper goes around residency's

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
            "check that its CPU LoRA ops skip slot -1 (tests/inside_vllm/test_punica_cpu.py)",
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
    from vllm.lora.model_manager import LoRAModelManager

    from app.inside_vllm import punica_cpu, slot_zeroing
    from app.inside_vllm.punica_wrapper import PlannedPunicaWrapper, report_activations

    for name in PATCHED_OPS:
        setattr(upstream, name, getattr(punica_cpu, name))
    # The platform names the wrapper class by this qualname and resolves it when the
    # model's LoRA layers are built, after plugins are loaded.
    upstream.PunicaWrapperCPU = PlannedPunicaWrapper  # type: ignore[misc]
    report_activations(LoRAModelManager)
    slot_zeroing.install()
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


class IsolationFixUnavailable(RuntimeError):
    """The CPU isolation fix would not be active in vLLM's processes: base-model requests
    batched with adapter requests could be computed with another tenant's adapter."""


def _installed_plugins() -> Iterable[metadata.EntryPoint]:
    return metadata.entry_points(group=PLUGIN_GROUP)


def require_isolation_fix(
    enabled: bool,
    *,
    is_cpu: bool,
    vllm_version: str,
    find_plugins: Callable[[], Iterable[metadata.EntryPoint]] = _installed_plugins,
    environ: Mapping[str, str] = os.environ,
) -> str:
    """Check, before the engine starts, that vLLM will load this plugin and that it will
    apply the fix; the outcome (``not-cpu``, ``disabled``, ``active``) or
    :class:`IsolationFixUnavailable` with what to do about it.

    ``enabled`` false (``LORA_GATEWAY_ISOLATION_FIX=0``) is the one explicit override; it is
    logged as a warning."""
    if not is_cpu:
        return "not-cpu"
    if not enabled:
        logger.warning(
            "CPU punica isolation fix turned off (%s=0): base-model requests batched with "
            "adapter requests may be computed with another tenant's adapter",
            ENV_VAR,
        )
        return "disabled"
    override = f"Set {ENV_VAR}=0 only to demonstrate the bug."
    if not _AFFECTED_VERSION.match(vllm_version):
        raise IsolationFixUnavailable(
            f"the CPU isolation fix supports vLLM 0.32.x, not {vllm_version}: install the "
            f"vLLM version this gateway pins. {override}"
        )
    found = [ep for ep in find_plugins() if ep.name == PLUGIN_NAME]
    if not found or found[0].value.replace(" ", "") != PLUGIN_TARGET:
        raise IsolationFixUnavailable(
            f"the entry point {PLUGIN_GROUP}: {PLUGIN_NAME} = {PLUGIN_TARGET} is not installed "
            f"(found {[ep.value for ep in found] or 'none'}), so vLLM would not load the CPU "
            f"isolation fix: reinstall the gateway (pip install -e .). {override}"
        )
    allowed = environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        raise IsolationFixUnavailable(
            f"VLLM_PLUGINS={allowed!r} leaves out {PLUGIN_NAME!r}, so vLLM would not load the "
            f"CPU isolation fix: add it or unset VLLM_PLUGINS. {override}"
        )
    try:
        loaded = found[0].load()
    except Exception as exc:
        raise IsolationFixUnavailable(
            f"the plugin {PLUGIN_TARGET} cannot be loaded: {exc!r}"
        ) from exc
    if loaded is not register:
        raise IsolationFixUnavailable(f"{PLUGIN_TARGET} loads {loaded!r}, not this plugin")
    return "active"
