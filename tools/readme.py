"""Regenerate README.md's generated blocks: the notebook map and the seed-coverage map (and README.zh-CN.md's).

    python tools/readme.py              # rewrite the blocks of README.md, docs/student/README.md, README.zh-CN.md
    python tools/readme.py --check      # exit 1 (and change nothing) if either is stale
    python tools/readme.py OTHER.md     # another file with the same markers

The notebook map comes from :data:`labkit.catalog.NOTEBOOKS`, the seed-coverage map from
``docs/seed_coverage.toml`` (one row per section of the three source articles: how deeply the workbook teaches it,
where, whether it needs a GPU, and where the workbook corrects the article).
Both live between ``<!-- notebook-map:start/end -->`` and ``<!-- seed-coverage:start/end -->`` markers.
tests/test_repo.py and tests/test_coverage.py check that the README is current. This is repository tooling:
it reads docs/ next to this file, so it is not part of the installed labkit package. It imports labkit
(``make lab`` installs it editable into .venv): run it with that Python, ``.venv/bin/python tools/readme.py``.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from labkit import i18n
from labkit.catalog import NOTEBOOKS, markdown_table

__all__ = ["COVERAGE_CONTEXT", "COVERAGE_FILE", "DEPTHS", "EVIDENCE", "EXERCISE_ID", "GPU_NEEDED", "PROOF_ASSERT",
           "README", "README_ZH", "ROOT", "STUDENT_README", "Correction", "Row", "Where", "coverage_messages",
           "coverage_summary", "coverage_table", "edition_headings", "lang_of", "load_coverage", "load_seeds", "main",
           "render", "update_readme"]

#: The repository root (this file is tools/readme.py).
ROOT = Path(__file__).resolve().parents[1]
#: The seed-coverage data file: one row per section of the source articles, and where and how deeply it is taught.
COVERAGE_FILE = ROOT / "docs" / "seed_coverage.toml"
#: The README whose blocks are generated.
README = ROOT / "README.md"
#: The student tree's README (labkit.student.TREE_README): its notebook map is generated too.
STUDENT_README = ROOT / "docs" / "student" / "README.md"
#: The Chinese README: the same blocks, in Chinese (the catalog's translations), linking the Chinese notebooks.
README_ZH = ROOT / "README.zh-CN.md"
#: The gettext context of the coverage table's words (a depth, a GPU answer), apart from the same words elsewhere.
COVERAGE_CONTEXT = "seed coverage"

_START, _END = "<!-- notebook-map:start -->", "<!-- notebook-map:end -->"
_COV_START, _COV_END = "<!-- seed-coverage:start -->", "<!-- seed-coverage:end -->"


#: The depths a row can have, shallowest first.
DEPTHS = ("missing", "mentioned", "explained", "run", "exercised")
#: Whether seeing a row's content for real needs a GPU (or a site's hardware).
GPU_NEEDED = ("no", "partly", "yes")
#: An exercise id in a ``proof`` list, as labkit.exercises names them; the other kind starts with ``PROOF_ASSERT``.
EXERCISE_ID = re.compile(r"\d\d\.[a-z0-9][a-z0-9-]*")
PROOF_ASSERT = "assert: "
#: What backs a correction: a code cell that asserts the truth ("run") or the documentation the box names ("docs").
EVIDENCE = ("run", "docs")


@dataclass(frozen=True)
class Where:
    """One place a seed section is taught: notebook number, exact heading text, and how deeply it is taught there.

    Introduced in notebook 00.
    """

    notebook: str
    heading: str
    depth: str
    #: What proves a "run" or "exercised" depth there: exercise ids (``"09.global-batch"``, called by check/reveal/
    #: predict in a code cell of that section) and ``"assert: <fragment>"`` (an ``assert`` statement of a code cell
    #: of that section contains the fragment). An "exercised" place names at least one exercise id.
    proof: tuple[str, ...] = ()


@dataclass(frozen=True)
class Correction:
    """Where the workbook corrects an article: the claim, what is true, the section holding the misconception box
    (``box`` = (notebook, heading)) and what backs it (``evidence``: "run" or "docs"); a "run" correction names in
    ``shown_by`` a fragment of the ``assert`` statement in the box's section that shows the truth. Introduced in
    notebook 00.
    """

    claim: str
    truth: str
    box: tuple[str, str]
    evidence: str
    shown_by: str = ""


@dataclass(frozen=True)
class Row:
    """One section of one source article: its seed and section number, a title, the depth it is taught to, where,
    whether it needs a GPU, a note (what the depth leaves out, or why it is missing) and its corrections.

    ``depth`` is the deepest of its ``where`` entries; "missing" rows have none. Introduced in notebook 00.
    """

    seed: str
    section: str
    title: str
    depth: str
    gpu: str
    where: tuple[Where, ...]
    note: str = ""
    corrections: tuple[Correction, ...] = ()

    @property
    def key(self) -> str:
        """``"000 §1.1"``: the seed and section, as the tables and the misconception boxes write them."""
        return f"{self.seed} §{self.section}"


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise ValueError(f"{where}: {what}")


def _text(value: object, where: str, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"{where}: {name} must be a non-empty string, got {value!r}")
    return value


def load_seeds(path: str | Path | None = None) -> dict[str, str]:
    """Return ``{seed number: English title}`` from the coverage file's ``[seeds.NNN]`` tables.

    Introduced in notebook 00.
    """
    data = _read_toml(path)
    seeds = data.get("seeds")
    if not isinstance(seeds, dict) or not seeds:
        raise ValueError("the seed-coverage file has no [seeds.NNN] tables")
    return {str(k): _text(v.get("title") if isinstance(v, dict) else None, f"seeds.{k}", "title")
            for k, v in seeds.items()}


def _read_toml(path: str | Path | None) -> dict:
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
    return tomllib.loads(p.read_text())


def load_coverage(path: str | Path | None = None) -> list[Row]:
    """Read the seed-coverage file (default ``docs/seed_coverage.toml``) into a list of :class:`Row`, in file order.

    Checks what a file alone can tell: known depths, GPU and evidence values; a row's depth is the deepest of its
    ``where`` entries; a "missing" row has no ``where`` and says why in its ``note``; every correction names its
    box; no section appears twice. (tests/test_coverage.py checks the headings against the notebooks.) Raises
    ``FileNotFoundError`` for a missing file, ``ValueError``/``TypeError`` for a malformed one. Needs Python >= 3.11
    (``tomllib``; on 3.10 the ``tomli`` package). Introduced in notebook 00.
    """
    data = _read_toml(path)
    seeds = load_seeds(path)
    rows: list[Row] = []
    for i, r in enumerate(data.get("section", [])):
        at = f"section #{i + 1}"
        seed, section = _text(r.get("seed"), at, "seed"), _text(r.get("section"), at, "section")
        at = f"{seed} §{section}"
        _need(seed in seeds, at, f"seed {seed!r} has no [seeds.{seed}] table")
        depth, gpu = r.get("depth"), r.get("gpu")
        _need(depth in DEPTHS, at, f"depth must be one of {DEPTHS}, got {depth!r}")
        _need(gpu in GPU_NEEDED, at, f"gpu must be one of {GPU_NEEDED}, got {gpu!r}")
        where_raw = r.get("where")
        if not isinstance(where_raw, list):
            raise TypeError(f"{at}: where must be a list of {{notebook, heading, depth}}")
        where = []
        for w in where_raw:
            _need(isinstance(w, dict) and {"notebook", "heading", "depth"} <= set(w) <= {"notebook", "heading",
                  "depth", "proof"}, at, "each where entry is {notebook = 'NN', heading = '...', depth = '...', "
                  "proof = [...]}")
            _need(w["depth"] in DEPTHS[1:], at,
                  f"a where entry's depth must be one of {DEPTHS[1:]}, got {w['depth']!r}")
            place = f"{at} ({w['notebook']} {w['heading']!r})"
            proof = w.get("proof", [])
            _need(isinstance(proof, list) and all(isinstance(p, str) and p.strip() for p in proof), place,
                  "proof is a list of exercise ids and 'assert: <fragment>' strings")
            for p in proof:
                _need(bool(EXERCISE_ID.fullmatch(p)) or (p.startswith(PROOF_ASSERT) and len(p) > len(PROOF_ASSERT) + 3),
                      place, f"a proof is an exercise id ('09.global-batch') or 'assert: <fragment>', got {p!r}")
            if w["depth"] in ("run", "exercised"):
                _need(bool(proof), place, f"a {w['depth']!r} place names its proof (exercise ids, 'assert: ...')")
            else:
                _need(not proof, place, f"a {w['depth']!r} place has nothing to prove: give no proof")
            if w["depth"] == "exercised":
                _need(any(EXERCISE_ID.fullmatch(p) for p in proof), place,
                      "an 'exercised' place names the exercise ids that exercise it")
            _need(len(set(proof)) == len(proof), place, "a proof is listed twice")
            where.append(Where(str(w["notebook"]), _text(w["heading"], at, "heading"), w["depth"], tuple(proof)))
        note = str(r.get("note", ""))
        if depth == "missing":
            _need(not where, at, "a missing row lists no where")
            _need(bool(note.strip()), at, "a missing row needs a note saying why")
        else:
            _need(bool(where), at, f"a {depth!r} row needs where entries")
            deepest = max(where, key=lambda w: DEPTHS.index(w.depth)).depth
            _need(depth == deepest, at, f"depth {depth!r} is not the deepest of its where entries ({deepest!r})")
        corrections = []
        for c in r.get("correction", []):
            _need(isinstance(c, dict) and {"claim", "truth", "box", "evidence"} <= set(c) <= {"claim", "truth", "box",
                  "evidence", "shown_by"}, at, "each [[section.correction]] has claim, truth, box, evidence "
                  "(and shown_by when the evidence is 'run')")
            box = c["box"]
            _need(isinstance(box, dict) and set(box) == {"notebook", "heading"}, at,
                  "a correction's box is {notebook = 'NN', heading = '...'}")
            _need(c["evidence"] in EVIDENCE, at, f"evidence must be one of {EVIDENCE}, got {c['evidence']!r}")
            shown_by = c.get("shown_by", "")
            if c["evidence"] == "run":
                _need(isinstance(shown_by, str) and bool(shown_by.strip()), at,
                      "a correction with evidence 'run' names what shows it: shown_by = '<a fragment of the assert>'")
            else:
                _need(not shown_by, at, "a correction with evidence 'docs' has no shown_by")
            corrections.append(Correction(_text(c["claim"], at, "claim"), _text(c["truth"], at, "truth"),
                                          (str(box["notebook"]), _text(box["heading"], at, "box heading")),
                                          c["evidence"], shown_by))
        row = Row(seed, section, _text(r.get("title"), at, "title"), depth, gpu, tuple(where), note,
                  tuple(corrections))
        _need(row.key not in {x.key for x in rows}, at, "listed twice")
        rows.append(row)
    if not rows:
        raise ValueError("the seed-coverage file lists no [[section]]")
    return rows


def _anchor(heading: str) -> str:
    """The GitHub/JupyterLab anchor of a Markdown heading (lower case, punctuation dropped, spaces to -)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def edition_headings(notebook: str, lang: str) -> dict[str, str]:
    """``{English heading: its heading in the edition lang}`` for one notebook: the sources pair each English prose
    cell with its translation, and the n-th heading of a cell with the n-th heading of its partner. Raises
    ``ValueError`` where a pair's headings differ in number or level."""
    return dict(_edition_headings(notebook, lang))


