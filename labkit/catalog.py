"""The map of the workbook: every notebook with what it teaches and how it behaves on CPU vs GPU.

The README's notebook map and notebook 00's table are both generated from ``NOTEBOOKS``;
``tests/test_repo.py`` checks that they, and the files in notebooks/, agree.
Regenerate the README block with ``python -m labkit.catalog --readme``.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COVERAGE_FILE", "NOTEBOOKS", "Notebook", "Topic", "available", "coverage_table", "load_coverage",
           "markdown_table", "update_readme"]


@dataclass(frozen=True)
class Notebook:
    """One notebook: number, file stem, title, what it teaches, CPU and GPU behaviour, bottleneck.

    Introduced in notebook 00.
    """

    number: str
    stem: str
    title: str
    teaches: str
    cpu: str
    gpu: str
    bottleneck: str
    available: bool = False

    @property
    def filename(self) -> str:
        """The notebook's file name in notebooks/."""
        return f"{self.stem}.ipynb"


NOTEBOOKS: list[Notebook] = [
    Notebook("00", "00_environment", "Environment check",
             "how to use the workbook, the doctor report, your device tier, the three HPC bottlenecks",
             "full", "reports GPU, CUDA, NCCL, TF32 and fp8 support", "all three", True),
    Notebook("01", "01_float_bit_layouts", "Float bit layouts",
             "FP64/FP32/TF32/FP16/BF16/FP8 bits, range vs precision, an interactive bit explorer",
             "full (pure Python + torch/ml_dtypes casts)", "same", "compute", True),
    Notebook("02", "02_underflow_overflow_rounding", "Underflow, overflow, rounding",
             "subnormals, flush to zero, overflow to inf, ties to even, swamping, why FP32 master weights",
             "full", "same", "compute", True),
    Notebook("03", "03_loss_scaling", "Loss scaling",
             "real gradients underflowing in fp16, static and dynamic loss scaling, GradScaler step order, "
             "finding the first NaN",
             "full (fp16 autocast + GradScaler('cpu'))", "same with CUDA autocast", "compute", True),
    Notebook("04", "04_amp_training", "AMP training",
             "the torch.amp recipe, which ops run in which dtype, fp16/bf16/pure-half training compared",
             "full (CPU autocast)", "CUDA autocast op table and timings", "compute", True),
    Notebook("05", "05_bf16_tf32_fp8", "BF16, TF32, FP8",
             "bf16 vs fp16 training, TF32 emulated and measured, FP8 scaling with amax history",
             "TF32 emulated, fp8 casts + _scaled_mm", "real TF32 timing, fp8 matmul on cc >= 8.9", "compute", True),
    Notebook("06", "06_memory", "Where memory goes",
             "params, grads, master weights, optimizer states, activations; ZeRO memory model; "
             "memory that does not drop",
             "exact tensor bytes", "torch.cuda peak memory", "memory", True),
    Notebook("07", "07_profiling_and_fusion", "Profiling and fusion",
             "torch.profiler, launch overhead, fusion and torch.compile, roofline, utilisation and MFU",
             "CPU profiler and roofline", "CUDA time columns, GPU roofline", "memory bandwidth", True),
    Notebook("08", "08_ddp", "DDP and communication",
             "data parallelism, all-reduce, gradient accumulation, torchrun from a notebook",
             "2 ranks on gloo", "NCCL", "communication", True),
    Notebook("09", "09_deepspeed_zero", "DeepSpeed and ZeRO",
             "ZeRO stages 0-3 in bf16/fp16, per-rank memory vs the model, offload",
             "DeepSpeed CPU accelerator, gloo", "CUDA + NCCL", "memory + communication", True),
    Notebook("10", "10_cluster_workflow", "Working on a cluster",
             "Slurm, JupyterLab on a compute node, multi-node DDP and DeepSpeed jobs",
             "full; live sinfo/sbatch/srun/scancel where a Slurm is reachable", "the same scripts on GPU nodes",
             "communication", True),
]


def available() -> list[Notebook]:
    """Return the notebooks that exist in this version of the workbook. Introduced in notebook 00."""
    return [n for n in NOTEBOOKS if n.available]


def markdown_table(notebooks: list[Notebook] | None = None) -> str:
    """Return the notebook map as a Markdown table (number, title, teaches, CPU, GPU).

    Introduced in notebook 00.
    """
    rows = ["| # | Notebook | What it teaches | On CPU | On a GPU |", "|---|---|---|---|---|"]
    for n in notebooks if notebooks is not None else available():
        rows.append(f"| {n.number} | [{n.title}](notebooks/{n.filename}) | {n.teaches} | {n.cpu} | {n.gpu} |")
    return "\n".join(rows)


#: The seed-coverage data file: each topic the workbook should teach, and the notebook sections that do.
COVERAGE_FILE = Path(__file__).resolve().parents[1] / "docs" / "seed_coverage.toml"


