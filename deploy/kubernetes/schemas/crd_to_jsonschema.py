"""Turn a CustomResourceDefinition's openAPIV3Schema into a JSON schema file.

    python deploy/kubernetes/schemas/crd_to_jsonschema.py CRDS.yaml KIND VERSION OUT.json

The API server refuses fields a structural schema does not declare (kubectl's strict field
validation), so every object with properties and no x-kubernetes-preserve-unknown-fields gets
additionalProperties: false here, as kubernetes-validate's strict schemas do for core kinds.
Descriptions are dropped (they are most of the size); x-kubernetes-int-or-string becomes
"integer or string". CEL rules (x-kubernetes-validations) cannot be checked offline and are
dropped too: the API server still enforces them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml


def strict(node: Any) -> Any:
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: strict(value)
        for key, value in node.items()
        if key != "description" and not key.startswith("x-kubernetes-validations")
    }
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    # properties maps names to schemas: a property called "description" is a field, keep it.
    if "properties" in node:
        out["properties"] = {name: strict(schema) for name, schema in node["properties"].items()}
    return out


def convert(crd_path: Path, kind: str, version: str) -> dict[str, Any]:
    for document in yaml.safe_load_all(crd_path.read_text()):
        if not document or document.get("kind") != "CustomResourceDefinition":
            continue
        if document["spec"]["names"]["kind"] != kind:
            continue
        for served in document["spec"]["versions"]:
            if served["name"] == version:
                schema: dict[str, Any] = strict(served["schema"]["openAPIV3Schema"])
                group = document["spec"]["group"]
                # metadata is the API server's: the CRD says "object" or (Istio) nothing.
                schema["properties"]["metadata"] = {"type": "object"}
                schema["properties"]["apiVersion"] = {"const": f"{group}/{version}"}
                schema["properties"]["kind"] = {"const": kind}
                schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind"})
                return schema
    raise SystemExit(f"{crd_path}: no CustomResourceDefinition of {kind} serving {version}")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    crds, kind, version, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
    out.write_text(json.dumps(convert(crds, kind, version), indent=1, sort_keys=True) + "\n")
