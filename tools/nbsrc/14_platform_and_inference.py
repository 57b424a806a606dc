# %% [markdown]
# # 14 · Platform and toolchain
#
# **Objectives**
# - say what HPC and AI computing share and where they differ (FP64 and MPI against low precision and data
#   parallelism), and watch FP64 matter on an ill-conditioned system;
# - compile one C kernel with one flag changed at a time (`-O0` to `-O3 -march=native`), read what the compiler
#   vectorised and why `-O2` may not, and know why `-march=native` can break a binary on another node;
# - reproduce the loader's `undefined symbol` error that a mismatched cuBLAS/cuDNN gives, and diagnose it;
# - know how a container gets a GPU (NVIDIA Container Toolkit, Apptainer `--nv`);
# - measure what a checkpoint costs to write, choose how often to write one, and keep a run verifiable;
# - read a data set from one packed file with an index instead of thousands of small files, and say why a parallel
#   file system punishes small files;
# - read speed-up claims with Amdahl's law, and know the GPU-side tools (`nvidia-smi dmon`, Nsight Compute,
#   TensorRT, energy counters, `NCCL_IB_TIMEOUT`) well enough to use them on a GPU node;
# - write a parameter server and a ring all-reduce with send/recv, count the bytes each rank sends, and see why
#   BatchNorm with local statistics is not the same model on 4 ranks as on one.
#
# **Prerequisites:** notebook 04 (the tiny GPT), 07 (profiling, the roofline), 12 (a cluster's nodes and storage).
#
# **Estimated time:** 80 min (core 40 min, stretch 40 min)
#
# Sections 4, 5, 6 and 8 are **stretch**: containers, checkpoint I/O, the run's lifecycle and the GPU-side tools.
# A first pass can take the other sections and their exercises; the cells still run in order.
#
# Two labels mark what this notebook can and cannot show on a laptop. **Run here** sections execute on any CPU and
# assert what they teach; the timings differ from machine to machine, so their cells are not compared by the
# tests, only the facts that hold everywhere. **Explained, not run** sections need a GPU, a site's hardware or
# a site's software: they say what you would type and what you would read.

# %%
# %matplotlib inline
import inspect
import math
import shutil
import tempfile
import warnings
import zlib
from pathlib import Path

import torch

from labkit import bench, data, models, train, zero
from labkit import lifecycle as L
from labkit import toolchain as T
from labkit.check import check, predict, reveal
from labkit.device import cpu_isa_flags
from labkit.dist import launch
from labkit.exercises.nb14 import AMDAHL, YOUNG, hilbert_system
from labkit.recipes import comm_patterns as comm

torch.set_num_threads(1)  # steadier timings on a shared machine (raise it on your own node)
WORK = Path(tempfile.mkdtemp(prefix="labkit14-"))  # builds and checkpoints go here; removed at the end
GCC = T.find_compilers()["gcc"] is not None

# %% [markdown]
# ## 1. HPC and AI computing: one cluster, two kinds of work
#
# A supercomputer centre and an AI training cluster are built from the same parts: nodes with CPUs and
# accelerators, a fast network, shared parallel storage and a batch scheduler. What runs on them differs:
#
# | | classic HPC | AI computing |
# |---|---|---|
# | typical jobs | simulation (weather, materials, fluids), engineering, large data analysis | training, fine-tuning, inference, embedding search |
# | the arithmetic | linear algebra, FFTs, partial differential equations | matrix multiplications, convolutions, attention |
# | precision | FP64, sometimes FP32 | FP32, TF32, BF16/FP16, FP8, INT8 |
# | parallelism | MPI between processes, threads and SIMD inside | data, tensor and pipeline parallelism (torch.distributed, NCCL) |
# | what it waits on | CPU, memory bandwidth, network, storage | accelerator memory, interconnect, storage, the queue |
#
# Each workload leans on a different bottleneck (notebook 00's three). Molecular dynamics spends its time in
# neighbour exchanges between MPI ranks and in FFTs; fluid dynamics streams large meshes through memory and is
# bandwidth-bound; training uses all three at once: compute in forward and backward, memory bandwidth in elementwise
# ops and normalisations, the network in gradient synchronisation, and beside them a fourth, the data loader, which
# waits on storage and on the CPU's decoding rather than on memory (section 5 measures it). Tensor cores, matrix units added to NVIDIA GPUs
# with Volta (2017, FP16) and given BF16 and TF32 with Ampere (2020), deliver many times the FP32 rate, which is
# why mixed precision spread from AI into HPC codes too. The same collectives exist on both sides: MPI's `MPI_Allreduce` is DDP's all-reduce, and
# torch.distributed can even run on MPI where PyTorch was built with it.
#
# ### FP64 still matters: an ill-conditioned system
#
# **Run here.** AI tolerates low precision because training is noisy anyway. Many scientific problems do not.
# The 8×8 Hilbert matrix `H[i, j] = 1 / (i + j + 1)` is a classic ill-conditioned system: we pick `x = (1, …, 1)`,
# compute `b = H x` in FP64, then solve `H x = b` in FP64, in FP32, and with the data stored in BF16.
#
# **Predict, then run.** Which of the three get `x` back to a relative error below 1e-3? Give a set of names.

# %%
prediction = ...
### BEGIN SOLUTION
prediction = {"fp64"}
### END SOLUTION
predict("14.solve-precision", prediction)

# %%
# NBVAL_IGNORE_OUTPUT
n = 8
H, x_true, solves = hilbert_system(n)  # H[i, j] = 1/(i + j + 1); b = H @ ones, as data in fp64, fp32 and bf16
err, resid = {}, {}
for name, (A, rhs) in solves.items():  # torch has no bf16 solver: bf16 *data*, solved in fp32
    x = torch.linalg.solve(A, rhs)
    err[name] = ((x.double() - x_true).norm() / x_true.norm()).item()
    resid[name] = ((A @ x - rhs).norm() / rhs.norm()).item()
    print(f"{name}: relative error {err[name]:.1e}, relative residual {resid[name]:.1e}")

# %%
cond = torch.linalg.cond(H).item()
print(f"condition number of Hilbert({n}): {cond:.1e}")
reveal("14.solve-precision", {k for k, v in err.items() if v < 1e-3})
assert err["fp64"] < 1e-6 and err["fp32"] > 0.1 and err["bf16"] > 0.1
assert resid["fp32"] < 1e-5  # a tiny residual, and not one correct digit: the residual does not check the answer

