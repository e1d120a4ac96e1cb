"""The engine role: vLLM's own OpenAI server on the configured model, with our plugins.

``LORA_GATEWAY_ROLE=engine lora-gateway serve`` runs vLLM's OpenAI server (the surface the
llm-d router's endpoint picker and llm-d's manifests expect) in a child process, with the
in-process engine's arguments as flags, our two plugins (the isolation fix and residency
metrics; the store's LoRA resolver), the middleware that refuses runtime adapter loading,
and a metrics directory of its own. It refuses to start without the isolation fix, passes
SIGTERM and SIGINT on, and never leaves vLLM's processes behind. Why vLLM's server, and each
flag and variable: docs/scale-out.md, "Engine role".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from types import FrameType

from app import tracing
from app.engine_role.parent_death import dying_with_this_process
from app.inside_vllm.plugin import ENV_VAR as ISOLATION_FIX_ENV
from app.inside_vllm.plugin import (
    PLUGIN_GROUP,
    PLUGIN_NAME,
    IsolationFixUnavailable,
    require_isolation_fix,
)
from app.settings import Settings

logger = logging.getLogger(__name__)

VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
RESOLVER_PLUGIN_NAME = "lora_gateway_resolver"
RESOLVER_TARGET = "app.engine_role.lora_resolver:register"
PLUGINS = f"{PLUGIN_NAME},{RESOLVER_PLUGIN_NAME}"
GIB = 1 << 30
PATHS_MIDDLEWARE = "app.engine_role.paths.EnginePathsOnly"


def vllm_server_argv(settings: Settings, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The command line of vLLM's server for ``settings`` (the flags mirror ``engine_args``);
    where ``environ`` turns tracing on (app/tracing), vLLM exports its spans to the same
    OTLP endpoint, under the front's span that each request's ``traceparent`` names."""
    from app.engine.vllm_engine import (
        engine_block_size,
        engine_dtype,
        slot_sharing_options,
        structured_outputs_config,
    )

    structured = structured_outputs_config(settings.structured_outputs_compact)
    structured_flag = {
        "backend": structured.backend,
        "disable_any_whitespace": structured.disable_any_whitespace,
    }
    argv = [
        sys.executable,
        "-m",
        VLLM_SERVER_MODULE,
        "--model",
        settings.model,
        "--served-model-name",
        settings.base_model_id,
        "--dtype",
        engine_dtype(settings.dtype),
        "--max-model-len",
        str(settings.max_model_len),
        "--max-num-seqs",
        str(settings.max_num_seqs),
        "--stream-interval",
        str(settings.stream_interval),
        "--enable-lora",
        "--max-loras",
        str(settings.max_loras),
        "--max-cpu-loras",
        str(settings.max_cpu_loras),
        "--max-lora-rank",
        str(settings.max_lora_rank),
        "--gpu-memory-utilization",
        str(settings.gpu_memory_utilization),
        "--enforce-eager" if settings.enforce_eager else "--no-enforce-eager",
        "--seed",
        str(settings.seed),
        "--structured-outputs-config",
        json.dumps(structured_flag),
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--uvicorn-log-level",
        settings.log_level,
        "--middleware",
        PATHS_MIDDLEWARE,
    ]
    slots = slot_sharing_options(settings)
    if slots:
        argv += ["--scheduler-cls", slots["scheduler_cls"]]
        argv += ["--additional-config", json.dumps(slots["additional_config"])]
    if settings.kv_cache_gib is not None:
        argv += ["--kv-cache-memory-bytes", str(int(settings.kv_cache_gib * GIB))]
    block_size = engine_block_size(settings.kv_block_size)
    if block_size is not None:
        argv += ["--block-size", str(block_size)]
    if settings.tool_call_parser is not None:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", settings.tool_call_parser]
    if settings.ssl_certfile is not None and settings.ssl_keyfile is not None:
        argv += ["--ssl-certfile", str(settings.ssl_certfile)]
        argv += ["--ssl-keyfile", str(settings.ssl_keyfile)]
    traces = tracing.traces_endpoint(environ)
    if traces is not None:
        argv += ["--otlp-traces-endpoint", traces]
    return argv


