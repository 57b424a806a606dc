"""The learner's workspace: a git-ignored folder (``work/``) of student copies that ``make lab`` opens.

The reference notebooks in ``notebooks/`` hold the solutions and every output. A learner works in copies of
them instead: :func:`update_workspace` (``python -m labkit workspace``, run by ``make lab``) writes each notebook
through the student build (:mod:`labkit.student`: solutions removed, the exercise cells' outputs cleared, every
teaching cell's output kept) into the workspace, with a first cell that links to the reference notebook.

It never overwrites the learner's work and never deletes anything. A marker file, ``.labkit-workspace``,
records the SHA-256 of every file it copied, so a later run can tell the three cases apart:

* the learner's copy is as it was copied and the notebook changed upstream (after a ``git pull``): the copy
  is replaced by the new version (nothing of the learner's is in it);
* the learner edited the copy and the notebook changed upstream: the new version is written *beside* it,
  ``NN_topic.updated.ipynb``, with a one-line message, and the learner's copy stays as it is;
* a notebook that is new upstream, or a copy the learner removed or renamed, is copied in.

A path the learner made is never replaced or written through: a symbolic link (or a folder) where a copy, its
folder or its ``.updated`` file would go is kept as it is, and the report says so in one line.

Notebooks read ``slurm/`` beside them (notebook 12): a workspace inside the checkout finds the checkout's; a
workspace elsewhere gets its own copy, kept up to date by the same rules.

Introduced in notebook 00.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from labkit._validate import safe_repr
from labkit.i18n import LANGUAGES, edition_of, translate

__all__ = ["DEFAULT_DIR", "EDITION_DIRS", "LAB_LOCALES", "MARKER", "PROGRESS_FILE", "WorkspaceReport", "find_workspace",
           "lab_settings", "update_workspace", "updated_name", "workspace_notebook"]

#: Where ``make lab`` puts the workspace, relative to the checkout (git-ignored).
DEFAULT_DIR = "work"
#: ``make lab``'s workspace of each edition (``make lab LAB_LANG=zh``: ``work-zh``), relative to the checkout.
EDITION_DIRS = {"en": DEFAULT_DIR, "zh": "work-zh"}
#: The file at the top of a workspace: what wrote it, and the SHA-256 of every file it copied.
MARKER = ".labkit-workspace"
#: The learner's progress record inside a workspace (written by :mod:`labkit.check`).
PROGRESS_FILE = ".labkit-progress.json"
#: The tag of the first cell of every workspace notebook (the link to the reference notebook).
NOTE_TAG = "workspace-note"
#: Cells with this tag lose their stored outputs in the workspace (their output is the learner's own state);
#: the student build (:mod:`labkit.student`) clears them, and every copy here starts from it.
CLEAR_TAG = "workspace-clear"

_FORMAT = 1
_KIND = "labkit-workspace"
_ABOUT = ("Written by `python -m labkit workspace` (make lab). It lists every file it copied here with its "
          "SHA-256, so that a later run replaces only copies you have not changed and puts a new version "
          "beside any copy you have changed (NN_topic.updated.ipynb). Nothing here is ever deleted.")
#: What notebooks read beside them; copied into a workspace that lies outside the checkout.
SUPPORT_PATHS = ("slurm",)
# the checkout's own folders: a workspace inside one would be picked up by pytest, nbval or the tools
_CHECKOUT_DIRS = ("docs", "labkit", "notebooks", "slurm", "tests", "tools")
_SKIP = {"__pycache__", ".ipynb_checkpoints"}


@dataclass(frozen=True)
class WorkspaceReport:
    """What :func:`update_workspace` did: the workspace's folder, one line per change, and the files by fate.

    ``copied``: written for the first time (or again, where the learner had removed the copy); ``replaced``:
    unchanged copies brought to the new upstream version; ``beside``: ``.updated`` files written beside an edited
    copy; ``waiting``: earlier ``.updated`` files still beside their copy; ``unchanged``: how many files needed
    nothing. Introduced in notebook 00.
    """

    path: Path
    created: bool
    lines: tuple[str, ...] = ()
    copied: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    beside: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    unchanged: int = 0


@dataclass
class _Log:
    copied: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    beside: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    unchanged: int = 0


def _path_arg(value: object, name: str) -> Path:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or Path), got {type(value).__name__}")
    return Path(value).expanduser()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def updated_name(rel: str, n: int = 1) -> str:
    """Return the name of the new version written beside the learner's copy: ``03_x.ipynb`` -> ``03_x.updated.ipynb``.

    ``n`` > 1 gives ``03_x.updated-2.ipynb`` (used when the learner edited an earlier ``.updated`` file).
    Introduced in notebook 00.
    """
    if not isinstance(rel, str):
        raise TypeError(f"rel must be a file's path inside the workspace (a str), got {type(rel).__name__}")
    if not rel.strip() or rel.endswith("/") or Path(rel).name in ("", ".", ".."):
        raise ValueError(f"rel must be a file's path inside the workspace, got {safe_repr(rel)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {safe_repr(n)}")
    p = Path(rel)
    tag = ".updated" if n == 1 else f".updated-{n}"
    return p.with_name(f"{p.stem}{tag}{p.suffix}").as_posix()


def find_workspace(start: str | Path | None = None) -> Path | None:
    """Return the workspace that holds folder ``start`` (default: the current folder), or None.

    A workspace is a folder with a ``.labkit-workspace`` file; ``start`` itself and its parents are searched.
    Introduced in notebook 00.
    """
    try:
        folder = Path.cwd() if start is None else _path_arg(start, "start").resolve()
    except OSError:  # the current folder was removed
        return None
    for d in (folder, *folder.parents):
        marker = d / MARKER
        if marker.is_file() and not marker.is_symlink():
            return d
    return None


def _link(dest: Path, target: Path) -> str:
    """A relative POSIX link from the workspace folder to ``target`` (absolute if there is no relative one)."""
    try:
        return Path(os.path.relpath(target, dest)).as_posix()
    except ValueError:  # another drive (Windows)
        return target.as_posix()


def workspace_notebook(path: str | Path, reference_link: str | None = None, lang: str = "en") -> bytes:
    """Return the workspace copy of the reference notebook at ``path`` (notebook JSON bytes).

    It is the student copy (:mod:`labkit.student`: solution blocks removed, those cells' outputs cleared, every
    other cell and output kept), with the outputs of cells tagged ``workspace-clear`` cleared too, and of cells
    whose output shows a check's verdict (a ``reveal(...)`` after a measurement: its ✓ would tell the answer),
    and a first markdown cell (tagged ``workspace-note``) that says where the reference notebook is: ``reference_link``
    (default: ``../notebooks/<name>``). Made from a student tree's notebooks, which hold no solution, the copy is
    the same and the first cell links to the notebook as handed out. The note is in ``lang`` (the edition's
    language, labkit.i18n). Introduced in notebook 00.
    """
    from labkit.student import _student_notebook

    src = _path_arg(path, "path")
    if reference_link is not None and not isinstance(reference_link, str):
        raise TypeError(f"reference_link must be a str or None, got {type(reference_link).__name__}")
    if not src.is_file() or src.suffix != ".ipynb":
        raise ValueError(f"{src} is not a notebook file (.ipynb)")
    link = reference_link if reference_link is not None else f"../notebooks/{src.name}"
    try:
        data, removed = _student_notebook(src)
        nb = json.loads(data)
        cells = nb["cells"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{src} is not a readable notebook: {e}") from None
    note = {
        "cell_type": "markdown",
        "id": "workspace-note",
        "metadata": {"tags": [NOTE_TAG]},
        "source": ("> " + translate("**Your copy** of this notebook, in your workspace: edit and run it freely; "
                                    "`make lab` never overwrites it (a newer version arrives beside it as "
                                    "`{updated}`). Each exercise's `check(...)` gives a hint, then the method, then "
                                    "the worked solution; `python -m labkit progress` lists what you have solved.",
                                    lang).format(updated=updated_name(src.name)) + " "
                   + (translate("The reference notebook, with the solutions and every output: [{name}]({link}).",
                                lang) if removed else
                      translate("The notebook as it was handed out: [{name}]({link}).", lang)).format(
                          name=src.name, link=link)),
    }
    if not (cells and cells[0].get("id") == note["id"]):
        cells.insert(0, note)
    return (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode()


def _readme(dest: Path, root: Path, names: list[str], solutions: bool) -> bytes:
    ref = _link(dest, root / "notebooks")
    where = ("The reference notebooks, with the solutions and every output, are in" if solutions else
             "The notebooks as they were handed out are in")
    rows = "\n".join(f"- [{n}]({n}) (reference: [{ref}/{n}]({ref}/{n}))" for n in names)
    text = f"""# Your workspace

