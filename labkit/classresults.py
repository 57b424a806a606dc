"""Class results: each learner exports their progress record; the instructor gathers them into one table.

A learner runs ``python -m labkit progress --export --to FOLDER`` (or calls :func:`export_record`): their progress
record (:func:`labkit.check.load_progress`: every exercise tried, its attempts, when it was first solved, whether the
worked solution was shown) is written to ``FOLDER/<login>.json`` with the labkit version and the time. The folder is
the class's drop box: writable by the students, listable only by the instructor (``chmod 1733``; see
docs/instructor.md). Without ``--to`` the file is ``~/labkit-results.json``, where an instructor who can read the
homes finds it (``/home/*/labkit-results.json``).

The instructor runs ``python -m labkit class-report SOURCE... --out DIR`` (:func:`gather` then
:func:`write_report`): every results file found (a folder's ``*.json``, a file, or a glob pattern) becomes one row
per learner and exercise in ``DIR/class-results.csv``, and ``DIR/class-results.html`` shows, per notebook, a plot of
each exercise: how many solved it without the solution, solved it after seeing it, tried without solving; with the
mean attempts to the first ✓. Each learner is named by the login that **owns** the file (a file cannot be written
under someone else's name); a file whose name or content claims another login is listed under its owner, with one
printed line saying so. Files are only read: regular files of at most 1 MiB, JSON only (never pickle), a damaged
one skipped with one line. Introduced in notebook 00.
"""

from __future__ import annotations

import base64
import csv
import glob
import html
import io
import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit._validate import safe_repr

__all__ = ["KIND", "RESULTS_FILE", "ClassResults", "LearnerRecord", "export_record", "gather", "write_report"]

#: What a results file says it is (``"kind"``), and its format.
KIND = "labkit-results"
_FORMAT = 2
#: Where :func:`export_record` writes without a destination: the learner's home.
RESULTS_FILE = "labkit-results.json"
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_STATUSES = ("correct", "wrong", "not attempted")
#: The fields of an exercise's entry that a results file carries (those :func:`labkit.check.load_progress` has).
_FIELDS: dict[str, type] = {"status": str, "attempts": int, "solved": str, "solution_seen": bool,
                            "solved_after_solution": bool}


def _login() -> str:
    import getpass

    return getpass.getuser()


def _owner(st: os.stat_result) -> str:
    """The login that owns a file (``uid<N>`` where the uid has no passwd entry, e.g. in a container)."""
    try:
        import pwd  # POSIX only: the instructor's report runs on the cluster
    except ImportError:  # pragma: no cover - Windows
        return f"uid{st.st_uid}"
    try:
        return pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        return f"uid{st.st_uid}"


