"""Lint the notebook sources for two habits: every measured sentence comes from its measurement, and every
``assert`` can fail.

    python tools/nblint.py                                   # every tools/nbsrc/*.py
    python tools/nblint.py tools/nbsrc/14_platform_and_inference.py

Prints one line per finding, ``path:line: kind: text (why)``, and exits 1 if there is any. Importing the module
does nothing; :func:`main` is the command line.

**(A) Measured sentences** (:func:`measured_sentences`, kind ``measured-sentence``). A sentence that reports or
compares measured values must be printed by the cell that measured it, computed from the numbers: that cell's
output changes between machines, fixed markdown does not. The heuristic flags a sentence when all three hold:

1. *It comments on a measuring cell.* A code cell measures when it is marked ``# NBVAL_IGNORE_OUTPUT`` (its output
   depends on the machine) or calls a timing function (:data:`TIMING_CALL`: ``time.perf_counter``, ``timeit``,
   ``bench.*``, ``*time_fn``, ``*timed*``, ``*_times``, ``*sweep*``, ``profile*``). The sentences checked are those
   of the *first paragraph of the markdown cell right after it* (unless that paragraph is a heading: a new topic)
   and of the *last paragraph of the markdown cell right before it* (what the cell is about to show). Farther
   paragraphs move on to other things: in the notebooks as first linted, checking every paragraph of those cells
   added five sentences, all general statements.
2. *It has a measurement pattern* (:data:`PATTERNS`), found in the sentence without inline code, LaTeX and link
   targets (so a unit inside ``$...$`` or `` `...` `` never counts):

   - ``quantity``: a number with a unit of time, rate or share: ``12 ms``, ``3.5 µs``, ``40 GB/s``,
     ``989 GFLOP/s``, ``1,200 tokens/s``, ``46 %``;
   - ``multiplier``: ``3x``/``2.5×`` (written without a space: ``2048 × 2048`` is a shape) within three words of a
     metric word (below): "a 3× speed-up", "throughput of 2.5x";
   - ``comparison``: faster, slower, quicker, speed-up, speeds ... up, slows ... down, outperforms, beats,
     "about (roughly, nearly, just) as much (fast, long, cheap) as", twice as, half as; not after "a", "an" or
     "the", where the comparative names a kind of thing ("a slower path", "the slower rank") instead of comparing;
   - ``trend``: a metric word (latency, throughput, bandwidth, P50/P99, median, TTFT, speed, time, timing,
     runtime, FLOP/s, tokens/s) within 40 characters of a movement or a comparative (grows, rises, falls, drops,
     increases, decreases, doubles, halves, shrinks, climbs, higher, lower, better, worse, larger, smaller,
     longer, shorter): "Throughput grows with the batch".
3. *No exemption applies* (:data:`EXEMPTIONS`):

   - ``question``: it ends with "?" (a prediction prompt asks, it reports nothing);
   - ``formula``: it contains "=" (an equation or a definition: "busbw = algbw × 2(n−1)/n");
   - ``quoted fact``: it names its source or says that the figure is not this run's: datasheet, spec,
     theoretical, ideal, nominal, peak, according to, paper, published, report(s/ed), vendor, not measured,
     illustrative, or a hardware product (H100, A100, V100, H200, B200, MI300, NVLink, PCIe, InfiniBand, HBM):
     "an H100 has 989 TFLOP/s of dense BF16 (datasheet)";
   - ``setting``: the figure is an input of the run, not a result: sleeps, slept, timeout, default, set to,
     configured, a wait of;
   - ``general``: it is hedged as a general rule: can, could, may, might, would, should, typical(ly), usually,
     often, generally, tends to, rule of thumb, law, whether, depends on, or it speaks of a class of hardware
     ("on a GPU", "on CPUs").

   A sentence that points at this run (:data:`THIS_RUN`: "... here", "this machine", "this CPU", "this run")
   keeps neither the ``quoted fact`` nor the ``general`` exemption: "the steps are usually slower than fp32 here"
   is still a measured claim.

Not caught: a measured sentence farther from its cell (a later paragraph, or after an unmarked cell such as an
assert cell), and a claim phrased without any of the patterns ("the train step gains less than the matmul"). The
heuristic catches the usual slip, a comment on the output just above or a promise about the output just below;
it proves nothing about the rest.

A sentence that the heuristic flags but that reports no measurement goes into :data:`EXEMPT`, keyed by notebook
number and the first words of the sentence, with the reason::

    EXEMPT = {("14", "A checkpoint stalls training"): "a property of shared file systems, not measured here"}

An entry that matches no sentence any more, or gives no reason, is reported as ``stale-exempt``.

**(B) Asserts that can fail** (:func:`vacuous_asserts`, on each code cell's ``ast``). Kinds:

- ``assert-literal``: the test reads no variable, only literals and builtins (``assert True``, ``assert 1 < 2``,
  ``assert sum({"a": 1, "b": 2}.values()) > 1``), or is a non-empty tuple (``assert (x, "msg")``), or contains an
  ``or`` with a true literal;
- ``assert-self``: an expression compared with itself by ``==``, ``<=``, ``>=`` or ``is`` (``assert x == x``; to
  test for NaN, say ``not math.isnan(x)``);
- ``assert-just-assigned``: a name compared with the very expression that the statement just before assigned to it
  (``y = a + b`` then ``assert y == a + b``);
- ``assert-order-statistic``: two order statistics of one sample compared in the order they always have
  (``assert s.p99 >= s.p50``, ``assert max(xs) >= min(xs)``; attributes or names ``p<N>``, ``median``, ``min``,
  ``max`` on the same object, or ``min``/``max`` of the same expression);
- ``assert-conditional``: an assert in the body or ``else`` of an ``if`` whose test compares a value with a number
  (``if 2 < ridge < 150:``): if that value is measured, the assert may silently never run. Assert the condition
  itself, or gate on the environment (``if builds is not None``, ``if device.is_cuda(dev)``), which this check
  leaves alone. An ``if`` inside a function tests its arguments and gates nothing.

Asserts are found in every block of a cell (loops, ``with``, ``try``, function bodies).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

__all__ = [
    "EXEMPT",
    "EXEMPTIONS",
    "PATTERNS",
    "THIS_RUN",
    "TIMING_CALL",
    "Cell",
    "Finding",
    "lint",
    "main",
    "measured_sentences",
    "paragraphs",
    "parse_cells",
    "read_cells",
    "sentences",
    "stale_exemptions",
    "vacuous_asserts",
]

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tools" / "nbsrc"

#: Sentences that the heuristic flags but that report no measurement: (notebook number, first words of the
#: sentence) -> why it is not a measurement. Keep the reason; an entry that matches nothing is reported.
EXEMPT: dict[tuple[str, str], str] = {
    ("14", "A checkpoint stalls training while it is written"):
        "how many writers slow a shared file system down, which the cell below does not measure (it times one "
        "local write)",
    ("13", "Each record is read from slow shared storage"):
        "the case script's own setting (it waits about a millisecond per record, as storage would), not a result "
        "of the run below",
}

IGNORE_TAG = "NBVAL_IGNORE_OUTPUT"

#: A call that times something: a code cell that makes one measures, whatever its output looks like.
TIMING_CALL = re.compile(
    r"\b(?:time\.(?:perf_counter|time|monotonic|process_time)(?:_ns)?|timeit|bench\.\w+|\w*time_fn"
    r"|\w*timed\w*|\w*_times|\w*sweep\w*|profile\w*)\s*\(")

_NUM = r"(?<![\w.])\d[\d,.]*(?:\s\d{3})*"
_UNIT = (r"(?:[kMGTP]i?B/s|[kMGTP]?FLOP/s|[kMGTP]?FLOPS|ms|µs|us|ns|s|secs?|seconds?|minutes?|min"
         r"|(?:tokens?|samples?|requests?|images?|steps?|it)/s|%|percent)")
_METRIC = (r"(?:latency|latencies|throughput|bandwidth|P\d{2}|median|TTFT|speed|speeds|time|timings?"
           r"|runtime|step time|FLOP/s|tokens/s|requests/s)")
_MOVE = (r"(?:grows?|grew|rises?|rose|falls?|fell|drops?|dropped|increases?|decreases?|doubles?|halves"
         r"|shrinks?|climbs?|higher|lower|better|worse|larger|smaller|longer|shorter)")
#: Measurement patterns: a sentence matching one of them reports or compares a value (see the module docstring).
PATTERNS: dict[str, re.Pattern[str]] = {
    "quantity": re.compile(rf"{_NUM}\s?{_UNIT}(?![\w/])"),
    "multiplier": re.compile(rf"{_NUM}[×x](?!\w)\W+(?:\w+\W+){{0,2}}{_METRIC}\b"
                             rf"|\b{_METRIC}\W+(?:\w+\W+){{0,2}}{_NUM}[×x](?!\w)", re.I),
    "comparison": re.compile(
        r"(?<!\ba )(?<!\ban )(?<!\bthe )\b(?:faster|slower|quicker|speed-?ups?|speeds? (?:\w+ )?up"
        r"|slows? (?:\w+ )?down|outperforms?|beats?|twice as|half as"
        r"|(?:about|roughly|nearly|almost|just) as (?:much|fast|slow|long|quick|cheap|expensive) as)\b", re.I),
    "trend": re.compile(rf"\b{_METRIC}\b[^.;:]{{0,40}}?\b{_MOVE}\b"
                        rf"|\b{_MOVE}\b[^.;:]{{0,40}}?\b{_METRIC}\b", re.I),
}

_HARDWARE = r"H100|H200|A100|V100|B200|GB200|MI\d{3}X?|NVLink|NVSwitch|PCIe|InfiniBand|HBM\d?e?|DDR\d"
#: Exemptions: a sentence matching one of them is a question, a formula, a quoted fact, a setting or a general
#: rule, not a report of this run's measurement.
EXEMPTIONS: dict[str, re.Pattern[str]] = {
    "question": re.compile(r"\?[*_)\]\s]*$"),
    "formula": re.compile(r"(?<![=!<>])=(?!=)"),
    "quoted fact": re.compile(
        rf"\b(?:datasheets?|specs?|specifications?|theoretical|ideal|ideally|nominal|peak|according to|papers?"
        rf"|published|reports?|reported|vendors?|not measured|illustrative|{_HARDWARE})\b", re.I),
    "setting": re.compile(r"\b(?:sleeps?|slept|timeouts?|defaults?|set to|configured|a wait of)\b", re.I),
    "general": re.compile(
        r"\b(?:can|cannot|could|may|might|would|should|typical|typically|usually|often|generally|in general"
        r"|tends? to|rule of thumb|law|whether|depends? on|on (?:an? )?(?:GPU|CPU)s?)\b", re.I),
}

#: Words that point at this run: they keep the "quoted fact" and "general" exemptions from applying.
THIS_RUN = re.compile(r"(?<=[\w,)]\s)here\b|\bthis (?:machine|computer|laptop|node|CPU|GPU|run|session)\b",
                      re.I)
#: Exemptions that do not apply to a sentence about this run (:data:`THIS_RUN`).
_OVERRIDDEN = ("quoted fact", "general")

_CODE_SPAN = re.compile(r"`[^`]*`")
_MATH = re.compile(r"\$\$.*?\$\$|\$[^$]*\$", re.S)
_LINK = re.compile(r"\]\([^)]*\)|<https?://[^>]*>|https?://\S+")
_LANG = re.compile(r'\blang="\w+"')
_HEADER = re.compile(r"^# %%(?=\s|$)(?:\s+\[(?P<kind>\w+)\])?(?P<meta>.*)$")
_TAGS = re.compile(r"tags\s*=\s*\[(?P<tags>[^\]]*)\]")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')*_]*\s+(?=[\"'(*_`$]*[A-Z0-9])")
_BLOCK_START = re.compile(r"^\s*(?:#{1,6}\s|[-*+]\s|\d+\.\s|\||>)")


@dataclass(frozen=True)
class Cell:
    """One cell of a percent-format source: its kind, its source lines and where they start in the file.

    ``lines`` are the cell's source lines (markdown without its ``# `` prefix); line ``i`` of them (0-based) is
    line ``line + i`` of the file. ``tags`` holds the header's ``tags=[...]`` and ``NBVAL_IGNORE_OUTPUT`` when
    that comment opens a code cell. ``notebook`` is the file's number prefix ("14"), ``path`` its path.
    """

    kind: str
    lines: tuple[str, ...]
    line: int
    tags: frozenset[str] = frozenset()
    notebook: str = ""
    path: str = ""

    @property
    def source(self) -> str:
        """The cell's source as one string."""
        return "\n".join(self.lines)

    @property
    def ignores_output(self) -> bool:
        """Whether the cell is marked ``# NBVAL_IGNORE_OUTPUT`` (its output depends on the machine)."""
        return IGNORE_TAG in self.tags


