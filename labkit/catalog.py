"""The map of the workbook: every notebook with what it teaches and how it behaves on CPU vs GPU.

The README's notebook map and notebook 00's table are both generated from ``NOTEBOOKS``;
``tests/test_repo.py`` checks that they, and the files in notebooks/, agree.
Regenerate the README's blocks with ``python tools/readme.py`` (it also writes the seed-coverage map).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NOTEBOOKS", "Notebook", "available", "markdown_table", "missing"]


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
             "torch.profiler, launch overhead, fusion (QKV projections, Conv+BN folding, a fused op's own backward) "
             "and torch.compile, the peak formula, roofline, utilisation and MFU",
             "CPU profiler and roofline", "CUDA time columns, GPU roofline", "memory bandwidth", True),
    Notebook("08", "08_triton_kernels", "Fused kernels in Triton",
             "Triton's programming model; writing fused bias+GELU, softmax, LayerNorm kernels and a one-kernel AdamW; "
             "bytes moved vs unfused torch on the roofline; FlashAttention's online softmax; interpreter vs GPU numerics",
             "Triton's interpreter (TRITON_INTERPRET=1): real results and byte counts, no timings",
             "compiled Triton, timed against torch eager and torch.compile", "memory bandwidth", True),
    Notebook("09", "09_ddp", "DDP and communication",
             "data parallelism, all-reduce, gradient accumulation and communication's share of a step, DDP's "
             "buckets, the NCCL knobs, torchrun from a notebook",
             "2 ranks on gloo", "NCCL", "communication", True),
    Notebook("10", "10_deepspeed_zero", "DeepSpeed and ZeRO",
             "ZeRO stages 0-3 in bf16/fp16, per-rank memory vs the model, offload",
             "DeepSpeed CPU accelerator, gloo", "CUDA + NCCL", "memory + communication", True),
    Notebook("11", "11_parallelism_by_hand", "Parallelism by hand",
             "DDP (hooks, buckets), ZeRO-1, Megatron tensor and GPipe pipeline parallelism written by hand and "
             "checked against torch DDP, AdamW, DeepSpeed and one process; FSDP2 beside DeepSpeed ZeRO-3",
             "2 ranks on gloo; DeepSpeed CPU accelerator", "the same code with NCCL", "communication + memory", True),
    Notebook("12", "12_cluster_workflow", "Working on a cluster",
             "Slurm, JupyterLab on a compute node, multi-node DDP and DeepSpeed jobs",
             "full; live sinfo/sbatch/srun/scancel where a Slurm is reachable", "the same scripts on GPU nodes",
             "communication", True),
    Notebook("13", "13_troubleshooting_clinic", "Troubleshooting clinic",
             "16 broken training runs, each failing for real (NaN, stuck loss, memory growth, a starved loader, "
             "hangs, rendezvous, DeepSpeed config, unscaled lr, uneven shards, unused parameters, a tensor-parallel "
             "gradient, a network interface, a ZeRO-3 export): read the symptom, name the cause, fix one setting",
             "full: each case a real process or 2 gloo ranks, DeepSpeed's CPU accelerator",
             "the same CPU-sized cases; the mistakes are the ones GPU jobs make", "all three", True),
    Notebook("14", "14_platform_and_inference", "Platform and toolchain",
             "HPC vs AI (FP64, iterative refinement), one C kernel one flag at a time (-O0 to -march=native, what "
             "-O2 vectorises), the undefined-symbol error, containers, small files vs a packed file, checkpoint "
             "I/O, the run lifecycle, Amdahl's law, parameter server vs ring and BatchNorm across ranks",
             "full (gcc builds and I/O measured); GPU tools explained",
             "the same cells; nvidia-smi dmon, Nsight Compute, TensorRT, NVML energy on the node", "all three",
             True),
    Notebook("15", "15_serving", "Serving: latency, load and batching",
             "latency percentiles with their n, batching, TTFT, open-loop Poisson load and its knee, coordinated "
             "omission, static vs continuous batching, prefill vs decode on the roofline, KV cache and paging, INT8",
             "full: the tiny GPT served by one CPU thread; batching replayed from measured step times",
             "the same cells (they serve on the CPU); a GPU server's numbers are worked from datasheets",
             "memory bandwidth (decode) and compute (prefill)", True),
    Notebook("16", "16_triton_attention", "Triton II: tiled matmul and FlashAttention, forward and backward",
             "a tiled matmul with grouped order and @triton.autotune, a looped online softmax, FlashAttention's "
             "forward with the logsumexp, causal stop and exp2, LayerNorm and FlashAttention backward kernels as "
             "autograd Functions checked with gradcheck (after notebooks 07 and 08)",
             "Triton's interpreter: real results, byte counts and float64 gradchecks, no timings",
             "compiled Triton, autotuned and timed", "compute (matmul) and memory bandwidth (attention)", True),
    Notebook("17", "17_low_precision_frontier", "The low-precision frontier: FP8 scaling, MX and NVFP4",
             "the scaling ladder (per-tensor, rowwise, 1 x 128 blocks, MX, NVFP4) on real activations and gradients, "
             "an MX shared exponent by hand, matmuls in the formats and FP32 promotion, the tiny GPT trained in "
             "emulated FP8, MXFP8 and NVFP4 with stochastic rounding and Hadamard rotations (after notebook 05)",
             "every format emulated exactly in float64: the numbers a GPU gets, no speed",
             "torchao's float8 training timed against bf16 (FP8 from compute capability 8.9; MX and NVFP4 "
             "natively on Blackwell)", "compute (matmul) and the bytes of scales", True),
]


def available() -> list[Notebook]:
    """Return the notebooks that exist in this version of the workbook. Introduced in notebook 00."""
    return [n for n in NOTEBOOKS if n.available]


def missing(folder: str | os.PathLike = ".") -> list[str]:
    """Return the file names of the available notebooks that are not in ``folder``.

    A translated edition lives in a language folder under notebooks/ (``notebooks/zh``) and may not have every
    notebook yet: there, a notebook also counts as present in the parent folder, where the English edition is.
    Introduced in notebook 00.
    """
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a path (str or Path), got {type(folder).__name__}")
    here = Path(folder).resolve()
    places = [here] + ([here.parent] if here.parent.name == "notebooks" else [])
    return [n.filename for n in available() if not any((p / n.filename).exists() for p in places)]


def markdown_table(notebooks: list[Notebook] | None = None, lang: str | None = None, folder: str | None = None) -> str:
    """Return the notebook map as a Markdown table (number, title, teaches, CPU, GPU), in the edition ``lang``
    (default: the notebook's language). Its links are relative to the checkout (``notebooks/``, or a translated
    edition's ``notebooks/zh/``), or to ``folder`` (``""``: the notebooks' own folder, for a notebook's map).

    Introduced in notebook 00.
    """
    from labkit import i18n

    chosen = available() if notebooks is None else notebooks
    if isinstance(chosen, (str, bytes)) or not all(isinstance(n, Notebook) for n in chosen):
        raise TypeError("notebooks must be a list of labkit.catalog.Notebook (or None for all)")
    if lang is not None and not isinstance(lang, str):
        raise TypeError(f"lang must be a str or None, got {type(lang).__name__}")
    edition = i18n.language() if lang is None else i18n.normalise(lang)
    if edition is None:
        raise ValueError(f"no edition in {lang!r}: choose one of {', '.join(i18n.LANGUAGES)}")
    t = functools.partial(i18n.translate, lang=edition)
    if folder is not None and not isinstance(folder, str):
        raise TypeError(f"folder must be a str or None, got {type(folder).__name__}")
    if folder is None:
        folder = "notebooks/" if edition == "en" else f"notebooks/{edition}/"
    elif folder and not folder.endswith("/"):
        folder += "/"
    rows = [i18n.translate("| # | Notebook | What it teaches | On CPU | On a GPU |", edition), "|---|---|---|---|---|"]
    for n in chosen:
        rows.append(f"| {n.number} | [{t(n.title)}]({folder}{n.filename}) | {t(n.teaches)} | {t(n.cpu)} "
                    f"| {t(n.gpu)} |")
    return "\n".join(rows)
