"""Build the workbook's notebooks from their percent-format sources and store them executed.

    python tools/nbbuild.py                 # every tools/nbsrc/*.py
    python tools/nbbuild.py 01 03           # by number prefix
    python tools/nbbuild.py --no-execute 01 # write cells only (tests/test_repo.py will complain)
    python tools/nbbuild.py --markdown-only 11  # only markdown changed: replace it, keep the stored outputs
    python tools/nbbuild.py --lang zh 01    # the Chinese edition: notebooks/zh/01_....ipynb
    python tools/nbbuild.py --stale zh      # list the Chinese cells whose English changed since (exit 1 if any)
    python tools/nbbuild.py --stamp zh 01   # record the English text a new Chinese cell translates

The sources are jupytext's "percent" format, read with jupytext itself:

    # %% [markdown]
    # # Title
    # Some *markdown*; each line starts with "# " (or is a bare "#").
    # %%
    x = 1          # a code cell
    # %% tags=["raises-exception"]

**Two editions, one source.** A prose cell's Chinese partner follows it directly, as a markdown cell with the
metadata ``lang="zh"`` and ``en="<hash>"``, the first 12 hex digits of the SHA-256 of the English cell it
translates (``--stamp zh`` records it, for partners that have none yet). Code cells are shared, byte for byte.
The English build drops the Chinese cells; the Chinese build (``--lang zh``, into ``notebooks/zh/``) puts each
partner in its English cell's place. A notebook has a Chinese edition once its source has Chinese cells, and
then every English prose cell must have a current partner: ``tests/test_zh.py`` fails on a missing partner, a
stale hash (the English changed after it was translated), a Chinese cell out of place, or a stored notebook that
differs from a fresh build, and ``--stale zh`` lists what to translate again.

Cells are written with deterministic ids, executed with nbclient in notebooks/ (the same working
directory that nbval and JupyterLab use), and saved with outputs and widget state. Each notebook carries
jupytext pairing metadata (``notebooks///ipynb,tools/nbsrc///py:percent``), so that an author with jupytext
installed can open a notebook in JupyterLab and have its source kept in step; the student build drops it.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import time
from pathlib import Path
from typing import NoReturn

import jupytext
import nbformat
from nbclient import NotebookClient

from labkit.i18n import LANGUAGES

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tools" / "nbsrc"
OUT = ROOT / "notebooks"
LANGS = LANGUAGES  # the editions: English first


def edition_dir(lang: str) -> Path:
    """Where an edition's notebooks are stored: notebooks/ for English, notebooks/<lang>/ for a translation."""
    return OUT if lang == "en" else OUT / lang


def text_hash(text: str) -> str:
    """The first 12 hex digits of the SHA-256 of a cell's text: what a translation records of its original."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _cells(text: str) -> list:
    return jupytext.reads(text, fmt="py:percent").cells


def drift(text: str, lang: str = "zh") -> list[str]:
    """What is wrong with the ``lang`` edition of a source, one line per problem; [] if it is complete and current.

    A source without ``lang`` cells has no such edition (nothing is wrong). Otherwise every English prose cell
    needs a partner right after it, and each partner's ``en`` hash must be the hash of that English cell."""
    cells = _cells(text)
    if not any(c.metadata.get("lang") == lang for c in cells):
        return []
    problems = []
    for i, c in enumerate(cells):
        first = c.source.strip().splitlines()[0][:60] if c.source.strip() else "(empty)"
        if c.metadata.get("lang") == lang:
            prev = cells[i - 1] if i else None
            if prev is None or prev.cell_type != "markdown" or prev.metadata.get("lang"):
                problems.append(f"cell {i}: a {lang} cell with no English prose cell before it: {first}")
            elif c.metadata.get("en") != text_hash(prev.source):
                state = "never stamped" if "en" not in c.metadata else "stale: the English changed"
                problems.append(f"cell {i}: {state}: {cells[i - 1].source.strip().splitlines()[0][:60]}")
        elif c.metadata.get("lang"):
            problems.append(f"cell {i}: unknown language {c.metadata['lang']!r}")
        elif c.cell_type == "markdown":
            nxt = cells[i + 1] if i + 1 < len(cells) else None
            if nxt is None or nxt.metadata.get("lang") != lang:
                problems.append(f"cell {i}: English prose with no {lang} partner: {first}")
    return problems


