"""The in-process measure (tools/gateway_cost/in_process.py): the real app answers every
request it drives with a stream, beside the bare ASGI app, and both are measured."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_a_baseline_is_measured_beside_this_checkout(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started: list[tuple[list[str], Path]] = []

    class Measure:
        """A measure's process: the baseline's rounds cost 100 us, this checkout's 80 and 90."""

        returncode = 0

        def __init__(self, command: list[str], *, cwd: Path, **_: object) -> None:
            started.append((command, cwd))
            self._rounds = (100, 100) if cwd == tmp_path else (80, 90)

        def communicate(self) -> tuple[str, None]:
            return "".join(
                f"round {n}: gateway {us} us, bare ASGI 10 us a request\n"
                for n, us in enumerate(self._rounds, 1)
            ), None

    monkeypatch.setattr(in_process.subprocess, "Popen", Measure)
    against = ["--endpoint", "responses", "--baseline-endpoint", "chat"]
    in_process.main(["--baseline", str(tmp_path), "--rounds", "2", *against])
    assert [cwd for _, cwd in started] == [tmp_path, Path(in_process.__file__).parents[2]]
    assert [command[command.index("--endpoint") + 1] for command, _ in started] == [
        "chat",
        "responses",
    ]
    assert not any("--baseline" in command for command, _ in started)
    printed = capsys.readouterr().out
    assert "round 2: baseline 100 us, this checkout 90 us, 0.900x" in printed
    assert "responses against chat, 16 streams, CPU per request, this / baseline: 0.850x" in printed
