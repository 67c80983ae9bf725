"""Debian's headless Chromium driven by Playwright, for the console's browser tests
(tests/console/ against `gitsched console`, tests/kube/ against `gitsched serve`).

Chromium is installed by scripts/chromium; without it these tests fail, never skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# A busy 2-core CI machine: generous deadlines, always waiting on a condition.
WAIT_MS = 90_000


@contextmanager
def chromium() -> Iterator[object]:
    """A launched headless Chromium (Playwright's Browser)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(
            "Debian's chromium is not installed, and the console's browser tests drive it: "
            "run scripts/chromium (apt-get install -y chromium), then rerun the tests"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


class Page:
    """A browser page that records every console error and uncaught exception."""

    def __init__(self, browser: object) -> None:
        self.page = browser.new_page(viewport={"width": 1280, "height": 860})  # type: ignore[attr-defined]
        self.problems: list[str] = []
        self.page.on(
            "console",
            lambda m: (
                self.problems.append(f"console.{m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        self.page.on("pageerror", lambda e: self.problems.append(f"pageerror: {e}"))

    def goto(self, url: str) -> None:
        response = self.page.goto(url, wait_until="load")
        assert response is not None and response.status == 200, url
        # the live stream is open: the status says "live" once the first event arrived
        self.page.wait_for_function(
            "document.getElementById('live') && document.getElementById('live').className === 'live'",
            timeout=WAIT_MS,
        )

    def wait_for_text(self, selector: str, text: str) -> str:
        """Until the element `selector` holds `text` (the page follows the log live)."""
        self.page.locator(selector, has_text=text).first.wait_for(timeout=WAIT_MS)
        return str(self.page.inner_text(selector))

    def close(self) -> None:
        self.page.close()