These are your copies of the workbook's notebooks: the exercises are open (`answer = ...`), their solutions
and outputs removed; every other cell keeps its output, so you can read a notebook before running it.
Edit and run them freely. This folder is yours: git ignores it, and nothing here is ever deleted.

- `make lab` (or `python -m labkit workspace`) copies in new notebooks and never overwrites a notebook you
  have changed. When a notebook changes upstream (after `git pull`), a copy you have not touched is brought
  up to date; beside a copy you have changed, the new version appears as `NN_topic.updated.ipynb`, and
  `make lab` says so in one line. Compare the two, keep what you want, then delete the `.updated` file.
- To start a notebook afresh, rename your copy (for example to `03_loss_scaling.mine.ipynb`) and run
  `make lab` again: a fresh copy appears.
- A wrong answer to `check(...)` gets a hint; the next wrong answer the method; the next the worked
  solution. `labkit.check.solution("NN.name")` shows the worked solution at once.
- Your progress is recorded in `{PROGRESS_FILE}` here (on this machine only): `python -m labkit progress`,
  or the last section of notebook 00, lists what you have solved.
- {where} [{ref}]({ref}/).

{rows}
"""
    return text.encode()


def _support_files(root: Path) -> Iterator[tuple[str, Path]]:
    for top in SUPPORT_PATHS:
        base = root / top
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP and not d.startswith("."))
            for name in sorted(filenames):
                f = Path(dirpath) / name
                if not name.startswith(".") and f.is_file() and not f.is_symlink():
                    yield f.relative_to(root).as_posix(), f


def _read_marker(dest: Path) -> dict[str, dict[str, str | None]] | None:
    """The ``files`` of the workspace marker, or None where there is no marker; ValueError if unreadable."""
    from labkit.student import _inside_path

    marker = dest / MARKER
    if not marker.exists() and not marker.is_symlink():
        return None
    if marker.is_symlink() or not marker.is_file():
        raise ValueError(f"{marker} is not a plain file; move it away and run again")
    try:
        doc = json.loads(marker.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{marker} cannot be read ({e}); move it away (the workspace then counts as a new "
                         "folder) or restore it") from None
    known = isinstance(doc, dict) and doc.get("kind") == _KIND and doc.get("format") == _FORMAT
    files = doc.get("files") if known else None
    ok = isinstance(files, dict) and all(
        _inside_path(k) and isinstance(v, dict) and all(isinstance(x, str) or x is None for x in v.values())
        for k, v in files.items())
    if not ok:
        raise ValueError(f"{marker} is not a labkit workspace marker of a known format; move it away or restore it")
    return files


def _write_atomic(path: Path, data: bytes, like: Path | None = None) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it (never half a file), with the umask's mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as fh:
            fh.write(data)
        if like is not None:
            os.chmod(tmp, like.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _file_sha(path: Path) -> str | None:
    if path.is_symlink() or not path.is_file():
        return None
    return _sha(path.read_bytes())


def _place(dest: Path, rel: str, data: bytes, files: dict[str, dict[str, str | None]], log: _Log,
           like: Path | None = None) -> None:
    """Bring one file of the workspace up to date with ``data`` (the new upstream copy), by the module's rules."""
    new = _sha(data)
    path = dest / rel
    entry = files.get(rel)
    shown = (Path(dest.name) / rel).as_posix()
    theirs = _learners_path(dest, rel)
    if theirs is not None:
        log.lines.append(f"{(Path(dest.name) / theirs).as_posix()}: yours ({_what_is(dest / theirs)}); kept as it "
                         f"is, so {rel} was not brought up to date (rename it to get a fresh copy)")
        return
    if not path.exists():
        again = entry is not None
        _write_atomic(path, data, like)
        files[rel] = {"copied": new}
        log.copied.append(rel)
        if again:
            log.lines.append(f"{shown}: was not there (removed or renamed); copied in afresh")
        return
    cur = _file_sha(path)
    base = entry.get("copied") if entry else None
    if cur == new:  # as upstream has it (also: the learner took the .updated version over)
        if entry is None or base != new or entry.get("updated"):
            files[rel] = {"copied": new}
        log.unchanged += 1
        return
    if entry is not None and cur == base:  # the learner has not touched it: bring it up to date
        _write_atomic(path, data, like)
        files[rel] = {"copied": new}
        log.replaced.append(rel)
        log.lines.append(f"{shown}: updated to the new version (you had not changed your copy)")
        return
    # the learner's file differs from what was copied (or was not copied by us): never touch it
    if entry is not None and new == base:
        log.unchanged += 1
        return
    record = dict(entry) if entry is not None else {"copied": None}
    if record.get("updated") == new:
        earlier = str(record.get("updated_file") or updated_name(rel))
        if (dest / earlier).is_file():
            log.waiting.append(earlier)
            log.lines.append(f"{(Path(dest.name) / earlier).as_posix()}: the new version of {rel} is still beside "
                             "your copy")
        else:
            log.unchanged += 1  # the learner removed the .updated file: dismissed until upstream changes again
        return
    beside, kept = _beside_name(dest, rel, {record.get("updated"), new} - {None})
    _write_atomic(dest / beside, data, like)
    record.update(updated=new, updated_file=beside)
    files[rel] = record
    log.beside.append(beside)
    also = f" ({', '.join(kept)}: yours, kept as {'it is' if len(kept) == 1 else 'they are'})" if kept else ""
    log.lines.append(f"{(Path(dest.name) / beside).as_posix()}: {rel} changed upstream; the new version is "
                     f"beside your copy, which stays as you left it{also}")


