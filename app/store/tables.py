"""Relational schema (SQLAlchemy 2 declarative); migrations live in ``migrations/``."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.tenancy.manifests import GrantSpec
from app.tenancy.tenants import new_cache_salt, new_tenant_uid


def as_utc(moment: datetime) -> datetime:
    """Naive datetimes are taken as UTC."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else as_utc(value).astimezone(timezone.utc)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else as_utc(value)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime}


class TenantRow(Base):
    __tablename__ = "tenants"

    # ``id`` is the public name, which a tenant created after this one is deleted may take
    # again; ``uid`` names this tenant alone (its usage rows, its quota state), for good.
    id: Mapped[str] = mapped_column(String(63), primary_key=True)
    uid: Mapped[str] = mapped_column(String(32), unique=True, index=True, default=new_tenant_uid)
    # The prefix-cache salt: random, never the id (which a later tenant may take again).
    cache_salt: Mapped[str] = mapped_column(String(64), default=new_cache_salt)
    name: Mapped[str] = mapped_column(String(200))
    allow_base_model: Mapped[bool] = mapped_column(Boolean, default=False)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime]
    # Scheduling: the tenant's share of the engine and its class (interactive or batch).
    weight: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    priority: Mapped[str] = mapped_column(
        String(16), default="interactive", server_default="interactive"
    )
    # Its own latency objectives in ms (0: its class's, from the settings).
    slo_ttft_ms: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    slo_tpot_ms: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


class AdapterVersionRow(Base):
    """One immutable adapter version; the adapter is the set sharing a name."""

    __tablename__ = "adapter_versions"
    # The id is vLLM's cache key for the version's weights: it must never be
    # reused after a delete (SQLite reuses rowids unless AUTOINCREMENT).
    __table_args__ = (UniqueConstraint("name", "version"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100), index=True)
    version: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text)
    rank: Mapped[int] = mapped_column(Integer)
    target_modules: Mapped[list[str]] = mapped_column(JSON)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    # Why the engine could not load it, once it failed to: it is refused from then on.
    unservable: Mapped[str | None] = mapped_column(Text)


class GrantRow(Base):
    """A tenant may call adapter ``adapter_name`` as ``alias``: a pinned version, the latest,
    or a weighted split of versions."""

    __tablename__ = "grants"

    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    alias: Mapped[str] = mapped_column(String(100), primary_key=True)
    adapter_name: Mapped[str] = mapped_column(String(100), index=True)
    version: Mapped[int | None] = mapped_column(Integer)
    # A split, version -> weight ({"3": 90, "4": 10}; JSON keys are strings), in place of
    # ``version``.
    weights: Mapped[dict[str, int] | None] = mapped_column(JSON(none_as_null=True))
    # Pick a split's version once per end user rather than per request.
    sticky: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # A candidate version also run on a share of requests: {version, percent}.
    shadow: Mapped[dict[str, int] | None] = mapped_column(JSON(none_as_null=True))
    # Roll back automatically: {to, error_rate, window_seconds, min_requests} (a split only).
    rollback: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # What the last rollback replaced, by whom and when; cleared when the grant is put again.
    rolled_back: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    created_at: Mapped[datetime]
    # When it was last put or rolled back, and how many times: its rule judges the requests
    # from then on, and rolls back only the grant it judged (compare-and-set on ``revision``).
    changed_at: Mapped[datetime | None]
    revision: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    def spec(self) -> GrantSpec:
        """What the row grants, in the shape manifests and the admin API write it."""
        return GrantSpec(
            adapter=self.adapter_name,
            version=self.version,
            versions={int(v): w for v, w in self.weights.items()} if self.weights else None,
            sticky="user" if self.sticky else "request",
            shadow=self.shadow,
            rollback=self.rollback,
        )


class QuotaColumns:
    """The limits a tenant or a key may have; ``None`` is unlimited."""

    requests_per_minute: Mapped[int | None]
    tokens_per_minute: Mapped[int | None]
    max_concurrent_requests: Mapped[int | None]
    token_budget: Mapped[int | None] = mapped_column(BigInteger)
    budget_period: Mapped[str | None] = mapped_column(String(10))
    updated_at: Mapped[datetime]


class QuotaRow(QuotaColumns, Base):
    __tablename__ = "quotas"

    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    # What its files and stored responses may hold together, in bytes (None: the default
    # setting). A tenant's alone: a key has no storage of its own.
    storage_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # The worst-case tokens its batches' unrun lines may add up to (None: unlimited).
    batch_tokens_enqueued: Mapped[int | None] = mapped_column(BigInteger)


