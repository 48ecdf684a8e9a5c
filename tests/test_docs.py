"""The docs site builds without a warning, loads nothing from another host (checked in the HTML, and in
headless Chromium, where its search must work offline), and the README stays an operator's page whose
links to files in the repository (the docs pages among them) lead somewhere."""

from __future__ import annotations

import functools
import html
import os
import re
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import CHROMIUM_ARGS, require_chromium

pytestmark = pytest.mark.static  # never the database: the PostgreSQL suite leaves it out

ROOT = Path(__file__).resolve().parent.parent


def build_site(site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` into `site`, from the repository's folder (the snippets' base path).
    NO_MKDOCS_2_WARNING silences Material's notice of its end of life (May 2027), which is no build
    warning; any other WARNING fails."""
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml")]
    return subprocess.run(
        [*command, "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def heading_ids(page: str) -> set[str]:
    """The anchors of a Markdown file's headings (outside code blocks), slugged as MkDocs' toc does."""
    from markdown.extensions.toc import slugify

    text = re.sub(r"^```.*?^```", "", (ROOT / page).read_text(), flags=re.M | re.S)
    titles = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {slugify(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", t).replace("`", ""), "-") for t in titles}


def test_docs_site_builds_strictly_with_its_picture(tmp_path):
    site = tmp_path / "site"
    done = build_site(site)
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    page = (site / "architecture" / "index.html").read_text()
    assert "architecture.svg" in page
    assert (site / "architecture.svg").is_file()
    # The configuration reference includes the generated bot_config.toml template whole.
    shown = html.unescape(re.sub(r"<[^>]+>", "", (site / "configuration" / "index.html").read_text()))
    template = (ROOT / "config" / "bot_config.toml").read_text().splitlines()
    assert [line for line in template if line.strip() and line not in shown] == []
    # Nothing from a CDN: every script, stylesheet and picture comes with the site; no web font.
    for page in site.rglob("*.html"):
        text = page.read_text()
        loads = re.findall(r'<(?:script|img)[^>]*\bsrc="(https?:)?//|<link[^>]*\bhref="(https?:)?//', text)
        assert not loads, f"{page.relative_to(site)} loads from another host"
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, page
    assert (site / "search" / "search_index.json").is_file()


def test_readme_is_an_operators_page_whose_links_lead_to_files_in_the_repository():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    # A fresh machine needs exactly two set-up commands.
    fresh = readme.split("## Quick start")[0]
    assert re.findall(r"^make \w+", fresh, re.M) == [], "set-up commands belong in the quick start"
    assert set(re.findall(r"^make [\w-]+", readme, re.M)) == {"make run", "make test"}
    for section in ("Quick start", "Connect QQ", "Configure a model", "The API", "Backup", "Password", "Upgrad"):
        assert re.search(rf"^## .*{section}", readme, re.M), section
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert not missing
    # Every anchor names a heading of its page (as MkDocs and GitHub both spell it).
    anchors = [t.partition("#") for t in re.findall(r"\]\(([^)\s]*#[^)\s]+)\)", readme)]
    assert anchors
    unknown = [f"{page}#{anchor}" for page, _, anchor in anchors if anchor not in heading_ids(page or "README.md")]
    assert not unknown
    # Every docs page is on the site's navigation.
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == set(re.findall(r"^\s+- [^:]+: ([\w-]+\.md)$", nav, re.M))


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.mark.live
@pytest.mark.browser
def test_site_in_chromium_loads_nothing_from_another_host_and_searches_offline(tmp_path):
    """Every page opened in headless Chromium from a local server, with every request elsewhere recorded
    and refused; the theme's search (its index and web worker) answers a query."""
    site = tmp_path / "site"
    done = build_site(site)
    assert done.returncode == 0, done.stderr
    handler = functools.partial(QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    outside: list[str] = []

    def route(route) -> None:
        if route.request.url.startswith(base):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    from playwright.sync_api import sync_playwright

    pages = sorted(str(p.parent.relative_to(site)) for p in site.rglob("index.html"))
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=require_chromium(), args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page()
                page.set_default_timeout(60_000)  # a loaded 2-core machine: the search worker indexes every page
                page.route("**/*", route)
                for path in pages:
                    page.goto(base + ("" if path == "." else f"{path}/"), wait_until="load")
                    assert page.locator("article h1").first.inner_text().strip(), path
                page.goto(base)
                page.fill("input[data-md-component=search-query]", "changepassword")
                page.locator(".md-search-result__item").first.wait_for()
                assert "changepassword" in page.locator(".md-search-result").inner_text().lower()
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert len(pages) >= 10
    assert outside == []
