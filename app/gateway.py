"""The objects a request handler reaches, one set per app (kept on ``app.state``): the
tenants' registry and its store, the quotas, admission, the usage ledger, and the
:class:`~app.serving.backend.Backend` that runs requests once it has started."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine, Iterable
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin.rollouts import apply_rollback_rules
from app.admin.service import AdminService
from app.admin.sessions import ConsoleSessions
from app.errors import EngineUnavailableError
from app.quota import backend_from_url
from app.quota.local_limit import LocalRateLimit
from app.serving.backend import Backend, BackendFactory
from app.serving.batches.files import Files
from app.serving.batches.lines import Services
from app.serving.batches.runner import BatchRunner
from app.serving.batches.service import Batches
from app.serving.lifecycle.inflight import InFlight
from app.serving.lifecycle.objectives import ClassObjectives
from app.serving.lifecycle.tracking import RequestTracker
from app.serving.preparation.structured import OutputConstraints
from app.serving.preparation.tools import tool_parser_class
from app.serving.responses.background import BackgroundResponses
from app.settings import Settings
from app.store.batches import BatchStore
from app.store.changes import StoreVersion
from app.store.file_contents import open_file_contents, spool_directory
from app.store.files import FileStore
from app.store.leases import Leases, new_holder_id
from app.store.responses import ResponseStore
from app.store.snapshot import load_registry, revision
from app.tenancy.adapters import Adapter
from app.tenancy.base_model import BaseModelInfo
from app.tenancy.registry import TenantRegistry
from app.tenancy.tenants import Principal
from app.usage import UsageLedger

logger = logging.getLogger(__name__)

# How long shutdown waits for work handed to ``Gateway.background`` (quota reconciliations,
# adapter retirements) before cancelling what is left.
BACKGROUND_GRACE_SECONDS = 5.0
# How often the keys' last use is written to the store (and at shutdown).
KEY_USE_SECONDS = 10.0


class Gateway:
    def __init__(
        self,
        settings: Settings,
        sessions: async_sessionmaker[AsyncSession],
        base_model: BaseModelInfo,
        backends: BackendFactory,
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.sessions = sessions
        self.registry = TenantRegistry([], [], base_model_id=settings.base_model_id)
        self.admin = AdminService.from_settings(
            settings, sessions, base_model, on_change=self.reload
        )
        self.admin_tokens = settings.admin_tokens()
        self.console_sessions = ConsoleSessions(
            sessions, timedelta(seconds=settings.console_session_seconds)
        )
        self.output_constraints = OutputConstraints.from_settings(settings)
        # Looked up here so that a misspelt parser stops the gateway at startup.
        self.tool_parser = (
            tool_parser_class(settings.tool_call_parser) if settings.tool_call_parser else None
        )
        self.in_flight = InFlight()
        self.ledger = UsageLedger(sessions, backlog_max=settings.usage_backlog_max)
        self.responses = ResponseStore(sessions, timedelta(days=settings.response_retention_days))
        self.files = Files(
            FileStore(
                sessions,
                timedelta(days=settings.file_retention_days),
                settings.default_storage_bytes,
            ),
            open_file_contents(settings),
            spool_directory(settings),
            max_bytes=settings.max_file_bytes,
            max_lines=settings.max_file_lines,
        )
        self.quota = backend_from_url(
            settings.quota_url,
            fail_open=settings.quota_fail_open,
            lease_seconds=settings.quota_lease_seconds,
        )
        # The calls that read a tenant's own usage and limits (app/api/organization.py).
        self.self_service_limit = LocalRateLimit(settings.self_service_requests_per_minute)
        self.admission = backends.admission
        self.tracker = RequestTracker(
            lambda: self.registry,
            self.in_flight,
            self.ledger,
            self.quota,
            self.background,
            admission=self.admission,
            lease_seconds=settings.quota_lease_seconds,
            shadow_wait_seconds=settings.shadow_wait_seconds,
            objectives=ClassObjectives.from_settings(settings),
            held_copy=self.admin.storage.held_copy if backends.holds_adapter_copies else None,
            held_copy_waits=self.admin.storage.held_copy_waits,
            on_unservable=self.admin.adapter_unservable,
            role=settings.role,
        )
        # Commits to the store, counted where it can tell: a poll that finds none since its
        # last query skips its query.
        self.store_version = StoreVersion(sessions)
        batch_store = BatchStore(sessions)
        self.batches = Batches(
            batch_store,
            self.files,
            timedelta(seconds=settings.batch_window_seconds),
            lambda: self.registry,
        )
        self.leases = Leases(sessions, new_holder_id())
        self.batch_runner = BatchRunner(
            batch_store,
            self.files,
            self.leases,
            self.tracker,
            lambda: self.registry,
            Services(
                chat=lambda: self.backend.chat,
                completions=lambda: self.backend.completions,
                responses=self.responses,
            ),
            self.check_ready,
            concurrency=settings.batch_concurrency or settings.max_num_seqs,
            lease_seconds=settings.batch_lease_seconds,
            poll_seconds=settings.batch_poll_seconds,
            store_version=self.store_version,
        )
        self.background_responses = BackgroundResponses(
            self.responses,
            self.leases,
            self.tracker,
            self.background,
            lease_seconds=settings.response_lease_seconds,
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self.startup_error: str | None = None
        self._backend: Backend | None = None
        self._revision = -1
        self._revision_read_at: int | None = None  # the store's version when it was read
        self._used_keys: set[str] = set()
        self._keys_touched = time.monotonic()

    # -- the in-memory view of the store --------------------------------------

    async def reload(self) -> None:
        self._revision, self.registry = await load_registry(
            self.sessions, base_model_id=self.settings.base_model_id
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The store watcher and the usage ledger's writer run until the block ends. Then
        they stop, background work finishes (or is cancelled after a grace period) and the
        last usage records are written: nothing still uses the store or the quota backend
        when they close, so no connection is left open to keep the process alive."""
        stop = asyncio.Event()
        watcher = asyncio.create_task(self.watch_store(stop))
        writer = asyncio.create_task(self.ledger.run())
        batches = asyncio.create_task(self.batch_runner.run(stop))
        sweeper = asyncio.create_task(
            self.background_responses.run(stop, lambda: self.settings.response_lease_seconds / 3)
        )
        try:
            yield
        finally:
            # The batches stop first: their lines in flight are aborted (pending still, they
            # run again on whichever replica takes the batches over) and leases given back.
            stop.set()
            await asyncio.gather(batches, sweeper, return_exceptions=True)
            # The watcher stops between polls, not inside a query: cancelled inside one, the
            # store's connection can keep its transaction open (a SQLite read lock that the
            # ledger's last write below would wait on) until it is garbage collected.
            stop.set()
            writer.cancel()
            await asyncio.wait([watcher], timeout=BACKGROUND_GRACE_SECONDS)
            watcher.cancel()  # a no-op once it has stopped
            await asyncio.gather(watcher, writer, return_exceptions=True)
            if self._tasks:
                _, late = await asyncio.wait(self._tasks, timeout=BACKGROUND_GRACE_SECONDS)
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)
            await self.responses.close()
            await self.ledger.close()
            self.tracker.close()
            self.store_version.close()

    async def watch_store(self, stop: asyncio.Event) -> None:
        """Follow changes made by other replicas and to the admin token file; record key use
        off the hot path; apply the splits' rollback rules every ``rollback_check_seconds``;
        purge expired stored responses and files every ``response_purge_seconds``; until
        ``stop`` is set."""
        rules_checked = responses_purged = time.monotonic()
        while True:
            with suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.registry_poll_seconds)
            if stop.is_set():
                try:
                    await self._touch_keys(now=True)  # the last uses are recorded too
                except Exception:
                    logger.exception("could not record the keys' last use")
                return
            try:
                # A token removed from the token file is refused from the next poll on.
                self.admin_tokens = self.settings.admin_tokens()
                await self._follow_revision()
                await self._touch_keys()
                if time.monotonic() - rules_checked >= self.settings.rollback_check_seconds:
                    rules_checked = time.monotonic()
                    await self.ledger.flush()  # this replica's latest requests count too
                    await apply_rollback_rules(
                        self.admin, self.sessions, self.registry, datetime.now(timezone.utc)
                    )
            except Exception:
                logger.exception("could not refresh from the store")
            if time.monotonic() - responses_purged >= self.settings.response_purge_seconds:
                responses_purged = time.monotonic()
                try:
                    await self.responses.purge()
                except Exception:
                    logger.exception("could not purge expired stored responses")
                try:
                    await self.files.purge()
                except Exception:
                    logger.exception("could not purge expired files")

    async def _follow_revision(self) -> None:
        """Reload where another replica (or the CLI) changed the registry; the revision is not
        read again while the store has had no commit since it was."""
        version = self.store_version.current()
        if version is not None and version == self._revision_read_at:
            return
        if await revision(self.sessions, self.store_version) != self._revision:
            await self.reload()
        self._revision_read_at = version

    async def _touch_keys(self, now: bool = False) -> None:
        """Record the keys used since the last record, every :data:`KEY_USE_SECONDS` (or
        ``now``): under load, a write at every poll cost more than the record is worth."""
        due = now or time.monotonic() - self._keys_touched >= KEY_USE_SECONDS
        used: set[str] = set()
        if due:
            used, self._used_keys = self._used_keys, set()
            self._keys_touched = time.monotonic()
        await self.admin.touch_keys(used, datetime.now(timezone.utc))

    def authenticate(self, key: str | None) -> Principal:
        principal = self.registry.authenticate(key)
        self._used_keys.add(principal.key_id)
        return principal

    def background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` as a task that shutdown waits for; failures are logged."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("background task failed", exc_info=task.exception())

    async def retire(self, adapters: Iterable[Adapter]) -> None:
        """Free removed versions' resources once their last request is done."""
        for adapter in adapters:
            await self.in_flight.wait_idle(adapter)
            if self._backend is not None:
                await self._backend.retire(adapter)

    # -- the backend ----------------------------------------------------------------

    async def start_backend(self, stack: AsyncExitStack) -> None:
        """Open the backend on ``stack`` (closed with it); a failure is kept, not raised: the
        server then answers 503 saying so, and exits (app/server.py)."""
        try:
            self._backend = await stack.enter_async_context(
                self.backends.open(self.output_constraints, self.tool_parser)
            )
        except Exception as exc:
            self.startup_error = f"{type(exc).__name__}: {exc}"
            logger.exception("%s failed to start", self.backends.name)

    def stop_backend(self) -> None:
        self._backend = None

    @property
    def backend(self) -> Backend:
        """What runs requests; :class:`EngineUnavailableError` until it has started."""
        if self._backend is None:
            subject = self.backends.name[0].upper() + self.backends.name[1:]
            raise EngineUnavailableError(
                f"{subject} is starting; retry shortly."
                if self.startup_error is None
                else f"{subject} failed to start."
            )
        return self._backend

    async def check_ready(self) -> None:
        """Raise :class:`EngineUnavailableError` unless requests can be served."""
        await self.backend.check_ready()
