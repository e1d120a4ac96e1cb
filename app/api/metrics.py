"""``GET /metrics``: every process's metrics in the Prometheus text format.

Our metrics (:mod:`app.metrics`, recorded in the gateway and in vLLM's
engine processes) and vLLM's own ``vllm:*`` engine metrics, which its
``PrometheusStatLogger`` keeps in this process, all merged from the
multiprocess directory the lifespan sets up. Unauthenticated, like
``/healthz``: expose it only where the scraper can reach it.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.metrics import render

router = APIRouter(tags=["metrics"])


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    # A plain (sync) route: merging the files reads the disk, so FastAPI
    # runs it in its thread pool, off the event loop. The directory is this
    # app's own (set by its lifespan); without one, the environment's.
    body, content_type = render(getattr(request.app.state, "metrics_dir", None))
    return Response(content=body, media_type=content_type)