# %% [markdown]
# The rule of thumb: a solve loses about log10(condition number) digits. FP64 has about 16 significant digits and
# keeps at least about 6 here; FP32 has about 7 and keeps none, yet its residual `‖Ax − b‖` is as small as FP32 can make it.
# So a small residual is not a correct answer, and a code that compares results only with "they look converged" can be
# wrong in every digit. This is why simulations stay in FP64, and why HPC uses low precision only where a method
# corrects for it.
#
# One such method is **mixed-precision iterative refinement**, the idea behind the HPL-MxP benchmark: factorise the
# matrix once in low precision (the expensive O(n³) part, where tensor cores help), then repeatedly compute the residual
# in FP64 and solve for a correction with the cheap factors. For a matrix that is not too ill-conditioned
# (condition × FP32's eps well below 1) it converges to FP64 accuracy:

# %%
g = torch.Generator().manual_seed(0)
A = torch.randn(200, 200, generator=g, dtype=torch.float64) + 20 * torch.eye(200, dtype=torch.float64)
x_true = torch.randn(200, 1, generator=g, dtype=torch.float64)
b = A @ x_true
LU, piv = torch.linalg.lu_factor(A.float())                      # O(n³) once, in FP32
x = torch.linalg.lu_solve(LU, piv, b.float()).double()
errors = [((x - x_true).norm() / x_true.norm()).item()]
for _ in range(4):
    r = b - A @ x                                                # the residual in FP64
    x = x + torch.linalg.lu_solve(LU, piv, r.float()).double()  # an O(n²) correction with the FP32 factors
    errors.append(((x - x_true).norm() / x_true.norm()).item())
print("FP32 solve alone reaches 1e-9:", errors[0] < 1e-9, "| after refinement, 1e-13:", errors[-1] < 1e-13)
assert errors[0] > 1e-9 and errors[-1] < 1e-13

# %% [markdown]
# ## 2. Compilers and flags: one C kernel, one flag at a time
#
# **Run here** (where gcc is installed). A toolchain has layers (scheduler, compilers, libraries, profilers); for
# each, one or two tools you know well are worth more than a dozen installed ones. The compiler decides how much of
# the hardware a program uses: the same loop can run one element per instruction or 8-16 at once (SIMD). On
# clusters you meet GCC, LLVM's clang, Intel's oneAPI `icx`, `icpx` and `ifx` (the successors of `icc`, `icpc` and
# `ifort`) and, for CUDA, NVIDIA's `nvcc`; PyTorch itself compiles at run time too (`torch.compile` generates C++ or
# Triton, notebook 07; Triton kernels, notebook 08). Which compilers this machine has:

# %%
# NBVAL_IGNORE_OUTPUT
for name, path in T.find_compilers().items():
    print(f"{name:>6}: {T.compiler_version(name) if path else 'not installed'}")

# %% [markdown]
# The kernel evaluates a cubic polynomial on every element of an array of 16 384 floats, 2000 times per round, and
# reports its best round (the least disturbed one). Every element is independent of the others, so a compiler may
# vectorise the loop:

# %%
print(T.KERNEL_C.strip())

# %% [markdown]
# Builds that differ by **one flag at a time**, each compared with the one before it: `-O0` (no optimisation:
# every variable goes to memory and back), `-O2` (the usual release level), `-O3` (more aggressive loop
# optimisations, the vectoriser with its full cost model), then `-march=native` (use every instruction the CPU it is built on
# has), then, where the CPU has AVX-512, `-mprefer-vector-width=512`. All builds also get `-ffp-contract=off`: without
# it, once the flags let the compiler use FMA instructions (`-march=native` on a CPU that has them, or `-mfma`), it
# may fuse `a*x + b` into one instruction with one rounding instead of two, and the bits of the result would change
# with the flags. Beside each time, the widest vectors GCC says it used for the loop
# (`-fopt-info-vec`: 16 bytes is SSE, 4 floats; 32 is AVX2, 8 floats; 64 is AVX-512, 16 floats):

# %%
# NBVAL_IGNORE_OUTPUT
FLAGS = {"-O0": ["-O0"], "-O2": ["-O2"], "-O3": ["-O3"], "-O3 -march=native": ["-O3", "-march=native"]}
if "avx512f" in cpu_isa_flags():  # 512-bit vectors exist only on AVX-512 CPUs
    FLAGS["-O3 -march=native -mprefer-vector-width=512"] = ["-O3", "-march=native", "-mprefer-vector-width=512"]
builds = T.time_builds(FLAGS, WORK) if GCC else None
widths = {k: T.vector_widths(T.vectorization_report([*f, "-ffp-contract=off"], WORK, loop_only=True))
          for k, f in FLAGS.items()} if GCC else {}
if builds is None:
    print("gcc is not installed here: nothing was compiled or timed.")
prev = None
for name, bld in (builds or {}).items():
    step = f"{prev.seconds / bld.seconds:4.1f}x the previous" if prev else "baseline"
    vec = f"{widths[name][0]}-byte vectors" if widths[name] else "scalar"
    print(f"{name:<45} {bld.seconds * 1e3:7.2f} ms  {step:<20} {vec}")
    prev = bld

# %%
if builds is not None:
    print("every build computed the same bits:", len({bld.checksum for bld in builds.values()}) == 1)
    assert len({bld.checksum for bld in builds.values()}) == 1
    assert widths["-O3"] and not widths["-O0"]                                   # GCC's own report
    assert builds["-O3 -march=native"].seconds < builds["-O0"].seconds / 1.5   # a wide margin: noise cannot flip it
    assert builds["-O2"].seconds < builds["-O0"].seconds / 1.2
else:
    print("gcc is not installed here: no builds to compare.")

# %% [markdown]
# **Why `-O2` may leave the loop scalar.** GCC 12 and later run the vectoriser at `-O2`, but with the *very cheap*
# cost model: it vectorises a loop only when the vector code needs no extra code around it. This loop needs two
# pieces: a runtime check that `x` and `y` do not overlap (the pointers could alias), and a scalar *epilogue* for the
# last `n mod 4` elements, since `n` is only known at run time. `restrict` on the pointers removes the first; a trip
# count fixed at compile time, a multiple of the vector width, removes the second. `-O3` (the *dynamic* cost model)
# or `-fvect-cost-model=cheap` accept both. GCC before 12 does not vectorise at `-O2` at all, and clang does, so
# read the report of your compiler. Three variants of `poly`, as written and with one change each:

# %%
if GCC:
    variants = {"as written": {}, "restrict": {"restrict": True}, "restrict, n fixed": {"restrict": True, "fixed_n": 16384}}
    print(f"{'poly':<18}" + "".join(f"{f:>28}" for f in ("-O2", "-O2 -fvect-cost-model=cheap", "-O3")))
    seen = {}
    for name, kw in variants.items():
        src = T.kernel_source(**kw)
        seen[name] = [T.vector_widths(T.vectorization_report(f.split(), WORK, source=src, loop_only=True))
                      for f in ("-O2", "-O2 -fvect-cost-model=cheap", "-O3")]
        print(f"{name:<18}" + "".join(f"{(f'{w[0]}-byte vectors' if w else 'scalar'):>28}" for w in seen[name]))
    assert all(row[2] for row in seen.values())   # -O3 vectorises every variant

