"""How long each notebook takes a learner, estimated from what it holds; the notebooks state these figures.

    python tools/pacing.py            # per notebook: the stated time against the model, core and stretch
    python tools/pacing.py --check    # exit 1 where a stated time is off the model by more than 5 minutes

The model, in minutes (the same for every notebook, so the figures can be compared and summed):

- reading: markdown words / 130 (technical prose, read closely), code lines shown / 12, output lines / 40;
- exercises: implement 8, debug 6 (a clinic's cause or fix, a choice among listed options: 3), design 4,
  compute 3, predict 2, recall 1.5 (the learner's thinking and typing; a wrong try costs more); the few kernels
  and parallel steps written from scratch take longer (``HEAVY``);
- running: nothing extra (each notebook runs in one to two minutes on 2 cores, while its text is read).

A section whose heading has "Stretch", or whose text starts with ``**Stretch.**``, is stretch: optional,
counted apart. The stated line in each notebook's
header reads ``**Estimated time:** T min`` (T = core + stretch), followed, where a notebook has stretch sections,
by ``(core C min, stretch S min)``. This is a model, not a measurement: a class's progress records (first-✓ times,
``python -m labkit.classresults``) are the measurement to recalibrate it against.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WPM, CODE_LPM, OUT_LPM = 130, 12, 40
EXERCISE_MIN = {"implement": 8.0, "debug": 6.0, "design": 4.0, "compute": 3.0, "predict": 2.0, "recall": 1.5}
CHOICE_MIN = 3.0  # a clinic's cause (one of four) or its fix (one setting)
#: Exercises that write a whole kernel or parallel step: minutes each, instead of their kind's.
HEAVY = {"08.flash-attention": 25.0, "11.zero1-step": 20.0, "11.gpipe": 25.0, "11.ddp-overlap": 15.0}
STRETCH_MARK = "**Stretch.**"  # the first words of a stretch section (or "Stretch" in its heading)
STATED = re.compile(r"\*\*Estimated time:\*\* (\d+) min(?: \(core (\d+) min, stretch (\d+) min\))?")


@dataclass
class Estimate:
    notebook: str
    core: float
    stretch: float
    stated: tuple[int, int | None, int | None] | None

    @property
    def total(self) -> float:
        return self.core + self.stretch


def _exercise_minutes(ex_id: str, kind: str) -> float:
    if ex_id in HEAVY:
        return HEAVY[ex_id]
    if ex_id.startswith("13.") and ex_id.endswith(("-cause", "-fix")):
        return CHOICE_MIN
    return EXERCISE_MIN[kind]


def estimate(path: Path) -> Estimate:
    """The model's minutes for one stored notebook, core and stretch."""
    from labkit.exercises import all_exercises

    nb = json.loads(path.read_text())
    kinds = {i: e.kind for i, e in all_exercises().items()}
    minutes = {"core": 0.0, "stretch": 0.0}
    part = "core"
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            heading = re.search(r"^## (.*)$", src, re.M)
            if heading:
                body = src[heading.end():].lstrip()
                part = "stretch" if "stretch" in heading.group(1).lower() or body.startswith(STRETCH_MARK) else "core"
            minutes[part] += len(src.split()) / WPM
            continue
        shown = re.sub(r"### BEGIN SOLUTION.*?### END SOLUTION", "", src, flags=re.S)
        minutes[part] += sum(1 for ln in shown.splitlines() if ln.strip() and not ln.strip().startswith("#")) / CODE_LPM
        out = sum(len("".join(o.get("text", "")).splitlines()) for o in cell.get("outputs", []))
        minutes[part] += out / OUT_LPM
        for ex_id in re.findall(r"(?:check|predict)\(\"(\d\d\.[\w-]+)\"", src):
            minutes[part] += _exercise_minutes(ex_id, kinds[ex_id])
    header = "".join("".join(c["source"]) for c in nb["cells"][:3])
    m = STATED.search(header)
    stated = None if m is None else (int(m.group(1)), *(int(g) if g else None for g in m.groups()[1:]))
    return Estimate(path.name, minutes["core"], minutes["stretch"], stated)


def rounded(x: float) -> int:
    """Minutes as a notebook states them: to the nearest 5, at least 5."""
    return max(5, int(5 * round(x / 5)))


def problems(e: Estimate, slack: float = 5.0) -> list[str]:
    """What is off between a notebook's stated time and the model (empty when it agrees within ``slack`` min)."""
    if e.stated is None:
        return [f"{e.notebook}: no '**Estimated time:** N min' line in its header"]
    total, core, stretch = e.stated
    out = []
    if abs(total - e.total) > slack:
        out.append(f"{e.notebook}: states {total} min, the model {e.total:.0f}")
    if e.stretch and (core is None or stretch is None):
        out.append(f"{e.notebook}: has stretch sections ({e.stretch:.0f} min) but states no core/stretch split")
    if core is not None and (abs(core - e.core) > slack or abs(stretch - e.stretch) > slack or core + stretch != total):
        out.append(f"{e.notebook}: states core {core} + stretch {stretch}, the model {e.core:.0f} + {e.stretch:.0f}")
    if not e.stretch and core is not None:
        out.append(f"{e.notebook}: states a stretch part but has no stretch section")
    return out


def main(argv: list[str] | None = None) -> int:
    from labkit import (
        _cli,  # the model reads labkit's exercise registry anyway: its one-line-error parser too
    )

    ap = _cli.ArgumentParser(prog="pacing.py", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 where a stated time is off the model")
    args = ap.parse_args(argv)
    rows = [estimate(p) for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    bad = []
    print(f"{'notebook':<36} {'stated':>14} {'model':>7} {'core':>6} {'stretch':>8} {'rounded':>18}")
    for e in rows:
        st = "-" if e.stated is None else f"{e.stated[0]}" + (f" ({e.stated[1]}+{e.stated[2]})" if e.stated[1] else "")
        want = f"{rounded(e.core) + (rounded(e.stretch) if e.stretch else 0)}" + (
            f" ({rounded(e.core)}+{rounded(e.stretch)})" if e.stretch else "")
        print(f"{e.notebook:<36} {st:>14} {e.total:7.0f} {e.core:6.0f} {e.stretch:8.0f} {want:>18}")
        bad += problems(e)
    total = sum(e.stated[0] for e in rows if e.stated)
    print(f"stated in all: {total} min = {total / 60:.1f} h; the model: {sum(e.total for e in rows) / 60:.1f} h")
    if args.check and bad:
        print("\n".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
