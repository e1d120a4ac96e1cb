"""The app-wide tracing measure (tools/trace_cost_app.py): the real app serves phases with
tracing off, unsampled and on in turn, the traced phases' spans reach the receiver (in a
process of its own), and both threads' CPU is read."""

from __future__ import annotations

import re

import pytest

from app import access_log
from tools import trace_cost_app


def test_the_app_is_measured_traced_against_untraced(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's logging stays as the test session set it up.
    monkeypatch.setattr(access_log, "configure", lambda level, log_format: None)
    figures = trace_cost_app.main(["--streams", "2", "--requests", "4", "--rounds", "2"])
    printed = capsys.readouterr().out
    read = r"^round \d \(.+\): loop \d+ us untraced, \d+ unsampled, \d+ traced;"
    assert len(re.findall(read, printed, re.M)) == 2
    # Traced: the warm-up's 2 requests and each round's 4 (unsampled ones send nothing), each
    # the same whole tree (the request's span and its children: authentication to settlement).
    spans = figures["spans"]
    assert spans % 10 == 0 and spans // 10 >= 8, spans
    assert set(figures) == {"unsampled", "loop", "export_thread", "tracing", "spans"}
    assert f"({spans} spans received)" in printed
