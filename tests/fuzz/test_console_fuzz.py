"""The admin console under a property-based fuzzer: it is outside ``/openapi.json``, so the
schemathesis suite never reaches it. A signed-in admin posts generated values to every field
of every console form, and to every query and path parameter of every console route: no
answer is a server error. Besides the generated examples, each field and parameter is tried
alone with each sentinel value (past int64, past int()'s digits, nested fifty thousand deep,
NUL), so that those are tried in every run, whatever the generation draws.

What is fuzzed is read from the console itself, so that a new field is covered without a
change here: the forms and their fields from its templates, the query and path parameters
from its routes. A template form that posts to no console route, or a POST route that no
template form posts to, fails :func:`test_every_console_form_posts_to_a_route_and_back`.
The fuzz_target fixture (tests/fuzz/conftest.py) serves the app; whatever an accepted form
changed of its seeds is put back after each example.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi.dependencies.utils import get_flat_dependant
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.console import router as console_router
from app.console.auth import CSRF_FIELD
from app.console.rendering import CONSOLE_PREFIX, TEMPLATES
from tests.fuzz.schema import KNOWN_PATH_PARAMETERS, MAX_EXAMPLES_ENV
from tests.support.console import csrf_of
from tests.support.fuzz_target import FuzzTarget
from tests.support.harness import ADMIN_TOKEN

# Examples per route and test; `make fuzz` (FUZZ_MAX_EXAMPLES) explores more, anew.
DEFAULT_EXAMPLES = 10
# A path or query value's length stays within what the HTTP server reads of a request's
# head (a longer one is refused before the app, and would test nothing here).
MAX_URL_REPEAT = 2_000
MAX_BODY_REPEAT = 60_000
# The version path parameter names an existing version when it is not generated.
KNOWN_VERSION = "1"
_TEMPLATED = re.compile(r"\{\{.*?\}\}")
_PATH_PARAMETER = re.compile(r"\{[^}]+\}")
SLOT = "\x00"  # a templated (or parameter) path segment, after normalising

EDGE_VALUES = [
    "",
    " ",
    "0",
    "-1",
    str(2**31),
    str(2**63 - 1),
    str(2**63),
    str(-(2**63) - 1),
    str(2**64),
    "9" * 4301,  # past Python's limit on the digits int() converts
    "1e309",
    "nan",
    "-inf",
    "null",
    "true",
    "[]",
    "{}",
    '{"to": 1, "error_rate": 0.5}',
    '{"to": 9223372036854775808, "error_rate": 1e999}',
    "1:50, 2:50",
    "1:",
    ":",
    "1:2:3",
    f"{2**63}:1",
    "\x00",
    "9999-12-31T23:59:59",
    "0001-01-01T00:00:00",
    "2027-01-01T00:00:00+14:00",
    "%",
    "_",
    "../",
    "<script>",
]
REPEATABLE = ["[", "{", '{"a":', "9", "-", ":", ",", "\\", "%"]
# Tried in every field and parameter, one at a time, on top of the generated examples.
BODY_SENTINELS = [str(2**63), str(-(2**63) - 1), "9" * 4301, "[" * 50_000, "\x00"]
URL_SENTINELS = [str(2**63), str(-(2**63) - 1), "9" * 4301, "[" * MAX_URL_REPEAT, "\x00"]


def hostile_text(max_repeat: int) -> st.SearchStrategy[str]:
    """Text, numbers past every integer column's range, malformed JSON, deep nesting; and
    the names of the seeds' objects, so that a form gets past its first field's check (an
    alias, an adapter) now and then."""
    repeated = st.builds(
        lambda unit, times: unit * times, st.sampled_from(REPEATABLE), st.integers(1, max_repeat)
    )
    return st.one_of(
        st.text(max_size=30),
        st.integers().map(str),
        st.sampled_from(EDGE_VALUES),
        repeated,
        st.sampled_from(sorted({KNOWN_VERSION, *KNOWN_PATH_PARAMETERS.values()})),
    )


@dataclass(frozen=True)
class Form:
    """A form of a console template: the route it posts to and the names of its fields."""

    template: str
    action: str  # normalised: the route's path, each parameter segment SLOT
    fields: tuple[str, ...]
    files: tuple[str, ...]


class _Forms(HTMLParser):
    def __init__(self, template: str) -> None:
        super().__init__()
        self.template = template
        self.forms: list[Form] = []
        self._open: tuple[str, list[str], list[str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "form" and (named.get("method") or "get").lower() == "post":
            self._open = (_normalised(str(named.get("action"))), [], [])
        elif tag in ("input", "select", "textarea") and self._open and named.get("name"):
            is_file = named.get("type") == "file"
            self._open[2 if is_file else 1].append(str(named["name"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self._open:
            action, fields, files = self._open
            self.forms.append(Form(self.template, action, tuple(fields), tuple(files)))
            self._open = None


def _normalised(action: str) -> str:
    """A template's form action as the route path it posts to, each templated segment SLOT."""
    return _TEMPLATED.sub(SLOT, action.replace("{{ prefix }}", CONSOLE_PREFIX))


