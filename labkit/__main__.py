"""Command line: ``python -m labkit doctor [--json]``."""

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
    stu = sub.add_parser("student-build", help="write notebooks without solutions to dist/student/")
    stu.add_argument("--src", default="notebooks")
    stu.add_argument("--out", default="dist/student")
    args = ap.parse_args(argv)
    if args.cmd == "student-build":
        from labkit.student import build_student

        rep = build_student(args.src, args.out)
        for name, n in rep.removed.items():
            print(f"{name}: {n} solution block{'s' if n != 1 else ''} removed")
        print(f"wrote {len(rep.removed)} notebooks to {rep.out_dir}")
        return 0
    if args.cmd == "doctor":
        from labkit import env

        r = env.report()
        print(json.dumps(r, indent=2, default=str) if args.json else env.format_report(r))
        return 0
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
