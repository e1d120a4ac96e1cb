"""Weighted splits of an alias's versions: by request (a seeded picker) and sticky per end
user (rendezvous hashing: a weight change moves only the users it must)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from app.tenancy.adapters import Adapter
from app.tenancy.grants import Grant, Weighted


def version(number: int) -> Adapter:
    return Adapter("support", number, f"{number:064x}", Path("/x"), 8, ("q_proj",), number)


def split(weights: dict[int, int], *, sticky: bool = False) -> Grant:
    return Grant(tuple(Weighted(version(v), w) for v, w in weights.items()), sticky=sticky)


USERS = [f"user:{n}" for n in range(2000)]


def test_a_split_by_request_follows_the_weights_within_3_points() -> None:
    grant, rng = split({3: 90, 4: 10}), random.Random(20261202)
    picked = Counter(grant.pick("key:k1", rng).version for _ in range(2000))
    assert abs(picked[4] / 2000 - 0.10) <= 0.03
    assert set(picked) == {3, 4}


def test_three_way_split_and_weight_zero_is_never_picked() -> None:
    grant, rng = split({2: 0, 3: 500, 4: 300, 5: 200}), random.Random(7)
    picked = Counter(grant.pick("", rng).version for _ in range(2000))
    assert 2 not in picked
    for number, share in ((3, 0.5), (4, 0.3), (5, 0.2)):
        assert abs(picked[number] / 2000 - share) <= 0.03


def test_a_sticky_split_gives_each_user_one_version_in_the_weights_share() -> None:
    grant = split({3: 90, 4: 10}, sticky=True)
    rngs = [random.Random(seed) for seed in range(3)]
    chosen = {user: {grant.pick(user, rng).version for rng in rngs} for user in USERS}
    assert all(len(versions) == 1 for versions in chosen.values())
    on_new = sum(versions == {4} for versions in chosen.values())
    assert abs(on_new / len(USERS) - 0.10) <= 0.03


def test_moving_10_to_20_percent_moves_about_10_percent_of_users_all_to_the_new_version() -> None:
    before, after = split({3: 90, 4: 10}, sticky=True), split({3: 80, 4: 20}, sticky=True)
    rng = random.Random(0)
    moves = Counter(
        (before.pick(user, rng).version, after.pick(user, rng).version)
        for user in USERS
        if before.pick(user, rng).version != after.pick(user, rng).version
    )
    assert set(moves) == {(3, 4)}
    assert abs(moves[(3, 4)] / len(USERS) - 0.10) <= 0.02


def test_a_version_added_to_a_sticky_split_takes_users_from_the_others_only() -> None:
    before, after = split({3: 50, 4: 50}, sticky=True), split({3: 50, 4: 50, 5: 25}, sticky=True)
    rng = random.Random(0)
    for user in USERS:
        old, new = before.pick(user, rng).version, after.pick(user, rng).version
        assert new in (old, 5)


def test_a_grant_needs_a_version_of_weight_above_zero() -> None:
    with pytest.raises(ValueError, match="weight above 0"):
        split({3: 0, 4: 0})
    assert Grant.of(version(2)).pick("anyone", random.Random(0)) == version(2)
