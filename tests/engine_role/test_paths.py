"""The engine role's server answers inference, /health and /metrics, and nothing else."""

from __future__ import annotations

import importlib

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

from app.engine_role.paths import ENGINE_PATHS, EnginePathsOnly
from app.engine_role.server import PATHS_MIDDLEWARE, vllm_server_argv
from app.settings import Settings


async def reached(request: Request) -> PlainTextResponse:
    return PlainTextResponse(f"reached {request.url.path}")


def guarded_client() -> httpx.AsyncClient:
    everything = Starlette(routes=[Route("/{path:path}", reached, methods=["GET", "POST"])])
    transport = httpx.ASGITransport(app=EnginePathsOnly(everything))
    return httpx.AsyncClient(transport=transport, base_url="http://engine")


@pytest.mark.parametrize("path", sorted(ENGINE_PATHS))
async def test_inference_health_and_metrics_reach_vllm(path: str) -> None:
    async with guarded_client() as client:
        response = await client.post(path)
    assert response.status_code == 200
    assert response.text == f"reached {path}"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/adapters",
        "/adapters/legal_advisor@v1",
        "/reset_prefix_cache",
        "/sleep",
        "/collective_rpc",
        "/v1/chat/completions/",
        "/metrics/../v1/load_lora_adapter",
        # vLLM's own Responses API keeps state in the engine's memory: the front owns it.
        "/v1/responses",
        "/v1/responses/resp_1",
    ],
)
async def test_every_other_path_is_refused_before_vllm_reads_it(path: str) -> None:
    async with guarded_client() as client:
        response = await client.post(path, json={"lora_name": "x@v1", "lora_path": "/tmp/x"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_vllms_server_is_started_with_the_guard() -> None:
    argv = vllm_server_argv(Settings(_env_file=None, role="engine"))  # type: ignore[call-arg]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[3:])  # type: ignore[no-untyped-call]
    assert args.middleware == [PATHS_MIDDLEWARE]  # type: ignore[attr-defined]
    module, name = PATHS_MIDDLEWARE.rsplit(".", 1)
    # vLLM imports it the same way (entrypoints/serve/middleware/register.py).
    assert getattr(importlib.import_module(module), name) is EnginePathsOnly
