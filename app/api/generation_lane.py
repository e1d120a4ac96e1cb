"""The completion endpoints' lane past the router: FastAPI's stack between the app's own
middleware and a route (its exception middleware, its exit stack, the router's match against
every route and the route's own wrapper) costs more per request than the route's work that
follows, and none of it is needed by a :class:`~app.api.generation_route.GenerationRoute`.

:class:`GenerationLane`, the innermost middleware, serves those routes itself: a request for
one (its method and path) goes straight to the route, and a refusal it raises before its
response starts goes to the app's exception handler for it, as Starlette's exception
middleware would send it. Anything else, and any exception no handler takes (a 500), goes on
as before: the first to the router, the second to the server error middleware outside.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from starlette._utils import get_route_path, is_async_callable
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.generation_route import GenerationRoute

Handler = Callable[[Request, Exception], Any]


class GenerationLane:
    """Serves the app's :class:`GenerationRoute` routes without the router (see the module)."""

    # It never looks at a response's body.
    passes_bodies_through: ClassVar[bool] = True

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._routes: dict[tuple[str, str], GenerationRoute] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = None
        if scope["type"] == "http":
            if self._routes is None:
                self._routes = {
                    (method, candidate.path): candidate
                    for candidate in scope["app"].router.routes
                    if isinstance(candidate, GenerationRoute)
                    for method in candidate.methods
                }
            route = self._routes.get((scope["method"], get_route_path(scope)))
        if route is None:
            await self.app(scope, receive, send)
            return
        started = False

        async def noting_start(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await route.serve(scope, receive, noting_start)
        except Exception as exc:
            handler = None if started else _handler(scope["app"].exception_handlers, exc)
            if handler is None:
                raise
            request = Request(scope, receive)
            if is_async_callable(handler):
                response: Response = await handler(request, exc)
            else:
                response = await run_in_threadpool(handler, request, exc)
            await response(scope, receive, send)


def _handler(handlers: dict[Any, Handler], exc: Exception) -> Handler | None:
    """The handler Starlette's exception middleware would pick for ``exc``: by its status for
    an HTTP exception, then by its class's nearest ancestor; never the catch-all (``500`` or
    ``Exception``), which the server error middleware runs outside."""
    if isinstance(exc, HTTPException) and exc.status_code != 500 and exc.status_code in handlers:
        return handlers[exc.status_code]
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None
