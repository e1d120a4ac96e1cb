"""What the engine role's server answers: inference, health and metrics, nothing else.

vLLM's server needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` for our resolver to run, and that flag
also mounts ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (and the SageMaker
``/adapters`` routes) on the same port as ``/metrics``, which the endpoint picker and
Prometheus must reach. A NetworkPolicy cannot tell paths apart, so the server itself refuses
every path but these: no cluster peer can load, unload or replace an adapter under a global
name, sleep the engine or reset its cache.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

ENGINE_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/health",
        "/metrics",
    }
)

_NOT_SERVED = json.dumps(
    {
        "error": {
            "message": "This path is not served by the engine.",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }
    }
).encode()


class EnginePathsOnly:
    """ASGI middleware (vLLM's ``--middleware``): a 404 for any HTTP path outside
    :data:`ENGINE_PATHS`, before vLLM reads the request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and scope["path"] not in ENGINE_PATHS:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await send(
                {
                    "type": "http.response.start",
                    "status": 404,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(_NOT_SERVED)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": _NOT_SERVED})
            return
        await self.app(scope, receive, send)
