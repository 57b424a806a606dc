# %% [markdown]
# # 07 · Profiling, fusion and the roofline
#
# **Objectives**
# - profile a real training step with `torch.profiler`: read the key_averages table sorted by *self* time,
#   find the few ops that take most of the time, and write a Chrome trace to open in Perfetto;
# - measure **kernel-launch overhead**: many tiny ops against one big op;
# - fuse a memory-bound chain (bias + GELU + dropout) by hand and with `torch.compile`, and explain why fusion
#   helps memory-bound chains and does little for a compute-bound matmul;
# - fuse around matmuls too: the Q, K and V projections as one matmul, BatchNorm folded into a convolution, and a
#   fused op's hand-written backward checked with `torch.autograd.gradcheck`;
# - measure this machine's ceilings (peak matmul FLOP/s per dtype, copy bandwidth), compare them with the
#   theoretical peak, and place measured ops on the **roofline**: memory- or compute-bound, and at what % of the roof;
# - read utilisation correctly: what `nvidia-smi`'s GPU-Util measures (and what DCGM and Nsight add), the busy
#   fraction of a trace, throughput in tokens/s and **MFU**;
# - work like an engineer: baseline first, one change at a time, a notes table.
#
# **Prerequisites:** notebook 04 (the tiny GPT, autocast), notebook 06 (where memory goes).
#
# **Estimated time:** 70 min
#
# All timings below depend on the machine and on what else runs on it, so their cells are not compared by the
# tests; the cells assert only facts that hold everywhere (same results, fewer bytes, which side of the ridge).

# %% [markdown] lang="zh" en="d379b9094cf0"
# # 07 · 性能分析、算子融合与屋顶线模型
#
# **学习目标**
# - 用 `torch.profiler` 分析一个真实的训练步：阅读按 *self* 时间排序的 key_averages 表，找出占去大部分时间的
#   少数几个算子，并导出一份 Chrome trace（追踪文件），在 Perfetto 中打开；
# - 测量**内核启动开销**：许多微小算子对比一个大算子；
# - 手工以及用 `torch.compile` 融合一条访存密集型的算子链（bias + GELU + dropout），并解释为什么融合对访存
#   密集型的算子链有帮助，而对计算密集型的矩阵乘法作用不大；
# - 在矩阵乘法周围同样做融合：把 Q、K、V 三个投影合成一个矩阵乘法，把 BatchNorm 折叠进卷积，并用
#   `torch.autograd.gradcheck` 检查融合算子手写的反向传播；
# - 测量本机的性能上限（各数据类型的矩阵乘法峰值 FLOP/s、拷贝带宽），与理论峰值比较，并把实测的算子放到
#   **屋顶线模型**上：是访存密集型还是计算密集型，达到了屋顶的百分之几；
# - 正确解读利用率：`nvidia-smi` 的 GPU-Util 测的是什么（以及 DCGM 和 Nsight 能补充什么）、trace 中的
#   忙碌比例、以 tokens/s 计的吞吐量，以及 **MFU**（模型算力利用率）；
# - 像工程师一样工作：先测基线，每次只改一处，用一张笔记表记录结果。
#
# **前置知识：** notebook 04（小型 GPT、autocast），notebook 06（显存都用在了哪里）。
#
# **预计用时：** 70 分钟
#
# 下面所有的计时都取决于机器本身，以及机器上同时在运行什么，所以测试不会比对这些单元格的输出；这些单元格
# 只断言在任何机器上都成立的事实（结果相同、搬运的字节更少、位于脊点（ridge point）的哪一侧）。

# %%
# %matplotlib inline
# %load_ext labkit
import os

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # small machines: compile workers steal the cores
import matplotlib.pyplot as plt
import torch
from torch.nn.utils.fusion import fuse_conv_bn_eval

from labkit import bench, device, fusion, models
from labkit import profiling as P
from labkit import roofline as R
from labkit import traffic as T
from labkit.check import check, predict, reveal
from labkit.exercises.nb07 import DGX_A100, H100_BANDWIDTH, H100_BF16_FLOPS, PROFILE_TABLE

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: steadier timings on a shared 2-core machine (raise it on your own node)
dev = device.pick_device()
device.inductor_cache_per_cpu_class()  # torch.compile's disk cache is not safe across CPU classes
notes = []  # the lab notebook of this session: one row per measurement

# %% [markdown]
# ## 1. Measure first: profile a training step
#
# The rule: **never optimise what you have not measured.** In a typical step a minority of the distinct ops takes
# most of the time (the cells below count how many cover 80 % here); an op above ~20 % is worth a look, one below 2 % is
# not, however ugly its code. The profiler records every
# op (`aten::...`) with its **self** time (inside the op, excluding the ops it calls) and its **total** time
# (including them). Sort by self time: total time counts the children again, so `aten::linear` looks expensive
# although the work is in `aten::addmm`.
#
# `P.profile_steps` runs one warm-up step (the first step pays one-off costs: allocations, lazy init), then
# profiles 3 steps of the tiny GPT (forward, backward, AdamW):

# %% [markdown] lang="zh" en="ae6f07d97328"
# ## 1. 先测量：分析一个训练步
#
# 原则是：**没有测量过的东西，绝不去优化。** 在一个典型的训练步中，少数几种算子占去了大部分时间（下面的单元格
# 会统计在这里需要多少种算子才能覆盖 80 %）；占比超过约 20 % 的算子值得一看，低于 2 % 的则不值得，
# 不管它的代码写得多难看。性能分析器会记录每个算子（`aten::...`）的 **self** 时间（算子自身内部的时间，
# 不含它调用的其他算子）和 **total** 时间（包含这些算子）。要按 self 时间排序：total 时间会把子算子的时间
# 再算一遍，所以 `aten::linear` 看上去很耗时，实际的工作却是在 `aten::addmm` 里完成的。
#
# `P.profile_steps` 先运行一个预热步（第一步要付出一次性的开销：内存分配、延迟初始化），然后对小型 GPT 的
# 3 个训练步（前向、反向、AdamW）做性能分析：

# %%
step = P.make_gpt_step(batch=32, device=dev)
baseline_loss = step()
prof = P.profile_steps(step, steps=3, device=dev)

# %%
# NBVAL_IGNORE_OUTPUT
print(P.op_table(prof, row_limit=12))

# %% [markdown]
# The top ops and their share of the total self time (annotations are left out: our `train_step` label, which is
# Python between ops, and torch's own, such as `Optimizer.step#AdamW.step`):

# %% [markdown] lang="zh" en="e87b869fe839"
# 排名靠前的算子，以及它们在总 self 时间中所占的份额（注解不计在内：一是我们自己的 `train_step` 标签，
# 它的 self 时间就是算子之间运行的 Python 代码；二是 torch 自己的注解，例如 `Optimizer.step#AdamW.step`）：

# %%
# NBVAL_IGNORE_OUTPUT
ops = P.top_ops(prof, k=1000)
for op in ops[:8]:
    print(f"{op.name:<40} {op.self_us / 1e3:8.2f} ms  {op.share:6.1%}  x{op.calls}")
n80 = P.ops_to_cover([o.share for o in ops], 0.8)
print(f"\n{n80} of {len(ops)} distinct ops cover 80 % of the self time")

# %%
names = [o.name for o in ops]
assert {"aten::addmm", "aten::native_layer_norm", "aten::mm"} <= set(names)
assert abs(sum(o.share for o in ops) - 1) < 1e-6 and n80 <= len(ops) // 2  # a minority of ops dominates
assert not any("#" in n or n == "train_step" for n in names)                 # no annotation ranked as an op
notes.append(("profile tiny GPT step", f"{n80} of {len(ops)} ops = 80 % of self time"))

# %% [markdown]
# ### The timeline: a Chrome trace
#
# The table aggregates; the **trace** shows every op on a timeline, per thread (and per CUDA stream on a GPU).
# Open the file in <https://ui.perfetto.dev> ("Open trace file"; it stays in your browser) or in
# `chrome://tracing`. Look for gaps between ops: on a GPU, gaps on the stream mean the GPU waits for Python.

# %% [markdown] lang="zh" en="f35497c7b065"
# ### 时间线：Chrome trace
#
# 表格做的是汇总；**trace** 则把每个算子按线程（在 GPU 上还按 CUDA 流）排在时间线上。在
# <https://ui.perfetto.dev> 中打开这个文件（点“Open trace file”；文件只留在你的浏览器里），或者用
# `chrome://tracing` 打开。留意算子之间的空隙：在 GPU 上，流上的空隙意味着 GPU 在等 Python。

# %%
trace = P.write_chrome_trace(prof, "_out/07_gpt_step_trace.json")
events = P.read_chrome_trace(trace)["traceEvents"]
# the CPU's spans ("user_annotation"); a GPU trace repeats each on the GPU's timeline ("gpu_user_annotation")
steps_seen = sum(1 for e in events if e.get("name") == "train_step" and e.get("cat") == "user_annotation")
print(f"trace written to notebooks/{trace.as_posix()}: {steps_seen} train_step spans, open it in ui.perfetto.dev")
assert trace.exists() and steps_seen == 3