@dataclass(frozen=True)
class Finding:
    """A lint finding: where (``path``, 1-based ``line``), what (``kind``), the offending ``text`` and ``why``."""

    path: str
    line: int
    kind: str
    text: str
    why: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.text}" + (f" ({self.why})" if self.why else "")


# ------------------------------------------------------------------------------------------------- cells
def parse_cells(text: str, notebook: str = "", path: str = "") -> list[Cell]:
    """Split percent-format text (``# %%`` code cells, ``# %% [markdown]`` cells) into :class:`Cell` objects.

    Markdown lines lose their ``# `` (or bare ``#``) prefix; trailing blank lines of a cell are dropped. Translated
    prose cells (``lang="zh"``) are left out: they say what their English cell says, which is linted.
    """
    cells: list[Cell] = []
    kind, meta, start, body = "code", "", 1, []

    def close() -> None:
        while body and not body[-1].strip():
            body.pop()
        if not body and not meta and start == 1:
            return  # nothing before the first header
        if kind == "markdown" and _LANG.search(meta):
            return  # a translation (tools/nbbuild.py): its English cell, linted here, carries the same sentences
        m = _TAGS.search(meta)
        tags = set(re.findall(r"[\"']([^\"']+)[\"']", m.group("tags"))) if m else set()
        first = next((ln.strip() for ln in body if ln.strip()), "")
        if kind == "code" and first == f"# {IGNORE_TAG}":
            tags.add(IGNORE_TAG)
        lines = tuple(_uncomment(ln) for ln in body) if kind == "markdown" else tuple(body)
        cells.append(Cell(kind, lines, start, frozenset(tags), notebook, path))

    for number, raw in enumerate(text.splitlines(), 1):
        header = _HEADER.match(raw)
        if header:
            close()
            kind, meta, start, body = header.group("kind") or "code", header.group("meta"), number + 1, []
        else:
            body.append(raw)
    close()
    return cells


