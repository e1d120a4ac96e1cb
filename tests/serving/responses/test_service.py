"""The Responses service prepares a request as its chat service does, under its own endpoint,
and its output check's errors name the Responses request's fields."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import pytest

from app.errors import BadRequestError
from app.protocol.responses_api import ResponsesRequest
from app.serving.preparation.generation import Generation
from app.serving.preparation.responses import translate
from app.serving.responses.service import ResponsesService


def test_prepare_is_the_chat_services_generation_under_the_responses_endpoint() -> None:
    def check() -> None:
        raise BadRequestError("the schema cannot be enforced", param="response_format")

    # Every field set to something other than its default: each must be carried.
    chats = Generation(
        request_id="req-1",
        endpoint="chat",
        principal=cast(Any, "principal"),
        target=cast(Any, "target"),
        prompt_token_ids=[1, 2, 3],
        params=cast(Any, "params"),
        shadow=True,
        compile_check=check,
    )
    defaults = {f.name: f.default for f in dataclasses.fields(Generation)}
    assert all(getattr(chats, name) != default for name, default in defaults.items())

    class Chat:
        fails_before_streaming = False

        def prepare(self, *args: Any) -> Generation:
            return chats

    request = ResponsesRequest.model_validate({"model": "m", "input": "hi"})
    service = ResponsesService(cast(Any, Chat()), translate(request, []), cast(Any, None))
    prepared = service.prepare(cast(Any, None), cast(Any, None), cast(Any, None), "req-1")
    assert prepared.compile_check is not None and prepared.compile_check is not check
    expected = dataclasses.replace(
        chats, endpoint="responses", compile_check=prepared.compile_check
    )
    assert prepared == expected
    with pytest.raises(BadRequestError) as refused:
        prepared.compile_check()
    assert refused.value.param == "text.format"
