"""Headless Chromium for the dashboard tests: Debian's ``chromium`` driven by Playwright's Python
package with ``executable_path`` (nothing downloads a browser), and the checks every page shares.

Importing this module skips the importing test module when ``/usr/bin/chromium`` is missing (and
fails it instead when ``CI`` is set: .ci/run installs it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
DOCS = Path(__file__).resolve().parents[2] / "docs"
ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WIDTHS = (420, 1400)  # a phone held upright and a desktop: nothing may scroll sideways at either

if not CHROMIUM.exists():
    if os.environ.get("CI"):
        pytest.fail("Debian's chromium is missing at /usr/bin/chromium", pytrace=False)
    pytest.skip("needs Debian's chromium at /usr/bin/chromium", allow_module_level=True)
from playwright import sync_api as playwright  # noqa: E402  (the `test` extra installs it)


def screenshot_dir(tmp_path: Path) -> Path:
    """docs/ with EDGEFED_UPDATE_SCREENSHOTS=1 (the pictures the docs show), else the test's tmp dir."""
    return DOCS if os.environ.get("EDGEFED_UPDATE_SCREENSHOTS") == "1" else tmp_path


@contextmanager
def browser() -> Iterator[playwright.Browser]:
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def page_errors(page: playwright.Page) -> list[str]:
    """Collects uncaught script errors of ``page`` (the list grows as they happen)."""
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return errors


def overflow(page: playwright.Page) -> dict[str, int]:
    """The document's width against the viewport's, and the widest element that sticks out."""
    return page.evaluate(
        """() => {
          const inner = window.innerWidth;
          let widest = null, right = 0;
          for (const node of document.querySelectorAll('body *')) {
            const r = node.getBoundingClientRect();
            if (r.right > right) { right = r.right; widest = node; }
          }
          const name = widest ? widest.tagName + (widest.id ? '#' + widest.id : '') +
            (widest.className && widest.className.baseVal === undefined ? '.' + widest.className : '') : '';
          const scroll = document.documentElement.scrollWidth;
          return {scroll, inner, right: Math.round(right), widest: name};
        }"""
    )


def assert_fits(page: playwright.Page, what: str) -> None:
    """At each of WIDTHS the page is no wider than the window (the viewport is set here)."""
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(700)  # not a wait before an assert: the charts redraw to the new width
        seen = overflow(page)
        assert seen["scroll"] <= seen["inner"], f"{what} at {width} px overflows: {seen}"


def empty_panels(page: playwright.Page) -> list[str]:
    """The titles of the page's panels that show nothing: no chart, no table, no text."""
    return page.evaluate(
        """() => [...document.querySelectorAll('.panel')].filter(panel => {
             const body = [...panel.children].filter(c => c.tagName !== 'H2');
             const text = body.map(c => c.innerText.trim()).join('');
             return !panel.querySelector('svg, table') && !text;
           }).map(panel => panel.querySelector('h2').innerText)"""
    )


def fleet_figures(page: playwright.Page) -> dict[str, int]:
    """The fleet page's summary row as {label: integer} (the figures are integers, commas allowed)."""
    cells = page.inner_text("#fleet-figures").split("\n")
    return {label: int(value.replace(",", "")) for value, label in zip(cells[::2], cells[1::2], strict=True)}
