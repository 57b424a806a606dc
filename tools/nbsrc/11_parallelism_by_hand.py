# %% [markdown]
# # 11 · Parallelism by hand: DDP, ZeRO-1, tensor and pipeline parallelism
#
# **Objectives**
# - write data parallelism three ways (all-reduce after backward, hooks that overlap communication with backward,
#   buckets), get gradients **bit-identical** to `torch.nn.parallel.DistributedDataParallel`, and know why they are;
# - shard AdamW over the ranks (ZeRO-1): the same weights as unsharded AdamW, bit for bit, with per-rank optimizer
#   bytes equal to `labkit.memory`'s prediction and to DeepSpeed stage 1's;
# - split an MLP the Megatron way (column-parallel, then row-parallel, with the conjugate operators f and g), add
#   sequence parallelism (an all-gather and a reduce-scatter in their place), and split a model into a 2-stage GPipe
#   pipeline; measure their communication and the pipeline bubble against the formulas;
# - run PyTorch's FSDP2 next to DeepSpeed ZeRO-3 on one model: same loss curve, different bytes and messages; with
#   gradient accumulation, mixed precision and sharded checkpoints (DCP, `zero_to_fp32`);
# - choose: what each rank holds, what it sends per step, and when each strategy is worth it; size a 70B run on 64
#   GPUs with tensor, pipeline and data parallelism.
#
# **Prerequisites:** notebooks 06 (the memory model), 09 (DDP, launching ranks) and 10 (ZeRO, DeepSpeed).
#
# **Estimated time:** 160 min (core 90 min, stretch 70 min)
#
# Sections 4-6 are **stretch**: tensor and pipeline parallelism by hand and FSDP2. A first pass can take sections
# 1-3 and 7 (data parallelism and ZeRO-1 by hand, then choosing a strategy) and come back for the rest; their
# cells still run in order, so run them even when you skip their reading.
#
# Everything runs for real on 2 ranks: two processes started by `torchrun`, talking over gloo. They are CPU
# processes wherever this notebook runs (`--device cpu`), because the point is the mechanism. The code follows its
# parameters' device and dtype and takes its backend from what the machine offers (gloo on a CPU, NCCL on GPUs), so on a node with 2 GPUs
# `torchrun --nproc_per_node 2 -m labkit.recipes.handpar --device cuda` runs the same strategies on NCCL, and the
# messages go over NVLink or PCIe within a node and InfiniBand between nodes instead of loopback TCP. What then
# differs: NCCL has a real reduce-scatter (section 3 counts gloo's emulation), and the timings are the GPU's.

# %% [markdown] lang="zh" en="a1184e5a0e3a"
# # 11 · 亲手实现并行：DDP、ZeRO-1、张量并行与流水线并行
#
# **学习目标**
# - 用三种方式实现数据并行（反向传播结束后做全归约（AllReduce）、用钩子让通信与反向传播重叠、分桶），得到与
#   `torch.nn.parallel.DistributedDataParallel` **逐位相同**的梯度，并弄清其中的原因；
# - 把 AdamW 分片到各个 rank 上（ZeRO-1）：权重与不分片的 AdamW 逐位相同，每个 rank 的优化器字节数既等于
#   `labkit.memory` 的预测值，也等于 DeepSpeed stage 1 的实际值；
# - 按 Megatron 的方式切分一个 MLP（先列并行、再行并行，配合一对共轭算子 f 和 g），加上序列并行（用一次全收集
#   （AllGather）和一次归约分散（ReduceScatter）取代 f 和 g），再把一个模型切成 2 个阶段的 GPipe 流水线；测量它们的
#   通信量和流水线气泡，并与公式对照；
# - 在同一个模型上并排运行 PyTorch 的 FSDP2 和 DeepSpeed ZeRO-3：损失曲线相同，字节数和消息不同；并加上梯度累积、混
#   合精度和分片检查点（DCP、`zero_to_fp32`）；
# - 做出选择：每个 rank 持有什么、每一步发送什么、每种策略何时值得使用；为一次在 64 块 GPU 上结合张量并行、流水线并
#   行和数据并行的 70B 训练估算规模。
#
# **前置知识：** notebook 06（显存模型）、09（DDP、启动多个 rank）和 10（ZeRO、DeepSpeed）。
#
# **预计用时：** 160 分钟（核心部分 90 分钟，进阶部分 70 分钟）
#
# 第 4-6 节为**进阶**内容：亲手实现张量并行和流水线并行，以及 FSDP2。第一遍可以只学第 1-3 节和第 7 节（亲手实现数据
# 并行和 ZeRO-1，然后选择策略），之后再回来学其余部分；这几节的单元格仍然要按顺序运行，所以即使跳过不读，也要运行它
# 们。
#
# 所有内容都在 2 个 rank（进程）上真实运行：由 `torchrun` 启动的两个进程，通过 gloo 通信。无论本 notebook 在哪里运
# 行，它们都是 CPU 进程（`--device cpu`），因为重点在于机制。
# 代码沿用参数所在的设备和数据类型，并按机器所能提供的选择通信后端
# （CPU 上用 gloo，GPU 上用 NCCL），所以在一个有 2 块 GPU 的节点上，
# `torchrun --nproc_per_node 2 -m labkit.recipes.handpar --device cuda` 会在 NCCL 上运行同样的策略，消息在节点内经由
# NVLink 或 PCIe、在节点间经由 InfiniBand 传输，而不是走回环 TCP。届时的不同之处：NCCL 有真正的归约分散（第 3 节统计
# 的是 gloo 的模拟实现），计时也是 GPU 的计时。

# %%
# %matplotlib inline
# %load_ext labkit
import inspect
import math

import matplotlib.pyplot as plt
import torch

from labkit import handpar, memory, models, sizing
from labkit.check import check, predict, reveal
from labkit.dist import launch
from labkit.exercises.nb11 import PREDICT_SETUP, rank_module

# %% [markdown]
# ## 1. Two processes, one model
#
# A rank is another process: it cannot see this notebook's variables. Code that runs on the ranks lives in files.
# `labkit.recipes.handpar` runs every strategy of this notebook next to the library that does the same thing
# (torch DDP, AdamW, DeepSpeed, the single-process model, `torch.distributed.pipelining`, FSDP2), in **one** launch
# (section 2), because starting the processes costs seconds. Your exercises run on the ranks too: `check()` writes
# the imports, functions and classes of your cell into a module file and runs it on 2 ranks next to the real thing.
#
# Data parallelism, ZeRO and FSDP below share one model: an MLP 64 → 256 → 256 → 256 → 1 with GELU, 148,481
# parameters in 8 tensors. Each rank trains on its own 64 rows per step.

# %% [markdown] lang="zh" en="650c9e9ecb5c"
# ## 1. 两个进程，一个模型
#
# 每个 rank 都是一个独立的进程：它看不到本 notebook 中的变量。在各个 rank 上运行的代码放在文件里。
# `labkit.recipes.handpar` 把本 notebook 中的每种策略与做同样事情的库（torch DDP、AdamW、DeepSpeed、单进程模型、
# `torch.distributed.pipelining`、FSDP2）并排运行，而且只用**一次**启动（第 2 节），因为启动进程要花好几秒。你的练习
# 也在各个 rank 上运行：`check()` 把你单元格中的 import、函数和类写进一个模块文件，然后在 2 个 rank 上把它与真正的实
# 现并排运行。
#
# 下面的数据并行、ZeRO 和 FSDP 共用一个模型：一个 64 → 256 → 256 → 256 → 1 的 MLP，激活函数为 GELU，共 148,481 个参
# 数，分布在 8 个张量中。每个 rank 每一步用它自己的 64 行数据训练。

# %%
mlp = models.MLP(64, 256, 1, depth=3, activation="gelu", seed=0)
for name, p in mlp.named_parameters():
    print(f"{name:<14} {str(tuple(p.shape)):<11} {p.numel():>7,} elements")
n_params = models.count_parameters(mlp)
print(f"{'total':<26} {n_params:>7,} elements, {4 * n_params:,} bytes in fp32")

# %% [markdown]
# ## 2. Data parallelism by hand, in three steps
#
# Every rank holds the whole model and computes the gradient of *its* rows. Averaged over the ranks (equal row
# counts), those gradients are the gradient of the mean loss over the global batch, so every rank takes the same
# step and the replicas stay identical.
#
# ### Step 0: start from the same weights
#
# "Stay identical" needs the replicas to *start* identical. A script without a common seed, or a checkpoint loaded
# on rank 0 only, starts each rank elsewhere, and nothing later would bring them together. So DDP's constructor
# broadcasts rank 0's parameters and buffers to every rank. By hand (the launch below seeds rank 1 differently on
# purpose, so that this step is what makes the replicas equal):

# %% [markdown] lang="zh" en="c0c1d509aea8"
# ## 2. 分三步亲手实现数据并行
#
# 每个 rank 都持有整个模型，并计算*它自己*那些行的梯度。在各 rank 行数相等时，把这些梯度在各 rank 间取平均，就得到全
# 局批次上平均损失的梯度，于是每个 rank 走出相同的一步，各个副本保持一致。
#
# ### 第 0 步：从相同的权重出发
#
# “保持一致”的前提是各副本在*开始时*就一致。一个没有统一随机种子的脚本，或者只在 rank 0 上加载的检查点，会让每个
# rank 从不同的位置出发，之后也没有任何操作能让它们重新一致。所以 DDP 的构造函数会把 rank 0 的参数和缓冲区广播到每个
# rank。亲手实现如下（下面的启动有意给 rank 1 设置了不同的种子，这样一来，让各副本相同的就只有这一步）：

# %%
print(inspect.getsource(handpar.broadcast_parameters))

# %% [markdown]
# ### Step 1: all-reduce after backward
#
# The simplest version waits until backward is done, then all-reduces each gradient, one tensor at a time:

# %% [markdown] lang="zh" en="b622728fd6c4"
# ### 第 1 步：反向传播结束后全归约
#
# 最简单的版本等反向传播全部结束，再逐个张量地对每个梯度做全归约：

# %%
print(inspect.getsource(handpar.allreduce_gradients))

# %% [markdown]
# Each gradient is scaled by 1/world *before* the sum. That detail is what DDP does too, and it matters for
# bitwise equality (below).
#
# ### Step 2: overlap communication with backward
#
# Backward produces gradients from the last layer to the first. The last layer's gradient is ready long before
# the first layer's, so its all-reduce can already travel while backward goes on. Two tools do it:
#
# - `p.register_post_accumulate_grad_hook(hook)` calls `hook(p)` as soon as `p.grad` is complete;
# - `dist.all_reduce(t, async_op=True)` starts the all-reduce and returns at once with a *work* handle; `work.wait()`
#   blocks until it is done.
#
# **Exercise 11.ddp-overlap.** Write `overlap_gradients(model)`: register a hook on every parameter that scales its
# gradient by 1/world and starts its all-reduce without waiting; return a function `wait()` that waits for all of
# them (the training loop calls it after `loss.backward()`, before `optimizer.step()`). The check runs your cell on
# 2 ranks and compares the gradients with torch DDP's, bit for bit, for 2 steps. Import what you use in the cell.

# %% [markdown] lang="zh" en="0cfba6d787de"
# 每个梯度都在求和*之前*乘以 1/world。DDP 也是这样做的，这个细节对逐位相等至关重要（见下文）。
#
# ### 第 2 步：让通信与反向传播重叠
#
# 反向传播从最后一层到第一层依次产生梯度。最后一层的梯度远早于第一层就绪，所以在反向传播继续进行的同时，它的全归约就
# 已经可以开始传输了。有两个工具可以做到这一点：
#
# - `p.register_post_accumulate_grad_hook(hook)` 在 `p.grad` 计算完成后立即调用 `hook(p)`；
# - `dist.all_reduce(t, async_op=True)` 启动全归约后立即返回一个 *work* 句柄；`work.wait()` 会阻塞，直到全归约完成。
#
# **练习 11.ddp-overlap。** 写出 `overlap_gradients(model)`：给每个参数注册一个钩子，把它的梯度乘以 1/world 并启动它
# 的全归约，但不等待完成；返回一个函数 `wait()`，由它等待所有这些全归约完成（训练循环在 `loss.backward()` 之后、
# `optimizer.step()` 之前调用它）。检查程序在 2 个 rank 上运行你的单元格，连续 2 步把梯度与 torch DDP 的梯度逐位比
# 较。单元格里用到什么，就在单元格里 import 什么。

# %%
import torch.distributed as dist


def overlap_gradients(model):
    """Start each gradient's all-reduce from a hook as soon as it is ready; return wait()."""
    ...
    ### BEGIN SOLUTION
    world = dist.get_world_size()
    pending = []

    def hook(p):
        p.grad.mul_(1.0 / world)
        pending.append(dist.all_reduce(p.grad, async_op=True))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def wait():
        for work in pending:
            work.wait()
        pending.clear()

    return wait
    ### END SOLUTION


check("11.ddp-overlap", overlap_gradients)

# %% [markdown]
# This is the file `check()` sent to the ranks, built from your cell (its `check(...)` line left out):

# %% [markdown] lang="zh" en="be65ce9b4f21"
# 这是 `check()` 根据你的单元格生成并发送给各个 rank 的文件（去掉了其中的 `check(...)` 那一行）：

# %% tags=["workspace-clear"]
print(rank_module(overlap_gradients))

# %% [markdown]
# ### Step 3: buckets
#
# Every all-reduce has a fixed cost α, whatever its size (notebook 09 measured it for gloo on loopback; with NCCL on
# NVLink it is a few microseconds). Eight small all-reduces pay 8α. DDP therefore copies gradients into
# **buckets** and all-reduces a bucket as soon as all its gradients are in: fewer, larger messages, still
# overlapped with backward. The buckets are filled in the order gradients arrive, last layer first, and a bucket
# closes once it holds its capacity or more (what DDP does when it rebuilds its buckets after the first step):

# %% [markdown] lang="zh" en="80962cf4aa10"
# ### 第 3 步：分桶
#
# 每次全归约都有一个固定开销 α，与数据大小无关（notebook 09 在回环上测量过 gloo 的 α；在 NVLink 上用 NCCL 时只有几微
# 秒）。八次小的全归约要付出 8α。因此 DDP 把梯度复制到**桶**（bucket）中，一个桶里的梯度一旦全部到齐，就对这个桶做全
# 归约：消息更少、更大，而且仍与反向传播重叠。桶按梯度到达的顺序填充，最后一层最先；一个桶装到其容量或超过容量时就关
# 闭（这正是 DDP 在第一步之后重建桶时的做法）：

# %%
print(inspect.getsource(handpar.bucket_layout))
print(inspect.getsource(handpar.BucketedGradients))