def stamp(text: str, lang: str = "zh") -> str:
    """Record the English hash in every ``lang`` cell that has none yet (never in a stale one)."""
    lines, out = text.splitlines(keepends=True), []
    cells = _cells(text)
    pending = [text_hash(cells[i - 1].source) for i, c in enumerate(cells)
               if c.metadata.get("lang") == lang and "en" not in c.metadata and i]
    header = re.compile(r'^# %% \[markdown\] lang="' + lang + r'"\s*$')
    for line in lines:
        if header.match(line.rstrip("\n")) and pending:
            line = f'# %% [markdown] lang="{lang}" en="{pending.pop(0)}"\n'
        out.append(line)
    return "".join(out)


#: Characters after or before which a line break is no space in Chinese (CJK ideographs and full-width punctuation).
_CJK = "\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef"
_PREFIX = re.compile(r"^((?:>\s?)*)(\s*)")


def join_cjk_lines(text: str) -> str:
    """Join the source's wrapped lines where both sides of the break are Chinese.

    Markdown renders a soft line break as a space, which reads as a stray gap inside a Chinese sentence (GitHub and
    JupyterLab both show it). The sources wrap at 120 columns for review, so the Chinese edition's markdown is
    joined at build time: a line whose previous line ends with a CJK character, and which (after the same
    blockquote prefix and any indentation) starts with one, continues that line. Code fences are left alone."""
    out: list[str] = []
    fence = False
    for line in text.split("\n"):
        if line.lstrip("> ").startswith("```"):
            fence = not fence
            out.append(line)
            continue
        if not fence and out and out[-1] and re.search(f"[{_CJK}]$", out[-1]):
            prev, cur = _PREFIX.match(out[-1]), _PREFIX.match(line)
            rest = line[cur.end():]
            if prev.group(1) == cur.group(1) and re.match(f"[{_CJK}]", rest):
                out[-1] += rest
                continue
        out.append(line)
    return "\n".join(out)


