"""A tenant's view of itself: its usage in the shape of OpenAI's Usage API
(``/v1/organization/usage/completions``) and its limits with what is left of them."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, Field

BucketWidth = Literal["1m", "1h", "1d"]
BUCKET_SECONDS: Final[dict[BucketWidth, int]] = {"1m": 60, "1h": 3600, "1d": 86400}
MAX_BUCKETS: Final[dict[BucketWidth, int]] = {"1m": 1440, "1h": 168, "1d": 31}
DEFAULT_BUCKETS: Final[dict[BucketWidth, int]] = {"1m": 60, "1h": 24, "1d": 7}


class CompletionsUsageResult(BaseModel):
    object: Literal["organization.usage.completions.result"] = (
        "organization.usage.completions.result"
    )
    input_tokens: int
    output_tokens: int
    num_model_requests: int
    model: str | None = Field(None, description="Set when grouped by model.")
    api_key_id: str | None = Field(None, description="Set when grouped by api_key_id.")
    api_key_name: str | None = Field(
        None, description="The key's name, when grouped by api_key_id (not in OpenAI's shape)."
    )
    batch: bool | None = Field(
        None, description="Set when grouped by batch: whether these were batch lines."
    )
    # OpenAI's other dimensions: a tenant has no projects or users here.
    project_id: None = None
    user_id: None = None


class UsageBucket(BaseModel):
    object: Literal["bucket"] = "bucket"
    start_time: int = Field(description="Unix seconds, inclusive.")
    end_time: int = Field(description="Unix seconds, exclusive.")
    results: list[CompletionsUsageResult] = Field(description="Empty: no requests in the bucket.")


class UsagePage(BaseModel):
    object: Literal["page"] = "page"
    data: list[UsageBucket]
    has_more: bool
    next_page: str | None = Field(description="Pass as `page` for the buckets that follow.")


class RateLimitState(BaseModel):
    limit: int = Field(description="Per minute.")
    remaining: int = Field(description="What may be used now.")
    reset_seconds: float = Field(description="Until the whole limit is available again.")


class ConcurrencyState(BaseModel):
    limit: int
    in_use: int
    remaining: int


class BudgetState(BaseModel):
    limit: int = Field(description="Tokens per period.")
    used: int
    remaining: int
    period: Literal["day", "month"]
    current_period: str = Field(description="The period now, in UTC: 2026-12-03 or 2026-12.")


class SubjectLimits(BaseModel):
    """Each limit with what is left of it; ``null``: no such limit."""

    requests_per_minute: RateLimitState | None
    tokens_per_minute: RateLimitState | None
    concurrent_requests: ConcurrencyState | None
    token_budget: BudgetState | None


class OrganizationLimits(BaseModel):
    """A request must pass both the tenant's limits and the calling key's own."""

    object: Literal["organization.limits"] = "organization.limits"
    tenant: SubjectLimits
    api_key_id: str
    api_key: SubjectLimits
