from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.settings import Settings


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORA_GATEWAY_MAX_LORA_RANK", "16")
    monkeypatch.setenv("LORA_GATEWAY_MAX_LORAS", "6")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert (settings.max_lora_rank, settings.max_loras) == (16, 6)


def test_an_unsupported_lora_rank_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORA_GATEWAY_MAX_LORA_RANK", "12")
    with pytest.raises(ValidationError, match="max_lora_rank"):
        Settings(_env_file=None)  # type: ignore[call-arg]
