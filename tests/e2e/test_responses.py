"""The Responses API on the real engine, through the official client: a plain create on an
adapter, and a streamed create continuing it (``previous_response_id``), walked by the SDK's
stream helper; both parse strictly into the SDK's types and stay readable."""

from __future__ import annotations

import pytest
from openai.types.responses import Response

from tests.support.live_gateway import LiveGateway

pytestmark = pytest.mark.slow


def test_a_plain_and_a_streamed_response_on_an_adapter(gateway: LiveGateway) -> None:
    client = gateway.client("demo-all")
    raw = client.responses.with_raw_response.create(
        model="medical_scribe",
        instructions="Answer in one short sentence.",
        input="What is a fever?",
        max_output_tokens=12,
        temperature=0,
    )
    first = Response.model_validate(raw.parse().to_dict())
    assert raw.headers["x-adapter-version"]
    assert first.status in ("completed", "incomplete") and first.output_text
    assert first.usage is not None and 0 < first.usage.output_tokens <= 12

    with client.responses.stream(
        model="medical_scribe",
        input="And a cough?",
        previous_response_id=first.id,
        max_output_tokens=12,
        temperature=0,
    ) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert kinds[-1] in ("response.completed", "response.incomplete")
    second = Response.model_validate(events[-1].response.to_dict())  # type: ignore[union-attr]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert second.output_text == deltas and second.previous_response_id == first.id
    # The chain's first turn came back to the engine in the second's prompt.
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert client.responses.retrieve(second.id).id == second.id