def parse(text: str, lang: str = "en") -> list[nbformat.NotebookNode]:
    """Split percent-format text into one edition's cells (with jupytext), deterministic ids, only tags kept.

    ``lang="en"`` drops the translated cells; ``lang="zh"`` puts each Chinese cell in its English cell's place."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    src = _cells(text)
    kept = []
    for i, c in enumerate(src):
        if c.metadata.get("lang"):
            continue
        nxt = src[i + 1] if i + 1 < len(src) else None
        if lang != "en" and c.cell_type == "markdown" and nxt is not None and nxt.metadata.get("lang") == lang:
            c = nxt
        kept.append(c)
    cells = []
    for i, c in enumerate(kept):
        if c.cell_type == "markdown":
            cell = nbformat.v4.new_markdown_cell(join_cjk_lines(c.source) if lang != "en" else c.source)
        else:
            cell = nbformat.v4.new_code_cell(c.source)
        if c.metadata.get("tags"):
            cell.metadata["tags"] = list(c.metadata["tags"])
        cell["id"] = f"c{i:03d}"
        cells.append(cell)
    return cells


def has_edition(src: Path, lang: str) -> bool:
    """True if the source has cells in ``lang`` (English: always)."""
    return lang == "en" or any(c.metadata.get("lang") == lang for c in _cells(src.read_text()))


#: jupytext pairing: notebooks/NN_x.ipynb <-> tools/nbsrc/NN_x.py
PAIRING = "notebooks///ipynb,tools/nbsrc///py:percent"


def new_notebook(cells: list[nbformat.NotebookNode], lang: str = "en") -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    if lang == "en":  # the Chinese edition has no file of its own to pair with: edit the shared source
        nb.metadata["jupytext"] = {"formats": PAIRING}
    else:
        nb.metadata["labkit"] = {"lang": lang}
    return nb


def build(src: Path, execute: bool = True, timeout: int = 600, lang: str = "en") -> Path:
    nb = new_notebook(parse(src.read_text(), lang), lang)
    out = edition_dir(lang)
    out.mkdir(exist_ok=True)
    dest = out / (src.stem + ".ipynb")
    if execute:
        t0 = time.perf_counter()
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                                resources={"metadata": {"path": str(out)}})  # where nbval and JupyterLab run it
        client.execute()
        print(f"{dest.name}: executed in {time.perf_counter() - t0:.1f} s")
    nb.metadata.pop("widgets", None) if not execute else None
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.validate(nb)
    dest.write_text(nbformat.writes(nb) + "\n")
    return dest


def update_markdown(src: Path) -> Path:
    """Replace the stored notebook's markdown cells with the source's, keeping every code cell and its outputs.

    For edits of prose only: the code cells (source, tags, order) must be exactly the stored ones, else
    ``ValueError`` says which differs and nothing is written (run a full build instead)."""
    dest = OUT / (src.stem + ".ipynb")
    new = parse(src.read_text())
    old = nbformat.read(dest, as_version=4)
    if len(new) != len(old.cells):
        raise ValueError(f"{dest.name}: {len(new)} cells in the source, {len(old.cells)} stored: build it in full")
    for i, (a, b) in enumerate(zip(new, old.cells)):
        if a.cell_type != b.cell_type or (a.cell_type == "code" and (
                a.source != b.source or a.metadata.get("tags") != b.metadata.get("tags"))):
            raise ValueError(f"{dest.name}: cell {i} is not markdown-only changed: build it in full")
    for a, b in zip(new, old.cells):
        if a.cell_type == "markdown":
            b.source = a.source
    nbformat.validate(old)
    dest.write_text(nbformat.writes(old) + "\n")
    print(f"{dest.name}: markdown updated, outputs kept")
    return dest


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line on stderr, exit status 2 (labkit._cli's convention)
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("which", nargs="*", help="number prefixes such as 01; default: all")
    ap.add_argument("--no-execute", action="store_true")
    ap.add_argument("--markdown-only", action="store_true",
                    help="replace the stored markdown cells, keep code cells and outputs (code must be unchanged)")
    ap.add_argument("--lang", choices=LANGS, default="en", help="the edition to build (default: en)")
    ap.add_argument("--stale", choices=LANGS[1:], help="list the cells of this edition to translate again")
    ap.add_argument("--stamp", choices=LANGS[1:], help="record the English hash in new translated cells")
    args = ap.parse_args(argv)
    srcs = sorted(SRC.glob("[0-9][0-9]_*.py"))
    if args.which:
        srcs = [s for s in srcs if any(s.name.startswith(w) for w in args.which)]
    if not srcs:
        print("no matching sources in tools/nbsrc", file=sys.stderr)
        return 2
    if args.stale:
        found = 0
        for s in srcs:
            for problem in drift(s.read_text(), args.stale):
                print(f"{s.relative_to(ROOT)}: {problem}")
                found += 1
        print(f"{found} {args.stale} cell(s) to translate or check" if found else f"the {args.stale} edition is current")
        return 1 if found else 0
    if args.stamp:
        for s in srcs:
            new = stamp(s.read_text(), args.stamp)
            if new != s.read_text():
                s.write_text(new)
                print(f"{s.relative_to(ROOT)}: stamped")
        return 0
    if args.lang != "en":
        srcs = [s for s in srcs if has_edition(s, args.lang)]
        for s in srcs:
            build(s, execute=not args.no_execute, lang=args.lang)
        return 0
    if args.markdown_only:
        for s in srcs:
            update_markdown(s)
        return 0
    for s in srcs:  # new notebooks exist (unexecuted) before any runs: 00 checks the map's files
        if not (OUT / (s.stem + ".ipynb")).exists():
            build(s, execute=False)
    for s in srcs:
        build(s, execute=not args.no_execute)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
