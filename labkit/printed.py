"""What a notebook's code prints, in the notebook's language.

A notebook's code cells are shared by both editions, byte for byte, so what they ``print`` is English source. Each
line a ``print(...)`` call of a code cell can make is a *template* in the message catalog (gettext context
:data:`CONTEXT`): the printed text with one field per value, written as the code writes it
(``loss {loss.item():.3f} after {n} steps``). :func:`templates_of` reads them from a cell's source (tools/i18n.py
extracts every notebook's into the catalog); a translator keeps each field and may reorder them.

In an edition other than English, ``%load_ext labkit`` (the second line of every imports cell) wraps ``sys.stdout`` in
:class:`PrintedLines`: each whole line printed while a cell runs is matched against the templates of the cells this
kernel has run (:func:`translate_line`), and the translation is printed with the same values; a value that is itself
a labkit message (a case's title) is shown translated too. A line no template makes (a table of numbers, a rank's
log line, a learner's own print) passes unchanged, and so does a line longer than :data:`MAX_LINE`.

Introduced in notebook 00.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import threading
from collections.abc import Iterable
from typing import Any

from labkit import i18n

__all__ = ["CONTEXT", "MAX_LINE", "PrintedLines", "load", "template_parts", "templates_of", "translate_line"]

#: The gettext context of the notebooks' printed lines.
CONTEXT = "printed"
#: Lines longer than this pass untranslated (a printed list or JSON is data, not a sentence).
MAX_LINE = 1000

_WORD = re.compile(r"[A-Za-z]{3,}")
_Piece = str | tuple[str]


# --- templates: from a cell's source -------------------------------------------------------------------------------

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


def _is_choice(node: ast.expr) -> bool:
    """``"a" if c else "b" if d else "c"``: a choice between literal texts only."""
    if isinstance(node, ast.IfExp):
        return _is_choice(node.body) and _is_choice(node.orelse)
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _choices(tree: ast.AST) -> dict[str, ast.expr]:
    """The names a cell assigns once, to a choice between literal texts (``verdict = "faster" if ... else ...``):
    printing one prints one of those texts."""
    seen: dict[str, list[ast.expr | None]] = {}
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.NamedExpr)) else []
        for t in targets:
            for name in ast.walk(t):
                if isinstance(name, ast.Name):
                    seen.setdefault(name.id, []).append(node.value if isinstance(node, ast.Assign) else None)
    return {k: v[0] for k, v in seen.items() if len(v) == 1 and v[0] is not None and _is_choice(v[0])}


def _field(node: ast.expr) -> tuple[str]:
    text = ast.unparse(node)
    return (f" {text} " if text.startswith("{") or text.endswith("}") else text,)  # a dict display is no "{{"


def _pieces(node: ast.expr, known: dict[str, ast.expr]) -> list[list[_Piece]]:
    """The text an argument of print() makes: the alternatives (an ``a if c else b`` of strings makes two, and so
    does a name the cell set to such a choice, in ``known``), each a list of literal text (str) and fields."""
    if isinstance(node, ast.Name) and node.id in known:
        return _pieces(known[node.id], known)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [[node.value]]
    if isinstance(node, ast.JoinedStr):
        alts: list[list[_Piece]] = [[]]
        for v in node.values:
            if isinstance(v, ast.Constant):
                alts = [a + [str(v.value)] for a in alts]
                continue
            assert isinstance(v, ast.FormattedValue)
            spec = v.format_spec
            fmt = None if spec is None else "".join(str(c.value) for c in spec.values if isinstance(c, ast.Constant)) \
                if isinstance(spec, ast.JoinedStr) and all(isinstance(c, ast.Constant) for c in spec.values) else "?"
            if v.conversion == -1 and fmt != "?" and (isinstance(v.value, ast.IfExp) or (
                    isinstance(v.value, ast.Name) and v.value.id in known)):
                both = _pieces(v.value, known)  # f"{'fits' if ok else 'does not fit'}": two sentences
                literal = all(all(isinstance(p, str) for p in b) for b in both)
                if len(both) > 1 and (fmt is None or literal):
                    alts = [a + ([format("".join(b), fmt)] if fmt else b)  # type: ignore[arg-type]
                            for a in alts for b in both]
                    continue
            value = v.value
            if v.conversion == -1 and spec is None and isinstance(value, ast.BoolOp) and isinstance(
                    value.op, ast.Or) and len(value.values) == 2 and isinstance(value.values[1], ast.Constant) \
                    and isinstance(value.values[1].value, str):
                fallback = value.values[1].value  # f"{found or 'none detected'}": the value, or the text
                alts = [a + b for a in alts for b in ([_field(value.values[0])], [fallback])]
                continue
            text = _field(value)[0] + ("" if v.conversion == -1 else "!" + chr(v.conversion))
            if spec is not None:
                inner = spec.values if isinstance(spec, ast.JoinedStr) else [spec]
                text += ":" + "".join(str(c.value) if isinstance(c, ast.Constant)
                                      else "{" + ast.unparse(getattr(c, "value", c)) + "}" for c in inner)
            alts = [a + [(text,)] for a in alts]
        return alts
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _pieces(node.left, known), _pieces(node.right, known)
        if any(isinstance(p, str) for a in left + right for p in a):
            return [a + b for a in left for b in right]
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and len(node.values) == 2 and isinstance(
            node.values[1], ast.Constant) and isinstance(node.values[1].value, str):
        return [[_field(node.values[0])], [node.values[1].value]]  # `found or "none"`: the value, or the text
    if isinstance(node, ast.IfExp):
        body, orelse = _pieces(node.body, known), _pieces(node.orelse, known)
        if any(isinstance(p, str) for a in body + orelse for p in a):
            return body + orelse
    return [[_field(node)]]


def _template(line: list[_Piece]) -> str:
    return "".join(p.replace("{", "{{").replace("}", "}}") if isinstance(p, str) else "{" + p[0] + "}" for p in line)


def _print_lines(call: ast.Call, known: dict[str, ast.expr] | None = None) -> list[str]:
    """The line templates one ``print(...)`` call can print: the arguments before a ``*args`` where ``sep`` starts
    a new line; none where the text cannot be known (a ``sep`` that is not a literal, a ``file=``)."""
    kw = {k.arg: k.value for k in call.keywords}
    if "file" in kw or None in kw:
        return []
    sep = kw.get("sep")
    if sep is not None and not (isinstance(sep, ast.Constant) and isinstance(sep.value, str)):
        return []
    glue = " " if sep is None else str(sep.value)  # type: ignore[union-attr]
    args = list(call.args)
    starred = next((i for i, a in enumerate(args) if isinstance(a, ast.Starred)), None)
    if starred is not None:
        if "\n" not in glue:
            return []
        args = args[:starred]  # print("header:", *rows, sep="\n"): the header is a line of its own
    alts: list[list[_Piece]] = [[]]
    for i, arg in enumerate(args):
        alts = [a + ([glue] if i and glue else []) + b for a in alts for b in _pieces(arg, known or {})]
    out = []
    for alt in alts:
        lines: list[list[_Piece]] = [[]]
        for p in alt:
            if isinstance(p, tuple):
                lines[-1].append(p)
                continue
            for j, seg in enumerate(p.split("\n")):
                if j:
                    lines.append([])
                if seg:
                    lines[-1].append(seg)
        for line in lines:
            if _WORD.search("".join(p for p in line if isinstance(p, str))):
                template = _template(line)
                back = "".join(x if isinstance(x, str) else "{" + x[0] + "}" for x in template_parts(template))
                if back == "".join(p if isinstance(p, str) else "{" + p[0] + "}" for p in line):  # it reads back
                    out.append(template)
    return list(dict.fromkeys(out))


def _python_of(cell_source: str) -> str | None:
    """A code cell's Python: IPython's line magics and shell escapes become ``pass``; a ``%%writefile`` cell is the
    file it writes; another cell magic has none (None)."""
    lines = cell_source.splitlines()
    if lines and lines[0].startswith("%%"):
        if not lines[0].startswith("%%writefile"):
            return None
        lines = lines[1:]
    return "\n".join(re.sub(r"^(\s*)[%!].*$", r"\1pass", ln) for ln in lines)


@functools.lru_cache(maxsize=512)
def templates_of(source: str) -> tuple[str, ...]:
    """The line templates the ``print(...)`` calls of one code cell can print, in the cell's order (none for a cell
    that is not Python, or does not parse). A line with no English word of three letters or more is no sentence and
    is left out. Introduced in notebook 00."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a cell's code (str), got {type(source).__name__}")
    code = _python_of(source)
    try:
        tree = ast.parse(code) if code is not None else None
    except (SyntaxError, ValueError):
        return ()
    if tree is None:
        return ()
    known = _choices(tree)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "print"]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    return tuple(dict.fromkeys(t for c in calls for t in _print_lines(c, known)))


