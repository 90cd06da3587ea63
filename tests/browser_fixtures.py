"""A real headless Chromium (Debian's package, installed by .ci/run) driven by Playwright, for the pages users look
at: a page is opened from its file (no network), its console errors are collected, and a screenshot can be kept
under test-artifacts/ (CI's artifacts)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import system_packages

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
# As the machine's own probe starts it: no sandbox as root, and nothing that reaches for Google's hosts.
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    system_packages.wait_installed()
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise RuntimeError("no chromium on PATH: `apt-get install chromium` (.ci/run installs it)")
    return path


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path(), args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def open_page(browser, path: Path, screenshot: str | None = None):
    """(page, console errors) of the file at `path`, fully loaded; with `screenshot`, a full-page PNG of it kept as
    test-artifacts/<screenshot>."""
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri(), wait_until="load")
    if screenshot:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / screenshot), full_page=True)
    return page, errors
