"""The learner's language: what labkit prints, in the notebook's edition (English or Chinese).

labkit's learner-facing messages (the ``check`` verdicts, hints, methods and worked solutions, the progress report,
the doctor's report) are looked up in gettext message catalogs, the ecosystem's standard: ``labkit/locale/<lang>/
LC_MESSAGES/labkit.po``, extracted and compiled with Babel by ``tools/i18n.py``. A message with no translation falls
back to English, message by message.

The language, in this order: :func:`set_language` (for this kernel); the ``LABKIT_LANG`` environment variable
(``zh``, ``zh_CN.UTF-8``, ``en``...); the notebook's edition, read from the folder the kernel runs in (a language
folder under ``notebooks/``, such as ``notebooks/zh``, or a workspace made from that edition, as ``make lab
LAB_LANG=zh`` makes); else English. Jupyter starts a notebook's kernel in the notebook's folder, so the Chinese
notebooks speak Chinese with no code of their own: their code cells are the English ones, byte for byte.

Introduced in notebook 00.
"""

from __future__ import annotations

import functools
import gettext as _gettext
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

__all__ = ["DOMAIN", "LANGUAGES", "LANG_ENV", "LOCALE_DIR", "N_", "PRINTED", "PrintedLines", "edition_of", "gettext",
           "language", "normalise", "set_language", "template_parts", "tidy", "translate", "translate_line",
           "translate_printed"]

#: The editions: English, the source, and the translations (each a folder under ``notebooks/``).
LANGUAGES: tuple[str, ...] = ("en", "zh")
#: The gettext domain: the catalogs are ``labkit.po`` / ``labkit.mo``.
DOMAIN = "labkit"
#: The environment variable that chooses the language (``zh``, ``zh_CN.UTF-8``, ``en``).
LANG_ENV = "LABKIT_LANG"
#: Where the compiled catalogs live: ``<lang>/LC_MESSAGES/labkit.mo``.
LOCALE_DIR = Path(__file__).resolve().parent / "locale"

_chosen: str | None = None


def normalise(name: object) -> str | None:
    """The edition a language name means: ``"zh_CN.UTF-8"``, ``"zh-Hans"`` or ``"zh"`` → ``"zh"``; ``"C"`` or
    ``"en_US"`` → ``"en"``; None for a name that is empty or names no edition. Introduced in notebook 00."""
    if not isinstance(name, str):
        raise TypeError(f"a language name must be a str, got {type(name).__name__}")
    base = name.strip().split(".")[0].split("@")[0].replace("-", "_").split("_")[0].lower()
    if base in ("c", "posix"):
        return "en"
    return base if base in LANGUAGES else None


def set_language(lang: str | None) -> None:
    """Choose the language of labkit's messages in this kernel (``"en"`` or ``"zh"``); None goes back to the
    automatic choice (see the module's doc). Raises ``ValueError`` for a language that has no edition.
    Introduced in notebook 00."""
    global _chosen
    if lang is None:
        _chosen = None
        return
    found = normalise(lang)
    if found is None:
        raise ValueError(f"no edition in {lang!r}: choose one of {', '.join(LANGUAGES)} (or None for automatic)")
    _chosen = found


#: The workspace marker's file name (labkit.workspace.MARKER; read here so that i18n imports no other module).
_WORKSPACE_MARKER = ".labkit-workspace"