# %% [markdown]
# A bucket is sent when *all* its gradients are in. A parameter that takes no part in the loss (a head used only in
# evaluation, a branch skipped this step) never gets a gradient, so its bucket never fills and is never sent. If
# another rank did send it, that rank now waits for a partner that will never come. DDP therefore checks: at the
# next forward it raises "Expected to have finished reduction in the prior iteration", unless it was built with
# `find_unused_parameters=True` (which searches the graph for such parameters after every forward, at a cost).
# `wait()` above checks the same and raises, naming the parameters; section 2's launch tried it with a model that
# has an extra, unused linear layer (below).

# %% [markdown] lang="zh" en="5c430107f9bd"
# 一个桶要等它的*所有*梯度都到齐才会发送。不参与损失计算的参数（只在评估时使用的输出头、这一步跳过的分支）永远得不到
# 梯度，所以它所在的桶永远装不满，也永远不会发送。如果另一个 rank 发送了这个桶，那个 rank 就会一直等待一个永远不会到
# 来的对方。所以 DDP 会做检查：在下一次前向传播时抛出“Expected to have finished reduction in the prior iteration”，
# 除非构造时设置了 `find_unused_parameters=True`（它会在每次前向传播之后搜索计算图来找出这类参数，这是有代价的）。上
# 面的 `wait()` 做了同样的检查并抛出异常，同时列出这些参数的名字；第 2 节的启动用一个多出一个未使用线性层的模型试过
# 这一点（见下文）。

# %% [markdown]
# **Predict, then run (11.allreduce-count).** How many all-reduce calls per step does each version make on our
# model: naive (step 1), bucketed with 0.25 MiB buckets (step 3), and torch DDP with its defaults (it starts with a
# 1 MiB first bucket and 25 MiB for the others)?

# %% [markdown] lang="zh" en="ef2bb3526126"
# **先预测，再运行（11.allreduce-count）。** 在我们的模型上，每个版本每一步调用多少次全归约：朴素版本（第 1 步）、使
# 用 0.25 MiB 桶的分桶版本（第 3 步），以及使用默认设置的 torch DDP（它的第一个桶为 1 MiB，其余的桶为 25 MiB）？

# %%
print(PREDICT_SETUP)
prediction = ...   # a dict: {"naive": ..., "bucketed": ..., "ddp": ...}
### BEGIN SOLUTION
prediction = {"naive": 8, "bucketed": 3, "ddp": 1}
### END SOLUTION
predict("11.allreduce-count", prediction)

# %% [markdown]
# Now the launch that runs everything in this notebook: the three DDP versions and torch DDP, ZeRO-1 by hand and
# DeepSpeed stage 1, the tensor-parallel MLP, GPipe with 1 to 8 micro-batches and `torch.distributed.pipelining`,
# FSDP2 and DeepSpeed stage 3. Each section below reads its part of the result.
#
# Collectives are counted by `torch.profiler`, which records every one that torch issues (torch DDP's internal
# bucket all-reduces included), with its size; "during backward" counts those *started* before `backward()`
# returned.

# %% [markdown] lang="zh" en="fd4651cbaf9f"
# 下面就是运行本 notebook 全部内容的那次启动：三个 DDP 版本和 torch DDP，亲手实现的 ZeRO-1 和 DeepSpeed stage 1，张
# 量并行 MLP，1 到 8 个微批次的 GPipe 和 `torch.distributed.pipelining`，FSDP2 和 DeepSpeed stage 3。后面每一节读取
# 结果中属于自己的那一部分。
#
# 集合通信由 `torch.profiler` 统计，它记录 torch 发出的每一次集合通信操作（包括 torch DDP 内部对桶的全归约）及其大
# 小；“during backward”（反向传播期间）统计的是在 `backward()` 返回之前*启动*的那些。

# %%
res = launch("labkit.recipes.handpar", nproc=2, timeout=600, stream=False, args=["--device", "cpu"])
print(f"{res['world_size']} ranks, backend {res['backend']}; ran {', '.join(res['timings_s'])}")
ddp = res["ddp"]
print(f"{'version':<10}{'all-reduces/step':>18}{'during backward':>17}{'bytes/step':>12}")
for name in ("naive", "overlap", "bucketed", "ddp"):
    c = ddp["collectives"][name]
    print(f"{name:<10}{c['all_reduce']['calls']:>18}{c['issued_in_backward']:>17}{4 * c['all_reduce']['elements']:>12,}")
calls = {k: ddp["collectives"][k]["all_reduce"]["calls"] for k in ("naive", "overlap", "bucketed", "ddp")}
verdict = reveal("11.allreduce-count", calls)

# %%
cs = ddp["collectives"]
assert all(cs[k]["all_reduce"]["elements"] == n_params for k in cs)  # the same data, in fewer messages
assert cs["naive"]["issued_in_backward"] == 0 and cs["overlap"]["issued_in_backward"] == 8
assert ddp["bucket_layout"] == [[7, 6, 5, 4], [3, 2], [1, 0]] and calls["bucketed"] == 3 and calls["ddp"] == 1

# %% [markdown]
# ### Bit for bit equal to torch DDP, and why
#
# For 3 training steps (AdamW in between) every version's gradients were compared with torch DDP's on both ranks,
# with `torch.equal`:

# %% [markdown] lang="zh" en="8326e8e01597"
# ### 与 torch DDP 逐位相等，以及原因
#
# 在 3 个训练步中（中间穿插 AdamW 更新），每个版本的梯度都在两个 rank 上用 `torch.equal` 与 torch DDP 的梯度做了比
# 较：

# %%
start = ddp["start_digests"]
print("each rank initialised its models with its own seed; before step 0 they differed from rank 0's:",
      ddp["differed_before_step0"])
print("after step 0, every version's weights identical on both ranks:", start[0] == start[1])
for rank, flags in enumerate(ddp["bitwise_grads_vs_ddp"]):
    print(f"rank {rank}: gradients bitwise equal to torch DDP at every step: {flags}")
print("weights after 3 steps bitwise equal:", ddp["bitwise_params_vs_ddp"][0])
assert ddp["differed_before_step0"] == [False, True] and start[0] == start[1]  # step 0 made rank 1 rank 0's
print("a model with an unused layer, bucketed by hand:", ddp["unused_param_error"][0].split(";")[0])
assert all("unused.weight" in e and "unused.bias" in e for e in ddp["unused_param_error"])
assert all(all(f.values()) for f in ddp["bitwise_grads_vs_ddp"] + ddp["bitwise_params_vs_ddp"])

# %% [markdown]
# Same bits, not just close. DDP (without a communication hook) multiplies each gradient by 1/world while it copies
# it into its bucket, then sums the buckets with all-reduce; our three versions do the same. With **2 ranks** that
# would not even matter, for three reasons that the next cell checks on 100,000 random numbers: multiplying by 0.5
# is exact (a power of two only changes the exponent), so dividing before or after the sum gives the same bits; x·0.5
# is x/2; and a sum of two numbers does not depend on the order. With **3 ranks** none of that holds: 1/3 is
# rounded in fp32, so x·fl(1/3) and x/3 differ in the last bit for some x, and (a + b) + c is not a + (b + c). A
# ring all-reduce sums each element in an order set by its *position* in the flat buffer, so the bucket layout
# decides the rounding. Bitwise equality with DDP at 3 ranks needs DDP's exact recipe: scale by fl(1/3) before the
# sum, and the same bucket layout (DDP rebuilds its buckets after the first step in the order gradients arrive,
# which is what `bucket_layout` does). `tests/test_handpar.py` checks all of this on 3 ranks.

# %% [markdown] lang="zh" en="27a8f787f92f"
# 比特完全相同，而不只是接近。DDP（不使用通信钩子时）在把每个梯度复制进桶的同时乘以 1/world，然后用全归约对桶求和；
# 我们的三个版本也是这样做的。在 **2 个 rank** 时，这一点甚至无关紧要，原因有三，下一个单元格会在 100,000 个随机数上
# 验证：乘以 0.5 是精确的（2 的幂只改变指数），所以在求和之前还是之后做除法，得到的比特相同；x·0.5 就是 x/2；两个数
# 的和与相加顺序无关。在 **3 个 rank** 时，这些都不再成立：1/3 在 fp32 中要舍入，所以对某些 x，x·fl(1/3) 和 x/3 在最
# 后一位上不同，而且 (a + b) + c 不等于 a + (b + c)。环形全归约对每个元素求和的顺序由它在扁平缓冲区中的*位置*决定，
# 所以桶的布局决定了舍入结果。要在 3 个 rank 时与 DDP 逐位相等，就需要 DDP 的确切做法：在求和之前乘以 fl(1/3)，并使
# 用相同的桶布局（DDP 在第一步之后按梯度到达的顺序重建桶，`bucket_layout` 做的正是这件事）。`tests/test_handpar.py`
# 在 3 个 rank 上检查了所有这些。

# %%
g = torch.Generator().manual_seed(0)
a, b, c = torch.randn(3, 100_000, generator=g).unbind()
print("x * 0.5 == x / 2 everywhere:          ", torch.equal(a * 0.5, a / 2))
print("x * fl(1/3) == x / 3 everywhere:      ", torch.equal(a * (1 / 3), a / 3))
print("a + b == b + a everywhere:            ", torch.equal(a + b, b + a))
print("(a + b) + c == a + (b + c) everywhere:", torch.equal((a + b) + c, a + (b + c)))
assert torch.equal(a * 0.5, a / 2) and not torch.equal(a * (1 / 3), a / 3) and not torch.equal((a + b) + c, a + (b + c))

# %% [markdown]
# ### What overlap and buckets buy
#
# One step (forward, backward, gradient sync) of each version, timed in turn, interleaved, after a barrier; the
# median of each rank, then the slower rank:

# %% [markdown] lang="zh" en="18f40b3010eb"
# ### 重叠和分桶带来了什么
#
# 对每个版本的一步（前向、反向、梯度同步）依次计时，各版本交替进行，计时前先做一次屏障同步；先取每个 rank 的中位数，
# 再取较慢的那个 rank：

# %%
# NBVAL_IGNORE_OUTPUT
t = ddp["step_s"]
for name in ("naive", "overlap", "bucketed", "ddp"):
    print(f"{name:<9} {1e3 * t[name]:6.2f} ms/step   {t['naive'] / t[name]:4.2f}x the speed of naive")
print(f"here, overlapping made a step {t['naive'] / t['overlap']:.2f}x as fast as all-reducing after backward; "
      f"torch DDP ran at {t['naive'] / t['ddp']:.2f}x")

# %% [markdown]
# Read the line above with the machine in mind. With gloo, an asynchronous all-reduce runs on gloo's own threads,
# so it can proceed while the main thread computes the earlier layers' gradients, if there is a free core for it.
# On a GPU, NCCL runs on its own CUDA stream, and overlap hides communication behind the backward kernels. Buckets
# matter most where α is large compared with the time a bucket takes to send.
#
# ## 3. ZeRO-1: a sharded optimizer, by hand
#
# In DDP every rank keeps AdamW's two moments for every parameter (8 bytes per parameter in fp32) and updates all
# of them, identically: wasted replication. ZeRO stage 1 keeps them once, spread over the ranks:
#
# 1. flatten the parameters into one vector and pad it with zeros to a multiple of 2 × world size (as DeepSpeed
#    does), so it splits into equal slices; rank r **owns** slice r;
# 2. after backward, **reduce-scatter** the gradients: each rank receives the sum of everyone's gradients *for its
#    slice* (scaled by 1/world, as in DDP);
# 3. step AdamW on the slice;
# 4. **all-gather** the updated slices, so every rank has the whole new model for the next forward.
#
# AdamW works element by element, so stepping it on slices gives exactly the arithmetic of stepping it on the
# whole model: the weights must come out bit for bit the same.
#
# **Exercise 11.zero1-step.** Write `zero1_step(flat_param, flat_grad, shard, optimizer)`: `flat_param` holds every
# parameter (flattened and padded, the same on every rank) and must be overwritten with the updated parameters;
# `flat_grad` is this rank's gradient in the same layout; `shard` is this rank's slice of the parameters (a leaf
# tensor), the only tensor `optimizer` updates. `dist.reduce_scatter_single(out, inp)` and
# `dist.all_gather_single(out, inp)` are the two collectives. The check trains 3 steps and compares the
# weights with AdamW on the whole model.

# %% [markdown] lang="zh" en="7e1f55947f67"
# 读上面那一行时，要结合机器的情况。使用 gloo 时，异步全归约在 gloo 自己的线程上运行，所以在主线程计算前面各层梯度的
# 同时它也能推进，前提是有空闲的核心给它用。在 GPU 上，NCCL 在自己的 CUDA 流上运行，重叠可以把通信隐藏在反向传播的内
# 核后面。当 α 相对于发送一个桶所需的时间较大时，分桶的作用最大。
#
# ## 3. ZeRO-1：亲手实现分片优化器
#
# 在 DDP 中，每个 rank 都为每个参数保存 AdamW 的两个动量（fp32 下每参数 8 字节），并且全部更新一遍，各 rank 的结果完
# 全相同：这是白白浪费的冗余。ZeRO stage 1 只保存一份，分散在各个 rank 上：
#
# 1. 把参数展平成一个向量，并用 0 填充到 2 × 进程总数（world size）的整数倍（DeepSpeed 也是这样做的），使它能切成相
#    等的切片；rank r **拥有**第 r 片；
# 2. 反向传播之后，对梯度做**归约分散**：每个 rank 收到所有人的梯度*在它那一片上*的和（像 DDP 一样乘以 1/world）；
# 3. 在这一片上执行 AdamW 更新；
# 4. 对更新后的切片做**全收集**，这样每个 rank 都拥有完整的新模型，用于下一次前向传播。
#
# AdamW 逐元素地计算，所以在切片上执行更新，与在整个模型上执行更新的算术完全相同：权重必须逐位一致。
#
# **练习 11.zero1-step。** 写出 `zero1_step(flat_param, flat_grad, shard, optimizer)`：`flat_param` 持有所有参数（已
# 展平并填充，每个 rank 上都一样），必须用更新后的参数覆盖它；`flat_grad` 是本 rank 的梯度，布局相同；`shard` 是本
# rank 的那一片参数（一个叶子张量），也是 `optimizer` 唯一更新的张量。`dist.reduce_scatter_single(out, inp)` 和
# `dist.all_gather_single(out, inp)` 就是要用到的两个集合通信操作。检查程序训练 3 步，并把权重与在整个模型上运行的
# AdamW 进行比较。

# %%
import torch
import torch.distributed as dist


def zero1_step(flat_param, flat_grad, shard, optimizer):
    """Reduce-scatter the averaged gradients, step this rank's slice, all-gather the new parameters."""
    ...
    ### BEGIN SOLUTION
    world = dist.get_world_size()
    grad_shard = torch.empty_like(shard)
    dist.reduce_scatter_single(grad_shard, flat_grad.mul(1.0 / world))
    shard.grad = grad_shard
    optimizer.step()
    dist.all_gather_single(flat_param, shard.detach())
    ### END SOLUTION


check("11.zero1-step", zero1_step)

