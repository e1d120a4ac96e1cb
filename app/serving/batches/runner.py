"""Running batches (docs/batches.md). Every replica runs a :class:`BatchRunner`: it looks for
unfinished batches and drives each one it can lease (:mod:`app.store.leases`), one replica
at a time, from wherever the store says it stopped:

* ``validating``: every line is checked (:mod:`.lines`); one bad line fails the batch, else
  its lines are recorded, pending, and it is ``in_progress``;
* ``in_progress``: its pending lines run, a few at a time, through the online path
  (:meth:`RequestTracker.track`: admission, fairness, quotas) at the ``batch`` priority
  class, each finished line's output committed with its usage record; once none is
  pending it is ``finalizing``, then ``completed`` with its output and error files;
* ``cancelling`` (the tenant cancelled) or past its window: the lines in flight are aborted
  and settled, every unrun line goes to the error file, and it is ``cancelled`` or
  ``expired`` with what it has.

Every store call is shielded: a call cancelled halfway (the replica stops, the lease is lost)
finishes its transaction rather than leave it open holding the store's write lock.

A line cut off by a crash (or by losing the lease) was never committed: it is pending still
and runs again, and its lost attempt is billed nothing (and, cut off here rather than killed,
charged nothing to the token budget: :class:`BatchLine`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from asyncio import shield
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Any, Literal

from app.errors import GatewayError
from app.protocol.batches import BatchError
from app.quota import Limits
from app.scheduling import AdmissionRefused
from app.serving.batches.files import Files
from app.serving.batches.lines import Services, as_pin, check_lines, parsed_body
from app.serving.lifecycle.runs import ADAPTER_VERSION_HEADER
from app.serving.lifecycle.tracking import BatchLine, RequestTracker
from app.store.batches import BatchStore, EnqueuedLimitPassed, PendingLine
from app.store.changes import StoreVersion
from app.store.leases import Leases
from app.store.tables import BatchRow, FileRow
from app.tenancy.registry import TenantRegistry
from app.tenancy.tenants import ApiKey, Principal
from app.usage.ledger import write_records

logger = logging.getLogger(__name__)

Ending = Literal["cancelled", "expired"]
ENDING_ERRORS: dict[Ending, tuple[str, str]] = {
    "cancelled": ("batch_cancelled", "This request was not run: the batch was cancelled."),
    "expired": (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
}


PENDING_PAGE = 256
"""Pending lines read from the store at once: a batch's lines are never all in memory."""


def lease_name(batch_id: str) -> str:
    return f"batch:{batch_id}"


def result_file_id(batch_id: str, name: str) -> str:
    """The id of the batch's ``name`` (output or error) file: the same on every try."""
    return f"file-{uuid.uuid5(uuid.NAMESPACE_URL, f'{batch_id}/{name}').hex}"


def batch_principal(registry: TenantRegistry, batch: BatchRow) -> Principal | None:
    """Who a batch's lines run as: its tenant (while it still exists), in the ``batch``
    priority class whatever its own, charged to its token budget but not to its interactive
    per-minute or concurrency limits; None once the tenant is gone."""
    tenant = registry.tenant(batch.tenant_id)
    if tenant is None or tenant.uid != batch.tenant_uid or not tenant.enabled:
        return None
    budget_only = Limits(
        token_budget=tenant.limits.token_budget, budget_period=tenant.limits.budget_period
    )
    tenant = replace(tenant, priority="batch", limits=budget_only)
    return Principal(tenant=tenant, key=ApiKey(id=batch.key_id, tenant_id=tenant.id, sha256=""))


def _appended(path: Path, lines: list[dict[str, Any]]) -> None:
    with path.open("a") as out:
        out.writelines(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)


async def _append(path: Path, lines: list[dict[str, Any]]) -> None:
    """Append ``lines`` to the file at ``path`` on a thread. Cancelled, it waits for the
    thread's write to end, so that the file its caller then deletes is not written again."""
    writing = asyncio.get_running_loop().run_in_executor(None, _appended, path, lines)
    try:
        await shield(writing)
    except asyncio.CancelledError:
        await asyncio.wait([writing])
        raise


