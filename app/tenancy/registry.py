"""Answers the two questions of every request: who is calling, and with what."""

from __future__ import annotations

import hmac
import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

from app.errors import AuthenticationError, ModelNotFoundError, PermissionDeniedError
from app.tenancy.adapters import Adapter
from app.tenancy.grants import Grant, Pin
from app.tenancy.keys import hash_key
from app.tenancy.tenants import ApiKey, ModelTarget, Principal, Tenant

_RNG = random.Random()


@dataclass(frozen=True)
class ModelEntry:
    """One model a tenant may call, as listed by ``GET /v1/models``."""

    id: str
    parent: str | None


class TenantRegistry:
    """An immutable view of tenants, their keys and their grants.

    Lookups never touch storage: whoever loads the store builds a new
    registry and swaps it in at once.
    """

    def __init__(
        self, tenants: Iterable[Tenant], keys: Iterable[ApiKey], *, base_model_id: str
    ) -> None:
        self._tenants = {t.id: t for t in tenants}
        self._keys = {k.sha256: k for k in keys if k.tenant_id in self._tenants}
        self.base_model_id = base_model_id
        self._rollouts = [
            (tenant, alias, grant)
            for tenant in self._tenants.values()
            for alias, grant in tenant.grants.items()
            if len(grant.versions) > 1 or grant.shadow is not None
        ]

    def authenticate(self, key: str | None, *, now: datetime | None = None) -> Principal:
        if not key:
            raise AuthenticationError(
                "You didn't provide an API key. Provide it as `Authorization: Bearer <key>`."
            )
        digest = hash_key(key)
        record = self._keys.get(digest)
        # The dict lookup is keyed by a hash of a high-entropy secret; the
        # constant-time compare keeps the final check free of timing signal.
        if record is None or not hmac.compare_digest(record.sha256, digest):
            raise AuthenticationError("Incorrect API key provided.")
        if record.expires_at is not None and record.expires_at <= (now or _utcnow()):
            raise AuthenticationError("The API key provided has expired.")
        tenant = self._tenants[record.tenant_id]
        if not tenant.enabled:
            raise PermissionDeniedError(f"Tenant `{tenant.id}` is disabled.")
        return Principal(tenant=tenant, key=record)

    def tenant(self, tenant_id: str) -> Tenant | None:
        return self._tenants.get(tenant_id)

    def resolve(
        self,
        tenant: Tenant,
        model: str,
        *,
        sticky_key: str = "",
        rng: random.Random = _RNG,
        pinned: Pin | None = None,
    ) -> ModelTarget:
        """The adapter version (or base model) ``model`` names for this tenant: of a split,
        the version :meth:`Grant.pick` picks for ``sticky_key`` (the end user) or ``rng``;
        the ``pinned`` version where one is (a 400 naming its field where the alias no
        longer has it).

        Unknown names, and adapters granted to other tenants, get the same
        404: a tenant cannot learn what others have.
        """
        if model == self.base_model_id and tenant.allow_base_model:
            return ModelTarget(model=model, adapter=None)
        grant = tenant.grants.get(model)
        if grant is None:
            raise ModelNotFoundError(model)
        if pinned is not None:
            return ModelTarget(
                model=model, adapter=pinned.among(grant, model), split=len(grant.versions) > 1
            )
        shadow = grant.shadow
        return ModelTarget(
            model=model,
            adapter=grant.pick(sticky_key, rng),
            split=len(grant.versions) > 1,
            shadow=shadow.adapter if shadow is not None and shadow.drawn(rng) else None,
        )

    def rollouts(self) -> list[tuple[Tenant, str, Grant]]:
        """Every alias served by a split of versions or shadowed: its tenant, name, grant."""
        return self._rollouts

    def models_for(self, tenant: Tenant) -> list[ModelEntry]:
        entries = []
        if tenant.allow_base_model:
            entries.append(ModelEntry(id=self.base_model_id, parent=None))
        for alias in sorted(tenant.grants):
            entries.append(ModelEntry(id=alias, parent=self.base_model_id))
        return entries

    def adapters(self) -> set[Adapter]:
        """Every adapter version some tenant can reach."""
        return {a for t in self._tenants.values() for g in t.grants.values() for a in g.adapters}


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)
