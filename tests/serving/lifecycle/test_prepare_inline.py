"""A small request is tokenised on the event loop when the tokenizer thread is idle, and only
then: the tokenizer is never used by two threads at once. A request with an output constraint
never is, and its compile check runs in its tenant's turn beside the tokenizer, holding no
other tenant's preparation (issue #48, item 1)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from app.protocol import ChatCompletionRequest
from app.serving.lifecycle.tracking import INLINE_PREPARE_BYTES, RequestTracker
from tests.support.bare_tracker import bare_tracker

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return ChatCompletionRequest.model_validate(body | fields)


PLAIN = chat()


class RecordingService:
    """``prepare`` records the thread it ran on; the first may be held until released."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.release = threading.Event()
        self.hold = False
        self.busy = threading.Lock()

    def prepare(self, request: Any, principal: Any, target: Any, request_id: str) -> Any:
        if not self.busy.acquire(blocking=False):
            raise AssertionError("the tokenizer is in use by another thread")
        try:
            self.threads.append(threading.current_thread().name)
            if self.hold:
                self.release.wait(60)  # bounds a hang only
            return SimpleNamespace(request_id=request_id, compile_check=None)
        finally:
            self.busy.release()


async def prepare(
    tracker: RequestTracker,
    service: Any,
    size: int | None,
    tenant: str = "t",
    request: ChatCompletionRequest = PLAIN,
    request_id: str = "r",
) -> Any:
    principal = SimpleNamespace(tenant=SimpleNamespace(id=tenant))
    return await tracker._prepare(service, request, principal, None, request_id, size)  # type: ignore[arg-type]


async def test_small_bodies_on_the_loop_large_or_unknown_ones_on_the_thread() -> None:
    subject, service = bare_tracker(), RecordingService()
    loop_thread = threading.current_thread().name
    try:
        await prepare(subject, service, 200)
        await prepare(subject, service, INLINE_PREPARE_BYTES + 1)
        await prepare(subject, service, None)
        await prepare(subject, service, INLINE_PREPARE_BYTES)
    finally:
        subject.close()
    assert service.threads[0] == service.threads[3] == loop_thread
    assert service.threads[1].startswith("tokenizer")
    assert service.threads[2].startswith("tokenizer")


async def test_a_small_body_queues_behind_the_thread_while_it_works() -> None:
    subject, service = bare_tracker(), RecordingService()
    service.hold = True
    try:
        large = asyncio.ensure_future(prepare(subject, service, None))
        while not service.threads:
            await asyncio.sleep(0.001)
        small = asyncio.ensure_future(prepare(subject, service, 10))
        await asyncio.sleep(0.01)
        assert not small.done()
        service.hold = False
        service.release.set()
        assert [g.request_id for g in await asyncio.gather(large, small)] == ["r", "r"]
    finally:
        subject.close()
    assert all(name.startswith("tokenizer") for name in service.threads)


async def test_a_request_cancelled_while_queued_does_not_free_the_tokenizer_early() -> None:
    subject, service = bare_tracker(), RecordingService()
    service.hold = True
    try:
        working = asyncio.ensure_future(prepare(subject, service, None))
        while not service.threads:
            await asyncio.sleep(0.001)
        queued = asyncio.ensure_future(prepare(subject, service, None))
        await asyncio.sleep(0.01)
        queued.cancel()  # its client left while it waited for the thread
        await asyncio.gather(queued, return_exceptions=True)
        # The thread is still busy with the first: a small body must not take the tokenizer.
        small = asyncio.ensure_future(prepare(subject, service, 10))
        await asyncio.sleep(0.01)
        service.hold = False
        service.release.set()
        assert [g.request_id for g in await asyncio.gather(working, small)] == ["r", "r"]
    finally:
        subject.close()


async def test_another_tenant_waits_for_the_running_job_only_not_for_a_flood() -> None:
    subject, service = bare_tracker(), RecordingService()
    service.hold = True
    finished: list[str] = []

    async def tokenised(tenant: str) -> None:
        await prepare(subject, service, None, tenant)
        finished.append(tenant)

    try:
        flood = [asyncio.ensure_future(tokenised("attacker")) for _ in range(4)]
        while not service.threads:
            await asyncio.sleep(0.001)
        victim = asyncio.ensure_future(tokenised("victim"))
        await asyncio.sleep(0.01)
        service.hold = False
        service.release.set()
        await asyncio.gather(*flood, victim)
    finally:
        subject.close()
    assert finished == ["attacker", "victim", "attacker", "attacker", "attacker"]


async def test_a_small_body_with_an_output_constraint_is_prepared_on_the_thread() -> None:
    subject, service = bare_tracker(), RecordingService()
    loop_thread = threading.current_thread().name
    constrained = (
        chat(structured_outputs={"json": {"type": "array"}}),
        chat(structured_outputs={"regex": "a+"}),
        chat(response_format={"type": "json_object"}),
        chat(tools=[WEATHER], tool_choice="required"),
    )
    try:
        for request in constrained:
            await prepare(subject, service, 200, request=request)
        await prepare(subject, service, 200, request=chat(response_format={"type": "text"}))
    finally:
        subject.close()
    assert all(name.startswith("tokenizer") for name in service.threads[:-1]), service.threads
    assert service.threads[-1] == loop_thread


async def until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition``; a minute bounds a hang, not a verdict."""
    async with asyncio.timeout(60):
        while not condition():
            await asyncio.sleep(0.001)


class CheckingService:
    """``prepare`` gives each request a compile check that records when it ran, held until
    released; a request without one (``plain``) has none."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.release = threading.Event()

    def prepare(self, request: Any, principal: Any, target: Any, request_id: str) -> Any:
        self.order.append(f"prepared {request_id}")
        if request_id.startswith("plain"):
            return SimpleNamespace(compile_check=None)
        return SimpleNamespace(compile_check=lambda: self._check(request_id))

    def _check(self, request_id: str) -> None:
        self.order.append(f"checking {request_id}")
        self.release.wait(60)  # bounds a hang only


async def test_a_compile_check_holds_neither_the_tokenizer_nor_another_tenants_check() -> None:
    subject, service = bare_tracker(), CheckingService()
    constrained = chat(structured_outputs={"json": {"type": "array"}})

    async def prepared(tenant: str, request_id: str) -> None:
        await prepare(subject, service, None, tenant, constrained, request_id)
        service.order.append(f"ready {request_id}")

    try:
        flood = [asyncio.ensure_future(prepared("attacker", f"a{n}")) for n in range(3)]
        await until(lambda: "checking a0" in service.order)
        # The attacker's first check is running: another tenant's plain request is
        # tokenised and ready meanwhile, and its constrained one is checked next.
        await prepared("victim", "plain")
        victim = asyncio.ensure_future(prepared("victim", "v0"))
        await until(lambda: {"prepared v0", "prepared a2"} <= set(service.order))
        service.release.set()
        await asyncio.gather(*flood, victim)
    finally:
        subject.close()
    checks = [entry for entry in service.order if entry.startswith("checking")]
    assert checks == ["checking a0", "checking v0", "checking a1", "checking a2"]
    assert service.order.index("ready plain") < service.order.index("ready a0")
