"""deploy/kubernetes: it renders, every object validates against its API's schema, and it
says what the scale-out needs (docs/scale-out.md): only inference paths through the
inference gateway, GPU engines in the InferencePool, the LoRA affinity scorer in the
endpoint picker's profile, an InferenceObjective per tenant priority class with flow control
to act on it, NetworkPolicies that admit exactly the intended peers, and only settings that
exist."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.serving.front.upstream import OBJECTIVE_HEADER, SHADOW_OBJECTIVE, objective_of
from app.settings import Settings
from app.tenancy.tenants import PRIORITIES, Tenant
from tests.deploy.manifests import (
    KUSTOMIZATION,
    ROOT,
    Manifest,
    Pod,
    allowed,
    config_map_data,
    container_environment,
    find,
    one,
    render,
    schema_errors,
    secret_data,
    vendored_schema_path,
)

NAMESPACE = "lora-gateway"
POOL = "lora-gateway-engines"
GATEWAY = "inference-gateway"
EPP_CONFIG_KEY = "endpoint-picker-config.yaml"
INFERENCE_ROUTES = {
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("GET", "/v1/models"),
}
ADAPTER_ADMIN_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
# Variables the manifests may set besides LORA_GATEWAY_* settings: boto3's, Hugging Face's
# cache, and the endpoint picker's own (its pod identity).
FOREIGN_VARIABLES = {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "HF_HOME",
    "HF_TOKEN",
    "NAMESPACE",
    "POD_NAME",
}


@pytest.fixture(scope="module")
def manifests() -> list[Manifest]:
    return render()


def pod_template(manifests: list[Manifest], deployment: str) -> dict[str, Any]:
    template: dict[str, Any] = one(manifests, "Deployment", deployment)["spec"]["template"]
    return template


def only_container(manifests: list[Manifest], deployment: str) -> dict[str, Any]:
    containers = pod_template(manifests, deployment)["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def epp_config(manifests: list[Manifest]) -> Manifest:
    # The picker's config is a file, not an API object; it is validated as one all the same.
    config: Manifest = yaml.safe_load(
        config_map_data(manifests, "lora-gateway-epp")[EPP_CONFIG_KEY]
    )
    return config


# -- schemas -------------------------------------------------------------------------------


def test_every_rendered_object_validates(manifests: list[Manifest]) -> None:
    kinds = {m["kind"] for m in manifests}
    assert {
        "Gateway",
        "HTTPRoute",
        "InferencePool",
        "InferenceObjective",
        "NetworkPolicy",
        "Deployment",
    } <= kinds
    errors = [error for m in manifests for error in schema_errors(m)]
    assert errors == []


def test_every_object_is_in_the_namespace(manifests: list[Manifest]) -> None:
    namespaced = [m for m in manifests if m["kind"] != "Namespace"]
    assert {m["metadata"].get("namespace") for m in namespaced} == {NAMESPACE}


def test_the_endpoint_picker_config_validates(manifests: list[Manifest]) -> None:
    assert schema_errors(epp_config(manifests)) == []


def break_field(manifest: Manifest, path: list[str | int], value: Any) -> Manifest:
    broken = copy.deepcopy(manifest)
    node: Any = broken
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return broken


@pytest.mark.parametrize(
    ("kind", "name", "path", "value"),
    [
        # A misspelt field: the API server's strict field validation refuses it.
        ("Deployment", "lora-gateway-engine", ["spec", "template", "spec", "replica"], 2),
        ("Deployment", "lora-gateway-front", ["spec", "replicas"], "two"),
        ("NetworkPolicy", "engine-ingress", ["spec", "ingres"], []),
        (
            "HTTPRoute",
            "lora-gateway-inference",
            ["spec", "rules", 0, "matches", 0, "path", "type"],
            "Prefix",
        ),
        ("InferencePool", POOL, ["spec", "targetPorts"], []),
        ("InferencePool", POOL, ["spec", "endpointPickerRef", "failureMode"], "Open"),
        ("InferenceObjective", "interactive", ["spec", "priority"], "high"),
        ("InferenceObjective", "batch", ["spec", "poolRef", "nam"], POOL),
        ("InferenceObjective", "batch", ["spec", "poolRef"], {}),
        ("Gateway", GATEWAY, ["spec", "listeners", 0, "protocl"], "HTTP"),
        ("DestinationRule", "lora-gateway-epp", ["spec", "trafficPolicy", "tls", "mode"], "TLS"),
        # metadata is checked as ObjectMeta for the vendored kinds too.
        ("InferencePool", POOL, ["metadata", "labels"], {"app": 7}),
    ],
)
def test_a_broken_object_is_refused(
    manifests: list[Manifest], kind: str, name: str, path: list[str | int], value: Any
) -> None:
    manifest = one(manifests, kind, name)
    assert schema_errors(manifest) == []
    assert schema_errors(break_field(manifest, path, value)) != []


def test_a_broken_endpoint_picker_config_is_refused(manifests: list[Manifest]) -> None:
    config = epp_config(manifests)
    assert schema_errors(break_field(config, ["schedulingProfile"], [])) != []
    assert schema_errors(break_field(config, ["plugins", 0, "typ"], "queue-scorer")) != []
    assert schema_errors(break_field(config, ["flowControl", "priorityBands", 0], {})) != []


def test_a_kind_without_a_schema_is_an_error() -> None:
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert not vendored_schema_path("example.com/v1", "Widget").exists()
    assert schema_errors(unknown) != []


def test_a_broken_kustomization_does_not_render(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - missing.yaml\n")
    with pytest.raises(RuntimeError, match=r"missing\.yaml"):
        render(tmp_path)


# -- the inference gateway -----------------------------------------------------------------


def test_the_route_exposes_only_the_inference_paths(manifests: list[Manifest]) -> None:
    routes = find(manifests, "HTTPRoute")
    assert [r["metadata"]["name"] for r in routes] == ["lora-gateway-inference"]
    exposed = set()
    for rule in routes[0]["spec"]["rules"]:
        # A rule without matches would match every path ("/" prefix).
        assert rule.get("matches"), "a rule without matches routes everything"
        for match in rule["matches"]:
            assert match["path"]["type"] == "Exact"
            exposed.add((match.get("method"), match["path"]["value"]))
        assert rule["backendRefs"] == [
            {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": POOL}
        ]
    assert exposed == INFERENCE_ROUTES
    assert not any(path.startswith(ADAPTER_ADMIN_PATHS) for _, path in exposed)
    assert routes[0]["spec"]["parentRefs"][0]["name"] == GATEWAY


def test_the_gateway_is_internal(manifests: list[Manifest]) -> None:
    gateway = one(manifests, "Gateway", GATEWAY)
    assert gateway["spec"]["gatewayClassName"] == "istio"
    assert gateway["metadata"]["annotations"]["networking.istio.io/service-type"] == "ClusterIP"


def test_the_front_forwards_to_the_inference_gateway(manifests: list[Manifest]) -> None:
    front = container_environment(manifests, only_container(manifests, "lora-gateway-front"))
    gateway = one(manifests, "Gateway", GATEWAY)
    # Istio names the Service it runs for a Gateway <gateway name>-<class name>.
    service = f"{GATEWAY}-{gateway['spec']['gatewayClassName']}"
    port = gateway["spec"]["listeners"][0]["port"]
    assert port == 80
    assert front["LORA_GATEWAY_UPSTREAM_URL"] == f"http://{service}.{NAMESPACE}.svc.cluster.local"
    assert front["LORA_GATEWAY_ROLE"] == "front"


# -- engines, pool, endpoint picker --------------------------------------------------------


def test_engine_pods_take_a_gpu_each_and_the_pool_selects_them(
    manifests: list[Manifest],
) -> None:
    template = pod_template(manifests, "lora-gateway-engine")
    engine = only_container(manifests, "lora-gateway-engine")
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == 1
    pool = one(manifests, "InferencePool", POOL)
    selector = pool["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    assert template["metadata"]["labels"]["llm-d.ai/engine-type"] == "vllm"
    # No other pod is in the pool.
    for deployment in find(manifests, "Deployment"):
        if deployment["metadata"]["name"] != "lora-gateway-engine":
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            assert not selector.items() <= labels.items()
    port = engine["ports"][0]
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [port["containerPort"]]
    environment = container_environment(manifests, engine)
    assert environment["LORA_GATEWAY_ROLE"] == "engine"
    assert int(environment["LORA_GATEWAY_PORT"]) == port["containerPort"]
    assert environment["LORA_GATEWAY_HOST"] == "0.0.0.0"


def test_engine_probes_ask_vllms_health_and_the_cache_volume_is_mounted(
    manifests: list[Manifest],
) -> None:
    engine = only_container(manifests, "lora-gateway-engine")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert engine[probe]["httpGet"] == {"path": "/health", "port": "http"}
    environment = container_environment(manifests, engine)
    mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
    volume = mounts[environment["LORA_GATEWAY_ADAPTER_CACHE_DIR"]]
    volumes = {
        v["name"]: v for v in pod_template(manifests, "lora-gateway-engine")["spec"]["volumes"]
    }
    size = volumes[volume]["emptyDir"]["sizeLimit"]
    assert size.endswith("Gi")
    assert int(size[:-2]) << 30 > int(environment["LORA_GATEWAY_ADAPTER_CACHE_BYTES"])


def test_disruption_budgets_select_their_pods(manifests: list[Manifest]) -> None:
    for name in ("lora-gateway-engine", "lora-gateway-front"):
        budget = one(manifests, "PodDisruptionBudget", name)
        labels = pod_template(manifests, name)["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_front_scales_on_cpu_and_probes_the_gateway(manifests: list[Manifest]) -> None:
    hpa = one(manifests, "HorizontalPodAutoscaler", "lora-gateway-front")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "lora-gateway-front",
    }
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    front = only_container(manifests, "lora-gateway-front")
    assert front["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert front["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "nvidia.com/gpu" not in str(front["resources"])
    # The HPA's utilization target needs a CPU request.
    assert front["resources"]["requests"]["cpu"]


def test_the_endpoint_picker_profile_has_the_lora_affinity_scorer(
    manifests: list[Manifest],
) -> None:
    config = epp_config(manifests)
    assert config["apiVersion"] == "llm-d.ai/v1alpha1"
    plugins = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
    profiles = config["schedulingProfiles"]
    assert [p["name"] for p in profiles] == ["default"]
    weights = {plugins[ref["pluginRef"]]: ref.get("weight") for ref in profiles[0]["plugins"]}
    for scorer in (
        "queue-scorer",
        "kv-cache-utilization-scorer",
        "prefix-cache-scorer",
        "lora-affinity-scorer",
    ):
        assert weights[scorer] > 0, scorer
    # Every reference names a declared plugin.
    refs = [ref["pluginRef"] for profile in profiles for ref in profile["plugins"]]
    refs += [s["pluginRef"] for s in config["dataLayer"]["sources"]]
    refs += [e["pluginRef"] for s in config["dataLayer"]["sources"] for e in s["extractors"]]
    assert set(refs) <= set(plugins)


def test_the_endpoint_picker_serves_the_pool(manifests: list[Manifest]) -> None:
    epp = only_container(manifests, "lora-gateway-epp")
    image, tag = epp["image"].rsplit(":", 1)
    assert image == "ghcr.io/llm-d/llm-d-router-endpoint-picker"
    assert re.fullmatch(r"v\d+\.\d+\.\d+", tag), "pin a released tag, not main or latest"
    args = dict(arg.removeprefix("--").split("=", 1) for arg in epp["args"])
    assert args["pool-name"] == POOL
    assert args["pool-namespace"] == NAMESPACE
    assert args["pool-group"] == "inference.networking.k8s.io"
    mount = {m["name"]: m["mountPath"] for m in epp["volumeMounts"]}["config"]
    assert args["config-file"] == f"{mount}/{EPP_CONFIG_KEY}"
    volumes = {v["name"]: v for v in pod_template(manifests, "lora-gateway-epp")["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"].startswith("lora-gateway-epp-")
    pool = one(manifests, "InferencePool", POOL)
    ref = pool["spec"]["endpointPickerRef"]
    service = one(manifests, "Service", ref["name"])
    service_ports = {p["port"]: p["targetPort"] for p in service["spec"]["ports"]}
    container_ports = {p["name"]: p["containerPort"] for p in epp["ports"]}
    grpc_port = container_ports[service_ports[ref["port"]["number"]]]
    assert int(args["grpc-port"]) == grpc_port
    labels = pod_template(manifests, "lora-gateway-epp")["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


# -- objectives and flow control ------------------------------------------------------------


def objectives(manifests: list[Manifest]) -> dict[str, Manifest]:
    return {m["metadata"]["name"]: m for m in find(manifests, "InferenceObjective")}


def test_every_priority_class_and_shadows_have_an_objective_of_the_pool(
    manifests: list[Manifest],
) -> None:
    found = objectives(manifests)
    # The picker looks an objective up by the header's value, the objective's name.
    assert OBJECTIVE_HEADER == "x-llm-d-inference-objective"
    sent = {objective_of(Tenant(id="t", name="t", priority=p)) for p in PRIORITIES}
    assert sent == set(PRIORITIES)
    assert set(found) == sent | {SHADOW_OBJECTIVE}
    epp = only_container(manifests, "lora-gateway-epp")
    args = dict(arg.removeprefix("--").split("=", 1) for arg in epp["args"])
    for name, objective in found.items():
        # The picker ignores an objective whose poolRef is not its own pool, group included.
        assert objective["spec"]["poolRef"]["name"] == args["pool-name"] == POOL, name
        assert objective["spec"]["poolRef"]["group"] == args["pool-group"], name
        one(manifests, "InferencePool", objective["spec"]["poolRef"]["name"])


def test_interactive_is_dispatched_before_batch_and_only_shadows_are_sheddable(
    manifests: list[Manifest],
) -> None:
    priority = {name: o["spec"]["priority"] for name, o in objectives(manifests).items()}
    assert priority["interactive"] > priority["batch"]
    # Negative priorities are sheddable in the picker: dropped when the pool is saturated.
    assert priority.pop(SHADOW_OBJECTIVE) < 0
    assert min(priority.values()) >= 0


def test_flow_control_serves_each_objectives_band_round_robin(manifests: list[Manifest]) -> None:
    config = epp_config(manifests)
    assert "flowControl" in config["featureGates"]
    declared = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
    bands = {b["priority"]: b for b in config["flowControl"]["priorityBands"]}
    for name, objective in objectives(manifests).items():
        band = bands[objective["spec"]["priority"]]
        # Tenants (fairness ids) of one class take turns; the default policy would not.
        assert declared[band["fairnessPolicyRef"]] == "round-robin-fairness-policy", name


def test_the_endpoint_picker_may_read_the_objectives(manifests: list[Manifest]) -> None:
    role = one(manifests, "Role", "lora-gateway-epp")
    assert any(
        rule["apiGroups"] == ["llm-d.ai"]
        and "inferenceobjectives" in rule["resources"]
        and {"get", "list", "watch"} <= set(rule["verbs"])
        for rule in role["rules"]
    )


# -- NetworkPolicies ------------------------------------------------------------------------


def cluster_pods(manifests: list[Manifest]) -> dict[str, Pod]:
    """Our pods as rendered, Istio's gateway pod as Istio labels it, and the outside peers
    the policies name (the ingress controller, Prometheus) or must refuse (anyone else)."""
    namespace = one(manifests, "Namespace", NAMESPACE)
    ours = {"kubernetes.io/metadata.name": NAMESPACE, **namespace["metadata"]["labels"]}
    pods = {
        role: Pod(
            role,
            NAMESPACE,
            pod_template(manifests, f"lora-gateway-{role}")["metadata"]["labels"],
            ours,
        )
        for role in ("front", "engine", "epp")
    }
    pods["gateway"] = Pod(
        "gateway", NAMESPACE, {"gateway.networking.k8s.io/gateway-name": GATEWAY}, ours
    )
    pods["ingress"] = Pod(
        "ingress",
        "ingress-nginx",
        {"app.kubernetes.io/name": "ingress-nginx"},
        {"kubernetes.io/metadata.name": "ingress-nginx"},
    )
    pods["prometheus"] = Pod(
        "prometheus",
        "monitoring",
        {"app.kubernetes.io/name": "prometheus"},
        {"kubernetes.io/metadata.name": "monitoring"},
    )
    # Another pod in Prometheus's namespace is not Prometheus.
    pods["grafana"] = Pod(
        "grafana",
        "monitoring",
        {"app.kubernetes.io/name": "grafana"},
        {"kubernetes.io/metadata.name": "monitoring"},
    )
    pods["tenant-pod"] = Pod(
        "tenant-pod", "team-a", {"app": "notebook"}, {"kubernetes.io/metadata.name": "team-a"}
    )
    pods["neighbour"] = Pod("neighbour", NAMESPACE, {"app": "debug"}, ours)
    return pods


# Who may reach which of our pods' ports; every other pair is refused.
INTENDED = {
    ("front", 8000): {"ingress"},
    ("front", 9464): {"prometheus"},
    ("gateway", 80): {"front"},
    ("gateway", 15020): {"prometheus"},
    ("epp", 9002): {"gateway"},
    ("epp", 9090): {"prometheus"},
    ("engine", 8000): {"gateway", "epp", "prometheus"},
}


def test_network_policies_admit_exactly_the_intended_peers(manifests: list[Manifest]) -> None:
    policies = find(manifests, "NetworkPolicy")
    pods = cluster_pods(manifests)
    ports = {port for _, port in INTENDED} | {5432, 6379, 9003}
    reachable = {
        (destination, port): {
            source
            for source, pod in pods.items()
            if source != destination and allowed(policies, pod, pods[destination], port)
        }
        # neighbour: a pod no policy names is closed too (default-deny-ingress).
        for destination in ("front", "gateway", "epp", "engine", "neighbour")
        for port in ports
    }
    expected = {key: INTENDED.get(key, set()) for key in reachable}
    assert reachable == expected


def test_the_network_policy_evaluator_can_refuse_and_admit() -> None:
    pods = {
        "a": Pod("a", "ns", {"role": "a"}, {"kubernetes.io/metadata.name": "ns"}),
        "b": Pod("b", "ns", {"role": "b"}, {"kubernetes.io/metadata.name": "ns"}),
    }
    # No policy selects b: everything reaches it.
    assert allowed([], pods["a"], pods["b"], 80)
    deny = {
        "metadata": {"name": "deny", "namespace": "ns"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }
    assert not allowed([deny], pods["a"], pods["b"], 80)
    allow_a = {
        "metadata": {"name": "allow", "namespace": "ns"},
        "spec": {
            "podSelector": {"matchLabels": {"role": "b"}},
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"role": "a"}}}], "ports": [{"port": 80}]}
            ],
        },
    }
    assert allowed([deny, allow_a], pods["a"], pods["b"], 80)
    assert not allowed([deny, allow_a], pods["a"], pods["b"], 81)
    assert not allowed([deny, allow_a], pods["b"], pods["a"], 80)


def test_prometheus_jobs_scrape_ports_the_pods_have_and_prometheus_reaches(
    manifests: list[Manifest],
) -> None:
    scrape = yaml.safe_load(
        config_map_data(manifests, "lora-gateway-prometheus")["scrape-configs.yaml"]
    )
    pods = cluster_pods(manifests)
    policies = find(manifests, "NetworkPolicy")
    roles = {"front": "front", "engine": "engine", "endpoint-picker": "epp"}
    scraped = set()
    for job in scrape["scrape_configs"]:
        keep = {
            tuple(rule["source_labels"]): rule["regex"]
            for rule in job["relabel_configs"]
            if rule.get("action") == "keep"
        }
        component = keep[("__meta_kubernetes_pod_label_app_kubernetes_io_component",)]
        port_name = keep[("__meta_kubernetes_pod_container_port_name",)]
        role = roles[component]
        container = only_container(manifests, f"lora-gateway-{role}")
        port = {p["name"]: p["containerPort"] for p in container["ports"]}[port_name]
        assert allowed(policies, pods["prometheus"], pods[role], port), job["job_name"]
        scraped.add(role)
    assert scraped == {"front", "engine", "epp"}


# -- settings, secrets, image --------------------------------------------------------------


def gateway_containers(manifests: list[Manifest]) -> dict[str, dict[str, Any]]:
    return {role: only_container(manifests, f"lora-gateway-{role}") for role in ("front", "engine")}


def test_every_variable_the_manifests_set_is_a_setting(manifests: list[Manifest]) -> None:
    fields = {f"LORA_GATEWAY_{name.upper()}" for name in Settings.model_fields}
    names: set[str] = set()
    for m in manifests:
        if m["kind"] in ("ConfigMap", "Secret") and not m["metadata"]["name"].startswith(
            ("lora-gateway-epp-", "lora-gateway-prometheus-")
        ):
            names |= set(m.get("data", {}))
    for deployment in find(manifests, "Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            names |= {v["name"] for v in container.get("env", [])}
    ours = {name for name in names if name.startswith("LORA_GATEWAY_")}
    assert ours - fields == set()
    assert names - ours <= FOREIGN_VARIABLES
    assert "LORA_GATEWAY_ROLE" in ours


@pytest.mark.parametrize("role", ["front", "engine"])
def test_each_roles_environment_makes_valid_settings(
    manifests: list[Manifest], role: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    environment = container_environment(manifests, gateway_containers(manifests)[role])
    for name in list(Settings.model_fields):
        monkeypatch.delenv(f"LORA_GATEWAY_{name.upper()}", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings = Settings(_env_file=None)
    assert settings.role == role
    assert settings.adapter_store.startswith("s3://")
    if role == "front":
        assert settings.database_url.startswith("postgresql+asyncpg://")
        assert settings.quota_url.startswith("redis://")
        assert settings.metrics_port == 9464


def test_secret_values_are_marked_placeholders(manifests: list[Manifest]) -> None:
    secrets = find(manifests, "Secret")
    assert len(secrets) == 4
    for secret in secrets:
        for key, value in secret_data(secret).items():
            assert "CHANGE-ME" in value, f"{secret['metadata']['name']}: {key}"


def test_the_containerfile_mirrors_make_install(manifests: list[Manifest]) -> None:
    containerfile = (ROOT / "deploy" / "Containerfile").read_text()
    assert "RUN make install ENGINE=cuda PYTHON=python3" in containerfile
    copied = {
        path
        for line in containerfile.splitlines()
        if line.startswith("COPY ")
        for path in line.split()[1:-1]
    }
    assert {"pyproject.toml", "README.md", "Makefile", "app", "tools"} <= copied
    command = re.search(r'^CMD \["lora-gateway", "serve"\]$', containerfile, re.MULTILINE)
    assert command
    kustomization = yaml.safe_load((KUSTOMIZATION / "kustomization.yaml").read_text())
    image = next(i for i in kustomization["images"] if i["name"] == "lora-gateway")
    for container in gateway_containers(manifests).values():
        assert container["image"] == f"{image['newName']}:{image['newTag']}"
        assert container["command"] == ["lora-gateway", "serve"]