def _marker_lang(folder: Path) -> str | None:
    """The edition recorded in the workspace marker of ``folder`` or a parent (None: no workspace, or none named)."""
    for d in (folder, *folder.parents):
        marker = d / _WORKSPACE_MARKER
        if marker.is_file() and not marker.is_symlink():
            try:
                doc = json.loads(marker.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            lang = doc.get("lang") if isinstance(doc, dict) else None
            return normalise(lang) if isinstance(lang, str) else None
    return None


def edition_of(folder: str | os.PathLike) -> str:
    """The edition of the notebooks in ``folder``: a language folder under ``notebooks/`` (``notebooks/zh``) or a
    workspace made from that edition gives its language; anything else is English. Introduced in notebook 00."""
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a path (str or Path), got {type(folder).__name__}")
    here = Path(folder).absolute()
    if here.parent.name == "notebooks" and here.name in LANGUAGES:
        return here.name
    return _marker_lang(here) or "en"


def language() -> str:
    """The language labkit speaks now: ``"en"`` or ``"zh"`` (see the module's doc for the order).
    Introduced in notebook 00."""
    if _chosen is not None:
        return _chosen
    named = os.environ.get(LANG_ENV, "").strip()
    if named:
        return normalise(named) or "en"
    try:
        return edition_of(Path.cwd())
    except OSError:  # the folder the kernel runs in was removed
        return "en"


@functools.cache
def _catalog(lang: str) -> _gettext.NullTranslations:
    if lang == "en":
        return _gettext.NullTranslations()
    mo = LOCALE_DIR / lang / "LC_MESSAGES" / f"{DOMAIN}.mo"
    try:
        with mo.open("rb") as f:  # read here, not through gettext.translation(), whose cache outlives the file
            return _gettext.GNUTranslations(f)
    except OSError:  # no catalog for this language: English, message by message
        return _gettext.NullTranslations()


def translate(message: str, lang: str, context: str | None = None) -> str:
    """``message`` in the edition ``lang`` (``"en"``, ``"zh"``), whatever the current language; ``message`` itself
    where it has no translation. ``context`` (gettext's msgctxt) tells apart one English word in two senses.
    Introduced in notebook 00."""
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, got {type(message).__name__}")
    if context is not None and not isinstance(context, str):
        raise TypeError(f"context must be a str or None, got {type(context).__name__}")
    found = normalise(lang)
    if found is None:
        raise ValueError(f"no edition in {lang!r}: choose one of {', '.join(LANGUAGES)}")
    if not message:
        return message
    return _catalog(found).gettext(message) if context is None else _catalog(found).pgettext(context, message)


def gettext(message: str) -> str:
    """``message`` in the current language, or ``message`` itself where it has no translation.

    Messages with fields are written with named fields and formatted after the lookup:
    ``gettext("{id}: correct.").format(id=...)``. Introduced in notebook 00.
    """
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, got {type(message).__name__}")
    return translate(message, language())  # translate("") is "" (gettext("") would be the catalog's header)


_JOINED = re.compile("([\u3001\u3002\uff01\uff09\uff0c\uff1a\uff1b\uff1f\u201d])[ ]+(?=[^\\s])")


def tidy(text: str) -> str:
    """``text`` with the space dropped after a full-width punctuation mark (。，：；！？）”), where English
    sentences joined with spaces became Chinese ones. Introduced in notebook 00."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return _JOINED.sub(r"\1", text)


def N_(message: str) -> str:
    """Mark a message for extraction without translating it now (it is translated where it is shown)."""
    return message


# --- The notebooks' printed lines --------------------------------------------------------------------------------
# A notebook's code cells are shared by both editions, byte for byte, so what they print is English source. Each
# sentence a code cell prints is a template in the catalog (context PRINTED): the print's text with each value it
# formats written as a field, ``{expr}`` exactly as the code writes it (tools/i18n.py extracts them from the code
# cells). In an edition other than English, the IPython extension (``%load_ext labkit`` in every imports cell) reads
# each line the kernel prints, finds the template it was made from and prints the translation with the same values.

#: The gettext context of the notebooks' printed lines.
PRINTED = "printed"


def template_parts(template: str) -> list[str | tuple[str]]:
    """A printed-line template split into its literal text (``str``) and its fields (a 1-tuple holding the field's
    text, ``{loss.item():.3f}`` → ``("loss.item():.3f",)``); ``{{`` and ``}}`` are literal braces. A field's braces
    nest (``{len({a, b})}``). Raises ``ValueError`` for an unbalanced brace. Introduced in notebook 00."""
    if not isinstance(template, str):
        raise TypeError(f"template must be a str, got {type(template).__name__}")
    parts: list[str | tuple[str]] = []
    lit: list[str] = []
    i, n = 0, len(template)
    while i < n:
        c = template[i]
        if c in "{}" and template[i:i + 2] == c * 2:
            lit.append(c)
            i += 2
        elif c == "}":
            raise ValueError(f"a single '}}' at {i} in {template!r}: write '}}}}' for a literal brace")
        elif c == "{":
            depth, j = 1, i + 1
            while j < n and depth:
                depth += {"{": 1, "}": -1}.get(template[j], 0)
                j += 1
            if depth:
                raise ValueError(f"the field opened at {i} in {template!r} is never closed")
            if lit:
                parts.append("".join(lit))
                lit = []
            parts.append((template[i + 1:j - 1],))
            i = j
        else:
            lit.append(c)
            i += 1
    if lit:
        parts.append("".join(lit))
    return parts


def _pattern(parts: list[str | tuple[str]]) -> re.Pattern[str]:
    return re.compile("".join("(.*?)" if isinstance(p, tuple) else re.escape(p) for p in parts), re.DOTALL)


@functools.cache
def _printed(lang: str) -> tuple[tuple[re.Pattern[str], tuple[str, ...], tuple[str | tuple[str], ...]], ...]:
    """The printed-line templates of ``lang``: (pattern of the English line, its fields in order, the translation's
    parts), the most specific first (the most literal text), so that a general template never shadows a longer one."""
    found = []
    prefix = PRINTED + "\x04"
    for key, value in getattr(_catalog(lang), "_catalog", {}).items():  # GNUTranslations keeps "ctxt\x04msgid"
        if not (isinstance(key, str) and key.startswith(prefix)) or not value:
            continue
        try:
            src, dst = template_parts(key[len(prefix):]), template_parts(value)
        except ValueError:
            continue
        names = tuple(p[0] for p in src if isinstance(p, tuple))
        if any(isinstance(p, tuple) and p[0] not in names for p in dst):
            continue  # a translation that names a field the English has not: never shown (tools/i18n.py check)
        literal = sum(len(p) for p in src if isinstance(p, str))
        found.append((literal, _pattern(src), names, tuple(dst)))
    found.sort(key=lambda t: -t[0])
    return tuple(f[1:] for f in found)


def translate_line(line: str, lang: str | None = None) -> str:
    """One printed line (no newline) in ``lang`` (default: the current language): the translation of the template
    it matches, with the values it printed, or ``line`` itself where no template matches. Introduced in notebook 00.
    """
    if not isinstance(line, str):
        raise TypeError(f"line must be a str, got {type(line).__name__}")
    found = language() if lang is None else normalise(lang)
    if found is None:
        raise ValueError(f"no edition in {lang!r}: choose one of {', '.join(LANGUAGES)}")
    if found == "en" or not line.strip():
        return line
    for pattern, names, dst in _printed(found):
        m = pattern.fullmatch(line)
        if m:
            values = dict(zip(reversed(names), reversed(m.groups())))  # a repeated field: its first value
            return tidy("".join(values[p[0]] if isinstance(p, tuple) else p for p in dst))
    return line


class PrintedLines:
    """A text stream that passes each whole line it is written through :func:`translate_line` to ``stream``, then
    writes it; a partial line waits for its newline (or a ``flush``). Each thread keeps its own partial line.
    ``sys.stdout`` in a kernel of the Chinese edition (see :func:`translate_printed`). Introduced in notebook 00."""

    def __init__(self, stream: Any, lang: str) -> None:
        if not callable(getattr(stream, "write", None)):
            raise TypeError(f"stream must have a write() method, got {type(stream).__name__}")
        found = normalise(lang)
        if found is None:
            raise ValueError(f"no edition in {lang!r}: choose one of {', '.join(LANGUAGES)}")
        self.stream, self.lang = stream, found
        self._local = threading.local()

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        pending = getattr(self._local, "pending", "") + text
        *whole, rest = pending.split("\n")
        self._local.pending = rest
        if whole:
            self.stream.write("".join(translate_line(ln, self.lang) + "\n" for ln in whole))
        return len(text)

    def flush(self) -> None:
        rest = getattr(self._local, "pending", "")
        if rest:
            self._local.pending = ""
            self.stream.write(rest)
        self.stream.flush()

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno, the kernel's own attributes...
        return getattr(self.stream, name)


def translate_printed(stream: Any = None, lang: str | None = None) -> Any:
    """Make ``sys.stdout`` print the notebook's lines in ``lang`` (default: the current language) and return the
    stream now in place: a :class:`PrintedLines` around the old one, or the old one itself in English (or when it
    is already one). What ``%load_ext labkit`` does in a notebook's imports cell. Introduced in notebook 00."""
    import sys

    found = language() if lang is None else normalise(lang)
    if found is None:
        raise ValueError(f"no edition in {lang!r}: choose one of {', '.join(LANGUAGES)}")
    current = sys.stdout if stream is None else stream
    if found == "en" or isinstance(current, PrintedLines):
        return current
    wrapped = PrintedLines(current, found)
    if stream is None:
        sys.stdout = wrapped
    return wrapped
