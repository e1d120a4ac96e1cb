"""Driving the admin console over HTTP as a browser would: cookies, forms and their CSRF
token (the browser tests use a real browser: tests/support/browser.py)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from html.parser import HTMLParser
from typing import Any

import httpx

from tests.support.harness import ADMIN_TOKEN

UI = "/admin/ui"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


class Console:
    """A signed-in console session: ``get`` pages, ``post`` forms (the CSRF token added)."""

    def __init__(self, client: httpx.AsyncClient, csrf: str) -> None:
        self.client = client
        self.csrf = csrf

    async def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return await self.client.get(UI + path, **kwargs)

    async def post(
        self, path: str, data: dict[str, Any] | None = None, **kwargs: Any
    ) -> httpx.Response:
        return await self.client.post(UI + path, data={"csrf": self.csrf, **(data or {})}, **kwargs)


def csrf_of(page: httpx.Response) -> str:
    found = _CSRF.search(page.text)
    assert found is not None, "no form with a CSRF token on the page"
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, token: str = ADMIN_TOKEN) -> httpx.Response:
    return await client.post(f"{UI}/sign-in", data={"token": token})


@asynccontextmanager
async def console(base_url: str, token: str = ADMIN_TOKEN) -> AsyncIterator[Console]:
    """A client signed in to the console at ``base_url``."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        answer = await sign_in(client, token)
        assert answer.status_code == 303, answer.text
        yield Console(client, csrf_of(await client.get(f"{UI}/")))


class _Fields(HTMLParser):
    """Form fields, the labels that name them, and whether each sits inside a label."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: list[tuple[str, str | None, bool]] = []
        self.labelled: set[str] = set()
        self._open_labels = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "label":
            self._open_labels += 1
            if named.get("for"):
                self.labelled.add(str(named["for"]))
        elif tag in ("input", "select", "textarea") and named.get("type") not in (
            "hidden",
            "submit",
        ):
            self.fields.append((str(named.get("name")), named.get("id"), self._open_labels > 0))

    def handle_endtag(self, tag: str) -> None:
        if tag == "label":
            self._open_labels -= 1


def unlabelled_fields(html: str) -> list[str]:
    """The names of a page's form fields that no label names: a screen reader could only
    say "edit text"."""
    parser = _Fields()
    parser.feed(html)
    return [
        name
        for name, field_id, inside_label in parser.fields
        if not inside_label and (field_id is None or field_id not in parser.labelled)
    ]