# %% [markdown]
# **On a GPU** the same call also records the CUDA activity: the table gets *Self CUDA* / *CUDA total* columns,
# and you should sort by device time (`P.op_table(prof, by="device")`), because the CPU only *launches* kernels
# and its times are launch times. For deeper GPU work use NVIDIA's tools: **Nsight Systems**
# (`nsys profile -o step python train.py`) for the whole timeline (CPU, CUDA API, kernels, NCCL, memcpy) and
# **Nsight Compute** (`ncu --set full -k regex:gemm python train.py`) for one kernel's achieved FLOP/s, memory
# throughput and its own roofline.

# %% [markdown] lang="zh" en="ce0138b95ecc"
# **在 GPU 上**，同一个调用还会记录 CUDA 活动：表格多出 *Self CUDA* / *CUDA total* 两列，这时应该按设备
# 时间排序（`P.op_table(prof, by="device")`），因为 CPU 只负责*启动*内核，它记下的时间只是启动的时间。
# 更深入的 GPU 分析请使用 NVIDIA 的工具：用 **Nsight Systems**（`nsys profile -o step python train.py`）
# 查看整条时间线（CPU、CUDA API、内核、NCCL、memcpy），用 **Nsight Compute**
# （`ncu --set full -k regex:gemm python train.py`）查看单个内核实际达到的 FLOP/s、访存吞吐量以及它自己的
# 屋顶线。

# %%
# NBVAL_IGNORE_OUTPUT
if device.is_cuda(dev):
    print(P.op_table(prof, by="device", row_limit=10))
else:
    print("No GPU here: the table above has CPU columns only. On a CUDA device this cell prints the table\n"
          "sorted by Self CUDA time; run nsys / ncu from a terminal on the GPU node.")

# %% [markdown]
# ## 2. Kernel-launch overhead: many tiny ops vs one big op
#
# **Predict, then run.** 2000 adds of 64 elements race one add of 128 000 elements: the same arithmetic. Which
# finishes first: `"one big add"`, `"2000 tiny adds"`, or are they `"about the same"`?

# %% [markdown] lang="zh" en="08c711aef8df"
# ## 2. 内核启动开销：许多微小算子对比一个大算子
#
# **先预测，再运行。** 2000 次 64 个元素的加法，与一次 128 000 个元素的加法赛跑：两边的算术量完全相同。
# 哪个先完成：`"one big add"`（一次大加法）、`"2000 tiny adds"`（2000 次微小加法），还是差不多
# （`"about the same"`）？

# %%
prediction = ...
### BEGIN SOLUTION
prediction = "one big add"
### END SOLUTION
predict("07.launch-overhead", prediction)

# %% [markdown]
# Every op costs a fixed overhead before any arithmetic: Python, PyTorch's dispatcher, and on a GPU the kernel
# launch (a few µs). The race, measured round-robin in one run, median of 5:

# %% [markdown] lang="zh" en="31408cd9d264"
# 每个算子在做任何算术之前，都要先付出一笔固定开销：Python、PyTorch 的分发器（dispatcher），在 GPU 上
# 还有内核启动（几 µs）。下面是这场比赛的结果，在同一次运行中轮流交替测量，取 5 次的中位数：

# %%
# NBVAL_IGNORE_OUTPUT
lo = P.launch_overhead(n_ops=2000, size=64, device=dev)
print(f"2000 tiny adds: {lo['many_s'] * 1e3:.2f} ms, one big add: {lo['one_s'] * 1e3:.3f} ms "
      f"-> {lo['ratio']:.0f}x slower, {lo['overhead_us']:.1f} µs per op")
notes.append(("launch overhead", f"{lo['overhead_us']:.1f} µs/op, many/one = {lo['ratio']:.0f}x"))

# %% tags=["workspace-clear"]
reveal("07.launch-overhead", "one big add" if lo["ratio"] > 2 else "2000 tiny adds" if lo["ratio"] < 0.5 else
       "about the same")
assert lo["ratio"] > 2  # per-op overhead dwarfs 64 elements of work on any device

# %% [markdown]
# This is why small models are slow out of proportion, why frameworks batch work (`torch._foreach_*` optimizers,
# fused Adam) and why CUDA graphs exist: they replay a whole step's launches as one.
#
# ## 3. Operator fusion
#
# A GPT-2-style MLP computes `dropout(gelu(x @ W + b))`, and old code writes GELU's tanh formula out by hand.
# Each line of `P.gelu_chain_unfused` is its own kernel that reads its inputs from memory and writes a new tensor:

# %% [markdown] lang="zh" en="6ccc913d0607"
# 这就是为什么小模型会慢得不成比例，为什么框架要把工作合并成批（`torch._foreach_*` 优化器、融合版 Adam），
# 以及为什么会有 CUDA graphs：它把整个训练步的所有内核启动当作一次来重放。
#
# ## 3. 算子融合
#
# GPT-2 风格的 MLP 计算 `dropout(gelu(x @ W + b))`，老代码还会把 GELU 的 tanh 公式手写出来。
# `P.gelu_chain_unfused` 的每一行都是一个独立的内核，它从内存读入输入，再写出一个新张量：

# %%
for i, (what, reads, writes, mask) in enumerate(P.CHAIN_STEPS, 1):
    print(f"{i:>2}. {what:<20} reads {reads + mask} tensor(s), writes {writes}")

# %% [markdown]
# Three versions compute the same thing (the dropout mask is passed in, so all agree; a fused dropout kernel
# draws it in-kernel from a counter-based RNG instead):
#
# - **unfused**: 12 kernels, 12 round trips through memory;
# - **fused by hand** (`P.gelu_chain_fused`): the chain runs block by block on rows that fit in the L2 cache,
#   in place, so each element goes to memory once: the idea of a fused kernel, done with the cache;
# - **`torch.compile`**: Inductor traces the function and generates *one* loop (C++/OpenMP on CPU, Triton on a
#   GPU) that reads x and the mask once and writes y once.
#
# The byte counts, from the model (12 FLOPs per element in every version):

# %% [markdown] lang="zh" en="1a5988c8b368"
# 三个版本计算的是同一个结果（dropout 掩码作为参数传入，所以三者完全一致；融合的 dropout 内核则会在内核
# 内部用基于计数器的随机数生成器来生成掩码）：
#
# - **未融合**：12 个内核，12 次往返内存；
# - **手工融合**（`P.gelu_chain_fused`）：整条链按块处理，每块是能放进 L2 缓存的若干行，原地计算，
#   因此每个元素只与内存往返一次：这正是融合内核的思路，只不过借助缓存来实现；
# - **`torch.compile`**：Inductor 追踪这个函数，生成*一个*循环（CPU 上是 C++/OpenMP，GPU 上是 Triton），
#   只读一次 x 和掩码，只写一次 y。
#
# 按代价模型算出的字节数（每个版本都是每个元素 12 次浮点运算）：

# %%
rows, cols, p = 2048, 2048, 0.1
x = torch.randn(rows, cols, device=dev)
bias = torch.randn(cols, device=dev)
mask = torch.rand(rows, cols, device=dev) > p
cost_unfused = P.gelu_chain_cost(x.numel(), x.dtype, fused=False)
cost_fused = P.gelu_chain_cost(x.numel(), x.dtype, fused=True)
print(f"unfused moves {cost_unfused.bytes / 2**20:.0f} MiB ({cost_unfused.intensity:.2f} FLOP/B), "
      f"fused {cost_fused.bytes / 2**20:.0f} MiB ({cost_fused.intensity:.2f} FLOP/B)")
assert cost_fused.bytes * 10 < cost_unfused.bytes and cost_fused.flops == cost_unfused.flops

# %% [markdown]
# Compile it. The first call traces and compiles (seconds to tens of seconds on 2 cores; cached on disk for next
# time), so it is timed on its own and never mixed into the steady-state comparison:

# %% [markdown] lang="zh" en="eb528520b3fb"
# 编译它。第一次调用会追踪并编译（在 2 个核上需要几秒到几十秒；结果缓存在磁盘上，下次直接复用），所以它
# 单独计时，绝不混进稳态下的比较：

# %%
# NBVAL_IGNORE_OUTPUT
chain_compiled, first_call_s = P.compile_timed(P.gelu_chain_unfused, x, bias, mask, p)
print(f"torch.compile first call (trace, generate and compile the kernel): {first_call_s:.1f} s")
notes.append(("torch.compile first call", f"{first_call_s:.1f} s"))

# %% [markdown]
# Same numbers from all four, then the race (round-robin, median of 5, one run):

# %% [markdown] lang="zh" en="e06f6584974f"
# 先确认四个版本给出相同的数值，然后开始比赛（轮流交替运行，取 5 次的中位数，在同一次运行中完成）：

# %%
ref = P.gelu_chain_reference(x, bias, mask, p)
versions = {"unfused (12 ops)": P.gelu_chain_unfused, "fused by hand": P.gelu_chain_fused,
            "F.gelu (library)": P.gelu_chain_reference, "torch.compile": chain_compiled}