# %% [markdown]
# The widths tell a second story. On a CPU with AVX-512, `-march=native` alone usually stays at 32-byte vectors: GCC's
# tuning for most AVX-512 CPUs sets `-mprefer-vector-width=256`, because 512-bit instructions lower the clock on
# several Intel generations and gain little in short loops; the last build asks for 64-byte vectors, and its time
# says whether they paid here. Decide with the measurement, one flag at a time.
#
# What to take from it:
#
# - **Measure, one flag at a time.** Start from the default build as the baseline, change one flag, keep it only if a
#   measurement says so. Flags copied from somewhere else were tuned for another compiler, another CPU, another code.
# - **`-march=native` ties the binary to the CPU it was built on.** Built on an AVX-512 login node, it dies with
#   `Illegal instruction` on an older compute node. Build on the node type you run on, or name a baseline the
#   whole cluster has (`-march=x86-64-v3` is AVX2 and FMA).
# - **Some flags change results, not just speed:** `-ffp-contract` (FMA), `-ffast-math` (reassociates sums, drops
#   NaN/inf checks). A run compared bit for bit across builds needs them fixed.
# - **nvcc** compiles host code with the host compiler and device code for the GPU architectures you list
#   (`-gencode arch=compute_90,code=sm_90`, or `-arch=sm_80`); a binary without code for the GPU it meets fails with
#   "no kernel image is available for execution on the device". `-lineinfo` lets Nsight Compute map metrics to
#   source lines.
#
# ## 3. Library versions and the "undefined symbol" error
#
# Between PyTorch and the GPU sit libraries with their own versions: the CUDA runtime, **cuBLAS** (matmuls),
# **cuDNN** (convolutions, attention, normalisation), **NCCL** (collectives), and on CPUs oneDNN and a BLAS. A new
# version can bring new kernels for new GPUs, different heuristics for choosing among them (so different speed and
# different rounding: results change in the last bits), new defaults, and fixes or bugs. Upgrading cuBLAS alone can
# speed up matmuls, but the supported path is the set of libraries your PyTorch build was tested with: the pip wheels
# of torch for CUDA bring their own cuBLAS, cuDNN and NCCL as `nvidia-*` packages. The GPU driver is the other half:
# it must be at least as new as the CUDA version the libraries need. What this torch was built with:

# %%
# NBVAL_IGNORE_OUTPUT
for lib, version in T.library_versions().items():
    print(f"{lib:<36} {version or '-'}")
print("MPI backend in torch.distributed:", torch.distributed.is_mpi_available())

# %% [markdown]
# **Run here.** When the loader finds an *older* library than the one a program was linked against, the program
# refers to a function the old library does not have, and loading fails: `undefined symbol: ...` (for torch, typically
# a `cudnn...` or `cublas...` name, after someone put another cuDNN first on `LD_LIBRARY_PATH`). The same thing, with
# two versions of a tiny library: version 2 adds a function `scale_fast`, and an extension built against version 2
# calls it.

# %%
if GCC:
    demo = T.undefined_symbol_demo(WORK)
    print("with v2 on the path:", demo.output_v2, "| loader picked:", demo.resolved_v2)
    print("with v1 on the path:", demo.error_v1, "| loader picked:", demo.resolved_v1)
    print("v1 exports", demo.symbols_v1, "; v2 exports", demo.symbols_v2)
    assert demo.output_v2 == "42.0" and demo.error_v1.endswith("undefined symbol: scale_fast")
else:
    print("gcc is not installed here: the demo needs it to build the two libraries.")

# %% [markdown]
# How to diagnose it on a real node: `ldd` on torch's `lib/libtorch_cuda.so` (in the folder
# `python -c "import torch, os; print(os.path.dirname(torch.__file__))"` prints) shows which file each library
# resolves to; `nm -D --defined-only libX.so | grep name` whether a file exports the
# missing name; `LD_DEBUG=libs python -c "import torch"` traces the search. The fix is almost never to copy a library
# in: remove what overrides the libraries torch shipped with (an `LD_LIBRARY_PATH` line in `.bashrc`, a `module load
# cudnn/...`), or use a container that fixes the whole stack. Record the versions with every run (notebook 12's
# reproducibility record, `python -m labkit doctor`).
#
# ## 4. Containers: Docker and Apptainer with GPUs
#
# **Stretch.**
# **Explained, not run** (a GPU node with a container runtime is needed). A container image freezes the user-space
# stack: Python, PyTorch, CUDA runtime, cuBLAS, cuDNN, NCCL. The GPU **driver** is not in the image: it belongs to
# the host's kernel, and the runtime brings its device files and user-space libraries (`libcuda.so`, `nvidia-smi`)
# into the container at start:
#
# - **Docker or Podman with the NVIDIA Container Toolkit:** `docker run --gpus all image python train.py` (or CDI:
#   `--device nvidia.com/gpu=all`). Docker Compose can request GPUs per service. Fine for one or a few machines.
# - **Apptainer (formerly Singularity)**, the usual runtime on HPC clusters because it runs as the user, without a
#   root daemon: `apptainer exec --nv image.sif python train.py`; `--nv` binds the host's driver libraries and GPUs.
#   Inside a Slurm job: `srun apptainer exec --nv image.sif torchrun ...`.
# - **The rule:** the host driver must support the CUDA version in the image. A too-old driver gives "CUDA driver
#   version is insufficient for CUDA runtime version".
# - **Multi-node jobs in containers** need the InfiniBand devices and an RDMA-capable network stack inside
#   (`/dev/infiniband`, libibverbs in the image); Apptainer shares the host network by default, Docker needs
#   `--network host` or an overlay, which is one reason clusters prefer Apptainer.
#
# Whether this kernel runs in a container, read from the marks runtimes leave:

# %%
# NBVAL_IGNORE_OUTPUT
print("container runtime:", T.container_runtime() or "none detected")

# %% [markdown]
# ## 5. Checkpoint and log I/O: what saving costs
#
# **Stretch.**
# **Run here.** A checkpoint stalls training while it is written (unless it is written asynchronously), and a
# shared file system is shared: a hundred ranks each writing their shard at once, or a job writing thousands of
# small log files, slow everybody down. First, what a write costs here, to the local temporary folder, with `fsync`
# so that the bytes really reach the disk:

# %%
# NBVAL_IGNORE_OUTPUT
writes = L.time_checkpoint_writes([2**20, 2**22, 2**24, 2**26], WORK, repeats=2)
for w in writes:
    print(f"{w.payload_bytes / 2**20:5.0f} MiB: {w.seconds * 1e3:7.1f} ms, {w.bytes_per_s / 1e9:5.2f} GB/s")

# %%
assert all(w.payload_bytes < w.file_bytes < w.payload_bytes + 4096 for w in writes)
assert writes[-1].seconds > writes[0].seconds
print("file = payload + under 4 KiB of metadata; a 64x larger checkpoint takes longer to write:",
      writes[-1].seconds > writes[0].seconds)

# %% [markdown]
# Small writes are dominated by fixed costs (opening, metadata, `fsync`), large ones by bandwidth. On a cluster,
# write checkpoints to the project or parallel file system (never many small files there), keep the last few and
# archive older ones after the job, and let one rank write logs.
#
# **How often?** Writing too often wastes the time spent writing; writing too rarely wastes the work lost when the
# job fails (half an interval, on average). Young's rule balances the two: interval = √(2 × write time × MTBF), where
# MTBF is the job's mean time between failures (a job on N nodes fails about N times as often as one node). For a
# 13B model with its AdamW state (about 16 bytes per parameter, 208 GB) written at 3.5 GB/s, about 60 s per
# checkpoint, and a failure a day:

# %%
c_s, mtbf_s = 60.0, 24 * 3600.0
every = L.young_interval(c_s, mtbf_s)
print(f"checkpoint every {every / 60:.0f} min; time spent writing: {L.checkpoint_overhead(c_s, every):.1%}")
assert round(every / 60) == 54 and L.checkpoint_overhead(c_s, every) < 0.02

# %% [markdown]
# ### Reading data: many small files or one packed file
#
# **Run here.** Data sets often arrive as one file per sample: an image, a clip, a JSON document. Seed 004 §2.3
# advises against piling many small files into a shared directory that many jobs read at once, and suggests packing
# them, indexing them or converting them to a format read sequentially. The reason is that a file costs more than
# its bytes. Reading one is a path lookup, an `open` (permissions, a file descriptor), an `fstat`, the `read` and a
# `close`. On a node's own disk these are system calls, answered in microseconds once the kernel has the directory
# and the file's inode cached. On a parallel file system (Lustre, GPFS) the open, the stat and every create are
# requests over the network to the file system's **metadata service** (on Lustre, the metadata servers, MDS), which
# every job of the cluster shares, while the bytes themselves come from many storage servers in parallel. A million
# images read in random order is a million metadata round trips per epoch, for every rank that reads.
#
# The same 2000 samples of 4 to 12 KiB (about 60 % of that once compressed), stored compressed as images are (JPEG,
# PNG), once as one file per sample and once packed into a single file with an index of (offset, length) per sample:

# %%
g = torch.Generator().manual_seed(0)
samples = [torch.randint(0, 16, (int(n),), generator=g, dtype=torch.uint8).numpy().tobytes()
           for n in torch.randint(4096, 12289, (2000,), generator=g)]   # 2000 raw samples of 4-12 KiB
records = [zlib.compress(smp) for smp in samples]                       # what the data set stores
small = WORK / "small"
small.mkdir()
for i, rec in enumerate(records):
    (small / f"{i:05d}.bin").write_bytes(rec)                           # one file per sample
index = data.pack_records(records, WORK / "packed.bin")                 # one file, (offset, length) per sample
print(f"{len(records)} samples, {sum(map(len, samples)) / 2**20:.1f} MiB before compression")

# %% [markdown]
# One shuffled epoch read both ways. The packed reader opens its file once and then only seeks: the index does
# the work the directory did.

# %%
order = torch.randperm(len(records), generator=g).tolist()   # the order a shuffling DataLoader reads in

def epoch_small():       # per sample: path lookup, open, fstat, read, close
    return [(small / f"{i:05d}.bin").read_bytes() for i in order]

def epoch_packed():      # one open for the epoch, then a seek and a read per sample
    out = []
    with open(WORK / "packed.bin", "rb") as f:
        for i in order:
            f.seek(index[i][0])
            out.append(f.read(index[i][1]))
    return out

# %% [markdown]
# `data.count_opens()` counts the files opened inside a block, from Python's own audit events (PEP 578: every
# `open()`, `os.open` and `Path.read_bytes` raises one), the in-process view of what `strace -e trace=openat` shows:

# %%
with data.count_opens() as opens_small:
    got_small = epoch_small()
with data.count_opens() as opens_packed:
    got_packed = epoch_packed()
print(f"files opened for one epoch: {opens_small.count} (one file per sample), {opens_packed.count} (packed)")
assert got_small == got_packed == [records[i] for i in order]   # the same bytes, in the same order
assert (opens_small.count, opens_packed.count) == (2000, 1)

# %% [markdown]
# What each costs here, measured in one run (interleaved, median of 5): the two epochs, and beside them two things
# a loader also does with the same bytes, copying them in memory and decompressing them.

# %%
# NBVAL_IGNORE_OUTPUT
blob = b"".join(records)
runs = {"small files": epoch_small, "packed": epoch_packed, "memory copy": lambda: bytearray(blob),
        "decompress": lambda: [zlib.decompress(rec) for rec in records]}
ms = {k: t.median * 1e3 for k, t in bench.compare(runs, warmup=1, repeats=5).timings.items()}
gain = ms["small files"] / ms["packed"]
print(f"one epoch here: {ms['small files']:.1f} ms from 2000 files ({ms['small files'] / 2:.1f} µs per file), "
      f"{ms['packed']:.1f} ms from the packed file, {gain:.1f}x {'faster' if gain > 1 else 'slower'}")
print(f"the same {len(blob) / 2**20:.1f} MiB copied in memory: {ms['memory copy']:.2f} ms; decompressed: "
      f"{ms['decompress']:.0f} ms")
assert ms["small files"] > 4 * ms["memory copy"] and ms["decompress"] > 4 * ms["memory copy"]

