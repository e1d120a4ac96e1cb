"""deploy/kubernetes rendered, validated offline, and its NetworkPolicies evaluated.

- :func:`render` runs ``kubectl kustomize`` (what an operator's ``kubectl apply -k`` applies).
- :func:`schema_errors` checks one object against its API's schema: core kinds against the
  Kubernetes OpenAPI schemas kubernetes-validate ships (strict: unknown fields refused, as
  kubectl's server-side field validation refuses them); Gateway API, InferencePool and
  Istio kinds against the JSON schemas vendored in deploy/kubernetes/schemas/ (converted
  from the upstream CRDs), with ``metadata`` checked as ObjectMeta. A kind with no schema is
  an error, never a pass.
- :func:`allowed` answers "may pod A open a connection to port P of pod B" under a set of
  NetworkPolicies, as the API defines them for ingress: a pod selected by no policy accepts
  everything; one selected by any accepts what one of their rules allows.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZATION = ROOT / "deploy" / "kubernetes"
SCHEMAS = KUSTOMIZATION / "schemas"
# The oldest Kubernetes minor the manifests target (every API they use is GA there).
KUBERNETES_VERSION = "1.33"
CORE_DEFINITIONS = "https://kubernetes.io/api/_definitions.json"
OBJECT_META = f"{CORE_DEFINITIONS}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

Manifest = dict[str, Any]


def render(directory: Path = KUSTOMIZATION) -> list[Manifest]:
    result = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory} failed: {result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def vendored_schema_path(api_version: str, kind: str) -> Path:
    group, _, version = api_version.rpartition("/")
    return SCHEMAS / f"{kind.lower()}-{group}-{version}.json"


@cache
def _core_definitions() -> Resource[Any]:
    directory = f"v{KUBERNETES_VERSION}.0-local-strict"
    path = resources.files("kubernetes_validate") / "kubernetes-json-schema" / directory
    return Resource.from_contents(json.loads((path / "_definitions.json").read_text()))


@cache
def _vendored_validator(path: Path) -> jsonschema.Draft202012Validator:
    schema = json.loads(path.read_text())
    if "metadata" in schema.get("properties", {}):
        schema["properties"]["metadata"] = {"$ref": OBJECT_META}
    registry: Registry[Any] = Registry().with_resource(CORE_DEFINITIONS, _core_definitions())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def schema_errors(manifest: Manifest) -> list[str]:
    """Why ``manifest`` would be refused by its API's schema (empty: it validates)."""
    name = f"{manifest.get('kind')}/{manifest.get('metadata', {}).get('name')}"
    path = vendored_schema_path(manifest["apiVersion"], manifest["kind"])
    if path.is_file():
        return [
            f"{name}: {'.'.join(map(str, error.absolute_path))}: {error.message}"
            for error in _vendored_validator(path).iter_errors(manifest)
        ]
    try:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"{name}: no schema: {exc.message}"]
    except kubernetes_validate.ValidationError as exc:
        return [f"{name}: {'.'.join(map(str, exc.path))}: {exc.message}"]
    return []


def find(manifests: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [
        m
        for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]


def one(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    found = find(manifests, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def config_map_data(manifests: list[Manifest], name: str) -> dict[str, str]:
    """A generated ConfigMap's data, found by the name before kustomize's hash suffix."""
    found = [
        m
        for m in manifests
        if m["kind"] == "ConfigMap" and m["metadata"]["name"].rsplit("-", 1)[0] == name
    ]
    assert len(found) == 1, f"ConfigMap {name}: {len(found)} objects"
    return dict(found[0].get("data", {}))


def secret_data(manifest: Manifest) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in manifest["data"].items()}


def container_environment(
    manifests: list[Manifest], container: Mapping[str, Any]
) -> dict[str, str]:
    """What the container's environment will hold, from its envFrom and env (rendered names)."""
    by_name = {(m["kind"], m["metadata"]["name"]): m for m in manifests}
    environment: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            ref = source["configMapRef"]
            found = by_name.get(("ConfigMap", ref["name"]))
            values = dict(found.get("data", {})) if found else {}
        else:
            ref = source["secretRef"]
            found = by_name.get(("Secret", ref["name"]))
            values = secret_data(found) if found else {}
        assert found or ref.get("optional"), f"envFrom names {ref['name']}, which is not there"
        environment.update(values)
    for variable in container.get("env", []):
        environment[variable["name"]] = variable.get("value", "<from valueFrom>")
    return environment


@dataclass(frozen=True)
class Pod:
    """A pod as NetworkPolicies see it: its namespace's labels and its own."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    namespace_labels: Mapping[str, str] = field(default_factory=dict)


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    # Only matchLabels is evaluated here; a policy using more must not pass unexamined.
    assert set(selector) <= {"matchLabels"}, f"selector not evaluated here: {selector}"
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())


def _peer_admits(peer: Mapping[str, Any], policy_namespace: str, source: Pod) -> bool:
    assert "ipBlock" not in peer, "ipBlock peers are not evaluated here"
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], source.namespace_labels):
            return False
    elif source.namespace != policy_namespace:
        return False
    return "podSelector" not in peer or _selects(peer["podSelector"], source.labels)


def _port_admits(ports: list[Mapping[str, Any]] | None, port: int) -> bool:
    if not ports:
        return True
    for entry in ports:
        # Named ports would need the destination container's port names.
        assert isinstance(entry.get("port"), int), f"only numbered ports here: {entry}"
        if entry.get("protocol", "TCP") == "TCP" and entry["port"] == port:
            return True
    return False


def allowed(policies: list[Manifest], source: Pod, destination: Pod, port: int) -> bool:
    """May ``source`` connect to ``destination`` on TCP ``port`` (ingress policies only)?"""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == destination.namespace
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and _selects(p["spec"]["podSelector"], destination.labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            from_ok = not peers or any(
                _peer_admits(peer, policy["metadata"]["namespace"], source) for peer in peers
            )
            if from_ok and _port_admits(rule.get("ports"), port):
                return True
    return False