for fn in versions.values():
    torch.testing.assert_close(fn(x, bias, mask, p), ref, atol=1e-5, rtol=1e-5)
print("all versions agree with F.gelu(approximate='tanh') + dropout to 1e-5")

# %%
# NBVAL_IGNORE_OUTPUT
times = P.interleaved_times(versions, x, bias, mask, p, repeats=5, device=dev)
for name, t in times.items():
    print(f"{name:<18} {t * 1e3:8.2f} ms   {times['unfused (12 ops)'] / t:5.2f}x vs unfused")
notes.append(("fusion (2048x2048 fp32)", ", ".join(f"{k}: {v * 1e3:.1f} ms" for k, v in times.items())))

# %% [markdown]
# **When fusion helps, when it does not.** Even fused, the chain does only about 1 FLOP per byte moved (section 5
# prints its intensity): it is memory-bound, so time is bytes moved, and cutting the bytes 12x is the whole game. A large matmul is the opposite: each element
# is reused ~n times from cache, the time is arithmetic, and fusing its bias or activation in (an *epilogue*)
# saves one pass over the output, a few percent. Fuse chains of elementwise ops, norms and softmaxes; for a
# matmul, get a faster matmul (lower precision, tensor cores / AMX). Sections 4 and 5 put numbers on this.
#
# > **Common misconception** (seed 002 §3.2): a module whose `forward` returns `relu(linear(x))` is a "fused"
# > Linear+ReLU that runs as a single kernel.
# >
# > **Why it is wrong:** putting two operations in one `forward` changes nothing about how they run: eager PyTorch
# > still runs the matmul, writes its output to memory, then runs ReLU, which reads it back. Fusion is done by a
# > compiler or a kernel author.
# >
# > **What is true:** the profiler below lists the module's operations: `aten::addmm` and `aten::relu`, two
# > kernels. `torch.compile` (above) or a hand-written kernel (notebook 08) fuses them into one.

# %% [markdown] lang="zh" en="2ca4a51bc926"
# **融合什么时候有用，什么时候没用。** 即使融合之后，这条链每搬运一个字节也只做约 1 次浮点运算（第 5 节
# 会打印它的算术强度）：它是访存密集型的，所以耗时取决于搬运的字节数，把字节数降到原来的 1/12 便是全部
# 要义。大矩阵乘法正好相反：每个元素从缓存中被重复使用约 n 次，耗时取决于算术运算，把它的 bias 或激活
# 函数融合进去（即 *epilogue*，尾处理）只省下对输出的一次遍历，收益只有百分之几。该融合的是逐元素算子链、
# 归一化和 softmax；对矩阵乘法，应该换一个更快的矩阵乘法（更低的精度、张量核心 / AMX）。第 4、5 节会给出
# 具体数字。
#
# > **常见误解**（seed 002 §3.2）：一个 `forward` 返回 `relu(linear(x))` 的模块，就是“融合”了的
# > Linear+ReLU，会作为单个内核运行。
# >
# > **错在哪里：** 把两个运算写进同一个 `forward`，丝毫不会改变它们的运行方式：eager 模式的 PyTorch 仍然
# > 先运行矩阵乘法，把输出写入内存，再运行 ReLU，把它读回来。融合要由编译器或内核作者来完成。
# >
# > **实际情况：** 下面的性能分析器列出了这个模块的运算：`aten::addmm` 和 `aten::relu`，是两个内核。
# > `torch.compile`（见上文）或手写内核（notebook 08）才会把它们融合成一个。

# %%
class FusedLinearReLU(torch.nn.Module):          # the article's "fused" module, as it writes it
    def __init__(self, d_in, d_out):
        super().__init__(); self.linear = torch.nn.Linear(d_in, d_out)
    def forward(self, x):
        return torch.relu(self.linear(x))
fused, x_small = FusedLinearReLU(256, 256), torch.randn(64, 256)
pr = P.profile_steps(lambda: fused(x_small), steps=1, warmup=0)   # torch.profiler, as in section 1
ran = sorted({e.key for e in pr.key_averages()} & {"aten::addmm", "aten::relu", "aten::clamp_min"})
print("operations that ran as kernels of their own:", ran)
assert {"aten::addmm", "aten::relu"} <= set(ran)

# %% [markdown]
# ### Fusing matmuls: the Q, K and V projections
#
# Attention projects the same input three times: `q = x Wq + bq`, `k = x Wk + bk`, `v = x Wv + bv`, three matmuls
# that each read `x`. Stack the three weight matrices into one `(3d, d)` matrix and it is one matmul, whose output
# is split into q, k and v. The article reports "about 15 % end-to-end" from this fusion in its Transformer
# (seed 002 §3.1): the article's own figure, for its model on its GPU. The same computation here, with the weights
# copied, so both versions must give the same numbers:

# %% [markdown] lang="zh" en="f09d471a91c4"
# ### 融合矩阵乘法：Q、K、V 投影
#
# 注意力对同一个输入做三次投影：`q = x Wq + bq`、`k = x Wk + bk`、`v = x Wv + bv`，即三次矩阵乘法，每次
# 都要读一遍 `x`。把三个权重矩阵堆叠成一个 `(3d, d)` 的矩阵，就只需要一次矩阵乘法，再把输出拆分成 q、k
# 和 v。文章称，这种融合在它的 Transformer 中带来了“端到端约 15 %”的提升（seed 002 §3.1）：这是文章
# 自己的数字，针对的是它的模型和它的 GPU。下面在这里做同样的计算，权重是复制过去的，所以两个版本必须给出
# 相同的数值：

# %%
d = 256
proj = [torch.nn.Linear(d, d, device=dev) for _ in range(3)]               # q, k, v: three Linear(d, d)
qkv = torch.nn.Linear(d, 3 * d, device=dev)                                # one Linear(d, 3d)
with torch.no_grad():
    qkv.weight.copy_(torch.cat([m.weight for m in proj]))
    qkv.bias.copy_(torch.cat([m.bias for m in proj]))
qkv_unfused, qkv_fused = (lambda h: [m(h) for m in proj]), (lambda h: qkv(h).split(d, dim=-1))
xq = torch.randn(64, d, device=dev)                                        # 64 tokens
with torch.no_grad():
    for unf, fus in zip(qkv_unfused(xq), qkv_fused(xq)):
        torch.testing.assert_close(fus, unf, rtol=1e-5, atol=1e-5)         # only the summation order may differ

# %% [markdown]
# What changed: the profiler counts the matmul launches (`aten::addmm`), `T.torch_traffic` (notebook 08 uses it
# too) counts the bytes each op reads, from the tensors it is handed, and `FlopCounterMode` the FLOPs:

# %% [markdown] lang="zh" en="0a47362b798b"
# 变化在哪里：性能分析器统计矩阵乘法的启动次数（`aten::addmm`），`T.torch_traffic`（notebook 08 也会用到）
# 根据传给每个算子的张量统计它读取的字节数，`FlopCounterMode` 则统计浮点运算次数：

# %%
mm_calls, moved = {}, {}
with torch.no_grad():
    for name, f in (("3 x Linear(d, d)", qkv_unfused), ("1 x Linear(d, 3d)", qkv_fused)):
        prof_qkv = P.profile_steps(lambda f=f: f(xq), steps=1, warmup=0, device=dev)
        calls = {e.key: e.count for e in prof_qkv.key_averages()}
        mm_calls[name], moved[name] = calls.get("aten::addmm", 0), T.torch_traffic(f, xq)
        print(f"{name:<18} {mm_calls[name]} matmul launch(es), reads {moved[name].read / 2**10:4.0f} KiB")
weights = sum(t.nbytes for t in qkv.parameters())  # the same weights in both: the saving is reading x once
print(f"weights and biases {weights / 2**10:.0f} KiB either way; x is {xq.nbytes / 2**10:.0f} KiB")
assert list(mm_calls.values()) == [3, 1]
assert P.count_flops(lambda: qkv_fused(xq)) == P.count_flops(lambda: qkv_unfused(xq))  # same FLOPs
assert [m.read for m in moved.values()] == [weights + 3 * xq.nbytes, weights + xq.nbytes]

# %% [markdown]
# Same FLOPs, two fewer launches, `x` read once instead of three times. The launches saved are a fixed cost, which
# shrinks next to the matmul's work as the number of tokens grows; the bytes saved (two reads of `x`) grow with the
# tokens, but so do the FLOPs, and the weights, read either way, are most of the bytes while the tokens are far
# fewer than d. The race, for a decoding step (4 tokens) and a long prompt (512 tokens), round-robin, median of 21:

# %% [markdown] lang="zh" en="fc159238d56f"
# 浮点运算次数相同，内核启动少了两次，`x` 只读一次而不是三次。省下的启动是固定开销，随着 token 数增加，
# 它相对于矩阵乘法的工作量会越来越小；省下的字节（两次读取 `x`）随 token 数增长，但浮点运算次数也随之
# 增长，而且只要 token 数远少于 d，两个版本都要读取的权重就占了字节数的大头。下面是解码步（4 个 token）
# 和长提示词（512 个 token）两种情形下的比赛，轮流交替运行，取 21 次的中位数：

