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

# %% [markdown] lang="zh" en="a1796958aac4"
# # 14 · 平台与工具链
#
# **学习目标**
# - 说明 HPC 与智算（智能计算）的共同点和差异（一边是 FP64 和 MPI，一边是低精度和数据并行），并在一个病态
#   方程组上亲眼看到 FP64 的作用；
# - 编译同一个 C 内核，每次只改一个选项（从 `-O0` 到 `-O3 -march=native`），读懂编译器向量化了什么、
#   `-O2` 为什么可能不做向量化，并知道 `-march=native` 为什么会让二进制文件在另一个节点上无法运行；
# - 复现 cuBLAS/cuDNN 版本不匹配时加载器报出的 `undefined symbol`（未定义符号）错误，并诊断它；
# - 了解容器如何获得 GPU（NVIDIA Container Toolkit、Apptainer `--nv`）；
# - 测量写一次检查点的开销，决定多久写一次，并让一次训练的结果可以核验；
# - 从一个带索引的打包文件中读取数据集，而不是读成千上万个小文件，并说明为什么并行文件系统对小文件格外
#   不友好；
# - 用阿姆达尔定律审视加速比的宣传，并熟悉 GPU 端的工具（`nvidia-smi dmon`、Nsight Compute、TensorRT、
#   能耗计数器、`NCCL_IB_TIMEOUT`），足以在 GPU 节点上使用它们；
# - 用 send/recv 写出参数服务器和环形全归约，统计每个 rank 发送的字节数，并理解为什么使用本地统计量的
#   BatchNorm 在 4 个 rank 上和在单个进程上不是同一个模型。
#
# **前置知识：** notebook 04（小型 GPT）、07（性能分析、屋顶线模型）、12（集群的节点与存储）。
#
# **预计用时：** 80 分钟（核心部分 40 分钟，进阶部分 40 分钟）
#
# 第 4、5、6、8 节是**进阶**内容：容器、检查点 I/O、训练的生命周期以及 GPU 端工具。第一遍学习可以只看
# 其余各节及其练习；单元格仍然按顺序运行。
#
# 本 notebook 用两种标签标明在笔记本电脑上能演示什么、不能演示什么。标为**在本机运行**的小节在任何 CPU 上
# 都能执行，并对所讲的内容做断言；耗时因机器而异，所以测试不比较这些单元格的输出，只检查处处成立的事实。
# 标为**只讲解，不运行**的小节需要 GPU、计算中心的硬件或计算中心的软件：它们说明你要输入什么、会读到什么。

# %%
# %matplotlib inline
# %load_ext labkit
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

# %% [markdown] lang="zh" en="f8720e632a12"
# ## 1. HPC 与智算：同一个集群，两类工作
#
# 超算中心和 AI 训练集群由相同的部件搭建而成：配有 CPU 和加速器的节点、高速网络、共享的并行存储，以及
# 批处理作业调度系统。在上面运行的工作却不一样：
#
# | | 传统 HPC | 智算 |
# |---|---|---|
# | 典型作业 | 仿真模拟（气象、材料、流体）、工程计算、大规模数据分析 | 训练、微调、推理、向量检索 |
# | 运算类型 | 线性代数、FFT、偏微分方程 | 矩阵乘法、卷积、注意力 |
# | 精度 | 双精度（FP64），有时用单精度（FP32） | FP32、TF32、BF16/FP16、FP8、INT8 |
# | 并行方式 | 进程之间用 MPI，进程内部用线程和 SIMD | 数据并行、张量并行和流水线并行（torch.distributed、NCCL） |
# | 在等什么 | CPU、内存带宽、网络、存储 | 加速器显存、互连、存储、作业排队 |
#
# 每类负载倚重的瓶颈各不相同（即 notebook 00 讲的三种瓶颈）。分子动力学的时间花在 MPI rank 之间的邻居
# 数据交换和 FFT 上；流体力学让大型网格流过内存，属于访存密集型；训练则三种瓶颈同时用到：前向和反向传播
# 靠算力，逐元素运算和归一化靠显存带宽，梯度同步靠网络；此外还有第四个瓶颈，即数据加载器，它等待的是存储
# 和 CPU 的解码，而不是内存（第 5 节会测量它）。张量核心（Tensor Core）是 NVIDIA GPU 中的矩阵计算单元，
# 随 Volta（2017 年，FP16）引入，在 Ampere（2020 年）上又增加了 BF16 和 TF32；它的速率是 FP32 的许多倍，
# 这也是混合精度从 AI 领域扩散到 HPC 程序中的原因。两边的集合通信也是相同的：MPI 的 `MPI_Allreduce` 就是
# DDP 的全归约（AllReduce），而且在编译时启用了 MPI 的 PyTorch 中，torch.distributed 甚至可以直接运行在
# MPI 之上。
#
# ### FP64 依然重要：一个病态方程组
#
# **在本机运行。** AI 能容忍低精度，因为训练本来就充满噪声。许多科学计算问题却不行。8×8 的希尔伯特（Hilbert）
# 矩阵 `H[i, j] = 1 / (i + j + 1)` 是经典的病态方程组：我们取 `x = (1, …, 1)`，用 FP64 计算 `b = H x`，
# 然后分别用 FP64、用 FP32，以及把数据存成 BF16，来求解 `H x = b`。
#
# **先预测，再运行。** 三种方式中，哪几种求得的 `x` 相对误差低于 1e-3？请以名称的集合作答。

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