def read_cells(path: str | Path) -> list[Cell]:
    """Parse a ``tools/nbsrc/NN_topic.py`` source into cells (see :func:`parse_cells`)."""
    p = Path(path)
    number = m.group(0) if (m := re.match(r"\d+", p.name)) else ""
    try:
        shown = p.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        shown = str(p)
    return parse_cells(p.read_text(encoding="utf-8"), notebook=number, path=shown)


def _uncomment(line: str) -> str:
    if line.startswith("# "):
        return line[2:]
    return line[1:] if line.startswith("#") else line


# ------------------------------------------------------------------------------------- (A) measured sentences
def paragraphs(cell: Cell) -> list[list[tuple[int, str]]]:
    """A markdown cell's paragraphs: runs of non-blank lines, as ``(file line, text)``; a heading is a paragraph
    of its own. Quote markers (``> ``) are removed."""
    result: list[list[tuple[int, str]]] = [[]]
    for i, raw in enumerate(cell.lines):
        text = re.sub(r"^\s*>\s?", "", raw).strip()
        heading = bool(re.match(r"#{1,6}\s", text))
        if not text or heading:
            result.append([])
        if text:
            result[-1].append((cell.line + i, text))
        if heading:
            result.append([])
    return [p for p in result if p]


def sentences(paragraph: Sequence[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Yield ``(file line, sentence)`` for a paragraph (see :func:`paragraphs`): list items, table rows and
    headings start a new sentence, and so does every ".", "!" or "?" followed by a capital or a digit."""
    blocks: list[list[tuple[int, str]]] = []
    for number, text in paragraph:
        if not blocks or _BLOCK_START.match(text) or blocks[-1][-1][1].startswith("|"):
            blocks.append([])
        blocks[-1].append((number, text))
    for block in blocks:
        joined, starts = "", []
        for number, text in block:
            starts.append((len(joined), number))
            joined += text + " "
        pos = 0
        for piece in _SENTENCE_END.split(joined.strip()):
            at = joined.find(piece, pos)
            pos = at + len(piece)
            if piece.strip():
                yield max(n for offset, n in starts if offset <= at), piece.strip()


def _plain(sentence: str) -> str:
    """The sentence without inline code, LaTeX and link targets, which never count as measurements."""
    return _LINK.sub("]", _MATH.sub(" ", _CODE_SPAN.sub(" ", sentence)))


def _exempted(plain: str) -> str:
    """The first exemption that applies to a sentence (plain text, see :func:`_plain`), or ""."""
    this_run = bool(THIS_RUN.search(plain))
    for name, rx in EXEMPTIONS.items():
        if rx.search(plain) and not (this_run and name in _OVERRIDDEN):
            return name
    return ""


def _measures(cell: Cell) -> str:
    """Why a code cell's output can vary, or "" if it cannot (as far as the heuristic sees)."""
    if cell.ignores_output:
        return IGNORE_TAG
    code = "\n".join(ln for ln in cell.lines if not ln.lstrip().startswith("#"))
    if m := TIMING_CALL.search(code):
        return f"times: {m.group(0).rstrip('( ')}"
    return ""


def _nearby(cells: Sequence[Cell], index: int) -> Iterator[tuple[list[tuple[int, str]], str]]:
    """The paragraphs of markdown cell ``cells[index]`` that comment on a measuring neighbour, with why: the
    first paragraph after a measuring cell (unless it is a heading, which starts a new topic) and the last
    paragraph before one. Of several markdown cells in a row, only the first and the last are next to code."""
    paras = paragraphs(cells[index])
    if not paras:
        return
    for step, where in ((-1, "after"), (1, "before")):
        j = index + step
        while 0 <= j < len(cells) and cells[j].kind != "code":
            j += step
        if not (0 <= j < len(cells) and (reason := _measures(cells[j]))):
            continue
        adjacent = cells[index + step].kind == "code"  # j == index + step: no markdown cell in between
        paragraph = paras[0] if step == -1 else paras[-1]
        if adjacent and not _is_heading(paragraph):
            yield paragraph, f"{where} the cell at line {cells[j].line} ({reason})"


def _is_heading(paragraph: Sequence[tuple[int, str]]) -> bool:
    return bool(re.match(r"#{1,6}\s", paragraph[0][1]))


def _exempt_key(cell: Cell, sentence: str, exempt: dict[tuple[str, str], str]) -> tuple[str, str] | None:
    text = " ".join(sentence.split())
    for key in exempt:
        number, prefix = key
        if number == cell.notebook and text.startswith(" ".join(prefix.split())):
            return key
    return None


def measured_sentences(cells: Sequence[Cell],
                       exempt: dict[tuple[str, str], str] | None = None) -> list[Finding]:
    """Markdown sentences that state a measured value next to the cell that measures it (rule A, see the module
    docstring for the heuristic and its exemptions). ``exempt`` defaults to :data:`EXEMPT`."""
    exempt = EXEMPT if exempt is None else exempt
    found: dict[tuple[int, str], Finding] = {}
    for index, cell in enumerate(cells):
        if cell.kind != "markdown":
            continue
        for paragraph, near in _nearby(cells, index):
            for line, sentence in sentences(paragraph):
                plain = _plain(sentence)
                hits = [name for name, rx in PATTERNS.items() if rx.search(plain)]
                if not hits or _exempted(plain):
                    continue
                if _exempt_key(cell, sentence, exempt) or (line, sentence) in found:
                    continue
                found[line, sentence] = Finding(cell.path, line, "measured-sentence", sentence,
                                                f"{', '.join(hits)}; {near}")
    return list(found.values())


def stale_exemptions(cells: Sequence[Cell],
                     exempt: dict[tuple[str, str], str] | None = None) -> list[Finding]:
    """Entries of ``exempt`` (default :data:`EXEMPT`) for this notebook that exempt nothing any more (no sentence
    that the heuristic flags starts with them) or that give no reason."""
    exempt = EXEMPT if exempt is None else exempt
    if not cells:
        return []
    number, path = cells[0].notebook, cells[0].path
    flagged = measured_sentences(cells, exempt={})
    used = {key for f in flagged for key in exempt
            if key[0] == number and " ".join(f.text.split()).startswith(" ".join(key[1].split()))}
    return [Finding(path, 1, "stale-exempt", f"{key!r}: {why!r}",
                    "exempts no flagged sentence" if key not in used else "gives no reason")
            for key, why in exempt.items() if key[0] == number and (key not in used or not why.strip())]


# ------------------------------------------------------------------------------------ (B) vacuous asserts
_BUILTINS = frozenset(dir(builtins))
_ORDER = re.compile(r"^(?:p(?P<p>\d+(?:_\d+)?)|(?P<word>min|median|max))$")


def _dump(node: ast.AST) -> str:
    """The expression's structure, without positions and without load/store context."""
    return re.sub(r",? ?ctx=\w+\(\)", "", ast.dump(node))


def _same(a: ast.AST, b: ast.AST) -> bool:
    return _dump(a) == _dump(b)


def _free_names(node: ast.AST) -> set[str]:
    """Names an expression reads that it does not bind itself (comprehension targets, lambda arguments)."""
    bound: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.comprehension):
            bound |= {n.id for n in ast.walk(sub.target) if isinstance(n, ast.Name)}
        elif isinstance(sub, ast.Lambda):
            bound |= {a.arg for a in ast.walk(sub.args) if isinstance(a, ast.arg)}
        elif isinstance(sub, ast.NamedExpr):
            bound.add(sub.target.id)
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id not in bound}


