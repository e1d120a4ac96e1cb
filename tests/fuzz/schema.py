"""The schemathesis schema of the app's ``/openapi.json``, and the hooks that point half of
the generated cases at objects that exist."""

from __future__ import annotations

import os
import re
from typing import Any

import schemathesis
from hypothesis import strategies as st

from app.main import create_app
from app.settings import Settings
from app.tenancy.manifests import ADAPTER_NAME_PATTERN

DEFAULT_EXAMPLES = 8
MAX_EXAMPLES_ENV = "FUZZ_MAX_EXAMPLES"

# Filled in by the fuzz_target fixture (and kept current as seeds are put back): path
# parameters and model names of store objects that exist.
KNOWN_PATH_PARAMETERS: dict[str, str] = {}
KNOWN_MODELS: list[str] = []


def max_examples() -> int:
    return int(os.environ.get(MAX_EXAMPLES_ENV, DEFAULT_EXAMPLES))


def openapi_document() -> dict[str, Any]:
    """What ``GET /openapi.json`` serves (the fuzz_target fixture checks it is): built
    without starting anything, because pytest collects the operations before any fixture
    runs."""
    settings = Settings(_env_file=None, model="unused", docs=True)  # type: ignore[call-arg]
    return create_app(settings).openapi()


def fuzz_config() -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "generation": {
                "mode": "all",
                "max-examples": max_examples(),
                # The normal suite replays the same cases; `make fuzz` explores anew.
                "deterministic": MAX_EXAMPLES_ENV not in os.environ,
                "database": "none",
            },
            "phases": {"stateful": {"enabled": False}},
            "checks": {
                # Schema-valid is not enough to succeed here: a model or tenant that does
                # not exist is a 404, n > 1 with greedy sampling or a prompt longer than the
                # context is a 400, an upload that is not an adapter archive is a 400.
                "positive_data_acceptance": {"enabled": False},
            },
            "operations": [
                {
                    # DELETE /admin/v1/adapters/residency is a real operation, the deletion
                    # of an adapter named "residency" (the {name} route), so the 405's Allow
                    # rightly lists DELETE; the schema files it under another path.
                    "include-path": "/admin/v1/adapters/residency",
                    "checks": {"allow_header_conformance": {"enabled": False}},
                }
            ],
        }
    )


def load_schema() -> Any:
    schema = schemathesis.openapi.from_dict(openapi_document(), config=fuzz_config())

    @schema.hook
    def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> Any:
        # Half the cases name objects that exist, so handlers past the lookup run too.
        if not path_parameters:
            return st.just(path_parameters)
        known = {k: v for k, v in KNOWN_PATH_PARAMETERS.items() if k in path_parameters}
        return st.sampled_from([path_parameters, {**path_parameters, **known}])

    @schema.hook
    def flatmap_body(context: Any, body: Any) -> Any:
        # Most generated models do not exist (404): name real ones, and stream some of them.
        # A grant's adapter likewise, where the name generated is valid: an invalid one is
        # what makes a negative case negative.
        if isinstance(body, dict) and "adapter" in body:
            adapter = body["adapter"]
            if not (isinstance(adapter, str) and re.match(ADAPTER_NAME_PATTERN, adapter)):
                return st.just(body)
            return st.sampled_from([body, {**body, "adapter": KNOWN_PATH_PARAMETERS["name"]}])
        if not isinstance(body, dict) or "model" not in body:
            return st.just(body)
        named = [{**body, "model": model} for model in KNOWN_MODELS]
        streamed = [{**b, "stream": True, "stream_options": {"include_usage": True}} for b in named]
        return st.sampled_from([body, *named, *streamed])

    return schema
