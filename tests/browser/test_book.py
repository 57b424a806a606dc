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
import html
import html.parser
import http.server
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The book, built as `make book` builds it; offline (in a network namespace of its own, with no interface up)
    where this process may make one (root, as in CI)."""
    base = tmp_path_factory.mktemp("book")
    out = base / "site"
    cmd = [sys.executable, str(ROOT / "tools" / "book.py"), "--out", str(out), "--stage", str(base / "src"),
           "--hub", "https://hub.example.edu", "--repo", "https://git.example.edu/me/labkit/", "--branch", "class"]
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
        words = re.sub(r"<[^>]+>", "", landing)  # the commands are highlighted word by word
        assert ("make lab LAB_LANG=zh" if lang == "zh" else "make lab") in words and "make test" in words
    root = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="en/index.html"' in root and 'href="zh/index.html"' in root and "navigator.language" in root


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


def _widget(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index('<div class="labkit-static-widget">')
    return text[start:text.index('<p class="labkit-widget-note">', start)]


def test_widgets_have_a_static_view_of_their_stored_state(site: Path) -> None:
    bits = _widget(site / "en" / "01_float_bit_layouts.html")
    assert bits.count('class="labkit-static-togglebutton"') >= 16       # one button per bit of the format
    number = float(re.search(r'<input disabled value="([^"]+)"', bits).group(1))
    label = re.search(r"(fp16|bf16|fp32|e4m3fn|e5m2)\s+0x[0-9a-f]+ = ([-0-9.e+]+|inf|-inf|nan)", bits)
    assert label and (float(label.group(2)) == number or math.isnan(number) and label.group(2) == "nan"), \
        "the number box and the value shown agree"
    calc = _widget(site / "zh" / "06_memory.html")
    assert '<input disabled value="13.0"' in calc and "<option>bf16-master</option>" in calc
    note = (site / "zh" / "06_memory.html").read_text(encoding="utf-8")
    assert "要使用可交互的控件，需要 JupyterLab" in note
    bars = (site / "en" / "04_amp_training.html").read_text(encoding="utf-8")
    assert "<progress" in bars and "labkit-widget-note" not in bars     # progress bars: no "live widget" note


def test_every_notebook_page_has_a_run_it_box_with_the_class_link(site: Path) -> None:
    for page in _pages(site):
        if not page.stem[:2].isdigit():
            continue
        text = page.read_text(encoding="utf-8")
        words = html.unescape(re.sub(r"<[^>]+>", "", text))  # Sphinx wraps each word of inline code in a span
        lang = page.parent.name
        folder, workspace = ("notebooks", "work") if lang == "en" else (f"notebooks/{lang}", f"work-{lang}")
        link = re.search(r"https://hub\.example\.edu/hub/user-redirect/git-pull\?\S+", words)
        assert "labkit-run" in text and link and f"{workspace}/{page.stem}.ipynb" in words, page.name
        query = parse_qs(urlsplit(link.group(0)).query)
        assert query == {"repo": ["https://git.example.edu/me/labkit"], "branch": ["class"], "targetpath": ["labkit"],
                         "urlpath": [f"lab/tree/labkit/{folder}/{page.stem}.ipynb"]}, (page.name, query)


def test_the_search_index_of_the_chinese_edition_holds_the_glossary_terms(site: Path) -> None:
    index = (site / "zh" / "searchindex.js").read_text(encoding="utf-8")
    terms = json.loads(index[index.index("(") + 1:index.rindex(")")])["terms"]
    for term in ("损失缩放", "主权重", "次正规数"):  # jieba alone cuts 主权重 into 主权 + 重
        assert term in terms, term


def _open(browser: Any, url: str, **context: Any) -> tuple[Any, Any, list[str]]:
    ctx = browser.new_context(**context)
    page = ctx.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}") if "ERR_ABORTED" not in (
        r.failure or "") else None)  # a load cut short by the next navigation (a click) is no failure
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


@pytest.mark.parametrize("lang,query,page_stem", [("en", "loss scaling", "03_loss_scaling"),
                                                  ("zh", "损失缩放", "03_loss_scaling"),
                                                  ("en", "hysteresis", "10_deepspeed_zero"),   # body text only
                                                  ("zh", "主权重", "02_underflow_overflow_rounding")])
def test_search_finds_a_term_in_each_language(served: str, browser: Any, lang: str, query: str,
                                              page_stem: str) -> None:
    ctx, page, problems = _open(browser, f"{served}{lang}/search.html?q={query}")
    try:
        results = page.locator("#search-results ul.search li a")
        results.first.wait_for(timeout=30_000)
        hrefs = [results.nth(i).get_attribute("href") or "" for i in range(results.count())]
        assert any(page_stem in h for h in hrefs), hrefs
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
        switch = page.locator("a.labkit-lang").first.bounding_box()
        header = page.locator("header").first.bounding_box()
        assert switch and header and switch["y"] >= header["y"] + header["height"] - 1 and \
            switch["x"] >= 0 and switch["x"] + switch["width"] <= widths["view"], (switch, header)
    finally:
        ctx.close()
    assert not problems, problems
