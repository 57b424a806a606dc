"""The GPU acceptance run: notebooks 03-17 on a CUDA GPU, plus every CUDA-only result, in one report.

    python tools/gpu_check.py [--out DIR] [--notebooks 03,04,...] [--timeout-per-notebook 300] [--budget S]
    make gpu-check

On a machine without a CUDA GPU it says so in one line and exits 0 without running anything. On a GPU it:

1. runs notebooks 03-17 top to bottom with nbclient (in notebooks/, as nbval and JupyterLab do; the stored copies
   are not touched) and records each one's wall time and first error; notebook 08 then runs its Triton kernels
   compiled for the GPU (on a CPU they run in Triton's interpreter);
2. measures what only a GPU can show, with labkit's own functions:
   - the CUDA autocast op table, compared with PyTorch's documented lists (``train.CUDA_AUTOCAST_REFERENCE``);
   - TF32 and FP8 matmul timings (``tf32.time_tf32``, ``fp8.time_fp8_matmul``; ``None`` where the GPU lacks them);
   - NCCL all-reduce bus bandwidth over the GPUs present (``labkit.recipes.allreduce`` under torchrun); with one
     GPU it is not measurable (bus bandwidth is 0 by definition with one rank), and the report says so (ok: None);
   - CUDA peak memory of a tiny-GPT run against ``labkit.memory``'s prediction of its model states;
   - the AMP speed-up over fp32 for a matmul and the tiny-GPT train step (``bench.amp_benchmark``);
   - notebook 08's Triton kernels compiled: each checked against torch (fp32 and bf16), the bf16 cast rounding to
     nearest even, and each timed against torch eager and ``torch.compile`` (``kernelbench.race``), as ratios;
     FlashAttention on bf16 tiles (tensor cores) checked and timed against ``scaled_dot_product_attention``;
3. writes ``gpu-report.json`` and ``gpu-report.md`` to ``--out`` (default: the current folder) after every step
   (the CUDA checks run first, so a lease cut short still reports them) and exits non-zero if any notebook or any
   check failed. ``--budget SECONDS`` bounds the whole run: a notebook that would not fit is reported as not run.

Budget: about 7 minutes on an H200 (03-11 and the checks took 5 min there on 2026-12-04; 09 and 11 the longest).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ("03", "04", "05", "06", "07", "08", "09", "10", "11", "12", "13", "14", "15", "16", "17")


def no_gpu_line() -> str | None:
    """One line saying why nothing runs here, or None when a CUDA GPU is present."""
    try:
        import torch
    except ImportError:
        return "gpu-check: torch is not installed; nothing to run."
    if not torch.cuda.is_available():
        return (f"gpu-check: no CUDA GPU here (torch {torch.__version__}, torch.cuda.is_available() is False); "
                "nothing to run.")
    return None


def failure_summary(text: str, keep: int = 14) -> str:
    """A failed cell, readable in a report: ANSI colours removed, the traceback's frames that point into the
    cell (``----> N`` lines and the lines just before them) and the exception line, at most ``keep`` lines."""
    import re

    lines = [ln.rstrip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines() if ln.strip()]
    if not lines:
        return "(no message)"
    marks = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("---->")]
    picked: list[str] = []
    for i in marks[-3:]:
        picked += lines[max(0, i - 2):i + 1]
    tail = lines[-1]
    return "\n".join([*picked[-(keep - 1):], tail])[:1500]


def run_notebook(path: Path, timeout: int, keep: Path | None = None) -> dict[str, Any]:
    """Execute one notebook in a scratch copy, every cell even after a failure (a lease is short: one run shows
    every failing cell); return its wall time, the first error and the later ones (each a failure_summary)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    errors: list[str] = []
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    except Exception as exc:  # a kernel death or timeout is a result to report, not a crash
        errors.append(f"{type(exc).__name__}: {exc}"[:500])
    if keep is not None:  # the executed copy, outputs and all, for reading a failure at leisure
        keep.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, keep / path.name)
    code = [c for c in nb.cells if c.cell_type == "code"]
    failed = [(i, o) for i, c in enumerate(code, 1) for o in c.get("outputs", []) if o.get("output_type") == "error"]
    cell_errors = [f"code cell {i}: " + failure_summary("\n".join(o.get("traceback", [])) or
                                                       f"{o.get('ename')}: {o.get('evalue')}") for i, o in failed]
    errors = cell_errors + errors
    return {"notebook": path.name, "seconds": round(time.perf_counter() - t0, 1),
            "error": errors[0] if errors else None, "later_errors": errors[1:]}