class KeyQuotaRow(QuotaColumns, Base):
    """A key's own limits, enforced on top of (so never looser than) its tenant's."""

    __tablename__ = "key_quotas"

    key_id: Mapped[str] = mapped_column(
        ForeignKey("api_keys.id", ondelete="CASCADE"), primary_key=True
    )


class AuditRow(Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(255))
    outcome: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str] = mapped_column(Text, default="")


class RevisionRow(Base):
    """One row whose counter moves on every mutation: replicas poll it to
    know when to reload their in-memory view."""

    __tablename__ = "revision"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0)


class UsageRow(Base):
    """One finished request, as the usage ledger records it."""

    __tablename__ = "usage"
    __table_args__ = (
        Index("ix_usage_tenant_started", "tenant_id", "started_at"),
        Index("ix_usage_tenant_uid_started", "tenant_uid", "started_at"),
        # One version's requests of an alias in time order: a rollback check's first partial
        # minute, and the latest requests a comparison takes its percentiles from.
        Index(
            "ix_usage_version_started",
            "tenant_uid",
            "model",
            "adapter",
            "adapter_version",
            "started_at",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[str] = mapped_column(String(63))
    # The tenant's uid: whose row it is (``tenant_id`` may have named several tenants over
    # time). None where that is not known: the request named none, and its tenant was
    # deleted before the row was written (or, for rows older than the uid, migrated).
    tenant_uid: Mapped[str | None] = mapped_column(String(32))
    key_id: Mapped[str] = mapped_column(String(40))
    endpoint: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(100))
    adapter: Mapped[str | None] = mapped_column(String(100))
    adapter_version: Mapped[int | None]
    # OpenAI's `user`: the client's name for its end user, as sent (at most 256 characters).
    user: Mapped[str | None] = mapped_column(String(256))
    prompt_tokens: Mapped[int]
    completion_tokens: Mapped[int]
    status: Mapped[str] = mapped_column(String(16))
    latency_ms: Mapped[int]
    # How it went, to compare an alias's versions: the first choice's finish reason, the time
    # to its first token and the mean gap between its tokens (None where not seen).
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    ttft_ms: Mapped[int | None]
    itl_ms: Mapped[float | None] = mapped_column(Float)
    # A shadow request: run on a candidate version for comparison, never billed.
    shadow: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Whose doing an ``error`` was: ``version`` (what a rollback rule counts) or ``request``.
    fault: Mapped[str | None] = mapped_column(String(16))
    # The batch whose line it was (docs/batches.md); None for an online request.
    batch_id: Mapped[str | None] = mapped_column(String(64))
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]


