"""Command line: ``python -m labkit doctor [--json]``, ``student-build [--tree]``, ``workspace``, ``progress
[--export]`` and ``class-report``."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the labkit command line and return its exit status. Introduced in notebook 00."""
    from labkit import _cli, i18n

    ap = _cli.ArgumentParser(prog="python -m labkit", description="labkit workbook helpers",
                             checks=[lambda ns: _cli.device_env(ns) if ns.cmd == "doctor" else None])
    sub = ap.add_subparsers(dest="cmd", required=True)
    doc = sub.add_parser("doctor", help="print versions, device capabilities and relevant settings")
    doc.add_argument("--json", action="store_true", help="print the report as JSON")
    stu = sub.add_parser("student-build",
                         help="write the notebooks without solutions (--tree: a whole student tree)")
    stu.add_argument("--src", default=None,
                     help="the instructor notebooks (default: notebooks); not with --tree")
    stu.add_argument("--out", default="dist/student",
                     help="a new or empty folder, or an earlier student build")
    stu.add_argument("--tree", action="store_true",
                     help="write everything a student needs (README, notebooks/, slurm/) and no solution")
    stu.add_argument("--root", default=None, help="with --tree: the workbook checkout (default: .)")
    stu.add_argument("--force", action="store_true",
                     help="move a folder that is not an earlier build aside to OUT.replaced-<time> "
                          "(nothing is deleted)")
    wsp = sub.add_parser("workspace",
                         help="create or update your workspace (work/): the notebooks without solutions; never "
                              "overwrites your edits (make lab runs it)")
    wsp.add_argument("--root", default=".", help="the workbook checkout (default: .)")
    wsp.add_argument("--dir", default=None, help="the workspace folder (default: ROOT/work)")
    wsp.add_argument("--lang", default="en", choices=list(i18n.LANGUAGES),
                     help="the edition to copy: en (notebooks/) or zh (notebooks/zh/, the Chinese edition)")
    lbs = sub.add_parser("lab-settings", help="write a JupyterLab settings folder whose UI language is the edition's "
                                              "(make lab LAB_LANG=zh uses it for that run)")
    lbs.add_argument("--lang", required=True, choices=list(i18n.LANGUAGES))
    lbs.add_argument("--dir", required=True, help="the settings folder (JUPYTERLAB_SETTINGS_DIR)")
    prg = sub.add_parser("progress", help="show which exercises you have solved (your local progress record)")
    prg.add_argument("--file", default=None,
                     help="the progress record (default: the workspace's, or ./work's, else your per-user file)")
    prg.add_argument("--json", action="store_true", help="print the record as JSON")
    prg.add_argument("--export", action="store_true",
                     help="write the record as a results file for your class (attempts, first solved, solution "
                          "shown, labkit version): to --to, else ~/labkit-results.json")
    prg.add_argument("--to", default=None,
                     help="with --export: the class's results folder (writes <login>.json there) or a .json file")
    rep = sub.add_parser("class-report",
                         help="instructor: gather the class's results files into class-results.csv and .html")
    rep.add_argument("sources", nargs="+",
                     help="folders of results files, files, or glob patterns such as '/home/*/labkit-results.json'")
    rep.add_argument("--out", default="class-report", help="the folder to write the two files to (default: "
                                                          "class-report)")
    args = ap.parse_args(argv)
    if args.cmd == "class-report":
        return _class_report(args)
    if args.cmd == "progress" and args.to is not None and not args.export:
        prg.error("--to goes with --export")
    if args.cmd == "workspace":
        return _workspace(args)
    if args.cmd == "lab-settings":
        from labkit.workspace import lab_settings

        try:
            print(f"lab-settings: {lab_settings(args.lang, args.dir)}")
        except (ValueError, OSError) as e:
            print(f"python -m labkit lab-settings: error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.cmd == "progress":
        return _progress(args)
    if args.cmd == "student-build":
        if args.tree and args.src is not None:
            stu.error("--src is for the notebooks-only build; with --tree give the checkout as --root")
        if not args.tree and args.root is not None:
            stu.error("--root goes with --tree")
        return _student_build(args)
    if args.cmd == "doctor":
        from labkit import env

        r = env.report()
        print(json.dumps(r, indent=2, default=str) if args.json else env.format_report(r))
        return 0
    return 2  # pragma: no cover - argparse rejects unknown commands


def _student_build(args: argparse.Namespace) -> int:
    """Run ``student-build``: print what was written, or one line saying why not (exit status 2).

    Introduced in notebook 00.
    """
    from labkit.student import build_student, build_student_tree

    try:
        if args.tree:
            rep = build_student_tree(args.root or ".", args.out, force=args.force)
        else:
            rep = build_student(args.src or "notebooks", args.out, force=args.force)
    except (ValueError, OSError) as e:
        print(f"python -m labkit student-build: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    for name, n in rep.removed.items():
        print(f"{name}: {n} solution block{'s' if n != 1 else ''} removed")
    if rep.moved_aside is not None:
        print(f"moved what was in {rep.out_dir} before to {rep.moved_aside} (nothing deleted)")
    what = f"a student tree ({len(rep.files)} files)" if args.tree else f"{len(rep.removed)} notebooks"
    print(f"wrote {what} to {rep.out_dir}")
    return 0


def _workspace(args: argparse.Namespace) -> int:
    """Run ``workspace``: one line per change, or one line saying why not (exit status 2).

    Introduced in notebook 00.
    """
    from labkit.workspace import update_workspace

    try:
        rep = update_workspace(args.root, args.dir, args.lang)
    except (ValueError, OSError) as e:
        print(f"python -m labkit workspace: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    for line in rep.lines:
        print(f"workspace: {line}")
    return 0


def _progress(args: argparse.Namespace) -> int:
    """Run ``progress``: the per-notebook view of the progress record (``--json``: the record itself).

    Without ``--file`` and ``LABKIT_PROGRESS``, run from the checkout it reads the workspace's record: ``./work``'s,
    or ``./work-zh``'s (the Chinese edition's, which it then reports in Chinese); with both, the locale's.
    Introduced in notebook 00.
    """
    import os
    from pathlib import Path

    from labkit import check, i18n
    from labkit.i18n import gettext as _
    from labkit.workspace import EDITION_DIRS, MARKER, PROGRESS_FILE, find_workspace

    path: Path | None
    here = [Path(d) for d in EDITION_DIRS.values() if (Path(d) / MARKER).is_file()]
    if args.file is not None:
        path = Path(args.file).expanduser()
    elif not os.environ.get(check.PROGRESS_ENV, "").strip() and find_workspace() is None and here:
        # run from the checkout: its workspace; with both editions', the one of the locale's language
        named = next((v for v in (os.environ.get(k, "") for k in (i18n.LANG_ENV, "LC_ALL", "LC_MESSAGES", "LANG"))
                      if v.strip()), "")
        want = EDITION_DIRS.get(i18n.normalise(named) or "en")
        chosen = next((d for d in here if d.name == want), here[0])
        path = (chosen / PROGRESS_FILE).absolute()
        if not os.environ.get(i18n.LANG_ENV, "").strip():
            i18n.set_language(i18n.edition_of(chosen))
    else:
        path = check.progress_path()
    if args.export:
        from labkit.classresults import export_record

        if path is None:
            print("python -m labkit progress: error: no progress record here (the reference notebooks, or "
                  "LABKIT_PROGRESS=off): nothing to export", file=sys.stderr)
            return 2
        try:
            out = export_record(args.to, path)
        except (ValueError, OSError) as e:
            print(f"python -m labkit progress: error: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
        print(f"exported {len(check.load_progress(path))} exercises from {path} to {out}")
        return 0
    try:
        record = check.load_progress(path) if path is not None else {}
    except ValueError as e:
        print(f"python -m labkit progress: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"file": None if path is None else str(path), "exercises": record}, indent=1))
        return 0
    if path is None:
        print(_("No progress record here (the reference notebooks, or LABKIT_PROGRESS=off)."))
    else:
        print(_("Your progress (recorded in {file}):").format(file=path) if record else
              _("No exercise checked yet (record: {file}).").format(file=path))
    print(check.format_progress(record))
    return 0


def _class_report(args: argparse.Namespace) -> int:
    """Run ``class-report``: gather the results files, write the CSV and the HTML page, say where (exit 2: why not).

    Introduced in notebook 00.
    """
    from labkit.classresults import gather, write_report

    try:
        res = gather(args.sources)
        csv_path, html_path = write_report(res, args.out)
    except (ValueError, OSError) as e:
        print(f"python -m labkit class-report: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    n = len(res.learners)
    print(f"{n} learner{'s' if n != 1 else ''} ({', '.join(sorted(res.learners))}); {len(res.skipped)} file(s) "
          f"skipped; wrote {csv_path} and {html_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
