"""The front tests' fixtures: one fake upstream per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fake_upstream import FakeUpstream, fake_upstream


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with fake_upstream() as fake:
        yield fake
