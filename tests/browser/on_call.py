"""The on-call engineer in the browser: from the admin's home page, counting the clicks that load a page."""

from __future__ import annotations

import os

from tests.browser.screenshots import DOCS_DIR, save_for_docs

#: The most page loads an incident may take, from the admin's home page.
MOST_CLICKS = 4


class Operator:
    """The browser, from the admin's home page, counting the clicks that load a page."""

    def __init__(self, page, screenshot, docs_shots: frozenset[str] = frozenset()) -> None:
        """``docs_shots``: the steps pictured in the docs, when a run is asked for them."""
        self.page, self.screenshot, self.clicks, self.docs_shots = page, screenshot, 0, docs_shots
        page.set_viewport_size({"width": 1280, "height": 800})
        page.goto("/admin/")

    def click(self, locator) -> None:
        with self.page.expect_navigation():
            locator.click()
        self._loaded()

    def shoot(self, name: str) -> None:
        self.screenshot(name)
        if os.environ.get("KEYED_QUEUE_DOCS_SCREENSHOTS") == "1" and name in self.docs_shots:
            save_for_docs(self.page, DOCS_DIR / f"incident-{name}.png", 800)

    def text(self, selector: str) -> str:
        return self.page.locator(selector).inner_text()

    def search(self, selector: str, text: str) -> None:
        """Type ``text`` in the box ``selector`` and press Enter: a page load, counted as a click."""
        self.page.fill(selector, text)
        with self.page.expect_navigation():
            self.page.press(selector, "Enter")
        self._loaded()

    def live_key(self, words: str, key: str):
        """*Live keys* from the home page, then ``words`` in its Key box: the row of ``key`` (two page loads)."""
        self.click(self.page.get_by_role("link", name="Live keys"))
        self.search("#key-field", words)
        return self.page.locator(f'#live-keys tr[data-key="{key}"]')

    def _loaded(self) -> None:
        self.clicks += 1
        assert self.clicks <= MOST_CLICKS, f"more than {MOST_CLICKS} clicks"
