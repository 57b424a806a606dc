"""Build the workbook as a static book: both editions, from the stored notebooks, offline (``make book``).

    python tools/book.py                  # build/book-src/<lang>/ (the Jupyter Book sources) -> _build/book/
    python tools/book.py --out DIR        # the site elsewhere
    python tools/book.py --hub URL --repo URL [--branch B]   # fill in the run-it box's nbgitpuller link
    python tools/book.py --stage DIR      # the Jupyter Book sources elsewhere (default build/book-src/)

The site: ``index.html`` (choose a language), ``en/`` and ``zh/``, one page per notebook with the same file name in
both (``en/03_loss_scaling.html``, ``zh/03_loss_scaling.html``), each edition's landing page its notebook map. Any
static host serves the folder as it is (every link is relative; nothing names a site).

Jupyter Book 1 (Sphinx, sphinx-book-theme, myst-nb) builds it, with execution off: the pages show the outputs
stored in ``notebooks/`` and ``notebooks/zh/``, so a build takes seconds and needs no GPU. Chosen because it installs
from the package index and builds with no network; Jupyter Book 2 (mystmd) downloads its theme at build time.
Everything a page loads is in the folder: MathJax 2 from the ``jupyter-server-mathjax`` package (Sphinx would load it
from a CDN), no widget JavaScript (the widgets get a static view, see :func:`static_widget`). The Chinese search
index is cut into words by jieba, with the glossary's Chinese terms as its dictionary, so 损失缩放 is one word.

Each page gets, under its title, a box that says how to run it (the two commands, and the nbgitpuller link a class
on JupyterHub uses) and, in the article header, a link to the same notebook in the other edition. Repository
tooling, not learner code; tests/browser/test_book.py checks the site in Chromium.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlencode

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit import catalog  # noqa: E402

__all__ = ["LANGS", "OUT", "STAGE", "build", "glossary_terms", "main", "run_box", "stage", "static_widget"]

#: The editions, each a folder of the site.
LANGS = ("en", "zh")
#: Where the Jupyter Book sources are staged (a build folder: written anew each time).
STAGE = ROOT / "build" / "book-src"
#: The site.
OUT = ROOT / "_build" / "book"
_MARK = ".labkit-book"  # marks a folder this tool made, the only kind it replaces
_WIDGET = "application/vnd.jupyter.widget-view+json"
_TEXT = {
    "en": {
        "title": "labkit: a hands-on workbook for HPC and mixed-precision training",
        "intro": "Every notebook of the workbook, executed: the outputs are the ones stored in the repository "
                 "(a CPU run, checked by the tests). To run them yourself, clone the repository and use the two "
                 "commands below.",
        "map": "The notebooks",
        "run": "Run it yourself",
        "local": "On your machine, in a clone of the repository: `make lab` opens JupyterLab on your own copy of "
                 "the notebooks, `{nb}` (`make test` runs the checks).",
        "hub": "A class on JupyterHub: this nbgitpuller link pulls the repository into each student's server and "
               "opens the notebook (fill in your hub and your copy of the repository; the hub's environment needs "
               "labkit installed, see docs/instructor.md):",
        "switch": "中文",
        "widget": "A static view of the widget as the stored run left it; the live widget needs JupyterLab "
                  "(`make lab`).",
        "landing_run": "Run it",
    },
    "zh": {
        "title": "labkit：HPC 与混合精度训练动手实验手册",
        "intro": "练习册的全部 notebook，均已运行：输出就是仓库中保存的输出（在 CPU 上运行，并经测试检查）。"
                 "想自己运行，请克隆仓库并使用下面的两条命令。",
        "map": "Notebook 目录",
        "run": "自己运行",
        "local": "在你自己的机器上，在仓库的克隆中：`make lab LAB_LANG=zh` 在你自己的 notebook 副本 `{nb}` 上打开 "
                 "JupyterLab（`make test` 运行全部检查）。",
        "hub": "在 JupyterHub 上开课：这个 nbgitpuller 链接会把仓库拉取到每位学员的服务器中并打开这个 notebook"
               "（请填入你的 hub 地址和你的仓库副本；hub 的环境需要装好 labkit，见 docs/instructor.zh-CN.md）：",
        "switch": "English",
        "widget": "这是该控件在保存的运行结束时的静态视图；要使用可交互的控件，需要 JupyterLab"
                  "（`make lab LAB_LANG=zh`）。",
        "landing_run": "自己运行",
    },
}


def _need_ours(folder: Path) -> None:
    """Refuse to replace a folder this tool did not make (nothing of a user's is deleted)."""
    if folder.exists() and not (folder / _MARK).is_file():
        raise ValueError(f"{folder} exists and was not made by tools/book.py: move it away or choose another --out")


def _fresh(folder: Path) -> Path:
    _need_ours(folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / _MARK).write_text("made by tools/book.py; replaced by each build\n")
    return folder


def glossary_terms() -> list[str]:
    """The Chinese terms of docs/glossary.md (each run of two or more Chinese characters in its 中文 column)."""
    terms: dict[str, None] = {}
    for line in (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and line.startswith("|") and not set(cells[1]) <= set("-: "):
            for term in re.findall(r"[\u4e00-\u9fff]{2,}", cells[1]):
                terms[term] = None
    return list(terms)


def run_box(lang: str, notebook: str, hub: str, repo: str, branch: str = "main") -> str:
    """The "run it" box under a page's title, as MyST Markdown: the two commands (a learner's own copy is
    ``work/NN.ipynb``, ``work-zh/`` for the Chinese edition) and the nbgitpuller link of a class on JupyterHub, in
    the form slurm/jupyterhub/jupyterhub_config.py uses (cloned into ``labkit/``)."""
    t = _TEXT[lang]
    folder = "notebooks" if lang == "en" else f"notebooks/{lang}"
    workspace = "work" if lang == "en" else f"work-{lang}"
    query = urlencode({"repo": repo.rstrip("/"), "branch": branch, "targetpath": "labkit",
                       "urlpath": f"lab/tree/labkit/{folder}/{notebook}"})
    link = f"{hub.rstrip('/')}/hub/user-redirect/git-pull?{query}"
    return (f":::{{admonition}} {t['run']}\n:class: tip labkit-run\n\n{t['local'].format(nb=f'{workspace}/{notebook}')}"
            f"\n\n{t['hub']}\n\n```text\n{link}\n```\n:::\n")


def _style(tag: str, state: dict[str, Any]) -> str:
    return f'<{tag} class="labkit-static-{state.get("_model_name", "").removesuffix("Model").lower()}"'


def static_widget(model_id: str, models: dict[str, Any]) -> str:
    """A widget's view as HTML, from the widget state the notebook stored: boxes, labels, HTML, text fields,
    dropdowns and (toggle) buttons, with the values the stored run left them with."""
    model = models.get(model_id)
    if model is None:
        return ""
    s = model.get("state", {})
    name = s.get("_model_name", "")
    kids = [static_widget(str(c).removeprefix("IPY_MODEL_"), models) for c in s.get("children", [])]
    desc = html.escape(str(s.get("description", "")))
    if name in ("VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel"):
        direction = "row" if name == "HBoxModel" else "column"
        return (f'{_style("div", s)} style="display:flex;flex-direction:{direction};flex-wrap:wrap;gap:4px">'
                + "".join(kids) + "</div>")
    if name in ("HTMLModel", "HTMLMathModel"):
        return f'{_style("div", s)}>{s.get("value", "")}</div>'
    if name in ("FloatProgressModel", "IntProgressModel"):
        return (f'{_style("progress", s)} max="{s.get("max", 100)}" value="{s.get("value", 0)}">'
                f'{s.get("value", 0)}</progress>')
    if name == "LabelModel":
        return f'{_style("span", s)}>{html.escape(str(s.get("value", "")))}</span>'
    if name in ("ToggleButtonModel", "ButtonModel"):
        pressed = " aria-pressed=\"true\" style=\"font-weight:bold\"" if s.get("value") else ""
        return f'{_style("button", s)} disabled{pressed}>{desc or html.escape(str(s.get("icon", "")))}</button>'
    if name == "DropdownModel":
        labels, index = s.get("_options_labels", []), s.get("index")
        chosen = labels[index] if isinstance(index, int) and 0 <= index < len(labels) else ""
        return (f'{_style("label", s)}>{desc} <select disabled><option>{html.escape(str(chosen))}</option>'
                "</select></label>")
    if "value" in s:  # Text, IntText, BoundedFloatText, Checkbox, sliders...
        return (f'{_style("label", s)}>{desc} <input disabled value="{html.escape(str(s["value"]), quote=True)}">'
                "</label>")
    return "".join(kids)


def _notebook(src: Path, lang: str, hub: str, repo: str, branch: str) -> nbformat.NotebookNode:
    nb = nbformat.read(src, as_version=4)
    models = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    note = html.escape(_TEXT[lang]["widget"]).replace("`make lab`", "<code>make lab</code>")
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).pop(_WIDGET, None)
            if view is not None:
                body = static_widget(view.get("model_id", ""), models)
                live = any(w in body for w in ("<button", "<select", "<input"))  # a control, not a progress bar
                out["data"]["text/html"] = (f'<div class="labkit-static-widget">{body}'
                                            + (f'<p class="labkit-widget-note"><em>{note}</em></p>' if live else "")
                                            + "</div>")
            markdown = out.get("data", {}).get("text/markdown")
            if isinstance(markdown, str):  # notebook 00's map links the notebooks next to it: their pages, here
                out["data"]["text/markdown"] = re.sub(r"\]\(([0-9]{2}_[a-z0-9_]+)\.ipynb\)", r"](\1.html)",
                                                      markdown)
    nb.metadata.pop("widgets", None)
    first = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"), -1)  # under the title
    nb.cells.insert(first + 1, nbformat.v4.new_markdown_cell(run_box(lang, src.name, hub, repo, branch)))
    return nb


def _landing(lang: str, names: list[str]) -> str:
    t = _TEXT[lang]
    table = catalog.markdown_table([n for n in catalog.NOTEBOOKS if n.stem in names], lang=lang)
    table = re.sub(r"\]\(notebooks/(?:[a-z]{2}/)?([0-9]{2}_[a-z0-9_]+)\.ipynb\)", r"](\1.ipynb)", table)
    lab = "make lab" if lang == "en" else f"make lab LAB_LANG={lang}"
    return (f"# {t['title']}\n\n{t['intro']}\n\n```sh\n{lab}\nmake test\n```\n\n## {t['map']}\n\n{table}\n")


def _config(lang: str, dest: Path, others: list[str]) -> str:
    conf: dict[str, Any] = {
        "title": "labkit" if lang == "en" else "labkit 中文版",
        "author": "labkit",
        "only_build_toc_files": True,
        "execute": {"execute_notebooks": "off"},
        "html": {"use_repository_button": False, "home_page_in_navbar": True},
        "sphinx": {"config": {
            "language": "en" if lang == "en" else "zh_CN",
            "html_search_language": lang,
            "html_static_path": ["_static"],
            "html_extra_path": ["_extra"],
            "templates_path": ["_templates"],
            "html_css_files": ["labkit-book.css"],
            "mathjax_path": "../mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full",  # relative to _static
            "mathjax2_config": {  # MathML, which browsers render with their own fonts; Sphinx's math spans
                "menuSettings": {"renderer": "NativeMML"},
                "HTML-CSS": {"availableFonts": [], "webFont": "STIX-Web", "imageFont": None, "preferredFont": None},
                "tex2jax": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]],
                            "processClass": "math|output_area", "ignoreClass": "tex2jax_ignore|mathjax_ignore"}},
            "nb_ipywidgets_js": {},
            # default_mode: else the theme logs "invalid theme mode" on a first visit; the other edition's pages
            "html_context": {"default_mode": "auto", "labkit_other_pages": others},
            "html_favicon": "_static/labkit.svg",
            "html_theme_options": {"article_header_end": ["labkit-lang.html", "article-header-buttons.html"],
                                   "use_download_button": False},
            "suppress_warnings": ["mystnb.unknown_mime_type"],
        }},
    }
    if lang == "zh":
        conf["sphinx"]["config"]["html_search_options"] = {"dict": str(dest / "_static" / "glossary-terms.txt")}
    return json.dumps(conf, ensure_ascii=False, indent=1)  # JSON is YAML


_ICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" rx="6" '
         'fill="#1f6feb"/><text x="16" y="22" font-family="sans-serif" font-size="14" fill="#fff" '
         'text-anchor="middle">lk</text></svg>\n')
_CSS = """.header-article-items__end { display: flex; align-items: center; }
.labkit-lang { margin: 0 .75rem; font-weight: 600; align-self: center; white-space: nowrap; }
.labkit-static-widget { border: 1px dashed var(--pst-color-border); padding: .5rem; overflow-x: auto; }
.labkit-static-widget button { margin: 1px; min-width: 1.6rem; }
.labkit-widget-note { font-size: .85em; margin: .4rem 0 0; }
"""


_HUB, _REPO = "https://<your-hub>", "https://<host>/<you>/labkit"


def stage(lang: str, hub: str = _HUB, repo: str = _REPO, branch: str = "main", into: Path = STAGE) -> Path:
    """Write the Jupyter Book sources of one edition into ``into/<lang>`` and return the folder."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {', '.join(LANGS)}, got {lang!r}")
    src_dir = ROOT / "notebooks" if lang == "en" else ROOT / "notebooks" / lang
    into.mkdir(parents=True, exist_ok=True)
    dest = _fresh(into / lang)
    names = [n.stem for n in catalog.available() if (src_dir / n.filename).is_file()]
    for stem in names:
        nbformat.write(_notebook(src_dir / f"{stem}.ipynb", lang, hub, repo, branch), dest / f"{stem}.ipynb")
    (dest / "index.md").write_text(_landing(lang, names), encoding="utf-8")
    toc = "format: jb-book\nroot: index\nchapters:\n" + "".join(f"- file: {s}\n" for s in names)
    (dest / "_toc.yml").write_text(toc, encoding="utf-8")
    other = "zh" if lang == "en" else "en"
    other_dir = ROOT / "notebooks" if other == "en" else ROOT / "notebooks" / other
    others = ["index", "search", "genindex"] + [s for s in names if (other_dir / f"{s}.ipynb").is_file()]
    (dest / "_config.yml").write_text(_config(lang, dest, others), encoding="utf-8")
    (dest / "_templates").mkdir()
    (dest / "_templates" / "labkit-lang.html").write_text(  # the same page in the other edition, else its map
        f'<a class="labkit-lang" hreflang="{other}" href="../{other}/'
        '{% if pagename in labkit_other_pages %}{{ pagename }}{% else %}index{% endif %}.html">'
        f'{_TEXT[lang]["switch"]}</a>\n', encoding="utf-8")
    static = dest / "_static"
    static.mkdir()
    (static / "labkit-book.css").write_text(_CSS, encoding="utf-8")
    (static / "labkit.svg").write_text(_ICON, encoding="utf-8")
    import jupyter_server_mathjax

    # not under _static: Jupyter Book adds every .js file there to every page
    shutil.copytree(Path(jupyter_server_mathjax.__file__).parent / "static", dest / "_extra" / "mathjax")
    if lang == "zh":
        (static / "glossary-terms.txt").write_text("".join(f"{t} 100000 n\n" for t in glossary_terms()),
                                                   encoding="utf-8")
    return dest


_THEBE = re.compile(r'\s*<script>const THEBE_JS_URL = [^<]*</script>|\s*<script async="async" src="_static/sphinx-thebe'
                    r'\.js[^"]*"></script>|\s*<script type="text/x-thebe-config">.*?</script>', re.DOTALL)


def _no_thebe(page: str) -> str:
    """A page without sphinx-thebe's scripts: Jupyter Book 1 writes its settings twice (a ``const`` declared twice
    is an error in every page's console), and the pages run no code (thebe would load from another site)."""
    return _THEBE.sub("", page)


