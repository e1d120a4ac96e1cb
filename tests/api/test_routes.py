"""Routers included once per process: every app gets the routes FastAPI would build, built
once."""

from __future__ import annotations

import pytest
from fastapi import APIRouter, FastAPI

from app.api import health, openai, organization
from app.api.admin import router as admin_router
from app.api.routes import include_routers
from app.main import create_app
from app.settings import Settings

ROUTERS = (health.router, openai.router, organization.router, admin_router)


def test_apps_serve_what_include_router_builds_and_share_the_routes() -> None:
    shared_a, shared_b, built = FastAPI(), FastAPI(), FastAPI()
    include_routers(shared_a, *ROUTERS)
    include_routers(shared_b, *ROUTERS)
    for router in ROUTERS:
        built.include_router(router)

    assert shared_a.openapi() == built.openapi()
    assert [route.path for route in shared_a.routes] == [route.path for route in built.routes]  # type: ignore[attr-defined]
    own = len(FastAPI().routes)  # the app's own: its schema and docs
    assert all(a is b for a, b in zip(shared_a.routes[own:], shared_b.routes[own:], strict=True))


def test_two_gateways_apps_share_their_routes() -> None:
    settings = Settings(_env_file=None, model="unused")
    first, second = create_app(settings), create_app(settings)
    api = [route for route in first.routes if route.path.startswith("/v1/")]  # type: ignore[attr-defined]
    assert api and all(route in second.routes for route in api)


def test_a_router_with_handlers_of_its_own_is_not_shared() -> None:
    router = APIRouter(on_startup=[lambda: None])
    with pytest.raises(AssertionError, match="handlers"):
        include_routers(FastAPI(), router)
