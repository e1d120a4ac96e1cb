"""What an alias a tenant calls is served with: one adapter version, or a weighted split of
several versions of one adapter, picked per request or sticky per end user (docs/rollouts.md).

Sticky picking is weighted rendezvous hashing: each version scores ``weight / -ln(u)``, with
``u`` a hash of the end user and the version, and the highest score wins. A user's version
changes only when a weight change lets another version outscore it, so moving a version from
10% to 20% moves about 10% of users, all of them to that version, and no one else.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from app.errors import BadRequestError
from app.tenancy.adapters import Adapter

MAX_SPLIT_VERSIONS: Final = 8
MAX_SPLIT_WEIGHT: Final = 1000


@dataclass(frozen=True)
class Weighted:
    """One version of a split and its share, relative to the other versions' weights."""

    adapter: Adapter
    weight: int


@dataclass(frozen=True)
class RollbackRule:
    """Move all of a split's traffic to version ``to`` once another version of it fails more
    than ``error_rate`` of at least ``min_requests`` requests over the last
    ``window_seconds``."""

    to: int
    error_rate: float
    window_seconds: int
    min_requests: int


@dataclass(frozen=True)
class Shadow:
    """A candidate version that also runs ``percent`` of the alias's requests, unseen."""

    adapter: Adapter
    percent: int

    def drawn(self, rng: random.Random) -> bool:
        """Whether one request is shadowed."""
        return rng.random() * 100 < self.percent


@dataclass(frozen=True)
class Grant:
    """A tenant's alias: the versions it is served with (one, or a weighted split), whether
    a version is picked per request or once per end user (``sticky``), and when to roll the
    split back on its own."""

    versions: tuple[Weighted, ...]
    sticky: bool = False
    rollback: RollbackRule | None = None
    shadow: Shadow | None = None
    changed_at: datetime | None = None
    """When it was last put or rolled back: its rule judges the requests from then on."""
    revision: int = 0
    """Its changes counted: a rule's rollback applies to the grant it judged, no later one."""
    _live: tuple[Weighted, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        live = tuple(w for w in self.versions if w.weight > 0)
        if not live:
            raise ValueError("a grant needs a version of weight above 0")
        object.__setattr__(self, "_live", live)

    @classmethod
    def of(cls, adapter: Adapter) -> Grant:
        """A grant served by one version."""
        return cls((Weighted(adapter, 1),))

    @property
    def adapters(self) -> tuple[Adapter, ...]:
        """Every version the grant names, those of weight 0 and the shadow included."""
        shadow = (self.shadow.adapter,) if self.shadow else ()
        return tuple(w.adapter for w in self.versions) + shadow

    def pick(self, sticky_key: str, rng: random.Random) -> Adapter:
        """The version one request is served with. ``sticky_key`` names the end user (a
        sticky grant gives the same key the same version while the weights stay); ``rng``
        draws a non-sticky grant's version."""
        live = self._live
        if len(live) == 1:
            return live[0].adapter
        if self.sticky:
            return max(live, key=lambda w: _rendezvous_score(sticky_key, w)).adapter
        return rng.choices(live, weights=[w.weight for w in live])[0].adapter


def _rendezvous_score(key: str, version: Weighted) -> float:
    seed = f"{key}\0{version.adapter.name}\0{version.adapter.version}".encode()
    digest = int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "big")
    unit = (digest + 0.5) / 2**64  # in (0, 1): the log below is finite and negative
    return version.weight / -math.log(unit)


@dataclass(frozen=True)
class Pin:
    """A version a request must be served with, whatever the alias's split says: the one that
    answered the response a Responses chain continues, or the one a batch's lines run on
    (named by ``param``; ``held_by`` says what holds it to that version)."""

    adapter: str
    version: int
    param: str
    held_by: str

    def among(self, grant: Grant, alias: str) -> Adapter:
        """The pinned version, where ``grant`` still names it (a version weighted 0 included:
        it takes no new chains, and ends those it has); else a 400 naming ``param``."""
        for weighted in grant.versions:
            adapter = weighted.adapter
            if adapter.name == self.adapter and adapter.version == self.version:
                return adapter
        raise BadRequestError(
            f"`{alias}` no longer serves version {self.version}, {self.held_by}",
            param=self.param,
        )