@dataclass(frozen=True)
class Topic:
    """One seed topic: its name, the (notebook, heading) sections that teach it, and a note on any gap.

    ``status`` is "covered", "partial" (taught in part; the note says what is missing) or "open" (no
    section teaches it). Introduced in notebook 00.
    """

    name: str
    sections: tuple[tuple[str, str], ...]
    partial: bool = False
    note: str = ""

    @property
    def status(self) -> str:
        """ "covered", "partial" or "open"."""
        if not self.sections:
            return "open"
        return "partial" if self.partial else "covered"


def load_coverage(path: str | Path | None = None) -> list[Topic]:
    """Read the seed-coverage file (default ``docs/seed_coverage.toml``) into a list of :class:`Topic`.

    Needs Python >= 3.11 (``tomllib``; on 3.10 the ``tomli`` package). Raises ``FileNotFoundError`` if
    the file is missing and ``ValueError`` (or ``TypeError``) for a malformed entry.
    Introduced in notebook 00.
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10: the same parser as the tomli package
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise RuntimeError("reading docs/seed_coverage.toml needs Python >= 3.11 (tomllib) or the "
                               "tomli package on Python 3.10") from None
    p = Path(path) if path is not None else COVERAGE_FILE
    if not p.is_file():
        raise FileNotFoundError(f"no seed-coverage file at {p} (it lives in the repository's docs/)")
    data = tomllib.loads(p.read_text())
    topics = []
    for i, t in enumerate(data.get("topic", [])):
        if not isinstance(t.get("name"), str) or not isinstance(t.get("sections"), list):
            raise TypeError(f"{p}: topic #{i + 1} needs a name (str) and sections (a list)")
        secs = []
        for sec in t["sections"]:
            if set(sec) != {"notebook", "heading"}:
                raise ValueError(f"{p}: {t['name']!r}: each section is {{notebook = 'NN', heading = '...'}}")
            secs.append((str(sec["notebook"]), str(sec["heading"])))
        if not secs and t.get("partial"):
            raise ValueError(f"{p}: {t['name']!r} is partial but lists no section")
        if (t.get("partial") or not secs) and not t.get("note"):
            raise ValueError(f"{p}: {t['name']!r}: a partial or open topic needs a note saying what is missing")
        topics.append(Topic(t["name"], tuple(secs), bool(t.get("partial", False)), str(t.get("note", ""))))
    if not topics:
        raise ValueError(f"{p} lists no [[topic]]")
    return topics


def _anchor(heading: str) -> str:
    """The GitHub/JupyterLab anchor of a Markdown heading (lower case, punctuation dropped, spaces to -)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def coverage_table(topics: list[Topic] | None = None) -> str:
    """Return the seed-coverage map as a Markdown table: topic, status, the sections that teach it, the gap.

    Introduced in notebook 00.
    """
    stems = {n.number: n for n in NOTEBOOKS}
    rows = ["| Topic | Status | Where it is taught | Not yet taught |", "|---|---|---|---|"]
    for t in topics if topics is not None else load_coverage():
        where = []
        for nb, heading in t.sections:
            text = heading.replace("|", "\\|")
            link = f"notebooks/{stems[nb].filename}#{_anchor(heading)}" if nb in stems else ""
            where.append(f"{nb} [{text}]({link})" if link else f"{nb} {text}")
        gap = t.note.replace("|", "\\|")
        rows.append(f"| {t.name} | {t.status} | {'<br>'.join(where) or '—'} | {gap} |")
    return "\n".join(rows)


_START, _END = "<!-- notebook-map:start -->", "<!-- notebook-map:end -->"
_COV_START, _COV_END = "<!-- seed-coverage:start -->", "<!-- seed-coverage:end -->"


def update_readme(path: str | Path = "README.md") -> bool:
    """Rewrite the README's notebook map (and its seed-coverage block, if it has one); return True if changed.

    Introduced in notebook 00.
    """
    p = Path(path)
    text = p.read_text()
    if _START not in text or _END not in text:
        raise ValueError(f"{p} has no {_START} ... {_END} block")
    nb_map = _START + "\n" + markdown_table() + "\n" + _END
    new = re.sub(re.escape(_START) + ".*?" + re.escape(_END), lambda m: nb_map,
                 text, flags=re.DOTALL)
    if _COV_START in new and _COV_END in new:
        block = _COV_START + "\n" + coverage_table() + "\n" + _COV_END
        new = re.sub(re.escape(_COV_START) + ".*?" + re.escape(_COV_END), lambda m: block, new, flags=re.DOTALL)
    if new != text:
        p.write_text(new)
    return new != text


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="print or update the notebook map")
    ap.add_argument("--readme", nargs="?", const="README.md",
                    help="rewrite the notebook map and the seed-coverage block in this README")
    a = ap.parse_args()
    if a.readme:
        print("updated" if update_readme(a.readme) else "already current")
    else:
        print(markdown_table())
    sys.exit(0)