# %% [markdown] lang="zh" en="3bb179474f57"
# 经验法则：求解一个方程组大约会损失 log10(条件数) 位有效数字。FP64 约有 16 位有效数字，在这里至少还能
# 保住约 6 位；FP32 约有 7 位，一位也保不住，可它的残差 `‖Ax − b‖` 已经小到 FP32 所能达到的极限。所以残差
# 小不等于答案对：一个只凭“看起来已经收敛”来比较结果的程序，可能每一位数字都是错的。这就是仿真计算坚持
# 使用 FP64 的原因，也是 HPC 只在有方法修正误差的地方才使用低精度的原因。
#
# **混合精度迭代精化**就是这样一种方法，也是 HPL-MxP 基准测试背后的思路：先用低精度对矩阵做一次分解（开销
# 最大的 O(n³) 部分，张量核心能在这里发挥作用），然后反复用 FP64 计算残差，并用这份廉价的分解因子解出修正量。
# 对于条件数不太大的矩阵（条件数 × FP32 的机器精度 ε 远小于 1），它的误差能收敛到 FP64 的水平：

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

# %% [markdown] lang="zh" en="685b6bfd6179"
# ## 2. 编译器与编译选项：同一个 C 内核，每次只改一个选项
#
# **在本机运行**（前提是装有 gcc）。工具链分为好几层（作业调度系统、编译器、库、性能分析器）；每一层熟练
# 掌握一两个工具，胜过装上一大堆。编译器决定了程序能用上多少硬件能力：同一个循环，可以每条指令处理一个
# 元素，也可以一次处理 8-16 个（SIMD）。在集群上你会遇到 GCC、LLVM 的 clang、Intel oneAPI 的 `icx`、
# `icpx` 和 `ifx`（分别是 `icc`、`icpc` 和 `ifort` 的后继者），以及用于 CUDA 的 NVIDIA `nvcc`；PyTorch
# 自己也会在运行时编译（`torch.compile` 生成 C++ 或 Triton 代码，见 notebook 07；Triton 内核见 notebook 08）。
# 本机装有哪些编译器：

# %%
# NBVAL_IGNORE_OUTPUT
for name, path in T.find_compilers().items():
    print(f"{name:>6}: {T.compiler_version(name) if path else 'not installed'}")

# %% [markdown]
# The kernel evaluates a cubic polynomial on every element of an array of 16 384 floats, 2000 times per round, and
# reports its best round (the least disturbed one). Every element is independent of the others, so a compiler may
# vectorise the loop:

# %% [markdown] lang="zh" en="eb7d7497ac80"
# 这个内核对一个含 16 384 个 float 的数组中的每个元素计算一个三次多项式，每轮计算 2000 次，并报告最好的
# 一轮（受干扰最少的一轮）。每个元素都与其他元素无关，所以编译器可以把这个循环向量化：

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

# %% [markdown] lang="zh" en="bab68160c3dc"
# 下面几次构建**每次只差一个选项**，每次都与前一次比较：`-O0`（不优化：每个变量都要写回内存再读出来）、
# `-O2`（常用的发布级别）、`-O3`（更激进的循环优化，向量化器使用完整的代价模型），然后是 `-march=native`
# （使用构建所在 CPU 的全部指令），最后，如果 CPU 支持 AVX-512，再加上 `-mprefer-vector-width=512`。所有
# 构建还都加了 `-ffp-contract=off`：没有它，一旦编译选项允许编译器使用 FMA 指令（在支持 FMA 的 CPU 上用
# `-march=native`，或者用 `-mfma`），编译器就可能把 `a*x + b` 融合成一条指令，只做一次舍入而不是两次，
# 结果的比特就会随编译选项而变。每个耗时旁边列出 GCC 报告它为该循环使用的最宽向量（`-fopt-info-vec`：
# 16 字节是 SSE，4 个 float；32 字节是 AVX2，8 个 float；64 字节是 AVX-512，16 个 float）：

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
# read the report of your compiler. Three variants of `poly`, as written and then one more change at a time:

# %% [markdown] lang="zh" en="59effac55d95"
# **为什么 `-O2` 可能让循环保持标量。** GCC 12 及更新的版本在 `-O2` 下也会运行向量化器，但用的是*非常廉价*
# （very cheap）的代价模型：只有当向量代码不需要任何额外的辅助代码时，它才会向量化一个循环。这个循环需要
# 两段辅助代码：一是运行时检查 `x` 和 `y` 不重叠（两个指针可能互为别名），二是处理最后 `n mod 4` 个元素的
# 标量*收尾循环*（epilogue），因为 `n` 要到运行时才知道。给指针加上 `restrict` 可以去掉第一段；在编译时
# 固定循环次数，并使它是向量宽度的整数倍，可以去掉第二段。`-O3`（*动态*代价模型）或
# `-fvect-cost-model=cheap` 两段都能接受。GCC 12 之前的版本在 `-O2` 下根本不做向量化，而 clang 会做，
# 所以要读你所用编译器的报告。下面是 `poly` 的三个版本：原样的写法，以及每次多改一处的两个版本：

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

