"""The check that refuses to start the engine on CPU without the isolation fix."""

from __future__ import annotations

import logging
from importlib import metadata
from typing import Any

import pytest

from app.inside_vllm import plugin as vllm_plugin
from app.inside_vllm.plugin import IsolationFixUnavailable, require_isolation_fix

OURS = metadata.EntryPoint(
    name="lora_gateway", value="app.inside_vllm.plugin:register", group="vllm.general_plugins"
)
OTHER = metadata.EntryPoint(
    name="lora_filesystem_resolver", value="vllm.plugins:x", group="vllm.general_plugins"
)


def check(
    enabled: bool = True,
    *,
    is_cpu: bool = True,
    version: str = "0.32.0",
    plugins: list[metadata.EntryPoint] | None = None,
    environ: dict[str, str] | None = None,
) -> str:
    return require_isolation_fix(
        enabled,
        is_cpu=is_cpu,
        vllm_version=version,
        find_plugins=lambda: [OURS, OTHER] if plugins is None else plugins,
        environ=environ or {},
    )


def test_the_fix_is_active_when_installed_on_the_pinned_vllm() -> None:
    assert check() == "active"
    assert check(version="0.32.3+cpu") == "active"
    assert check(environ={"VLLM_PLUGINS": "lora_filesystem_resolver,lora_gateway"}) == "active"


def test_the_installed_entry_point_is_ours() -> None:
    # The real metadata of this checkout's installed distribution.
    assert vllm_plugin.PLUGIN_TARGET in [
        ep.value for ep in metadata.entry_points(group="vllm.general_plugins")
    ]
    assert require_isolation_fix(True, is_cpu=True, vllm_version="0.32.0") == "active"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"plugins": [OTHER]}, "is not installed"),
        ({"plugins": []}, "is not installed"),
        (
            {"plugins": [metadata.EntryPoint("lora_gateway", "elsewhere:register", "g")]},
            "is not installed",
        ),
        ({"version": "0.33.0"}, "not 0.33.0"),
        ({"environ": {"VLLM_PLUGINS": "lora_filesystem_resolver"}}, "VLLM_PLUGINS"),
        ({"environ": {"VLLM_PLUGINS": ""}}, "VLLM_PLUGINS"),
    ],
)
def test_the_gateway_refuses_to_start_without_the_fix(options: dict[str, Any], says: str) -> None:
    with pytest.raises(IsolationFixUnavailable) as refused:
        check(**options)
    assert says in str(refused.value)
    assert "LORA_GATEWAY_ISOLATION_FIX=0" in str(refused.value)  # the way out, named


def test_turning_the_fix_off_is_the_one_override_and_it_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="lora_gateway.vllm_plugin"):
        assert check(False, plugins=[], version="0.99.0") == "disabled"
    assert "turned off" in caplog.text


def test_other_platforms_need_no_fix() -> None:
    assert check(is_cpu=False, plugins=[], version="0.99.0") == "not-cpu"
