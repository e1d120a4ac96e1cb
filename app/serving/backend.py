"""Where a request runs: the one seam between the request lifecycle and what serves it.

Two backends implement :class:`Backend`: ``InProcessBackend``
(:mod:`app.serving.in_process.backend`) runs requests on the vLLM engine in this process (the
``all`` role); ``Front`` (:mod:`app.serving.front.backend`) forwards them to an upstream
OpenAI server, vLLM's or the Inference Extension's gateway (the ``front`` role). Each is
opened by its :class:`BackendFactory`, which also says what comes with it: the admission
policy in front of it, and whether adapters' content is read from this process's storage.
:func:`backend_factory` is the one place that reads the role (besides the CLI, which runs the
engine role's server instead of this app). See docs/architecture.md.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from app.protocol import ChatCompletionRequest, CompletionRequest
from app.scheduling import Admission
from app.serving.front.backend import FrontFactory
from app.serving.in_process.backend import EngineFactory, InProcessFactory
from app.serving.lifecycle.runs import Service
from app.serving.preparation.structured import OutputConstraints
from app.settings import Settings
from app.tenancy.adapters import Adapter

if TYPE_CHECKING:
    # Annotations only: vLLM's tool parsers load where one is set (preparation.tools).
    from vllm.tool_parsers import ToolParser


class Backend(Protocol):
    """What serves a request once it is admitted: the chat and completion services (built
    once), and its own health."""

    @property
    def chat(self) -> Service[ChatCompletionRequest, Any]: ...

    @property
    def completions(self) -> Service[CompletionRequest, Any]: ...

    async def check_ready(self) -> None:
        """Raise :class:`app.errors.EngineUnavailableError` unless requests can be served."""

    async def check_alive(self) -> None:
        """Raise :class:`app.errors.EngineUnavailableError` if what serves requests has died
        for good: the server then exits, to be restarted."""

    async def retire(self, adapter: Adapter) -> None:
        """Free what ``adapter``, removed and idle, still holds."""


class BackendFactory(Protocol):
    @property
    def name(self) -> str:
        """What serves requests, as a refusal names it while it starts."""

    @property
    def admission(self) -> Admission:
        """The admission policy in front of the backend (:mod:`app.scheduling`)."""

    @property
    def holds_adapter_copies(self) -> bool:
        """Whether requests run here on adapters read from this process's adapter storage (the
        front names them by global name: their content is the engines' to fetch)."""

    def open(
        self, constraints: OutputConstraints, tool_parser: type[ToolParser] | None
    ) -> AbstractAsyncContextManager[Backend, bool | None]:
        """The backend, started (loading a model: seconds to minutes) and stopped on exit."""


def backend_factory(settings: Settings, engine_factory: EngineFactory) -> BackendFactory:
    """Where ``settings`` run requests; ``engine_factory`` starts the in-process engine."""
    if settings.role == "front":
        return FrontFactory(settings)
    return InProcessFactory(settings, engine_factory)