# %%
# NBVAL_IGNORE_OUTPUT
with torch.no_grad():
    for n_tok in (4, 512):
        tq = P.interleaved_times({"3": qkv_unfused, "1": qkv_fused}, torch.randn(n_tok, d, device=dev),
                                 repeats=21, warmup=3, device=dev)
        print(f"{n_tok:>3} tokens: three matmuls {tq['3'] * 1e6:7.1f} µs, one {tq['1'] * 1e6:7.1f} µs: the fused "
              f"projection ran {abs(tq['3'] / tq['1'] - 1):.0%} {'faster' if tq['1'] < tq['3'] else 'slower'}")
        notes.append((f"QKV fusion, {n_tok} tokens", f"3 matmuls / 1 matmul = {tq['3'] / tq['1']:.2f}"))

# %% [markdown]
# The lines above say what this machine made of it. On a GPU the fused projection has one more advantage: a
# `(tokens, 3d)` output has three times as many tiles as a `(tokens, d)` one, so it can keep more of the SMs busy
# where a small matmul leaves some idle. How much that buys end to end depends on the model's size and on what else the
# step does, so treat the article's 15 % as one measurement, not a constant: measure it on your model.
#
# ### Folding BatchNorm into a convolution
#
# In eval mode BatchNorm is a fixed affine map per channel, `y = γ (z − μ) / σ + β` with
# `σ = sqrt(running_var + eps)`, and a convolution `z = W ∗ x + b` is affine too, so the two fold into one
# convolution with
#
# $$W' = W \cdot \frac{\gamma}{\sigma}, \qquad b' = (b - \mu) \cdot \frac{\gamma}{\sigma} + \beta$$
#
# (per output channel). Inference tools (TensorRT, ONNX Runtime) do this among their first graph passes;
# `torch.nn.utils.fusion.fuse_conv_bn_eval` does it for one pair. A small CNN, whose BatchNorm layers get a random
# scale and shift, and running statistics from five training-mode batches, then switches to eval mode:

# %% [markdown] lang="zh" en="9631090bf06d"
# 上面几行给出了这台机器上的结果。在 GPU 上，融合后的投影还有一个好处：`(tokens, 3d)` 输出的 tile 数
# 是 `(tokens, d)` 输出的三倍，所以在小矩阵乘法会让部分 SM 闲置的地方，它能让更多的 SM 忙起来。这在端到端
# 上能带来多少收益，取决于模型的规模，以及训练步中还做了什么，所以请把文章的 15 % 看作一次测量结果，而不是
# 一个常数：在你自己的模型上测一测。
#
# ### 把 BatchNorm 折叠进卷积
#
# 在 eval 模式下，BatchNorm 是每个通道上的一个固定仿射变换，`y = γ (z − μ) / σ + β`，其中
# `σ = sqrt(running_var + eps)`；而卷积 `z = W ∗ x + b` 也是仿射变换，所以两者可以折叠成一个卷积，
# 其参数为
#
# $$W' = W \cdot \frac{\gamma}{\sigma}, \qquad b' = (b - \mu) \cdot \frac{\gamma}{\sigma} + \beta$$
#
# （逐输出通道计算）。推理工具（TensorRT、ONNX Runtime）在最先执行的几道图优化中就会做这件事；
# `torch.nn.utils.fusion.fuse_conv_bn_eval` 对一对层做这件事。下面是一个小型 CNN：给它的 BatchNorm 层
# 随机设定缩放和平移参数，再用五个训练模式的批次积累运行统计量，然后切换到 eval 模式：

# %%
cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                          torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU()).to(dev)
with torch.no_grad():
    for bn_ in (cnn[1], cnn[4]):                                                    # γ and β
        bn_.weight.uniform_(0.5, 1.5)
        bn_.bias.uniform_(-0.5, 0.5)
    for _ in range(5):
        cnn(torch.randn(16, 3, 16, 16, device=dev) * 2 + 1)                         # μ and σ move
cnn.eval()
folded = torch.nn.Sequential(fuse_conv_bn_eval(cnn[0], cnn[1]), cnn[2], fuse_conv_bn_eval(cnn[3], cnn[4]), cnn[5])

# %% [markdown]
# The folded network against the original (float32, tolerance `1e-5` absolute and relative: only rounding
# differs; on an Ampere or newer GPU cuDNN would run fp32 convolutions in TF32 by default, whose 10-bit rounding of
# the folded weights exceeds that, so the check turns it off), its operations as the profiler counts them, and the
# formula above against the folded layer's weights:

# %% [markdown] lang="zh" en="8413d2f89c42"
# 把折叠后的网络与原网络对比（float32，绝对容差和相对容差都是 `1e-5`：两者只有舍入上的差别；在 Ampere
# 或更新的 GPU 上，cuDNN 默认会以 TF32 运行 fp32 卷积，它对折叠后权重做的 10 位舍入会超出这个容差，
# 所以检查时把它关掉了），再看性能分析器统计的运算次数，最后用上面的公式核对折叠层的权重：

# %%
img = torch.randn(4, 3, 16, 16, device=dev)
with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # plain fp32 on a GPU too
    torch.testing.assert_close(folded(img), cnn(img), rtol=1e-5, atol=1e-5)
    top = ("aten::conv2d", "aten::batch_norm", "aten::relu")
    n_ops = {name: sum(e.count for e in P.profile_steps(lambda m=m: m(img), steps=1, warmup=0, device=dev)
                       .key_averages() if e.key in top) for name, m in (("conv+BN+ReLU", cnn), ("folded", folded))}
print(f"operations per forward (conv2d, batch_norm, relu): {n_ops}")
sigma = torch.sqrt(cnn[1].running_var + cnn[1].eps)
gain = cnn[1].weight / sigma                                                        # γ / σ, per output channel
torch.testing.assert_close(folded[0].weight, cnn[0].weight * gain.reshape(-1, 1, 1, 1))               # W'
torch.testing.assert_close(folded[0].bias, (cnn[0].bias - cnn[1].running_mean) * gain + cnn[1].bias)  # b'
assert n_ops == {"conv+BN+ReLU": 6, "folded": 4}

# %% [markdown]
# The ReLUs are still ops of their own. Fusing an activation into the convolution needs a compiler or a library
# kernel: `torch.compile` for inference with Inductor's `freezing` option folds BatchNorm the same way and, on a CPU,
# asks oneDNN for a convolution that applies the ReLU as it writes its output (a "post-op": the generated code calls
# `mkldnn._convolution_pointwise(..., 'relu', ...)`); on a GPU, TensorRT and cuDNN's fused convolutions do the
# same. It is not run here: compiling it would take a good part of this notebook's time budget, for a lesson the
# GELU chain above already showed.
#
# ### A fused op needs its own backward
#
# The article warns that a fused op can make the gradient vanish (seed 002 §6.2). The reason: autograd cannot see
# inside a hand-written fused kernel (CUDA, Triton, notebook 08), so its author writes the backward by hand too, and
# a forgotten term of the derivative goes unnoticed, since the forward is right. (`torch.compile` is the exception:
# it derives the backward with autograd before it fuses.) `fusion.fused_bias_gelu` is bias + GELU as one `torch.autograd.Function`;
# its backward, from the saved `h = x + b` and `u = sqrt(2/π) (h + 0.044715 h³)`, is
#
# $$\frac{\partial y}{\partial h} = \tfrac12 (1 + \tanh u) + \tfrac12\, h\, (1 - \tanh^2 u)\,
# \sqrt{2/\pi}\, (1 + 3 \cdot 0.044715\, h^2),$$
#
# and the bias gradient sums it over the rows. `torch.autograd.gradcheck` compares a backward with finite differences
# of the forward, in float64 (in float32 the differences drown in rounding). It passes the exact backward and
# fails the typical mistake, a backward that treats `tanh u` as a constant and keeps only the first term:

# %% [markdown] lang="zh" en="239bb24f75a5"
# ReLU 仍然是独立的算子。把激活函数融合进卷积需要编译器或库内核：用于推理、开启了 Inductor `freezing`
# 选项的 `torch.compile` 会以同样的方式折叠 BatchNorm，并且在 CPU 上向 oneDNN 请求一个在写出输出时顺便
# 应用 ReLU 的卷积（即“post-op”：生成的代码会调用 `mkldnn._convolution_pointwise(..., 'relu', ...)`）；
# 在 GPU 上，TensorRT 和 cuDNN 的融合卷积也做同样的事。这里不运行它：编译要占去本 notebook 相当一部分
# 时间预算，而它要讲的道理，上面的 GELU 链已经展示过了。
#
# ### 融合算子需要自己的反向传播
#
# 文章警告说，融合算子可能导致梯度消失（seed 002 §6.2）。原因在于：autograd 看不到手写融合内核（CUDA、
# Triton，notebook 08）的内部，所以内核作者还得手写反向传播，而导数中漏掉的某一项不会被察觉，因为前向
# 是对的。（`torch.compile` 是个例外：它在融合之前先用 autograd 推导出反向传播。）
# `fusion.fused_bias_gelu` 把 bias + GELU 写成一个 `torch.autograd.Function`；它的反向传播利用保存下来的
# `h = x + b` 和 `u = sqrt(2/π) (h + 0.044715 h³)` 计算：
#
# $$\frac{\partial y}{\partial h} = \tfrac12 (1 + \tanh u) + \tfrac12\, h\, (1 - \tanh^2 u)\,
# \sqrt{2/\pi}\, (1 + 3 \cdot 0.044715\, h^2),$$
#
# bias 的梯度则是它沿各行的求和。`torch.autograd.gradcheck` 用前向的有限差分来检验反向传播，在 float64
# 下进行（在 float32 下，差分会淹没在舍入误差中）。精确的反向传播能通过它，典型的错误则通不过：一个把
# `tanh u` 当作常数、只保留第一项的反向传播：

# %%
xg = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)
bg = torch.randn(16, dtype=torch.float64, requires_grad=True)
torch.testing.assert_close(fusion.fused_bias_gelu(xg, bg), torch.nn.functional.gelu(xg + bg, approximate="tanh"))
exact = torch.autograd.gradcheck(fusion.fused_bias_gelu, (xg, bg))
buggy = torch.autograd.gradcheck(lambda a_, b_: fusion.fused_bias_gelu(a_, b_, backward="tanh-held-constant"),
                                 (xg, bg), raise_exception=False)
print(f"gradcheck: the exact backward {'passes' if exact else 'fails'}; "
      f"with tanh held constant it {'passes' if buggy else 'fails'}")
assert exact and not buggy

# %% [markdown]
# ## 4. This machine's ceilings
#
# **Compute:** the best matmul FLOP/s over a few shapes (the "maximum achievable matmul FLOPs": what a real
# kernel reaches, not the datasheet), for fp32 and bf16. **Memory:** a large copy, counting the bytes read
# *and* written.

# %% [markdown] lang="zh" en="70d081989b7b"
# ## 4. 本机的性能上限
#
# **计算：** 在几种形状中取最好的矩阵乘法 FLOP/s（即“可达到的最大矩阵乘法 FLOPs”：真实内核能达到的水平，
# 而不是数据手册上的数字），fp32 和 bf16 分别测量。**内存：** 做一次大规模拷贝，读*和*写的字节都计入。

# %%
# NBVAL_IGNORE_OUTPUT
shapes = ((512, 512, 512), (1024, 1024, 1024), (2048, 1024, 1024))
BF16_FAST = device.fast(torch.bfloat16, dev)  # emulated bf16 is slow: measure it on the smallest shape only
peaks = {"fp32": bench.peak_matmul_flops("fp32", dev, shapes)}
if device.computes(torch.bfloat16, dev):
    peaks["bf16"] = bench.peak_matmul_flops("bf16", dev, shapes if BF16_FAST else shapes[:1])
bw = bench.memory_bandwidth(256 * 2**20, dev)
for name, pk in peaks.items():
    print(f"{name}: {pk.flops_per_s / 1e9:8.1f} GFLOP/s (best shape {pk.shape})")
print(f"copy bandwidth: {bw.bytes_per_s / 1e9:.1f} GB/s (read + write)")

# %% [markdown]
# The **theoretical** peak is units × frequency × FLOPs per cycle: on a CPU, cores × clock × what the ISA does
# per cycle (AVX-512 FMA: 16 fp32 lanes × 2 FLOPs × 2 units; AMX-BF16: 1024 FLOPs/cycle); on a GPU, SMs × clock
# × FLOPs/clock/SM of its tensor cores. The formula rests on assumptions, printed with it. Real jobs reach part of it:

# %% [markdown] lang="zh" en="6dac16625754"
# **理论**峰值 = 单元数 × 频率 × 每周期 FLOPs：在 CPU 上是核数 × 时钟频率 × 指令集每周期能完成的运算量
# （AVX-512 FMA：16 个 fp32 通道 × 2 FLOPs × 2 个单元；AMX-BF16：每周期 1024 FLOPs）；在 GPU 上是
# SM 数 × 时钟频率 × 其张量核心每 SM 每时钟周期的 FLOPs。这个公式建立在若干假设之上，下面会把这些假设随公式
# 一起打印出来。实际作业只能达到其中的一部分：

# %%
# NBVAL_IGNORE_OUTPUT
for name, pk in peaks.items():
    theo = bench.theoretical_peak(name, dev)
    print(theo.describe())
    print(f"  measured {pk.flops_per_s / 1e9:.1f} GFLOP/s = {pk.flops_per_s / theo.flops_per_s:.0%} of it")
    print("  " + (bench.excess_note(theo, pk.flops_per_s) or "below it, as a measurement should be") + "\n")
    notes.append((f"peak {name}", f"{pk.flops_per_s / 1e9:.0f} of {theo.flops_per_s / 1e9:.0f} GFLOP/s"))
notes.append(("copy bandwidth", f"{bw.bytes_per_s / 1e9:.1f} GB/s"))

# %% [markdown]
# **07.peak-formula.** The same formula for a GPU node, from NVIDIA's A100 whitepaper: a DGX A100 holds 8 A100 GPUs,
# each with 108 SMs at a boost clock of 1410 MHz, and the four tensor cores of an SM together perform 1024 dense FP16
# fused multiply-adds (FMA) per clock (`DGX_A100`). Its theoretical dense FP16 peak, in FLOP/s
# (devices × units × clock × FLOPs per unit per cycle)?

# %% [markdown] lang="zh" en="57ecf0b45271"
# **07.peak-formula.** 对 GPU 节点套用同一个公式，数据来自 NVIDIA 的 A100 白皮书：一台 DGX A100 装有
# 8 块 A100 GPU，每块有 108 个 SM，加速频率（boost clock）为 1410 MHz，每个 SM 的四个张量核心每个时钟
# 周期合计完成 1024 次稠密 FP16 融合乘加（FMA）（`DGX_A100`）。它的理论稠密 FP16 峰值是多少 FLOP/s
# （设备数 × 单元数 × 时钟频率 × 每单元每周期的 FLOPs）？

# %%
peak_dgx = ...   # FLOP/s, a Python float
### BEGIN SOLUTION
peak_dgx = DGX_A100["gpus"] * DGX_A100["sms_per_gpu"] * DGX_A100["boost_clock_mhz"] * 1e6 \
    * DGX_A100["dense_fp16_fma_per_sm_per_clock"] * 2   # an FMA is two FLOPs
### END SOLUTION
check("07.peak-formula", peak_dgx)

# %% [markdown]
# ## 5. The roofline
#
# Time four kinds of op on this machine and place them: a 1024³ fp32 matmul (the shape measured above), a bf16
# matmul, LayerNorm and softmax over 2048 × 2048, and the GELU chain unfused and compiled.

# %% [markdown] lang="zh" en="396f67c6a0bb"
# ## 5. 屋顶线模型
#
# 在本机上为四类算子计时，并把它们放到屋顶线图上：一个 1024³ 的 fp32 矩阵乘法（即上面测过的形状）、
# 一个 bf16 矩阵乘法、在 2048 × 2048 上的 LayerNorm 和 softmax，以及未融合和编译后的 GELU 链。

# %%
n = 1024
a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
ab16, bb16 = a.bfloat16(), b.bfloat16()
ln = torch.nn.LayerNorm(cols).to(dev).requires_grad_(False)
timed = {"mm fp32 1024": (lambda: a @ b, R.matmul_cost(n, n, n, "fp32")),
         "layernorm": (lambda: ln(x), R.layernorm_cost(rows, cols, "fp32")),
         "softmax": (lambda: torch.softmax(x, -1), R.softmax_cost(rows, cols, "fp32")),
         "chain unfused": (lambda: P.gelu_chain_unfused(x, bias, mask, p), cost_unfused),
         "chain compiled": (lambda: chain_compiled(x, bias, mask, p), cost_fused)}
if "bf16" in peaks:
    timed["mm bf16 1024"] = (lambda: ab16 @ bb16, R.matmul_cost(n, n, n, "bf16"))
secs = P.interleaved_times({k: f for k, (f, _) in timed.items()}, repeats=5, device=dev)

# %%
# NBVAL_IGNORE_OUTPUT
points = [R.place(c, secs[k], peaks["bf16" if "bf16" in k else "fp32"].flops_per_s, bw.bytes_per_s, name=k)
          for k, (_, c) in timed.items()]
print(R.table(points))
R.plot({k: v.flops_per_s for k, v in peaks.items()}, bw.bytes_per_s, points)
plt.show()