# %% [markdown]
# Read the figures with what this machine hides in mind. The files were written a moment ago, so every one of them
# sits in the kernel's page cache and no disk was touched: the time per file above is system calls and path
# lookups only. On a shared parallel file system each open and stat is instead a network round trip to the
# metadata server, queued behind every other job's, so the gap between the two readers there is usually far wider
# than here. To see where a real loader's time goes, count its system calls on the cluster:
# `strace -c -f -e trace=openat,newfstatat,statx,read,close python load.py` (with `-f`, its worker processes too).
#
# Formats built on the packed idea: WebDataset's tar shards, TFRecord, HDF5, LMDB, Parquet and Arrow files,
# MosaicML's MDS shards. A shuffle then reads shards in random order and shuffles samples in a buffer, or seeks
# through an index as above. Convert once, in the data preparation step, and record the packed data set's version
# (section 6).
#
# > **Common misconception** (seed 000 §1.2): in training, the forward and backward passes are compute-bound,
# > synchronisation is communication-bound, and data loading is the memory-access-bound part (访存密集), the kind of
# > bottleneck the article relieves with 16-bit formats that halve the bytes moved (its §1.1).
# >
# > **Why it is wrong:** the article's 访存 spans GPU memory, host memory and disk (its §1.1), but its remedy acts
# > on memory bandwidth only, and a loader hands each step megabytes to tens of megabytes, which memory copies in
# > milliseconds; neither the host's DRAM nor the GPU's HBM is what it waits for. Its time goes to the storage path
# > (the latency and metadata operations of every file, the throughput of a shared file system) and to the CPU
# > (decoding JPEGs or compressed records, augmenting, collating), and none of that shrinks when the model computes
# > in BF16: the files and their decoding stay the same. The remedies are worker processes
# > (`DataLoader(num_workers=...)`), prefetching, packed files and decoding on the GPU (NVIDIA DALI). The
# > memory-bound parts of a step are its elementwise operations, normalisations and optimizer updates (notebook 07's
# > roofline), and those are what 16-bit formats speed up.
# >
# > **What is true:** in the cell above, reading the epoch from small files and decompressing it both take more than
# > 4 times as long as copying the same bytes in memory (the assert; the lines above say by how much here).

# %% [markdown]
# ## 6. The lifecycle beyond checkpoints
#
# **Stretch.**
# A run that finished is not yet a result anyone can use or check. The stages of a reusable run: prepare the data
# and record its version; fix the environment; request resources; validate small (notebook 12); train with
# config, seed, logs and checkpoints; **evaluate** on independent data; **deploy** with a chosen batch size,
# concurrency and precision (notebook 15); **archive** the model, config, metrics, logs and environment. A run
# that *runs* needs the code; a run that can be *reproduced* also needs the same data, environment and parameters.
#
# **Run here.** The run to archive: the tiny GPT of notebook 04, trained on the reverse task, with a held-out test
# set. The data gets a version from its content (a sha256 of the tensors), the run folder a manifest with the hash of
# every file, and a restored model must give the same evaluation:

# %%
task = data.make_token_task("reverse", n=4096, n_digits=6, vocab_size=12, seed=0)
test = data.make_token_task("reverse", n=512, n_digits=6, vocab_size=12, seed=1)  # independent data
run = train.train(models.TinyGPT(vocab_size=12, seq_len=task.seq_len, seed=0),
                  data.Batches(task.inputs, task.targets, batch_size=32, seed=0),
                  policy="fp32", steps=100, lr=3e-3, device="cpu", progress=False)
model = run.model.eval()
with torch.inference_mode():
    acc_fp32 = test.answer_accuracy(model(test.inputs), test.targets)

# %%
run_dir = WORK / "run"
run_dir.mkdir()
torch.save(model.state_dict(), run_dir / "model.pt")
meta = {"data_train": L.fingerprint(task.inputs, task.targets), "data_test": L.fingerprint(test.inputs, test.targets),
        "config": {"model": "TinyGPT", "steps": 100, "lr": 3e-3, "seed": 0}, "test_accuracy": acc_fp32,
        "torch": torch.__version__}
manifest = L.write_manifest(run_dir, meta)
print("train data version", meta["data_train"][:12], "| test data version", meta["data_test"][:12])
print("manifest lists:", sorted(p.name for p in run_dir.iterdir() if p.name != "manifest.json"))

# %%
restored = models.TinyGPT(vocab_size=12, seq_len=task.seq_len)
restored.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True))
with torch.inference_mode():
    assert test.answer_accuracy(restored.eval()(test.inputs), test.targets) == acc_fp32
assert L.verify_manifest(run_dir) == []
with open(run_dir / "model.pt", "r+b") as f:    # one flipped byte, as a bad copy or a full disk would leave
    f.seek(100); byte = f.read(1); f.seek(100); f.write(bytes([byte[0] ^ 1]))
print("after one flipped byte:", L.verify_manifest(run_dir))
assert L.verify_manifest(run_dir) == ["model.pt: changed (sha256 differs)"]

# %% [markdown]
# ## 7. Reading speed-up claims
#
# **Run here.** Articles promise "2-5x from mixed precision, fusion and better communication" and report case studies
# such as "3 days to 18 hours". Such figures are true for the job they were measured on, with its own baseline and
# bottleneck. Amdahl's law says what part of a job a speed-up can reach: if a fraction `f` of the time gets `s` times
# faster, the job gets 1 / ((1 − f) + f / s) faster, and never more than 1 / (1 − f).

# %%
for f, s in ((0.6, 2.0), (0.6, 8.0), (0.9, 8.0), (0.6, float("inf"))):
    print(f"{f:.0%} of the step {'infinitely' if s == float('inf') else f'{s:g}x'} faster -> the step "
          f"{T.amdahl(f, s):.2f}x faster")
# the bound is approached, never passed, as s grows (checked on finite s, not by the formula's own inf case)
assert T.amdahl(0.6, 2.0) < T.amdahl(0.6, 8.0) < T.amdahl(0.6, 1e9) < 1 / (1 - 0.6)
assert math.isclose(T.amdahl(0.6, 1e9), 1 / (1 - 0.6), rel_tol=1e-6)

# %% [markdown]
# > **Common misconception** (seed 002 §7.2): a profile of one BERT iteration found "75 % of the time in an
# > inefficient LayerNorm", "30 % in communication", and attention at 40 % of peak, so the fixes should add up.
# >
# > **Why it is wrong:** shares of one iteration's time add up to at most 100 %; 75 % + 30 % is already 105 %. Either
# > communication overlapped the LayerNorm (then removing one does not remove the other's time), or the numbers come
# > from different runs. Speed-ups from separate fixes multiply only when they act on disjoint parts of the time.
# >
# > **What is true:** measure the shares in one profile (notebook 07), check that they add up, and bound each fix
# > with Amdahl's law before you promise a speed-up. The cell below does the arithmetic.

# %%
shares = {"LayerNorm": 0.75, "communication": 0.30}  # the article's figures (nothing to assert: they are given)
print(f"shares add up to {sum(shares.values()):.0%} of one iteration")
print(f"if LayerNorm really were 75 % and fusion made it 3x faster: at most {T.amdahl(0.75, 3.0):.2f}x overall")