@functools.cache
def _edition_headings(notebook: str, lang: str) -> tuple[tuple[str, str], ...]:
    try:
        import nbbuild  # run as tools/readme.py, or imported with tools/ on the path
    except ModuleNotFoundError:
        from tools import nbbuild

    stems = {n.number: n for n in NOTEBOOKS}
    if notebook not in stems:
        raise ValueError(f"no notebook {notebook!r}")
    src = ROOT / "tools" / "nbsrc" / f"{stems[notebook].stem}.py"
    text = src.read_text(encoding="utf-8")
    pairs = zip(nbbuild.parse(text, "en"), nbbuild.parse(text, lang))
    found: dict[str, str] = {}
    for en, tr in pairs:
        if en.cell_type != "markdown":
            continue
        heads = [re.findall(r"^(#+) (.+)$", c.source, flags=re.MULTILINE) for c in (en, tr)]
        if [h for h, _ in heads[0]] != [h for h, _ in heads[1]]:
            raise ValueError(f"{src.name}: the headings of a cell and its {lang} partner differ: {heads}")
        found.update({a.strip(): b.strip() for (_, a), (_, b) in zip(*heads)})
    return tuple(found.items())


def _link(notebook: str, heading: str, lang: str = "en") -> str:
    stems = {n.number: n for n in NOTEBOOKS}
    if notebook not in stems:
        return f"{notebook} {_cell(heading)}"
    folder = "notebooks" if lang == "en" else f"notebooks/{lang}"
    shown = heading
    if lang != "en":
        pairs = edition_headings(notebook, lang)
        if heading.strip() not in pairs:
            raise ValueError(f"notebook {notebook} has no {lang} partner for the heading {heading!r}")
        shown = pairs[heading.strip()]
    return f"{notebook} [{_cell(shown)}]({folder}/{stems[notebook].filename}#{_anchor(shown)})"