# %% [markdown]
# A point *above* 100 % of its roof is not an error: the copy measured main-memory bandwidth with tensors far
# larger than the cache, while a 16 MiB activation can stay partly in L2/L3, whose bandwidth is higher. Real
# machines have one bandwidth roof per memory level (the *hierarchical* roofline; Nsight Compute draws it on a GPU).
#
# Read it: the matmuls sit right of the ridge point (compute-bound; the bf16 roof is higher, which is why mixed
# precision speeds matmuls up); LayerNorm, softmax and the GELU chain sit far left (memory-bound: their roof is
# the bandwidth slope, and only moving fewer bytes helps). Fusion moved the chain *right* (same FLOPs, fewer
# bytes): that is what fusion does on a roofline. The bounds follow from the intensities and hold on any machine
# whose ridge point lies between ~2 and ~150 FLOP/byte (CPUs: ~5-30; GPUs: ~10-20 on their FP32 cores, ~100-300 on
# tensor cores, where even the 1024³ fp32 matmul, run in TF32, is closer to the ridge):

# %% [markdown] lang="zh" en="30137724fc59"
# 一个*高于*其屋顶 100 % 的点并不是错误：拷贝测的是主存带宽，用的张量远大于缓存，而一个 16 MiB 的激活值
# 可以部分留在 L2/L3 中，那里的带宽更高。真实机器的每一级存储都有一条自己的带宽屋顶（即*分层*屋顶线模型；
# Nsight Compute 会在 GPU 上画出它）。
#
# 解读这张图：矩阵乘法位于脊点右侧（计算密集型；bf16 的屋顶更高，这就是混合精度能加速矩阵乘法的原因）；
# LayerNorm、softmax 和 GELU 链位于远远的左侧（访存密集型：它们的屋顶是带宽那条斜线，只有少搬运字节才
# 有用）。融合把这条链向*右*移动了（浮点运算次数不变，字节更少）：这就是融合在屋顶线图上的作用。这些判定
# 由算术强度决定，在任何脊点位于约 2 到约 150 FLOP/byte 之间的机器上都成立（CPU：约 5-30；GPU：在 FP32
# 核心上约 10-20，在张量核心上约 100-300，在那里即使是以 TF32 运行的 1024³ fp32 矩阵乘法也更接近脊点）：

# %%
bounds = {pt.name: pt.bound for pt in points}
ridge = R.ridge_point(peaks["fp32"].flops_per_s, bw.bytes_per_s)
assert 2 < ridge < 150, f"this machine's fp32 ridge point is {ridge:.0f} FLOP/byte, outside the range the text assumes"
assert bounds["mm fp32 1024"] == "compute"
assert bounds["softmax"] == bounds["layernorm"] == bounds["chain unfused"] == "memory"
compiled_pt = next(pt for pt in points if pt.name == "chain compiled")
assert compiled_pt.intensity > 10 * next(pt for pt in points if pt.name == "chain unfused").intensity
assert 1 <= compiled_pt.intensity < 2  # "about 1 FLOP per byte, even fused" (section 3)
for pt in points:  # the intensities are exact: they come from the FLOP and byte model, not the clock
    print(f"{pt.name:<15} {pt.intensity:8.2f} FLOP/byte")

# %% [markdown]
# > **Common misconception** (seed 002 §7.2): "compute density" should be above 30 %; below that, a kernel is
# > memory-bound.
# >
# > **Why it is wrong:** arithmetic intensity is a ratio of FLOPs to bytes moved, in FLOP/byte, not a percentage,
# > and no fixed threshold separates memory- from compute-bound. The threshold is the machine's ridge point, its
# > peak FLOP/s divided by its bandwidth, which differs per machine and per dtype. From the datasheets: an A100
# > (40 GB, 1.555 TB/s) has its ridge at about 12.5 FLOP/byte in FP32 (19.5 TFLOP/s), about 100 with TF32 tensor
# > cores (156 TFLOP/s) and about 200 in FP16 (312 TFLOP/s); an H100 at about 295 in bf16. (Read as a utilisation
# > instead, a kernel's achieved share of the peak FLOP/s, a low figure says the kernel is not compute-bound, not
# > that memory limits it: it may wait on latency or launches; Nsight Compute shows its memory throughput beside it.)
# >
# > **What is true:** compare an op's intensity with the ridge point of the machine and the dtype it runs in. The
# > cell below computes two intensities from what torch counts (`FlopCounterMode`'s FLOPs, the tensors' bytes) and
# > puts them on either side of this machine's measured ridge; then it takes one fp32 matmul that is compute-bound
# > on an A100's FP32 roof and memory-bound on its TF32 roof: same op, same bytes, another threshold.

# %% [markdown] lang="zh" en="107c10da6c04"
# > **常见误解**（seed 002 §7.2）：“计算密度”应该高于 30 %；低于这个值，内核就是访存密集型的。
# >
# > **错在哪里：** 算术强度是浮点运算次数与搬运字节数之比，单位是 FLOP/byte，不是百分比，也没有一个固定
# > 的阈值能把访存密集型和计算密集型分开。这个阈值是机器的脊点，即峰值 FLOP/s 除以带宽，它因机器而异，
# > 也因数据类型而异。按数据手册：A100（40 GB，1.555 TB/s）的脊点在 FP32 下（19.5 TFLOP/s）约为
# > 12.5 FLOP/byte，使用 TF32 张量核心（156 TFLOP/s）时约为 100，在 FP16 下（312 TFLOP/s）约为 200；
# > H100 在 bf16 下约为 295。（如果把这个数理解为利用率，即内核实际达到的 FLOP/s 占峰值的比例，那么数值
# > 低只说明这个内核不是计算密集型的，并不说明它受内存限制：它也可能受制于延迟，或者在等待内核启动；
# > Nsight Compute 会在旁边同时给出它的访存吞吐量。）
# >
# > **实际情况：** 把一个算子的算术强度，与它所运行的机器和数据类型的脊点相比较。下面的单元格根据 torch
# > 统计的数据（`FlopCounterMode` 给出的 FLOPs、张量的字节数）计算两个算术强度，并把它们放在本机实测
# > 脊点的两侧；然后取一个 fp32 矩阵乘法，它在 A100 的 FP32 屋顶下是计算密集型的，在 TF32 屋顶下却是
# > 访存密集型的：同一个算子，同样的字节数，阈值却不同。

# %%
mm_intensity = P.count_flops(lambda: a @ b) / (a.nbytes + b.nbytes + (a @ b).nbytes)  # FlopCounterMode: 2·n³ FLOPs
add_intensity = a.numel() / (a.nbytes + b.nbytes + (a + b).nbytes)                  # a + b: 1 FLOP per element
print(f"{n}³ fp32 matmul: {mm_intensity:.1f} FLOP/byte; add: {add_intensity:.3f} FLOP/byte; "
      f"this machine's fp32 ridge lies {'between them' if add_intensity < ridge < mm_intensity else 'elsewhere'}")
a256, b256 = a[:256, :256].contiguous(), b[:256, :256].contiguous()
mm256 = P.count_flops(lambda: a256 @ b256) / (3 * a256.nbytes)                       # ~43 FLOP/byte
assert add_intensity < ridge < mm_intensity and mm_intensity > 1000 * add_intensity
assert 19.5e12 / 1.555e12 < mm256 < 156e12 / 1.555e12  # A100: right of the FP32 ridge, left of the TF32 one

# %% [markdown]
# ## 6. Utilisation, throughput and MFU
#
# **What `nvidia-smi`'s "GPU-Util" measures.** The fraction of the last sample period (1/6 s to 1 s) during which
# *at least one kernel* was running on the GPU. One small kernel occupying 1 of an H100's 132 SMs for the whole
# period reads 100 %. So GPU-Util answers "is the GPU ever idle?" (0-60 % means it waits for the CPU, the data
# loader or the network: the gaps of section 1's trace), never "is it working hard?". For the second question:
#
# - **DCGM** profiling metrics (`dcgmi dmon -e 1002,1003,1004,1005`, or the DCGM exporter for Prometheus):
#   *SM activity* (`DCGM_FI_PROF_SM_ACTIVE`: the share of time each SM has at least one warp, averaged over all
#   SMs), *SM occupancy* (resident warps / the maximum), *tensor pipe activity* (`PIPE_TENSOR_ACTIVE`: how busy
#   the tensor cores are) and *DRAM activity*;
# - **Nsight Systems** `nsys profile --gpu-metrics-devices=all python train.py` draws SM activity, tensor activity
#   and DRAM bandwidth on the same timeline as the kernels; **Nsight Compute** gives one kernel's achieved occupancy;
# - the end-to-end figures, which need no tool at all: **throughput** (samples/s, tokens/s) and **MFU**.
#
# GPU-Util is the busy fraction of a kernel timeline. `P.busy_fraction` computes it from a Chrome trace: the share
# of the `train_step` spans covered by at least one event of a category (`"kernel"` on a GPU trace, `"cpu_op"` on
# this CPU trace, where the rest is Python and dispatcher time between ops). First on a made-up trace, to see how
# little it takes to read 100 %:

