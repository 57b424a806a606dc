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

# %% [markdown] lang="zh" en="e96b79d53256"
# # 00 · 环境检查
#
# **学习目标**
# - 了解如何使用本练习册：在笔记本电脑上的 JupyterLab 中，或在集群的计算节点上；
# - 读懂 `labkit doctor` 报告：版本、设备，以及你的硬件能用哪些精度做计算；
# - 了解你的**设备档位**（tier），以及后续每个 notebook 在 CPU 和 GPU 上分别做些什么；
# - 说出 HPC 的三大瓶颈（计算、内存带宽、通信），以及本练习册在哪里分别讲到它们。
#
# **前置知识：** Python，外加一点 PyTorch，别无其他。
#
# **预计用时：** 20 分钟

# %%
# %matplotlib inline
# %load_ext labkit
import importlib.util
import time

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

# %% [markdown] lang="zh" en="9bb8d956315b"
# ## 1. 如何使用本练习册
#
# - **在笔记本电脑上：** 在仓库中运行 `make lab`。它会创建 `.venv`，安装全部依赖（默认安装 CPU 版 PyTorch，
#   除非你指定 CUDA 版），创建你的工作区 `work/`（各 notebook 的个人副本，不含答案），并在那里打开 JupyterLab。
#   含答案的参考 notebook 保留在 `notebooks/` 中。
# - **在集群上：** 切勿在登录节点上运行 notebook。请提交 `slurm/jupyter.sbatch`：它会在计算节点上启动
#   JupyterLab，并把 `ssh -N -L ...` 隧道命令写入作业输出（见 `slurm/README.md` 和 notebook 12）。
# - 用 *Run → Run All Cells* 从头到尾运行一个 notebook。单元格会用 `assert` 检验它所讲的内容：如果某个断言
#   失败，那是 notebook 在告诉你这台机器的某些情况。
# - 练习中留有 `...` 等你填写。随后 `check(...)` 会打印 ✓、一条提示，或“not attempted yet”（尚未作答）；
#   之后每答错一次，就给出下一级提示（先是点拨，再是方法，最后是完整解答）。
#   有些练习是*先预测，再运行*：在实际测量的单元格之前，你先用 `predict(...)` 记下预测，该单元格中的
#   `reveal(...)` 会对比两者并解释差异。另一些是*调试*练习：一段有缺陷的代码运行后会显露出症状，由你写出
#   修正后的版本。
# - 每个 notebook 都设计为能在任意 x86 或 Arm CPU 的 2 个核心上运行。凡是 GPU 会改变结论的地方，有 GPU 时
#   notebook 会展示真实的 GPU 数据，没有 GPU 时则明确说明会有哪些不同。

# %% [markdown]
# ## 2. The doctor report
#
# The same report is printed by `python -m labkit doctor` in a terminal; paste it into a question when you ask
# for help. Its content depends on your machine, so its stored output is not compared by the tests.

# %% [markdown] lang="zh" en="01782af38d64"
# ## 2. doctor 报告
#
# 在终端中运行 `python -m labkit doctor` 会打印同一份报告；提问求助时，请把它一并贴上。报告内容取决于你的机器，
# 因此测试不会比对它保存下来的输出。

# %%
# NBVAL_IGNORE_OUTPUT
report = env.report()
print(env.format_report(report))

# %% [markdown]
# Whatever the machine, a few things must hold for the workbook to work:

# %% [markdown] lang="zh" en="744d1b52bdca"
# 无论在什么机器上，要让本练习册正常工作，以下几点都必须成立：

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

# %% [markdown] lang="zh" en="a6990ebb3296"
# ## 3. 你的设备档位
#
# notebook 使用哪种设备、哪种 autocast（自动精度转换）数据类型、走哪些快速路径，都只由 `labkit.device`
# 这一处决定。对 bf16 和 fp16，它各提出三个不同的问题，因为真实机器对这三个问题的回答各不相同：
#
# | 问题 | 函数 | 如何回答 |
# |---|---|---|
# | autocast 到该类型在这里能否**计算**？ | `device.computes(dtype)` | 试跑一个很小的 autocast 矩阵乘法 |
# | 它在这里是否**快**（硬件原生支持，而非模拟）？ | `device.fast(dtype)` | CPU：看 AMX 或 AVX512-BF16/FP16，以 oneDNN 能够使用为准；CUDA：看计算能力（bf16 需 sm80+，fp8 需 sm89+） |
# | **DeepSpeed** 是否接受它？ | `device.deepspeed_accepts(dtype)` | 询问 DeepSpeed 的加速器抽象（accelerator） |
#
# 笔记本电脑的 CPU 能算 fp16，但比 fp32 慢约一百倍，而且 DeepSpeed 在它上面拒绝 fp16；V100 则靠模拟来计算 bf16。
# 一个问题的答案永远不能代替另一个问题的答案。
#
# | 档位 | 是什么 | 后续 notebook 中有何变化 |
# |---|---|---|
# | `cpu` | 没有 GPU（CI 运行的就是这一档） | CPU 上的 bf16/fp16 autocast，基于 gloo 的 DDP，DeepSpeed 的 CPU 加速器；TF32 和 fp8 矩阵乘法只做讲解和模拟 |
# | `mps` | Apple GPU | MPS 上的 autocast；没有 NCCL，没有 TF32，也没有 fp8 |
# | `cuda` | NVIDIA GPU | CUDA autocast（softmax 等算子提升到 fp32 计算），NCCL，真实计时；计算能力 8.0 起（A100，而非 V100/T4）支持 TF32 和快速 bf16 |
# | `cuda-fp8` | 计算能力 ≥ 8.9 的 NVIDIA GPU（Ada、Hopper） | 与 `cuda` 相同，另有真实的 fp8 矩阵乘法 |