def coverage_messages(rows: list[Row] | None = None) -> list[tuple[str, str | None]]:
    """Every text the coverage table shows that a translation translates: (message, gettext context). The
    message catalogs hold them (tools/i18n.py)."""
    rows = load_coverage() if rows is None else rows
    out: list[tuple[str, str | None]] = [(w, COVERAGE_CONTEXT) for w in (*DEPTHS, *GPU_NEEDED)]
    out += [(m, None) for m in _COVERAGE_FORMS]
    for r in rows:
        out += [(t, None) for t in (r.title, r.note) if t]
        out += [(t, None) for c in r.corrections for t in (c.claim, c.truth)]
    return list(dict.fromkeys(out))


_COVERAGE_FORMS = (
    "{sections} sections: {counts}; {corrections} corrections of the articles.",
    "{count} {depth}",
    "{first}, {second}",
    "{place} ({depth})",
    "“{claim}” {truth} ({box})",
    "| Seed § | Section | Depth | Where it is taught | GPU needed | Where the workbook corrects the article | Notes |",
)


def coverage_summary(rows: list[Row] | None = None, lang: str = "en") -> str:
    """One line: how many sections at each depth, and how many corrections. Introduced in notebook 00."""
    rows = load_coverage() if rows is None else rows
    t = functools.partial(i18n.translate, lang=lang)
    counts = [t("{count} {depth}").format(count=sum(r.depth == d for r in rows),
                                          depth=t(d, context=COVERAGE_CONTEXT)) for d in reversed(DEPTHS)]
    joined = functools.reduce(lambda a, b: t("{first}, {second}").format(first=a, second=b), counts)
    n_corr = sum(len(r.corrections) for r in rows)
    return t("{sections} sections: {counts}; {corrections} corrections of the articles.").format(
        sections=len(rows), counts=joined, corrections=n_corr)


