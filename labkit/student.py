"""The student build: copies of the notebooks with the exercise solutions removed and their outputs cleared.

Solutions sit between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` lines in code cells (and between
``<!-- BEGIN SOLUTION -->`` and ``<!-- END SOLUTION -->`` in markdown cells). The learner's ``...`` line
stays above each block, so in the student copy ``check(...)`` reports "not attempted yet" and the
notebook still runs top to bottom. Run it with ``python -m labkit student-build`` (or ``make student``).

Two builds: :func:`build_student` writes the stripped notebooks alone; :func:`build_student_tree` writes
everything a student needs to run the workbook (README, ``notebooks/``, ``slurm/``, the README's images) and
nothing that holds a solution (no ``labkit/``, ``tools/``, ``tests/``). labkit itself comes from the class's
shared environment, installed there as a normal (non-editable) package.

Neither build ever deletes a user's file. Each writes a marker file, ``.labkit-student-build``, with the list
of files it wrote and their SHA-256. An output folder is used only if it is new, empty, or an earlier build
whose files are all still as that build wrote them; anything else is refused, saying what is in the way,
unless ``force=True`` (``--force``), which moves the old folder aside to ``<out>.replaced-<time>``, intact.
The build is written to a temporary folder next to the output and renamed into place, so an interrupted
build leaves the previous one as it was; on every way out the temporary folder is gone (renamed into place,
or removed: only the one that build made). Then the previous build's own files, and only those, are removed.
No build is ever written into the workbook checkout's own folders (``labkit/``, ``tools/``, ``tests/``...).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from labkit._validate import safe_repr

__all__ = ["CLEAR_TAG", "MARKER", "MAX_NOTEBOOK_BYTES", "TREE_PATHS", "TREE_README", "BuildReport",
           "build_student", "build_student_tree", "predict_spans", "shows_a_verdict", "solution_blocks", "strip_solutions"]

_CODE = (re.compile(r"^\s*### BEGIN SOLUTION\s*$"), re.compile(r"^\s*### END SOLUTION\s*$"))
_MD = (re.compile(r"^\s*<!-- BEGIN SOLUTION -->\s*$"), re.compile(r"^\s*<!-- END SOLUTION -->\s*$"))

#: The file every student build writes at its top: what wrote the folder, and the manifest of its files.
MARKER = ".labkit-student-build"
_FORMAT = 1
_ABOUT = ("Written by `python -m labkit student-build`. A later build replaces this folder only while every "
          "file in it is one listed here, unchanged; anything else makes it stop and say so. Delete this "
          "marker and the folder counts as yours: no build will touch it.")

#: What a student tree holds besides ``notebooks/`` and its README: paths relative to the workbook root, files or
#: folders. Not ``labkit/``, ``tools/`` or ``tests/`` (solutions and reference answers), not the instructor's docs.
TREE_PATHS = ("docs/img", "docs/glossary.md", "slurm")
#: The student tree's README.md: the students' own (no ``make`` commands they cannot run, links that resolve in the
#: tree), not the checkout's developer README.
TREE_README = "docs/student/README.md"
#: Paths under :data:`TREE_PATHS` a student does not get: the cluster admin's JupyterHub setup.
TREE_EXCLUDE = ("slurm/jupyterhub",)
# the checkout's own folders: a student tree is never written inside one (pytest, ruff and nbbuild read them)
_WORKBOOK_DIRS = ("docs", "labkit", "notebooks", "slurm", "tests", "tools")
_SKIP = {"__pycache__", ".ipynb_checkpoints"}


@dataclass(frozen=True)
class BuildReport:
    """What a student build wrote: notebooks and how many solution blocks each lost, every file, and
    where an earlier folder was moved aside (``--force``), if it was.

    Introduced in notebook 00.
    """

    out_dir: Path
    removed: dict[str, int]
    files: tuple[str, ...] = ()
    moved_aside: Path | None = None


def solution_blocks(source: str, cell_type: str = "code") -> list[list[str]]:
    """Return the lines of each solution block in a cell's source (markers excluded).

    Raises ``ValueError`` on an unbalanced or nested marker, naming the line. Introduced in notebook 00.
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be a cell's text (a str), got {type(source).__name__}")
    if cell_type not in ("code", "markdown", "raw"):
        raise ValueError(f"cell_type must be 'code', 'markdown' or 'raw', got {safe_repr(cell_type)}")
    begin, end = _CODE if cell_type == "code" else _MD
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for i, line in enumerate(source.splitlines(), 1):
        if begin.match(line):
            if current is not None:
                raise ValueError(f"nested BEGIN SOLUTION at line {i}")
            current = []
        elif end.match(line):
            if current is None:
                raise ValueError(f"END SOLUTION without BEGIN at line {i}")
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line)
    if current is not None:
        raise ValueError("BEGIN SOLUTION without END SOLUTION")
    return blocks