def _is_literal(node: ast.AST) -> bool:
    """True when the expression reads no variable: only literals and builtins."""
    return not (_free_names(node) - _BUILTINS)


def _order_key(node: ast.AST) -> tuple[str, float] | None:
    """``(sample, rank)`` of an order statistic: ``s.p99`` -> (s, 99); ``max(xs)`` -> (xs, 100)."""
    if isinstance(node, ast.Attribute):
        base, name = _dump(node.value), node.attr
    elif isinstance(node, ast.Name):
        base, name = "", node.id
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max")
          and len(node.args) == 1 and not node.keywords):
        base, name = _dump(node.args[0]), node.func.id
    else:
        return None
    m = _ORDER.match(name)
    if not m:
        return None
    if m.group("p"):
        return base, float(m.group("p").replace("_", "."))
    return base, {"min": 0.0, "median": 50.0, "max": 100.0}[m.group("word")]


def _compare_pairs(node: ast.Compare) -> Iterator[tuple[ast.expr, ast.cmpop, ast.expr]]:
    left = node.left
    for op, right in zip(node.ops, node.comparators):
        yield left, op, right
        left = right


def _assert_problems(test: ast.expr, previous: ast.stmt | None) -> Iterator[tuple[str, str]]:
    """``(kind, why)`` for each way an assert's test cannot fail."""
    if isinstance(test, ast.Tuple) and test.elts:
        yield "assert-literal", "a non-empty tuple is always true"
        return
    if _is_literal(test):
        yield "assert-literal", "reads no variable: its value is fixed"
        return
    for sub in ast.walk(test):
        if isinstance(sub, ast.BoolOp) and isinstance(sub.op, ast.Or):
            if any(isinstance(v, ast.Constant) and v.value for v in sub.values):
                yield "assert-literal", "an `or` with a true literal"
        if not isinstance(sub, ast.Compare):
            continue
        for left, op, right in _compare_pairs(sub):
            if _same(left, right):
                if isinstance(op, ast.Eq | ast.LtE | ast.GtE | ast.Is):
                    yield "assert-self", f"compares {ast.unparse(left)} with itself"
                continue
            if previous is not None and isinstance(previous, ast.Assign | ast.AnnAssign) and previous.value:
                targets = previous.targets if isinstance(previous, ast.Assign) else [previous.target]
                for target in targets:
                    for a, b in ((left, right), (right, left)):
                        if _same(a, target) and _same(b, previous.value) and isinstance(a, ast.Name):
                            yield "assert-just-assigned", f"{a.id} was just assigned {ast.unparse(b)}"
            ka, kb = _order_key(left), _order_key(right)
            if ka and kb and ka[0] == kb[0] and ka[1] != kb[1]:
                if (isinstance(op, ast.GtE) and ka[1] > kb[1]) or (isinstance(op, ast.LtE) and ka[1] < kb[1]):
                    yield ("assert-order-statistic",
                           f"{ast.unparse(left)} and {ast.unparse(right)} are order statistics of one sample")


