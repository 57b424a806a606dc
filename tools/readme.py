"""Regenerate README.md's generated blocks: the notebook map and the seed-coverage map.

    python tools/readme.py              # rewrite the blocks of README.md in place
    python tools/readme.py --check      # exit 1 (and change nothing) if README.md is stale
    python tools/readme.py OTHER.md     # another file with the same markers

The notebook map comes from :data:`labkit.catalog.NOTEBOOKS`, the seed-coverage map from
``docs/seed_coverage.toml`` (each topic the workbook should teach and the notebook sections that do).
Both live between ``<!-- notebook-map:start/end -->`` and ``<!-- seed-coverage:start/end -->`` markers.
tests/test_repo.py and tests/test_coverage.py check that the README is current. This is repository tooling:
it reads docs/ next to this file, so it is not part of the installed labkit package. It imports labkit
(``make lab`` installs it editable into .venv): run it with that Python, ``.venv/bin/python tools/readme.py``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from labkit.catalog import NOTEBOOKS, markdown_table

__all__ = ["COVERAGE_FILE", "README", "ROOT", "Topic", "coverage_table", "load_coverage", "main", "render",
           "update_readme"]

#: The repository root (this file is tools/readme.py).
ROOT = Path(__file__).resolve().parents[1]
#: The seed-coverage data file: each topic the workbook should teach, and the notebook sections that do.
COVERAGE_FILE = ROOT / "docs" / "seed_coverage.toml"
#: The README whose blocks are generated.
README = ROOT / "README.md"

_START, _END = "<!-- notebook-map:start -->", "<!-- notebook-map:end -->"
_COV_START, _COV_END = "<!-- seed-coverage:start -->", "<!-- seed-coverage:end -->"


@dataclass(frozen=True)
class Topic:
    """One seed topic: its name, the (notebook, heading) sections that teach it, and a note on any gap.

    ``status`` is "covered", "partial" (taught in part; the note says what is missing) or "open" (no
    section teaches it). Introduced in notebook 00.
    """

    name: str
    sections: tuple[tuple[str, str], ...]
    partial: bool = False
    note: str = ""

    @property
    def status(self) -> str:
        """ "covered", "partial" or "open"."""
        if not self.sections:
            return "open"
        return "partial" if self.partial else "covered"


def load_coverage(path: str | Path | None = None) -> list[Topic]:
    """Read the seed-coverage file (default ``docs/seed_coverage.toml``) into a list of :class:`Topic`.

    Needs Python >= 3.11 (``tomllib``; on 3.10 the ``tomli`` package). Raises ``FileNotFoundError`` if
    the file is missing and ``ValueError`` (or ``TypeError``) for a malformed entry.
    Introduced in notebook 00.
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10: the same parser as the tomli package
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise RuntimeError("reading docs/seed_coverage.toml needs Python >= 3.11 (tomllib) or the "
                               "tomli package on Python 3.10") from None
    p = Path(path) if path is not None else COVERAGE_FILE
    if not p.is_file():
        raise FileNotFoundError(f"no seed-coverage file at {p} (it lives in the repository's docs/)")
    data = tomllib.loads(p.read_text())
    topics = []
    for i, t in enumerate(data.get("topic", [])):
        if not isinstance(t.get("name"), str) or not isinstance(t.get("sections"), list):
            raise TypeError(f"{p}: topic #{i + 1} needs a name (str) and sections (a list)")
        secs = []
        for sec in t["sections"]:
            if set(sec) != {"notebook", "heading"}:
                raise ValueError(f"{p}: {t['name']!r}: each section is {{notebook = 'NN', heading = '...'}}")
            secs.append((str(sec["notebook"]), str(sec["heading"])))
        if not secs and t.get("partial"):
            raise ValueError(f"{p}: {t['name']!r} is partial but lists no section")
        if (t.get("partial") or not secs) and not t.get("note"):
            raise ValueError(f"{p}: {t['name']!r}: a partial or open topic needs a note saying what is missing")
        topics.append(Topic(t["name"], tuple(secs), bool(t.get("partial", False)), str(t.get("note", ""))))
    if not topics:
        raise ValueError(f"{p} lists no [[topic]]")
    return topics


def _anchor(heading: str) -> str:
    """The GitHub/JupyterLab anchor of a Markdown heading (lower case, punctuation dropped, spaces to -)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def coverage_table(topics: list[Topic] | None = None) -> str:
    """Return the seed-coverage map as a Markdown table: topic, status, the sections that teach it, the gap.

    Introduced in notebook 00.
    """
    stems = {n.number: n for n in NOTEBOOKS}
    rows = ["| Topic | Status | Where it is taught | Not yet taught |", "|---|---|---|---|"]
    for t in topics if topics is not None else load_coverage():
        where = []
        for nb, heading in t.sections:
            text = heading.replace("|", "\\|")
            link = f"notebooks/{stems[nb].filename}#{_anchor(heading)}" if nb in stems else ""
            where.append(f"{nb} [{text}]({link})" if link else f"{nb} {text}")
        gap = t.note.replace("|", "\\|")
        rows.append(f"| {t.name} | {t.status} | {'<br>'.join(where) or '—'} | {gap} |")
    return "\n".join(rows)


def render(text: str) -> str:
    """Return ``text`` with its notebook map (and its seed-coverage block, if it has one) regenerated.

    Raises ``ValueError`` if ``text`` has no notebook-map block. Introduced in notebook 00.
    """
    if _START not in text or _END not in text:
        raise ValueError(f"no {_START} ... {_END} block")
    nb_map = _START + "\n" + markdown_table() + "\n" + _END
    new = re.sub(re.escape(_START) + ".*?" + re.escape(_END), lambda m: nb_map, text, flags=re.DOTALL)
    if _COV_START in new and _COV_END in new:
        block = _COV_START + "\n" + coverage_table() + "\n" + _COV_END
        new = re.sub(re.escape(_COV_START) + ".*?" + re.escape(_COV_END), lambda m: block, new,
                     flags=re.DOTALL)
    return new


def update_readme(path: str | Path = README) -> bool:
    """Rewrite the README's notebook map (and its seed-coverage block, if it has one); return True if changed.

    Introduced in notebook 00.
    """
    p = Path(path)
    text = p.read_text()
    try:
        new = render(text)
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from None
    if new != text:
        p.write_text(new)
    return new != text


def main(argv: Sequence[str] | None = None) -> int:
    """Update (or with ``--check`` only check) the README's generated blocks; return the exit status.

    Introduced in notebook 00.
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("readme", nargs="?", default=str(README), help="the file to update (default: README.md)")
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 if the generated blocks are stale")
    a = ap.parse_args(argv)
    p = Path(a.readme)
    if a.check:
        text = p.read_text()
        try:
            stale = render(text) != text
        except ValueError as exc:
            print(f"{p}: {exc}", file=sys.stderr)
            return 1
        if stale:
            print(f"{p} is stale: run python tools/readme.py", file=sys.stderr)
            return 1
        print(f"{p} is current")
        return 0
    print(f"{p}: updated" if update_readme(p) else f"{p}: already current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
