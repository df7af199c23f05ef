"""A report page rendered by headless Chromium (Debian's ``chromium``), probed by a script that writes its answer in the
page's title: what the report tests check that the HTML text alone cannot show (figures loaded, tables in view)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def render_probe(page: Path, script: str, width: int, height: int = 800) -> str:
    """The title ``script`` (JavaScript run on load) gave a copy of ``page`` rendered ``width`` px wide.

    Skips the calling test where Chromium is not installed: the HTML was then checked, not rendered.
    """
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("Debian's chromium is not installed: the HTML was checked, not rendered")
    probe = page.with_name(f"{page.stem}.probe.html")
    probe.write_text(page.read_text().replace("</body>", f"<script>window.onload=()=>{{{script}}}</script></body>"))
    try:
        dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                              f"--window-size={width},{height}", "--dump-dom", probe.as_uri()], capture_output=True,
                             text=True, timeout=120)
    finally:
        probe.unlink(missing_ok=True)
    start, end = dom.stdout.find("<title>"), dom.stdout.find("</title>")
    assert start >= 0 and end > start, dom.stdout[:500] + dom.stderr[-500:]
    return dom.stdout[start + len("<title>"):end]