def vllm_server_env(
    settings: Settings, metrics_dir: str, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """``environ`` plus what vLLM's server and our plugins need to act on ``settings``."""
    traced = {}
    if tracing.traces_endpoint(environ) is not None:
        # vLLM's exporter defaults to gRPC; the gateway's, as OTLP's, to http/protobuf.
        traced["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = tracing.protocol(environ)
    return {
        **environ,
        **traced,
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
        "VLLM_PLUGINS": PLUGINS,
        "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
        ISOLATION_FIX_ENV: "1" if settings.isolation_fix else "0",
        # What the resolver reads (it builds its Settings from the environment), so that it
        # sees this settings object even where it came from elsewhere than the environment.
        "LORA_GATEWAY_ROLE": "engine",
        "LORA_GATEWAY_MODEL": settings.model,
        "LORA_GATEWAY_ADAPTER_STORE": settings.adapter_store,
        "LORA_GATEWAY_ADAPTER_ROOT": str(settings.adapter_root),
        "LORA_GATEWAY_ADAPTER_CACHE_DIR": str(settings.adapter_cache_dir),
        "LORA_GATEWAY_ADAPTER_CACHE_BYTES": str(settings.adapter_cache_bytes),
        "LORA_GATEWAY_DATABASE_URL": settings.database_url,
        "LORA_GATEWAY_MAX_LORA_RANK": str(settings.max_lora_rank),
        "LORA_GATEWAY_MAX_ADAPTER_BYTES": str(settings.max_adapter_bytes),
    }


def _installed_plugins() -> Iterable[metadata.EntryPoint]:
    return metadata.entry_points(group=PLUGIN_GROUP)


class ResolverUnavailable(RuntimeError):
    """vLLM would not load our LoRA resolver: every adapter name would be a 404."""


def require_resolver(find_plugins: Callable[[], Iterable[metadata.EntryPoint]]) -> None:
    """Check that the resolver's entry point is installed (``pip install -e .``)."""
    found = [ep.value for ep in find_plugins() if ep.name == RESOLVER_PLUGIN_NAME]
    if found != [RESOLVER_TARGET]:
        raise ResolverUnavailable(
            f"the entry point {PLUGIN_GROUP}: {RESOLVER_PLUGIN_NAME} = {RESOLVER_TARGET} is not "
            f"installed (found {found or 'none'}), so vLLM's server could not resolve adapter "
            "names: reinstall the gateway (pip install -e .)"
        )


def check_plugins(
    settings: Settings,
    env: Mapping[str, str],
    find_plugins: Callable[[], Iterable[metadata.EntryPoint]] | None = None,
) -> str:
    """Refuse (``IsolationFixUnavailable``, ``ResolverUnavailable``) to start vLLM's server
    with ``env`` unless both plugins will be loaded; the isolation fix's outcome."""
    import vllm
    from vllm.platforms import current_platform

    find = find_plugins or _installed_plugins
    require_resolver(find)
    return require_isolation_fix(
        settings.isolation_fix,
        is_cpu=current_platform.is_cpu(),
        vllm_version=vllm.__version__,
        find_plugins=find,
        environ=env,
    )


def serve_engine(settings: Settings) -> int:
    """Run vLLM's server for ``settings`` until it exits; its exit status (1 when the plugins
    are not in place)."""
    metrics_dir = tempfile.mkdtemp(prefix="lora-gateway-engine-metrics-")
    try:
        env = vllm_server_env(settings, metrics_dir)
        try:
            logger.info("CPU punica isolation fix: %s", check_plugins(settings, env))
        except (IsolationFixUnavailable, ResolverUnavailable) as exc:
            logger.error("not starting vLLM's server: %s", exc)
            return 1
        server = start_server(vllm_server_argv(settings), env)

        def forward(signum: int, _: FrameType | None) -> None:
            # Not send_signal(): it would reap an exited server, and wait_for_server kills
            # the server's group by its pid, which must stay unreaped until then.
            if server.returncode is None:
                os.kill(server.pid, signum)

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, forward)
        return wait_for_server(server)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def start_server(argv: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start ``argv`` (vLLM's server) as a process that is sent SIGTERM when this one dies,
    leading a session and process group of its own: a terminal's Ctrl-C reaches it once,
    through ``serve_engine``'s forwarding, and its children are found by its group. Call it
    from the main thread: the signal comes when the thread that started it ends."""
    return subprocess.Popen(dying_with_this_process(argv), env=env, start_new_session=True)


def wait_for_server(server: subprocess.Popen[bytes]) -> int:
    """Wait for ``server`` (started by :func:`start_server`) to exit, kill what it left in its
    process group (an engine core and workers outlive a server that was killed outright), and
    return its exit status."""
    # Waited for but not reaped: until it is, the server's pid, which is its group's id,
    # cannot be given to another process, so the group killed is the server's own.
    os.waitid(os.P_PID, server.pid, os.WEXITED | os.WNOWAIT)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    return server.wait()
