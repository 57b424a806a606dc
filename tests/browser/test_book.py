"""`make book`: the static book of both editions, built from the stored notebooks and read in headless Chromium.

The site is built once (tools/book.py, into a temporary folder) and served by a plain static server on loopback, as
any static host would serve it. In the browser: every page of both editions loads with no console error and asks
for nothing outside the site; the language switch goes to the same notebook in the other edition; search finds a
term in each language ("loss scaling", 损失缩放); a page is readable at phone width (the page does not scroll
sideways). Without a browser: every internal link, anchor and image of every page resolves; the widgets have a
static view that says the live one needs JupyterLab; each page has the run-it box.
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The book, built as `make book` builds it; offline (in a network namespace of its own, with no interface up)
    where this process may make one (root, as in CI)."""
    out = tmp_path_factory.mktemp("book") / "site"
    cmd = [sys.executable, str(ROOT / "tools" / "book.py"), "--out", str(out)]
    if os.geteuid() == 0 and shutil.which("unshare"):
        cmd = ["unshare", "--net", *cmd]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    seconds = [float(x) for x in re.findall(r"built in ([0-9.]+) s", done.stdout)]
    assert len(seconds) == 2, done.stdout
    print(f"book built: {done.stdout.strip().splitlines()[-1]}")
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The site on http://127.0.0.1:<free port>/ (loopback only), served as files."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def _pages(site: Path) -> list[Path]:
    return sorted(p for lang in ("en", "zh") for p in (site / lang).glob("*.html"))


