"""What every request model shares: the base model and JSON's types, strictly; and the
shape of a page of a list, as every list endpoint answers."""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, computed_field
from pydantic_core import PydanticCustomError


class OpenAIModel(BaseModel):
    # Clients send fields outside OpenAI's API (other servers' extensions): ignore those.
    # JSON has no NaN or infinity, but Python's parser accepts them: refuse them.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


# The engine's transport (MessagePack) carries signed 64-bit integers at most.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _json_number(value: Any) -> Any:
    # JSON Schema's types, which /openapi.json states: pydantic's lax mode would read
    # `true` as 1 and "0.5" as 0.5.
    if isinstance(value, (bool, str)):
        kind = "a boolean" if isinstance(value, bool) else "a string"
        raise PydanticCustomError("json_number", "must be a number, not {kind}", {"kind": kind})
    return value


JsonNumber = BeforeValidator(_json_number)


# true or false only: lax mode reads 0, "no" and "off" as false.
Flag = Annotated[bool, Field(strict=True)]


Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX), JsonNumber]


TokenCount = Annotated[int, Field(ge=1, le=INT64_MAX), JsonNumber]


Item = TypeVar("Item")


class ObjectList(BaseModel, Generic[Item]):
    """One page of a list, as OpenAI pages lists: ``last_id`` is the next page's ``after``."""

    object: Literal["list"] = "list"
    data: list[Item]
    has_more: bool

    @computed_field  # type: ignore[prop-decorator]
    @property
    def first_id(self) -> str | None:
        return _id(self.data[0]) if self.data else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def last_id(self) -> str | None:
        return _id(self.data[-1]) if self.data else None


def _id(item: Any) -> str:
    return str(item["id"] if isinstance(item, dict) else item.id)