# %% [markdown] lang="zh" en="eb8550b29571"
# 向量宽度还说明了另一件事。在支持 AVX-512 的 CPU 上，单用 `-march=native` 通常仍停留在 32 字节向量：
# GCC 对大多数 AVX-512 CPU 的调优设定了 `-mprefer-vector-width=256`，因为在好几代 Intel 处理器上，512 位
# 指令会降低时钟频率，而在短循环中又收益不大；最后一次构建要求使用 64 字节向量，它的耗时说明了这样做在
# 这里是否划算。用测量来做决定，每次只改一个选项。
#
# 从中应该记住：
#
# - **测量，每次只改一个选项。** 以默认构建作为基线，改一个选项，只有测量结果支持时才保留它。从别处抄来
#   的编译选项，是针对另一个编译器、另一种 CPU、另一份代码调出来的。
# - **`-march=native` 把二进制文件绑定在构建它的那种 CPU 上。** 在支持 AVX-512 的登录节点上构建，到了较老
#   的计算节点上就会因 `Illegal instruction` 而崩溃。要在实际运行的那类节点上构建，或者指定一个整个集群都
#   支持的基线（`-march=x86-64-v3` 即 AVX2 加 FMA）。
# - **有些选项改变的不只是速度，还有结果：** `-ffp-contract`（FMA）、`-ffast-math`（对求和重新结合、去掉
#   NaN/inf 检查）。要在不同构建之间逐位比较结果，就必须把它们固定下来。
# - **nvcc** 用主机编译器编译主机端代码，并为你列出的 GPU 架构编译设备端代码
#   （`-gencode arch=compute_90,code=sm_90`，或 `-arch=sm_80`）；如果二进制文件中没有它所遇到的 GPU 的代码，
#   就会报错“no kernel image is available for execution on the device”。`-lineinfo` 让 Nsight Compute
#   能把指标对应到源代码行。
#
# ## 3. 库版本与“undefined symbol”（未定义符号）错误
#
# 在 PyTorch 和 GPU 之间，还隔着几个各有版本号的库：CUDA 运行时、**cuBLAS**（矩阵乘法）、**cuDNN**（卷积、
# 注意力、归一化）、**NCCL**（集合通信），在 CPU 上则是 oneDNN 和某个 BLAS 库。新版本可能带来针对新 GPU
# 的新内核、在多个内核之间做选择的不同启发式规则（因此速度和舍入都会不同：结果的最后几位会变）、新的默认值，
# 以及修复的或新引入的 bug。单独升级 cuBLAS 可能让矩阵乘法变快，但受支持的做法是使用你的 PyTorch 构建
# 经过测试的那一整套库：CUDA 版 torch 的 pip wheel 以 `nvidia-*` 包的形式自带 cuBLAS、cuDNN 和 NCCL。
# GPU 驱动是另一半：它必须至少与这些库所需的 CUDA 版本一样新。当前这个 torch 构建时所用的版本：

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

# %% [markdown] lang="zh" en="7dbe78dcf328"
# **在本机运行。** 如果加载器找到的库比程序链接时所用的库*更旧*，程序就会引用一个旧库中没有的函数，于是
# 加载失败：`undefined symbol: ...`（对 torch 来说，通常是某个 `cudnn...` 或 `cublas...` 开头的名字，起因
# 是有人把另一个 cuDNN 放到了 `LD_LIBRARY_PATH` 的最前面）。下面用一个小库的两个版本重现同样的情况：版本 2
# 新增了函数 `scale_fast`，一个针对版本 2 构建的扩展调用了它。

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
# Whether this notebook's kernel runs in a container, read from the marks runtimes leave:

# %% [markdown] lang="zh" en="63842897c4e0"
# 在真实节点上如何诊断：对 torch 的 `lib/libtorch_cuda.so`（位于
# `python -c "import torch, os; print(os.path.dirname(torch.__file__))"` 打印出的文件夹中）运行 `ldd`，
# 可以看到每个库解析到了哪个文件；`nm -D --defined-only libX.so | grep name` 可以查看某个文件是否导出了
# 缺失的名字；`LD_DEBUG=libs python -c "import torch"` 会跟踪整个搜索过程。修复办法几乎从来不是把某个库
# 复制进来，而是去掉覆盖了 torch 自带库的东西（`.bashrc` 中的一行 `LD_LIBRARY_PATH`、一条
# `module load cudnn/...`），或者使用一个固定了整个软件栈的容器。每次运行都要记录版本（notebook 12 的
# 可复现性记录，`python -m labkit doctor`）。
#
# ## 4. 容器：带 GPU 的 Docker 与 Apptainer
#
# **进阶。**
# **只讲解，不运行**（需要装有容器运行时的 GPU 节点）。容器镜像冻结了用户态的软件栈：Python、PyTorch、
# CUDA 运行时、cuBLAS、cuDNN、NCCL。GPU **驱动**不在镜像里：它属于宿主机的内核，由容器运行时在容器启动时
# 把设备文件和用户态库（`libcuda.so`、`nvidia-smi`）带进容器：
#
# - **Docker 或 Podman 加上 NVIDIA Container Toolkit：** `docker run --gpus all image python train.py`
#   （或者用 CDI：`--device nvidia.com/gpu=all`）。Docker Compose 可以为每个服务单独申请 GPU。适合一台或
#   少数几台机器。
# - **Apptainer（前身为 Singularity）** 是 HPC 集群上常用的运行时，因为它以用户身份运行，不需要 root
#   守护进程：`apptainer exec --nv image.sif python train.py`；`--nv` 会把宿主机的驱动库和 GPU 挂载进来。
#   在 Slurm 作业中：`srun apptainer exec --nv image.sif torchrun ...`。
# - **规则：** 宿主机驱动必须支持镜像中的 CUDA 版本。驱动太旧会报错“CUDA driver version is insufficient
#   for CUDA runtime version”。
# - **容器中的多节点作业**需要容器内有 InfiniBand（无限带宽网络）设备和支持 RDMA 的网络栈
#   （`/dev/infiniband`、镜像中的 libibverbs）；Apptainer 默认共享宿主机的网络，Docker 则需要
#   `--network host` 或覆盖网络（overlay），这也是集群偏爱 Apptainer 的原因之一。
#
# 根据各种容器运行时留下的痕迹，判断本 notebook 的内核是否运行在容器中：

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

