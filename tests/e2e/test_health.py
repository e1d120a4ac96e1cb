from __future__ import annotations

import httpx
import pytest

from tests.support.live_gateway import LiveGateway

pytestmark = pytest.mark.slow


def test_probes(gateway: LiveGateway) -> None:
    assert httpx.get(f"{gateway.base_url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{gateway.base_url}/readyz").json() == {"status": "ready"}
