"""labkit's message catalogs: extract, update, compile and check them with Babel.

    python tools/i18n.py update     # extract the messages; add the new ones to each catalog (untranslated), drop
                                    # the ones no longer used; then compile
    python tools/i18n.py compile    # labkit/locale/<lang>/LC_MESSAGES/labkit.po -> labkit.mo
    python tools/i18n.py check      # exit 1 with a list if a message is untranslated, a catalog is stale or a
                                    # translation drops or adds a {field}
    python tools/i18n.py todo zh    # the untranslated messages of a catalog, as a .po to fill in
    python tools/i18n.py merge zh PART.po...   # copy filled-in parts into the catalog, then compile

The messages are (1) every string literal labkit passes to ``_``/``N_``/``gettext`` (Babel's Python extractor) and
(2) the exercises' texts (prompt, hint, method, worked solution, the typical mistake's answer, the success line),
read from the exercise registry, which labkit.check translates where it shows them, and (3) the lines the notebooks'
code cells print (context ``printed``): each ``print(...)`` call in a code cell of ``tools/nbsrc/``, as a template
with one ``{field}`` per value it formats, written as the code writes it (``labkit.printed.translate_line`` finds the
template of each line a Chinese notebook prints and prints its translation with the same values). A line with no
English word (three letters or more) is no sentence and is left out. tests/test_i18n.py runs
``check``. Repository tooling, not learner code.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
from collections import Counter
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.extract import extract_from_dir
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po, write_po

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from labkit import i18n, printed  # noqa: E402
from tools import nbbuild  # noqa: E402

__all__ = ["EXERCISE_FIELDS", "KEYWORDS", "compile_catalogs", "extract", "fields", "merge", "po_path", "printed_lines",
           "problems", "todo", "update"]

#: The gettext functions labkit calls (``_`` is ``labkit.i18n.gettext`` imported under gettext's usual name).
KEYWORDS = {"_": None, "N_": None, "gettext": None, "translate": None}
#: The exercise texts a learner reads (labkit.check shows them through gettext).
EXERCISE_FIELDS = ("prompt", "hint", "method", "solution", "wrong_why", "success")
_FIELD = re.compile(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_]*)(?:[!:][^{}]*)?\}(?!\})")


def printed_lines() -> list[tuple[str, str, int, str]]:
    """Every line template the notebooks' code cells print (``labkit.printed.templates_of`` of each code cell):
    (template, notebook file, cell number, the cell's first line), in notebook order."""
    found = []
    for src in sorted((ROOT / "tools" / "nbsrc").glob("[0-9][0-9]_*.py")):
        for n, cell in enumerate(nbbuild.parse(src.read_text(encoding="utf-8"))):
            if cell.cell_type == "code":
                found += [(t, src.name, n, cell.source) for t in printed.templates_of(cell.source)]
    return found


def po_path(lang: str) -> Path:
    return i18n.LOCALE_DIR / lang / "LC_MESSAGES" / f"{i18n.DOMAIN}.po"


def extract() -> Catalog:
    """The template: every learner-facing message, with where it comes from."""
    cat = Catalog(project="labkit", version="0.1.0", charset="utf-8")
    method_map = [("**.py", "python")]
    for filename, lineno, message, comments, context in extract_from_dir(
            str(ROOT / "labkit"), method_map=method_map, keywords=KEYWORDS, strip_comment_tags=True):
        if isinstance(message, str) and message:
            cat.add(message, locations=[(f"labkit/{filename}", lineno)], auto_comments=comments, context=context)
    from labkit.catalog import NOTEBOOKS
    from labkit.exercises import all_exercises

    for nb in NOTEBOOKS:  # the progress report names each notebook by its title; the READMEs' map shows the rest
        for name in ("title", "teaches", "cpu", "gpu"):
            text, where = getattr(nb, name), (f"notebook {nb.number} {name}", 0)
            if text in cat:
                cat[text].locations.append(where)
            else:
                cat.add(text, locations=[where])
    from tools import readme

    for text, context in readme.coverage_messages():  # README.zh-CN.md's seed-coverage map
        have = cat.get(text, context=context)
        if have is not None:
            have.locations.append(("docs/seed_coverage.toml", 0))
        else:
            cat.add(text, locations=[("docs/seed_coverage.toml", 0)], context=context)

    exs = all_exercises()
    for ex in (exs.values() if isinstance(exs, dict) else exs):
        for name in EXERCISE_FIELDS:
            text = getattr(ex, name)
            if isinstance(text, str) and text.strip():
                if text in cat:
                    cat[text].locations.append((f"exercise {ex.id}", 0))
                else:
                    cat.add(text, locations=[(f"exercise {ex.id}", 0)], auto_comments=[f"{ex.id} {name}"])
    for template, name, cell, _source in printed_lines():
        where = (f"tools/nbsrc/{name} cell", cell)
        have = cat.get(template, context=printed.CONTEXT)
        if have is not None:
            have.locations.append(where)
        else:
            cat.add(template, locations=[where], context=printed.CONTEXT,
                    auto_comments=["a printed line: keep each {field} as it is (the value printed there)"])
    for msg in cat:  # "80 % of" is no %-format: labkit formats with str.format only
        msg.flags.discard("python-format")
    return cat


def _read(lang: str) -> Catalog:
    path = po_path(lang)
    if not path.exists():
        return Catalog(locale=lang, project="labkit", version="0.1.0", charset="utf-8")
    with path.open("rb") as f:
        return read_po(f, locale=lang)


def _po_bytes(cat: Catalog) -> bytes:
    buf = io.BytesIO()
    write_po(buf, cat, width=120, sort_output=False, omit_header=False, ignore_obsolete=True)
    return buf.getvalue()


def _mo_bytes(cat: Catalog) -> bytes:
    buf = io.BytesIO()
    write_mo(buf, cat, use_fuzzy=False)
    return buf.getvalue()


def update(langs: tuple[str, ...] = tuple(x for x in i18n.LANGUAGES if x != "en")) -> None:
    template = extract()
    for lang in langs:
        cat = _read(lang)
        cat.update(template, no_fuzzy_matching=True)
        cat.obsolete.clear()
        for msg in cat:
            msg.flags.discard("python-format")
        path = po_path(lang)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_po_bytes(cat))
    compile_catalogs(langs)