# %% [markdown] lang="zh" en="198c7e664764"
# ## 5. 检查点与日志 I/O：保存的代价
#
# **进阶。**
# **在本机运行。** 写检查点时训练会停顿（除非异步写入）；而共享文件系统是大家共用的：一百个 rank 同时各写
# 自己的分片，或者一个作业写成千上万个小日志文件，都会拖慢所有人。先看在这里写一次的代价：写到本地临时
# 文件夹，并调用 `fsync`，确保字节真正落到磁盘上：

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

# %% [markdown] lang="zh" en="cb49414e63b3"
# 小块写入的耗时主要是固定开销（打开文件、元数据、`fsync`），大块写入则主要受带宽限制。在集群上，把
# 检查点写到项目文件系统或并行文件系统（绝不要在那里写大量小文件），保留最近的几个，作业结束后把更早的
# 归档，并且只让一个 rank 写日志。
#
# **多久写一次？** 写得太频繁，浪费的是写入的时间；写得太少，浪费的是作业失败时丢失的工作（平均为半个
# 间隔）。Young 公式在两者之间取得平衡：间隔 = √(2 × 写入时间 × MTBF)，其中 MTBF 是作业的平均故障间隔
# 时间（一个跑在 N 个节点上的作业，出故障的频率约为单个节点的 N 倍）。以一个 13B 模型为例，连同 AdamW
# 状态（每个参数约 16 字节，共 208 GB）以 3.5 GB/s 写入，每个检查点约需 60 s，每天故障一次：

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

# %% [markdown] lang="zh" en="bcc4cb192fb2"
# ### 读取数据：大量小文件，还是一个打包文件
#
# **在本机运行。** 数据集常常是一个样本一个文件：一张图片、一段视频、一个 JSON 文档。seed 004 §2.3 建议不要
# 把大量小文件堆在一个被许多作业同时读取的共享目录里，而应把它们打包、建立索引，或者转换成顺序读取的格式。
# 原因在于，一个文件的代价不止于它的字节。读一个文件要经过路径查找、`open`（权限检查、文件描述符）、
# `fstat`、`read` 和 `close`。在节点自己的磁盘上，这些都是系统调用，只要内核缓存了目录和文件的 inode，
# 几微秒就能完成。在并行文件系统（Lustre、GPFS）上，open、stat 以及每一次创建文件，都是通过网络发给文件
# 系统**元数据服务**的请求（在 Lustre 上就是元数据服务器 MDS），而整个集群的所有作业共用这项服务；文件
# 内容本身则从许多存储服务器并行读取。以随机顺序读取一百万张图片，就意味着每个 epoch、每个读数据的 rank
# 都要与元数据服务往返一百万次。
#
# 同样的 2000 个样本，每个 4 到 12 KiB（压缩后约为原大小的 60 %），像图片（JPEG、PNG）那样以压缩形式
# 存储：一次存成每个样本一个文件，一次打包成单个文件，并为每个样本附上 (offset, length) 索引：

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

# %% [markdown] lang="zh" en="9dca9208c914"
# 以打乱后的顺序，用两种方式各读一个 epoch。打包读取器只打开一次文件，之后只做 seek：原来由目录完成的
# 工作，现在由索引完成。

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

# %% [markdown] lang="zh" en="b9ed47718765"
# `data.count_opens()` 统计一个代码块中打开的文件数，依据是 Python 自己的审计事件（PEP 578：每次 `open()`、
# `os.open` 和 `Path.read_bytes` 都会触发一个），相当于在进程内部看到 `strace -e trace=openat` 所显示的内容：

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

# %% [markdown] lang="zh" en="d81a7e7e0b34"
# 在同一次运行中（交替执行，取 5 次的中位数）测量各自的开销：两种方式各读一个 epoch；此外还有加载器对
# 同样的字节也要做的两件事：在内存中复制，以及解压缩。

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

# %% [markdown] lang="zh" en="a653d8910bb2"
# 解读这些数字时，要记住这台机器掩盖了什么。这些文件刚刚才写入，所以每一个都在内核的页缓存里，根本没有
# 碰到磁盘：上面每个文件的耗时只是系统调用和路径查找。在共享的并行文件系统上，每一次 open 和 stat 都是一次
# 到元数据服务器的网络往返，还要排在其他所有作业的请求后面，所以两种读取方式在那里的差距通常比这里大得多。
# 要看清一个真实加载器的时间花在哪里，就在集群上统计它的系统调用：
# `strace -c -f -e trace=openat,newfstatat,statx,read,close python load.py`（加上 `-f`，连同它的 worker
# 进程一起统计）。
#
# 基于打包思路的格式有：WebDataset 的 tar 分片、TFRecord、HDF5、LMDB、Parquet 和 Arrow 文件、MosaicML
# 的 MDS 分片。这时要打乱顺序，就以随机顺序读取分片，再在缓冲区中打乱样本；或者像上面那样借助索引跳转
# 读取。在数据准备阶段一次性转换好，并记录打包后数据集的版本（第 6 节）。
#
# > **常见误解**（seed 000 §1.2）：在训练中，前向和反向传播是计算密集型的，同步是通信密集型的，而数据加载
# > 是“访存密集”的部分，也就是文章用 16 位格式把搬运的字节数减半来缓解的那类瓶颈（见其 §1.1）。
# >
# > **错在哪里：** 文章所说的“访存”涵盖 GPU 显存、主机内存和磁盘（见其 §1.1），但它给出的办法只作用于
# > 内存带宽；而加载器每一步交出的数据只有几 MB 到几十 MB，内存几毫秒就能复制完，它等的既不是主机的
# > DRAM，也不是 GPU 的 HBM。它的时间花在存储路径上（每个文件的延迟和元数据操作、共享文件系统的吞吐量），
# > 以及 CPU 上（解码 JPEG 或压缩过的记录、数据增强、组装批次），而这些都不会因为模型改用 BF16 计算而减少：
# > 文件和解码工作都还是原样。对症的办法是 worker 进程（`DataLoader(num_workers=...)`）、预取、打包文件，
# > 以及在 GPU 上解码（NVIDIA DALI）。一步训练中访存密集的部分是逐元素运算、归一化和优化器更新
# > （notebook 07 的屋顶线模型），16 位格式加速的正是这些。
# >
# > **实际情况：** 在上面的单元格中，从小文件读取一个 epoch 和解压缩，耗时都超过在内存中复制同样字节的
# > 4 倍（见断言；上面打印的几行给出了在本机上具体是多少倍）。

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

