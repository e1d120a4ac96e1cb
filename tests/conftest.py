"""Fixtures every layer shares: a gateway over a scripted engine (its harness:
tests/support/serving.py), for the serving, API and console tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.serving import ServeFactory, serving
from tools.gateway_cost.server import write_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-model")


@pytest.fixture
def serve(tiny_model_dir: Path, tmp_path: Path) -> ServeFactory:
    """``async with serve(engine, **settings) as served``: a gateway over ``engine``."""
    return serving(tiny_model_dir, tmp_path)
