"""Engines behind the front (the cluster: tests/support/scale_out.py): adapters resolved from
the bucket on first use, loaded once, checked against their digests, served token-identically
by either engine and as the reference (PEFT) decodes them; metrics the endpoint picker reads;
the routes an engine refuses."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.settings import EMBEDDED_MODEL_DIR
from app.tenancy.storage.s3 import s3_client
from tests.support.engine_role import BASE_MODEL_ID, EngineProcess
from tests.support.lora_requests_info import LoraRequestsInfo, parse_lora_requests_info
from tests.support.reference import reference_greedy
from tests.support.scale_out import (
    ADAPTER,
    ALIAS,
    BRITTLE,
    COLD,
    REFUSED,
    SOURCES,
    SPARES,
    TAMPERED,
    Cluster,
)

pytestmark = pytest.mark.slow

PROMPT = "The contract says"


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
    # The cluster's first request for the adapter (test_front.py, on the same cluster, runs
    # after this module).
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


def test_an_engine_answers_as_the_reference_does(cluster: Cluster) -> None:
    # The reference the isolation suite holds the in-process gateway to (PEFT on the demo
    # adapter, float32, one request alone), so the two modes answer alike.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_MODEL_DIR)
    prompt = tokenizer(PROMPT)["input_ids"]
    (expected,) = reference_greedy(
        EMBEDDED_MODEL_DIR,
        Path("var/adapters") / SOURCES["legal_advisor"],
        [prompt],
        8,
        eos_token_id=tokenizer.eos_token_id,
    )
    engine = complete(cluster.engines[1], ADAPTER, prompt=prompt)
    assert engine.status_code == 200, engine.text
    text = tokenizer.decode(expected.token_ids, skip_special_tokens=True)
    assert engine.json()["choices"][0]["text"] == text


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


def test_an_adapter_that_fails_to_load_fails_only_its_requests(cluster: Cluster) -> None:
    engine = cluster.engines[1]
    refused = complete(engine, REFUSED)  # by the resolver, before vLLM loads anything
    assert refused.status_code == 422, refused.text
    message = refused.json()["error"]["message"]
    assert "lora_bias" in message and "adapter_unservable" in message

    assert complete(engine, BRITTLE).status_code == 200  # loaded, in the host cache
    cached = Path(engine.env["LORA_GATEWAY_ADAPTER_CACHE_DIR"]) / "sha256"
    weights = cached / cluster.digests[BRITTLE] / "adapter_model.safetensors"
    weights.chmod(0o644)
    weights.write_bytes(b"\xff" * 64)  # the disk goes bad under the running engine
    for spare in SPARES:  # push it out of the host cache: its next use reads the disk
        assert complete(engine, spare).status_code == 200, spare
    failed = complete(engine, BRITTLE)
    assert failed.status_code == 500, failed.text
    assert f"adapter {BRITTLE} failed to load" in engine.log_text()

    assert engine.running()
    assert httpx.get(f"{engine.base_url}/health", timeout=30).status_code == 200
    assert complete(engine, ADAPTER).status_code == 200
    assert complete(engine, SPARES[0]).status_code == 200


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