# %% [markdown] lang="zh" en="b688560adb20"
# ## 6. 检查点之外的生命周期
#
# **进阶。**
# 一次跑完的训练，还不是一个别人能用、能核查的结果。一次可复用的训练要经过这些阶段：准备数据并记录其版本；
# 固定环境；申请资源；先做小规模验证（notebook 12）；带着配置、随机种子、日志和检查点进行训练；在独立的
# 数据上**评估**；以选定的批大小、并发数和精度**部署**（notebook 15）；**归档**模型、配置、指标、日志和
# 环境。一次训练要能*跑起来*，只需要代码；要能*复现*，还需要同样的数据、环境和参数。
#
# **在本机运行。** 要归档的训练：notebook 04 的小型 GPT，在倒序任务上训练，另有一个留出的测试集。数据根据
# 其内容得到一个版本号（张量的 sha256），训练目录中有一份清单（manifest），记录每个文件的哈希值；恢复出来
# 的模型必须给出相同的评估结果：

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

# %% [markdown] lang="zh" en="b635d56e8233"
# ## 7. 如何看待加速比的宣传
#
# **在本机运行。** 有些文章承诺“混合精度、算子融合和更好的通信能带来 2-5 倍加速”，并给出“从 3 天缩短到
# 18 小时”之类的案例。这些数字对它们所测的那个作业是真实的，那个作业有它自己的基线和瓶颈。阿姆达尔定律
# 说明了一项加速能作用到作业的哪一部分：如果时间中占比 `f` 的部分快了 `s` 倍，整个作业就快
# 1 / ((1 − f) + f / s) 倍，而且永远不会超过 1 / (1 − f) 倍。

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

# %% [markdown] lang="zh" en="54cdc2c520a7"
# > **常见误解**（seed 002 §7.2）：对 BERT 的一次迭代做性能分析，发现“75 % 的时间花在低效的 LayerNorm
# > 上”、“30 % 花在通信上”，注意力只达到峰值的 40 %，所以各项修复的收益应该可以叠加。
# >
# > **错在哪里：** 一次迭代中各部分的时间占比加起来最多是 100 %；75 % + 30 % 已经是 105 %。要么通信与
# > LayerNorm 是重叠的（那么去掉其中一个并不会去掉另一个的时间），要么这些数字来自不同的运行。只有当几项
# > 修复作用于时间中互不重叠的部分时，它们各自的加速比才能相乘。
# >
# > **实际情况：** 在同一次性能分析中测量各部分的占比（notebook 07），检查它们的总和说得通，并在承诺加速
# > 之前用阿姆达尔定律算出每项修复的上限。下面的单元格做的就是这笔算术。

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