class _Refs(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        for key in ("href", "src"):
            value = a.get(key)
            if value and not (tag == "link" and a.get("rel") in ("preconnect", "dns-prefetch")):
                self.refs.append(value)


@functools.cache
def _parsed(path: Path) -> _Refs:
    refs = _Refs()
    refs.feed(path.read_text(encoding="utf-8"))
    return refs


def test_both_editions_have_every_notebook_and_a_landing_page(site: Path) -> None:
    stems = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for lang in ("en", "zh"):
        built = {p.stem for p in (site / lang).glob("[0-9][0-9]_*.html")}
        assert built == set(stems), f"{lang}: {sorted(set(stems) ^ built)}"
        landing = (site / lang / "index.html").read_text(encoding="utf-8")
        assert all(f'href="{s}.html"' in landing for s in stems), f"{lang}: the landing page maps every notebook"
    assert 'url=en/index.html' in (site / "index.html").read_text(encoding="utf-8")


def test_every_internal_link_anchor_and_image_resolves(site: Path) -> None:
    broken = []
    for page in [site / "index.html", *_pages(site)]:
        for ref in _parsed(page).refs:
            parts = urlsplit(ref)
            if parts.scheme in ("http", "https", "mailto", "data", "javascript") or ref.startswith("//"):
                continue
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if not target.is_relative_to(site.resolve()) or not target.exists():
                broken.append(f"{page.relative_to(site)} -> {ref}")
            elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in _parsed(target).ids:
                broken.append(f"{page.relative_to(site)} -> {ref} (no such anchor)")
    assert not broken, f"{len(broken)} broken: {broken[:8]}"


def test_every_page_links_no_other_site_for_what_it_loads(site: Path) -> None:
    """Scripts, styles, images and fonts come from the site itself (a reader offline, or behind a firewall)."""
    outside = []
    for page in _pages(site):
        text = page.read_text(encoding="utf-8")
        for ref in _parsed(page).refs:
            loaded = f'src="{ref}"' in text or (f'href="{ref}"' in text and ref.split("?")[0].endswith(
                (".css", ".js", ".woff2", ".png", ".svg", ".ico")))
            if loaded and (urlsplit(ref).scheme in ("http", "https") or ref.startswith("//")):
                outside.append(f"{page.name}: {ref}")
    assert not outside, outside[:5]


def test_widgets_have_a_static_view_and_every_page_a_run_it_box(site: Path) -> None:
    bits = (site / "en" / "01_float_bit_layouts.html").read_text(encoding="utf-8")
    assert "labkit-static-widget" in bits and "needs JupyterLab" in bits and "<button" in bits
    calc = (site / "zh" / "06_memory.html").read_text(encoding="utf-8")
    assert "labkit-static-widget" in calc and "JupyterLab" in calc and "<select disabled>" in calc
    for page in _pages(site):
        if page.stem[:2].isdigit():
            text = page.read_text(encoding="utf-8")
            words = re.sub(r"<[^>]+>", "", text)  # Sphinx wraps each word of inline code in its own span
            assert "labkit-run" in text and "git-pull?repo=" in words and "make lab" in words, page.name


def _open(browser: Any, url: str, **context: Any) -> tuple[Any, Any, list[str]]:
    ctx = browser.new_context(**context)
    page = ctx.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
    origin = urlsplit(url).netloc
    page.on("request", lambda r: problems.append(f"outside: {r.url}") if urlsplit(r.url).netloc not in (
        origin, "") and not r.url.startswith("data:") else None)
    page.goto(url, wait_until="load")
    return ctx, page, problems


def test_every_page_loads_without_console_errors(site: Path, served: str, browser: Any) -> None:
    bad = []
    for page_path in _pages(site):
        url = served + page_path.relative_to(site).as_posix()
        ctx, page, problems = _open(browser, url)
        try:
            page.wait_for_load_state("networkidle")
            assert page.locator("h1").count() >= 1, url
        finally:
            ctx.close()
        bad += [f"{page_path.relative_to(site)}: {p}" for p in problems]
    assert not bad, "\n".join(bad[:10])


def test_math_is_typeset_by_the_sites_own_mathjax(served: str, browser: Any) -> None:
    ctx, page, problems = _open(browser, served + "en/01_float_bit_layouts.html")
    try:
        page.locator(".MathJax_MathML math").first.wait_for(timeout=30_000)  # MathJax 2 writes MathML
    finally:
        ctx.close()
    assert not problems, problems


def test_the_language_switch_goes_to_the_same_notebook(served: str, browser: Any) -> None:
    ctx, page, problems = _open(browser, served + "en/03_loss_scaling.html")
    try:
        page.get_by_role("link", name="中文").first.click()
        page.wait_for_url("**/zh/03_loss_scaling.html")
        assert "损失缩放" in page.locator("h1").first.inner_text()
        page.get_by_role("link", name="English").first.click()
        page.wait_for_url("**/en/03_loss_scaling.html")
        assert "Loss scaling" in page.locator("h1").first.inner_text()
        page.goto(served + "zh/index.html")
        page.get_by_role("link", name="English").first.click()
        page.wait_for_url("**/en/index.html")
    finally:
        ctx.close()
    assert not problems, problems


@pytest.mark.parametrize("lang,query", [("en", "loss scaling"), ("zh", "损失缩放")])
def test_search_finds_a_term_in_each_language(served: str, browser: Any, lang: str, query: str) -> None:
    ctx, page, problems = _open(browser, f"{served}{lang}/search.html?q={query}")
    try:
        results = page.locator("#search-results ul.search li a")
        results.first.wait_for(timeout=30_000)
        hrefs = [results.nth(i).get_attribute("href") or "" for i in range(results.count())]
        assert any("03_loss_scaling" in h for h in hrefs), hrefs
    finally:
        ctx.close()
    assert not problems, problems


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_page_is_readable_at_phone_width(served: str, browser: Any, lang: str) -> None:
    ctx, page, problems = _open(browser, f"{served}{lang}/03_loss_scaling.html", viewport=PHONE,
                                device_scale_factor=2, is_mobile=True, has_touch=True)
    try:
        page.wait_for_load_state("networkidle")
        widths = page.evaluate("""() => ({page: document.documentElement.scrollWidth, view: window.innerWidth,
            text: Math.max(...[...document.querySelectorAll('article p')].map(p => p.getBoundingClientRect().right))})""")
        assert widths["page"] <= widths["view"], widths       # the page itself does not scroll sideways
        assert widths["text"] <= widths["view"], widths       # and no paragraph runs past the screen
    finally:
        ctx.close()
    assert not problems, problems
