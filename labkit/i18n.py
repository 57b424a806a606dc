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
from pathlib import Path

__all__ = ["DOMAIN", "LANGUAGES", "LANG_ENV", "LOCALE_DIR", "N_", "edition_of", "gettext", "language", "normalise",
           "set_language", "tidy", "translate"]

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