# %% [markdown] lang="zh" en="0712f3c5e405"
# ## 8. 需要 GPU 或计算中心硬件的内容
#
# **进阶。**
# 除非某一小节另有说明，以下内容都是**只讲解，不运行**。在 GPU 节点上，这些是应该用到的工具和设置。
#
# ### 观察 GPU：`nvidia-smi dmon`、Nsight Compute 与张量核心利用率
#
# `nvidia-smi dmon -s pucm -d 1` 每秒为每块 GPU 打印一行：功耗（W）和温度（`p`）、`sm` 和 `mem` 利用率
# （`u`）、时钟频率（`c`）、已用显存（`m`）。`sm` 与 `nvidia-smi` 的 GPU-Util 是同一种基于时间的指标
# （notebook 07）：它表示*有某个*内核在运行的时间占比，而不是计算单元有多忙；`mem` 是设备内存处于读写
# 状态的时间占比。`sm` 高而每秒训练步数低，说明内核很小或在等待显存；`sm` 低，说明 GPU 在等数据加载器、
# CPU 或网络。
#
# 要看张量核心是否在工作，就用 **Nsight Compute** 分析几步：
# `ncu --set full -k regex:gemm -c 10 -o report python train.py`，然后阅读 *Compute Workload Analysis*
# （各流水线的利用率，包括张量流水线）和 *Memory Workload Analysis* 两部分。张量流水线的指标名称随架构
# 而不同（在 Ampere 上是 `sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active`）；
# `ncu --query-metrics | grep -i tensor` 会列出你的 GPU 上的指标。如果矩阵乘法占比高而张量核心活跃度低，
# 说明矩阵乘法在以 FP32 运行（autocast 没有覆盖到它们，或者形状不是 8/16 的倍数），或者自定义算子没有
# 半精度内核。要做持续监控，DCGM 的性能分析指标（`dcgmi dmon -e 1002,1004`：SM 活跃度、张量流水线
# 活跃度）几乎没有开销。
#
# > **常见误解**（seed 002 §6.3）：要测量通信占一步训练的多少时间，该用 `nvprof`。
# >
# > **错在哪里：** `nvprof` 和 Visual Profiler 不支持计算能力 8.0 及以上的 GPU（A100、H100）；NVIDIA
# > 已经用 Nsight Systems（时间线）和 Nsight Compute（单个内核）取代了它们。
# >
# > **实际情况：** `nsys profile --trace=cuda,nvtx,osrt -o step python train.py` 会把 NCCL 内核和计算
# > 内核并排放在 GPU 时间线上，这正是计算通信占比所需要的；`torch.profiler` 也能显示它们（notebook 07），
# > NVIDIA 的性能分析器文档写明了支持范围。
#
# ### L2 命中率、SM 效率和其他经验法则
#
# Nsight Compute 会为每个内核报告 **L2 缓存命中率**（`lts__t_sector_hit_rate.pct`）：L2 缓存无需访问 HBM
# 就满足了的内存请求所占的比例。一个会复用数据的内核命中率低，说明它的分块（tile）放不下，或者访问过于
# 分散；而流式的逐元素内核天生命中率就低，这没有问题。“L2 命中率高于 70 %”或“SM 效率 85-95 %”之类的
# 目标，是针对特定内核的经验法则，而不是每个内核都该达到的目标：要对照内核自己的屋顶线（notebook 07）
# 来评判它，看它是访存密集型还是计算密集型。在 CPU 上，同样的道理体现在缓存层次结构中，notebook 07 的
# 屋顶线图上那些超过 100 % 的点已经展示过这一点。
#
# ### 推理用的图编译器：TensorRT、XLA、TorchScript
#
# - **TensorRT**（NVIDIA）接收一个训练好的模型（从 ONNX 导入，或通过 Torch-TensorRT），融合各层，在*你的*
#   GPU 上为每一层挑选最快的内核，并针对这块 GPU 和这个 TensorRT 版本构建一个引擎，可使用 FP16、INT8 或
#   FP8。动态形状需要配置 profile（最小、最优、最大形状），而且不同形状下的性能可能不同。
# - **XLA** 为 JAX 和 TensorFlow（以及 TPU 上的 PyTorch/XLA）编译整张计算图；每遇到一个新的输入形状都要
#   重新编译。
# - **TorchScript**（`torch.jit.script`/`trace`）是 PyTorch 较早的图格式；在当前的 PyTorch 中它已被弃用，
#   取而代之的是 `torch.compile`（即时编译，notebook 07）和 `torch.export`（提前导出，得到一张可供
#   AOTInductor、TensorRT 等其他工具使用的计算图）。
# - 再往前看：MLIR 和 TVM 之类的编译器框架能为多种硬件生成内核；结构化稀疏（每 4 个权重中有 2 个为零）
#   在 Ampere 及以后的 GPU 上让张量核心的速率翻倍，但会损失一些准确率。等本练习册的基础方法见效之后再
#   采用它们，每次只做一项经过测量的改动。
#
# **在本机运行：** `torch.export` 把一个 512 → 2048 → 512 的 MLP（notebook 15 的 INT8 示例）捕获为一张由
# ATen 算子组成的计算图，其输出与原模型相同。捕获要求代码中没有依赖数据的 Python 逻辑：小型 GPT 无法原样
# 导出，因为它的注意力在每次调用时都用 `float(tensor)` 记录一个统计量，而这个值是计算图无法预先知道的。

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
#   bytes, under twice the gradient however many ranks p there are, the least any all-reduce can send, so it suits dense gradients of every
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

# %% [markdown] lang="zh" en="c714406e67b3"
# ### 通信策略：参数服务器、环形全归约、压缩、BatchNorm
#
# 梯度如何传输是一项设计选择：
#
# - **参数服务器**保存权重；worker 推送梯度、拉取权重。它适合稀疏更新（推荐模型的 embedding 行：每个
#   worker 只涉及其中少数几行），但服务器的链路要承载全部流量；
# - **环形全归约**（DDP、NCCL；notebook 09）没有中心：每个 rank 发送和接收的字节数都是梯度字节数的
#   2(p−1)/p：无论 rank 数 p 有多大，都不到梯度字节数的两倍，而且是任何全归约所能做到的最少发送量，因此
#   适合各种大小的稠密梯度。它的代价是延迟：要依次进行 2(p−1) 步，这也是为什么 NCCL 还为多 rank 上的小消息
#   提供了树形算法；
# - **混合**方案把模型拆开：embedding 走参数服务器或 all-to-all，稠密层走全归约；NCCL 本身也是分层的，
#   节点内走 NVLink，节点间走网络。
#
# **在本机运行**，在一次 torchrun 启动的 4 个 gloo rank 上（`labkit.recipes.comm_patterns`）：两种方式都用
# 点对点的 `send`/`recv` 写成，每个 rank 对 65 536 个 fp32 值（256 KiB）求和，并与 `dist.all_reduce`
# 比较。rank 0 是服务器，同时也贡献它自己的梯度。环形算法把张量切成 p 块：在归约分散（reduce-scatter）
# 阶段，每个 rank 把一块传给右边的邻居，并把从左边收到的那块累加上去，直到每个 rank 都持有其中一块的
# 完整和；接着在全收集（all-gather）阶段，把这些已完成的块沿环传一圈。

# %%
print(inspect.getsource(comm.ps_allreduce))
print(inspect.getsource(comm.ring_allreduce))