def compile_catalogs(langs: tuple[str, ...] = tuple(x for x in i18n.LANGUAGES if x != "en")) -> None:
    for lang in langs:
        po_path(lang).with_suffix(".mo").write_bytes(_mo_bytes(_read(lang)))


def fields(text: str) -> set[str]:
    """The named ``{fields}`` a message formats (``{{`` and ``}}`` are literal braces)."""
    return set(_FIELD.findall(text))


def printed_fields(text: str) -> Counter[str] | None:
    """The fields of a printed-line template, with how often each occurs (None: the braces do not balance)."""
    try:
        return Counter(p[0] for p in printed.template_parts(text) if isinstance(p, tuple))
    except ValueError:
        return None


def problems(lang: str) -> list[str]:
    """What is wrong with a catalog: untranslated or fuzzy messages, messages no longer extracted, translations
    whose fields differ from the English, and a compiled catalog that is not the .po compiled."""
    out: list[str] = []
    cat, template = _read(lang), extract()
    for msg in template:
        if not msg.id:
            continue
        have = cat.get(msg.id, context=msg.context)
        where = ", ".join(f"{f}:{n}" if n else f for f, n in msg.locations[:2])
        short = msg.id if len(msg.id) < 70 else msg.id[:67] + "..."
        if have is None or not have.string:
            out.append(f"untranslated ({where}): {short!r}")
        elif have.fuzzy:
            out.append(f"fuzzy, to check ({where}): {short!r}")
        elif msg.context == printed.CONTEXT:
            mine, theirs = printed_fields(msg.id), printed_fields(have.string)
            if theirs is None or (mine is not None and set(theirs) != set(mine)):
                out.append(f"fields differ ({where}): {short!r} vs {have.string[:70]!r}")
        elif fields(msg.id) != fields(have.string):
            out.append(f"fields differ ({where}): {sorted(fields(msg.id))} vs {sorted(fields(have.string))}")
    extra = [m.id for m in cat if m.id and template.get(m.id, context=m.context) is None]
    out += [f"no longer used (run python tools/i18n.py update): {m[:67]!r}" for m in extra]
    mo = po_path(lang).with_suffix(".mo")
    if not mo.exists() or mo.read_bytes() != _mo_bytes(cat):
        shown = mo.relative_to(ROOT) if mo.is_relative_to(ROOT) else mo
        out.append(f"{shown} is not {po_path(lang).name} compiled: run python tools/i18n.py compile")
    return out


def merge(lang: str, parts: list[Path]) -> int:
    """Copy the translations of ``parts`` (.po files, as ``todo`` writes them, filled in) into ``lang``'s catalog;
    return how many were copied. A part's message the catalog does not have is an error (ValueError)."""
    cat = _read(lang)
    copied = 0
    for part in parts:
        with part.open("rb") as f:
            for msg in read_po(f, locale=lang):
                if not msg.id or not msg.string:
                    continue
                have = cat.get(msg.id, context=msg.context)
                if have is None:
                    raise ValueError(f"{part}: {msg.id[:60]!r} is not in the catalog (run update first)")
                have.string, copied = msg.string, copied + 1
    po_path(lang).write_bytes(_po_bytes(cat))
    compile_catalogs((lang,))
    return copied


def todo(lang: str) -> bytes:
    """The untranslated messages of ``lang``'s catalog, as a .po to fill in."""
    cat = _read(lang)
    part = Catalog(locale=lang, project="labkit", version="0.1.0", charset="utf-8")
    for msg in cat:
        if msg.id and not msg.string:
            part.add(msg.id, "", locations=msg.locations, auto_comments=msg.auto_comments, context=msg.context)
    return _po_bytes(part)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["update", "compile", "check", "todo", "merge"])
    ap.add_argument("lang", nargs="?", default="zh", choices=[x for x in i18n.LANGUAGES if x != "en"])
    ap.add_argument("parts", nargs="*", type=Path, help="merge: the filled-in .po files")
    a = ap.parse_args(argv)
    if a.command == "update":
        update()
    elif a.command == "compile":
        compile_catalogs()
    elif a.command == "merge":
        print(f"{a.lang}: {merge(a.lang, a.parts)} translations merged")
    elif a.command == "todo":
        sys.stdout.buffer.write(todo(a.lang))
    else:
        found = problems(a.lang)
        for line in found:
            print(line)
        print(f"{a.lang}: {len(found)} problem(s)")
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