def _beside_name(dest: Path, rel: str, ours: set[str]) -> tuple[str, list[str]]:
    """Return a name for the new version of ``rel`` beside the learner's copy, and the names passed over.

    ``NN_x.updated.ipynb``, else ``NN_x.updated-2.ipynb``, ...: the first that is free or is a plain file this
    workspace wrote (its SHA-256 in ``ours``). A path the learner made there (a changed file, a symbolic link,
    a folder) is passed over and kept as it is.
    """
    n, kept = 1, []
    while True:
        beside = updated_name(rel, n)
        target = dest / beside
        if not target.exists() and not target.is_symlink():
            return beside, kept
        if _file_sha(target) in ours:  # None (a link, a folder) is never ours
            return beside, kept
        if target.is_symlink() or not target.is_file():
            kept.append(f"{beside} ({_what_is(target)})")
        n += 1


def _learners_path(dest: Path, rel: str) -> str | None:
    """Return the part of ``rel`` (itself, or a folder above it inside ``dest``) that the learner made into
    something a copy must not be written through or over: a symbolic link, or not a plain file/folder. None if
    there is none."""
    parts = Path(rel).parts
    for i in range(1, len(parts) + 1):
        sub = Path(*parts[:i])
        path = dest / sub
        last = i == len(parts)
        if path.is_symlink() or (path.exists() and not (path.is_file() if last else path.is_dir())):
            return sub.as_posix()
    return None


