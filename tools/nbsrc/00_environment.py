# %% [markdown]
# # 00 · Environment check
#
# **Objectives**
# - know how to work through this workbook, in JupyterLab on a laptop or on a cluster's compute node;
# - read the `labkit doctor` report: versions, device, what your hardware can compute;
# - know your **device tier** and what each later notebook does on a CPU and on a GPU;
# - name the three bottlenecks of HPC (compute, memory bandwidth, communication) and where the workbook visits each.
#
# **Prerequisites:** Python and a little PyTorch. Nothing else.
#
# **Estimated time:** 20 min

# %%
# %matplotlib inline
import importlib.util
import time
from pathlib import Path

import numpy as np
import torch
from IPython.display import Markdown, display

import labkit
from labkit import catalog, device, env
from labkit.check import check, predict, reveal

DEEPSPEED = importlib.util.find_spec("deepspeed") is not None  # optional: `make test` installs it

# %% [markdown]
# ## 1. How to use this workbook
#
# - **On a laptop:** `make lab` in the repository creates `.venv`, installs everything (a CPU build of
#   PyTorch unless you ask for CUDA), creates your workspace `work/` (your own copies of the notebooks, without
#   the solutions) and opens JupyterLab there. The reference notebooks, solutions included, stay in `notebooks/`.
# - **On a cluster:** never run notebooks on the login node. Submit `slurm/jupyter.sbatch`; it starts
#   JupyterLab on a compute node and writes the `ssh -N -L ...` tunnel command to your job output
#   (see `slurm/README.md` and notebook 12).
# - Run a notebook top to bottom with *Run → Run All Cells*. Cells `assert` what they teach: if one fails,
#   the notebook is telling you something about your machine.
# - Exercises have a `...` for you to fill. `check(...)` then prints ✓, a hint, or "not attempted yet"; each
#   further wrong answer gets the next hint (a nudge, then the method, then the worked solution).
#   Some are *predict, then run*: you record a prediction with `predict(...)` before a cell that measures the
#   real thing, and that cell's `reveal(...)` compares the two and explains the difference. Others are *debug*
#   exercises: a broken snippet runs and shows its symptom, and you write the fixed version.
# - Every notebook is built to run on 2 CPU cores of any x86 or Arm CPU. Where a GPU changes the story, the notebook shows the real GPU numbers
#   when one is present and says plainly what would differ when not.

# %% [markdown]
# ## 2. The doctor report
#
# The same report is printed by `python -m labkit doctor` in a terminal; paste it into a question when you ask
# for help. Its content depends on your machine, so its stored output is not compared by the tests.

# %%
# NBVAL_IGNORE_OUTPUT
report = env.report()
print(env.format_report(report))

# %% [markdown]
# Whatever the machine, a few things must hold for the workbook to work:

# %%
major, minor = (int(p) for p in torch.__version__.split(".")[:2])
assert (major, minor) >= (2, 4), "labkit needs torch >= 2.4 (torch.amp.GradScaler(device))"
assert report["versions"]["ml_dtypes"] and report["versions"]["labkit"] == labkit.__version__
assert hasattr(torch, "float8_e4m3fn") and hasattr(torch, "float8_e5m2")
print("torch", ".".join(map(str, (major, minor))), "ok; fp8 dtypes present; labkit", labkit.__version__)