# --- translating a line ----------------------------------------------------------------------------------------------

class _Template:
    """One template of the catalog, ready to match: its literal parts, its regular expression, its translation."""

    __slots__ = ("english", "literal", "first", "last", "pieces", "pattern", "names", "dst")

    def __init__(self, english: str, translated: str) -> None:
        src, dst = template_parts(english), template_parts(translated)
        self.english, self.dst = english, tuple(dst)
        self.names = tuple(p[0] for p in src if isinstance(p, tuple))
        if any(isinstance(p, tuple) and p[0] not in self.names for p in dst):
            raise ValueError("a translation that names a field the English has not")
        self.pieces = tuple(p for p in src if isinstance(p, str))
        self.literal = sum(map(len, self.pieces))
        self.first = src[0] if src and isinstance(src[0], str) else ""
        self.last = src[-1] if len(src) > 1 and isinstance(src[-1], str) else ""
        self.pattern = re.compile("".join("(.*?)" if isinstance(p, tuple) else re.escape(p) for p in src), re.DOTALL)

    def match(self, line: str) -> dict[str, str] | None:
        if not (line.startswith(self.first) and line.endswith(self.last)):
            return None
        at = 0
        for piece in self.pieces:  # every literal part, in order: a cheap test before the expression
            at = line.find(piece, at)
            if at < 0:
                return None
            at += len(piece)
        m = self.pattern.fullmatch(line)
        return None if m is None else dict(zip(reversed(self.names), reversed(m.groups())))  # a repeated field: 1st