# %% [markdown]
# ## 8. What needs a GPU or a site's hardware
#
# **Stretch.**
# **Explained, not run** unless a section says otherwise. On a GPU node, these are the tools and settings to reach
# for.
#
# ### Watching a GPU: `nvidia-smi dmon`, Nsight Compute and tensor-core utilisation
#
# `nvidia-smi dmon -s pucm -d 1` prints one line per second per GPU: power (W) and temperatures (`p`), `sm` and
# `mem` utilisation (`u`), clocks (`c`), memory used (`m`). `sm` is the same time-based figure as `nvidia-smi`'s
# GPU-Util (notebook 07): the share of time *some* kernel ran, not how busy the units were; `mem` is the share of time
# device memory was being read or written. A high `sm` with a low step rate means the kernels are small or waiting on
# memory; a low `sm` means the GPU waits for the data loader, the CPU or the network.
#
# To see whether the tensor cores work, profile a few steps with **Nsight Compute**:
# `ncu --set full -k regex:gemm -c 10 -o report python train.py`, then read the *Compute Workload Analysis* (pipe
# utilisation, including the tensor pipe) and *Memory Workload Analysis* sections. The tensor-pipe metric names
# depend on the architecture (on Ampere, `sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active`);
# `ncu --query-metrics | grep -i tensor` lists your GPU's. Low tensor-core activity with a high matmul share means
# matmuls run in FP32 (autocast does not cover them, or shapes are not multiples of 8/16) or custom ops have no
# half-precision kernel. For continuous monitoring, DCGM's profiling metrics (`dcgmi dmon -e 1002,1004`: SM active,
# tensor pipe active) cost almost nothing.
#
# > **Common misconception** (seed 002 §6.3): `nvprof` is the tool for measuring how much of a step communication
# > takes.
# >
# > **Why it is wrong:** `nvprof` and the Visual Profiler do not support GPUs of compute capability 8.0 and later
# > (A100, H100); NVIDIA replaced them with Nsight Systems (the timeline) and Nsight Compute (single kernels).
# >
# > **What is true:** `nsys profile --trace=cuda,nvtx,osrt -o step python train.py` puts the NCCL kernels on the
# > GPU timeline next to the compute kernels, which is what the share of communication needs; `torch.profiler` shows
# > them as well (notebook 07), and NVIDIA's profiler documentation states the support limits.
#
# ### L2 hit rate, SM efficiency and other rules of thumb
#
# Nsight Compute reports, per kernel, the **L2 hit rate** (`lts__t_sector_hit_rate.pct`): the share of memory
# requests the L2 cache served without going to HBM. A low hit rate in a kernel that reuses data means its tiles do
# not fit or its accesses are scattered; a streaming elementwise kernel has a low hit rate by nature and that is
# fine. Targets like "L2 hit rate above 70 %" or "SM efficiency 85-95 %" are rules of thumb for particular kernels, not
# goals for every kernel: judge a kernel against its own roofline (notebook 07), memory-bound or compute-bound.
# On a CPU the same idea is the cache hierarchy, which notebook 07's roofline points above 100 % already showed.
#
# ### Graph compilers for inference: TensorRT, XLA, TorchScript
#
# - **TensorRT** (NVIDIA) takes a trained model (from ONNX, or through Torch-TensorRT), fuses layers, picks the
#   fastest kernel for each on *your* GPU and builds an engine for that GPU and TensorRT version, with FP16, INT8 or
#   FP8. Dynamic shapes need profiles (minimum, optimum, maximum shape), and performance can vary across them.
# - **XLA** compiles whole graphs for JAX and TensorFlow (and PyTorch/XLA on TPUs); each new input shape compiles
#   again.
# - **TorchScript** (`torch.jit.script`/`trace`) is PyTorch's older graph format; it is deprecated in current
#   PyTorch in favour of `torch.compile` (just-in-time, notebook 07) and `torch.export` (ahead of time, a graph
#   that other tools such as AOTInductor or TensorRT consume).
# - Further out: compiler frameworks such as MLIR and TVM generate kernels for many kinds of hardware, and
#   structured sparsity (2 of every 4 weights zero) doubles the tensor cores' rate on GPUs since Ampere, at some
#   accuracy cost. Adopt them after the basics of this workbook have paid off, one measured change at a time.
#
# **Run here:** `torch.export` captures a 512 → 2048 → 512 MLP (notebook 15's INT8 example) as a graph of ATen ops
# that gives the same outputs. Capture
# needs code without data-dependent Python: the tiny GPT does not export as it is, because its attention records a
# statistic with `float(tensor)` on every call, a value the graph cannot know in advance.

# %%
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    mlp = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).eval()
    xb = torch.randn(64, 512)
    exported = torch.export.export(mlp, (xb,))
ops = [nd.target.__name__ for nd in exported.graph.nodes if nd.op == "call_function"]
print(f"{len(ops)} ATen ops in the graph: {ops}")
torch.testing.assert_close(exported.module()(xb), mlp(xb))
assert sum("linear" in o for o in ops) == 2 and any("gelu" in o for o in ops)

# %% [markdown]
# ### Communication strategies: parameter server, ring, compression, BatchNorm
#
# How gradients travel is a design choice:
#
# - a **parameter server** holds the weights; workers push gradients and pull weights. It suits sparse updates
#   (a recommendation model's embedding rows: each worker touches a few), but the server's link carries everything;
# - **ring all-reduce** (DDP, NCCL; notebook 09) has no centre: each rank sends and receives 2(p−1)/p of the gradient
#   bytes whatever the number of ranks p is, the least any all-reduce can send, so it suits dense gradients of every
#   size. Its cost is latency: 2(p−1) steps one after another, which is why NCCL also has a tree algorithm for
#   small messages on many ranks;
# - **hybrid** schemes split the model: embeddings through a server or all-to-all, dense layers through all-reduce;
#   NCCL itself is hierarchical, NVLink inside a node and the network across nodes.
#
# **Run here**, on 4 gloo ranks in one torchrun launch (`labkit.recipes.comm_patterns`): both written with
# point-to-point `send`/`recv`, each rank summing 65 536 fp32 values (256 KiB), and compared with `dist.all_reduce`.
# Rank 0 is the server and contributes its own gradient too. The ring cuts the tensor into p pieces: in the
# reduce-scatter each rank passes one piece to its right neighbour and adds the one from its left, until every rank
# holds the full sum of one piece; the all-gather then passes the finished pieces around.

# %%
print(inspect.getsource(comm.ps_allreduce))
print(inspect.getsource(comm.ring_allreduce))