# %% [markdown]
# The bytes each rank sent and received are read from `torch.profiler`'s records of the `send` and `recv` calls
# (`handpar.recorded_collectives`, notebook 11), not counted by the functions above, and compared with the formulas:
# the server sends and receives (p−1)·N bytes, a worker N each way; every ring rank 2(p−1)/p·N.

# %% [markdown] lang="zh" en="83c1a1fa062a"
# 每个 rank 发送和接收的字节数读自 `torch.profiler` 对 `send` 和 `recv` 调用的记录
# （`handpar.recorded_collectives`，notebook 11），而不是由上面的函数自己统计，然后与公式比较：服务器
# 发送和接收各 (p−1)·N 字节，每个 worker 各 N 字节；环中的每个 rank 各 2(p−1)/p·N 字节。

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

# %% [markdown] lang="zh" en="0dd5e3df83fe"
# 4 个 rank 时，服务器每个方向传输 3·N，而环中的一个 rank 传输 1.5·N；64 个 rank 时，则是 63·N 对不到
# 2·N。求和结果与 `dist.all_reduce` 的结果在舍入误差范围内一致（断言允许 1e-5 的相对误差），但不一定逐位
# 相同：每种算法可能以不同的顺序把四份贡献加起来（notebook 02）。
#
# 少发送数据的三种方法：在通信之前先在几个微批次上累积梯度（DDP 的 `no_sync()`，notebook 09）；让通信与
# 反向传播重叠（DDP 的分桶、DeepSpeed 的 `overlap_comm`）；以及**压缩**梯度：压缩到 16 位（DDP 的
# `fp16_compress_hook`）、压缩为低秩近似（PowerSGD），或者每个值只用 1 位，DeepSpeed 的 **1-bit Adam**
# 就是这样做的：在全精度预热之后，它对 Adam 的动量做 1 位压缩（在 GPU 上需要 NCCL 或 MPI）。每个值只用
# 1 位会丢掉每一步的大部分信息；*误差反馈*（error feedback）把没有发出去的部分加到下一步，于是没有任何
# 信息被永久丢失。**在本机运行**，在一个 rank 的 50 步梯度上：

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

# %% [markdown] lang="zh" en="972c77986ac0"
# **跨 rank 的 BatchNorm。** BatchNorm 用它所看到的那个批次的均值和方差做归一化，在 DDP 下就是每个 rank
# 自己的那些行：DDP 让 BatchNorm 保持本地计算，并且在 `broadcast_buffers=True`（默认值）时，于每次前向
# 传播之前把 rank 0 的滑动统计量复制到其他 rank。所以 p 个 rank、每个 b 行，与单个进程处理 p·b 行，计算
# 的并不是同一个东西。文章对 BN 层所做的“局部同步”（seed 002 §4.3），即每个 rank 各自保留统计量，或只在
# 一小组 rank 内同步（`SyncBatchNorm(process_group=...)`），正是这种取舍：通信更少，统计量来自更少的样本。
# 每个 rank 的批次较大时，差别很小；批次较小时（检测和分割模型，每块 GPU 只有几张图片），统计量就会很
# 嘈杂，这时 `torch.nn.SyncBatchNorm` 在每次前向传播中交换统计量（对每个 rank 的均值、标准差倒数和行数
# 做一次全收集），并在反向传播中对两个梯度和做全归约。Transformer 使用 LayerNorm，它对每个样本单独
# 归一化：没有什么需要同步。
#
# torch 只在 GPU 和其他加速器上运行 `SyncBatchNorm`，所以同一次启动中还手工同步了统计量：对行数做一次
# 全归约，对和做一次，对偏差的平方和做一次；后两次在反向传播中也会把梯度在各 rank 之间求和：

# %%
print(inspect.getsource(comm.sync_batch_norm))

# %% [markdown]
# Each rank had b = 4 rows; the reference is one process with all 16. The largest difference from it, over every
# rank, after one forward and backward:

# %% [markdown] lang="zh" en="cdfc6a7789ed"
# 每个 rank 有 b = 4 行；参照是一个处理全部 16 行的单进程。一次前向和反向传播之后，在所有 rank 中与参照
# 的最大差异：

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

# %% [markdown] lang="zh" en="3455a660d026"
# ### 能耗：瓦、焦耳与每焦耳完成的工作
#
# 能耗效率（能效）是每焦耳完成的有用工作：每焦耳处理的 token 数或样本数，或每瓦秒完成的 FLOP 数。在 GPU
# 上，`nvidia-smi --query-gpu=power.draw --format=csv -lms 100` 对功率采样，NVML 的累计能耗计数器
# （`nvmlDeviceGetTotalEnergyConsumption`，或 DCGM 的能耗字段）对功率做积分；在计算中心启用了相应功能的
# 地方，Slurm 还能统计一个作业的能耗（`sacct -j JOB --format=JobID,ConsumedEnergy`）。在 Intel 和 AMD 的
# CPU 上，RAPL 计数器测量整个处理器封装（package）的能耗；许多系统只允许 root 读取它，而虚拟机和容器
# 通常根本看不到它：

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