@functools.cache
def _templates(lang: str) -> dict[str, _Template]:
    """``{English template: _Template}`` of ``lang``'s catalog."""
    found: dict[str, _Template] = {}
    prefix = CONTEXT + "\x04"
    for key, value in getattr(i18n._catalog(lang), "_catalog", {}).items():  # GNUTranslations keeps "ctxt\x04msgid"
        if isinstance(key, str) and key.startswith(prefix) and value:
            try:
                found[key[len(prefix):]] = _Template(key[len(prefix):], value)
            except ValueError:  # a translation tools/i18n.py check refuses: never shown
                continue
    return found


def _value(text: str, lang: str) -> str:
    """A value a printed line shows, translated where it is a whole labkit message of two words or more (a case's
    title, a recipe's description): the text itself otherwise, its padding kept."""
    core = text.strip()
    if " " not in core or not re.search("[A-Za-z]{2}", core):
        return text
    done = i18n._catalog(lang).gettext(core)
    return text if done == core else text.replace(core, done, 1)


def translate_line(line: str, lang: str | None = None, among: Iterable[str] | None = None) -> str:
    """One printed line (no newline) in ``lang`` (default: the current language): the translation of the template it
    matches, with the values it printed, or ``line`` itself where none matches. ``among`` limits the templates to
    those named (the English templates of the cells a kernel ran); None tries every one, the most literal text
    first. Introduced in notebook 00."""
    if not isinstance(line, str):
        raise TypeError(f"line must be a str, got {type(line).__name__}")
    found = i18n.language() if lang is None else i18n.normalise(lang)
    if found is None:
        raise ValueError(f"no edition in {lang!r}: choose one of {', '.join(i18n.LANGUAGES)}")
    if found == "en" or not line.strip() or len(line) > MAX_LINE:
        return line
    table = _templates(found)
    chosen = table.values() if among is None else [table[t] for t in among if t in table]
    for tpl in sorted(chosen, key=lambda t: -t.literal):
        values = tpl.match(line)
        if values is not None:
            return i18n.tidy("".join(_value(values[p[0]], found) if isinstance(p, tuple) else p for p in tpl.dst))
    return line


