"""The framework floor (tools/gateway_cost/floor.py): both apps answer the client's chat
stream and are measured."""

from __future__ import annotations

import re

import pytest

from tools.gateway_cost import floor


def test_both_apps_stream_what_the_client_reads_and_each_is_measured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert floor.main(["--streams", "4", "--rounds", "1", "--requests", "8"]) == 0
    printed = capsys.readouterr().out
    for kind in ("asgi", "fastapi"):
        found = re.search(rf"^{kind}: (\d+) us of CPU per request", printed, re.MULTILINE)
        assert found is not None, printed
        assert int(found.group(1)) >= 0