# %% [markdown]
# The bytes each rank sent and received are read from `torch.profiler`'s records of the `send` and `recv` calls
# (`handpar.recorded_collectives`, notebook 11), not counted by the functions above, and compared with the formulas:
# the server sends and receives (p−1)·N bytes, a worker N each way; every ring rank 2(p−1)/p·N.

# %%
cp = launch("labkit.recipes.comm_patterns", nproc=4, timeout=180, stream=False, args=["--device", "cpu"])
ar, p = cp["allreduce"], cp["world_size"]
N = ar["bytes"]
for name in ("ps", "ring"):
    print(f"{name:>4}: bytes sent by rank 0..{p - 1}: {ar[name]['sent']}, received: {ar[name]['received']}")
assert ar["ps"]["sent"] == ar["ps"]["received"] == [(p - 1) * N] + [N] * (p - 1)   # the server (p−1)·N, workers N
assert ar["ring"]["sent"] == ar["ring"]["received"] == [2 * (p - 1) * N // p] * p  # 2(p−1)/p·N on every rank
assert ar["ps"]["max_rel_diff"] < 1e-5 and ar["ring"]["max_rel_diff"] < 1e-5      # dist.all_reduce's sums

# %% [markdown]
# With 4 ranks the server moves 3·N each way while a ring rank moves 1.5·N; with 64 ranks, 63·N against under 2·N.
# The sums agree with `dist.all_reduce`'s up to rounding (the assert allows 1e-5, relative), not necessarily bit for
# bit: each algorithm may add the four contributions in another order (notebook 02).
#
# Three ways to send less: accumulate gradients over several micro-batches before communicating (DDP's
# `no_sync()`, notebook 09); overlap communication with the backward pass (DDP's buckets, DeepSpeed's
# `overlap_comm`); and **compress** gradients: to 16 bits (DDP's `fp16_compress_hook`), to a low-rank
# approximation (PowerSGD), or to one bit per value, as DeepSpeed's **1-bit Adam** does with Adam's momentum after a
# full-precision warm-up (it needs NCCL or MPI on GPUs). One bit per value loses most of each step's information;
# *error feedback* adds what was not sent to the next step, so nothing is lost for good. **Run here** on one rank's
# gradients over 50 steps:

# %%
rng = torch.Generator().manual_seed(0)
grads = [torch.randn(10_000, generator=rng) for _ in range(50)]
true_sum = torch.stack(grads).sum(0)
one_bit = lambda v: v.abs().mean() * v.sign()        # 1 bit per value and one fp32 scale: 32x fewer bytes
sent_plain = sum(one_bit(gr) for gr in grads)
sent_ef, residual = torch.zeros(10_000), torch.zeros(10_000)
for gr in grads:
    c = gr + residual                                 # error feedback: add back what was not sent last time
    sent_ef, residual = sent_ef + one_bit(c), c - one_bit(c)
rel = lambda v: ((v - true_sum).norm() / true_sum.norm()).item()
print(f"error of the summed updates: 1-bit {rel(sent_plain):.2f}, 1-bit with error feedback {rel(sent_ef):.2f}")
assert rel(sent_ef) < 0.5 * rel(sent_plain)

# %% [markdown]
# **BatchNorm across ranks.** BatchNorm normalises with the mean and variance of the batch it sees, which under DDP
# is each rank's own rows: DDP leaves BatchNorm local, and with `broadcast_buffers=True` (its default) copies rank
# 0's running statistics to the other ranks before each forward. So p ranks with b rows each do not compute what one
# process with p·b rows computes. The article's "local synchronisation" of the BN layers (seed 002 §4.3), statistics
# kept per rank or synchronised only within a small group of ranks (`SyncBatchNorm(process_group=...)`), is that
# trade: less communication, statistics from fewer samples. With a large per-rank batch the difference is small;
# with a small one (detection and segmentation models, a few images per GPU) the statistics get noisy, and
# `torch.nn.SyncBatchNorm` exchanges them in every forward pass (an all-gather of each rank's mean, inverse standard
# deviation and row count) and all-reduces two gradient sums in backward. Transformers
# use LayerNorm, which normalises each sample on its own: nothing to synchronise.
#
# torch runs `SyncBatchNorm` only on GPUs and other accelerators, so the same launch also synchronised the
# statistics by hand: one all-reduce of the row counts, one of the sums and one of the squared deviations, the last
# two summing the gradients over ranks in backward as well:

# %%
print(inspect.getsource(comm.sync_batch_norm))

# %% [markdown]
# Each rank had b = 4 rows; the reference is one process with all 16. The largest difference from it, over every
# rank, after one forward and backward:

# %%
bn = cp["batchnorm"]
print(f"{p} ranks x {bn['batch_per_rank']} rows, local statistics:",
      ", ".join(f"{k} {v:.2f}" for k, v in bn["local"].items()))
print("synchronised statistics, every difference below 1e-5:", max(bn["sync"].values()) < 1e-5)
print("local running means differ between ranks:", bn["running_mean_differs_between_ranks"])
print("torch.nn.SyncBatchNorm on CPU tensors:", bn["torch_syncbn"].get("error", "ran"))
assert min(bn["local"].values()) > 1e-2 and max(bn["sync"].values()) < 1e-5
assert bn["running_mean_differs_between_ranks"]

# %% [markdown]
# ### Energy: watts, joules and work per joule
#
# Energy efficiency is useful work per joule: tokens or samples per joule, or FLOPs per watt-second. On a GPU,
# `nvidia-smi --query-gpu=power.draw --format=csv -lms 100` samples the power, NVML's total energy counter
# (`nvmlDeviceGetTotalEnergyConsumption`, or DCGM's energy field) integrates it, and Slurm can account a job's energy
# (`sacct -j JOB --format=JobID,ConsumedEnergy`) where the site enabled it. On Intel and AMD CPUs, the RAPL counter
# measures the package; many systems let only root read it, and virtual machines and containers usually hide it:

# %%
# NBVAL_IGNORE_OUTPUT
e0 = T.read_energy_uj()
if e0 is None:
    print("no readable RAPL energy counter here (common in VMs and containers): nothing measured")
else:
    a = torch.randn(512, 512)
    t = bench.time_fn(lambda: a @ a, warmup=1, repeats=50)
    joules = (T.read_energy_uj() - e0) / 1e6
    print(f"{joules:.2f} J for 51 matmuls: {51 * 2 * 512**3 / joules / 1e9:.1f} GFLOP per joule (package, all cores)")

# %% [markdown]
# ### `NCCL_IB_TIMEOUT` and the article's 13B reference configuration
#
# Seed 000 closes with a configuration it ran for pre-training a 13B model on one node with 8 A100 80 GB GPUs,
# PyTorch 2.1 and DeepSpeed, BF16, AdamW. Quoted as printed there (comments translated; the extracted text had lost
# its `=` and quote characters, which are restored):
#
# ```bash
# # key environment variables
# export NCCL_IB_DISABLE=0
# export NCCL_IB_TIMEOUT=22
# export NCCL_DEBUG=INFO
# export OMP_NUM_THREADS=8
# ```
#
# ```python
# # DeepSpeed configuration, key items
# ds_config = {
#     "train_batch_size": 64,
#     "gradient_accumulation_steps": 2,
#     "fp16": {"enabled": False},
#     "bf16": {"enabled": True},
#     "zero_optimization": {
#         "stage": 2,
#         "offload_optimizer": {"device": "cpu"},
#         "overlap_comm": True,
#         "contiguous_gradients": True
#     },
#     "gradient_clipping": 1.0,
#     "steps_per_print": 100
# }
# ```
#
# The article reports steadier training than FP16 with dynamic loss scaling and about 85 % linear scaling efficiency
# across the 8 GPUs (not something a CPU can check). What each line means:
#
# - `NCCL_IB_TIMEOUT=22` is not seconds: it is the exponent of InfiniBand's acknowledgement timeout, 4.096 µs × 2^22
#   ≈ 17 s per attempt (recent NCCL releases default to 20, about 4.3 s; older ones to 18). A larger value rides out
#   short network hiccups instead of failing the job; it also makes a real failure take longer to surface.
# - `NCCL_IB_DISABLE=0` is NCCL's default (InfiniBand allowed); what hurts is a stray `=1` (notebook 09).
# - `OMP_NUM_THREADS=8` holds per process: 8 ranks use 64 threads, which must not exceed the node's cores.
# - DeepSpeed requires `train_batch_size` = micro-batch × accumulation steps × GPUs, so each GPU takes 4 sequences
#   per micro-step. ZeRO-2 shards gradients and optimizer states, which brings 13B's model states to about 49 GB per
#   GPU; offloading the optimizer to the CPU brings them to 26 GB and leaves more room for activations, at the cost
#   of traffic to the host (notebook 10 sizes both).

# %%
ds_config = {"train_batch_size": 64, "gradient_accumulation_steps": 2, "fp16": {"enabled": False},
             "bf16": {"enabled": True},
             "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True,
                                   "contiguous_gradients": True},
             "gradient_clipping": 1.0, "steps_per_print": 100}