# %% [markdown]
# labkit's sharded AdamW, which calls such a step function (its own `handpar.zero1_step` by default). ZeRO exists
# to save memory, so the by-hand version must not spend it: each parameter becomes a view into one flat buffer and
# each gradient a view into a flat gradient (backward accumulates straight into it), the slice a rank updates is its
# part of the flat buffer, and the all-gather writes straight into the flat buffer, which *is* the parameters. No
# tensor is held twice. (PyTorch ships the same idea as `torch.distributed.optim.ZeroRedundancyOptimizer`, which
# shards the states of any optimizer per parameter tensor; DeepSpeed stage 1 shards one flat vector, like ours.)

# %% [markdown] lang="zh" en="98accdacbd99"
# 下面是 labkit 的分片 AdamW，它调用的就是这样一个更新函数（默认是它自己的 `handpar.zero1_step`）。ZeRO 的存在是为了
# 节省显存，所以亲手实现的版本不能反而多花显存：每个参数都成为一个扁平缓冲区的视图，每个梯度都成为一个扁平梯度的视图
# （反向传播直接累加到其中），一个 rank 更新的切片就是它在扁平缓冲区中的那一部分，而全收集直接写入扁平缓冲区，扁平缓
# 冲区*就是*参数本身。没有任何张量被保存两次。（PyTorch 以 `torch.distributed.optim.ZeroRedundancyOptimizer` 提供了
# 同样的思路，它按参数张量对任意优化器的状态分片；DeepSpeed stage 1 则像我们一样对一个扁平向量分片。）

# %% tags=["workspace-clear"]
print(inspect.getsource(handpar.zero1_step))
print(inspect.getsource(handpar.ShardedAdamW.__init__))

# %% [markdown]
# The launch trained it for 5 steps next to AdamW on the whole model (each rank all-reducing its gradients as in
# step 1) and next to DeepSpeed ZeRO stage 1 (fp32, torch's AdamW, same data):

# %% [markdown] lang="zh" en="9873ebd278e2"
# 启动时把它训练了 5 步，同时并排运行在整个模型上的 AdamW（每个 rank 像第 1 步那样对梯度做全归约）和 DeepSpeed ZeRO
# stage 1（fp32、torch 的 AdamW、相同的数据）：

# %%
z, zds = res["zero1"], res["zero1"]["deepspeed"]
print("weights after", z["steps"], "steps bitwise equal to unsharded AdamW, per rank:", z["bitwise_vs_adamw"])
print("DeepSpeed ZeRO-1's weights bitwise equal to ours:", zds["bitwise_vs_hand"], "| its losses equal ours:",
      zds["losses"] == z["losses"])
print(f"{z['n_params']:,} parameters padded to {z['padded']:,}: each rank owns {z['part']:,}; "
      f"AdamW state shapes on each rank: {z['state_shapes'][0]}")
assert all(z["bitwise_vs_adamw"]) and z["ranks_identical"] and z["losses"] == z["reference_losses"]
assert zds["bitwise_vs_hand"] and zds["losses"] == z["losses"]

# %% [markdown]
# Now the bytes. Three independent numbers per rank: what our sharded AdamW holds (the storages of `exp_avg` and
# `exp_avg_sq`), what `labkit.memory` predicts for ZeRO stage 1 (notebook 06's model, with DeepSpeed's padding),
# and what DeepSpeed stage 1 really holds (counted from its optimizer's tensors by `labkit.zero.count_model_states`,
# notebook 10):

# %% [markdown] lang="zh" en="8f4832176071"
# 现在看字节数。每个 rank 有三个相互独立的数字：我们的分片 AdamW 持有多少（`exp_avg` 和 `exp_avg_sq` 的存储），
# `labkit.memory` 对 ZeRO stage 1 的预测（notebook 06 的模型，加上 DeepSpeed 的填充），以及 DeepSpeed stage 1 实际持
# 有多少（由 `labkit.zero.count_model_states` 从它的优化器张量统计得出，见 notebook 10）：

# %%
pred1 = memory.model_state_bytes(z["n_params"], "fp32", "adamw", stage=1, world_size=2).device["optimizer"]
pred0 = memory.model_state_bytes(z["n_params"], "fp32", "adamw", stage=0, world_size=2).device["optimizer"]
ds1 = [b["optimizer"] for b in zds["bytes"]]
print(f"{'':14}{'rank 0':>10}{'rank 1':>10}")
print(f"{'by hand':<14}{z['state_bytes'][0]:>10,}{z['state_bytes'][1]:>10,}")
print(f"{'labkit.memory':<14}{pred1:>10,}{pred1:>10,}")
print(f"{'DeepSpeed':<14}{ds1[0]:>10,}{ds1[1]:>10,}")
print(f"unsharded AdamW would hold {pred0:,} bytes per rank")
assert z["state_bytes"] == [pred1, pred1] == ds1 and pred1 == 8 * z["part"] and 2 * pred1 == pred0 + 8 * (z["padded"] - z["n_params"])

# %% [markdown]
# The states are what ZeRO-1 shards, but what a rank must fit is everything it holds for the model. Totals per
# rank, counted from the tensors' storages at the end of the run (fp32 here, so there is no separate master copy:
# the shard *is* the parameters' slice):

# %% [markdown] lang="zh" en="4b2966a43a64"
# ZeRO-1 分片的是优化器状态，但一个 rank 必须放得下的，是它为模型持有的全部内容。下面是每个 rank 的总量，在运行结束
# 时从张量的存储统计得出（这里是 fp32，所以没有单独的主权重副本：分片*就是*参数的那一片）：

# %%
mine, full = z["memory_bytes"][0], z["adamw_memory_bytes"]
print(f"{'':18}{'params':>10}{'grads':>10}{'states':>11}{'total':>11}")
for name, m in (("AdamW, replicated", full), ("ZeRO-1 by hand", mine)):
    print(f"{name:<18}{m['params']:>10,}{m['grads']:>10,}{m['states']:>11,}{m['total']:>11,}")
print(f"ZeRO-1 by hand holds {mine['total'] / full['total']:.2f} of replicated AdamW's bytes on each of 2 ranks; "
      f"the parameters live in the flat buffer: {z['params_in_flat']}")
assert z["params_in_flat"] and z["memory_bytes"][0] == z["memory_bytes"][1]
pred_total = memory.model_state_bytes(z["n_params"], "fp32", "adamw", stage=1, world_size=2).device_total
assert mine["states"] == pred1 and mine["total"] < full["total"]
assert abs(mine["total"] - pred_total) <= 16 * (z["padded"] - z["n_params"])  # labkit.memory, but for the padding

# %% [markdown]
# **Gradient clipping when the gradients are sharded.** `clip_grad_norm_` scales every gradient by
# max_norm / ‖g‖ when the norm of the *whole* gradient exceeds max_norm. After the reduce-scatter no rank holds the
# whole gradient, and clipping each shard by its own norm would give each rank a different factor: wrong, and the
# ranks would no longer apply one consistent update. The norm of the whole vector is the square root of the sum of
# the shards' sums of squares, so one all-reduce of a single number per rank is enough. DeepSpeed and FSDP do this;
# so does `zero1_step(..., max_norm=...)` here:

# %% [markdown] lang="zh" en="4b09a2606a52"
# **梯度分片时的梯度裁剪。** 当*整个*梯度的范数超过 max_norm 时，`clip_grad_norm_` 把每个梯度乘以 max_norm / ‖g‖。归约
# 分散之后，没有哪个 rank 持有整个梯度；如果每个分片按自己的范数裁剪，各个 rank 会得到不同的缩放系数：这是错的，而且
# 各 rank 施加的将不再是同一个一致的更新。整个向量的范数等于各分片平方和之和的平方根，所以每个 rank 只需对一个数做一
# 次全归约就够了。DeepSpeed 和 FSDP 就是这样做的；这里的 `zero1_step(..., max_norm=...)` 也是：

# %%
print(inspect.getsource(handpar.clip_sharded_grad_norm_))

# %% [markdown]
# The launch trained ZeRO-1 by hand with `max_norm` = 0.05 next to replicated AdamW with `clip_grad_norm_`:

# %% [markdown] lang="zh" en="7057d90a2b08"
# 启动时用 `max_norm` = 0.05 训练了亲手实现的 ZeRO-1，同时并排运行使用 `clip_grad_norm_` 的复制式（不分片的）AdamW：

# %%
c = z["clip"]
clipped = min(c["norms"]) > c["max_norm"]
same_norms = all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(c["norms"], c["reference_norms"]))
print(f"{len(c['norms'])} steps; the gradient norm exceeded {c['max_norm']} at every step (so every step clipped): "
      f"{clipped}")
print("global norm from the shards = clip_grad_norm_'s on the whole gradient (to 1e-5):", same_norms)
at_max = all(math.isclose(a, c["max_norm"], rel_tol=1e-4) for a in c["norms_after"])
print(f"the gradients the optimizer stepped with had global norm {c['max_norm']} (to 1e-4):", at_max)
print("weights equal unsharded clipping (to 1e-5, relative):", c["rel_vs_adamw"] < 1e-5)
assert clipped and same_norms and at_max and c["rel_vs_adamw"] < 1e-5

# %% [markdown]
# The communication of one step, as the profiler saw it on rank 0 (elements per call):

# %% [markdown] lang="zh" en="316e1ad2cbe3"
# 一步的通信，即性能分析器在 rank 0 上看到的情况（每次调用的元素数）：

# %%
for name, c in z["collectives"].items():
    print(f"by hand    {name:<11} {c['calls']} call(s), sizes {c['sizes']}")
for name, c in zds["collectives"].items():
    print(f"DeepSpeed  {name:<11} {c['calls']} call(s), sizes {c['sizes']}")
rs = z["collectives"].get("reduce_scatter") or z["collectives"]["all_reduce"]  # NCCL's name, or gloo's emulation
assert z["collectives"]["all_gather"]["sizes"] == [z["part"]] and rs["sizes"] in ([z["padded"]], [z["part"]])
assert sum(zds["collectives"]["all_reduce"]["sizes"]) == z["n_params"] + 1  # every gradient, plus one element

# %% [markdown]
# Two things to read here. Our `reduce_scatter_single` shows up as an **all-reduce of the whole padded vector**:
# gloo has no reduce-scatter, and torch emulates it with an all-reduce, then keeps the slice. On NCCL it is a real
# reduce-scatter, which sends half the bytes of an all-reduce: ZeRO-1 then costs reduce-scatter (Ψ) + all-gather
# (Ψ) = 2Ψ per step, the same as DDP's all-reduce (2Ψ as reduce-scatter + all-gather inside the ring). The
# all-gather's input is this rank's slice; the whole gathered vector is world × that. DeepSpeed stage 1 does it its
# own way, on NCCL too: after backward (with `overlap_comm` off, as here) it goes through the parameters in order and
# sums their gradients in buckets of `reduce_bucket_size` (65,536 elements here) with **all-reduces**, each rank then
# keeping its slice (`use_multi_rank_bucket_allreduce`, on by default: twice the bytes of a reduce-scatter, in fewer
# calls; off, each slice is reduced to its owner). The sizes add up to the 148,481 unpadded gradients plus one
# all-reduce of a single element, as the cell asserts; then one all-gather of the slices.
#
# ## 4. Tensor parallelism: a Megatron MLP on 2 ranks
#
# **Stretch.**
#
# **Two ways to split one model, and their names.** Seed 004 §6.2 calls *model parallelism* placing different layers
# or modules of a model on different devices, and §6.3 calls *pipeline parallelism* cutting the model into stages
# that work on different mini-batches at the same time. Both describe one split: whole layers per device, with
# activations passed from one device to the next. This notebook calls it **pipeline parallelism** (section 5), and
# §6.3's batches in flight together (GPipe's micro-batches) are what keep its stages busy at once. **Tensor parallelism**, this section, splits
# *each* layer instead: every rank holds a slice of every weight matrix and the ranks combine partial results inside
# the layer. The literature uses "model parallelism" for either split, or for both (Megatron-LM's paper calls its
# tensor split model parallelism), so read which one a text means. The launch's results below show what a rank
# held: half of every matrix of the block, against the shapes of the whole layers (`torch.nn.Linear`); section 5's
# first results cell checks that a pipeline stage holds whole layers.
#
# A transformer's MLP is Y = GELU(X A) B, with A of d × 4d and B of 4d × d. Megatron splits it so that a
# whole block needs one all-reduce forward and one backward:
#
# - **column-parallel A** = [A₁ A₂]: rank r computes H_r = GELU(X A_r), its half of the hidden units. GELU acts
#   element by element, so no communication is needed between the two layers;
# - **row-parallel B** = [B₁; B₂]: rank r computes H_r B_r, a *partial* sum of Y. Y = H₁B₁ + H₂B₂ takes one
#   all-reduce (the operator **g**), and the bias of B is added once, after it;
# - backward mirrors it: the gradient of X is the sum of both ranks' contributions (each used its own A_r), so
#   the operator **f** in front of the block is the identity forward and an all-reduce backward, and g is the
#   identity backward.
#
# **Exercise 11.tp-conjugates.** Write f and g as `torch.autograd.Function` classes, `CopyToTP` and `ReduceFromTP`
# (each with `@staticmethod forward(ctx, x)` and `backward(ctx, grad)`). `dist.all_reduce` works in place: clone
# first. The check builds the 2-way MLP with them and compares its output and *every* gradient, the input's too,
# with the single-process MLP.