_ROOT_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>labkit</title>
<script>if ((navigator.language || "").toLowerCase().startsWith("zh")) location.replace("zh/index.html");
else location.replace("en/index.html");</script></head>
<body><p><a href="en/index.html" hreflang="en">English</a> · <a href="zh/index.html" hreflang="zh">中文</a></p>
</body></html>
"""


def build(out: Path = OUT, hub: str = _HUB, repo: str = _REPO, branch: str = "main", stage_dir: Path = STAGE) -> Path:
    """Stage and build both editions, and assemble the site in ``out``; return ``out``. The root page sends a
    reader to the edition of the browser's language (and links both)."""
    _need_ours(out)
    book = Path(sys.executable).with_name("jupyter-book")
    if not book.is_file():
        raise RuntimeError(f"no {book}: install the book's tools (make install-dev, or pip install -e '.[book]')")
    built = {}
    for lang in LANGS:
        src = stage(lang, hub, repo, branch, stage_dir)
        t0 = time.perf_counter()
        try:
            done = subprocess.run([str(book), "build", str(src), "--quiet", "--warningiserror", "--keep-going"],
                                  capture_output=True, text=True, cwd=src, timeout=600)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"jupyter-book build {lang} took over 600 s") from None
        if done.returncode != 0:
            raise RuntimeError(f"jupyter-book build {lang} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        print(f"{lang}: built in {time.perf_counter() - t0:.1f} s")
        built[lang] = src / "_build" / "html"
    site = _fresh(out)
    for lang, html_dir in built.items():
        shutil.copytree(html_dir, site / lang)
        for page in (site / lang).glob("*.html"):
            page.write_text(_no_thebe(page.read_text(encoding="utf-8")), encoding="utf-8")
    (site / "index.html").write_text(_ROOT_PAGE, encoding="utf-8")
    return site


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line on stderr, exit status 2 (labkit._cli's convention)
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help=f"the site folder (default: {OUT.relative_to(ROOT)})")
    ap.add_argument("--hub", default=_HUB, help="the JupyterHub of the run-it box's link")
    ap.add_argument("--repo", default=_REPO, help="the repository nbgitpuller pulls")
    ap.add_argument("--branch", default="main", help="its branch (default: main)")
    ap.add_argument("--stage", type=Path, default=STAGE,
                    help=f"where the Jupyter Book sources go (default: {STAGE.relative_to(ROOT)})")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        site = build(a.out.resolve(), a.hub, a.repo, a.branch, a.stage.resolve())
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"book: {exc}", file=sys.stderr)
        return 1
    print(f"book: {site} in {time.perf_counter() - t0:.1f} s (open {site / 'index.html'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
