"""Reading the console's HTML forms into the admin API's own models, so that a form is
checked exactly as the same call over REST is; a refusal names the field, as there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.datastructures import FormData

from app.admin.mutations import was_audited
from app.admin.service import AdminService
from app.errors import BadRequestError, GatewayError

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class FormError:
    """A refusal shown next to the form ``form`` (its id in the page)."""

    form: str
    message: str
    status: int = 400

    @classmethod
    def of(cls, form: str, error: GatewayError) -> FormError:
        return cls(form, error.message, error.status_code)


def text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def optional_int(form: FormData, name: str) -> int | None:
    """An integer field; empty is ``None``."""
    value = text(form, name)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise BadRequestError(f"`{name}` must be a whole number.", param=name) from None


def checkbox(form: FormData, name: str) -> bool:
    return form.get(name) is not None


def model(cls: type[M], fields: dict[str, Any]) -> M:
    """``cls`` from ``fields`` (empty ones left out), or a 400 naming the first bad field."""
    try:
        return cls.model_validate({k: v for k, v in fields.items() if v not in (None, "")})
    except ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(part) for part in error["loc"]) or None
        raise BadRequestError(f"`{param}`: {error['msg']}", param=param) from exc


async def audit_refusal(admin: AdminService, actor: str, action: str, error: GatewayError) -> None:
    """A form the admin models refused is audited as the REST API audits its 400s (the
    service has audited its own refusals already)."""
    if not was_audited(error):
        await admin.audit(actor, action, "console", "rejected", error.message)
