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


@pytest.mark.parametrize("unset", ["", "none", "None"])
def test_the_kv_cache_size_can_be_unset_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, unset: str
) -> None:
    # On a GPU, unset means vLLM's own sizing (gpu_memory_utilization).
    monkeypatch.setenv("LORA_GATEWAY_KV_CACHE_GIB", unset)
    assert Settings().kv_cache_gib is None
    monkeypatch.setenv("LORA_GATEWAY_KV_CACHE_GIB", "3.5")
    assert Settings().kv_cache_gib == 3.5


def test_the_front_role_needs_an_upstream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORA_GATEWAY_ROLE", "front")
    with pytest.raises(ValueError, match="upstream_url"):
        Settings()
    monkeypatch.setenv("LORA_GATEWAY_UPSTREAM_URL", "http://inference-gateway")
    assert Settings().upstream_url == "http://inference-gateway"


def test_latency_objectives_are_unset_by_default_and_set_per_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not Settings(_env_file=None).has_objectives  # type: ignore[call-arg]
    monkeypatch.setenv("LORA_GATEWAY_SLO_TTFT_MS_INTERACTIVE", "")
    monkeypatch.setenv("LORA_GATEWAY_SLO_TPOT_MS_BATCH", "250")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert (settings.slo_ttft_ms_interactive, settings.slo_tpot_ms_batch) == (None, 250.0)
    assert settings.has_objectives
    monkeypatch.setenv("LORA_GATEWAY_SLO_TTFT_MS_BATCH", "0")
    with pytest.raises(ValidationError, match="slo_ttft_ms_batch"):
        Settings(_env_file=None)  # type: ignore[call-arg]


def test_the_deployments_stream_interval_is_within_the_requests_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LORA_GATEWAY_STREAM_INTERVAL", "32")
    monkeypatch.setenv("LORA_GATEWAY_MAX_STREAM_INTERVAL", "16")
    with pytest.raises(ValueError, match="max_stream_interval"):
        Settings(_env_file=None)  # type: ignore[call-arg]
    monkeypatch.setenv("LORA_GATEWAY_MAX_STREAM_INTERVAL", "32")
    assert Settings(_env_file=None).max_stream_interval == 32  # type: ignore[call-arg]