tbs, micro, accum = zero.batch_triple(4, ds_config["gradient_accumulation_steps"], 8, ds_config["train_batch_size"])
print(f"micro-batch per GPU: {micro}; NCCL_IB_TIMEOUT=22 waits {T.ib_timeout_seconds(22):.1f} s per attempt")
assert (tbs, micro, accum) == (64, 4, 2) and round(T.ib_timeout_seconds(22), 1) == 17.2

# %% [markdown]
# > **Common misconception** (seed 000 §2.3): across nodes, NCCL must be told explicitly to use InfiniBand, or its
# > traffic goes over TCP.
# >
# > **Why it is wrong:** NCCL looks for InfiniBand/RoCE adapters itself at start-up and uses them when it finds them
# > (`NCCL_IB_DISABLE` defaults to 0, as the quoted configuration sets it). It falls back to sockets only when IB is
# > disabled (`NCCL_IB_DISABLE=1`), when no usable adapter or verbs library is visible (a container without
# > `/dev/infiniband` or libibverbs), or when the network plugin fails to load.
# >
# > **What is true:** nothing has to be switched on; check what NCCL chose. `NCCL_DEBUG=INFO` prints `NET/IB` or
# > `NET/Socket` at start-up (NCCL's documentation of its environment variables lists the defaults; notebook 09 has
# > the table).
#
# ## 9. Exercises
#
# **14.amdahl.** The matmuls take 60 % of a training step (`AMDAHL`); BF16 tensor cores make them 4 times faster.
# How much faster does the whole step get?

# %%
print(AMDAHL)
answer = ...
### BEGIN SOLUTION
answer = T.amdahl(AMDAHL["matmul_share"], AMDAHL["matmul_speedup"])
### END SOLUTION
check("14.amdahl", answer)

# %% [markdown]
# **14.young.** A checkpoint write stalls training for 90 s, and the job fails on average every 12 hours (`YOUNG`).
# Every how many **minutes** should it checkpoint, by Young's rule (section 5, stretch: the interval that balances
# the time spent writing against the work lost to a failure, √(2 · write time · mean time between failures))?

# %%
print(YOUNG)
answer = ...
### BEGIN SOLUTION
answer = L.young_interval(YOUNG["checkpoint_s"], YOUNG["mtbf_s"]) / 60
### END SOLUTION
check("14.young", answer)

# %% [markdown]
# **14.ib-timeout.** How many seconds does one InfiniBand attempt wait with the article's `NCCL_IB_TIMEOUT=22`?
# (Section 8, stretch: the value n sets a wait of 4.096 µs × 2ⁿ.)

# %%
answer = ...
### BEGIN SOLUTION
answer = 4.096e-6 * 2**22
### END SOLUTION
check("14.ib-timeout", answer)

# %% [markdown]
# ## Summary
#
# - HPC and AI share the hardware and the collectives; HPC codes need FP64 where the problem is ill-conditioned (a
#   small residual is not a right answer), and use low precision only with a correction such as iterative refinement.
# - Compiler flags: baseline first, one flag at a time; `-O3 -march=native` vectorises for *this* CPU and can crash on
#   another; `-ffp-contract` and `-ffast-math` change results.
# - `undefined symbol` means an older library was loaded than the one a binary was linked against: find it with
#   `ldd`, `nm -D`, `LD_DEBUG=libs`, and stop overriding the libraries torch shipped with.
# - Containers carry the user-space stack; the host driver and the GPU come in through the NVIDIA Container Toolkit
#   (`--gpus all`) or Apptainer (`--nv`); the driver must support the image's CUDA.
# - Checkpoints: measure the write time, checkpoint about every √(2 × write time × MTBF), keep a manifest of hashes.
# - Data: pack small files into a few large ones with an index; a loader waits on file metadata and on decoding, not
#   on memory bandwidth, and a laptop's page cache hides most of what a parallel file system charges per file.
# - Communication: a parameter server's link carries (p−1)·N each way, a ring rank 2(p−1)/p·N; BatchNorm with
#   per-rank statistics is not the single large batch, synchronised statistics are.
# - Bound every promised speed-up with Amdahl's law, from shares measured in one profile.
#
# Next: notebook 15 serves a model under load. Notebook 13's clinic is where to practise diagnosing broken runs
# with all of it.

# %%
shutil.rmtree(WORK)  # this notebook's scratch folder (created by tempfile above), nothing else