def _what_is(path: Path) -> str:
    """A few words on what ``path`` is, for a message: "a symbolic link", "a folder", "not a plain file"."""
    if path.is_symlink():
        return "a symbolic link"
    return "a folder" if path.is_dir() else "not a plain file"


def _check_places(root: Path, dest: Path) -> None:
    if dest == dest.parent:
        raise ValueError(f"workspace {dest} is the file system root; choose a folder such as {root / DEFAULT_DIR}")
    if dest == root or dest in root.parents:
        raise ValueError(f"workspace {dest} is the checkout or a folder above it; choose a new folder such as "
                         f"{root / DEFAULT_DIR}")
    home = Path.home().resolve()
    if dest == home or dest in home.parents:
        raise ValueError(f"workspace {dest} is your home folder or above it; choose a folder such as "
                         f"{root / DEFAULT_DIR}")
    for d in _CHECKOUT_DIRS:
        inside = root / d
        if dest == inside or inside in dest.parents:
            raise ValueError(f"workspace {dest} is inside the checkout's {d}/ folder, where the tests and tools "
                             f"would pick the copies up; choose a folder such as {root / DEFAULT_DIR}")


def _edition_notebooks(root: Path, lang: str) -> list[Path]:
    """The reference notebooks of an edition: ``notebooks/<lang>/NN_*.ipynb``, and the English one for any notebook
    the edition does not have yet."""
    english = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")) if (root / "notebooks").is_dir() else []
    if lang == "en":
        return english
    return [root / "notebooks" / lang / p.name if (root / "notebooks" / lang / p.name).is_file() else p
            for p in english]


