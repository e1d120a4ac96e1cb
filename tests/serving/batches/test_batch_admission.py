"""How batch lines share the engine with interactive requests, through the real app over an
engine with fixed seats (docs/scheduling.md, "Batch lines"): alone, a batch fills the window
as online load does; an interactive request waiting inside the engine for its first token keeps
new batch lines out, and they go in again once it has it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from vllm import RequestOutput

from tests.support.batches import FAST_BATCHES, chat_line, finished, submitted
from tests.support.responses import client
from tests.support.scripted_engine import ScriptedRequest, SeatedEngine
from tests.support.serving import ServeFactory, chat, eventually

LINE_TOKENS = 10
INTERACTIVE_TOKENS = 3


class LoggedEngine(SeatedEngine):
    """A seated engine that logs each request's arrival and first token, in order."""

    def __init__(self, seats: int, **kwargs: Any) -> None:
        super().__init__(seats, **kwargs)
        self.events: list[tuple[str, str]] = []

    def generate(
        self, prompt_token_ids: Any, params: Any, request_id: str, *args: Any, **kw: Any
    ) -> AsyncIterator[RequestOutput]:
        self.events.append(("arrive", request_id))
        return super().generate(prompt_token_ids, params, request_id, *args, **kw)

    def _output(
        self, request: ScriptedRequest, tokens: list[int], *, finish_reason: str | None
    ) -> RequestOutput:
        if request.produced == 1 and not request.aborted:
            self.events.append(("first", request.request_id))
        return super()._output(request, tokens, finish_reason=finish_reason)

    def kind(self, request_id: str) -> str:
        tokens = self.requests[request_id].params.max_tokens
        return "interactive" if tokens == INTERACTIVE_TOKENS else "line"


async def test_a_batch_alone_fills_the_window_as_online_load_does(serve: ServeFactory) -> None:
    """Its lines take the engine's whole batch (8, the headroom going beyond it), not the
    batch's share beside interactive requests (4)."""
    engine = SeatedEngine(8, step_seconds=0.01)
    async with serve(engine, max_num_seqs=8, scheduler_window=8, **FAST_BATCHES) as served:
        api = client(served)
        lines = [chat_line(f"l-{i}", served.model, max_tokens=LINE_TOKENS) for i in range(30)]
        batch = await finished(api, (await submitted(api, lines)).id)
        assert batch.status == "completed"
        assert engine.peak == 8


async def test_an_interactive_request_waiting_in_the_engine_keeps_batch_lines_out(
    serve: ServeFactory,
) -> None:
    """The engine runs 2 at once; alone, the batch has 8 lines in it, 6 of them queued. An
    interactive request of the same tenant goes in through the headroom, and the engine seats
    it at once in a line's seat: until its first token no new line goes into the engine,
    after it lines do again."""
    engine = LoggedEngine(2, step_seconds=0.02)
    settings = {"max_num_seqs": 8, "scheduler_window": 8, **FAST_BATCHES}
    async with serve(engine, **settings) as served:
        api = client(served)
        lines = [chat_line(f"l-{i}", served.model, max_tokens=LINE_TOKENS) for i in range(30)]
        created = await submitted(api, lines)
        await eventually(lambda: engine.num_unfinished_requests() == 8)
        async with served.client() as http:
            response = await http.post(
                "/v1/chat/completions", json=chat(served, max_tokens=INTERACTIVE_TOKENS)
            )
            assert response.status_code == 200, response.text
        batch = await finished(api, created.id)
        assert batch.status == "completed"

    [interactive] = [r for _, r in engine.events if engine.kind(r) == "interactive"][:1]
    arrived = engine.events.index(("arrive", interactive))
    first = engine.events.index(("first", interactive))
    # Seated on arrival, ahead of the lines queued in the engine, in a line's seat...
    assert engine.waited_behind[interactive] == 0
    assert [engine.kind(r) for r in engine.unseated] == ["line"]
    # ...and none went in before its first token; lines went in again once it had it.
    between = engine.events[arrived + 1 : first]
    assert [r for event, r in between if event == "arrive"] == []
    after = engine.events[first + 1 :]
    assert any(event == "arrive" and engine.kind(r) == "line" for event, r in after)
