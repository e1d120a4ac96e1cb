"""The scale-out on one machine: a front and two engine processes (vLLM's OpenAI server with
our plugins) on the embedded model, beside a real S3 server on loopback (moto's server mode).
Adapters are uploaded through the front's admin API into the bucket; neither engine is told
about them. The front forwards to engine 1; engine 2 is asked directly, as the endpoint picker
may route there.

GETs are counted on the S3 server itself (moto's request recorder: every request it served,
method and URL), not in our code.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import openai
import pytest

from app.tenancy.storage.s3 import S3Location, s3_client
from tests.support.engine_role import (
    BASE_MODEL_ID,
    EngineProcess,
    engine_process,
    front_process,
)
from tests.support.front_app import ADMIN_TOKEN, admin_call
from tests.support.live_gateway import LiveGateway
from tests.support.lora_requests_info import LoraRequestsInfo, parse_lora_requests_info
from tests.support.s3_server import s3_server, use_s3

pytestmark = pytest.mark.slow

ADAPTER = "legal_advisor@v1"
COLD = "telephony@v1"  # asked for by the cold-load test only, whatever order tests run in
TAMPERED = "tampered@v1"
ALIAS = "contracts"  # the tenant's name for legal_advisor@v1
PROMPT = "The contract says"
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
    keys: dict[str, str]

    def tenant(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.front_url}/v1", api_key=self.keys[tenant], max_retries=0
        )

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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    state = tmp_path_factory.mktemp("engine-role")
    recording = state / "s3-requests.jsonl"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MOTO_RECORDER_FILEPATH", str(recording))  # read by moto's server
        with s3_server() as endpoint, ExitStack() as stack:
            use_s3(env, endpoint)
            location = S3Location(f"adapters-{uuid.uuid4().hex[:12]}", "lgw/adapters")
            s3_client().create_bucket(Bucket=location.bucket)
            store = f"s3://{location.bucket}/{location.prefix}"
            for name, demo in SOURCES.items():
                shutil.copytree(Path("var/adapters") / demo, state / "adapters" / name)
            engines = [
                stack.enter_context(
                    engine_process(
                        {
                            "LORA_GATEWAY_ADAPTER_STORE": store,
                            # A host each: a cold cache, nothing but the bucket to fetch from.
                            "LORA_GATEWAY_ADAPTER_CACHE_DIR": str(state / f"engine-{i}-cache"),
                        },
                        state / "logs",
                    )
                )
                for i in (1, 2)
            ]
            front_env = {
                "LORA_GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{state / 'front.db'}",
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
            for name in SOURCES:  # uploaded through the front, as an admin does
                row = admin_call(front_url, "POST", "/adapters", {"name": name, "path": name})
                digests[f"{name}@v{row['version']}"] = row["sha256"]
            keys = {}
            for tenant in ("acme", "other"):
                admin_call(front_url, "POST", "/tenants", {"id": tenant, "name": tenant})
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
            yield Cluster(endpoint, location, recording, digests, engines, front_url, keys)


def test_an_upload_through_the_front_lands_in_the_bucket(cluster: Cluster) -> None:
    bucket, location = cluster.location.bucket, cluster.location
    digest = cluster.digests[ADAPTER]
    version = s3_client().get_object(Bucket=bucket, Key=location.version_key(ADAPTER))
    assert json.loads(version["Body"].read())["sha256"] == digest
    manifest = s3_client().get_object(Bucket=bucket, Key=location.manifest_key(digest))
    files = {f["name"] for f in json.loads(manifest["Body"].read())["files"]}
    assert files == {"adapter_config.json", "adapter_model.safetensors"}


def test_a_tenant_is_served_through_the_front_by_engine_1_and_engine_2_answers_the_same(
    cluster: Cluster,
) -> None:
    first, second = cluster.engines
    resolved = f"resolved {ADAPTER} to content"
    assert resolved not in first.log_text()
    served = cluster.tenant("acme").completions.create(
        model=ALIAS, prompt=PROMPT, max_tokens=8, temperature=0
    )
    assert served.model == ALIAS  # never the global name
    assert resolved in first.log_text()  # engine 1 loaded it from the bucket for the front
    direct = complete(second, ADAPTER)
    assert direct.status_code == 200, direct.text
    assert direct.json()["choices"][0]["text"] == served.choices[0].text


@pytest.mark.parametrize("model", [ALIAS, ADAPTER, "legal_advisor"])
def test_another_tenant_cannot_reach_the_adapter_through_the_front(
    cluster: Cluster, model: str
) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        cluster.tenant("other").completions.create(model=model, prompt=PROMPT, max_tokens=1)
    message = refused.value.body["message"]  # type: ignore[index]
    assert message == f"The model `{model}` does not exist or you do not have access to it."


def complete(engine: EngineProcess, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(f"{engine.base_url}/v1/completions", json=body, timeout=300)


def test_eight_concurrent_first_requests_cold_load_the_adapter_from_the_bucket_once(
    cluster: Cluster,
) -> None:
    engine = cluster.engines[1]
    cluster.record("reset")
    cluster.record("start")
    try:
        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(lambda _: complete(engine, COLD), range(8)))
    finally:
        cluster.record("stop")
    assert [r.status_code for r in responses] == [200] * 8, responses[0].text
    assert len({r.json()["choices"][0]["text"] for r in responses}) == 1
    assert {r.json()["model"] for r in responses} == {COLD}
    digest = cluster.digests[COLD]
    assert cluster.gets() == {
        f"versions/{COLD}.json": 1,
        f"sha256/{digest}.json": 1,
        f"sha256/{digest}/adapter_config.json": 1,
        f"sha256/{digest}/adapter_model.safetensors": 1,
    }


def test_an_engine_never_told_about_the_adapter_serves_it_token_identically(
    cluster: Cluster,
) -> None:
    first, second = (complete(e, ADAPTER, return_token_ids=True) for e in cluster.engines)
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    tokens = [r.json()["choices"][0]["token_ids"] for r in (first, second)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 8
    assert first.json()["choices"][0]["text"] == second.json()["choices"][0]["text"]
    base = complete(cluster.engines[1], BASE_MODEL_ID, return_token_ids=True)
    assert base.json()["choices"][0]["token_ids"] != tokens[0], "the adapter changed nothing"
    # Both engines list the version under its global name once resolved.
    for engine in cluster.engines:
        models = httpx.get(f"{engine.base_url}/v1/models").json()["data"]
        assert ADAPTER in {model["id"] for model in models}


def test_the_engines_answer_as_the_in_process_gateway_does(
    cluster: Cluster, gateway: LiveGateway
) -> None:
    # The session's in-process gateway (shared with the other e2e tests) serves the same demo
    # adapter's content under the tenant's alias.
    in_process = gateway.client("acme-legal").completions.create(
        model="legal_advisor", prompt=PROMPT, max_tokens=8, temperature=0
    )
    engine = complete(cluster.engines[1], ADAPTER)
    assert engine.status_code == 200, engine.text
    assert engine.json()["choices"][0]["text"] == in_process.choices[0].text


def test_a_corrupted_object_is_refused_and_the_engine_keeps_serving(cluster: Cluster) -> None:
    engine = cluster.engines[0]
    for _ in range(2):  # refused again: nothing half-loaded, nothing left to serve from
        refused = complete(engine, TAMPERED)
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert "adapter_content_corrupt" in message and TAMPERED in message
        assert "does not match its manifest" in message
        assert cluster.location.bucket not in message
    assert complete(engine, ADAPTER).status_code == 200
    models = httpx.get(f"{engine.base_url}/v1/models").json()["data"]
    assert TAMPERED not in {model["id"] for model in models}
    cache = Path(engine.env["LORA_GATEWAY_ADAPTER_CACHE_DIR"])
    assert not (cache / "sha256" / cluster.digests[TAMPERED]).exists()
    assert "adapter tampered@v1 refused" in engine.log_text()


@pytest.mark.parametrize("model", ["nope@v1", "legal_advisor@v7", "legal_advisor", "../x@v1"])
def test_an_unknown_global_name_is_a_404(cluster: Cluster, model: str) -> None:
    response = complete(cluster.engines[0], model)
    assert response.status_code == 404, response.text
    assert response.json()["error"]["type"] == "NotFoundError"


def test_metrics_name_the_global_name_as_the_epp_reads_them(cluster: Cluster) -> None:
    engine = cluster.engines[0]
    body = {"model": ADAPTER, "prompt": PROMPT, "max_tokens": 64, "temperature": 0}
    body |= {"stream": True, "ignore_eos": True}
    seen: list[LoraRequestsInfo | None] = []
    with httpx.stream(
        "POST", f"{engine.base_url}/v1/completions", json=body, timeout=300
    ) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():  # to the end: the engine is idle afterwards
            if line.startswith("data: {") and len(seen) < 8:
                seen.append(parse_lora_requests_info(engine.metrics()))
    in_flight = next(info for info in seen if info is not None and ADAPTER in info.running)
    assert in_flight.max_lora == 2
    assert in_flight.errors == ()
    exposition = engine.metrics()
    assert f'running_lora_adapters="{ADAPTER}"' in exposition
    # Our plugin's residency metrics, written in the engine core, reach vLLM's /metrics.
    assert 'lora_gateway_adapter_swap_seconds_count{stage="load"}' in exposition


def test_the_isolation_fix_is_active_in_every_vllm_process(cluster: Cluster) -> None:
    log = cluster.engines[0].log_text()
    assert "INFO app.engine_role.server: CPU punica isolation fix: active" in log
    active = [line for line in log.splitlines() if "CPU punica isolation fix active" in line]
    processes = {line.split()[1] for line in active}
    assert {"MainProcess", "EngineCore"} <= processes and len(processes) >= 3, active


def test_the_runtime_load_and_unload_endpoints_are_refused_on_engines(cluster: Cluster) -> None:
    # vLLM mounts them with VLLM_ALLOW_RUNTIME_LORA_UPDATING, which the resolver needs; the
    # engine role's middleware refuses them (and the SageMaker /adapters routes) on the port
    # the endpoint picker and Prometheus reach.
    base = cluster.engines[0].base_url
    refused = [
        httpx.post(f"{base}/v1/load_lora_adapter", json={"lora_name": "x@v1", "lora_path": "/"}),
        httpx.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": "legal_advisor@v1"}),
        httpx.post(f"{base}/adapters", json={"name": "x@v1", "src": "/"}),
    ]
    assert [r.status_code for r in refused] == [404, 404, 404]
    assert httpx.get(f"{base}/health").status_code == 200


def prefix_cache_hits(engine: EngineProcess) -> float:
    """Prompt tokens the engine has served from its prefix cache so far."""
    for line in engine.metrics().splitlines():
        if line.startswith("vllm:prefix_cache_hits_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no vllm:prefix_cache_hits_total on the engine")


def test_cache_salt_keeps_one_tenants_cached_prefix_from_another(cluster: Cluster) -> None:
    # The front puts a per-tenant cache_salt in the upstream body; vLLM's server takes it on
    # chat and completions and keys its prefix cache on it.
    engine = cluster.engines[0]
    messages = [{"role": "user", "content": "Summarise the clause. " * 60}]

    def chat(salt: str) -> float:
        before = prefix_cache_hits(engine)
        body = {"model": ADAPTER, "messages": messages, "max_tokens": 1, "cache_salt": salt}
        response = httpx.post(f"{engine.base_url}/v1/chat/completions", json=body, timeout=300)
        assert response.status_code == 200, response.text
        return prefix_cache_hits(engine) - before

    chat("tenant-a")
    assert chat("tenant-b") == 0
    assert chat("tenant-a") > 0
    refused = complete(engine, ADAPTER, cache_salt="tenant@a")
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "cache_salt"
