"""Headless Chromium for checking reports: render a page and read back the DOM after its
scripts ran (errors, per-figure render status, table cells), or save a screenshot."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
# Offline and quiet: no first-run UI, no background fetches, nothing outside file://.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def find_chromium() -> str | None:
    """Path of a Chromium-family browser on PATH, or None."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _run_chromium(
    chromium: str, extra: list[str], page: Path, timeout_s: float
) -> tuple[str, float]:
    with tempfile.TemporaryDirectory(prefix="servesim-chromium-") as profile:
        command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra]
        start = time.perf_counter()
        done = subprocess.run(
            [*command, page.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        wall_s = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{chromium} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout, wall_s


def dump_dom(
    page: Path, chromium: str, budget_ms: int = 10_000, timeout_s: float = 120.0
) -> tuple[str, float]:
    """(the DOM after the page's scripts ran, wall seconds of the whole browser run)."""
    return _run_chromium(
        chromium, [f"--virtual-time-budget={budget_ms}", "--dump-dom"], page, timeout_s
    )


def screenshot(
    page: Path,
    png: Path,
    chromium: str,
    size: tuple[int, int] = (1400, 4000),
    budget_ms: int = 10_000,
    timeout_s: float = 120.0,
) -> float:
    """Save a PNG of the page's top ``size`` pixels; returns wall seconds."""
    extra = [
        f"--virtual-time-budget={budget_ms}",
        f"--window-size={size[0]},{size[1]}",
        f"--screenshot={png.resolve()}",
    ]
    return _run_chromium(chromium, extra, page, timeout_s)[1]


class RenderedPage(HTMLParser):
    """What the report's own scripts left in the DOM: ``errors`` (#js-errors),
    ``status`` (#render-status), ``rendered`` (body[data-rendered]), summary ``cells`` by run
    and key, and (type, text) of every <script> element."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.errors: list[str] = []
        self.status: dict[str, Any] = {}
        self.rendered = False
        self.cells: dict[tuple[str, str], str] = {}
        self.scripts: list[tuple[str, str]] = []
        self._capture: str | None = None
        self._text: list[str] = []
        self._run = ""
        self._key = ""
        self._type = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.rendered = a.get("data-rendered") == "true"
        elif tag == "tr" and a.get("data-run") is not None:
            self._run = a["data-run"] or ""
        elif tag == "pre" and a.get("id") in ("js-errors", "render-status"):
            self._start(str(a["id"]))
        elif tag == "td" and a.get("data-key"):
            self._key = a["data-key"] or ""
            self._start("cell")
        elif tag == "script":
            self._type = a.get("type") or "text/javascript"
            self._start("script")

    def _start(self, what: str) -> None:
        self._capture, self._text = what, []

    def handle_data(self, data: str) -> None:
        if self._capture is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if self._capture is None or tag not in ("pre", "td", "script"):
            return
        text = "".join(self._text)
        if self._capture == "js-errors":
            self.errors = json.loads(text or "[]")
        elif self._capture == "render-status":
            self.status = json.loads(text) if text else {}
        elif self._capture == "cell":
            self.cells[(self._run, self._key)] = text
        else:
            self.scripts.append((self._type, text))
        self._capture = None


def read_rendered(dom: str) -> RenderedPage:
    page = RenderedPage()
    page.feed(dom)
    page.close()
    return page
