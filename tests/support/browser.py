"""A real browser for the web console's tests: Debian's ``chromium`` (``make services``
installs it) driven through Playwright's sync API.

Playwright normally runs browsers it downloads itself; we point it at the system chromium
instead, so nothing is downloaded (and CI needs no access beyond Debian's archive). The sync
API suits tests that serve the app on a thread (``serve_on_thread`` in
tests/support/harness.py); it refuses to run inside an event loop, so use it from plain
``def`` tests, not ``async def`` ones."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import Browser, Page, sync_playwright

# None where chromium is not installed: browser() says so when a test asks for one, so the
# other tests still collect and run.
CHROMIUM = shutil.which("chromium")

# Long enough for a page served by a test app on a busy two-core machine, short enough that
# a selector that never matches fails the test quickly instead of hanging it.
DEFAULT_TIMEOUT_MS = 10_000


@contextmanager
def browser() -> Iterator[Browser]:
    """A headless chromium until the block ends (about 0.6 s to start, driver included)."""
    if CHROMIUM is None:
        raise RuntimeError("chromium is not installed: run `make services` (apt's chromium)")
    with sync_playwright() as playwright:
        # Chromium's sandbox refuses to start as root, which is how CI runs the tests.
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def new_page(browser: Browser, base_url: str) -> Page:
    """A page in a context of its own (no cookies or storage shared with other pages), whose
    relative URLs (``page.goto("/console")``) resolve against ``base_url``."""
    context = browser.new_context(base_url=base_url)
    context.set_default_timeout(DEFAULT_TIMEOUT_MS)
    return context.new_page()