def strip_solutions(source: str, cell_type: str = "code") -> tuple[str, int]:
    """Remove every solution block (markers included) from a cell's source; return (text, blocks removed).

    Introduced in notebook 00.
    """
    n = len(solution_blocks(source, cell_type))  # validates the markers
    if not n:
        return source, 0
    begin, end = _CODE if cell_type == "code" else _MD
    out, inside = [], False
    for line in source.splitlines():
        if begin.match(line):
            inside = True
        elif end.match(line):
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out), n


#: Cells with this tag lose their stored outputs in a student copy (e.g. a result that would answer a prediction).
CLEAR_TAG = "workspace-clear"
# a line that labkit.check prints for an answer: "✓ 03.x: correct...", "✗ 03.x: ...", "✎ 03.x: prediction ..."
_VERDICT = re.compile(r"^[✓✗✎] \d\d\.[\w.-]+:", re.M)


_PREDICT_CALL = re.compile(r"""\bpredict\(\s*["']([^"']+)["']""")


def _cell_text(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def predict_spans(cells: list[dict]) -> set[int]:
    """The indices of the code cells whose stored outputs would show a *predict, then run* result before the
    learner has predicted: every code cell from the one that calls ``predict("ID", ...)`` through the one that calls
    ``reveal("ID", ...)``, both included (a predict without a reveal below it: that cell only).

    Introduced in notebook 00.
    """
    if not isinstance(cells, list):
        raise TypeError(f"cells must be a notebook's list of cells, got {type(cells).__name__}")
    hidden: set[int] = set()
    for i, cell in enumerate(cells):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        m = _PREDICT_CALL.search(_cell_text(cell))
        if not m:
            continue
        reveal = re.compile(rf"""\breveal\(\s*["']{re.escape(m.group(1))}["']""")
        span = [i]
        for j in range(i + 1, len(cells)):
            if isinstance(cells[j], dict) and cells[j].get("cell_type") == "code":
                span.append(j)
                if reveal.search(_cell_text(cells[j])):
                    hidden.update(span)
                    break
        else:
            hidden.add(i)
    return hidden


def shows_a_verdict(cell: dict) -> bool:
    """Say whether a code cell's stored output holds a check's verdict (the reference answer's ✓ would tell it).

    Introduced in notebook 00.
    """
    if not isinstance(cell, dict):
        raise TypeError(f"cell must be a notebook cell (dict), got {type(cell).__name__}")
    for out in cell.get("outputs", []):
        text = out.get("text", "") if isinstance(out, dict) else ""
        if _VERDICT.search("".join(map(str, text)) if isinstance(text, list) else str(text)):
            return True
    return False


#: The largest notebook file the student build reads: 64 MiB. The workbook's own are under 300 KB; one with many
#: stored images can reach a few MB. Anything bigger is not one of them (and would be read whole into memory).
MAX_NOTEBOOK_BYTES = 64 * 2**20
_CELL_TYPES = ("code", "markdown", "raw")


def _json_kind(value: object) -> str:
    """What a JSON value is, in JSON's words: "a number", "a string", "a list", "an object", "null"..."""
    kinds = {bool: "true/false", int: "a number", float: "a number", str: "a string", list: "a list",
             dict: "an object", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _cell_problem(cell: object) -> str | None:
    """Say what keeps ``cell`` from being an nbformat 4 cell the build can read, or None if nothing does."""
    if not isinstance(cell, dict):
        return f"is {_json_kind(cell)}, not a cell (an object)"
    kind = cell.get("cell_type")
    if kind not in _CELL_TYPES:
        shown = f"'{kind[:40]}'" if isinstance(kind, str) else "missing" if kind is None else _json_kind(kind)
        return f"has cell_type {shown}; expected code, markdown or raw"
    source = cell.get("source")
    if isinstance(source, list):
        odd = next((v for v in source if not isinstance(v, str)), "")
        if not isinstance(odd, str):
            return f"has a 'source' list holding {_json_kind(odd)}; expected a string or a list of strings"
    elif not isinstance(source, str):
        return f"has a 'source' that is {_json_kind(source)}; expected a string or a list of strings"
    meta = cell.get("metadata", {})
    if not isinstance(meta, dict) or not isinstance(meta.get("tags", []), list):
        return "has a 'metadata' that is not an object with a list of 'tags'"
    if kind == "code" and not isinstance(cell.get("outputs", []), list):
        return f"has 'outputs' that are {_json_kind(cell.get('outputs'))}; expected a list"
    return None


def _read_notebook(path: Path) -> dict:
    """Return the nbformat 4 notebook in ``path`` as a dict, or raise ``ValueError`` naming the file and what is
    wrong with it: too large (:data:`MAX_NOTEBOOK_BYTES`), empty, not UTF-8 text, not JSON, JSON that is not a
    notebook, another nbformat, cells that are not cells. Introduced in notebook 00.
    """
    size = path.stat().st_size
    if size > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"{path}: {size:,} bytes, more than the {MAX_NOTEBOOK_BYTES:,} a notebook may have here")
    try:
        nb = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a notebook: not UTF-8 text (binary data?)") from None
    except RecursionError:
        raise ValueError(f"{path}: not a notebook: its JSON is nested too deeply") from None
    except ValueError as e:
        what = "the file is empty" if size == 0 else f"not JSON ({e})"
        raise ValueError(f"{path}: not a notebook: {what}") from None
    if not isinstance(nb, dict):
        raise ValueError(f"{path}: not a notebook: its JSON is {_json_kind(nb)}, not an object")
    got = nb.get("nbformat")
    if got != 4:
        shown = ("no nbformat" if got is None else f"nbformat {got}" if type(got) is int
                 else f"an nbformat that is {_json_kind(got)}")
        raise ValueError(f"{path}: {shown}; the student build reads nbformat 4 (open and save the notebook in "
                         "JupyterLab to convert it)")
    if not isinstance(nb.get("cells"), list):
        raise ValueError(f"{path}: not a notebook: it has no 'cells' list")
    if not isinstance(nb.get("metadata", {}), dict):
        raise ValueError(f"{path}: not a notebook: its 'metadata' is not an object")
    for i, cell in enumerate(nb["cells"]):
        problem = _cell_problem(cell)
        if problem is not None:
            raise ValueError(f"{path}: cell {i} {problem}")
    return nb


def _student_notebook(path: Path) -> tuple[bytes, int]:
    """Return the student copy of one notebook (JSON bytes) and how many solution blocks it lost.

    Cells that held a solution lose their outputs and execution count, and so do cells tagged
    ``workspace-clear`` and cells whose stored output shows a check's verdict (a ``reveal(...)`` after a
    measurement: its ✓ would tell the answer); every other cell and output is kept. A file that is not an
    nbformat 4 notebook raises ``ValueError`` naming it and what is wrong (see :func:`_read_notebook`).
    Introduced in notebook 00.
    """
    nb = _read_notebook(path)
    total = 0
    predicted = predict_spans(nb["cells"])
    for i, cell in enumerate(nb["cells"]):
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        try:
            new, n = strip_solutions(text, cell["cell_type"])
        except ValueError as e:
            raise ValueError(f"{path}: cell {i}: {e}") from None
        if n:
            total += n
            cell["source"] = new
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "code" and (n or CLEAR_TAG in tags or i in predicted or shows_a_verdict(cell)):
            cell["outputs"], cell["execution_count"] = [], None
    if total:
        nb.get("metadata", {}).pop("widgets", None)
    nb.get("metadata", {}).pop("jupytext", None)  # the pairing with tools/nbsrc is for authors only
    return (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode(), total


def _listing(names: Iterable[str], limit: int = 5) -> str:
    """Return ``a, b, c (and 4 more)`` for a message. Introduced in notebook 00."""
    names = sorted(names)
    more = f" (and {len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _contents(folder: Path) -> set[str]:
    """Return every entry below ``folder`` (files, links and folders) as a POSIX path relative to it.

    Introduced in notebook 00.
    """
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(folder):
        rel = Path(dirpath).relative_to(folder)
        found.update((rel / n).as_posix() for n in [*dirnames, *filenames])
    return found


def _sha256(path: Path) -> str:
    """Return the SHA-256 of a file's bytes, in hex. Introduced in notebook 00."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_manifest(out: Path) -> dict[str, str] | None:
    """Return ``{relative path: sha256}`` from an earlier build's marker, or None where there is no
    readable marker of a known format.

    Introduced in notebook 00.
    """
    marker = out / MARKER
    if not marker.is_file() or marker.is_symlink():
        return None
    try:
        data = json.loads(marker.read_text())
        files = data["files"] if data.get("format") == _FORMAT else None
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return None
    if not isinstance(files, dict) or not all(isinstance(v, str) and _inside_path(k)
                                              for k, v in files.items()):
        return None  # a marker that names a file outside the folder is not one a build wrote
    return files


def _inside_path(rel: object) -> bool:
    """Whether ``rel`` is a relative POSIX path that stays inside its folder (no ``..``, not absolute).

    Introduced in notebook 00.
    """
    if not isinstance(rel, str) or not rel or "\\" in rel:
        return False
    parts = Path(rel).parts
    return not Path(rel).is_absolute() and bool(parts) and ".." not in parts and rel == Path(rel).as_posix()


def _not_from_build(out: Path, manifest: dict[str, str]) -> list[str]:
    """Return what in ``out`` the earlier build did not write, or wrote and was changed since.

    Introduced in notebook 00.
    """
    ours = {MARKER, *manifest}
    ours |= {p.as_posix() for rel in manifest for p in Path(rel).parents if p != Path(".")}
    odd = [f"{rel} (added)" for rel in sorted(_contents(out) - ours)]
    for rel, digest in sorted(manifest.items()):
        path = out / rel
        if path.is_symlink() or (path.exists() and not path.is_file()):
            odd.append(f"{rel} (replaced)")
        elif path.is_file() and _sha256(path) != digest:
            odd.append(f"{rel} (changed)")
    return odd


def _refuse_places(out: Path, anchors: Iterable[tuple[str, Path]], inside: Iterable[tuple[str, Path]]) -> None:
    """Raise ``ValueError`` if ``out`` is one of the ``anchors`` or a folder above one, or lies inside one
    of the ``inside`` folders. Each comes as ``(what, folder)``: ``what`` names the folder in the message.

    Introduced in notebook 00.
    """
    if out == out.parent:
        raise ValueError(f"out_dir {out} is the file system root; choose a new folder such as dist/student")
    for what, path in anchors:
        if out == path or out in path.parents:
            raise ValueError(f"out_dir {out} is {what} ({path}) or a folder above it, and a build "
                             "would replace it; choose a new folder such as dist/student")
    for what, path in inside:
        if out == path or path in out.parents:
            raise ValueError(f"out_dir {out} is inside {what} ({path}), where pytest, JupyterLab and the "
                             "workbook tools would pick the copies up; choose a folder outside it, "
                             "such as dist/student")


def _is_checkout(root: Path) -> bool:
    """Whether ``root`` looks like a workbook checkout (or a student tree): it has ``tools/nbsrc/`` or
    ``slurm/jupyter.sbatch`` (an installed labkit's ``site-packages`` has neither). Introduced in notebook 00."""
    return (root / "tools" / "nbsrc").is_dir() or (root / "slurm" / "jupyter.sbatch").is_file()


def _checkouts(start: Path) -> list[Path]:
    """Return the checkouts no build may be written into: the one ``start`` lies in (if any), and the one
    labkit itself is imported from (an editable install), if it is one. Introduced in notebook 00."""
    found = [next((r for r in start.parents if _is_checkout(r)), None), Path(__file__).resolve().parents[1]]
    return list(dict.fromkeys(r for r in found if r is not None and _is_checkout(r)))


def _source_tree(roots: Iterable[Path]) -> tuple[list[tuple[str, Path]], list[tuple[str, Path]]]:
    """Return ``(anchors, inside)`` for :func:`_refuse_places` that keep a build out of the checkouts ``roots``:
    each checkout itself (and the folders above it), and its own folders (:data:`_WORKBOOK_DIRS`) and hidden
    folders (``.git``, a virtual environment...). A new folder such as ``dist/student`` stays allowed.
    Introduced in notebook 00.
    """
    anchors: list[tuple[str, Path]] = []
    inside: list[tuple[str, Path]] = []
    for root in roots:
        anchors.append(("the workbook checkout", root))
        hidden: list[str] = []
        with contextlib.suppress(OSError):
            hidden = sorted(p.name for p in root.iterdir() if p.name.startswith(".") and p.is_dir())
        inside += [(f"the checkout's {d}/ folder", root / d) for d in (*_WORKBOOK_DIRS, *hidden)]
    return anchors, inside


def _plan(out: Path, force: bool) -> tuple[str, dict[str, str]]:
    """Decide how a build may take the place of ``out``: ``("new"|"replace"|"aside", manifest)``.

    ``replace``: ``out`` is empty or an earlier, unchanged build (its manifest is returned); ``aside``: it
    holds something else and ``force`` is set. Anything else raises ``ValueError`` naming what is in the
    way and how to go on. Introduced in notebook 00.
    """
    if out.is_symlink():
        raise ValueError(f"out_dir {out} is a symbolic link; give the folder it points to, or a new one")
    if not out.exists():
        return "new", {}
    if not out.is_dir():
        raise ValueError(f"out_dir {out} is an existing file, not a folder; give a new folder, an empty one, "
                         "or an earlier student build")
    found = _contents(out)
    if not found:
        return "replace", {}
    manifest = _read_manifest(out)
    if manifest is None:
        if force:
            return "aside", {}
        raise ValueError(f"out_dir {out} is not empty and is not an earlier student build (it has no "
                         f"readable {MARKER}): it holds {_listing(found)}; choose a new or empty folder, "
                         "or pass --force (force=True) to move it aside, whole, to "
                         f"{out.name}.replaced-<time> beside it")
    odd = _not_from_build(out, manifest)
    if odd and not force:
        raise ValueError(f"out_dir {out} is an earlier student build, but it holds files that build did "
                         f"not write as they are: {_listing(odd)}; move them out, or pass --force "
                         f"(force=True) to move the folder aside, whole, to {out.name}.replaced-<time> "
                         "beside it")
    return ("aside", {}) if odd else ("replace", manifest)


def _sibling(out: Path, kind: str, hidden: bool = True) -> Path:
    """Return a name that does not exist yet next to ``out``, for a folder being built or set aside.

    Introduced in notebook 00.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S") if not hidden else uuid.uuid4().hex[:8]
    base = f".{out.name}.{kind}-{stamp}" if hidden else f"{out.name}.{kind}-{stamp}"
    path, n = out.parent / base, 1
    while path.exists() or path.is_symlink():
        n += 1
        path = out.parent / f"{base}-{n}"
    return path


def _remove_build(folder: Path, manifest: dict[str, str]) -> bool:
    """Remove an earlier build's own files (those of its manifest still as it wrote them, and its marker),
    then the folders they emptied.

    Nothing else is touched: a file changed since, or a folder not empty afterwards, stays. Returns whether
    ``folder`` is gone. Introduced in notebook 00.
    """
    for rel, digest in manifest.items():
        path = folder / rel
        if path.is_file() and not path.is_symlink() and _sha256(path) == digest:
            path.unlink()
    if (folder / MARKER).is_file() and not (folder / MARKER).is_symlink():
        (folder / MARKER).unlink()
    dirs = {p for rel in manifest for p in (folder / rel).parents if folder in p.parents}
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:
            pass
    try:
        folder.rmdir()
    except OSError:
        return False
    return True


def _write(root: Path, rel: str, data: bytes, files: dict[str, str], like: Path | None = None) -> None:
    """Write ``data`` to ``root/rel`` (copying the permission bits of ``like``) and record its SHA-256.

    Introduced in notebook 00.
    """
    dest = root / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    if like is not None:
        shutil.copymode(like, dest)
    files[rel] = hashlib.sha256(data).hexdigest()


def _publish(out: Path, kind: str, force: bool, fill: Callable[[Path, dict[str, str]], None]) -> BuildReport:
    """Build into a fresh folder next to ``out`` with ``fill(folder, files)``, then rename it into place.

    Whatever happens (an exception, an interruption, another build that took ``out`` meanwhile), the fresh
    folder this call made is gone when it returns: renamed into place, or removed. ``out`` is left as it was
    unless the build took its place. Introduced in notebook 00.
    """
    how, manifest = _plan(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(out, "building")
    tmp.mkdir()
    try:
        files: dict[str, str] = {}
        fill(tmp, files)
        marker = {"about": _ABOUT, "format": _FORMAT, "kind": kind, "files": dict(sorted(files.items()))}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
        return _swap_in(tmp, out, how, manifest, tuple(sorted(files)))
    finally:
        if tmp.is_dir() and not tmp.is_symlink():  # not renamed into place: the fresh folder this call made
            shutil.rmtree(tmp, ignore_errors=True)


def _swap_in(tmp: Path, out: Path, how: str, manifest: dict[str, str], files: tuple[str, ...]) -> BuildReport:
    """Rename the finished build ``tmp`` to ``out`` as :func:`_plan` decided (``how``), moving the earlier
    folder aside or removing the earlier build's own files. Raises ``ValueError`` if ``out`` changed meanwhile
    (another build, say), leaving it as that left it. Introduced in notebook 00.
    """
    if how == "new":
        try:
            tmp.rename(out)
        except OSError as e:
            raise ValueError(f"out_dir {out} appeared while this build ran (another build at the same time?) "
                             f"and was left as it is ({e.strerror}); run the build again") from None
        return BuildReport(out, {}, files)
    old = _sibling(out, "replaced", hidden=False) if how == "aside" else _sibling(out, "previous")
    try:
        out.rename(old)
    except OSError as e:
        raise ValueError(f"out_dir {out} changed while this build ran (another build at the same time?) and "
                         f"was left as it is ({e.strerror}); run the build again") from None
    try:
        tmp.rename(out)
    except BaseException:
        _put_back(old, out)
        raise
    if how == "aside" or _remove_build(old, manifest):
        return BuildReport(out, {}, files, old if how == "aside" else None)
    kept = _sibling(out, "replaced", hidden=False)  # someone added a file while this build ran: keep it
    old.rename(kept)
    return BuildReport(out, {}, files, kept)


def _put_back(old: Path, out: Path) -> None:
    """Rename ``old`` (the earlier folder, moved aside) back to ``out``; if ``out`` was taken meanwhile, give
    it a visible name beside ``out`` instead and say where (``ValueError``). Nothing is deleted."""
    try:
        old.rename(out)
    except OSError:
        kept = _sibling(out, "replaced", hidden=False)
        old.rename(kept)
        raise ValueError(f"out_dir {out} was taken by another build while this one ran; what was there "
                         f"before is now {kept}") from None


def _resolve_out(out_dir: str | Path) -> Path:
    """Return ``out_dir`` as an absolute path (``~`` expanded), without following a link at its end.

    Introduced in notebook 00.
    """
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"out_dir must be a path (str or Path), got {type(out_dir).__name__}")
    out = Path(out_dir).expanduser()
    return out.parent.resolve() / out.name if out.name not in ("", ".", "..") else out.resolve()


def _user_anchors() -> list[tuple[str, Path]]:
    """Return the folders a build must never take the place of, whatever ``force`` says, as ``(what, folder)``.

    Introduced in notebook 00.
    """
    return [("your home folder", Path.home().resolve()), ("the current folder", Path.cwd().resolve())]


def _notebooks(src: Path) -> list[Path]:
    """Return the notebooks in ``src``, sorted; raise ``ValueError`` if there are none.

    Introduced in notebook 00.
    """
    notebooks = sorted(src.glob("*.ipynb"))
    if not notebooks:
        raise ValueError(f"no notebooks found in {src}; expected the instructor notebooks, e.g. notebooks/")
    return notebooks


def _student_copies(notebooks: Iterable[Path]) -> dict[str, tuple[bytes, int]]:
    """Return ``{name: (student copy, solution blocks removed)}`` for ``notebooks``; the first one that is not a
    readable notebook raises ``ValueError`` naming it. Introduced in notebook 00."""
    return {path.name: _student_notebook(path) for path in notebooks}


def build_student(src_dir: str | Path = "notebooks", out_dir: str | Path = "dist/student", *,
                  force: bool = False) -> BuildReport:
    """Write student copies of every notebook in ``src_dir`` to ``out_dir``; return what was removed.

    Cells that held a solution lose their outputs and execution count; every other cell, output and
    file is kept as it is. ``out_dir`` must be new, empty, or an earlier unchanged build (replaced
    whole); it may not be, hold, or lie inside ``src_dir``, nor be the workbook checkout ``src_dir`` lies in
    (or labkit's own), a folder above it, or inside one of its folders (``labkit/``, ``tools/``, ``tests/``,
    ``docs/``, ``slurm/``, hidden ones such as ``.git/``): ``ValueError``, whatever ``force`` says. A new folder
    such as ``dist/student`` is fine. ``force=True`` moves any other folder aside instead of refusing.
    Nothing is ever deleted but an earlier build's own files. Every notebook is read first: a file in ``src_dir``
    that is not an nbformat 4 notebook (not JSON, no cells, larger than :data:`MAX_NOTEBOOK_BYTES`...) raises
    ``ValueError`` naming it, and nothing is written. Introduced in notebook 00.
    """
    src, out = Path(src_dir).expanduser().resolve(), _resolve_out(out_dir)
    notebooks = _notebooks(src)
    anchors, inside = _source_tree(_checkouts(src))
    _refuse_places(out, [("the source notebooks folder", src), *_user_anchors(), *anchors],
                   [("the source notebooks folder", src), *inside])
    copies = _student_copies(notebooks)  # every notebook read and checked before anything is written
    removed = {name: n for name, (_, n) in copies.items()}

    def fill(folder: Path, files: dict[str, str]) -> None:
        for name, (data, _) in copies.items():
            _write(folder, name, data, files)

    rep = _publish(out, "notebooks", force, fill)
    return BuildReport(rep.out_dir, removed, rep.files, rep.moved_aside)


def _tree_sources(root: Path) -> list[tuple[Path, str]]:
    """Return ``(source file, path in the tree)`` for the README (:data:`TREE_README`) and everything in
    :data:`TREE_PATHS`, sorted.

    Raises ``ValueError`` if one is missing. Introduced in notebook 00.
    """
    readme = root / TREE_README
    if not readme.is_file():
        raise ValueError(f"{root} does not look like the workbook: it has no {TREE_README}")
    pairs: list[tuple[Path, str]] = [(readme, "README.md")]
    for rel in TREE_PATHS:
        path = root / rel
        if path.is_file():
            pairs.append((path, rel))
        elif path.is_dir():
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames[:] = sorted(d for d in dirnames if d not in _SKIP and not d.startswith(".")
                                     and (Path(dirpath) / d).relative_to(root).as_posix() not in TREE_EXCLUDE)
                for name in sorted(filenames):
                    f = Path(dirpath) / name
                    if not name.startswith(".") and f.is_file():
                        pairs.append((f, f.relative_to(root).as_posix()))
        else:
            raise ValueError(f"{root} does not look like the workbook: it has no {rel}")
    return pairs


def build_student_tree(repo_root: str | Path = ".", out_dir: str | Path = "dist/student", *,
                       force: bool = False) -> BuildReport:
    """Write a complete student copy of the workbook to ``out_dir``, holding no solution.

    ``out_dir`` gets the student notebooks in ``notebooks/``, the students' README (:data:`TREE_README`) and
    :data:`TREE_PATHS` (its images, the glossary, ``slurm/``, which notebook 12 reads): what a student needs to run the workbook with labkit
    installed in the class environment. ``labkit/``, ``tools/``, ``tests/`` and the instructor's docs
    stay out. The rules on ``out_dir`` are :func:`build_student`'s: it may not be the checkout, a folder
    above it, or inside one of its folders. Introduced in notebook 00.
    """
    root, out = Path(repo_root).expanduser().resolve(), _resolve_out(out_dir)
    if not (root / "slurm" / "jupyter.sbatch").is_file():
        raise ValueError(f"{root} does not look like the workbook checkout: no slurm/jupyter.sbatch; "
                         "give its root folder")
    notebooks = _notebooks(root / "notebooks")
    copies = _tree_sources(root)
    anchors, inside = _source_tree(dict.fromkeys([root, *_checkouts(root / "notebooks")]))
    _refuse_places(out, [*anchors, *_user_anchors()], inside)
    students = _student_copies(notebooks)  # every notebook read and checked before anything is written
    removed = {name: n for name, (_, n) in students.items()}

    def fill(folder: Path, files: dict[str, str]) -> None:
        for name, (data, _) in students.items():
            _write(folder, f"notebooks/{name}", data, files)
        for path, rel in copies:
            _write(folder, rel, path.read_bytes(), files, like=path)

    rep = _publish(out, "tree", force, fill)
    return BuildReport(rep.out_dir, removed, rep.files, rep.moved_aside)
