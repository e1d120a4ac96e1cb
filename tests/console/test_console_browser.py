"""The console as a person uses it, in a real browser (Debian's chromium), against a real
gateway (the scripted engine) on loopback, with the official ``openai`` client as the tenant:
sign in, create a tenant, issue a key and use it, upload an adapter (a bad archive's refusal
shown, then a good one), grant it, see the requests in the tenant's usage chart, revoke the
key (the client gets 401), sign out.

With ``CONSOLE_SCREENSHOTS=<dir>`` (``make console-screenshots``) it saves a screenshot of each
main page there on the way."""

from __future__ import annotations

import os
import re
from pathlib import Path

import openai
import pytest
from playwright.sync_api import Page, expect

from tests.support.archives import tiny_adapter_archive
from tests.support.browser import browser, new_page
from tests.support.harness import ADMIN_TOKEN, app_settings, scripted, serve_on_thread
from tests.support.scripted_engine import ScriptedEngine

SCREENSHOTS = os.environ.get("CONSOLE_SCREENSHOTS")


def screenshot(page: Page, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=f"{SCREENSHOTS}/{name}.png", full_page=True)


def test_an_admin_runs_a_tenant_from_the_console(tiny_model_dir: Path, tmp_path: Path) -> None:
    settings = app_settings(tmp_path / "state", model=str(tiny_model_dir))
    bad, good = tmp_path / "notes.tar.gz", tmp_path / "helper.tar.gz"
    bad.write_bytes(b"not an archive at all")
    good.write_bytes(tiny_adapter_archive())
    with (
        serve_on_thread(settings, scripted(ScriptedEngine()), timeout=30) as (app, _),
        browser() as chromium,
    ):
        page = new_page(chromium, app.base_url)
        page.on("dialog", lambda dialog: dialog.accept())  # the confirmations of revoke & co.

        page.goto("/admin/ui/")
        expect(page).to_have_url(re.compile("/admin/ui/sign-in$"))
        page.get_by_label("Admin token").fill(ADMIN_TOKEN)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Overview", level=1)).to_be_visible()

        page.get_by_role("link", name="Tenants").click()
        page.get_by_label("Id", exact=True).fill("acme")
        page.get_by_label("Name", exact=True).fill("ACME <Legal>")
        page.get_by_label("May call the base model").check()
        page.get_by_role("button", name="Create", exact=True).click()
        expect(page.get_by_role("heading", name="Tenant acme")).to_be_visible()

        page.get_by_label("New key's name").fill("production")
        page.get_by_role("button", name="Create key").click()
        key = page.locator("#new-key").inner_text()
        assert key.startswith("sk-")
        client = openai.OpenAI(api_key=key, base_url=f"{app.base_url}/v1", max_retries=0)
        base = client.models.list().data[0].id
        client.chat.completions.create(
            model=base, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )

        page.get_by_role("link", name="Adapters").click()
        page.get_by_label("Name (a new version if it exists)").fill("helper")
        page.get_by_label(re.compile("^Archive")).set_input_files(str(bad))
        page.get_by_role("button", name="Upload").click()
        expect(page.locator("#upload-error")).to_contain_text(
            "is not a gzip-compressed tar archive"
        )
        screenshot(page, "adapters")
        page.get_by_label(re.compile("^Archive")).set_input_files(str(good))
        page.get_by_role("button", name="Upload").click()
        expect(page.get_by_role("heading", name="Adapter helper")).to_be_visible()
        screenshot(page, "adapter")

        page.goto("/admin/ui/tenants/acme")
        page.get_by_text("Grant a model").click()
        page.get_by_label("Alias (the model the tenant sends)").fill("assistant")
        page.get_by_label("Adapter", exact=True).fill("helper")
        page.get_by_role("button", name="Grant", exact=True).click()
        expect(page.get_by_role("status")).to_have_text("Grants updated.")
        expect(page.get_by_role("cell", name="assistant", exact=True)).to_be_visible()
        answer = client.chat.completions.create(
            model="assistant", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert answer.model == "assistant"

        page.reload()
        screenshot(page, "tenant")
        tokens = page.locator("figure", has_text="Tokens per day")
        tokens.get_by_text("as a table").click()
        today = tokens.locator("tbody tr").last
        used = answer.usage.prompt_tokens + answer.usage.completion_tokens  # type: ignore[union-attr]
        assert int(today.locator("td").last.inner_text().replace(",", "")) > used

        page.get_by_role("button", name="Revoke production").click()
        expect(page.get_by_role("cell", name=re.compile("^revoked"))).to_be_visible()
        with pytest.raises(openai.AuthenticationError):
            client.models.list()

        page.get_by_role("link", name="Overview").click()
        screenshot(page, "overview")
        page.get_by_role("link", name="Audit log").click()
        expect(page.get_by_role("cell", name="key.revoke")).to_be_visible()
        screenshot(page, "audit")
        page.get_by_role("button", name="Sign out").click()
        expect(page).to_have_url(re.compile("/admin/ui/sign-in$"))
        page.goto("/admin/ui/tenants")
        expect(page).to_have_url(re.compile("/admin/ui/sign-in$"))