#: JupyterLab's UI language per edition: the language pack's locale (jupyterlab-language-pack-zh-CN).
LAB_LOCALES = {"en": "en", "zh": "zh_CN"}
_TRANSLATION_SETTINGS = Path("@jupyterlab") / "translation-extension" / "plugin.jupyterlab-settings"


def lab_settings(lang: str, folder: str | Path) -> Path:
    """Write a JupyterLab user-settings folder whose UI language is ``lang``'s; return the settings file written.

    ``make lab LAB_LANG=zh`` runs JupyterLab with ``JUPYTERLAB_SETTINGS_DIR`` set to this folder, so the Chinese
    UI is chosen for that run only and the learner's own settings are not touched. Other settings already in the
    file are kept. Introduced in notebook 00.
    """
    if not isinstance(lang, str) or lang not in LAB_LOCALES:
        raise ValueError(f"lang must be one of {', '.join(LAB_LOCALES)}, got {safe_repr(lang)}")
    target = _path_arg(folder, "folder") / _TRANSLATION_SETTINGS
    doc: dict = {}
    if target.is_file():
        try:
            found = json.loads(target.read_text(encoding="utf-8"))
            doc = found if isinstance(found, dict) else {}
        except (OSError, ValueError):
            raise ValueError(f"{target} is not a JupyterLab settings file; move it away and run again") from None
    doc["locale"] = LAB_LOCALES[lang]
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(target, (json.dumps(doc, indent=2) + "\n").encode())
    return target


