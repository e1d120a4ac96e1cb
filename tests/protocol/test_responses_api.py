"""What ``POST /v1/responses`` reads: every field of OpenAI's API, as the ``openai`` SDK sends
it, is either served or refused (a 400 naming it), never ignored; an "off" value of a refused
field is accepted."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import response_create_params
from pydantic import ValidationError

from app.protocol.responses_api import REFUSED_FIELDS, ResponsesRequest

SENT = {"model": "m", "input": "hi"}


def test_every_field_the_sdk_sends_is_served_or_refused() -> None:
    """A field a newer SDK adds fails this until it is served or refused."""
    sdk = set(response_create_params.ResponseCreateParamsBase.__annotations__)
    sdk |= set(response_create_params.ResponseCreateParamsStreaming.__annotations__)
    assert sdk - set(ResponsesRequest.model_fields) - set(REFUSED_FIELDS) == set()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("prompt_cache_options", {"mode": "explicit"}),
        ("context_management", [{"type": "compaction"}]),
        ("moderation", {"model": "omni-moderation-latest"}),
        ("stream_options", {"include_obfuscation": True}),
        ("include", ["message.output_text.logprobs"]),
        ("truncation", "auto"),
    ],
)
def test_a_field_not_served_is_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as refused:
        ResponsesRequest.model_validate({**SENT, field: value})
    [error] = refused.value.errors()
    assert error["loc"] == (field,)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stream_options", {"include_obfuscation": False}),
        ("context_management", []),
        ("include", []),
        ("truncation", "disabled"),
        ("moderation", None),
    ],
)
def test_an_off_value_of_a_refused_field_is_accepted(field: str, value: Any) -> None:
    assert ResponsesRequest.model_validate({**SENT, field: value}).model == "m"