# %% [markdown] lang="zh" en="5c5cb7b3f43a"
# ### `NCCL_IB_TIMEOUT` 与文章中的 13B 参考配置
#
# seed 000 在结尾给出了一份配置，是它在单节点 8 块 A100 80 GB GPU 上预训练一个 13B 模型时使用的，环境为
# PyTorch 2.1 和 DeepSpeed，BF16，AdamW。下面按原文照录（注释已译为英文；提取出的文本丢失了 `=` 和引号，
# 这里已经补回）：
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
# 文章报告说，训练比使用动态损失缩放的 FP16 更稳定，在 8 块 GPU 上的线性扩展效率约为 85 %（这不是 CPU
# 能验证的）。每一行的含义：
#
# - `NCCL_IB_TIMEOUT=22` 的单位不是秒：它是 InfiniBand 确认超时的指数，每次尝试等待
#   4.096 µs × 2^22 ≈ 17 s（较新的 NCCL 版本默认为 20，约 4.3 s；较旧的版本为 18）。较大的值能扛过短暂
#   的网络抖动，而不至于让作业失败；但也会让真正的故障要更久才暴露出来。
# - `NCCL_IB_DISABLE=0` 是 NCCL 的默认值（允许使用 InfiniBand）；真正有害的是误设的 `=1`（notebook 09）。
# - `OMP_NUM_THREADS=8` 是按进程计算的：8 个 rank 就是 64 个线程，不能超过节点的核心数。
# - DeepSpeed 要求 `train_batch_size` = 微批次大小 × 累积步数 × GPU 数，所以每块 GPU 每个微步处理 4 条
#   序列。ZeRO-2 对梯度和优化器状态做分片，使 13B 模型的模型状态降到每块 GPU 约 49 GB；把优化器卸载
#   （offload）到 CPU 后降到 26 GB，为激活值留出更多空间，代价是与主机之间的数据传输（notebook 10 对
#   两者都做了估算）。

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

# %% [markdown] lang="zh" en="89718b14c2f3"
# > **常见误解**（seed 000 §2.3）：跨节点时，必须明确告诉 NCCL 使用 InfiniBand，否则它的流量会走 TCP。
# >
# > **错在哪里：** NCCL 在启动时会自己查找 InfiniBand/RoCE 网卡，找到就用（`NCCL_IB_DISABLE` 默认为 0，
# > 正如上面引用的配置所设）。只有在以下几种情况下它才会退回到 socket：IB 被禁用（`NCCL_IB_DISABLE=1`）、
# > 看不到可用的网卡或 verbs 库（容器中没有 `/dev/infiniband` 或 libibverbs），或者网络插件加载失败。
# >
# > **实际情况：** 不需要手动开启任何东西；要做的是检查 NCCL 选择了什么。`NCCL_DEBUG=INFO` 会在启动时
# > 打印 `NET/IB` 或 `NET/Socket`（NCCL 关于环境变量的文档列出了各项默认值；notebook 09 里有这张表）。
#
# ## 9. 练习
#
# **14.amdahl.** 矩阵乘法占一个训练步的 60 %（`AMDAHL`）；BF16 张量核心让它们快了 4 倍。整个训练步会
# 快多少倍？

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

# %% [markdown] lang="zh" en="2a825f1b0943"
# **14.young.** 写一次检查点会让训练停顿 90 s，作业平均每 12 小时出一次故障（`YOUNG`）。按照 Young 公式
# （第 5 节，进阶内容：在写入所花的时间和故障丢失的工作之间取得平衡的间隔，
# √(2 · 写入时间 · 平均故障间隔时间)），应该每隔多少**分钟**写一次检查点？

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

# %% [markdown] lang="zh" en="50370a2d1a2f"
# **14.ib-timeout.** 按文章中的 `NCCL_IB_TIMEOUT=22`，一次 InfiniBand 尝试要等待多少秒？（第 8 节，进阶
# 内容：取值 n 对应的等待时间为 4.096 µs × 2ⁿ。）

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

# %% [markdown] lang="zh" en="d3b6bf3216a6"
# ## 小结
#
# - HPC 和 AI 共用硬件和集合通信；问题病态时，HPC 程序需要 FP64（残差小不等于答案对），只有在配合迭代精化
#   之类的修正手段时才使用低精度。
# - 编译选项：先建立基线，每次只改一个选项；`-O3 -march=native` 为*这台* CPU 做向量化，换一台 CPU 就可能
#   崩溃；`-ffp-contract` 和 `-ffast-math` 会改变结果。
# - `undefined symbol` 意味着加载的库比二进制文件链接时所用的库更旧：用 `ldd`、`nm -D`、`LD_DEBUG=libs`
#   把它找出来，并且不要再覆盖 torch 自带的库。
# - 容器携带用户态软件栈；宿主机的驱动和 GPU 通过 NVIDIA Container Toolkit（`--gpus all`）或 Apptainer
#   （`--nv`）进入容器；驱动必须支持镜像中的 CUDA 版本。
# - 检查点：测量写入时间，大约每隔 √(2 × 写入时间 × MTBF) 写一次检查点，并保留一份记录哈希值的清单。
# - 数据：把小文件打包成少数几个带索引的大文件；加载器等待的是文件元数据和解码，而不是内存带宽；笔记本
#   电脑上的页缓存掩盖了并行文件系统对每个文件收取的大部分代价。
# - 通信：参数服务器的链路每个方向承载 (p−1)·N，环中的一个 rank 承载 2(p−1)/p·N；使用每个 rank 各自
#   统计量的 BatchNorm 不等于单个大批次，同步了统计量的才等于。
# - 对每一个承诺的加速比，都要基于同一次性能分析中测得的占比，用阿姆达尔定律算出上限。
#
# 下一步：notebook 15 让一个模型在负载下提供推理服务。想综合运用这些知识、练习诊断出问题的训练任务，
# 请去 notebook 13 的故障排查门诊。

# %%
shutil.rmtree(WORK)  # this notebook's scratch folder (created by tempfile above), nothing else
