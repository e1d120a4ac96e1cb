"""One scale-out cluster (tests/support/scale_out.py) for every test in this package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.scale_out import Cluster, running_cluster


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("scale-out")) as running:
        yield running
