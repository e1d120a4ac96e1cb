"""The scale-out on one machine, shared by the scale-out e2e tests: a front and two engine
processes (vLLM's OpenAI server with our plugins) on the embedded model, beside a real S3
server on loopback (moto's server mode). Adapters are uploaded through the front's admin API
into the bucket; neither engine is told about them. The front forwards to engine 1; engine 2
is asked directly, as the endpoint picker may route there.

GETs are counted on the S3 server itself (moto's request recorder: every request it served,
method and URL), not in our code.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx
import openai
import pytest

from app.settings import EMBEDDED_MODEL_DIR
from app.tenancy.storage.s3 import S3Content, S3Location, s3_client
from bench.random_adapters import make_random_adapter
from tests.support.adapter_dirs import publish_unchecked, with_config
from tests.support.engine_role import EngineProcess, engine_processes, front_process
from tests.support.front_app import admin_call
from tests.support.harness import ADMIN_TOKEN
from tests.support.s3_server import s3_server, use_s3

ADAPTER = "legal_advisor@v1"
COLD = "telephony@v1"  # asked for by the cold-load test only, whatever order tests run in
TAMPERED = "tampered@v1"
ALIAS = "contracts"  # acme's name for legal_advisor@v1
# The load-failure test's own adapters: one it breaks on an engine's disk once loaded, four
# others (one content, four names) that push it out of that engine's host cache
# (max_cpu_loras 4), and one stored without the upload's checks, with a config vLLM refuses.
BRITTLE = "brittle@v1"
SPARES = tuple(f"spare-{n}@v1" for n in range(1, 5))
REFUSED = "refused@v1"
# name: the demo adapter it is a copy of
SOURCES = {
    "legal_advisor": "legal_advisor",
    "telephony": "telephony_support",
    "tampered": "medical_scribe",
}


@dataclass
class Cluster:
    s3_endpoint: str
    location: S3Location
    recording: Path
    digests: dict[str, str]
    engines: list[EngineProcess]
    front_url: str
    database: Path
    keys: dict[str, str]
    """``acme`` (granted ``contracts``, and the base model) and ``other`` (nothing)."""

    def tenant(self, tenant: str = "acme", **options: float) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.front_url}/v1", api_key=self.keys[tenant], max_retries=0, **options
        )

    def usage_row(self, request_id: str) -> tuple[str, int, int]:
        """``(status, prompt_tokens, completion_tokens)`` of a request, once the front
        recorded it."""
        deadline = time.monotonic() + 10
        while True:
            with sqlite3.connect(self.database) as db:
                row = db.execute(
                    "SELECT status, prompt_tokens, completion_tokens FROM usage "
                    "WHERE request_id = ?",
                    (request_id,),
                ).fetchone()
            if row is not None:
                return (str(row[0]), int(row[1]), int(row[2]))
            assert time.monotonic() < deadline, f"no usage record for {request_id}"
            time.sleep(0.05)

    def gets(self) -> Counter[str]:
        """Keys under the prefix the S3 server served GETs for since the recording began."""
        seen: Counter[str] = Counter()
        if not self.recording.exists():
            return seen
        for line in self.recording.read_text().splitlines():
            entry = json.loads(line)
            path = unquote(urlsplit(entry["url"]).path)
            prefix = f"/{self.location.bucket}/{self.location.prefix}/"
            if entry["method"] == "GET" and path.startswith(prefix):
                seen[path.removeprefix(prefix)] += 1
        return seen

    def record(self, action: str) -> None:
        """``reset``, ``start`` or ``stop`` moto's request recording."""
        response = httpx.post(f"{self.s3_endpoint}/moto-api/recorder/{action}-recording")
        assert response.status_code == 200


@contextmanager
def running_cluster(state: Path) -> Iterator[Cluster]:
    """The S3 server, two engines and a front, with their state in ``state``, until the
    block ends; the demo adapters uploaded, one of them tampered with in the bucket."""
    recording = state / "s3-requests.jsonl"
    database = state / "front.db"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MOTO_RECORDER_FILEPATH", str(recording))  # read by moto's server
        with s3_server() as endpoint, ExitStack() as stack:
            use_s3(env, endpoint)
            location = S3Location(f"adapters-{uuid.uuid4().hex[:12]}", "lgw/adapters")
            s3_client().create_bucket(Bucket=location.bucket)
            store = f"s3://{location.bucket}/{location.prefix}"
            for name, demo in SOURCES.items():
                shutil.copytree(Path("var/adapters") / demo, state / "adapters" / name)
            for name, seed in (("brittle", 481), ("spare", 482), ("refused", 483)):
                make_random_adapter(
                    EMBEDDED_MODEL_DIR,
                    state / "adapters" / name,
                    rank=8,
                    target_modules=("q_proj",),
                    seed=seed,
                )
            engine_envs = [
                {
                    "LORA_GATEWAY_ADAPTER_STORE": store,
                    # A host each: a cold cache, nothing but the bucket to fetch from.
                    "LORA_GATEWAY_ADAPTER_CACHE_DIR": str(state / f"engine-{i}-cache"),
                }
                for i in (1, 2)
            ]
            engines = stack.enter_context(engine_processes(engine_envs, state / "logs"))
            front_env = {
                "LORA_GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{database}",
                "LORA_GATEWAY_ADAPTER_ROOT": str(state / "adapters"),
                "LORA_GATEWAY_ADAPTER_STORE": store,
                "LORA_GATEWAY_ADAPTER_CACHE_DIR": str(state / "front-cache"),
                "LORA_GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN,
            }
            front = stack.enter_context(
                front_process(engines[0].base_url, front_env, state / "logs")
            )
            front_url = front.base_url
            digests = {}
            uploads = {name: name for name in SOURCES} | {"brittle": "brittle"}
            uploads |= {spare.split("@")[0]: "spare" for spare in SPARES}
            for name, path in uploads.items():  # uploaded through the front, as an admin does
                row = admin_call(front_url, "POST", "/adapters", {"name": name, "path": path})
                digests[f"{name}@v{row['version']}"] = row["sha256"]
            refused = with_config(state / "adapters" / "refused", lora_bias=True)
            digests[REFUSED] = publish_unchecked(S3Content(location), "refused", 1, refused)
            keys = {}
            for tenant in ("acme", "other"):
                body = {"id": tenant, "name": tenant, "allow_base_model": tenant == "acme"}
                admin_call(front_url, "POST", "/tenants", body)
                keys[tenant] = admin_call(front_url, "POST", f"/tenants/{tenant}/keys", {})["key"]
            admin_call(
                front_url, "PUT", f"/tenants/acme/adapters/{ALIAS}", {"adapter": "legal_advisor"}
            )
            # The upload tampered with in the bucket: one bit of the weights flipped.
            key_of_weights = location.content_key(digests[TAMPERED], "adapter_model.safetensors")
            weights = s3_client().get_object(Bucket=location.bucket, Key=key_of_weights)
            data = weights["Body"].read()
            s3_client().put_object(
                Bucket=location.bucket, Key=key_of_weights, Body=data[:-1] + bytes([data[-1] ^ 1])
            )
            yield Cluster(
                endpoint, location, recording, digests, engines, front_url, database, keys
            )
