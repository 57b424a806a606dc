"""Build the workbook's notebooks from their percent-format sources and store them executed.

    python tools/nbbuild.py                 # every tools/nbsrc/*.py
    python tools/nbbuild.py 01 03           # by number prefix
    python tools/nbbuild.py --no-execute 01 # write cells only (tests/test_repo.py will complain)
    python tools/nbbuild.py --markdown-only 11  # only markdown changed: replace it, keep the stored outputs

The sources are jupytext's "percent" format, read with jupytext itself:

    # %% [markdown]
    # # Title
    # Some *markdown*; each line starts with "# " (or is a bare "#").
    # %%
    x = 1          # a code cell
    # %% tags=["raises-exception"]

Cells are written with deterministic ids, executed with nbclient in notebooks/ (the same working
directory that nbval and JupyterLab use), and saved with outputs and widget state. Each notebook carries
jupytext pairing metadata (``notebooks///ipynb,tools/nbsrc///py:percent``), so that an author with jupytext
installed can open a notebook in JupyterLab and have its source kept in step; the student build drops it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NoReturn

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tools" / "nbsrc"
OUT = ROOT / "notebooks"


def parse(text: str) -> list[nbformat.NotebookNode]:
    """Split percent-format text into notebook cells (with jupytext), with deterministic ids and only tags kept."""
    nb = jupytext.reads(text, fmt="py:percent")
    cells = []
    for i, c in enumerate(nb.cells):
        cell = (nbformat.v4.new_markdown_cell(c.source) if c.cell_type == "markdown"
                else nbformat.v4.new_code_cell(c.source))
        if c.metadata.get("tags"):
            cell.metadata["tags"] = list(c.metadata["tags"])
        cell["id"] = f"c{i:03d}"
        cells.append(cell)
    return cells


#: jupytext pairing: notebooks/NN_x.ipynb <-> tools/nbsrc/NN_x.py
PAIRING = "notebooks///ipynb,tools/nbsrc///py:percent"


def new_notebook(cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata = {
        "jupytext": {"formats": PAIRING},
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    return nb


def build(src: Path, execute: bool = True, timeout: int = 600) -> Path:
    nb = new_notebook(parse(src.read_text()))
    dest = OUT / (src.stem + ".ipynb")
    if execute:
        t0 = time.perf_counter()
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                                resources={"metadata": {"path": str(OUT)}})
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
    args = ap.parse_args(argv)
    srcs = sorted(SRC.glob("[0-9][0-9]_*.py"))
    if args.which:
        srcs = [s for s in srcs if any(s.name.startswith(w) for w in args.which)]
    if not srcs:
        print("no matching sources in tools/nbsrc", file=sys.stderr)
        return 2
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
