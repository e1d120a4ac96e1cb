"""An adapter version the engine cannot load fails its own requests, never the engine.

Two versions break after their upload passed: one's weights file is corrupted on disk, the
other's config is rewritten with a feature vLLM refuses. Each first request fails with a clear
error while another tenant's stream runs on; the version is marked unservable and audited, its
next request is refused the same way, and every other tenant is served throughout.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from app.settings import EMBEDDED_MODEL_DIR
from app.tenancy.storage import STORE_DIR
from bench.random_adapters import make_random_adapter
from tests.support.live_gateway import LiveGateway

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Say hello."}]


def corrupt_weights(stored: Path) -> None:
    weights = stored / "adapter_model.safetensors"
    weights.chmod(0o644)
    weights.write_bytes(b"\xff" * 64)


def refused_feature(stored: Path) -> None:
    config_file = stored / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config_file.chmod(0o644)
    config_file.write_text(json.dumps({**config, "lora_bias": True}))


@pytest.mark.parametrize("breakage", [corrupt_weights, refused_feature])
def test_a_version_that_fails_to_load_fails_alone_and_is_marked_unservable(
    gateway: LiveGateway, tmp_path: Path, breakage: Callable[[Path], None]
) -> None:
    name, tenant = f"breakable-{breakage.__name__}", f"breaker-{breakage.__name__}"
    source = make_random_adapter(
        EMBEDDED_MODEL_DIR, tmp_path / "src", rank=8, target_modules=("q_proj",), seed=48
    )
    if breakage is refused_feature:  # other content than the other case's
        (source / "README.md").write_text("# config rewritten after upload\n")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for file in source.iterdir():
            archive.write(file, f"adapter/{file.name}")
    with gateway.admin_client() as admin:
        assert admin.post("/tenants", json={"id": tenant, "name": "Breaker"}).status_code == 201
        key = admin.post(f"/tenants/{tenant}/keys", json={}).json()["key"]
        uploaded = admin.post(
            "/adapters",
            data={"name": name},
            files={"file": ("adapter.zip", buffer.getvalue(), "application/zip")},
        )
        assert uploaded.status_code == 201, uploaded.text
        granted = admin.put(f"/tenants/{tenant}/adapters/broken", json={"adapter": name})
        assert granted.status_code == 200, granted.text
    breakage(gateway.settings.adapter_root / STORE_DIR / uploaded.json()["sha256"])

    broken = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0)
    victim = gateway.client("demo-all")
    stream = victim.chat.completions.create(
        model="legal_advisor", messages=MESSAGES, max_tokens=24, temperature=0, stream=True
    )
    chunks = iter(stream)
    first = next(chunks)  # the victim's request is in the engine
    for attempt in ("loads and fails", "refused as unservable"):
        with pytest.raises(openai.InternalServerError) as failed:
            broken.chat.completions.create(model="broken", messages=MESSAGES, max_tokens=4)
        error = failed.value.body
        assert error["code"] == "adapter_unservable", (attempt, error)  # type: ignore[index]
        assert "`broken`" in error["message"], (attempt, error)  # type: ignore[index]
        assert str(gateway.settings.adapter_root) not in error["message"]  # type: ignore[index]
    rest = list(chunks)
    assert first.id and rest[-1].choices[0].finish_reason in ("stop", "length")

    for tenant_key, model in (("demo-all", "medical_scribe"), ("demo-all", "legal_advisor")):
        answer = gateway.client(tenant_key).chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=4
        )
        assert answer.usage is not None and answer.usage.completion_tokens >= 1
    gateway.run(gateway.engine.check_health())
    assert gateway.wait_idle() == 0

    with gateway.admin_client() as admin:
        version = admin.get(f"/adapters/{name}").json()["versions"][0]
        assert version["unservable"], version
        audit = admin.get("/audit", params={"action": "adapter.unservable"}).json()["data"]
        records = [r for r in audit if r["target"] == f"{name}@v1"]
        assert len(records) == 1, audit
        assert records[0]["actor"] == "engine" and records[0]["detail"]