# %% [markdown] lang="zh" en="ce2628b76c86"
# ## 6. 利用率、吞吐量与 MFU
#
# **`nvidia-smi` 的“GPU-Util”测的是什么。** 它是上一个采样周期（1/6 s 到 1 s）中，GPU 上*至少有一个
# 内核*在运行的时间比例。一个小内核在整个周期内只占用 H100 的 132 个 SM 中的 1 个，读数就是 100 %。所以
# GPU-Util 回答的是“GPU 有没有空闲？”（0-60 % 说明它在等 CPU、数据加载器或网络：也就是第 1 节 trace
# 中的那些空隙），而从不回答“它是不是在卖力工作？”。要回答第二个问题：
#
# - **DCGM** 的性能分析指标（`dcgmi dmon -e 1002,1003,1004,1005`，或者供 Prometheus 使用的 DCGM
#   exporter）：*SM 活跃度*（`DCGM_FI_PROF_SM_ACTIVE`：每个 SM 上至少有一个 warp 的时间比例，在所有 SM
#   上取平均）、*SM 占用率*（驻留的 warp 数 / 最大值）、*张量流水线活跃度*（`PIPE_TENSOR_ACTIVE`：
#   张量核心有多忙）和 *DRAM 活跃度*；
# - **Nsight Systems** 的 `nsys profile --gpu-metrics-devices=all python train.py` 把 SM 活跃度、张量核心
#   活跃度和 DRAM 带宽画在与内核相同的时间线上；**Nsight Compute** 给出单个内核实际达到的占用率；
# - 端到端的指标，完全不需要任何工具：**吞吐量**（samples/s、tokens/s）和 **MFU**。
#
# GPU-Util 就是内核时间线的忙碌比例。`P.busy_fraction` 从 Chrome trace 中计算它：在各个 `train_step`
# 区间中，至少被某一类别的一个事件覆盖的时间所占的比例（GPU trace 上的类别是 `"kernel"`，这份 CPU trace
# 上是 `"cpu_op"`，其余时间是算子之间的 Python 和分发器时间）。先在一份虚构的 trace 上看一看，读数达到
# 100 % 有多容易：

# %%
window = {"ph": "X", "name": "train_step", "ts": 0, "dur": 1000}
one_tiny_kernel = {"ph": "X", "cat": "kernel", "name": "tiny", "ts": 0, "dur": 1000}   # 1 block on 1 SM, all along
burst = {"ph": "X", "cat": "kernel", "name": "big gemm", "ts": 0, "dur": 300}            # every SM, 30 % of the time
print(f"one tiny kernel: {P.busy_fraction([window, one_tiny_kernel], 'kernel'):.0%} 'utilised'; "
      f"one big kernel then idle: {P.busy_fraction([window, burst], 'kernel'):.0%}")
assert P.busy_fraction([window, one_tiny_kernel], "kernel") == 1.0 and P.busy_fraction([window, burst], "kernel") == 0.3

# %% [markdown]
# And on the trace of section 1 (on a GPU, with `category="kernel"`: the same figure `nvidia-smi` would show):

# %% [markdown] lang="zh" en="df06a2a8bf20"
# 再看第 1 节的 trace（在 GPU 上使用 `category="kernel"`：得到的就是 `nvidia-smi` 会显示的那个数字）：

# %%
# NBVAL_IGNORE_OUTPUT
busy = P.busy_fraction(events, "kernel" if device.is_cuda(dev) else "cpu_op")
print(f"busy fraction of the tiny GPT step: {busy:.0%} (the rest: Python and framework overhead between ops)")
assert 0 < busy <= 1
notes.append(("busy fraction (GPU-Util analogue)", f"{busy:.0%}"))

# %% [markdown]
# **Throughput and MFU.** Tokens per second is the figure to compare runs by (step time alone hides the batch
# size). **MFU**, *model FLOPs utilisation*, relates it to the hardware: the FLOPs the model needs per second at
# that throughput, divided by the peak FLOP/s. A dense transformer needs about **6 FLOPs per parameter per token**
# for training (2 forward, 4 backward), plus attention's 12 × layers × sequence length × d_model
# (`P.gpt_train_flops`; PaLM's appendix). PyTorch's `FlopCounterMode` (`P.count_flops`) counts the matmuls of a
# real step, and the two agree exactly. Recomputation under activation checkpointing does not count: with it
# counted, the figure is HFU (*hardware* FLOPs utilisation).

# %% [markdown] lang="zh" en="278632294c3f"
# **吞吐量与 MFU。** 比较不同的运行要看每秒 token 数（只看单步时间会掩盖批大小）。**MFU**，即*模型算力
# 利用率*（model FLOPs utilisation），把吞吐量与硬件联系起来：在该吞吐量下模型每秒所需的浮点运算次数，
# 除以峰值 FLOP/s。稠密 Transformer 训练时，每个 token 每个参数约需 **6 次浮点运算**（前向 2 次，反向
# 4 次），另加注意力部分的 12 × 层数 × 序列长度 × d_model（`P.gpt_train_flops`；见 PaLM 论文附录）。
# PyTorch 的 `FlopCounterMode`（`P.count_flops`）统计一个真实训练步中的矩阵乘法，两者完全一致。激活
# 重计算（梯度检查点）带来的重复计算不计入；如果计入，这个指标就成了 HFU（*硬件*算力利用率，hardware
# FLOPs utilisation）。

# %%
gpt_cfg = models.GPTConfig(vocab_size=12, seq_len=12)  # the model P.make_gpt_step built
flops_per_step = P.count_flops(step)
assert flops_per_step == P.gpt_train_flops(gpt_cfg, 32)
print(f"one step of 32 x 12 tokens: {flops_per_step / 1e6:.1f} MFLOP = {flops_per_step / (32 * 12) / 1e6:.2f} MFLOP/token")

# %%
# NBVAL_IGNORE_OUTPUT
step_s = bench.time_fn(step, warmup=1, repeats=5, device=dev).median
theo32 = bench.theoretical_peak("fp32", dev).flops_per_s
mfu_measured = P.mfu(flops_per_step, step_s, peaks["fp32"].flops_per_s)
print(f"step {step_s * 1e3:.1f} ms -> {32 * 12 / step_s:,.0f} tokens/s, {flops_per_step / step_s / 1e9:.2f} GFLOP/s")
print(f"MFU: {mfu_measured:.1%} of the measured fp32 matmul peak, {P.mfu(flops_per_step, step_s, theo32):.1%} "
      "of the theoretical one")
assert 0 < mfu_measured < 0.9  # far below the peak, whatever the machine
notes.append(("tiny GPT throughput", f"{32 * 12 / step_s:,.0f} tokens/s, MFU {mfu_measured:.1%} of measured peak"))

# %% [markdown]
# Far below the peak (the line above says how far on this machine): d_model = 96 gives matmuls too small to reach
# it, and the busy fraction above says
# part of the step is not even inside an op. Large-model training on GPUs reports an MFU of about 30-50 %
# (PaLM 540B: 46 %). Published MFU divides by the **datasheet** peak (the theoretical one); the first figure above
# divides by the peak measured here, which is not the same number, so the two figures differ: compare an MFU only with one that used the
# same denominator, which is why the cell prints both. The same formula, for a 7B model at 3000 tokens/s per H100 (989 TFLOP/s dense bf16), and the
# throughput 40 % MFU would give (attention left out: small next to 6 × 7B at moderate sequence lengths):

# %% [markdown] lang="zh" en="3a8f2660ca5c"
# 远低于峰值（上面那一行给出了在本机上低多少）：d_model = 96 时矩阵乘法太小，达不到峰值；而上面的忙碌
# 比例说明，训练步中有一部分时间甚至不在任何算子之内。在 GPU 上训练大模型，报告的 MFU 约为 30-50 %
# （PaLM 540B：46 %）。公开发表的 MFU 除以的是**数据手册**上的峰值（即理论峰值）；上面第一个数字除以的
# 是在这里实测的峰值，两者并不相同，所以这两个数字也不同：只能把一个 MFU 与使用相同分母的 MFU 相比较，这也是该单元格
# 把两者都打印出来的原因。下面用同一个公式计算一个在每块 H100（稠密 bf16 989 TFLOP/s）上跑到
# 3000 tokens/s 的 7B 模型的 MFU，以及 40 % MFU 对应的吞吐量（不计注意力：在中等序列长度下，它与
# 6 × 7B 相比很小）：

# %%
mfu_7b = P.mfu(6 * 7e9 * 3000, 1.0, H100_BF16_FLOPS)
print(f"7B at 3000 tokens/s: MFU {mfu_7b:.1%}; 40 % MFU would be {0.4 * H100_BF16_FLOPS / (6 * 7e9):,.0f} tokens/s")
assert round(mfu_7b, 3) == 0.127

# %% [markdown]
# ## 7. Method: one change at a time, baseline first
#
# Every figure above was measured against a baseline in the *same run* (round-robin, medians), because a busy
# machine drifts by tens of percent between runs. Change one variable at a time (fusion, dtype, shape, threads),
# and write each result down with what changed. This session's notes:

# %% [markdown] lang="zh" en="0fb025cb2c8e"
# ## 7. 方法：先测基线，每次只改一处
#
# 上面的每个数字都是与*同一次运行*中的基线对比测得的（轮流交替运行，取中位数），因为一台繁忙的机器在两次
# 运行之间会漂移几十个百分点。每次只改变一个变量（融合、数据类型、形状、线程数），并把每个结果连同改动
# 一起记下来。本次会话的笔记：

# %%
# NBVAL_IGNORE_OUTPUT
for what, result in notes:
    print(f"{what:<26} | {result}")

# %% [markdown]
# ## 8. Exercises
#
# **07.axpy-intensity.** The arithmetic intensity (FLOP/byte) of `y = a * x + y` on fp32 vectors, `a` a scalar.

# %% [markdown] lang="zh" en="58c1b87440fd"
# ## 8. 练习
#
# **07.axpy-intensity.** 在 fp32 向量上计算 `y = a * x + y`（`a` 是标量）的算术强度（FLOP/byte）。

# %%
answer = ...
### BEGIN SOLUTION
answer = 2 / (3 * 4)  # a multiply and an add; read x, read y, write y
### END SOLUTION
check("07.axpy-intensity", answer)

# %% [markdown]
# **07.matmul-intensity.** Write `intensity(m, n, k, bytes_per_element)` for `(m, k) @ (k, n)`, reading A and B
# and writing C once. (`R.matmul_cost` does it; write it yourself.)

# %% [markdown] lang="zh" en="418ecc951adf"
# **07.matmul-intensity.** 为 `(m, k) @ (k, n)` 编写 `intensity(m, n, k, bytes_per_element)`，假设 A 和 B
# 各读一次、C 写一次。（`R.matmul_cost` 能算出它；请你自己写。）

# %%
def intensity(m, n, k, bytes_per_element):
    ...
    ### BEGIN SOLUTION
    return 2 * m * n * k / ((m * k + k * n + m * n) * bytes_per_element)
    ### END SOLUTION


check("07.matmul-intensity", intensity)

# %% [markdown]
# **07.optimise-first** and **07.ops-for-80.** A profile of a bigger model's step (self and total time in ms):

# %% [markdown] lang="zh" en="614dfcc280dc"
# **07.optimise-first** 和 **07.ops-for-80.** 一个更大模型的训练步的性能分析结果（self 时间和 total 时间，
# 单位 ms）：

# %%
print(f"{'op':<28} {'self ms':>8} {'total ms':>9} {'calls':>6}")
for op, self_ms, total_ms, calls in PROFILE_TABLE:
    print(f"{op:<28} {self_ms:>8.1f} {total_ms:>9.1f} {calls:>6}")

# %% [markdown]
# Which op do you optimise first? And how many ops, largest self time first, cover 80 % of the self time?

# %% [markdown] lang="zh" en="ee5dab2edc3a"
# 你会先优化哪个算子？把算子按 self 时间从大到小排列，需要多少个才能覆盖 80 % 的 self 时间？

# %%
first = ...
n_for_80 = ...
### BEGIN SOLUTION
first = max(PROFILE_TABLE, key=lambda r: r[1])[0]
total = sum(r[1] for r in PROFILE_TABLE)
n_for_80 = P.ops_to_cover([r[1] / total for r in PROFILE_TABLE], 0.8)
### END SOLUTION
check("07.optimise-first", first)
check("07.ops-for-80", n_for_80)

# %% [markdown]
# **07.bound.** On an H100 (datasheet: `H100_BF16_FLOPS` = 989 TFLOP/s dense bf16, `H100_BANDWIDTH` = 3.35 TB/s),
# say `"memory"` or `"compute"` for: a bf16 8192³ matmul; a bf16 softmax over 8192 × 8192; a bf16
# (8, 8192) @ (8192, 8192) matmul (a decoding step with batch 8).

# %% [markdown] lang="zh" en="eed7353b50c9"
# **07.bound.** 在 H100 上（数据手册：`H100_BF16_FLOPS` = 989 TFLOP/s 稠密 bf16，`H100_BANDWIDTH` =
# 3.35 TB/s），对下列每一项回答 `"memory"` 或 `"compute"`：一个 bf16 8192³ 矩阵乘法；一个在
# 8192 × 8192 上的 bf16 softmax；一个 bf16 的 (8, 8192) @ (8192, 8192) 矩阵乘法（批大小为 8 的一个
# 解码步）。

# %%
bounds_h100 = ...
### BEGIN SOLUTION
ops_h100 = (R.matmul_cost(8192, 8192, 8192, "bf16"), R.softmax_cost(8192, 8192, "bf16"),
            R.matmul_cost(8, 8192, 8192, "bf16"))
bounds_h100 = tuple(R.bound(c.intensity, H100_BF16_FLOPS, H100_BANDWIDTH) for c in ops_h100)
### END SOLUTION
check("07.bound", bounds_h100)

# %% [markdown]
# ## Summary
#
# - Profile before optimising: sort by **self** time; a few ops cover 80 %. The Chrome trace (Perfetto) shows
#   the timeline; on a GPU, sort by CUDA time and use Nsight Systems / Nsight Compute.
# - Every op pays a fixed launch/dispatch overhead: many tiny ops are slow out of proportion.
# - A chain of elementwise ops is memory-bound: fusing it (by hand or with `torch.compile`, whose first call
#   compiles) cuts the bytes and raises its intensity. A large matmul is compute-bound: fusion gains little there.
# - Matmuls fuse by stacking weights (Q, K, V: same FLOPs, two fewer launches, the input read once) or by folding
#   (BatchNorm into the convolution before it, in eval mode: W' = W·γ/σ, b' = (b − μ)·γ/σ + β). A fused op's
#   backward is written by hand: check it with `gradcheck` in float64 before trusting a loss curve.
# - The roofline: attainable = min(peak, intensity × bandwidth), with *measured* ceilings. The theoretical peak,
#   devices × units × frequency × FLOPs per unit per cycle (an FMA is two FLOPs; dense, not sparse), is an upper
#   bound real jobs reach only part of. Intensity is FLOP/byte, judged against the ridge point of the machine and
#   dtype, never a fixed percentage.
# - `python -m labkit.bench peak` prints this machine's measured vs theoretical peaks.
# - GPU-Util is the share of time *some* kernel runs, not how hard the GPU works: read DCGM's SM/tensor activity,
#   and judge a run by tokens/s and MFU (model FLOPs ≈ 6 × parameters × tokens, over the peak; 30-50 % is good
#   for large models on GPUs).
#
# Next, notebook 08 writes fused kernels yourself, in Triton, and counts the bytes they save; notebook 09 spreads the
# step over several processes, where the bottleneck becomes communication.

# %% [markdown] lang="zh" en="80052a8b3b0f"
# ## 小结
#
# - 优化之前先做性能分析：按 **self** 时间排序；少数几个算子就覆盖了 80 %。Chrome trace（Perfetto）展示
#   时间线；在 GPU 上要按 CUDA 时间排序，并使用 Nsight Systems / Nsight Compute。
# - 每个算子都要付出固定的启动/分发开销：许多微小算子会慢得不成比例。
# - 逐元素算子链是访存密集型的：把它融合起来（手工融合，或者用 `torch.compile`，它第一次调用时会编译）能
#   减少字节数、提高算术强度。大矩阵乘法是计算密集型的：融合在那里收益甚微。
# - 矩阵乘法可以通过堆叠权重来融合（Q、K、V：浮点运算次数相同，少两次内核启动，输入只读一次），也可以
#   通过折叠来融合（在 eval 模式下把 BatchNorm 折叠进它前面的卷积：W' = W·γ/σ，b' = (b − μ)·γ/σ + β）。
#   融合算子的反向传播是手写的：在相信一条损失曲线之前，先在 float64 下用 `gradcheck` 检查它。
# - 屋顶线模型：可达性能 = min(峰值, 算术强度 × 带宽)，其中的上限要用*实测*值。理论峰值，即
#   设备数 × 单元数 × 频率 × 每单元每周期的 FLOPs（一次 FMA 算两次浮点运算；按稠密而非稀疏计算），是一个
#   上界，实际作业只能达到其中的一部分。算术强度的单位是 FLOP/byte，要与机器和数据类型的脊点相比较，而不是
#   与一个固定的百分比比较。
# - `python -m labkit.bench peak` 打印本机实测峰值与理论峰值的对比。
# - GPU-Util 是*某个*内核在运行的时间比例，而不是 GPU 工作得有多卖力：要看 DCGM 的 SM/张量核心活跃度，
#   并用 tokens/s 和 MFU 来评判一次运行（模型浮点运算次数 ≈ 6 × 参数量 × token 数，再除以峰值；在 GPU 上
#   训练大模型，30-50 % 就算不错）。
#
# 接下来，notebook 08 让你自己用 Triton 编写融合内核，并统计它们省下的字节；notebook 09 把训练步分布到多个
# 进程上，这时瓶颈就变成了通信。