def _line_output(custom_id: str, request_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": f"batch_req_{request_id}", "custom_id": custom_id, **fields}


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        files: Files,
        leases: Leases,
        tracker: RequestTracker,
        registry: Callable[[], TenantRegistry],
        services: Services,
        ready: Callable[[], Awaitable[None]],
        *,
        concurrency: int,
        lease_seconds: float,
        poll_seconds: float,
        store_version: StoreVersion | None = None,
    ) -> None:
        self.store = store
        self.files = files
        self.leases = leases
        self.tracker = tracker
        self.registry = registry
        self.services = services
        self.ready = ready
        self.concurrency = concurrency
        self.lease = timedelta(seconds=lease_seconds)
        self.poll_seconds = poll_seconds
        self.store_version = store_version
        # The store's version when a look found no unfinished batch: none until it moves.
        self._none_at: int | None = None
        self._driven: dict[str, asyncio.Task[None]] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """Drive every batch this replica can lease, until ``stop`` is set; then stop them
        (their unfinished lines stay pending) and let their leases go."""
        try:
            while not stop.is_set():
                try:
                    await self.ready()
                    await self.take_new()
                except GatewayError:
                    pass  # the engine is starting: the batches wait for it
                except Exception:
                    logger.exception("could not look for batches to run")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_seconds)
        finally:
            driven = list(self._driven.values())
            for task in driven:
                task.cancel()
            await asyncio.gather(*driven, return_exceptions=True)

    async def take_new(self) -> None:
        """Drive every unfinished batch this replica can lease and does not drive yet."""
        version = self.store_version.current() if self.store_version is not None else None
        if version is not None and version == self._none_at:
            return  # no batch then, and nothing committed since
        active = await shield(self.store.active_ids(self.store_version))
        self._none_at = None if active else version
        for batch_id in active:
            if batch_id in self._driven:
                continue
            if not await shield(self.leases.take(lease_name(batch_id), self.lease)):
                continue
            task = asyncio.create_task(self._drive(batch_id))
            self._driven[batch_id] = task
            task.add_done_callback(partial(self._done, batch_id))

    def _done(self, batch_id: str, task: asyncio.Task[None]) -> None:
        self._driven.pop(batch_id, None)
        if not task.cancelled() and task.exception() is not None:
            logger.error("batch %s stopped", batch_id, exc_info=task.exception())

    async def _drive(self, batch_id: str) -> None:
        """Drive one leased batch as far as it goes, renewing the lease; give it back after
        (another replica may take it over at once) unless the lease was lost."""
        work = asyncio.create_task(self._advance(batch_id))
        renewals = asyncio.create_task(self._renew(batch_id))
        try:
            done, _ = await asyncio.wait({work, renewals}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, renewals):
                task.cancel()
            await asyncio.gather(work, renewals, return_exceptions=True)
        if work in done:
            await shield(self.leases.release(lease_name(batch_id)))
            work.result()

    async def _renew(self, batch_id: str) -> None:
        """Renew the lease a third of its time before it would lapse; return once it is lost
        (another replica took it over: this one must stop)."""
        while True:
            await asyncio.sleep(self.lease.total_seconds() / 3)
            try:
                if not await shield(self.leases.take(lease_name(batch_id), self.lease)):
                    logger.warning("lost the lease of batch %s", batch_id)
                    return
            except Exception:
                logger.warning("could not renew the lease of batch %s", batch_id, exc_info=True)

    async def _advance(self, batch_id: str) -> None:
        batch = await shield(self.store.by_id(batch_id))
        if batch is None:
            return
        principal = batch_principal(self.registry(), batch)
        if batch.status == "validating":
            if principal is None or self._past_window(batch):
                await self._end(batch, "cancelled" if principal is None else "expired")
                return
            if not await self._validate(batch, principal):
                return
            batch = await shield(self.store.by_id(batch_id))
            assert batch is not None
        if batch.status == "in_progress":
            ending: Ending | None = "cancelled"  # its tenant is gone
            if principal is not None:
                ending = await self._run_lines(batch, principal)
            if ending is None:
                await shield(self.store.move(batch.id, "finalizing", only_from=("in_progress",)))
                batch.status = "finalizing"
            else:
                await self._end(batch, ending)
                return
        if batch.status == "finalizing":
            await self._finalize(batch, "completed", only_from=("finalizing",))
        elif batch.status == "cancelling":
            await self._end(batch, "cancelled")

    @staticmethod
    def _past_window(batch: BatchRow) -> bool:
        return datetime.now(timezone.utc) >= batch.expires_at

    async def _validate(self, batch: BatchRow, principal: Principal) -> bool:
        """Check every line; fail the batch, or start it. Whether it started."""
        await shield(self.store.clear_lines(batch.id))  # an earlier try's, cut off

        async def keep(lines: list[PendingLine]) -> None:
            await shield(self.store.add_lines(batch.id, lines))

        source = await shield(self.files.store.get(batch.tenant_uid, batch.input_file_id))
        if source is None:  # deleted (or expired) before the batch was validated
            missing = BatchError(
                code="invalid_file",
                message=f"The input file {batch.input_file_id} no longer exists.",
                param="input_file_id",
            )
            errors = {"object": "list", "data": [missing.model_dump()]}
            await shield(
                self.store.move(batch.id, "failed", only_from=("validating",), errors=errors)
            )
            return False
        with self.files.contents.local_copy(batch.input_file_id, self.files.spool) as path:
            checked = await check_lines(
                path,
                batch_id=batch.id,
                endpoint=batch.endpoint,
                principal=principal,
                registry=self.registry(),
                services=self.services,
                prepare=self.tracker.prepare,
                keep=keep,
                pins=batch.pins,
            )
        if not checked.error_count:
            start = self.store.start(batch.id, checked.valid, checked.pins, cost=checked.cost)
            try:
                return await shield(start)
            except EnqueuedLimitPassed as passed:
                message = (
                    f"This batch's lines may use {checked.cost} tokens at worst; with your "
                    f"other batches' unrun lines ({passed.enqueued}) that passes your limit, "
                    f"`batch_tokens_enqueued` ({passed.limit})."
                )
                checked.error_count = 1
                checked.errors.append(
                    BatchError(
                        code="token_limit_exceeded", message=message, param="batch_tokens_enqueued"
                    )
                )
        await shield(self.store.clear_lines(batch.id))
        errors = {"object": "list", "data": [e.model_dump() for e in checked.errors]}
        await shield(self.store.move(batch.id, "failed", only_from=("validating",), errors=errors))
        return False

    async def _run_lines(self, batch: BatchRow, principal: Principal) -> Ending | None:
        """Run the pending lines, ``concurrency`` at once, until none is left (None), or the
        batch is cancelled or its window passes (which, once the lines in flight are
        aborted and settled)."""
        ending: list[Ending] = []
        buffered: list[PendingLine] = []
        read = 0  # the last line read from the store
        reading = asyncio.Lock()

        async def next_line() -> PendingLine | None:
            """The next pending line, read from the store a page at a time; within a page,
            the lines that name one model go one after another (in file order), so that an
            adapter's lines run together rather than each taking its slot in turn."""
            nonlocal read
            async with reading:
                if not buffered:
                    page = await shield(
                        self.store.pending(batch.id, after=read, limit=PENDING_PAGE)
                    )
                    if page:
                        read = page[-1].line
                    page.sort(key=lambda line: (str(line.body.get("model")), line.line))
                    buffered.extend(reversed(page))
                return buffered.pop() if buffered else None

        async def worker() -> None:
            while not ending and (line := await next_line()) is not None:
                await self._run_line(batch, principal, line, ending)

        workers = [asyncio.create_task(worker()) for _ in range(self.concurrency)]
        watcher = asyncio.create_task(self._watch(batch, ending))
        try:
            unfinished = set(workers)
            while unfinished:
                done, _ = await asyncio.wait(
                    unfinished | {watcher}, return_when=asyncio.FIRST_COMPLETED
                )
                unfinished -= done
                if watcher in done:
                    if ending:  # abort the lines in flight: each settles as the batch ends
                        for task in workers:
                            task.cancel()
                    break
            await asyncio.gather(*workers, return_exceptions=True)
            failures = [t.exception() for t in workers if not t.cancelled() and t.exception()]
            if failures and failures[0] is not None:
                raise failures[0]
        finally:
            watcher.cancel()
            for task in workers:
                task.cancel()
            await asyncio.gather(watcher, *workers, return_exceptions=True)
        return ending[0] if ending else None

    async def _watch(self, batch: BatchRow, ending: list[Ending]) -> None:
        """Set ``ending`` once the batch is cancelled or past its window."""
        while True:
            current = await shield(self.store.by_id(batch.id))
            if current is None or current.status == "cancelling":
                ending.append("cancelled")
                return
            if self._past_window(current):
                ending.append("expired")
                return
            await asyncio.sleep(self.poll_seconds)

    async def _run_line(
        self, batch: BatchRow, principal: Principal, line: PendingLine, ending: list[Ending]
    ) -> None:
        """Run one line and commit its output with its usage record. Aborted because the
        batch ends, it is settled as such (what it produced billed); aborted otherwise (the
        replica stops), nothing is committed and it runs again later."""
        request_id = f"{batch.id}-{line.line}"
        sink = BatchLine(batch.id, ending=ending)
        status: Literal["ok", "error", "cancelled", "expired"] = "error"
        response: dict[str, Any] = {"status_code": 200, "request_id": request_id}
        try:
            request = parsed_body(batch.endpoint, line.body)
            pinned = as_pin((batch.pins or {}).get(request.model))  # type: ignore[attr-defined]
            if pinned is not None:  # named as the online path names it, in a header
                response["headers"] = {ADAPTER_VERSION_HEADER: str(pinned.version)}
            while True:
                service, prepared = self.services.for_line(
                    batch.endpoint, request, f"resp_{batch.id}_{line.line}"
                )
                try:
                    async with self.tracker.track(
                        service, prepared, principal, request_id, pinned=pinned, batch=sink
                    ) as run:
                        result = await service.complete(prepared, run)
                    break
                except AdmissionRefused as refused:
                    # The engine's queue is full or busy with others' requests: a line waits
                    # for its turn, however long (nothing ran, nothing is billed).
                    await asyncio.sleep(refused.retry_after)
            status = "ok"
            output = _line_output(
                line.custom_id,
                request_id,
                response={**response, "body": result.model_dump(mode="json")},
                error=None,
            )
        except Exception as exc:
            if not isinstance(exc, GatewayError):  # rendered as the online path renders it
                logger.error("batch line %s failed", request_id, exc_info=exc)
                exc = GatewayError("The server had an error while processing your request.")
            response["status_code"] = exc.status_code
            output = _line_output(
                line.custom_id, request_id, response={**response, "body": exc.body()}, error=None
            )
        except asyncio.CancelledError:
            if not ending:
                raise
            status = ending[0]
            code, message = ENDING_ERRORS[status]
            output = _line_output(
                line.custom_id, request_id, response=None, error={"code": code, "message": message}
            )
        commit = self.store.finish_line(
            batch.id, line.line, status, output, also=partial(write_records, records=sink.records)
        )
        await shield(commit)

    async def _end(self, batch: BatchRow, ending: Ending) -> None:
        """Settle every unrun line as ``ending``'s error, then finish the batch so."""
        code, message = ENDING_ERRORS[ending]

        def unrun(line: PendingLine) -> dict[str, Any]:
            error = {"code": code, "message": message}
            request_id = f"{batch.id}-{line.line}"
            return _line_output(line.custom_id, request_id, response=None, error=error)

        await shield(self.store.settle_unrun(batch.id, ending, unrun))
        if ending == "cancelled":
            await shield(
                self.store.move(batch.id, "cancelling", only_from=("validating", "in_progress"))
            )
        await self._finalize(
            batch, ending, only_from=("validating", "in_progress", "cancelling", "finalizing")
        )

    async def _finalize(self, batch: BatchRow, status: str, *, only_from: tuple[str, ...]) -> None:
        """Write the output and error files, then move the batch to ``status`` with them,
        their records added in the same transaction. Their ids are the batch's own: a replica
        cut off between storing them and that transaction leaves nothing recorded (nothing
        counted against the tenant's storage), and the one that finalizes the batch again
        stores them over the same ids."""
        tenant = self.registry().tenant(batch.tenant_id)
        file_ids: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
        rows: list[FileRow] = []
        for field, statuses, name in (
            ("output_file_id", ("ok",), "output"),
            ("error_file_id", ("error", "expired", "cancelled"), "error"),
        ):
            if tenant is None or tenant.uid != batch.tenant_uid:
                continue
            path = await self._written(batch.id, statuses)
            if path is None:
                continue
            file_id = result_file_id(batch.id, name)
            try:
                size = path.stat().st_size
                await asyncio.to_thread(self.files.contents.put, file_id, path)
            finally:
                path.unlink(missing_ok=True)
            rows.append(
                self.files.store.row(
                    batch.tenant_uid,
                    file_id,
                    purpose="batch_output",
                    filename=f"{batch.id}_{name}.jsonl",
                    size=size,
                )
            )
            file_ids[field] = file_id
        moved = self.store.move(batch.id, status, only_from=only_from, files=rows, **file_ids)
        await shield(moved)

    async def _written(self, batch_id: str, statuses: tuple[str, ...]) -> Path | None:
        """The batch's finished lines of ``statuses`` as a JSONL file, read from the store a
        page at a time (a batch's output is never whole in memory); None where it has none."""
        path = self.files.spool_path()
        after = 0
        try:
            while page := await shield(self.store.outputs(batch_id, statuses, after=after)):
                await _append(path, [output for _, output in page])
                after = page[-1][0]
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path if after else None