def template_forms() -> list[Form]:
    forms = []
    for template in sorted(TEMPLATES.glob("*.html")):
        parser = _Forms(template.name)
        parser.feed(template.read_text())
        forms += parser.forms
    return forms


def console_routes() -> list[APIRoute]:
    return [r for r in console_router.routes if isinstance(r, APIRoute)]


def _method(route: APIRoute) -> str:
    (method,) = route.methods
    return method


def _slotted(route: APIRoute) -> str:
    return _PATH_PARAMETER.sub(SLOT, route.path)


def query_parameters(route: APIRoute) -> list[str]:
    return [p.name for p in get_flat_dependant(route.dependant).query_params]


def path_parameters(route: APIRoute) -> list[str]:
    return [p.name for p in get_flat_dependant(route.dependant).path_params]


def form_of(route: APIRoute) -> Form | None:
    if _method(route) != "POST":
        return None
    return next((f for f in template_forms() if f.action == _slotted(route)), None)


def _route_id(route: APIRoute) -> str:
    return f"{_method(route)} {route.path}"


def _has_inputs(route: APIRoute) -> bool:
    form = form_of(route)
    fields = [f for f in form.fields if f != CSRF_FIELD] + list(form.files) if form else []
    return bool(query_parameters(route) or fields)


ROUTES_WITH_INPUTS = [r for r in console_routes() if _has_inputs(r)]
ROUTES_WITH_PATH_PARAMETERS = [r for r in console_routes() if path_parameters(r)]