class VersionMinuteRow(Base):
    """An alias's requests per adapter version, minute (of their start) and finish reason,
    and how many of them failed by the version's doing: what rollback rules and the versions'
    comparison count from, a day's window being at most 1,440 rows a version and reason.
    The ledger adds to it in the transaction that writes the requests' usage rows."""

    __tablename__ = "version_minutes"
    __table_args__ = (
        Index("ix_version_minutes_minute", "tenant_uid", "model", "adapter", "minute"),
    )

    tenant_uid: Mapped[str] = mapped_column(String(32), primary_key=True)
    model: Mapped[str] = mapped_column(String(100), primary_key=True)
    adapter: Mapped[str] = mapped_column(String(100), primary_key=True)
    adapter_version: Mapped[int] = mapped_column(Integer, primary_key=True)
    minute: Mapped[datetime] = mapped_column(primary_key=True)
    # "" where the request had none.
    finish_reason: Mapped[str] = mapped_column(String(32), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    errors: Mapped[int] = mapped_column(BigInteger)


class RefusalRow(Base):
    """Requests a quota limit refused, per tenant, minute and limit: what the console charts
    (every replica adds its counts)."""

    __tablename__ = "refusals"
    __table_args__ = (Index("ix_refusals_minute", "minute"),)

    tenant_uid: Mapped[str] = mapped_column(String(32), primary_key=True)
    minute: Mapped[datetime] = mapped_column(primary_key=True)
    limit: Mapped[str] = mapped_column(String(16), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(63))
    count: Mapped[int] = mapped_column(BigInteger)


class ConsoleSessionRow(Base):
    """A signed-in admin console: valid on every replica until it expires, is signed out, or
    the admin token it was made from is no longer accepted."""

    __tablename__ = "console_sessions"

    # SHA-256 of the cookie's secret: the store never holds what a browser presents.
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    actor: Mapped[str] = mapped_column(String(64))
    admin_token_sha256: Mapped[str] = mapped_column(String(64), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    ended_by: Mapped[str | None] = mapped_column(String(32))


class StoredResponseRow(Base):
    """A response of the Responses API, stored for its tenant (``store: true``): readable and
    continuable (``previous_response_id``) on every replica. Each row holds its chain's whole
    context, so continuing a chain reads one row."""

    __tablename__ = "stored_responses"
    __table_args__ = (Index("ix_stored_responses_created", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Whose it is: the tenant's uid, never its reusable id.
    tenant_uid: Mapped[str] = mapped_column(String(32))
    # The model as the tenant called it, and the adapter version that answered (a chain
    # continues on it), None for the base model.
    model: Mapped[str] = mapped_column(String(100))
    adapter: Mapped[str | None] = mapped_column(String(100))
    adapter_version: Mapped[int | None]
    # The Response object as it was returned; a background response's, as it stands now.
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    # The body's status, where a conditional write can read it: a background response moves
    # from queued or in_progress to its end once (app/serving/responses/background.py).
    status: Mapped[str] = mapped_column(String(16), server_default="completed")
    # This response's input items, and the chain's items before them.
    input_items: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    context: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    # What the row holds, in bytes of JSON: counted in its tenant's :class:`StorageUsageRow`.
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]


class FileRow(Base):
    """A file of the Files API, its tenant's: what it is; its bytes are in the file contents
    storage (:mod:`app.store.file_contents`), under its id."""

    __tablename__ = "files"
    __table_args__ = (
        Index("ix_files_tenant_created", "tenant_uid", "created_at"),
        Index("ix_files_expires", "expires_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Whose it is: the tenant's uid, never its reusable id.
    tenant_uid: Mapped[str] = mapped_column(String(32))
    # batch (uploaded), batch_output (a batch's results or errors).
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(255))
    # Counted in its tenant's :class:`StorageUsageRow`.
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]


class StorageUsageRow(Base):
    """What a tenant's files and stored responses hold, in bytes: the sum of their rows'
    sizes, kept by every write that adds, resizes or deletes one, in its transaction
    (:mod:`app.store.storage_usage`), so that the storage cap reads one row. Keyed by the
    uid: the rows outlive the tenant's id, and are counted until they are purged."""

    __tablename__ = "storage_usage"

    tenant_uid: Mapped[str] = mapped_column(String(32), primary_key=True)
    bytes: Mapped[int] = mapped_column(BigInteger)


class LeaseRow(Base):
    """A named piece of work one holder (a replica's process) does at a time: held until
    ``expires_at``, renewed while the work goes on, and taken over by another holder once it
    has expired (its holder died). :mod:`app.store.leases`."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    holder: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[datetime]


class BatchRow(Base):
    """A batch of the Batch API, its tenant's (docs/batches.md). Its lines are
    :class:`BatchLineRow`; its progress is theirs, counted here as they finish."""

    __tablename__ = "batches"
    __table_args__ = (
        Index("ix_batches_tenant_created", "tenant_uid", "created_at"),
        Index("ix_batches_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Whose it is: the tenant's uid (its id names it in the registry, the uid checks that it
    # is still the same tenant).
    tenant_uid: Mapped[str] = mapped_column(String(32))
    tenant_id: Mapped[str] = mapped_column(String(63))
    # Whose key created it: its lines' usage records name it.
    key_id: Mapped[str] = mapped_column(String(40))
    endpoint: Mapped[str] = mapped_column(String(32))
    input_file_id: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(16))
    metadata_: Mapped[dict[str, str] | None] = mapped_column("metadata", JSON(none_as_null=True))
    status: Mapped[str] = mapped_column(String(16))
    # Why it failed validation: OpenAI's errors object ({"object": "list", "data": [...]}).
    errors: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # Each model its lines name -> the adapter version they all run on ({"adapter", "version"};
    # None for the base model), resolved once validated.
    pins: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    total: Mapped[int] = mapped_column(Integer, default=0)
    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    output_file_id: Mapped[str | None] = mapped_column(String(64))
    error_file_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    in_progress_at: Mapped[datetime | None]
    finalizing_at: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]
    failed_at: Mapped[datetime | None]
    expired_at: Mapped[datetime | None]
    cancelling_at: Mapped[datetime | None]
    cancelled_at: Mapped[datetime | None]


class BatchLineRow(Base):
    """One request of a batch: pending until it has run, then its output line, written in
    the transaction that writes its usage record (each line billed once)."""

    __tablename__ = "batch_lines"

    batch_id: Mapped[str] = mapped_column(
        ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True
    )
    # Its line in the input file, from 1.
    line: Mapped[int] = mapped_column(Integer, primary_key=True)
    custom_id: Mapped[str] = mapped_column(Text)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    # Its worst-case tokens (prompt and n x max_tokens), as admission reserves them.
    cost: Mapped[int] = mapped_column(BigInteger)
    # pending, ok (the output file), error, expired, cancelled (the error file).
    status: Mapped[str] = mapped_column(String(16))
    # The line as the output or error file has it.
    output: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