def cuda_results() -> dict[str, Any]:
    """The CUDA-only measurements; each entry has "ok" and what was measured (or the error)."""
    import torch

    from labkit import bench, fp8, memory, models, tf32, train
    from labkit import device as dev_gate
    from labkit.dist import launch

    dev = torch.device("cuda")
    out: dict[str, Any] = {"device": dev_gate.capabilities(dev).as_dict()}

    def guarded(name: str, fn: Any) -> None:
        try:
            out[name] = fn()
        except Exception:  # every check reports; the exit status says whether all passed
            out[name] = {"ok": False, "error": traceback.format_exc(limit=3)[-1500:]}

    def autocast_table() -> dict[str, Any]:
        kinds = {"low": None, "fp32": torch.float32, "input": None}
        rows, ok = {}, True
        for dt in (torch.float16, torch.bfloat16):
            if not dev_gate.computes(dt, dev):
                continue
            measured = train.autocast_op_dtypes(dev, dt)
            for op, kind in train.CUDA_AUTOCAST_REFERENCE.items():
                want = kinds[kind] or dt
                got = measured[op][1]
                rows[f"{op} {dt}"] = {"documented": str(want), "measured": str(got)}
                ok &= got == want
        return {"ok": ok, "ops": rows}

    def timings() -> dict[str, Any]:
        t = tf32.time_tf32(4096, dev)
        f = fp8.time_fp8_matmul(4096, dev)
        res = {"tf32": None if t is None else {k: t.speedup(k) for k in ("tf32", "bf16")},
               "fp8": None if f is None else {k: f.speedup(k) for k in f.timings if k != f.baseline}}
        return {"ok": True, **res}

    def nccl() -> dict[str, Any]:
        n = torch.cuda.device_count()
        if n < 2:
            return {"ok": None, "gpus": n, "status": "not measurable: bus bandwidth needs 2 or more GPUs "
                    "(with one rank nothing crosses a link, so busbw is 0 by definition)"}
        res = launch("labkit.recipes.allreduce", nproc=n, timeout=300, stream=False,
                     args=["--device", "cuda", "--sizes", "1M,16M,256M", "--iters", "10"])
        rows = res["rows"]
        return {"ok": res["backend"] == "nccl" and all(r["correct"] for r in rows), "gpus": n,
                "busbw_GBps": {r["size"]: r["busbw_GBps"] for r in rows}}

    def peak_memory() -> dict[str, Any]:
        from labkit import data

        task = data.make_token_task("reverse", n=2048, n_digits=6, vocab_size=12, seed=0)
        batches = data.Batches(task.inputs, task.targets, batch_size=64, seed=0)
        model = models.TinyGPT(vocab_size=task.vocab_size, seq_len=task.seq_len, seed=0)
        predicted = sum(memory.predict_torch_state(model, "bf16", "adamw").values())
        r = train.train(model, batches, policy="bf16", steps=5, device=dev, progress=False)
        return {"ok": r.peak_memory is not None and r.peak_memory >= predicted, "peak_bytes": r.peak_memory,
                "predicted_model_state_bytes": predicted, "ratio": (r.peak_memory or 0) / predicted}

    def amp_speedup() -> dict[str, Any]:
        names = [n for n in ("bf16", "fp16") if dev_gate.computes(train.get_policy(n).compute_dtype, dev)]
        res = bench.amp_benchmark(dev, tuple(names))
        mm = {n: res["matmul"].speedup(n) for n in names}
        step = {n: res["train_step"].speedup(n) for n in names}
        return {"ok": all(v > 1.0 for v in mm.values()), "matmul": mm, "train_step": step}

    guarded("autocast_table", autocast_table)
    guarded("matmul_timings", timings)
    guarded("nccl_allreduce", nccl)
    guarded("peak_memory", peak_memory)
    def triton_kernels() -> dict[str, Any]:
        from labkit import kernelbench, kernels

        mode = kernels.setup(dev)
        checks = {f"{n} {d}": kernelbench.verify(n, 64, 1000, d).ok for n in kernelbench.NAMES for d in ("fp32", "bf16")}
        x = kernels.randn(4096, device=dev)
        rne = bool(torch.equal(kernels.cast(x, torch.bfloat16), x.to(torch.bfloat16)))
        timing = {}
        for n in kernelbench.NAMES:
            t = kernelbench.race(n, 4096, 4096, repeats=10)
            timing[n] = {"triton_us": round(t["triton"] * 1e6, 1),
                         **{f"{k} / triton": round(v / t["triton"], 2) for k, v in t.items() if k != "triton"}}
        # FlashAttention compiled: bf16 tiles into tl.dot (tensor cores), against PyTorch's SDPA on the same inputs
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(4, 16, 4096, 64, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
        ours = kernels.flash_attention(q, k, v, block_m=64, block_n=64)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        err = float((ours.float() - ref.float()).abs().max())
        fa = bench.compare({"triton": lambda: kernels.flash_attention(q, k, v, block_m=64, block_n=64),
                            "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)},
                           baseline="triton", device=dev)
        timing["flash_attention bf16 (4x16x4096x64)"] = {
            "triton_us": round(fa.timings["triton"].median * 1e6, 1), "sdpa / triton": round(fa.ratio("sdpa"), 2),
            "max_abs_err_vs_sdpa": err}
        fa_ok = err < 3e-2  # bf16 output: a few ulps of values of order 1
        return {"ok": mode.name == "compiled" and all(checks.values()) and rne and fa_ok, "mode": mode.name,
                "bf16_cast_round_to_nearest": rne, "flash_attention_matches_sdpa": fa_ok, "checks": checks,
                "timings": timing}

    def qtrain_on_cuda() -> dict[str, Any]:
        # notebook 17's emulated recipes on CUDA tensors: the same numbers as on the CPU, and torchao's float8 timed
        from labkit import qtrain

        same = {}
        for recipe in qtrain.RECIPES:
            for tricks in ((False, False), (True, True)) if recipe == "nvfp4" else ((False, False),):
                grads = []
                for d in ("cpu", dev):
                    torch.manual_seed(0)
                    lin = torch.nn.Linear(64, 32).double()
                    q = qtrain.QLinear(lin, qtrain.QuantConfig(recipe, *tricks, seed=3)).to(d)
                    x = torch.randn(64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(d)
                    x.requires_grad_()
                    q(x).pow(2).sum().backward()
                    grads.append((x.grad.cpu(), lin.weight.grad.cpu()))
                same[f"{recipe}{' +SR+RHT' if tricks[0] else ''}"] = all(
                    torch.allclose(a, b, rtol=1e-12, atol=0) for a, b in zip(*grads))
        return {"ok": all(same.values()), "cpu_equals_cuda": same, "float8_training": qtrain.float8_speedup()}

    guarded("amp_speedup", amp_speedup)
    guarded("triton_kernels", triton_kernels)
    guarded("qtrain_on_cuda", qtrain_on_cuda)
    return out


def overall(notebooks: list[dict[str, Any]], cuda: dict[str, Any]) -> bool:
    """Whether the run passed: no notebook error and no check with ok False.

    ok None means not measurable on this machine (NCCL bandwidth on one GPU): reported, neither pass nor failure.
    """
    return all(r["error"] is None for r in notebooks) and all(v.get("ok") is not False for k, v in cuda.items()
                                                              if k != "device")


def markdown(report: dict[str, Any]) -> str:
    """A short human summary of the report."""
    lines = [f"# GPU check: {report['device_name']}", "", "| notebook | seconds | result |", "|---|---|---|"]
    lines += [f"| {r['notebook']} | {r['seconds']} | "
              f"{'ok' if r['error'] is None else r['error'].splitlines()[-1][:200].replace('|', '/')} |"
              for r in report["notebooks"]]
    lines += ["", "| check | ok | details |", "|---|---|---|"]
    for k, v in report["cuda"].items():
        if k == "device":
            continue
        detail = {a: b for a, b in v.items() if a not in ("ok", "ops", "timings")}
        ok = "not measurable" if v.get("ok") is None else v.get("ok")
        lines.append(f"| {k} | {ok} | {json.dumps(detail)[:300]} |")
    triton = report["cuda"].get("triton_kernels", {}).get("timings")
    if triton:  # notebook 08's kernels: time per kernel, and each torch variant's time as a ratio to it
        lines += ["", "| Triton kernel (4096 x 4096, fp32) | Triton µs | other / Triton |", "|---|---|---|"]
        lines += [f"| {n} | {t['triton_us']} | " + ", ".join(f"{k} {r}" for k, r in t.items() if k != "triton_us")
                  + " |" for n, t in triton.items()]
    failed = [r for r in report["notebooks"] if r["error"] is not None]
    for r in failed:  # each failing cell in full: where it failed and what it said
        lines += ["", f"## {r['notebook']}", "", "```", r["error"], *r.get("later_errors", []), "```"]
    lines += ["", f"**{'PASS' if report['passed'] else 'FAIL'}** in {report['seconds']} s"]
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict[str, Any]) -> None:
    """Write gpu-report.json and gpu-report.md; called after every step, so a run cut short still leaves one."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "gpu-report.md").write_text(markdown(report))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line on stderr, exit status 2 (labkit._cli's convention)
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path.cwd(), help="folder for gpu-report.json/.md (default: .)")
    ap.add_argument("--notebooks", default=",".join(NOTEBOOKS), help="number prefixes (default: 03-17)")
    ap.add_argument("--timeout-per-notebook", type=int, default=300)
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole run: a notebook is not started once the remainder is below its "
                         "timeout (it is reported as not run, and the run does not pass)")
    ap.add_argument("--keep", type=Path, default=None, help="folder for the executed copies of the notebooks")
    args = ap.parse_args(argv)
    why = no_gpu_line()
    if why is not None:
        print(why)
        return 0
    import torch

    t0 = time.perf_counter()
    wanted = [w.strip() for w in args.notebooks.split(",") if w.strip()]
    paths = [p for w in wanted for p in sorted((ROOT / "notebooks").glob(f"{w}_*.ipynb"))]
    report: dict[str, Any] = {"device_name": torch.cuda.get_device_name(0), "torch": torch.__version__,
                              "notebooks": [], "cuda": {}, "passed": False, "seconds": 0.0}
    # the CUDA-only checks first (a minute or two): they are what only a GPU can show
    report["cuda"] = cuda_results()
    report["seconds"] = round(time.perf_counter() - t0, 1)
    write_report(args.out, report)
    for p in paths:
        left = None if args.budget is None else args.budget - (time.perf_counter() - t0)
        if left is not None and left < min(args.timeout_per_notebook, 60):
            r = {"notebook": p.name, "seconds": 0.0, "error": f"not run: {left:.0f} s of the budget left"}
        else:
            timeout = args.timeout_per_notebook if left is None else int(min(args.timeout_per_notebook, left))
            r = run_notebook(p, timeout, args.keep)
        report["notebooks"].append(r)
        report["seconds"] = round(time.perf_counter() - t0, 1)
        write_report(args.out, report)
        print(f"{p.name}: {r['seconds']} s {'ok' if r['error'] is None else 'FAILED: ' + r['error']}", flush=True)
    report["passed"] = overall(report["notebooks"], report["cuda"])
    report["seconds"] = round(time.perf_counter() - t0, 1)
    write_report(args.out, report)
    print(markdown(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
