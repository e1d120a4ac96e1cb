"""The objects a request handler reaches, one set per app (kept on ``app.state``)."""

from __future__ import annotations

from app.engine.base import Engine
from app.errors import EngineUnavailableError
from app.serving.chat import ChatService
from app.serving.completions import CompletionService
from app.settings import Settings
from app.tenancy.registry import TenantRegistry


class Gateway:
    def __init__(self, settings: Settings, registry: TenantRegistry) -> None:
        self.settings = settings
        self.registry = registry
        self._engine: Engine | None = None
        self.startup_error: str | None = None

    def attach_engine(self, engine: Engine | None) -> None:
        self._engine = engine

    @property
    def ready(self) -> bool:
        return self._engine is not None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise EngineUnavailableError(
                "The inference engine is starting; retry shortly."
                if self.startup_error is None
                else "The inference engine failed to start."
            )
        return self._engine

    @property
    def chat(self) -> ChatService:
        return ChatService(self.engine)

    @property
    def completions(self) -> CompletionService:
        return CompletionService(self.engine)