def update_workspace(root: str | Path = ".", dest: str | Path | None = None, lang: str = "en") -> WorkspaceReport:
    """Create the learner's workspace, or bring it up to date, from the checkout at ``root``; never lose an edit.

    ``dest`` defaults to ``<root>/work``. A new or empty folder becomes a workspace; an earlier workspace (it has a
    ``.labkit-workspace`` marker) is updated: new notebooks are copied in, copies the learner has not changed are
    replaced by their new upstream version, and beside a changed copy the new version is written as
    ``NN_topic.updated.ipynb``. A folder that holds anything but is no workspace is refused (``ValueError``), as
    are the checkout, its own folders and the home folder. Nothing is ever deleted.
    ``lang`` is the edition (labkit.i18n.LANGUAGES): ``"zh"`` copies ``notebooks/zh/``, and the marker records it, so
    that labkit speaks that language in the workspace; a workspace of another edition is refused (``ValueError``).
    Returns a :class:`WorkspaceReport` with one line per change. Introduced in notebook 00.
    """
    if not isinstance(lang, str) or lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {', '.join(LANGUAGES)}, got {safe_repr(lang)}")
    root_p = _path_arg(root, "root").resolve()
    notebooks = _edition_notebooks(root_p, lang)
    if not notebooks:
        raise ValueError(f"{root_p} does not look like the workbook checkout: no notebooks/NN_*.ipynb")
    dest_p = root_p / DEFAULT_DIR if dest is None else _path_arg(dest, "dest")
    dest_p = dest_p.parent.resolve() / dest_p.name if dest_p.name not in ("", ".", "..") else dest_p.resolve()
    if dest_p.is_symlink():
        dest_p = dest_p.resolve()
    _check_places(root_p, dest_p)
    if dest_p.exists() and not dest_p.is_dir():
        raise ValueError(f"workspace {dest_p} is an existing file, not a folder; choose another --dir")
    files = _read_marker(dest_p) if dest_p.is_dir() else None
    created = files is None
    if not created and edition_of(dest_p) != lang:  # the edition its marker records (none: English)
        raise ValueError(f"{dest_p} is a workspace of the {edition_of(dest_p)!r} edition, not {lang!r}; choose "
                         f"another folder for it (make lab LAB_LANG={lang} WORKSPACE=...); nothing was changed")
    if created and dest_p.is_dir():
        found = sorted(p.name for p in dest_p.iterdir())
        if found:
            more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
            raise ValueError(f"{dest_p} exists and is not a labkit workspace (it has no {MARKER}): it holds "
                             f"{', '.join(found[:5])}{more}; choose another folder (make lab WORKSPACE=..., or "
                             "python -m labkit workspace --dir ...), or move this one aside; nothing was changed")
    files = dict(files or {})
    dest_p.mkdir(parents=True, exist_ok=True)
    log = _Log()
    for nb in notebooks:
        link = _link(dest_p, nb)
        _place(dest_p, nb.name, workspace_notebook(nb, link, lang), files, log)
    solutions = any("BEGIN SOLUTION" in p.read_text(encoding="utf-8", errors="replace") for p in notebooks)
    _place(dest_p, "README.md", _readme(dest_p, root_p, [p.name for p in notebooks], solutions), files, log)
    if root_p not in dest_p.parents:  # outside the checkout: notebooks need what they read beside them
        for rel, src in _support_files(root_p):
            _place(dest_p, rel, src.read_bytes(), files, log, like=src)
    if created:
        log.lines.insert(0, f"created your workspace {dest_p} ({len(notebooks)} notebooks without the solutions; "
                            f"the reference notebooks stay in {root_p / 'notebooks'})")
    else:
        for rel in log.copied:
            line = f"{(Path(dest_p.name) / rel).as_posix()}: "
            if not any(ln.startswith(line) for ln in log.lines):
                log.lines.append(line + "new upstream; copied in")
    doc = {"about": _ABOUT, "format": _FORMAT, "kind": _KIND, "lang": lang, "root": str(root_p),
           "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": dict(sorted(files.items()))}
    _write_atomic(dest_p / MARKER, (json.dumps(doc, indent=1) + "\n").encode())
    if not log.lines:
        log.lines.append(f"your workspace {dest_p} is up to date ({len(notebooks)} notebooks)")
    return WorkspaceReport(dest_p, created, tuple(log.lines), tuple(log.copied), tuple(log.replaced),
                           tuple(log.beside), tuple(log.waiting), log.unchanged)
