"""The Batch API on the real engine, through the official client end to end: upload a file
of chat requests on an adapter, create a batch, poll it to ``completed``, download its
output and parse every line's body strictly into the SDK's ``ChatCompletion``."""

from __future__ import annotations

import io
import json
import time

import pytest
from openai.types import Batch
from openai.types.chat import ChatCompletion

from tests.support.batches import chat_line, jsonl
from tests.support.live_gateway import LiveGateway

pytestmark = pytest.mark.slow

LINES = 12
POLL_SECONDS = 0.2


def test_a_batch_runs_to_completed_and_every_line_parses(gateway: LiveGateway) -> None:
    client = gateway.client("demo-all")
    questions = ["What is a fever?", "What is a cough?", "What is a rash?"]
    lines = []
    for i in range(LINES):
        line = chat_line(f"q-{i}", "medical_scribe", max_tokens=8, temperature=0)
        line["body"]["messages"] = [{"role": "user", "content": questions[i % len(questions)]}]
        lines.append(line)
    uploaded = client.files.create(
        file=("questions.jsonl", io.BytesIO(jsonl(lines))), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"suite": "e2e"},
    )
    deadline = time.monotonic() + 120  # bounds only a hang
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(POLL_SECONDS)
        batch = client.batches.retrieve(batch.id)
    batch = Batch.model_validate(batch.to_dict())
    assert batch.status == "completed", batch.errors
    assert batch.metadata == {"suite": "e2e"}
    assert batch.request_counts is not None and batch.request_counts.completed == LINES
    assert batch.error_file_id is None and batch.output_file_id is not None

    output = [
        json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()
    ]
    assert [line["custom_id"] for line in output] == [f"q-{i}" for i in range(LINES)]
    for line in output:
        assert line["error"] is None and line["response"]["status_code"] == 200
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.model == "medical_scribe"
        assert completion.usage is not None and 0 < completion.usage.completion_tokens <= 8
        assert completion.choices[0].message.content