def _threshold(test: ast.expr) -> str:
    """The part of an ``if`` test that compares a value with a number, or ""."""
    for sub in ast.walk(test):
        if not isinstance(sub, ast.Compare):
            continue
        operands = [sub.left, *sub.comparators]
        numbers = [o for o in operands if isinstance(o, ast.Constant) and type(o.value) in (int, float)
                   or isinstance(o, ast.UnaryOp) and isinstance(o.operand, ast.Constant)]
        if numbers and len(numbers) < len(operands):
            return ast.unparse(sub)
    return ""


def _walk_block(body: Iterable[ast.stmt], gate: str,
                in_def: bool = False) -> Iterator[tuple[ast.Assert, ast.stmt | None, str]]:
    """Yield ``(assert, statement before it, enclosing numeric if-test)`` for every assert in a block. Inside a
    function an ``if`` tests the arguments, not a measurement, so it gates nothing."""
    previous: ast.stmt | None = None
    for stmt in body:
        if isinstance(stmt, ast.Assert):
            yield stmt, previous, gate
        elif isinstance(stmt, ast.If):
            inner = gate or ("" if in_def else _threshold(stmt.test))
            yield from _walk_block(stmt.body, inner, in_def)
            yield from _walk_block(stmt.orelse, inner, in_def)
        else:
            nested = in_def or isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            for name in ("body", "orelse", "finalbody"):
                yield from _walk_block(getattr(stmt, name, []) or [], gate, nested)
            for handler in getattr(stmt, "handlers", []) or []:
                yield from _walk_block(handler.body, gate, nested)
            for case in getattr(stmt, "cases", []) or []:
                yield from _walk_block(case.body, gate, nested)
        previous = stmt