# %%
# NBVAL_IGNORE_OUTPUT
caps = device.capabilities()
print(f"tier {caps.tier}: {caps.device} ({caps.device_name}); autocast dtype {caps.autocast_dtype}")
print(f"bf16 {caps.bf16}, fp16 {caps.fp16}, fp8 matmul {caps.fp8_matmul}, CPU ISA {' '.join(caps.cpu_isa) or '-'}")

# %% [markdown]
# The three answers for this machine, and a sentence about its CPU generated from what was detected:

# %% [markdown] lang="zh" en="20ee7b4b9459"
# 这台机器对三个问题的回答，以及根据检测结果生成的一句 CPU 描述：

# %%
# NBVAL_IGNORE_OUTPUT
for name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
    print(f"{name}: computes {device.computes(dt)}, fast {device.fast(dt)}, "
          f"DeepSpeed accepts {device.deepspeed_accepts(dt) if DEEPSPEED else 'n/a (not installed)'}")
print("This machine:", device.cpu_summary())

# %% [markdown]
# The tier is consistent with what was measured, and the answers never contradict each other:

# %% [markdown] lang="zh" en="adf4282448c4"
# 设备档位与实测结果一致，各个回答之间也从不矛盾：

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

# %% [markdown] lang="zh" en="65a47c86e485"
# ## 4. 各 notebook 在 CPU 上与在 GPU 上

# %%
display(Markdown(catalog.markdown_table(folder="")))  # links to the notebooks next to this one
missing = catalog.missing(".")  # the listed notebooks not found next to this one
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

# %% [markdown] lang="zh" en="53a48ab27847"
# ## 5. 三大瓶颈
#
# 训练的每一步都在等待以下三者之一：
#
# 1. **计算**：即运算单元，如张量核心（Tensor Core）和 AVX-512/AMX 单元。一个大矩阵乘法在 $3n^2$ 个数上
#    做约 $2n^3$ 次浮点运算（FLOPs），每个字节都被重复使用多次，因此受限于 FLOP/s。
#    Notebook 01-05 用更窄的数值格式让计算变得更便宜。
# 2. **内存带宽**（在 GPU 上即显存带宽）：在内存与运算单元之间搬运字节。逐元素运算每加载并写回一个元素
#    只做一次浮点运算，所以无论运算单元多快，它都受制于带宽（GB/s）。Notebook 06 统计字节数，notebook 07
#    做性能分析并进行算子融合，以减少搬运的字节。
# 3. **通信**：在设备之间、机器之间搬运字节。数据并行每一步都要对所有梯度做全归约（AllReduce）；ZeRO 则以
#    更多的通信换取显存的节省。见 notebook 09-12。
#
# 根据*算术强度*（每搬运一个字节所做的浮点运算次数），可以判断一个算子受前两者中的哪一个限制：

# %%
def intensity_matmul(n: int, bytes_per: int = 4) -> float:
    return 2 * n**3 / (3 * n * n * bytes_per)

print(f"matmul 512x512 fp32: {intensity_matmul(512):.1f} FLOP/byte;  elementwise add fp32: {1 / 12:.3f} FLOP/byte")
assert intensity_matmul(512) > 80 > 1 / 12

# %% [markdown]
# **Predict, then run.** The next cell times a 512 × 512 fp32 matmul and an add of two 16 MB fp32 vectors, and
# counts FLOP/s for both (the add does one FLOP per element). Which reaches more FLOP/s on this machine:
# `"matmul"`, `"add"` or `"about the same"`? Record your prediction before you run the measurement.

# %% [markdown] lang="zh" en="4a2d4bd42660"
# **先预测，再运行。** 下一个单元格会对一个 512 × 512 的 fp32 矩阵乘法和两个 16 MB fp32 向量的加法分别计时，
# 并计算两者的 FLOP/s（加法每个元素算一次浮点运算）。在这台机器上，哪一个的 FLOP/s 更高：
# `"matmul"`、`"add"`，还是 `"about the same"`？请在运行测量之前记下你的预测。

