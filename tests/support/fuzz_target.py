"""What the fuzz suite drives: the seeded store it restores after each case, the target (base
URL, credentials per path) and the tally of what the fuzzer saw. The fixture that serves the
app is in tests/fuzz/conftest.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from safetensors.numpy import save_file

from tests.fuzz.schema import KNOWN_PATH_PARAMETERS, max_examples
from tests.support.harness import ADMIN_TOKEN

TENANT = "fuzz-tenant"
VICTIM = "fuzz-victim"
ADAPTER = "fuzz_adapter"
ALIAS = "fuzz-alias"
# Small enough that a request asking for the whole context finishes in milliseconds.
MAX_MODEL_LEN = 256


@dataclass
class Tally:
    """What the fuzzer sent and got, for the summary at the end of the run."""

    cases: int = 0
    by_class: dict[str, int] = field(default_factory=dict)
    by_status: dict[int, int] = field(default_factory=dict)
    server_errors: int = 0
    misshapen_errors: int = 0
    failed_cases: int = 0
    streams: int = 0
    by_operation: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, operation: str, status: int, misshapen: bool, content_type: str) -> None:
        self.cases += 1
        classes = self.by_operation.setdefault(operation, {})
        classes[f"{status // 100}xx"] = classes.get(f"{status // 100}xx", 0) + 1
        self.streams += content_type.startswith("text/event-stream")
        status_class = f"{status // 100}xx"
        self.by_class[status_class] = self.by_class.get(status_class, 0) + 1
        self.by_status[status] = self.by_status.get(status, 0) + 1
        self.server_errors += status >= 500
        self.misshapen_errors += misshapen

    def lines(self) -> list[str]:
        classes = ", ".join(f"{k}: {v}" for k, v in sorted(self.by_class.items()))
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(self.by_status.items()))
        return [
            f"cases: {self.cases} (examples per operation and phase: {max_examples()})",
            f"responses by class: {classes}",
            f"responses by status: {statuses}",
            f"streamed (server-sent events) responses: {self.streams}",
            f"responses >= 500: {self.server_errors}",
            f"non-OpenAI-shaped errors: {self.misshapen_errors}",
            f"cases failing a check: {self.failed_cases}",
            "by operation:",
            *(
                f"  {operation}: " + ", ".join(f"{k}: {v}" for k, v in sorted(classes.items()))
                for operation, classes in sorted(self.by_operation.items())
            ),
        ]


TALLY = Tally()


def write_tiny_adapter(directory: Path) -> None:
    """A rank-4 PEFT LoRA on the tiny model's q_proj and v_proj."""
    directory.mkdir(parents=True)
    config = {
        "peft_type": "LORA",
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
    }
    (directory / "adapter_config.json").write_text(json.dumps(config))
    prefix = "base_model.model.model.layers.0.self_attn"
    weights: dict[str, np.ndarray[Any, Any]] = {}
    for module in ("q_proj", "v_proj"):
        weights[f"{prefix}.{module}.lora_A.weight"] = np.ones((4, 8), dtype=np.float32)
        weights[f"{prefix}.{module}.lora_B.weight"] = np.zeros((8, 4), dtype=np.float32)
    save_file(weights, str(directory / "adapter_model.safetensors"))


class Seeds:
    """The store objects the fuzzer is pointed at, and putting back what it changed: read
    first, written only where it differs (every admin write reloads the gateway's registry)."""

    def __init__(self, admin: httpx.Client) -> None:
        self.admin = admin
        self.tenant_key = ""
        self.victim_key_id = ""
        self._grants: dict[str, Any] = {}

    def _call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        return self.admin.request(method, path, json=body)

    def _ensure_tenant(self, tenant_id: str) -> tuple[str, str] | None:
        """The key and key id of a tenant created now; None if it existed (its state put
        back)."""
        found = self._call("GET", f"/tenants/{tenant_id}")
        if found.status_code == 200:
            if not (found.json()["enabled"] and found.json()["allow_base_model"]):
                update = {"enabled": True, "allow_base_model": True}
                patched = self._call("PATCH", f"/tenants/{tenant_id}", update)
                assert patched.status_code == 200, patched.text
            return None
        body = {"id": tenant_id, "name": tenant_id, "allow_base_model": True}
        created = self._call("POST", "/tenants", body)
        assert created.status_code == 201, created.text
        key = self._call("POST", f"/tenants/{tenant_id}/keys", {"name": "fuzz"})
        assert key.status_code == 201, key.text
        return str(key.json()["key"]), str(key.json()["id"])

    def _ensure_grant(self, tenant_id: str) -> None:
        grants = self._call("GET", f"/tenants/{tenant_id}/adapters").json()
        if self._grants.get(tenant_id) in grants:
            return
        granted = self._call("PUT", f"/tenants/{tenant_id}/adapters/{ALIAS}", {"adapter": ADAPTER})
        assert granted.status_code == 200, granted.text
        self._grants[tenant_id] = granted.json()

    def restore(self) -> None:
        for tenant_id in (TENANT, VICTIM):
            created = self._ensure_tenant(tenant_id)
            if created is not None:
                key, key_id = created
                if tenant_id == TENANT:
                    self.tenant_key = key
                else:
                    self.victim_key_id = key_id
        if self._call("GET", f"/adapters/{ADAPTER}").status_code != 200:
            registered = self._call("POST", "/adapters", {"name": ADAPTER, "path": ADAPTER})
            assert registered.status_code == 201, registered.text
        for tenant_id in (TENANT, VICTIM):
            self._ensure_grant(tenant_id)
        victim_keys = self._call("GET", f"/tenants/{VICTIM}/keys").json()
        if not any(k["id"] == self.victim_key_id and k["revoked_at"] is None for k in victim_keys):
            key = self._call("POST", f"/tenants/{VICTIM}/keys", {"name": "fuzz"})
            self.victim_key_id = key.json()["id"]

        KNOWN_PATH_PARAMETERS.update(
            tenant_id=VICTIM, key_id=self.victim_key_id, alias=ALIAS, name=ADAPTER
        )


@dataclass
class FuzzTarget:
    base_url: str
    seeds: Seeds
    base_model: str

    def auth(self, path: str) -> dict[str, str]:
        """The credentials of the operation at ``path``: the tenant key on ``/v1``, the
        admin token elsewhere (admin routes and ``/metrics``)."""
        token = self.seeds.tenant_key if path.startswith("/v1/") else ADMIN_TOKEN
        return {"Authorization": f"Bearer {token}"}