def coverage_table(rows: list[Row] | None = None, lang: str = "en") -> str:
    """Return the seed-coverage map as Markdown: a summary line, then one table row per seed section.

    Columns: seed and section, title, depth, where it is taught (each place with its own depth), whether it needs a
    GPU, where the workbook corrects the article (the claim, what is true, a link to the box), and notes. In a
    translated edition (``lang``) every text comes from the message catalog and the links go to that edition's
    notebooks and headings. Introduced in notebook 00.
    """
    rows = load_coverage() if rows is None else rows
    t = functools.partial(i18n.translate, lang=lang)
    word = functools.partial(i18n.translate, lang=lang, context=COVERAGE_CONTEXT)
    out = [coverage_summary(rows, lang), "", t(_COVERAGE_FORMS[-1]), "|---|---|---|---|---|---|---|"]
    for r in rows:
        where = "<br>".join(t("{place} ({depth})").format(place=_link(w.notebook, w.heading, lang),
                                                          depth=word(w.depth)) for w in r.where) or "—"
        corr = "<br>".join(t("“{claim}” {truth} ({box})").format(claim=_cell(t(c.claim)), truth=_cell(t(c.truth)),
                                                                   box=_link(*c.box, lang)) for c in r.corrections)
        note = _cell(t(r.note)) if r.note else ""
        out.append(f"| {r.key} | {_cell(t(r.title))} | {word(r.depth)} | {where} | {word(r.gpu)} | {corr or '—'} "
                   f"| {note} |")
    return "\n".join(out)


