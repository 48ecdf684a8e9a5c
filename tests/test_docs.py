"""The docs site builds without a warning, loads nothing from another host, and the README's links to
files in the repository (the docs pages among them) lead somewhere."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_docs_site_builds_strictly_with_its_picture(tmp_path):
    site = tmp_path / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml")]
    done = subprocess.run(
        [*command, "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    page = (site / "architecture" / "index.html").read_text()
    assert "architecture.svg" in page
    assert (site / "architecture.svg").is_file()
    # Nothing from a CDN: every script, stylesheet and picture comes with the site.
    for html in site.rglob("*.html"):
        loads = re.findall(r'<(?:script|img)[^>]*\bsrc="(https?:)?//|<link[^>]*\bhref="(https?:)?//', html.read_text())
        assert not loads, f"{html.relative_to(site)} loads from another host"


def test_readme_links_lead_to_files_in_the_repository():
    readme = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert not missing