# %% [markdown] lang="zh" en="145293248692"
# 这里有两点值得注意。我们的 `reduce_scatter_single` 显示为**对整个填充后向量的全归约**：gloo 没有归约分散，torch 用
# 一次全归约来模拟它，然后只保留那一片。在 NCCL 上它是真正的归约分散，发送的字节数是全归约的一半：这时 ZeRO-1 每一步
# 的代价是归约分散（Ψ）+ 全收集（Ψ）= 2Ψ，与 DDP 的全归约相同（在环上，全归约就是归约分散 + 全收集，共 2Ψ）。全收集
# 的输入是本 rank 的切片；收集后的整个向量是它的 world 倍。DeepSpeed stage 1 有自己的做法，在 NCCL 上也是如此：反向
# 传播之后（`overlap_comm` 关闭，如这里），它按顺序遍历参数，以 `reduce_bucket_size`（这里是 65,536 个元素）为桶大
# 小，用**全归约**对它们的梯度求和，然后每个 rank 保留自己的那一片（`use_multi_rank_bucket_allreduce`，默认开启：字
# 节数是归约分散的两倍，但调用次数更少；关闭时，每一片都被归约到它的拥有者）。这些大小加起来是 148,481 个未填充的梯
# 度，再加上一次只有一个元素的全归约，正如单元格所断言的；然后是一次对各切片的全收集。
#
# ## 4. 张量并行：2 个 rank 上的 Megatron MLP
#
# **进阶。**
#
# **切分一个模型的两种方式，以及它们的名称。** Seed 004 §6.2 所说的*模型并行*，是把模型的不同层或模块放到不同设备
# 上；§6.3 所说的*流水线并行*，是把模型切成若干阶段，让它们同时处理不同的小批次。两者描述的其实是同一种切分：每个设
# 备放若干整层，激活值从一个设备传到下一个设备。本 notebook 把它称为**流水线并行**（第 5 节），而 §6.3 中同时在处理
# 中的多个批次（GPipe 的微批次）正是让各阶段同时忙碌起来的原因。**张量并行**（本节）则切分*每一*层：每个 rank 持有每
# 个权重矩阵的一片，各 rank 在层内合并部分结果。文献中的“模型并行”既可以指其中一种切分，也可以指两种（Megatron-LM 的
# 论文就把它的张量切分称为模型并行），所以要看清一篇文章指的是哪一种。下面的启动结果显示了一个 rank 持有的内容：块中
# 每个矩阵的一半，并与完整层（`torch.nn.Linear`）的形状对照；第 5 节的第一个结果单元格则检查一个流水线阶段持有的是整
# 层。
#
# Transformer 的 MLP 是 Y = GELU(X A) B，其中 A 为 d × 4d，B 为 4d × d。Megatron 这样切分它，使整个块在前向只需一次
# 全归约、在反向也只需一次全归约：
#
# - **列并行的 A** = [A₁ A₂]：rank r 计算 H_r = GELU(X A_r)，即它那一半隐藏单元。GELU 逐元素作用，所以两层之间不需要
#   任何通信；
# - **行并行的 B** = [B₁; B₂]：rank r 计算 H_r B_r，这是 Y 的一个*部分*和。Y = H₁B₁ + H₂B₂ 需要一次全归约（算子
#   **g**），B 的偏置在它之后只加一次；
# - 反向传播与之对称：X 的梯度是两个 rank 的贡献之和（每个 rank 用的是自己的 A_r），所以块前面的算子 **f** 在前向是
#   恒等映射、在反向是全归约，而 g 在反向是恒等映射。
#
# **练习 11.tp-conjugates。** 把 f 和 g 写成 `torch.autograd.Function` 类，即 `CopyToTP` 和 `ReduceFromTP`（各自带有
# `@staticmethod forward(ctx, x)` 和 `backward(ctx, grad)`）。`dist.all_reduce` 是原地操作：要先 clone。检查程序用它
# 们搭建 2 路 MLP，并把它的输出和*每一个*梯度（包括输入的梯度）与单进程 MLP 的结果比较。

# %%
import torch
import torch.distributed as dist


class CopyToTP(torch.autograd.Function):
    """f: the identity forward; all-reduce the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        ...
        ### BEGIN SOLUTION
        return x
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ...
        ### BEGIN SOLUTION
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad
        ### END SOLUTION


class ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward (sum the partial outputs); the identity backward."""

    @staticmethod
    def forward(ctx, x):
        ...
        ### BEGIN SOLUTION
        x = x.clone()
        dist.all_reduce(x)
        return x
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ...
        ### BEGIN SOLUTION
        return grad
        ### END SOLUTION


check("11.tp-conjugates", (CopyToTP, ReduceFromTP))

# %% [markdown]
# labkit's version of the block (its `CopyToTP` and `ReduceFromTP` are the ones above):

# %% [markdown] lang="zh" en="57c6c0fb8077"
# labkit 版本的块（它的 `CopyToTP` 和 `ReduceFromTP` 就是上面那两个）：

# %%
print(inspect.getsource(handpar.TensorParallelMLP))

# %% [markdown]
# The launch ran it with d = 128 (hidden 512) on 256 tokens, next to the single-process MLP on every rank:

# %% [markdown] lang="zh" en="ecd6c3bdcba5"
# 启动时以 d = 128（隐藏层 512）在 256 个 token 上运行了它，并在每个 rank 上并排运行单进程 MLP：

# %%
tp = res["tp"]
for rank, r in enumerate(tp["ranks"]):
    close = {k: v < 1e-5 for k, v in r["rel"].items()}
    print(f"rank {rank} holds w1 {r['held']['w1']}, w2 {r['held']['w2']}, b2 {r['held']['b2']}; "
          f"equal to one process within 1e-5 (relative): {close}")