def lang_of(path: str | Path) -> str:
    """The edition a README is written in: ``README.zh-CN.md`` → ``"zh"``; any other → ``"en"``."""
    parts = Path(path).name.split(".")
    return (i18n.normalise(parts[-2]) or "en") if len(parts) >= 3 else "en"


def render(text: str, lang: str = "en") -> str:
    """Return ``text`` with its notebook map (and its seed-coverage block, if it has one) regenerated, in the
    edition ``lang``.

    Raises ``ValueError`` if ``text`` has no notebook-map block. Introduced in notebook 00.
    """
    if _START not in text or _END not in text:
        raise ValueError(f"no {_START} ... {_END} block")
    nb_map = _START + "\n" + markdown_table(lang=lang) + "\n" + _END
    new = re.sub(re.escape(_START) + ".*?" + re.escape(_END), lambda m: nb_map, text, flags=re.DOTALL)
    if _COV_START in new and _COV_END in new:
        block = _COV_START + "\n" + coverage_table(lang=lang) + "\n" + _COV_END
        new = re.sub(re.escape(_COV_START) + ".*?" + re.escape(_COV_END), lambda m: block, new,
                     flags=re.DOTALL)
    return new


def update_readme(path: str | Path = README) -> bool:
    """Rewrite the README's notebook map (and its seed-coverage block, if it has one), in the README's language
    (:func:`lang_of`); return True if changed.

    Introduced in notebook 00.
    """
    p = Path(path)
    text = p.read_text()
    try:
        new = render(text, lang_of(p))
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from None
    if new != text:
        p.write_text(new)
    return new != text


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line on stderr, exit status 2 (labkit._cli's convention)
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Update (or with ``--check`` only check) the README's generated blocks; return the exit status.

    Introduced in notebook 00.
    """
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("readme", nargs="?", default=None,
                    help="the file to update (default: README.md, docs/student/README.md, README.zh-CN.md)")
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 if the generated blocks are stale")
    a = ap.parse_args(argv)
    status = 0
    for p in [Path(a.readme)] if a.readme is not None else [README, STUDENT_README, README_ZH]:
        if a.check:
            text = p.read_text()
            try:
                stale = render(text, lang_of(p)) != text
            except ValueError as exc:
                print(f"{p}: {exc}", file=sys.stderr)
                status = 1
                continue
            if stale:
                print(f"{p} is stale: run python tools/readme.py", file=sys.stderr)
                status = 1
            else:
                print(f"{p} is current")
            continue
        print(f"{p}: updated" if update_readme(p) else f"{p}: already current")
    return status


if __name__ == "__main__":
    sys.exit(main())