def fuzz_settings() -> settings:
    return settings(
        max_examples=int(os.environ.get(MAX_EXAMPLES_ENV, DEFAULT_EXAMPLES)),
        # The normal suite replays the same examples; `make fuzz` explores anew.
        derandomize=MAX_EXAMPLES_ENV not in os.environ,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@dataclass
class SignedIn:
    client: httpx.Client
    csrf: str
    target: FuzzTarget

    def path(self, route: APIRoute, values: dict[str, str] | None = None) -> str:
        """``route``'s path, its parameters the seeds' objects unless ``values`` says (one
        that names no seed, say a batch's id: an object that does not exist)."""
        missing = dict.fromkeys(path_parameters(route), "none")
        known = {**missing, **KNOWN_PATH_PARAMETERS, "version": KNOWN_VERSION, **(values or {})}
        return route.path.format(**{name: quote(known[name], safe="") for name in known})

    def send(
        self,
        route: APIRoute,
        path: str,
        query: dict[str, str],
        fields: dict[str, str],
        files: dict[str, bytes],
    ) -> httpx.Response:
        if _method(route) == "GET":
            answer = self.client.get(path, params=query)
        else:
            uploads = {
                name: ("upload.tar.gz", data, "application/gzip") for name, data in files.items()
            }
            answer = self.client.post(
                path,
                params=query,
                data={**fields, CSRF_FIELD: self.csrf},
                files=uploads or None,
            )
        assert answer.status_code < 500, (
            f"{_method(route)} {path} query={query!r:.300} fields={fields!r:.300}: "
            f"{answer.status_code} {answer.text[:300]}"
        )
        if _method(route) == "POST" and answer.status_code < 400:
            self.target.seeds.restore()
        return answer


# Once per process: the sign-in form's own fuzzing soon meets its per-address limit (429),
# after which a second sign-in would be refused.
@pytest.fixture(scope="session")
def signed_in(fuzz_target: FuzzTarget) -> Iterator[SignedIn]:
    with httpx.Client(base_url=fuzz_target.base_url, timeout=60) as client:
        answer = client.post(f"{CONSOLE_PREFIX}/sign-in", data={"token": ADMIN_TOKEN})
        assert answer.status_code == 303, answer.text
        yield SignedIn(client, csrf_of(client.get(f"{CONSOLE_PREFIX}/")), fuzz_target)


def test_every_console_form_posts_to_a_route_and_back() -> None:
    forms = template_forms()
    posts = {_slotted(r) for r in console_routes() if _method(r) == "POST"}
    assert {f.action for f in forms} == posts, "a form without a route, or a route without a form"
    # The discovery is not vacuous: the forms' fields and the routes' parameters are found.
    fields = {field for form in forms for field in form.fields}
    assert {"alias", "rollback", "versions", "token_budget", "token"} <= fields
    assert {"file"} <= {field for form in forms for field in form.files}
    assert "offset" in query_parameters(
        next(r for r in console_routes() if r.path.endswith("/audit"))
    )


def _optional(
    names: list[str], values: st.SearchStrategy[Any]
) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={name: values for name in names})


def _with_sentinels(
    send: Callable[..., None], route: APIRoute, fields: list[str]
) -> Callable[..., None]:
    """``send`` with an explicit example per field and query parameter for each sentinel
    value: every one is tried there, whatever the generated examples happen to hold."""
    for name in query_parameters(route):
        for value in URL_SENTINELS:
            send = example(query={name: value}, posted={}, uploaded={})(send)
    for name in fields:
        for value in BODY_SENTINELS:
            send = example(query={}, posted={name: value}, uploaded={})(send)
    return send


@pytest.mark.parametrize("route", ROUTES_WITH_INPUTS, ids=_route_id)
def test_no_generated_field_or_query_value_is_a_server_error(
    route: APIRoute, signed_in: SignedIn
) -> None:
    form = form_of(route)
    fields = [f for f in form.fields if f != CSRF_FIELD] if form else []
    files = list(form.files) if form else []

    def send(query: dict[str, str], posted: dict[str, str], uploaded: dict[str, bytes]) -> None:
        signed_in.send(route, signed_in.path(route), query, posted, uploaded)

    fuzz_settings()(
        given(
            query=_optional(query_parameters(route), hostile_text(MAX_URL_REPEAT)),
            posted=_optional(fields, hostile_text(MAX_BODY_REPEAT)),
            uploaded=_optional(files, st.binary(max_size=512)),
        )(_with_sentinels(send, route, fields))
    )()


@pytest.mark.parametrize("route", ROUTES_WITH_PATH_PARAMETERS, ids=_route_id)
def test_no_generated_path_parameter_is_a_server_error(
    route: APIRoute, signed_in: SignedIn
) -> None:
    def send(values: dict[str, str]) -> None:
        signed_in.send(route, signed_in.path(route, values), {}, {}, {})

    for name in path_parameters(route):
        for value in URL_SENTINELS:
            send = example(values={name: value})(send)
    values = _optional(path_parameters(route), hostile_text(MAX_URL_REPEAT)).filter(bool)
    fuzz_settings()(given(values=values)(send))()
