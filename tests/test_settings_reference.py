from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest
from pydantic import Field, SecretStr

from app import cli
from app.settings import Settings
from app.settings_reference import REGENERATE, SECTIONS, help_text, render

PAGE = Path(__file__).resolve().parents[1] / "docs" / "settings.md"


def test_docs_settings_md_is_what_the_cli_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["settings", "--reference"]) == 0
    expected = capsys.readouterr().out
    assert expected == render()
    current = PAGE.read_text() if PAGE.is_file() else ""
    if current != expected:
        diff = difflib.unified_diff(
            current.splitlines(), expected.splitlines(), "docs/settings.md", "rendered", lineterm=""
        )
        shown = "\n".join(list(diff)[:40])
        pytest.fail(f"docs/settings.md is stale; regenerate it: {REGENERATE}\n{shown}")


def test_every_setting_has_a_description() -> None:
    undescribed = [
        name
        for name, field in Settings.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert undescribed == []


def test_every_setting_is_one_row_in_its_section() -> None:
    page = render()
    for name in Settings.model_fields:
        assert page.count(f"| `LORA_GATEWAY_{name.upper()}` |") == 1, name
    headings = [line[3:] for line in page.splitlines() if line.startswith("## ")]
    assert headings == [title for title, _ in SECTIONS]
    # A section holds the fields from its first one up to the next section's first.
    fair = page.split("## Fair scheduler")[1].split("## ")[0]
    assert "`LORA_GATEWAY_SCHEDULER_MAX_QUEUE_SECONDS`" in fair
    assert "`LORA_GATEWAY_MODEL`" not in fair


def test_types_defaults_and_bounds_are_shown_as_written_in_the_environment() -> None:
    rows = {line.split(" | ")[0][3:-1]: line.split(" | ") for line in render().splitlines()}
    assert rows["LORA_GATEWAY_PORT"][1:3] == ["integer, ≥ 0, ≤ 65535", "`8000`"]
    assert rows["LORA_GATEWAY_GPU_MEMORY_UTILIZATION"][1:3] == ["number, > 0, ≤ 1", "`0.9`"]
    assert rows["LORA_GATEWAY_ROLE"][1:3] == ["`all` \\| `front` \\| `engine`", "`all`"]
    assert rows["LORA_GATEWAY_ENFORCE_EAGER"][2] == "`true`"
    assert rows["LORA_GATEWAY_ADAPTER_ROOT"][1:3] == ["path", "`var/adapters`"]
    assert rows["LORA_GATEWAY_MAX_ADAPTER_BYTES"][2] == "`1073741824` (1 GiB)"
    assert rows["LORA_GATEWAY_MAX_CONNECTIONS"][2] == "unset"
    assert rows["LORA_GATEWAY_ADAPTER_STORE"][2] == "empty"


class _WithSecretDefault(Settings):
    admin_token: SecretStr | None = Field(
        SecretStr("lgw-admin-do-not-print"), description="Admin bearer token(s)."
    )


def test_a_secret_default_is_never_printed() -> None:
    page = render(_WithSecretDefault)
    assert "lgw-admin-do-not-print" not in page
    row = next(line for line in page.splitlines() if "`LORA_GATEWAY_ADMIN_TOKEN`" in line)
    assert row.split(" | ")[1:3] == ["secret", "set (hidden)"]


def test_the_page_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = render()
    monkeypatch.setenv("LORA_GATEWAY_PORT", "9999")
    monkeypatch.setenv("LORA_GATEWAY_ADMIN_TOKEN", "lgw-admin-from-the-environment")
    assert render() == expected


def test_markup_in_a_description_stays_text() -> None:
    row = next(line for line in render().splitlines() if "ADAPTER_CACHE_DIR`" in line)
    assert "sha256/&lt;digest>/" in row


def test_plain_settings_prints_the_values_in_effect_as_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LORA_GATEWAY_PORT", "9999")
    assert cli.main(["settings"]) == 0
    assert json.loads(capsys.readouterr().out)["port"] == 9999


def test_the_reference_needs_no_valid_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LORA_GATEWAY_PORT", "not a port")
    assert cli.main(["settings", "--reference"]) == 0
    assert capsys.readouterr().out == render()


def test_the_help_epilog_lists_every_setting_by_section_from_the_same_source() -> None:
    epilog = cli.build_parser().epilog or ""
    assert epilog == help_text()
    headings = [line[:-1] for line in epilog.splitlines() if line and not line.startswith(" ")]
    assert headings[2:] == [title for title, _ in SECTIONS]
    for name in Settings.model_fields:
        assert epilog.count(f"  LORA_GATEWAY_{name.upper()}  (") == 1, name
    assert "  LORA_GATEWAY_ROLE  (all | front | engine; default all)" in epilog
    assert "  LORA_GATEWAY_MAX_ADAPTER_BYTES  (integer, ≥ 1; default 1073741824 (1 GiB))" in epilog
    assert "`" not in epilog
    descriptions = [line for line in epilog.splitlines() if line.startswith("      ")]
    assert descriptions and max(len(line) for line in descriptions) <= 100


def test_a_secret_default_is_never_in_the_help() -> None:
    assert "lgw-admin-do-not-print" not in help_text(_WithSecretDefault)