assert all(v < 1e-5 for r in tp["ranks"] for v in r["rel"].values())
fc1, fc2 = torch.nn.Linear(tp["d_model"], tp["hidden"]), torch.nn.Linear(tp["hidden"], tp["d_model"])  # one process
assert all(r["held"]["w1"] == [fc1.weight.shape[0] // 2, fc1.weight.shape[1]] and
           r["held"]["w2"] == [fc2.weight.shape[0], fc2.weight.shape[1] // 2] for r in tp["ranks"])  # half of each

# %% [markdown]
# Not bitwise this time: Y is now summed in two halves and then added, a different order than one matmul.
# Communication per step, measured and from the formula (tokens × d elements each way, fp32):

# %% [markdown] lang="zh" en="4687fb27f537"
# 这次不是逐位相等：Y 现在分成两半分别求和再相加，顺序与一次矩阵乘法不同。每一步的通信，实测值与公式值（每个方向
# tokens × d 个元素，fp32）：

# %%
want = handpar.tp_comm_bytes(tp["tokens"], tp["d_model"])
for rank, r in enumerate(tp["ranks"]):
    fwd, bwd = (4 * r[k]["all_reduce"]["elements"] for k in ("forward", "backward"))
    calls = (r["forward"]["all_reduce"]["calls"], r["backward"]["all_reduce"]["calls"])
    print(f"rank {rank}: all-reduces forward/backward {calls}, bytes {fwd:,} + {bwd:,}; formula "
          f"{want['forward']:,} + {want['backward']:,}")
    assert calls == (1, 1) and (fwd, bwd) == (want["forward"], want["backward"])

# %% [markdown]
# Tensor parallelism sends **activations**, inside every layer, in the critical path. In this naive form nothing
# overlaps with the all-reduce of g: the next layer needs its result. Real implementations hide part of it.
# Megatron starts f's backward all-reduce (of the input gradient) and computes the weight gradients while it runs,
# and collective matmuls split a GEMM into chunks so that each chunk's communication overlaps the next chunk's
# compute. The volume still grows with tokens × d, not with the parameter count, and whatever is not hidden waits on
# the link. That is why tensor parallelism stays inside a node, on NVLink: 2-8 GPUs.
#
# ### Sequence parallelism
#
# Around the MLP, a transformer layer also runs LayerNorm, dropout and the residual add. With tensor parallelism
# alone every rank runs them on every token and keeps all of their activations: in Megatron's accounting
# (Korthikanti et al., 2022) that is 10·s·b·h of a layer's 34·s·b·h bytes that tensor parallelism does not divide
# by t. Megatron's **sequence parallelism** splits these regions by tokens: rank r keeps tokens r·T/n to
# (r+1)·T/n. Entering the MLP, f becomes an **all-gather** of the token slices (its backward: a reduce-scatter of
# the input gradient); leaving it, g becomes a **reduce-scatter**, which hands each rank the finished sum for its
# own tokens (its backward: an all-gather). A ring all-reduce *is* a reduce-scatter followed by an all-gather, so
# the link carries the same bytes as before. The cost is elsewhere: the LayerNorm's weight and bias and fc2's bias
# are whole on every rank but each rank's copy sees only its tokens, so their gradients are partial sums that one
# more (small) all-reduce adds up. Below, labkit's entry operator and block (in the order they run). The launch ran
# the pre-norm block x + MLP(LayerNorm(x)) this way, each rank given only its 128 tokens, against the whole block in
# one process. It also measured what autograd keeps for backward on each rank (as notebook 06 does), with and
# without sequence parallelism:

# %% [markdown] lang="zh" en="c40508a96934"
# 张量并行发送的是**激活值**，发生在每一层内部，处于关键路径上。在这种朴素形式中，没有任何计算与 g 的全归约重叠：下
# 一层需要它的结果。实际的实现会把其中一部分隐藏起来。Megatron 先启动 f 的反向全归约（对输入梯度），在它运行的同时计
# 算权重梯度；集合矩阵乘法（collective matmul）则把一个 GEMM 切成若干块，让每一块的通信与下一块的计算重叠。但通信量
# 仍随 tokens × d 增长，而不是随参数量增长，没有被隐藏的部分都要在链路上等待。这就是张量并行留在节点内、走 NVLink 的
# 原因：2-8 块 GPU。
#
# ### 序列并行
#
# 在 MLP 周围，Transformer 层还要运行 LayerNorm、dropout 和残差相加。只用张量并行时，每个 rank 都在每个 token 上运行
# 它们，并保存它们的全部激活值：按照 Megatron 的统计（Korthikanti et al., 2022），一层的 34·s·b·h 字节中有 10·s·b·h
# 是张量并行无法除以 t 的。Megatron 的**序列并行**按 token 切分这些区域：rank r 保存第 r·T/n 到 (r+1)·T/n 个 token。
# 进入 MLP 时，f 变成对各 token 切片的**全收集**（它的反向：对输入梯度做归约分散）；离开 MLP 时，g 变成**归约分
# 散**，把每个 rank 自己那些 token 的最终和交给它（它的反向：全收集）。环形全归约*就是*一次归约分散加一次全收集，所
# 以链路上传输的字节数与之前相同。代价在别处：LayerNorm 的权重和偏置以及 fc2 的偏置在每个 rank 上都是完整的，但每个
# rank 的副本只看到它自己的 token，所以它们的梯度是部分和，需要再做一次（很小的）全归约把它们加起来。下面是 labkit
# 的入口算子和块（按运行顺序）。启动时以这种方式运行了 pre-norm 块 x + MLP(LayerNorm(x))，每个 rank 只拿到它自己的
# 128 个 token，并与单进程中的完整块对照。它还在有和没有序列并行两种情况下，测量了每个 rank 上 autograd 为反向传播保
# 存的内容（如同 notebook 06 的做法）：

# %%
print(inspect.getsource(handpar.GatherFromSequence))
print(inspect.getsource(handpar.SequenceParallelBlock.forward))
T, d = tp["tokens"], tp["d_model"]
for rank, r in enumerate(tp["sp"]):
    sizes = {when: {op: c["sizes"] for op, c in r[when].items()} for when in ("forward", "backward")}
    print(f"rank {rank}: holds {r['tokens_held']} of {T} tokens; the output of its tokens and all "
          f"{len(r['rel']) - 1} gradients equal one process within 1e-5: {max(r['rel'].values()) < 1e-5}")
    print(f"  collectives (elements): {sizes}")
    print(f"  saved for backward: {r['saved_sp']:,} B, against {r['saved_tp']:,} B with tensor parallelism only "
          f"({1 - r['saved_sp'] / r['saved_tp']:.1%} less)")
    assert max(r["rel"].values()) < 1e-5 and r["tokens_held"] == T // 2
    assert r["saved_tp"] - r["saved_sp"] == (T - T // 2) * (d + 2) * 4  # the norm's input and 2 statistics, fp32

# %% [markdown]
# Read the collectives with gloo in mind: it has no reduce-scatter, so torch emulates each one with an all-reduce of
# the whole tensor (the 32,768 elements) and keeps a slice. On NCCL these are real reduce-scatters of 16,384
# elements per rank, and the forward and backward each move what one all-reduce moved before. The three 128-element
# all-reduces are the partial gradients of the LayerNorm's weight and bias and of b2.
#
# The saving measured here is exactly the LayerNorm's input (and its mean and inverse deviation) for the other
# rank's tokens: small, because this block is mostly MLP, whose hidden activations tensor parallelism already
# splits, and because fc1 keeps the gathered, full-length LayerNorm output for its backward. Megatron saves that
# one in its sharded form too and all-gathers it again during backward, so every activation outside the split
# GEMMs is divided by t: leaving the attention scores aside, 34·s·b·h/t per layer instead of (10 + 24/t)·s·b·h.
#
# ## 5. Pipeline parallelism: GPipe on 2 stages
#
# **Stretch.**
# Split the model's layers into stages, one per rank: here 6 linear layers of width 1024, 3 per stage. Stage 0 sends
# its output activations to stage 1; stage 1 sends the gradient of those activations back. With the whole batch at
# once, stage 1 waits through stage 0's forward, then stage 0 waits through stage 1's forward and backward. GPipe
# cuts the batch into m **micro-batches**: stage 0 runs all m forwards, handing each micro-batch on as soon as it is
# done, so both stages work at once; then all m backwards run, last micro-batch first. Gradients accumulate over
# the micro-batches, and each micro-batch loss is divided by m, so they add up to the gradient of the mean loss
# over the whole batch.
#
# What remains idle is the **bubble**: with p stages of equal cost, each idles for p − 1 of the m + p − 1 slots of a
# step (a slot is one micro-batch's forward plus backward):
#
# $$\text{bubble} = \frac{p-1}{m+p-1}$$
#
# **Exercise 11.gpipe.** Write `gpipe_step(stage, inputs, targets, loss_fn, act_shape)` for 2 ranks: rank 0 gets its
# micro-batches in `inputs` (a list), the last rank its `targets`; `act_shape` is the shape of one micro-batch's
# activations between the stages. Use `dist.send(t, dst)` / `dist.recv(t, src)` (or `dist.isend`, which does not
# wait). Return the mean loss on the last rank, `None` elsewhere. The check compares loss and gradients with the
# whole model on the whole batch, with 4 micro-batches.

# %% [markdown] lang="zh" en="49ad61bec3c0"
# 读这些集合通信时要记住 gloo 的特点：它没有归约分散，所以 torch 用一次对整个张量（32,768 个元素）的全归约来模拟每一次归约
# 分散，然后保留一片。在 NCCL 上，它们是真正的归约分散，每个 rank 16,384 个元素，前向和反向各自传输的量与之前一次全
# 归约相同。那三个 128 元素的全归约，是 LayerNorm 的权重和偏置以及 b2 的部分梯度。
#
# 这里测得的节省，恰好是另一个 rank 那些 token 的 LayerNorm 输入（以及它的均值和标准差倒数）：量很小，一是因为这个块
# 主要是 MLP，其隐藏层激活值已经被张量并行切分了，二是因为 fc1 为它的反向传播保存的是收集后的、完整长度的 LayerNorm
# 输出。Megatron 把这一份也以分片形式保存，在反向传播时再做一次全收集，于是切分的 GEMM 之外的每个激活值都被除以 t：
# 不计注意力分数，每层是 34·s·b·h/t，而不是 (10 + 24/t)·s·b·h。
#
# ## 5. 流水线并行：2 个阶段的 GPipe
#
# **进阶。**
# 把模型的层切分成若干阶段，每个 rank 一个：这里是 6 个宽度为 1024 的线性层，每个阶段 3 层。阶段 0 把它的输出激活值
# 发给阶段 1；阶段 1 把这些激活值的梯度发回来。如果一次处理整个批次，阶段 1 要等阶段 0 的前向传播结束，然后阶段 0 又
# 要等阶段 1 的前向和反向传播结束。GPipe 把批次切成 m 个**微批次**：阶段 0 运行全部 m 次前向传播，每完成一个微批次就
# 立即把它交出去，于是两个阶段同时工作；然后运行全部 m 次反向传播，最后一个微批次最先。梯度在各微批次上累积，每个微
# 批次的损失都除以 m，所以它们加起来就是整个批次上平均损失的梯度。
#
# 剩下的空闲时间就是**气泡**：有 p 个代价相等的阶段时，每个阶段在一步的 m + p − 1 个时间槽中有 p − 1 个是空闲的（一
# 个时间槽是一个微批次的前向加反向）：
#
# $$\text{bubble} = \frac{p-1}{m+p-1}$$
#
# **练习 11.gpipe。** 为 2 个 rank 写出 `gpipe_step(stage, inputs, targets, loss_fn, act_shape)`：rank 0 在 `inputs`
# （一个列表）中得到它的微批次，最后一个 rank 得到它的 `targets`；`act_shape` 是阶段之间一个微批次激活值的形状。使用
# `dist.send(t, dst)` / `dist.recv(t, src)`（或者不等待的 `dist.isend`）。在最后一个 rank 上返回平均损失，在其他
# rank 上返回 `None`。检查程序用 4 个微批次，把损失和梯度与整个模型在整个批次上的结果比较。

# %%
import torch
import torch.distributed as dist


def gpipe_step(stage, inputs, targets, loss_fn, act_shape):
    """One GPipe step: every micro-batch forward, then every backward; return the mean loss on the last rank."""
    ...
    ### BEGIN SOLUTION
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    m = len(inputs if first else targets)
    p = next(stage.parameters())  # received activations live where the stage does, in its dtype
    ins, outs = [], []
    for i in range(m):
        if first:
            x = inputs[i]
        else:
            x = torch.empty(act_shape, dtype=p.dtype, device=p.device)
            dist.recv(x, rank - 1)
            x.requires_grad_(True)
        y = stage(x)
        if last:
            y = loss_fn(y, targets[i]) / m
        else:
            dist.send(y.detach(), rank + 1)
        ins.append(x)
        outs.append(y)
    for i in reversed(range(m)):
        if last:
            outs[i].backward()
        else:
            grad = torch.empty_like(outs[i])
            dist.recv(grad, rank + 1)
            outs[i].backward(grad)
        if not first:
            dist.send(ins[i].grad, rank - 1)
    return float(sum(float(y) for y in outs)) if last else None
    ### END SOLUTION


check("11.gpipe", gpipe_step)

# %% [markdown]
# labkit's version sends with `isend`: a stage does not wait for its message to arrive before it starts on the next
# micro-batch (with gloo, a blocking `send` of a large tensor can wait for the receiver, and then the stages take
# turns instead of working at once):

# %% [markdown] lang="zh" en="3e41ad49fe99"
# labkit 的版本用 `isend` 发送：一个阶段不必等消息送达，就开始处理下一个微批次（使用 gloo 时，阻塞式 `send` 发送大张
# 量时可能要等待接收方，这样各阶段就会轮流工作，而不是同时工作）：

# %% tags=["workspace-clear"]
print(inspect.getsource(handpar.gpipe_step))

# %% [markdown]
# The launch ran it with 1, 2, 4 and 8 micro-batches (batch 256), next to the whole model on the whole batch. Loss
# and gradients agree to fp32 rounding for every m, and the bytes between the stages do not depend on m: m
# micro-batches of 256/m rows each way.
# The cell also cuts section 1's MLP into two stages the pipeline way (seed 004 §6.2's "model parallelism"): no
# parameter sits on both stages, unlike section 4's split of every matrix; what passes from stage 0 to stage 1 is a
# batch of activations (8 rows × 256 here), and the two stages in a row compute exactly what the whole model does.

# %% [markdown] lang="zh" en="2efaa86de19a"
# 启动时用 1、2、4 和 8 个微批次（批大小 256）运行了它，并与整个模型在整个批次上的结果并排对照。对每个 m，损失和梯度
# 都在 fp32 舍入误差范围内一致，而且阶段之间的字节数与 m 无关：每个方向都是 m 个各 256/m 行的微批次。
# 这个单元格还按流水线的方式把第 1 节的 MLP 切成两个阶段（即 seed 004 §6.2 所说的“模型并行”）：没有哪个参数同时位于
# 两个阶段，这与第 4 节切分每个矩阵的做法不同；从阶段 0 传到阶段 1 的是一批激活值（这里是 8 行 × 256），而两个阶段依
# 次计算的结果与整个模型完全相同。

# %%
pp = res["pp"]
want = handpar.pipeline_p2p_bytes(pp["batch"], pp["width"])
for m, r in pp["runs"].items():
    sent = [4 * sum(c["elements"] for k, c in p2p.items() if k == "send") for p2p in r["p2p"]]
    same = r["loss_rel"] < 1e-5 and max(r["grad_rel"]) < 1e-5
    print(f"m = {m}: loss and gradients equal one process (1e-5): {same}; bytes sent by stage 0 / stage 1: "
          f"{sent[0]:,} / {sent[1]:,} (formula {want['forward']:,} / {want['backward']:,})")
    assert same and sent == [want["forward"], want["backward"]]
stages, xb = [mlp.net[:4], mlp.net[4:]], torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
h = stages[0](xb)  # section 1's MLP cut in two: what stage 0 would send to stage 1
shared = {id(p) for p in stages[0].parameters()} & {id(p) for p in stages[1].parameters()}
assert not shared and h.shape == (8, 256) and torch.equal(stages[1](h), mlp(xb))  # activations cross, not weights

# %% [markdown]
# The bubble, measured: hooks around each stage module record when its forward and backward run (instrumentation
# outside the schedule). A rank's idle share is the part of the step (first start to last end, over both ranks) in
# which that rank computed nothing; the bubble is the mean of the two ranks' idle shares, which is what the formula
# counts. The formula assumes free communication and stages of equal cost. Our real stages are not that: the two
# ranks share this machine's cores, so a stage can wait for a core as well as for the other stage. So the launch
# measured the schedule twice: with the real stages, and with stages whose work has a **fixed cost** that needs no
# core (a narrow layer, then a wait of 160 ms forward and 320 ms backward per whole batch, split over the
# micro-batches by rows; a stand-in for a GPU that runs the kernels while the CPU waits). A busy machine can only
# add idle time, so each fixed-cost bubble is the smaller of two timed steps.

# %% [markdown] lang="zh" en="512ee6951056"
# 实测气泡：在每个阶段模块周围挂上钩子，记录其前向和反向何时运行（这是调度之外的插桩）。一个 rank 的空闲占比，是该
# rank 在一步（两个 rank 中从最早开始到最晚结束）中什么都没算的那部分时间；气泡是两个 rank 空闲占比的平均值，这正是
# 公式所计算的量。公式假设通信不花时间，而且各阶段代价相等。我们真实的阶段并不满足这一点：两个 rank 共用这台机器的核
# 心，所以一个阶段除了等另一个阶段，还可能在等核心。因此启动时把调度测了两次：一次用真实的阶段，一次用工作代价**固
# 定**、不需要核心的阶段（一个窄层，然后等待：每个完整批次前向 160 ms、反向 320 ms，按行数分摊到各微批次上；它模拟的
# 是 GPU 运行内核而 CPU 在等待的情形）。机器繁忙只会增加空闲时间，所以每个固定代价的气泡都取两次计时中较小的那个。

# %%
# NBVAL_IGNORE_OUTPUT
fixed = pp["fixed_cost"]["bubble"]
print(f"{'m':>3}{'(p-1)/(m+p-1)':>15}{'fixed cost':>12}{'real stages':>13}{'real step (ms)':>16}")
for m, r in pp["runs"].items():
    print(f"{m:>3}{handpar.bubble_fraction(2, int(m)):>15.3f}{fixed[m]:>12.3f}{r['bubble']:>13.3f}"
          f"{1e3 * r['span_s']:>16.1f}")
gap = {m: fixed[m] - handpar.bubble_fraction(2, int(m)) for m in fixed}
worst = max(gap, key=gap.get)
print(f"fixed cost: at most {gap[worst]:+.3f} from the formula (at m = {worst}); real stages: from "
      f"{pp['runs']['1']['bubble']:.2f} at m = 1 down to {min(r['bubble'] for r in pp['runs'].values()):.2f} at best")

# %% [markdown]
# With fixed-cost stages only the schedule and the hand-offs remain. Every micro-batch is one more hand-off between
# the stages (a message, a process waking up): idle time that the formula does not count, and the reason the
# fixed-cost column can sit above the formula (the line under the table prints by how much, here). The real stages add two more effects: on a small CPU the ranks
# compete for cores, and each micro-batch is a smaller matrix product, which runs at a lower fraction of the
# machine's peak. That is the trade-off on GPUs too: a larger m shrinks the bubble, but a micro-batch too small to
# keep the GPU's matrix units busy makes every slot slower, so m is raised only while the micro-batch stays large
# enough for efficient GEMMs (and the activation memory allows it). With one micro-batch the stages cannot overlap
# at all: about half of each step is idle whatever the machine (the cells assert at least 0.45, leaving room for
# timer noise).
#
# Memory is the other side of it. GPipe runs all m forwards before the first backward, so each stage keeps the
# activations of all m micro-batches, that is of the whole batch. Here the batch is fixed (256 rows, cut into m
# pieces), so that is the same amount for every m, and the cost of a larger m is smaller matrix products and more
# messages. In practice the micro-batch size is what is fixed (by memory and GEMM efficiency) and m is raised to
# shrink the bubble: then GPipe's activation memory grows with m. The schedules that came next work on memory or on
# the bubble, and it is worth keeping the two apart:
# - **1F1B** (one forward, one backward) starts a micro-batch's backward as soon as the last stage has its forward.
#   A stage then holds at most p micro-batches' activations instead of m. Its bubble is GPipe's, (p − 1)/(m + p − 1):
#   the same idle slots, moved around.
# - **Interleaved 1F1B** gives each rank v chunks of layers (virtual stages) instead of one block. The idle time
#   shrinks by a factor v, the bubble fraction becomes (p − 1)/(v·m + p − 1), and it costs v times as many
#   point-to-point messages (Megatron also needs m to be a multiple of p).
# - **Zero-bubble** schedules split each backward into the input-gradient part (which the previous stage waits for)
#   and the weight-gradient part (which nobody waits for), and fill the idle slots with the latter.

# %% [markdown] lang="zh" en="a79b312ad10b"
# 使用固定代价的阶段时，只剩下调度和交接。每多一个微批次，阶段之间就多一次交接（一条消息、一次进程唤醒）：这是公式没
# 有计入的空闲时间，也是固定代价那一列可能高于公式的原因（表下面那一行打印了这里高出多少）。真实的阶段还多了两个影
# 响：在小型 CPU 上，各 rank 争抢核心；而且每个微批次的矩阵乘法更小，只能达到机器峰值中更低的比例。在 GPU 上也是同样
# 的权衡：更大的 m 会缩小气泡，但微批次小到无法让 GPU 的矩阵单元保持忙碌时，每个时间槽都会变慢，所以只有在微批次仍大
# 到足以让 GEMM 高效运行（并且激活值显存允许）时，才会增大 m。只有一个微批次时，两个阶段完全无法重叠：不论什么机器，
# 每一步都有大约一半时间是空闲的（单元格断言它至少为 0.45，给计时噪声留出余地）。
#
# 显存是问题的另一面。GPipe 在第一次反向传播之前运行全部 m 次前向传播，所以每个阶段都保存全部 m 个微批次的激活值，也
# 就是整个批次的激活值。这里批次是固定的（256 行，切成 m 份），所以对每个 m 来说这个量都一样，更大的 m 的代价是更小
# 的矩阵乘法和更多的消息。实际中固定的是微批次大小（由显存和 GEMM 效率决定），增大 m 是为了缩小气泡：这时 GPipe 的激
# 活值显存随 m 增长。后来出现的调度方式，有的针对显存，有的针对气泡，值得把两者分开来看：
# - **1F1B**（一次前向、一次反向）在最后一个阶段完成某个微批次的前向之后，立即开始该微批次的反向。这样一个阶段最多保
#   存 p 个微批次的激活值，而不是 m 个。它的气泡与 GPipe 相同，为 (p − 1)/(m + p − 1)：空闲的时间槽一样多，只是挪了
#   位置。
# - **交错式 1F1B** 给每个 rank 分配 v 组层（虚拟阶段），而不是一整块连续的层。空闲时间缩小为原来的 1/v，气泡占比变为
#   (p − 1)/(v·m + p − 1)，代价是点对点消息变为 v 倍（Megatron 还要求 m 是 p 的整数倍）。
# - **零气泡**调度把每次反向传播拆成输入梯度部分（前一个阶段在等它）和权重梯度部分（没有谁在等它），并用后者填补空闲
#   的时间槽。

# %%
m4 = pp["runs"]["4"]["timeline"]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.2))
ms = [int(m) for m in pp["runs"]]
ax1.plot(ms, [handpar.bubble_fraction(2, m) for m in ms], "o-", label="(p-1)/(m+p-1)")
ax1.plot(ms, [fixed[str(m)] for m in ms], "^-", label="measured, fixed-cost stages")
ax1.plot(ms, [pp["runs"][str(m)]["bubble"] for m in ms], "s--", label="measured, real stages")
ax1.set(xscale="log", xticks=ms, xticklabels=ms, xlabel="micro-batches m", ylabel="bubble fraction", ylim=(0, 1))
ax1.legend()
for rank, spans in enumerate(m4):
    for kind, t0, t1 in spans:
        ax2.barh(rank, 1e3 * (t1 - t0), left=1e3 * t0, color="tab:blue" if kind == "F" else "tab:orange", edgecolor="k")
ax2.set(yticks=[0, 1], yticklabels=["stage 0", "stage 1"], xlabel="ms (blue: forward, orange: backward)",
        title="GPipe, m = 4, as measured")
ax2.invert_yaxis()
plt.show()
first = pp["runs"]["1"]["bubble"]
assert first >= 0.45 and all(0 <= r["bubble"] < 1 for r in pp["runs"].values())
assert all(fixed[str(a)] > fixed[str(b)] for a, b in zip(ms, ms[1:]))  # more micro-batches, a smaller bubble
assert all(abs(g) < 0.1 for g in gap.values())

# %% [markdown]
# PyTorch has this built in: `torch.distributed.pipelining` (a `PipelineStage` per rank and a `ScheduleGPipe`).
# The launch ran the same 2 stages with it, 4 micro-batches, on gloo:

# %% [markdown] lang="zh" en="3866e75b0581"
# PyTorch 内置了这一功能：`torch.distributed.pipelining`（每个 rank 一个 `PipelineStage`，再加一个
# `ScheduleGPipe`）。启动时用它在 gloo 上运行了同样的 2 个阶段、4 个微批次：

# %%
pl = pp["pipelining"]
if pl["works"]:
    print(f"{pl['schedule']} with {pl['micro_batches']} micro-batches works on gloo; loss and gradients equal one "
          f"process (1e-5): {pl['loss_rel'] < 1e-5 and max(pl['grad_rel']) < 1e-5}")
else:
    print("torch.distributed.pipelining failed here:", pl["error"])
assert pl["works"] and pl["loss_rel"] < 1e-5 and max(pl["grad_rel"]) < 1e-5

# %% [markdown]
# ## 6. FSDP2 beside DeepSpeed ZeRO-3
#
# **Stretch.**
# ZeRO stage 3 and PyTorch's FSDP shard the parameters too: between uses, a rank holds only its slice of every
# weight. Before a layer runs, its slices are all-gathered into the whole weight, used, and freed again; gradients
# are reduce-scattered so that each rank keeps its slice of the averaged gradient (FSDP divides by the number of
# ranks, as DDP does). FSDP2 (`torch.distributed.fsdp.fully_shard`, applied
# here to each linear layer and then to the whole model) is PyTorch's own implementation. The launch trained our MLP
# for 5 steps with FSDP2, with DeepSpeed stage 3 (fp32, torch's AdamW), and with plain AdamW in one process on the
# global batch (both ranks' rows):

# %% [markdown] lang="zh" en="717dd8b45d86"
# ## 6. FSDP2 与 DeepSpeed ZeRO-3 并排对比
#
# **进阶。**
# ZeRO stage 3 和 PyTorch 的 FSDP 连参数也分片：在两次使用之间，一个 rank 只持有每个权重的一片。某一层运行之前，它的
# 各片被全收集成完整的权重，用完后再次释放；梯度做归约分散，让每个 rank 保留平均梯度中属于自己的那一片（FSDP 像 DDP
# 一样除以 rank 数）。FSDP2（`torch.distributed.fsdp.fully_shard`，这里先应用到每个线性层，再应用到整个模型）是
# PyTorch 自己的实现。启动时用三种方式把我们的 MLP 训练了 5 步：FSDP2、DeepSpeed stage 3（fp32、torch 的 AdamW），以
# 及在单进程中对全局批次（两个 rank 的全部行）运行的普通 AdamW：

# %%
fs = res["fsdp"]
f2, ds3 = fs["fsdp2"], fs["deepspeed"]
print("FSDP2 works on gloo (CPU):", f2["works"])
rel = max(abs(a - b) / b for curve in (f2["losses"], ds3["losses"]) for a, b in zip(curve, fs["reference_losses"]))
print(f"FSDP2 and DeepSpeed ZeRO-3 losses equal one process within 1e-5 (relative), every step: {rel < 1e-5}")
print("FSDP2 and DeepSpeed ZeRO-3 losses bitwise equal to each other:", f2["losses"] == ds3["losses"])
assert f2["works"] and rel < 1e-5
fig, ax = plt.subplots(figsize=(6, 3.2))
steps = range(1, fs["steps"] + 1)
ax.plot(steps, fs["reference_losses"], "k-", lw=4, alpha=0.3, label="one process, global batch")
ax.plot(steps, f2["losses"], "o-", label="FSDP2 (fully_shard)")
ax.plot(steps, ds3["losses"], "x--", label="DeepSpeed ZeRO-3")
ax.set(xlabel="step", ylabel="loss", title="Same model, same data, 2 ranks", xticks=list(steps))
ax.legend()
plt.show()

# %% [markdown]
# The bytes each rank holds (after the last backward, so the gradients exist too), against `labkit.memory`'s
# prediction for stage 3 (the whole model as one flat vector, split in two), and FSDP2's own rule (below):

# %% [markdown] lang="zh" en="383d151d0361"
# 每个 rank 持有的字节数（在最后一次反向传播之后统计，所以梯度也存在），对照 `labkit.memory` 对 stage 3 的预测（整个
# 模型作为一个扁平向量，一分为二），以及 FSDP2 自己的规则（见下文）：

# %%
pred3 = memory.model_state_bytes(n_params, "fp32", "adamw", stage=3, world_size=2).device
print(f"{'':22}{'params':>9}{'grads':>9}{'master':>9}{'optimizer':>11}")
print(f"{'labkit.memory':<22}{pred3['params']:>9,}{pred3['grads']:>9,}{'-':>9}{pred3['optimizer']:>11,}")
for rank in (0, 1):
    b = ds3["bytes"][rank]
    print(f"{f'DeepSpeed-3 rank {rank}':<22}{b['params']:>9,}{b['grads']:>9,}{b['master']:>9,}{b['optimizer']:>11,}")
for rank in (0, 1):
    b = f2["bytes"][rank]
    print(f"{f'FSDP2 rank {rank}':<22}{b['params']:>9,}{b['grads']:>9,}{'-':>9}{b['optimizer']:>11,}")
print("FSDP2 local shards on rank 1:", f2["bytes"][1]["shards"])
assert all({k: b[k] for k in ("params", "grads", "optimizer")} == {k: pred3[k] for k in ("params", "grads", "optimizer")}
           for b in ds3["bytes"])
shapes = [tuple(p.shape) for p in mlp.parameters()]
dim0_rule = sum(-(-s[0] // 2) * (s[1] if len(s) > 1 else 1) for s in shapes)  # ceil(rows / 2) x columns
print(f"FSDP2 storage per rank by the dim-0 rule: {dim0_rule:,} elements = {4 * dim0_rule:,} bytes")
assert all(b["params"] == b["grads"] == 4 * dim0_rule for b in f2["bytes"])
assert f2["bytes"][0]["optimizer"] - f2["bytes"][1]["optimizer"] == 8 * (256 + 1)  # rank 1: no states for the empty row

# %% [markdown]
# DeepSpeed pads each parameter to a multiple of the world size and splits it flat: 74,241 elements per rank, as
# predicted. Even in fp32 it also keeps a separate fp32 copy of its slice (`master`), which the optimizer updates.
# FSDP2 splits every tensor along its **first dimension** and pads that dimension: the last layer's 1 × 256 weight
# and its one-element bias cannot be split, so rank 0 holds them whole and rank 1 a padded, empty row. Its
# parameters and gradients take 74,369 elements' storage on both ranks (the rule, checked above), its AdamW states
# only the real elements. FSDP2 in fp32 keeps no master copy: AdamW steps the shards in place.
#
# And what they send per step (profiler, rank 0; an all-gather's size is this rank's piece, the gathered tensor is
# twice that; on gloo a reduce-scatter appears as an all-reduce of the whole tensor):

# %% [markdown] lang="zh" en="777c1d2999d4"
# DeepSpeed 把每个参数填充到进程总数的整数倍，然后扁平地切分：每个 rank 74,241 个元素，与预测一致。即使在 fp32 下，
# 它也另外保存它那一片的一份 fp32 副本（`master`），由优化器更新。FSDP2 沿**第一个维度**切分每个张量，并对这个维度做
# 填充：最后一层 1 × 256 的权重和它只有一个元素的偏置无法切分，所以 rank 0 完整地持有它们，rank 1 持有一个填充出来的
# 空行。它的参数和梯度在两个 rank 上都占 74,369 个元素的存储（即上面检查过的规则），而它的 AdamW 状态只对应真实的元
# 素。fp32 下的 FSDP2 不保存主权重副本：AdamW 直接原地更新分片。
#
# 再看它们每一步发送了什么（性能分析器，rank 0；全收集的大小是本 rank 的那一块，收集后的张量是它的两倍；在 gloo 上，
# 归约分散显示为对整个张量的全归约）：

# %%
for who, c in (("FSDP2", f2["collectives"]), ("DeepSpeed-3", ds3["collectives"])):
    ag, ar = c["all_gather"], c.get("reduce_scatter") or c["all_reduce"]  # NCCL's reduce-scatter, or gloo's emulation
    print(f"{who:<12} all-gather: {ag['calls']} calls, {2 * ag['elements']:,} elements gathered | "
          f"reduce: {ar['calls']} calls, {ar['elements']:,} elements")
gathered = {who: 2 * c["all_gather"]["elements"] / n_params for who, c in (("fsdp2", f2["collectives"]),
                                                                             ("ds3", ds3["collectives"]))}
print(f"parameters gathered per step, in units of the model size Ψ: FSDP2 {gathered['fsdp2']:.3f}, "
      f"DeepSpeed-3 {gathered['ds3']:.3f}")
assert round(gathered["fsdp2"], 2) == 2.0 and round(gathered["ds3"], 2) == 1.0

# %% [markdown]
# FSDP2 gathers every layer twice, for forward and again for backward (`reshard_after_forward=True`, its
# default, frees the gathered weights after forward): 2Ψ gathered + Ψ reduce-scattered = **3Ψ** per step, the ZeRO-3
# figure of notebook 10. DeepSpeed gathered only once: by default it keeps gathered parameters that will be used
# again soon (`stage3_max_reuse_distance`, 10⁹ parameters, far more than this model), so backward reuses forward's
# copies: 2Ψ, at the price of holding the whole model during the step. Both knobs trade memory for messages; FSDP2's
# is `reshard_after_forward=False`.
#
# **Accumulation and mixed precision with FSDP2.** The launch made two more FSDP2 runs. One accumulates 2
# micro-batches with `model.set_requires_gradient_sync(False)` before the first (FSDP2's `no_sync()`) and looks after
# each micro-batch at what was sent and what gradients are held. The other trains with
# `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`:

# %% [markdown] lang="zh" en="12453a941789"
# FSDP2 对每一层收集两次，前向一次，反向再一次（它的默认设置 `reshard_after_forward=True` 会在前向之后释放收集到的权
# 重）：收集 2Ψ + 归约分散 Ψ = 每一步 **3Ψ**，即 notebook 10 中 ZeRO-3 的数字。DeepSpeed 只收集了一次：默认情况下，
# 它会保留很快还会再用到的已收集参数（`stage3_max_reuse_distance`，10⁹ 个参数，远多于这个模型），所以反向传播复用前
# 向传播的副本：2Ψ，代价是在这一步中持有整个模型。这两个开关都是用显存换消息；FSDP2 对应的是
# `reshard_after_forward=False`。
#
# **FSDP2 下的梯度累积与混合精度。** 启动时又做了两次 FSDP2 运行。一次累积 2 个微批次，在第一个微批次之前调用
# `model.set_requires_gradient_sync(False)`（相当于 FSDP2 的 `no_sync()`），并在每个微批次之后查看发送了什么、持有哪
# 些梯度。另一次用 `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)` 训练：

# %%
acc, mp = fs["fsdp2_accumulation"], fs["fsdp2_mixed"]
for i, m in enumerate(acc["per_micro"], 1):
    c = m["collectives"]
    print(f"micro-batch {i}: gathered {2 * c['all_gather']['elements'] / n_params:.2f}Ψ, reduced "
          f"{c.get('all_reduce', {}).get('elements', 0) / n_params:.2f}Ψ; gradients held: whole "
          f"{m['unsharded_grad_bytes']:,} B, sharded {m['sharded_grad_bytes']:,} B")
b, b32 = mp["bytes"][0], f2["bytes"][0]
print(f"bf16 policy: layers compute in {mp['compute_dtypes']}; rank 0 holds {b['dtypes']} parameters "
      f"{b['params']:,} B, {b['grad_dtypes']} gradients {b['grads']:,} B, AdamW {b['optimizer']:,} B "
      f"(fp32 run: {b32['params']:,} / {b32['grads']:,} / {b32['optimizer']:,} B)")
first, second = acc["per_micro"]
assert "all_reduce" not in first["collectives"] and first["unsharded_grad_bytes"] == 4 * n_params
assert second["unsharded_grad_bytes"] == 0 and second["sharded_grad_bytes"] == f2["bytes"][0]["grads"]
assert mp["compute_dtypes"] == ["bfloat16"] and all(
    {k: x[k] for k in ("params", "grads", "optimizer")} == {k: y[k] for k in ("params", "grads", "optimizer")}
    for x, y in zip(mp["bytes"], f2["bytes"]))

# %% [markdown]
# Without gradient sync FSDP2 behaves like DDP under `no_sync()`: no reduce-scatter until the last micro-batch. It
# still gathers every layer twice per micro-batch, so a step of k micro-batches moves (2k + 1)Ψ (notebook 10's
# table), and between micro-batches each rank keeps the **whole** model's gradients in fp32, here 4 bytes × Ψ, N
# times the sharded gradients on N ranks: the memory that sharding was meant to save. Leaving sync on keeps the
# gradients sharded and pays a reduce-scatter per micro-batch instead, ZeRO-2's choice.
#
# With the bf16 policy FSDP2 keeps its shards in fp32 (they *are* the master weights) and casts them to bf16 when it
# gathers them: the all-gathers carry bf16, half the bytes of the fp32 run for the same elements (FSDP2's documented
# behaviour: `param_dtype` is the dtype of the unsharded parameter and of the parameter all-gather), and the layers
# compute in bf16 (measured above: they saw bf16 weights). Gradients are reduced in `reduce_dtype` (fp32) into fp32
# shards. What a rank holds between uses is therefore byte for byte the fp32 run's, 4 + 4 + 8 = 16 bytes per parameter
# over N (asserted). DeepSpeed ZeRO-3 in bf16
# (notebook 10) also comes to 16/N, split differently: bf16 weight and gradient shards (2 + 2) plus an fp32 master
# copy and Adam's moments (12). Mixed precision saves activation memory, bandwidth and time, not model-state bytes.
#
# **Checkpoints of a sharded model.** No rank holds the whole model, so `torch.save(model.state_dict())` on rank 0
# would save one shard (or first gather everything into one rank's memory). Each library has its own answer:
# - FSDP2 uses **`torch.distributed.checkpoint`** (DCP): `dcp.save({"model": model.state_dict()}, checkpoint_id=dir)`
#   has every rank write its own shards, in parallel, plus one metadata file; `dcp.load` reads them back into any
#   layout, a different number of ranks or no sharding at all (`get_state_dict`/`set_state_dict` from
#   `torch.distributed.checkpoint.state_dict` add the optimizer).
# - DeepSpeed's `engine.save_checkpoint(dir)` writes each rank's partitions of the fp32 weights and optimizer states.
#   To get one ordinary fp32 state dict out, offline and without GPUs, use `zero_to_fp32.py`, which DeepSpeed puts
#   next to the checkpoint, or `deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(dir)`.
#
# The launch did both after training: FSDP2's shards loaded by DCP into a plain, unsharded MLP, and DeepSpeed's
# ZeRO-3 checkpoint merged by `zero_to_fp32`, each compared with the trained weights:

# %% [markdown] lang="zh" en="22c9ef74bcb4"
# 关闭梯度同步后，FSDP2 的行为与 `no_sync()` 下的 DDP 一样：直到最后一个微批次才做归约分散。它每个微批次仍要把每一层
# 收集两次，所以 k 个微批次的一步要传输 (2k + 1)Ψ（notebook 10 的表格），而且在微批次之间，每个 rank 都以 fp32 保
# 存**整个**模型的梯度，这里是 4 字节 × Ψ，在 N 个 rank 上是分片梯度的 N 倍：这正是分片本想省下的显存。保持同步开
# 启，梯度就一直是分片的，代价是每个微批次做一次归约分散，这就是 ZeRO-2 的选择。
#
# 使用 bf16 策略时，FSDP2 以 fp32 保存分片（它们*就是*主权重），在收集时把它们转换为 bf16：全收集传输的是 bf16，同样
# 的元素数，字节数只有 fp32 运行的一半（这是 FSDP2 文档所写的行为：`param_dtype` 是未分片参数以及参数全收集的数据类
# 型），各层以 bf16 计算（上面已测得：它们看到的是 bf16 权重）。梯度以 `reduce_dtype`（fp32）归约到 fp32 分片中。因
# 此，一个 rank 在两次使用之间持有的内容与 fp32 运行逐字节相同，即每参数 4 + 4 + 8 = 16 字节再除以 N（已断言）。bf16
# 下的 DeepSpeed ZeRO-3（notebook 10）也是 16/N，只是划分方式不同：bf16 的权重分片和梯度分片（2 + 2），加上 fp32 主
# 权重副本和 Adam 的两个动量（12）。混合精度节省的是激活值显存、带宽和时间，而不是模型状态的字节数。
#
# **分片模型的检查点。** 没有哪个 rank 持有整个模型，所以在 rank 0 上执行 `torch.save(model.state_dict())` 只会保存
# 一个分片（或者要先把所有内容收集到一个 rank 的内存中）。每个库都有自己的办法：
# - FSDP2 使用 **`torch.distributed.checkpoint`**（DCP）：
#   `dcp.save({"model": model.state_dict()}, checkpoint_id=dir)` 让每个 rank 并行写出自己的分片，外加一个元数据文
#   件；`dcp.load` 可以把它们读回任意布局，包括不同的 rank 数，甚至完全不分片
#   （`torch.distributed.checkpoint.state_dict` 中的 `get_state_dict`/`set_state_dict` 可以把优化器也加进来）。
# - DeepSpeed 的 `engine.save_checkpoint(dir)` 写出每个 rank 的 fp32 权重分区和优化器状态分区。要离线、不用 GPU 地从
#   中得到一个普通的 fp32 state dict，可以用 DeepSpeed 放在检查点旁边的 `zero_to_fp32.py`，或者
#   `deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(dir)`。
#
# 启动时在训练之后把两者都做了：FSDP2 的分片由 DCP 加载进一个普通的、不分片的 MLP，DeepSpeed 的 ZeRO-3 检查点由
# `zero_to_fp32` 合并，两者都与训练得到的权重做了比较：

# %%
ck, z2f = f2["dcp"], ds3["zero_to_fp32"]
print(f"DCP: files {ck['files']}; loaded into an unsharded MLP, equal to FSDP2's full weights on each rank: "
      f"{ck['equal']}")
print(f"zero_to_fp32: from {len(z2f['files'])} partition files, {z2f['keys']} tensors in {z2f['dtypes']}, equal to the "
      f"engine's gathered weights: {z2f['equal']}")
assert ck["works"] and ck["equal"] == [True, True] and z2f["works"] and z2f["equal"]

# %% [markdown]
# **Across nodes: HSDP and ZeRO++.** FSDP and ZeRO-3 gather every layer's weights from all n ranks, twice per
# micro-batch, on the critical path. Inside a node that runs over NVLink; across nodes every gather waits on the
# slower network. Two remedies:
# - **HSDP** (hybrid sharding; in FSDP2, `fully_shard(..., mesh=...)` with a 2-D mesh of (replicate, shard)
#   dimensions) shards inside a group of g GPUs, usually a node, and replicates across groups. The per-layer
#   gathers stay inside the node; only gradients cross nodes: after the reduce-scatter inside the node, each rank
#   all-reduces its 1/g shard with the ranks that hold the same shard in the other nodes, DDP-style. Model states
#   are then divided by g, not by n.
# - **ZeRO++** (DeepSpeed) keeps full sharding and makes the cross-node traffic cheaper: quantised weight
#   all-gathers (qwZ, `zero_quantized_weights`: int8, half the bytes of bf16), a secondary copy of the weights
#   sharded only inside each node so that backward's gathers stay there (hpZ, `zero_hpz_partition_size`: costs
#   that copy's memory), and quantised gradient reduction through all-to-all (qgZ, `zero_quantized_gradients`).
#
# **What works on CPU/gloo with this torch**, as run above: FSDP2 (`fully_shard`, with `MixedPrecisionPolicy` and
# without gradient sync), `torch.distributed.pipelining`
# (`ScheduleGPipe`), DeepSpeed stages 1 and 3, and every collective used here. What gloo lacks is a native
# reduce-scatter: torch emulates it with an all-reduce, which sends twice the bytes a ring reduce-scatter would. That
# changes the speed, not the results.
#
# ## 7. Which strategy, when
#
# If you skipped the stretch sections 4-6, what this section needs from them, in three lines: **tensor
# parallelism** splits every weight matrix of a block over the ranks (Megatron's MLP: one all-reduce forward and
# one backward per block); **pipeline parallelism** gives each rank a run of layers (a stage) and streams
# micro-batches through them, leaving each stage idle for a *bubble* of (p−1)/(m+p−1) of the step with p stages and
# m micro-batches (GPipe; 1F1B reorders the same work so that a stage holds at most p micro-batches' activations
# instead of m); **FSDP / ZeRO-3** shards the weights too and all-gathers each layer just before it runs.
#
# Ψ is the parameter count, n the number of ranks, b·s·d the activations at a layer boundary (tokens × width). The
# volumes are the collectives' payloads per step; a ring all-reduce moves 2(n−1)/n of its payload through every
# rank, an all-gather or a reduce-scatter (n−1)/n.
#
# | strategy | each rank holds | communicates per step: payload (ring traffic per rank) | use it when |
# |---|---|---|---|
# | DDP | the whole model, gradients and optimizer states | all-reduce of the gradients: Ψ (≈ 2Ψ), overlapped with backward | the model states fit on one GPU |
# | ZeRO-1 | the whole model and gradients; 1/n of the optimizer states | reduce-scatter Ψ + all-gather Ψ (≈ 2Ψ, as DDP) | the optimizer states do not fit (ZeRO-2: also shard the gradients; the same traffic per step without accumulation, but with accumulation it reduce-scatters on every micro-batch: notebook 10) |
# | FSDP / ZeRO-3 | 1/n of everything; one layer whole while it runs | all-gather 2Ψ (forward and backward) + reduce-scatter Ψ (≈ 3Ψ) | even the weights do not fit; any number of nodes |
# | tensor (Megatron) | 1/n of every weight matrix | per MLP block: all-reduce of b·s·d forward and of b·s·d backward (≈ 4 b·s·d), in the critical path | one layer is too big or too slow; inside a node (NVLink) |
# | pipeline (GPipe) | 1/n of the layers | per stage boundary: b·s·d forward + b·s·d backward, point to point; plus a bubble | the model is too deep for a node; across nodes |
#
# The same formulas against what the profiler counted in this notebook's launch (elements per step, rank 0; Ψ
# padded where the sharding pads it):

# %% [markdown] lang="zh" en="73f637846b18"
# **跨节点：HSDP 与 ZeRO++。** FSDP 和 ZeRO-3 在每个微批次中要从全部 n 个 rank 把每一层的权重收集两次，而且处于关键
# 路径上。在节点内，这走的是 NVLink；跨节点时，每次收集都要等待较慢的网络。有两种补救办法：
# - **HSDP**（混合分片数据并行；在 FSDP2 中即 `fully_shard(..., mesh=...)`，使用一个由 (replicate, shard) 两个维度组
#   成的 2-D mesh）在一组 g 块 GPU（通常是一个节点）内部分片，在组与组之间复制。逐层的收集留在节点内；只有梯度跨越节
#   点：节点内的归约分散之后，每个 rank 与其他节点中持有同一分片的 rank 一起，以 DDP 的方式对它那 1/g 的分片做全归
#   约。这时模型状态除以的是 g，而不是 n。
# - **ZeRO++**（DeepSpeed）保持完全分片，但让跨节点的流量更便宜：量化的权重全收集（qwZ，`zero_quantized_weights`：
#   int8，字节数是 bf16 的一半）；一份只在每个节点内部分片的次级权重副本，让反向传播的收集留在节点内（hpZ，
#   `zero_hpz_partition_size`：代价是这份副本占用的显存）；以及通过 all-to-all 进行的量化梯度归约（qgZ，
#   `zero_quantized_gradients`）。
#
# **在这个版本的 torch 上，CPU/gloo 能运行什么**（如上面实际运行的）：FSDP2（`fully_shard`，带
# `MixedPrecisionPolicy`，以及关闭梯度同步）、`torch.distributed.pipelining`（`ScheduleGPipe`）、DeepSpeed stage 1
# 和 3，以及这里用到的每一种集合通信操作。gloo 缺少的是原生的归约分散：torch 用一次全归约来模拟它，发送的字节数是环
# 形归约分散的两倍。这改变的是速度，而不是结果。
#
# ## 7. 何时用哪种策略
#
# 如果你跳过了进阶的第 4-6 节，本节要从中用到的内容可以概括为三点：**张量并行**把一个块的每个权重矩阵切分到各个 rank 上
# （Megatron 的 MLP：每个块前向一次全归约、反向一次全归约）；**流水线并行**给每个 rank 一段连续的层（一个阶段），让
# 微批次依次流过它们，有 p 个阶段、m 个微批次时，每个阶段在一步中有 (p−1)/(m+p−1) 的时间处于空闲的*气泡*中（GPipe；
# 1F1B 重新安排同样的工作，使一个阶段最多保存 p 个微批次的激活值，而不是 m 个）；**FSDP / ZeRO-3** 连权重也分片，每
# 一层在运行之前才被全收集。
#
# Ψ 是参数量，n 是 rank 数，b·s·d 是层边界处的激活值（token 数 × 宽度）。通信量是每一步集合通信的有效载荷；环形全归
# 约经过每个 rank 传输的数据量是其有效载荷的 2(n−1)/n，全收集或归约分散则是 (n−1)/n。
#
# | 策略 | 每个 rank 持有 | 每一步的通信：有效载荷（每个 rank 的环形流量） | 适用场景 |
# |---|---|---|---|
# | DDP | 整个模型、梯度和优化器状态 | 梯度的全归约：Ψ（≈ 2Ψ），与反向传播重叠 | 模型状态能放进一块 GPU |
# | ZeRO-1 | 整个模型和梯度；1/n 的优化器状态 | 归约分散 Ψ + 全收集 Ψ（≈ 2Ψ，与 DDP 相同） | 优化器状态放不下（ZeRO-2：梯度也分片；不做梯度累积时每步流量相同，但做梯度累积时每个微批次都要做一次归约分散：见 notebook 10） |
# | FSDP / ZeRO-3 | 所有内容的 1/n；一层在运行时是完整的 | 全收集 2Ψ（前向和反向）+ 归约分散 Ψ（≈ 3Ψ） | 连权重都放不下；任意数量的节点 |
# | 张量并行（Megatron） | 每个权重矩阵的 1/n | 每个 MLP 块：前向对 b·s·d 做一次全归约，反向对 b·s·d 做一次全归约（≈ 4 b·s·d），处于关键路径上 | 单层太大或太慢；在节点内（NVLink） |
# | 流水线并行（GPipe） | 1/n 的层 | 每个阶段边界：前向 b·s·d + 反向 b·s·d，点对点；外加气泡 | 模型太深，一个节点放不下；跨节点 |
#
# 同样的公式，对照本 notebook 的启动中性能分析器统计到的数字（每一步的元素数，rank 0；在分片有填充的地方，Ψ 取填充后
# 的值）：

# %%
f2c, psi_pad, fsdp_pad = f2["collectives"], z["padded"], 2 * dim0_rule  # DeepSpeed's flat padding; FSDP2's dim-0 one
sent = {k: sum(c["elements"] for op, c in p.items() if op == "send") for k, p in enumerate(pp["runs"]["4"]["p2p"])}
table = [  # strategy, measured, formula
    ("DDP", ddp["collectives"]["ddp"]["all_reduce"]["elements"], n_params),
    ("ZeRO-1", rs["elements"] + 2 * z["collectives"]["all_gather"]["elements"], 2 * psi_pad),
    ("FSDP2", 2 * f2c["all_gather"]["elements"] + (f2c.get("reduce_scatter") or f2c["all_reduce"])["elements"], 3 * fsdp_pad),
    ("tensor", sum(tp["ranks"][0][k]["all_reduce"]["elements"] for k in ("forward", "backward")), 2 * tp["tokens"] * tp["d_model"]),
    ("pipeline", sent[0] + sent[1], 2 * pp["batch"] * pp["width"]),
]
for name, got, formula in table:
    print(f"{name:<9} measured {got:>9,}   formula {formula:>9,}")
assert all(got == formula for _, got, formula in table)

# %% [markdown]
# **Each strategy's loop, whole.** The pieces above come together in a training loop of about ten lines per
# strategy, with nothing in it but the training. The launch ran each one and checked it against the real thing in
# a wrapper (`labkit.recipes.handpar`): DDP by hand against torch DDP and ZeRO-1 by hand against AdamW (bit for bit,
# from each rank's own initial weights), the sequence-parallel block and GPipe against the same model trained in
# one process:

# %% [markdown] lang="zh" en="3babb2cc1b73"
# **每种策略的完整循环。** 上面的各个部分汇集成一个训练循环，每种策略大约十行，里面除了训练什么都没有。启动时运行了
# 每一个循环，并在一个包装程序（`labkit.recipes.handpar`）中把它与真正的实现对照检查：亲手实现的 DDP 对照 torch
# DDP，亲手实现的 ZeRO-1 对照 AdamW（逐位相等，都从每个 rank 自己的初始权重出发），序列并行块和 GPipe 则对照在单进程
# 中训练的同一个模型：

# %%
for loop in (handpar.train_ddp, handpar.train_zero1, handpar.train_sequence_parallel, handpar.train_gpipe):
    src = inspect.getsource(loop)
    print(src[:src.index('    """')] + src[src.index('"""', src.index('    """') + 7) + 4:])  # without the docstring
checks = {"DDP": ddp["loop_bitwise_vs_ddp"], "ZeRO-1": z["loop_bitwise_vs_adamw"],
          "TP + SP (within 1e-5)": [r < 1e-5 for r in tp["loop_rel"]], "GPipe (within 1e-5)": [r < 1e-5 for r in pp["loop_rel"]]}
print("each loop equals the real thing, rank 0 and rank 1:", checks)
assert all(v == [True, True] for v in checks.values())

# %% [markdown]
# ### Sizing a real run: 3D parallelism
#
# How they combine in practice ("3D parallelism"): tensor parallel inside a node, where NVLink makes its per-layer
# collectives affordable; pipeline parallel across groups of nodes, where only activations at a few boundaries
# cross the slower network; data parallel, usually with ZeRO-1 or FSDP, over everything else. Context parallelism
# (splitting a long sequence over ranks that exchange keys and values for attention) is a fourth dimension; it needs
# attention, which our MLPs do not have, and is not run here.
#
# `labkit.sizing` does the arithmetic for a GPT-style model: model states from `labkit.memory` (ZeRO over the
# data-parallel group), activations from Korthikanti et al. (2022) with tensor and sequence parallelism and selective
# recomputation, 1F1B's live micro-batches, and the bubble. A GPT-style model with Llama-2-70B's depth, width and
# sequence (80 layers, width 8192, 64 heads, 4096 tokens; 65 billion parameters by the GPT count, since it keeps a
# 4h GELU MLP and full multi-head attention) on 64 GPUs of 80 GB, global batch 1024 sequences, ZeRO-1 in
# DeepSpeed's layout (bf16 weights and gradients whole; the fp32 gradient partition, master weights and Adam states
# sharded: 20 bytes per parameter before sharding), one sequence per micro-batch:

# %% [markdown] lang="zh" en="c8357b28c38a"
# ### 估算一次真实训练的规模：3D 并行
#
# 它们在实践中如何组合（“3D 并行”）：张量并行放在节点内，那里的 NVLink 让它逐层的集合通信负担得起；流水线并行跨越若
# 干组节点，只有少数几个边界处的激活值要经过较慢的网络；数据并行（通常配合 ZeRO-1 或 FSDP）覆盖其余的一切。上下文并
# 行（把一个长序列切分到多个 rank 上，各 rank 为注意力交换键和值）是第四个维度；它需要注意力，而我们的 MLP 没有注意
# 力，所以这里不运行它。
#
# `labkit.sizing` 为 GPT 式模型做这笔算术：模型状态来自 `labkit.memory`（ZeRO 作用在数据并行组上），激活值采用
# Korthikanti et al. (2022) 在张量并行、序列并行和选择性重计算下的公式，再加上 1F1B 下同时在处理中的微批次数和气泡。
# 一个 GPT 式模型，具有 Llama-2-70B 的深度、宽度和序列长度（80 层、宽度 8192、64 个头、4096 个 token；按 GPT 的算法
# 为 650 亿个参数，因为它保留了 4h 的 GELU MLP 和完整的多头注意力），在 64 块 80 GB 的 GPU 上，全局批大小为 1024 个
# 序列，采用 DeepSpeed 布局的 ZeRO-1（bf16 权重和梯度是完整的；fp32 梯度分区、主权重和 Adam 状态分片：分片前每参数
# 20 字节），每个微批次一个序列：

# %%
plans = sizing.search_plans(64, 80 * memory.GB, model="70B")
best = plans[0]
print(best)
print("\nother layouts that fit (tp x pp x dp: GB per GPU, bubble):",
      ", ".join(f"{p.tp}x{p.pp}x{p.dp}: {p.total_bytes / memory.GB:.1f}, {p.bubble:.1%}" for p in plans[1:]))
for recompute in ("selective", "full"):
    dp64 = sizing.plan_3d(64, 80 * memory.GB, 1, 1, 64, model="70B", zero=3, recompute=recompute)
    print(f"pure data parallel, ZeRO-3 over 64, {recompute} recomputation: model states "
          f"{dp64.model_state_bytes / memory.GB:.1f} GB, activations {dp64.activation_bytes / memory.GB:.1f} GB, "
          f"total {dp64.total_bytes / memory.GB:.1f} GB: fits = {dp64.fits}")
    assert dp64.fits == (recompute == "full")
megatron = best.params_per_gpu * (2 + 4 + 12 / best.dp)  # bf16 weights, a whole fp32 main_grad, 12 B sharded
print(f"Megatron-LM's layout instead (gradients accumulated in a whole fp32 buffer): model states "
      f"{megatron / memory.GB:.1f} GB, total {(best.total_bytes - best.model_state_bytes + megatron) / memory.GB:.1f} GB")
states = memory.model_state_bytes(best.params_per_gpu, best.policy, "adam", stage=1, world_size=best.dp)
assert best.model_state_bytes == states.device_total and best.fits
s_len, width = 4096, 8192  # Korthikanti et al., sequence-parallel and selective: 34·s·b·h / t bytes per layer
assert best.act_per_layer == s_len * 1 * width * 34 // best.tp and best.activation_bytes == (
    best.layers_per_stage * best.act_per_layer * best.live_micro_batches)

# %% [markdown]
# Read the winner by building it up, from the simplest layout. Pure data parallelism fits only with full recomputation: with every model state
# sharded 64 ways (ZeRO-3), each GPU still holds all 80 layers' activations for its sequence, unless it keeps only
# each layer's input and recomputes the rest in backward (about a third more compute), and its per-layer gathers of
# ZeRO-3 then cross the network between nodes for every micro-batch. Tensor parallelism of 8, inside
# a node, with sequence parallelism divides both the weights and the activations by 8, and ZeRO-1 over the 8
# data-parallel replicas divides the optimizer states further. Pipeline parallelism would divide the weights too,
# but not the activations of its first stage: under 1F1B that stage holds L/pp layers for up to pp micro-batches in
# flight, L layers' worth, the same as without a pipeline. It adds a bubble (small here, with hundreds of
# micro-batches per step) and point-to-point messages, so the calculator prefers the smallest model-parallel degree
# that fits. The numbers are estimates for planning: leave room for the CUDA context, communication
# buffers, fragmentation and the logits (`reserve_bytes`), and measure the first steps.
#
# **What this notebook leaves out**, for the next step on real GPUs:
# - Memory is measured here after backward; the peak is often inside `optimizer.step()` (DeepSpeed ZeRO-1/2
#   allocate an fp32 gradient partition there). Plan with `torch.cuda.max_memory_allocated`, not a snapshot.
# - FSDP2's prefetching (forward and backward) and `set_reshard_after_backward(False)` with accumulation, and
#   DeepSpeed's `stage3_prefetch_bucket_size`, take gathers off the critical path at the price of memory.
# - DDP's knobs: `bucket_cap_mb`, `gradient_as_bucket_view=True` (no second copy of the gradients), `static_graph`,
#   and communication hooks such as `bf16_compress_hook`.
# - A loss averaged per rank is the global per-token mean only when every rank sees the same number of tokens
#   (padding breaks it); sum and divide by the all-reduced count instead.
# - Megatron's overlap of tensor-parallel communication needs `CUDA_DEVICE_MAX_CONNECTIONS=1`, and a pipeline with
#   tied input and output embeddings needs an extra all-reduce between its first and last stage.
#
# ## Summary
#
# - DDP by hand starts with a broadcast of rank 0's weights (step 0), then all-reduces scaled gradients. Hooks
#   start each all-reduce as soon as its gradient exists, so communication overlaps backward; buckets send fewer,
#   larger messages, and a parameter without a gradient must raise, not leave a bucket unsent. All three equal
#   torch DDP bit for bit, because they scale by 1/world before summing as DDP does and, with 2 ranks, halving and
#   a two-term sum are exact; with 3 ranks bitwise equality also needs DDP's bucket layout.
# - ZeRO-1 is reduce-scatter, a local AdamW step on 1/n of the parameters, and all-gather: bit for bit the same
#   weights as AdamW, with 1/n of the states (here 593,936 bytes per rank: by hand, `labkit.memory` and DeepSpeed
#   agree). It saves memory only if nothing is held twice: parameters and gradients as views into flat buffers.
#   Clipping sharded gradients needs the global norm: one all-reduce of the shards' sums of squares.
# - Megatron's MLP needs one all-reduce forward (g) and one backward (f) per block, of activations, in the critical
#   path; forgetting f's backward all-reduce leaves the input with half a gradient and no error message. Sequence
#   parallelism turns f and g into an all-gather and a reduce-scatter (the same bytes on a ring) so that LayerNorm,
#   dropout and the residual run on 1/t of the tokens; their replicated parameters then need their gradients summed.
# - GPipe trades a bubble of (p − 1)/(m + p − 1) for splitting the layers; more micro-batches shrink it, while the
#   bytes between stages stay the same; at a fixed micro-batch size the activations GPipe holds grow with m. 1F1B
#   keeps the bubble and bounds the activations to p micro-batches; interleaving and zero-bubble schedules shrink
#   the bubble itself.
# - FSDP2 and DeepSpeed ZeRO-3 train the same curve; they differ in how they split tensors (first dimension vs flat)
#   and in whether backward gathers the weights again. FSDP2 without gradient sync accumulates whole gradients (its
#   memory saving gone until the last micro-batch); its bf16 policy keeps fp32 shards and gathers bf16 copies.
#   Sharded models are saved by every rank (DCP; DeepSpeed's partitions, merged offline by `zero_to_fp32`); HSDP and
#   ZeRO++ keep the per-layer gathers off the slow network between nodes.
# - Every strategy's loop is ten lines of ordinary training; what differs is where the collectives hide. Sizing a
#   real run (`labkit.sizing`) is the same memory model with tensor, pipeline and data degrees: 70B on 64 × 80 GB
#   fits with tensor parallelism 8 inside each node and ZeRO-1 across nodes; data parallelism alone needs ZeRO-3 and
#   full recomputation.
#
# Next, notebook 12 takes the multi-rank recipes to a cluster with Slurm.

# %% [markdown] lang="zh" en="05860737905b"
# 从最简单的布局开始，一步步搭出这个胜出的方案。纯数据并行只有在完全重计算时才放得下：
# 即使每一项模型状态都分成 64 片（ZeRO-3），每块 GPU
# 仍要为它的序列保存全部 80 层的激活值，除非它只保留每一层的输入，在反向传播中重算其余部分（计算量多出约三分之一）；
# 而且 ZeRO-3 的逐层收集在每个微批次都要跨越节点之间的网络。在节点内做 8 路张量并行并配合序列并行，能把权重和激活值
# 都除以 8，而在 8 个数据并行副本上做 ZeRO-1，又把优化器状态进一步切分。流水线并行也会切分权重，但不会切分它第一个阶
# 段的激活值：在 1F1B 下，该阶段为最多 pp 个同时在处理中的微批次各保存 L/pp 层的激活值，合计相当于 L 层，与不用流水
# 线时相同。它还会增加气泡（这里很小，因为每一步有数百个微批次）和点对点消息，所以计算器优先选择放得下的最小模型并行
# 度。这些数字是用于规划的估算：要给 CUDA 上下文、通信缓冲区、内存碎片和 logits 留出余量（`reserve_bytes`），并实测
# 最初的几步。
#
# **本 notebook 没有涉及的内容**，留给在真实 GPU 上的下一步：
# - 这里的显存是在反向传播之后测量的；峰值常常出现在 `optimizer.step()` 内部（DeepSpeed ZeRO-1/2 在那里分配一个 fp32
#   梯度分区）。请用 `torch.cuda.max_memory_allocated` 来规划，而不是某个时刻的快照。
# - FSDP2 的预取（前向和反向）、梯度累积时的 `set_reshard_after_backward(False)`，以及 DeepSpeed 的
#   `stage3_prefetch_bucket_size`，都能以显存为代价把收集移出关键路径。
# - DDP 的各个开关：`bucket_cap_mb`、`gradient_as_bucket_view=True`（不保存梯度的第二份副本）、`static_graph`，以及
#   `bf16_compress_hook` 之类的通信钩子。
# - 只有当每个 rank 看到的 token 数相同时，各 rank 分别求平均的损失才等于全局的逐 token 平均（填充会破坏这一点）；应
#   当先求和，再除以经过全归约的 token 总数。
# - Megatron 的张量并行通信重叠需要设置 `CUDA_DEVICE_MAX_CONNECTIONS=1`；输入和输出嵌入共享权重的流水线，需要在第一
#   个和最后一个阶段之间额外做一次全归约。
#
# ## 小结
#
# - 亲手实现的 DDP 先广播 rank 0 的权重（第 0 步），然后对缩放后的梯度做全归约。钩子在每个梯度一产生就启动它的全归
#   约，让通信与反向传播重叠；分桶发送更少、更大的消息，而没有梯度的参数必须引发报错，而不是让一个桶一直发不出去。三
#   个版本都与 torch DDP 逐位相等，因为它们像 DDP 一样在求和之前乘以 1/world，而且在 2 个 rank 时，减半和两项求和都
#   是精确的；在 3 个 rank 时，逐位相等还需要 DDP 的桶布局。
# - ZeRO-1 就是归约分散、在 1/n 的参数上执行本地 AdamW 更新、再全收集：得到与 AdamW 逐位相同的权重，而状态只有 1/n
#   （这里每个 rank 593,936 字节：亲手实现、`labkit.memory` 和 DeepSpeed 三者一致）。只有在没有任何东西被保存两次
#   时，它才真正节省显存：参数和梯度都应是扁平缓冲区的视图。裁剪分片梯度需要全局范数：对各分片的平方和做一次全归约。
# - Megatron 的 MLP 每个块需要前向一次全归约（g）和反向一次全归约（f），对象是激活值，处于关键路径上；忘记 f 的反向
#   全归约，输入就只得到一半梯度，而且没有任何报错。序列并行把 f 和 g 变成全收集和归约分散（在环上字节数相同），使
#   LayerNorm、dropout 和残差只在 1/t 的 token 上运行；于是它们被复制的参数需要把梯度加起来。
# - GPipe 用 (p − 1)/(m + p − 1) 的气泡换来层的切分；更多的微批次会缩小气泡，而阶段之间的字节数不变；在微批次大小固
#   定时，GPipe 保存的激活值随 m 增长。1F1B 保持同样的气泡，并把激活值限制在 p 个微批次以内；交错式调度和零气泡调度
#   则缩小气泡本身。
# - FSDP2 和 DeepSpeed ZeRO-3 训练出相同的曲线；它们的区别在于如何切分张量（按第一个维度还是扁平切分），以及反向传播
#   是否再次收集权重。关闭梯度同步的 FSDP2 累积的是完整梯度（在最后一个微批次之前，分片节省的显存荡然无存）；它的
#   bf16 策略保留 fp32 分片，收集的是 bf16 副本。分片模型由每个 rank 各自保存（DCP；DeepSpeed 的分区由
#   `zero_to_fp32` 离线合并）；HSDP 和 ZeRO++ 让逐层收集避开节点之间较慢的网络。
# - 每种策略的循环都是十行普通的训练代码；不同的只是集合通信藏在哪里。估算一次真实训练的规模（`labkit.sizing`）用的
#   是同一个显存模型，再加上张量、流水线和数据并行的并行度：70B 模型在 64 × 80 GB 上，节点内用 8 路张量并行、跨节点
#   用 ZeRO-1 就能放下；只用数据并行则需要 ZeRO-3 加完全重计算。
#
# 接下来，notebook 12 把这些多 rank 的训练脚本搬到使用 Slurm 的集群上。
