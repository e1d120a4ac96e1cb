"""A finished trace's children as rows of one list (app/tracing/records.py): the records they
were made from come back whole, failures included, and a child carrying an attribute the rows
cannot hold is refused rather than dropped."""

from __future__ import annotations

import pytest

from app.tracing.records import SERVER, FinishedTrace, SpanRecord


def records() -> list[SpanRecord]:
    root = SpanRecord("chat m", 1, 0, 1_000, SERVER, {"lora_gateway.tenant.id": "t"})
    root.end = 9_000
    plain = SpanRecord("admission", 2, 1, 2_000)
    plain.end = 3_000
    failed = SpanRecord("engine", 3, 1, 3_000)
    failed.end = 8_000
    failed.failed, failed.message = True, "The engine failed."
    failed.attributes = {"error.type": "engine_error"}
    return [root, plain, failed]


def fields(span: SpanRecord) -> tuple[object, ...]:
    return (
        span.name,
        span.span_id,
        span.parent_id,
        span.start,
        span.end,
        span.kind,
        span.attributes,
        span.failed,
        span.message,
    )


def test_the_rows_give_back_the_records_they_were_made_from() -> None:
    finished = FinishedTrace.of(7, None, None, records())
    assert finished.span_count == 3
    assert [fields(span) for span in finished.spans] == [fields(span) for span in records()]


def test_a_child_with_an_attribute_other_than_its_failure_is_refused() -> None:
    root, child, _ = records()
    child.attributes = {"some.attribute": 1}
    with pytest.raises(ValueError, match="admission"):
        FinishedTrace.of(7, None, None, [root, child])
    child.attributes = {"error.type": "x"}  # an error type without a failure
    with pytest.raises(ValueError, match="admission"):
        FinishedTrace.of(7, None, None, [root, child])
