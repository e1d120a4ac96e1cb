"""The in-process measure (tools/gateway_cost/in_process.py): the real app answers every
request it drives with a stream, beside the bare ASGI app, and both are measured."""

from __future__ import annotations

import re

import pytest

from app import access_log
from tools.gateway_cost import in_process


def test_the_app_and_the_bare_app_are_driven_and_measured(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's logging stays as the test session set it up.
    monkeypatch.setattr(access_log, "configure", lambda level, log_format: None)
    in_process.main(["--streams", "2", "--requests", "4", "--rounds", "2", "--tokens", "3"])
    printed = capsys.readouterr().out
    assert len(re.findall(r"^round \d: gateway \d+ us, bare ASGI \d+ us", printed, re.M)) == 2
    summary = re.search(
        r"^chat, 2 streams, max_tokens 3, CPU per request: gateway (\d+)",
        printed,
        re.MULTILINE,
    )
    assert summary is not None, printed
    assert int(summary.group(1)) > 0
