"""Background responses (``background: true``, docs/responses.md): stored at once as
``queued``, then run detached from the HTTP request, through the same path as a foreground
response (:meth:`RequestTracker.track`: admission, quotas reserved then settled, the ledger),
their end written to their stored row. Each runs as a stream read to its end, in both roles
(:meth:`ResponsesService.run_detached`): its counts come as it runs.

Each running background response holds a lease in the store (:mod:`app.store.leases`, the one
the Batch API's runner uses), renewed while it runs. A replica that dies stops renewing: every
replica sweeps for responses whose lease expired and marks them ``failed``, so none stays
``in_progress`` forever. A response is only moved from ``queued`` or ``in_progress`` to its end
by one conditional write: whichever of its runner, a cancel and a sweep comes first wins.

A cancel reaching the replica that runs the response aborts it there at once; on another
replica it marks the row ``cancelled``, and the runner, which looks at its row each time it
renews its lease, aborts it then. Either way the engine request is aborted, settled as the
charging rule says (what the engine produced is charged), and the row keeps that usage.

Every store call is shielded: a call cancelled halfway finishes its transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from asyncio import shield
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

from app.errors import GatewayError
from app.protocol.responses_api import ResponseError
from app.serving.lifecycle.runs import Run
from app.serving.lifecycle.tracking import RequestTracker, Spawn
from app.serving.preparation.responses import Translated
from app.serving.responses.output import error_of, response, usage
from app.serving.responses.service import ResponsesService
from app.store.leases import Leases
from app.store.responses import ResponseStore, StoredResponse
from app.tenancy.adapters import Adapter
from app.tenancy.grants import Pin
from app.tenancy.tenants import Principal

logger = logging.getLogger(__name__)

LEASE_PREFIX = "response:"
ACTIVE = ("queued", "in_progress")
"""The statuses a background response moves on from, once."""
FINAL = ("completed", "incomplete", "failed", "cancelled")

ABANDONED = ResponseError(
    code="server_error",
    message="The replica running this background response stopped before it finished.",
)
STOPPED = ResponseError(
    code="server_error", message="The server stopped before this background response finished."
)


DRAWN = "which was drawn for this background response when it was created"


class Queued(NamedTuple):
    """A background response just started: its Response's body, and the adapter version it
    runs on (None: the base model)."""

    body: dict[str, Any]
    adapter: Adapter | None


def lease_name(response_id: str) -> str:
    return f"{LEASE_PREFIX}{response_id}"


@dataclass
class _Running:
    task: asyncio.Task[None]
    cancelled: bool = False


class BackgroundResponses:
    """This replica's background responses, and its share of the sweep."""

    def __init__(
        self,
        store: ResponseStore,
        leases: Leases,
        tracker: RequestTracker,
        spawn: Spawn,
        *,
        lease_seconds: float,
    ) -> None:
        self.store = store
        self.leases = leases
        self.tracker = tracker
        self.spawn = spawn
        self.lease = timedelta(seconds=lease_seconds)
        self._running: dict[str, _Running] = {}

    async def start(
        self,
        service: ResponsesService,
        translated: Translated,
        principal: Principal,
        request_id: str,
        pinned: Pin | None,
        *,
        prechecked: bool = False,
    ) -> Queued:
        """Store ``translated``'s response as ``queued`` under this replica's lease, start it,
        and return the queued Response's body and the adapter version it runs on; refused, as
        a foreground one would be, where it could not run (its model or pinned version, its
        chain past the context...). ``prechecked``: the tenant's rate limits were checked
        before its body was read (as for a foreground request)."""
        target = await self.tracker.check(
            service, translated.chat, principal, request_id, pinned=pinned
        )
        adapter = target.adapter
        if pinned is None and adapter is not None:  # runs on the version drawn now
            pinned = Pin(adapter.name, adapter.version, "model", DRAWN)
        response_id = translated.response_id
        queued = response(translated, [], status="queued").model_dump(mode="json")
        if not await shield(self.leases.take(lease_name(response_id), self.lease)):
            raise GatewayError("Could not start the background response.")
        row = StoredResponse(
            id=response_id,
            model=translated.request.model,
            adapter=None,
            adapter_version=None,
            body=queued,
            input_items=translated.input_items,
            context=translated.context,
        )
        try:
            await shield(self.store.save(principal.tenant.uid, row))
        except BaseException:
            await shield(self.leases.release(lease_name(response_id)))
            raise
        execution = self._execute(
            service, translated, principal, request_id, pinned, queued, prechecked
        )
        self._running[response_id] = _Running(self.spawn(self._run(response_id, execution)))
        return Queued(queued, adapter)

    async def _run(self, response_id: str, execution: Coroutine[Any, Any, None]) -> None:
        """Run the response (``execution``) while renewing its lease; stop it once the lease is
        lost (a sweep elsewhere has failed it) or it was cancelled on another replica."""
        work = asyncio.create_task(execution)
        watch = asyncio.create_task(self._renew(response_id))
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch in done and not work.done():
                if watch.result():  # cancelled elsewhere: abort it, settle it
                    self._running[response_id].cancelled = True
                work.cancel()
            await asyncio.gather(work, return_exceptions=True)
        except asyncio.CancelledError:  # the server stops
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            raise
        finally:
            lost = watch.done() and not watch.cancelled() and watch.result() is False
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            self._running.pop(response_id, None)
            if not lost:  # a lost lease is another holder's now
                await shield(self.leases.release(lease_name(response_id)))

    async def _renew(self, response_id: str) -> bool:
        """Renew the lease a third of its time before it would lapse, looking at the row each
        time; True once the row says ``cancelled``, False once the lease is lost."""
        while True:
            await asyncio.sleep(self.lease.total_seconds() / 3)
            try:
                if not await shield(self.leases.take(lease_name(response_id), self.lease)):
                    logger.warning("lost the lease of background response %s", response_id)
                    return False
                if await shield(self.store.status(response_id)) == "cancelled":
                    return True
            except Exception:
                logger.warning("could not renew background response %s", response_id, exc_info=True)

    async def _execute(
        self,
        service: ResponsesService,
        translated: Translated,
        principal: Principal,
        request_id: str,
        pinned: Pin | None,
        queued: dict[str, Any],
        prechecked: bool,
    ) -> None:
        """Run it on the chat path, streamed; the service stores its end (completed or
        incomplete).
        A failure, a cancel or a stop is written here, with what the engine produced."""
        response_id = translated.response_id
        request = translated.chat
        ran: list[Run] = []
        try:
            async with self.tracker.track(
                service, request, principal, request_id, pinned=pinned, prechecked=prechecked
            ) as run:
                ran.append(run)
                started = {**queued, "status": "in_progress"}
                await shield(self.store.finish(response_id, started, only_from=("queued",)))
                await service.run_detached(request, run)
        except asyncio.CancelledError:
            running = self._running.get(response_id)
            if running is not None and running.cancelled:
                await self._end(translated, queued, ran, "cancelled", None)
            else:
                await self._end(translated, queued, ran, "failed", STOPPED)
                raise
        except Exception as exc:
            if not isinstance(exc, GatewayError):
                logger.error("background response %s failed", response_id, exc_info=exc)
                exc = GatewayError("The server had an error while processing your request.")
            await self._end(translated, queued, ran, "failed", error_of(exc.body()))
        else:
            # A cancel from another replica may have come after the engine's last token and
            # before its answer was stored (which then left the row as the cancel wrote it):
            # it stays cancelled, without that output, and gets the usage it was charged.
            await self._end(translated, queued, ran, "cancelled", None, only_from=("cancelled",))

    async def _end(
        self,
        translated: Translated,
        queued: dict[str, Any],
        ran: list[Run],
        status: str,
        error: ResponseError | None,
        *,
        only_from: tuple[str, ...] | None = None,
    ) -> None:
        """Write the response's end: ``status``, with no output and the usage of what the
        engine produced, where its status is one of ``only_from`` (by default, one it moves on
        from). A cancel may already have written ``cancelled`` (from another replica): its
        usage is completed here."""
        made = response(translated, [], status=status, error=error)
        if ran:
            made.usage = usage(ran[0].prompt_tokens, ran[0].completion_tokens)
        if only_from is None:
            only_from = (*ACTIVE, "cancelled") if status == "cancelled" else ACTIVE
        body = {**queued, **made.model_dump(mode="json", include={"status", "error", "usage"})}
        body["completed_at"] = made.completed_at
        await shield(self.store.finish(translated.response_id, body, only_from=only_from))

    async def cancel(self, stored: StoredResponse) -> dict[str, Any]:
        """Cancel background response ``stored``, unless it has ended (then it is returned
        unchanged); its body as it stands after."""
        response_id = stored.id
        running = self._running.get(response_id)
        if running is not None:
            running.cancelled = True
            running.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({running.task})
        elif stored.body.get("status") in ACTIVE:
            # Another replica runs it: it aborts it at its next renewal, and completes the
            # usage then.
            body = {**stored.body, "status": "cancelled"}
            await shield(self.store.finish(response_id, body, only_from=ACTIVE))
        return await shield(self.store.body(response_id)) or stored.body

    async def sweep(self) -> int:
        """Fail the background responses whose lease expired (their replica died); how many.
        Each is taken over first, so that two sweeping replicas do it once."""
        failed = 0
        for name in await shield(self.leases.expired(LEASE_PREFIX)):
            if not await shield(self.leases.take(name, self.lease)):
                continue
            response_id = name.removeprefix(LEASE_PREFIX)
            body = await shield(self.store.body(response_id))
            if body is not None and body.get("status") in ACTIVE:
                ended = {**body, "status": "failed", "error": ABANDONED.model_dump()}
                if await shield(self.store.finish(response_id, ended, only_from=ACTIVE)):
                    failed += 1
                    logger.warning("background response %s was abandoned: failed", response_id)
            await shield(self.leases.release(name))
        return failed

    async def run(self, stop: asyncio.Event, every: Callable[[], float]) -> None:
        """Sweep every ``every()`` seconds until ``stop`` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every())
            if stop.is_set():
                return
            try:
                await self.sweep()
            except Exception:
                logger.exception("could not sweep abandoned background responses")
