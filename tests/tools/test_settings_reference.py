from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from pydantic import Field, SecretStr

from app.settings import Settings
from tools import settings_reference
from tools.settings_reference import PAGE, REGENERATE, SECTIONS, render


def test_docs_settings_md_is_what_the_generator_renders() -> None:
    expected = render()
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


def test_the_command_writes_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "settings.md"
    settings_reference.main(["--output", str(output)])
    assert output.read_text() == render()
    assert str(output) in capsys.readouterr().out
