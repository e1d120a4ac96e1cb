"""The engine role's command line and environment for vLLM's server, read back by vLLM's own
argument parser, and the refusal to start it without our plugins."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

import pytest
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

from app.engine.vllm_engine import engine_args
from app.engine_role import server as engine_server
from app.engine_role.server import (
    VLLM_SERVER_MODULE,
    ResolverUnavailable,
    check_plugins,
    serve_engine,
    vllm_server_argv,
    vllm_server_env,
)
from app.inside_vllm.plugin import IsolationFixUnavailable
from app.inside_vllm.slot_sharing import OBJECTIVES_KEY, QUANTUM_KEY, SCHEDULER_CLS
from app.settings import Settings

GROUP = "vllm.general_plugins"
OURS = metadata.EntryPoint("lora_gateway", "app.inside_vllm.plugin:register", GROUP)
RESOLVER = metadata.EntryPoint(
    "lora_gateway_resolver", "app.engine_role.lora_resolver:register", GROUP
)


def settings(**overrides: object) -> Settings:
    defaults: dict[str, object] = {
        "role": "engine",
        "dtype": "float32",
        "max_model_len": 512,
        "max_loras": 3,
        "max_cpu_loras": 5,
        "max_lora_rank": 16,
        "kv_cache_gib": 0.5,
        "seed": 7,
        "port": 8123,
        "host": "0.0.0.0",
        "served_model_name": "base-model",
        "adapter_store": "s3://bucket/prefix",
        "adapter_cache_dir": Path("/cache/adapters"),
    }
    return Settings(_env_file=None, **{**defaults, **overrides})  # type: ignore[arg-type]


def parsed(argv: list[str]) -> tuple[object, AsyncEngineArgs]:
    assert argv[1:3] == ["-m", VLLM_SERVER_MODULE]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[3:])  # type: ignore[no-untyped-call]
    return args, AsyncEngineArgs.from_cli_args(args)


@pytest.mark.parametrize("compact", [True, False])
def test_vllm_reads_the_engine_arguments_the_in_process_engine_takes(compact: bool) -> None:
    # With and without a KV block size of our own (unset: vLLM's platform default).
    config = settings(
        structured_outputs_compact=compact,
        kv_block_size=32 if compact else None,
        stream_interval=4 if compact else 1,
    )
    args, from_cli = parsed(vllm_server_argv(config))
    expected = engine_args(config)
    for name in (
        "model",
        "dtype",
        "max_model_len",
        "max_num_seqs",
        "stream_interval",
        "enable_lora",
        "max_loras",
        "max_cpu_loras",
        "max_lora_rank",
        "kv_cache_memory_bytes",
        "block_size",
        "gpu_memory_utilization",
        "enforce_eager",
        "seed",
        "scheduler_cls",
        "additional_config",
    ):
        assert getattr(from_cli, name) == getattr(expected, name), name
    assert from_cli.served_model_name == ["base-model"]
    structured = from_cli.structured_outputs_config
    assert structured.backend == expected.structured_outputs_config.backend
    assert structured.disable_any_whitespace == compact
    assert (args.host, args.port) == ("0.0.0.0", 8123)  # type: ignore[attr-defined]
    assert args.enable_auto_tool_choice is False  # type: ignore[attr-defined]


@pytest.mark.parametrize("class_objective", [500, None])
def test_objectives_run_the_slot_turns_even_without_a_quantum(class_objective: int | None) -> None:
    """Both engines always run the slot-sharing scheduler, which reads each request's
    objectives, with a quantum of 0 and with no class's objectives too: a tenant's own may be
    set at any time."""
    config = settings(lora_slot_quantum_tokens=0, slo_ttft_ms_interactive=class_objective)
    _, from_cli = parsed(vllm_server_argv(config))
    assert from_cli.scheduler_cls == engine_args(config).scheduler_cls == SCHEDULER_CLS
    assert from_cli.additional_config == {QUANTUM_KEY: 0, OBJECTIVES_KEY: True}


def test_a_tool_call_parser_enables_auto_tool_choice() -> None:
    args, _ = parsed(vllm_server_argv(settings(tool_call_parser="hermes")))
    assert args.enable_auto_tool_choice is True  # type: ignore[attr-defined]
    assert args.tool_call_parser == "hermes"  # type: ignore[attr-defined]


def test_the_environment_enables_both_plugins_and_carries_the_resolver_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = settings()
    env = vllm_server_env(config, "/tmp/metrics", environ={"PATH": "/bin"})
    assert env["PATH"] == "/bin"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert env["VLLM_PLUGINS"].split(",") == ["lora_gateway", "lora_gateway_resolver"]
    assert env["PROMETHEUS_MULTIPROC_DIR"] == "/tmp/metrics"
    assert env["LORA_GATEWAY_ISOLATION_FIX"] == "1"
    # The resolver in vLLM's process builds its settings from this environment alone.
    for name in list(Settings.model_fields):
        monkeypatch.delenv(f"LORA_GATEWAY_{name.upper()}", raising=False)
    for name, value in env.items():
        if name.startswith("LORA_GATEWAY_"):
            monkeypatch.setenv(name, value)
    seen = Settings(_env_file=None)
    for name in ("model", "adapter_store", "adapter_root", "adapter_cache_dir", "database_url"):
        assert getattr(seen, name) == getattr(config, name), name
    assert seen.adapter_cache_bytes == config.adapter_cache_bytes


def test_without_the_resolver_entry_point_vllm_is_not_started() -> None:
    env = vllm_server_env(settings(), "/tmp/metrics")
    with pytest.raises(ResolverUnavailable, match="lora_gateway_resolver"):
        check_plugins(settings(), env, find_plugins=lambda: [OURS])
    assert check_plugins(settings(), env, find_plugins=lambda: [OURS, RESOLVER]) == "active"
    assert check_plugins(settings(), env) == "active"  # this checkout's installed entry points


def test_without_the_isolation_fix_entry_point_vllm_is_not_started() -> None:
    env = vllm_server_env(settings(), "/tmp/metrics")
    with pytest.raises(IsolationFixUnavailable, match="lora_gateway"):
        check_plugins(settings(), env, find_plugins=lambda: [RESOLVER])


def test_serve_refuses_before_starting_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("vLLM's server was started")

    monkeypatch.setattr(engine_server, "_installed_plugins", lambda: [RESOLVER])
    monkeypatch.setattr(subprocess, "Popen", never)
    assert serve_engine(settings()) == 1


def test_where_tracing_is_on_vllms_server_exports_to_the_same_endpoint_over_the_same_protocol() -> (
    None
):
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    args, _ = parsed(vllm_server_argv(settings(), environ))
    assert args.otlp_traces_endpoint == "http://collector:4318/v1/traces"  # type: ignore[attr-defined]
    # vLLM's exporter would default to gRPC.
    env = vllm_server_env(settings(), "/tmp/metrics", environ=environ)
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    grpc = {**environ, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    assert (
        vllm_server_env(settings(), "/tmp/m", environ=grpc)["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]
        == "grpc"
    )


def test_without_tracing_vllms_server_traces_nothing() -> None:
    args, _ = parsed(vllm_server_argv(settings(), {}))
    assert args.otlp_traces_endpoint is None  # type: ignore[attr-defined]
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" not in vllm_server_env(
        settings(), "/tmp/m", environ={}
    )