# %%
prediction = ...
### BEGIN SOLUTION
prediction = "matmul"
### END SOLUTION
predict("00.matmul-vs-add", prediction)

# %% [markdown]
# Measured on this machine (median of a few repeats; your figures will differ):

# %% [markdown] lang="zh" en="bc852ce3c4c8"
# 这台机器上的实测结果（取几次重复的中位数；你的数字会有所不同）：

# %%
# NBVAL_IGNORE_OUTPUT
def median_time(fn, repeats: int = 7) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return float(np.median(ts))

torch.set_num_threads(1)  # one core each: a fair race, and one that a busy shared node cannot tip over
a = torch.randn(512, 512); big = torch.randn(16 * 2**20 // 4)
t_mm, t_copy, t_add = (median_time(f) for f in (lambda: a @ a, lambda: big.clone(), lambda: big + big))
flops_mm, flops_add = 2 * 512**3 / t_mm, big.numel() / t_add
print(f"matmul: {flops_mm / 1e9:.1f} GFLOP/s   add: {flops_add / 1e9:.2f} GFLOP/s   "
      f"copy: {2 * big.numel() * 4 / t_copy / 1e9:.1f} GB/s")

# %% [markdown]
# The two rates, side by side (a factor of 2 either way counts as "about the same"):

# %% [markdown] lang="zh" en="5bf1aeee8291"
# 两个速率并列对比（无论哪一方领先，只要相差不超过 2 倍，都算作“about the same”）：

# %% tags=["workspace-clear"]
winner = "matmul" if flops_mm > 2 * flops_add else "add" if flops_add > 2 * flops_mm else "about the same"
reveal("00.matmul-vs-add", winner)
assert flops_mm > 2 * flops_add  # ~85 against 1/12 FLOP per byte: the gap is tens of times on any CPU or GPU

# %% [markdown]
# ## Exercises
#
# **1.** Which device type did `pick_device()` choose (`"cpu"`, `"cuda"` or `"mps"`)?

# %% [markdown] lang="zh" en="3dada4fa0f3f"
# ## 练习
#
# **1.** `pick_device()` 选择了哪种设备类型（`"cpu"`、`"cuda"` 还是 `"mps"`）？

# %%
answer = ...
### BEGIN SOLUTION
answer = device.pick_device().type
### END SOLUTION
check("00.device", answer)

# %% [markdown]
# **2.** Which dtype does autocast use by default on this machine? (A `torch.dtype` or its name.)

# %% [markdown] lang="zh" en="2953bbd5ff2a"
# **2.** 在这台机器上，autocast 默认使用哪种数据类型？（填一个 `torch.dtype` 或它的名称。）

# %%
answer = ...
### BEGIN SOLUTION
answer = device.autocast_dtype()
### END SOLUTION
check("00.autocast-dtype", answer)

# %% [markdown]
# **3.** Name the bottleneck (`"compute"`, `"memory bandwidth"` or `"communication"`) of each scenario.

# %% [markdown] lang="zh" en="6836cf860b8a"
# **3.** 指出每个场景的瓶颈（`"compute"`、`"memory bandwidth"` 或 `"communication"`）。

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

# %% [markdown] lang="zh" en="c8d1ad68e16c"
# ## 你的进度
#
# 你在工作区（`work/`，即 `make lab` 打开的目录）中运行的每一次 `check(...)` 都记录在本机的
# `work/.labkit-progress.json` 中，不会发送到任何地方。运行下一个单元格，或在终端中运行
# `python -m labkit progress`，即可按 notebook 列出你已解决的练习。被某道练习卡住了？下一次答错会给出方法，
# 再下一次给出完整解答；而 `labkit.check.solution("NN.name")` 会立即显示解答。

# %% tags=["workspace-clear"]
labkit.check.progress()

# %% [markdown]
# ## Summary
#
# - `python -m labkit doctor` (section 2) is the first thing to run on a new machine or cluster node.
# - `labkit.device` decides device, dtype and backend by measuring; later notebooks adapt to your tier.
# - Compute, memory bandwidth and communication are the three limits; arithmetic intensity tells compute
#   from bandwidth. The rest of the workbook visits each, starting with the bits of a float in notebook 01.

# %% [markdown] lang="zh" en="eb62a960c495"
# ## 小结
#
# - `python -m labkit doctor`（第 2 节）是在新机器或新的集群节点上首先要运行的命令。
# - `labkit.device` 通过实测来决定设备、数据类型和后端；后续 notebook 会根据你的设备档位自动调整。
# - 计算、内存带宽和通信是三大限制；算术强度可以区分计算密集型与访存密集型。本练习册的其余部分会逐一讲到它们，
#   第一站是 notebook 01 中浮点数的各个比特。
