"""tests/support/browser.py drives the system chromium: a page's script, loaded from its own
origin as the console's are (no inline script), changes text on a click."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import browser, new_page
from tests.support.servers import free_port

PAGE = """<!doctype html>
<html>
<head><meta charset="utf-8"><title>check</title><script src="/click.js" defer></script></head>
<body><p id="status">waiting</p><button id="press">Press</button></body>
</html>
"""

SCRIPT = """document.getElementById("press").addEventListener("click", () => {
  document.getElementById("status").textContent = "pressed";
});
"""


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Keep the request log out of pytest's output."""


@pytest.fixture
def static_site(tmp_path: Path) -> Iterator[str]:
    """``tmp_path`` served on loopback with the page and its script; yields its base URL."""
    (tmp_path / "index.html").write_text(PAGE)
    (tmp_path / "click.js").write_text(SCRIPT)
    server = ThreadingHTTPServer(
        ("127.0.0.1", free_port()), partial(QuietHandler, directory=str(tmp_path))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_click_runs_the_pages_own_script(static_site: str) -> None:
    with browser() as chromium:
        page = new_page(chromium, static_site)
        page.goto("/")
        assert page.text_content("#status") == "waiting"
        page.click("#press")
        assert page.text_content("#status") == "pressed"