# %% [markdown]
# ## 3. Your device tier
#
# `labkit.device` is the one place that decides which device, which autocast dtype and which fast paths a
# notebook uses. It asks three different questions about bf16 and fp16, because real machines answer them
# differently:
#
# | question | function | how it is answered |
# |---|---|---|
# | does autocast to it **compute** here? | `device.computes(dtype)` | a tiny autocast matmul is tried |
# | is it **fast** here (native hardware, no emulation)? | `device.fast(dtype)` | CPU: AMX or AVX512-BF16/FP16, as far as oneDNN may use them; CUDA: the compute capability (bf16 sm80+, fp8 sm89+) |
# | does **DeepSpeed** accept it? | `device.deepspeed_accepts(dtype)` | DeepSpeed's accelerator is asked |
#
# A laptop CPU computes fp16, about a hundred times slower than fp32, and DeepSpeed refuses fp16 on it; a V100
# computes bf16 by emulation. One answer never stands in for another.
#
# | tier | what it is | what changes in later notebooks |
# |---|---|---|
# | `cpu` | no GPU (this is what CI runs) | bf16/fp16 autocast on CPU, DDP on gloo, DeepSpeed's CPU accelerator; TF32 and fp8 matmul explained and emulated |
# | `mps` | Apple GPU | autocast on MPS; no NCCL, no TF32, no fp8 |
# | `cuda` | NVIDIA GPU | CUDA autocast (softmax & co upcast to fp32), NCCL, real timings; TF32 and fast bf16 from compute capability 8.0 (A100, not V100/T4) |
# | `cuda-fp8` | NVIDIA GPU with compute capability ≥ 8.9 (Ada, Hopper) | as `cuda`, plus real fp8 matmuls |

# %%
# NBVAL_IGNORE_OUTPUT
caps = device.capabilities()
print(f"tier {caps.tier}: {caps.device} ({caps.device_name}); autocast dtype {caps.autocast_dtype}")
print(f"bf16 {caps.bf16}, fp16 {caps.fp16}, fp8 matmul {caps.fp8_matmul}, CPU ISA {' '.join(caps.cpu_isa) or '-'}")

# %% [markdown]
# The three answers for this machine, and a sentence about its CPU generated from what was detected:

# %%
# NBVAL_IGNORE_OUTPUT
for name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
    print(f"{name}: computes {device.computes(dt)}, fast {device.fast(dt)}, "
          f"DeepSpeed accepts {device.deepspeed_accepts(dt) if DEEPSPEED else 'n/a (not installed)'}")
print("This machine:", device.cpu_summary())

# %% [markdown]
# The tier is consistent with what was measured, and the answers never contradict each other:

# %%
assert caps.tier in {"cpu", "mps", "cuda", "cuda-fp8"}
# fp8 matmuls need FP8 tensor cores: compute capability 8.9 or higher, as torch itself reports it
cc = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
assert caps.fp8_matmul == (cc is not None and cc >= (8, 9))
assert device.dist_backend() == ("nccl" if caps.tier.startswith("cuda") else "gloo")
assert caps.bf16 or caps.fp16 or caps.autocast_dtype is None
assert (caps.bf16 or not caps.bf16_fast) and (caps.fp16 or not caps.fp16_fast)   # fast implies computes
print("device gate consistent; distributed backend:", "nccl on CUDA, gloo elsewhere")

# %% [markdown]
# ## 4. The notebooks, on CPU and on a GPU

# %%
display(Markdown(catalog.markdown_table()))
missing = [n.filename for n in catalog.available() if not Path(n.filename).exists()]
assert not missing, f"notebooks listed but not found next to this one: {missing}"

# %% [markdown]
# ## 5. The three bottlenecks
#
# Every step of training waits on one of three things:
#
# 1. **Compute**: the arithmetic units (tensor cores, AVX-512/AMX units). A big matmul does about
#    $2n^3$ FLOPs on $3n^2$ numbers, so it reuses each byte many times and is limited by FLOP/s.
#    Notebooks 01-05 make compute cheaper with narrower formats.
# 2. **Memory bandwidth**: moving bytes between memory and the arithmetic units. An elementwise op does one
#    FLOP per element loaded and stored, so it waits on GB/s however fast the units are. Notebook 06 counts the
#    bytes, notebook 07 profiles and fuses ops to move fewer of them.
# 3. **Communication**: moving bytes between devices and machines. Data parallelism all-reduces every
#    gradient every step; ZeRO trades memory for more communication. Notebooks 09-12.
#
# *Arithmetic intensity* (FLOPs per byte moved) tells which of the first two limits an op:

# %%
def intensity_matmul(n: int, bytes_per: int = 4) -> float:
    return 2 * n**3 / (3 * n * n * bytes_per)