def vacuous_asserts(cells: Sequence[Cell]) -> list[Finding]:
    """Asserts in code cells that cannot fail, or may silently never run (rule B, kinds in the module
    docstring)."""
    found: list[Finding] = []
    for cell in cells:
        if cell.kind != "code":
            continue
        source = "\n".join(_magic_free(ln) for ln in cell.lines)
        try:
            tree = ast.parse(source)
        except SyntaxError as err:
            found.append(Finding(cell.path, cell.line + (err.lineno or 1) - 1, "syntax-error", str(err.msg)))
            continue
        for node, previous, gate in _walk_block(tree.body, ""):
            line = cell.line + node.lineno - 1
            text = " ".join((ast.get_source_segment(source, node) or ast.unparse(node)).split())
            for kind, why in dict.fromkeys(_assert_problems(node.test, previous)):
                found.append(Finding(cell.path, line, kind, text, why))
            if gate:
                found.append(Finding(cell.path, line, "assert-conditional", text,
                                     f"runs only if {gate}: assert the condition, or gate on the environment"))
    return found


def _magic_free(line: str) -> str:
    """A line with an IPython magic or shell escape commented out (sources keep them commented anyway)."""
    return "# " + line if line.lstrip().startswith(("%", "!")) else line


# ------------------------------------------------------------------------------------------------------ CLI
def lint(path: str | Path) -> list[Finding]:
    """Every finding for one source file, sorted by line."""
    cells = read_cells(path)
    found = measured_sentences(cells) + vacuous_asserts(cells) + stale_exemptions(cells)
    return sorted(found, key=lambda f: (f.line, f.kind))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line on stderr, exit status 2 (labkit._cli's convention)
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Lint the given sources (default: every tools/nbsrc/*.py); print the findings; 1 if any, else 0."""
    parser = _Parser(description="Lint notebook sources: measured sentences, asserts.")
    parser.add_argument("paths", nargs="*", type=Path, help="sources (default: tools/nbsrc/*.py)")
    args = parser.parse_args(argv)
    paths = args.paths or sorted(SRC.glob("[0-9]*.py"))
    count = 0
    for path in paths:
        for finding in lint(path):
            print(finding)
            count += 1
    print(f"{count} finding(s) in {len(paths)} file(s)", file=sys.stderr)
    return 1 if count else 0


if __name__ == "__main__":
    sys.exit(main())
