"""Routers included in an app without building their routes again for every app."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute


def include_routers(app: FastAPI, *routers: APIRouter) -> None:
    """``app.include_router`` for each of ``routers``, their routes shared by the apps of one
    process. FastAPI builds an included router's routes anew for every app (each route's
    dependency tree and its fields' pydantic models, for each of the gateway's ~60 routes),
    and a route holds no app's state: it reaches its app through the request. What
    sharing leaves out, our routers do not use: app-wide dependency overrides, and a router's
    own lifespan or start-up and shut-down handlers."""
    for router in routers:
        app.router.routes.extend(_built(router))


# By the router's id (a router is not hashable), the router kept with its routes so that
# the id is not another's.
_BUILT: dict[int, tuple[APIRouter, tuple[BaseRoute, ...]]] = {}


def _built(router: APIRouter) -> tuple[BaseRoute, ...]:
    if id(router) not in _BUILT:
        assert not (router.on_startup or router.on_shutdown), "its handlers would be lost"
        built = APIRouter()
        built.include_router(router)
        _BUILT[id(router)] = (router, tuple(built.routes))
    return _BUILT[id(router)][1]