print(f"matmul 512x512 fp32: {intensity_matmul(512):.1f} FLOP/byte;  elementwise add fp32: {1 / 12:.3f} FLOP/byte")
assert intensity_matmul(512) > 80 > 1 / 12

# %% [markdown]
# **Predict, then run.** The next cell times a 512 × 512 fp32 matmul and an add of two 16 MB fp32 vectors, and
# counts FLOP/s for both (the add does one FLOP per element). Which reaches more FLOP/s on this machine:
# `"matmul"`, `"add"` or `"about the same"`? Record your prediction before you run the measurement.

# %%
prediction = ...
### BEGIN SOLUTION
prediction = "matmul"
### END SOLUTION
predict("00.matmul-vs-add", prediction)

# %% [markdown]
# Measured on this machine (median of a few repeats; your figures will differ):

# %%
# NBVAL_IGNORE_OUTPUT
def median_time(fn, repeats: int = 7) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return float(np.median(ts))

a = torch.randn(512, 512); big = torch.randn(16 * 2**20 // 4)
t_mm, t_copy, t_add = (median_time(f) for f in (lambda: a @ a, lambda: big.clone(), lambda: big + big))
flops_mm, flops_add = 2 * 512**3 / t_mm, big.numel() / t_add
print(f"matmul: {flops_mm / 1e9:.1f} GFLOP/s   add: {flops_add / 1e9:.2f} GFLOP/s   "
      f"copy: {2 * big.numel() * 4 / t_copy / 1e9:.1f} GB/s")

# %% [markdown]
# The two rates, side by side (a factor of 2 either way counts as "about the same"):

# %% tags=["workspace-clear"]
winner = "matmul" if flops_mm > 2 * flops_add else "add" if flops_add > 2 * flops_mm else "about the same"
reveal("00.matmul-vs-add", winner)
assert flops_mm > 2 * flops_add  # ~85 against 1/12 FLOP per byte: the gap is tens of times on any CPU or GPU

# %% [markdown]
# ## Exercises
#
# **1.** Which device type did `pick_device()` choose (`"cpu"`, `"cuda"` or `"mps"`)?

# %%
answer = ...
### BEGIN SOLUTION
answer = device.pick_device().type
### END SOLUTION
check("00.device", answer)

# %% [markdown]
# **2.** Which dtype does autocast use by default on this machine? (A `torch.dtype` or its name.)

# %%
answer = ...
### BEGIN SOLUTION
answer = device.autocast_dtype()
### END SOLUTION
check("00.autocast-dtype", answer)

# %% [markdown]
# **3.** Name the bottleneck (`"compute"`, `"memory bandwidth"` or `"communication"`) of each scenario.

# %%
answer = {
    "a 8192x8192 bf16 matmul": ...,
    "adding a bias to a 1 GB activation tensor": ...,
    "all-reducing 1 GB of gradients between two nodes": ...,
}
### BEGIN SOLUTION
answer = {
    "a 8192x8192 bf16 matmul": "compute",
    "adding a bias to a 1 GB activation tensor": "memory bandwidth",
    "all-reducing 1 GB of gradients between two nodes": "communication",
}
### END SOLUTION
check("00.bottlenecks", answer)

# %% [markdown]
# ## Your progress
#
# Every `check(...)` you run in your workspace (`work/`, which `make lab` opens) is recorded on this machine,
# in `work/.labkit-progress.json`; nothing is sent anywhere. The next cell, or `python -m labkit progress` in a
# terminal, lists which exercises you have solved, per notebook. Stuck on an exercise? The next wrong answer
# gets the method, the one after it the worked solution, and `labkit.check.solution("NN.name")` shows it at once.

# %% tags=["workspace-clear"]
labkit.check.progress()

# %% [markdown]
# ## Summary
#
# - `python -m labkit doctor` (section 2) is the first thing to run on a new machine or cluster node.
# - `labkit.device` decides device, dtype and backend by measuring; later notebooks adapt to your tier.
# - Compute, memory bandwidth and communication are the three limits; arithmetic intensity tells compute
#   from bandwidth. The rest of the workbook visits each, starting with the bits of a float in notebook 01.