class PrintedLines:
    """A text stream that writes each whole line (ended by ``\\n`` or ``\\r``) to ``stream`` through
    :func:`translate_line`, in the language of the moment (``lang`` None: :func:`labkit.i18n.language`); a partial
    line waits for its end or a ``flush``, each thread's apart, and ``flush`` writes every thread's. ``among`` holds
    the templates to try (None: every one); :func:`load` adds each cell's as the cell starts. Introduced in
    notebook 00."""

    def __init__(self, stream: Any, lang: str | None = None) -> None:
        if not callable(getattr(stream, "write", None)):
            raise TypeError(f"stream must have a write() method, got {type(stream).__name__}")
        if lang is not None and i18n.normalise(lang) is None:
            raise ValueError(f"no edition in {lang!r}: choose one of {', '.join(i18n.LANGUAGES)}")
        self.stream, self.lang = stream, lang
        self.among: set[str] | None = None
        self._watching = False
        self._pending: dict[int, str] = {}
        self._lock = threading.Lock()

    def _out(self, text: str) -> str:
        lang = self.lang or i18n.language()
        return re.sub(r"[^\r\n]+(?=[\r\n])", lambda m: translate_line(m.group(0), lang, self.among), text)

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        me = threading.get_ident()
        with self._lock:
            pending = self._pending.pop(me, "") + text
            cut = max(pending.rfind("\n"), pending.rfind("\r")) + 1
            if cut < len(pending):
                self._pending[me] = pending[cut:]
        if cut:
            self.stream.write(self._out(pending[:cut]))
        return len(text)

    def flush(self) -> None:
        with self._lock:
            rest, self._pending = "".join(self._pending.values()), {}
        if rest:
            self.stream.write(rest)
        self.stream.flush()

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno, the kernel's own attributes...
        return getattr(self.stream, name)


def _running_cell(ipython: Any) -> str:
    """The code of the cell being run: the kernel's execute request (nbval runs cells without history), else the
    last input in the history."""
    try:
        code = ipython.kernel.get_parent()["content"]["code"]
        if isinstance(code, str):
            return code
    except (AttributeError, KeyError, TypeError):
        pass
    history = getattr(ipython, "user_ns", {}).get("_ih") or [""]
    return history[-1] if isinstance(history[-1], str) else ""


def load(ipython: Any = None, lang: str | None = None) -> PrintedLines | None:
    """What ``%load_ext labkit`` does: in an edition other than English, wrap ``sys.stdout`` in
    :class:`PrintedLines` (once) and, with an IPython shell, add each cell's templates to the ones it tries as the
    cell starts; return the wrapper, or None in English. Introduced in notebook 00."""
    if ipython is not None and not callable(getattr(getattr(ipython, "events", None), "register", None)):
        raise TypeError(f"ipython must be an IPython shell (with .events) or None, got {type(ipython).__name__}")
    found = i18n.language() if lang is None else i18n.normalise(lang)
    if found is None:
        raise ValueError(f"no edition in {lang!r}: choose one of {', '.join(i18n.LANGUAGES)}")
    if found == "en":
        return None
    wrapped = sys.stdout if isinstance(sys.stdout, PrintedLines) else PrintedLines(sys.stdout, lang)
    sys.stdout = wrapped
    events = getattr(ipython, "events", None)
    if events is not None and not wrapped._watching:
        wrapped.among = set()

        def cell_starts(info: Any) -> None:
            wrapped.among.update(templates_of(getattr(info, "raw_cell", "") or ""))  # type: ignore[union-attr]

        events.register("pre_run_cell", cell_starts)
        wrapped._watching = True
        wrapped.among.update(templates_of(_running_cell(ipython)))  # the cell running %load_ext: its own prints
    return wrapped
