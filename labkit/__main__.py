"""Command line: ``python -m labkit doctor [--json]`` and ``python -m labkit student-build [--tree]``."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the labkit command line and return its exit status. Introduced in notebook 00."""
    ap = argparse.ArgumentParser(prog="python -m labkit", description="labkit workbook helpers")
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
    args = ap.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