def _entries(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The known exercises of a record, with only the fields a results file carries, typed as they must be."""
    from labkit.exercises import all_exercises

    known = set(all_exercises())
    out: dict[str, dict[str, Any]] = {}
    for ex_id, entry in record.items():
        if ex_id not in known or not isinstance(entry, dict):
            continue
        kept = {k: entry[k] for k, kind in _FIELDS.items() if isinstance(entry.get(k), kind)
                and not (kind is int and isinstance(entry[k], bool))}
        if kept.get("status") not in _STATUSES:
            kept["status"] = "not attempted"
        out[ex_id] = kept
    return dict(sorted(out.items()))


def export_record(to: str | Path | None = None, record: str | Path | None = None) -> Path:
    """Write this learner's progress record as a results file for the class; return the file's path.

    ``to`` is a folder (the file is ``<login>.json`` in it: the class's drop box) or a file ending in ``.json``;
    ``None`` means ``~/labkit-results.json``. ``record`` is the progress record to read (default: the one
    :func:`labkit.check.progress_path` names). The file holds, per exercise tried: the status, the attempts, when it
    was first solved, whether the solution was shown; and the login, the labkit version and the time. It is written
    atomically, mode 0644; an existing file is replaced only if it is a results file (anything else raises
    ``ValueError`` and is left as it is). Raises ``ValueError`` for a record that cannot be read.
    Introduced in notebook 00.
    """
    from labkit import __version__, check

    if to is not None and not isinstance(to, (str, os.PathLike)):
        raise TypeError(f"to must be a folder or a .json file (str or Path) or None, got {type(to).__name__}")
    login = _login()
    if not _NAME_OK.match(login):
        raise ValueError(f"the login {safe_repr(login)} cannot name a file")
    data = check.load_progress(record)
    target = Path.home() / RESULTS_FILE if to is None else Path(to).expanduser()
    if target.suffix != ".json":
        if not target.is_dir():
            raise ValueError(f"{target} is not a folder (give the class's results folder, or a .json file)")
        target = target / f"{login}.json"
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise ValueError(f"{target} is not a regular file; not writing there")
    if target.exists():
        try:
            old = check._parse_json(check._read_small_file(target))
        except (OSError, ValueError):
            old = None
        if not (isinstance(old, dict) and (old.get("kind") == KIND or isinstance(old.get("results"), dict))):
            raise ValueError(f"{target} exists and is not a labkit results file; not overwriting it")
    doc = {"kind": KIND, "format": _FORMAT, "login": login, "labkit": __version__,
           "exported": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "exercises": _entries(data)}
    return check._write_public_json(target, doc)


@dataclass(frozen=True)
class LearnerRecord:
    """One learner's exported record: their login (the file's owner), the file, and their exercises."""

    login: str
    path: Path
    exported: str
    labkit: str
    exercises: dict[str, dict[str, Any]]


@dataclass
class ClassResults:
    """What :func:`gather` found: the learners' records, by login, and one line per file it skipped."""

    learners: dict[str, LearnerRecord] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One row per learner and exercise they tried: the CSV's rows."""
        out = []
        for login in sorted(self.learners):
            rec = self.learners[login]
            for ex_id, e in rec.exercises.items():
                out.append({"learner": login, "exercise": ex_id, "status": e.get("status", "not attempted"),
                            "attempts": e.get("attempts", 0), "first_solved": e.get("solved", ""),
                            "solution_shown": bool(e.get("solution_seen")),
                            "solved_after_solution": bool(e.get("solved_after_solution")),
                            "labkit": rec.labkit, "exported": rec.exported})
        return out

    def summary(self) -> dict[str, dict[str, float]]:
        """Per exercise (every exercise of the workbook): learners who solved it on their own, solved it after the
        solution, tried without solving, and the mean attempts of those who solved it."""
        from labkit.exercises import all_exercises

        out = {}
        for ex_id in all_exercises():
            entries = [r.exercises[ex_id] for r in self.learners.values() if ex_id in r.exercises]
            solved = [e for e in entries if e.get("status") == "correct"]
            after = [e for e in solved if e.get("solved_after_solution")]
            out[ex_id] = {"solved": len(solved) - len(after), "solved_after_solution": len(after),
                          "tried_not_solved": sum(e.get("status") == "wrong" for e in entries),
                          "solution_shown": sum(bool(e.get("solution_seen")) for e in entries),
                          "mean_attempts": (sum(e.get("attempts", 0) for e in solved) / len(solved)) if solved else 0.0}
        return out


def _files(sources: Iterable[str | Path]) -> list[Path]:
    found: list[Path] = []
    for src in sources:
        if not isinstance(src, (str, os.PathLike)):
            raise TypeError(f"each source is a folder, a file or a glob pattern, got {type(src).__name__}")
        text = os.fspath(src)
        p = Path(text).expanduser()
        if p.is_dir():
            found += sorted(p.glob("*.json"))
        elif any(ch in text for ch in "*?["):
            found += sorted(Path(m) for m in glob.glob(os.path.expanduser(text)))
        elif p.exists():
            found.append(p)
        else:
            raise ValueError(f"{text}: no such folder or file (and not a glob pattern)")
    return list(dict.fromkeys(found))


def gather(sources: Iterable[str | Path]) -> ClassResults:
    """Read every results file in ``sources`` (folders, files, glob patterns) into a :class:`ClassResults`.

    Each learner is the login that owns the file. A file that is not a regular file (a link, a FIFO, a folder), is
    larger than 1 MiB, is not JSON or not a results file is skipped with one line in ``skipped`` (and printed). Two
    files of one owner: the one exported last counts. Nothing is written. Introduced in notebook 00.
    """
    from labkit import check

    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    out = ClassResults()

    def skip(path: Path, why: str) -> None:
        line = " ".join(f"(class-report: skipped {path}: {why})".split())
        out.skipped.append(line)
        print(line)

    for path in _files(sources):
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                skip(path, "not a regular file")
                continue
            doc = check._parse_json(check._read_small_file(path))
        except (OSError, ValueError) as e:
            skip(path, str(e))
            continue
        if not isinstance(doc, dict) or doc.get("kind") != KIND or not isinstance(doc.get("exercises"), dict):
            skip(path, "not a labkit results file (python -m labkit progress --export writes them)")
            continue
        owner = _owner(st)
        claimed = {str(doc.get("login", owner)), path.stem if path.name != RESULTS_FILE else owner}
        if claimed != {owner}:
            print(" ".join(f"(class-report: {path} names {sorted(claimed - {owner})!r:.80}; listed under its owner, "
                           f"{owner})".split()))
        exported = doc.get("exported") if isinstance(doc.get("exported"), str) else ""
        rec = LearnerRecord(owner, path, exported, str(doc.get("labkit", "?"))[:32], _entries(doc["exercises"]))
        if owner not in out.learners or exported >= out.learners[owner].exported:
            out.learners[owner] = rec
    return out


def _figure(nb: str, ids: list[str], summary: dict[str, dict[str, float]], n: int) -> str:
    """One notebook's plot, a base64 PNG: a stacked bar per exercise."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 0.35 * len(ids) + 1.0))  # no pyplot: the caller's backend is left alone
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    left = [0.0] * len(ids)
    for key, label, color in (("solved", "solved", "#2a9d8f"),
                              ("solved_after_solution", "solved after the solution", "#e9c46a"),
                              ("tried_not_solved", "tried, not solved", "#e76f51")):
        vals = [summary[i][key] for i in ids]
        ax.barh(ids, vals, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_xlim(0, max(n, 1))
    ax.invert_yaxis()
    ax.set_xlabel(f"learners (of {n})")
    ax.set_title(f"Notebook {nb}")
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def write_report(results: ClassResults, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``class-results.csv`` and ``class-results.html`` into ``out_dir`` (created if needed); return both paths.

    The CSV has one row per learner and exercise tried (:meth:`ClassResults.rows`); the HTML page, per notebook, a
    plot and a table per exercise (solved, solved after the solution, tried and not solved, solution shown, mean
    attempts to the first ✓), the learners, and the skipped files. Every text from a file is escaped. Only these two
    files are written. Introduced in notebook 00.
    """
    if not isinstance(results, ClassResults):
        raise TypeError(f"results must be what gather() returns, got {type(results).__name__}")
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"out_dir must be a folder's path (str or Path), got {type(out_dir).__name__}")
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    rows = results.rows()
    csv_path, html_path = out / "class-results.csv", out / "class-results.html"
    cols = ["learner", "exercise", "status", "attempts", "first_solved", "solution_shown", "solved_after_solution",
            "labkit", "exported"]
    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    summary, n = results.summary(), len(results.learners)
    by_nb: dict[str, list[str]] = {}
    for ex_id in summary:
        by_nb.setdefault(ex_id.split(".")[0], []).append(ex_id)
    e = html.escape
    parts = ["<!doctype html><meta charset='utf-8'><title>labkit class results</title>",
             "<style>body{font-family:sans-serif;max-width:60em}td,th{padding:2px 8px;text-align:right}"
             "td:first-child,th:first-child{text-align:left}</style>",
             f"<h1>labkit class results</h1><p>{n} learner{'s' if n != 1 else ''}: "
             f"{e(', '.join(sorted(results.learners)))}</p>"]
    for nb, ids in sorted(by_nb.items()):
        if not any(summary[i]["solved"] + summary[i]["solved_after_solution"] + summary[i]["tried_not_solved"]
                   for i in ids):
            continue
        parts.append(f"<h2>Notebook {e(nb)}</h2><img alt='notebook {e(nb)}' "
                     f"src='data:image/png;base64,{_figure(nb, ids, summary, n)}'>")
        parts.append("<table><tr><th>exercise</th><th>solved</th><th>after the solution</th><th>tried, not solved"
                     "</th><th>solution shown</th><th>mean attempts to ✓</th></tr>")
        for i in ids:
            s = summary[i]
            parts.append(f"<tr><td>{e(i)}</td><td>{s['solved']:g}</td><td>{s['solved_after_solution']:g}</td>"
                         f"<td>{s['tried_not_solved']:g}</td><td>{s['solution_shown']:g}</td>"
                         f"<td>{s['mean_attempts']:.1f}</td></tr>")
        parts.append("</table>")
    if results.skipped:
        parts.append("<h2>Skipped files</h2><ul>" + "".join(f"<li>{e(s)}</li>" for s in results.skipped) + "</ul>")
    html_path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return csv_path, html_path
