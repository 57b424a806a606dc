# %% [markdown]
# # 09 · DDP and communication: multi-rank training from a notebook
#
# **Objectives**
# - explain data parallelism: replicas, the all-reduce of gradients, and the global batch;
# - launch 1 and 2 ranks with `torchrun` from a notebook, safely, and check that the ranks stay bit-identical;
# - combine AMP with DDP (bf16, and fp16 with a GradScaler) and accumulate gradients with `no_sync()`;
# - measure all-reduce bandwidth the way nccl-tests does (algbw, busbw) and read the NCCL knobs that matter;
# - survive a crashed rank: a clean error in the notebook, then a resume that ends in the same weights.
#
# **Prerequisites:** notebooks 03 and 04 (loss scaling, AMP, checkpoints).
#
# **Estimated time:** 80 min
#
# Every run below is real multi-process training: on this machine two CPU processes talking over gloo, on a GPU
# node the same module with NCCL. Each launch costs a few seconds of process start-up.

# %% [markdown] lang="zh" en="aa12b6d16d0f"
# # 09 · DDP 与通信：在 notebook 中进行多 rank 训练
#
# **学习目标**
# - 解释数据并行：模型副本、梯度的全归约（all-reduce）以及全局批大小；
# - 在 notebook 中用 `torchrun` 安全地启动 1 个和 2 个 rank，并检查各 rank 是否保持逐位一致；
# - 把 AMP 与分布式数据并行（DDP）结合起来（bf16，以及配合 GradScaler 的 fp16），并用 `no_sync()` 做梯度累积；
# - 像 nccl-tests 那样测量全归约带宽（algbw、busbw），并读懂真正要紧的 NCCL 参数；
# - 应对 rank 崩溃：在 notebook 中得到一个干净的报错，然后恢复训练，最终得到相同的权重。
#
# **前置知识：** notebook 03 和 04（损失缩放、AMP、检查点）。
#
# **预计用时：** 80 分钟
#
# 下面的每次运行都是真正的多进程训练：在本机上是两个通过 gloo 通信的 CPU 进程，在 GPU 节点上则是
# 同一个模块改用 NCCL。每次启动都要花几秒钟来启动进程。

# %%
# %matplotlib inline
# %load_ext labkit
import inspect
import math
import os
import subprocess
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from torch.utils.data import DistributedSampler

from labkit import device, train
from labkit.check import check, predict, reveal
from labkit.dist import LaunchError, launch
from labkit.exercises.nb09 import simulate_all_reduce
from labkit.recipes import comm_share
from labkit.recipes import ddp as ddp_recipe

# %% [markdown]
# ## 1. Data parallelism in one picture
#
# Every rank (process, usually one per GPU) holds a full **replica** of the model and optimizer. Each step:
#
# 1. every rank takes *its own* slice of the global batch (a `DistributedSampler` hands out disjoint indices);
# 2. forward and backward run locally, giving different local gradients;
# 3. an **all-reduce** combines the ranks' gradients into their mean (DDP starts it bucket by bucket while backward is
#    still running);
# 4. every rank applies the same averaged gradient with the same optimizer, so the replicas stay identical.
#
# $$\text{global batch} = \text{micro-batch per rank} \times \text{ranks} \times \text{accumulation steps}$$
#
# The sampler shuffles with a shared seed and deals the permutation out round-robin, so two ranks with batch 2
# see exactly the four examples one rank with batch 4 would see:

# %% [markdown] lang="zh" en="f91d3a124860"
# ## 1. 一张图看懂数据并行
#
# 每个 rank（即一个进程，rank 是它的进程编号；通常每块 GPU 对应一个）都持有模型和优化器的一份完整**副本**。
# 每一步：
#
# 1. 每个 rank 取全局批次中*属于自己的*那一片（`DistributedSampler` 分发互不相交的索引）；
# 2. 前向传播和反向传播在本地运行，得到各不相同的本地梯度；
# 3. 一次**全归约**（all-reduce）把各 rank 的梯度合并为它们的平均值（DDP 在反向传播仍在进行时就逐桶启动它）；
# 4. 每个 rank 用同一个优化器应用同一个平均梯度，因此各副本始终保持一致。
#
# $$\text{global batch} = \text{micro-batch per rank} \times \text{ranks} \times \text{accumulation steps}$$
#
# 即：全局批大小 = 每个 rank 的微批次大小 × rank 数 × 梯度累积步数。
#
# 采样器用一个共享的随机种子打乱顺序，再把这个排列轮流分发给各个 rank，因此两个批大小为 2 的 rank
# 看到的，恰好就是一个批大小为 4 的 rank 会看到的那四个样本：

# %%
data = list(range(16))
one_rank = list(DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0))
two_ranks = [list(DistributedSampler(data, num_replicas=2, rank=r, shuffle=True, seed=0)) for r in (0, 1)]
print("1 rank,  batch 4:", one_rank[:4])
print("rank 0,  batch 2:", two_ranks[0][:2], "  rank 1, batch 2:", two_ranks[1][:2])
assert sorted(two_ranks[0][:2] + two_ranks[1][:2]) == sorted(one_rank[:4])
assert not set(two_ranks[0]) & set(two_ranks[1])  # disjoint shards

# %% [markdown]
# ## 2. Launching ranks from a notebook
#
# `mp.spawn` of a function defined in a notebook fails (the child processes cannot import `__main__`), and
# `!torchrun ...` never fails a cell when a rank crashes. So the training code lives in a module,
# `labkit.recipes.ddp`, and `labkit.dist.launch` runs it under `torchrun` as a subprocess:
#
# - a free `MASTER_PORT` on 127.0.0.1, `OMP_NUM_THREADS=1` per rank, logs streamed into the cell as they come
#   (prefixed `[default0]:`, `[default1]:`);
# - it returns the one JSON line rank 0 prints (`LABKIT_RESULT {...}`);
# - on a failed rank or a timeout it kills every process of the launch and raises `LaunchError` carrying the
#   failing rank's traceback.
#
# From a shell the same run is `torchrun --nproc_per_node 2 -m labkit.recipes.ddp --batch 64 --steps 12`; under
# Slurm, `srun python -m labkit.recipes.ddp ...` (the recipe reads `SLURM_PROCID`/`SLURM_NTASKS`).
#
# The problem: an MLP (136 K parameters) regressing a smooth function, AdamW, 12 steps, global batch 128. First
# 1 rank with batch 128, streaming its log:

# %% [markdown] lang="zh" en="ccb1ae9add20"
# ## 2. 在 notebook 中启动多个 rank
#
# 对 notebook 中定义的函数调用 `mp.spawn` 会失败（子进程无法导入 `__main__`），而 `!torchrun ...` 在某个 rank
# 崩溃时也从不会让单元格失败。因此训练代码放在一个模块 `labkit.recipes.ddp` 中，由 `labkit.dist.launch`
# 以子进程的方式在 `torchrun` 下运行它：
#
# - 在 127.0.0.1 上选一个空闲的 `MASTER_PORT`，每个 rank 设置 `OMP_NUM_THREADS=1`，日志一产生就实时输出到单元格中
#   （带有 `[default0]:`、`[default1]:` 前缀）；
# - 它返回 rank 0 打印的那一行 JSON（`LABKIT_RESULT {...}`）；
# - 一旦某个 rank 失败或超时，它就杀掉这次启动的所有进程，并抛出 `LaunchError`，其中带有出错 rank 的调用栈
#   （traceback）。
#
# 在 shell 中，同样的运行是 `torchrun --nproc_per_node 2 -m labkit.recipes.ddp --batch 64 --steps 12`；在 Slurm 下
# 则是 `srun python -m labkit.recipes.ddp ...`（训练脚本会读取 `SLURM_PROCID`/`SLURM_NTASKS`）。
#
# 要解决的问题：一个 MLP（136 K 个参数）回归一个平滑函数，使用 AdamW，训练 12 步，全局批大小 128。先用
# 1 个 rank、批大小 128 运行，并实时输出它的日志：

# %%
caps = device.capabilities()
DEV = "cuda" if caps.device_type == "cuda" and caps.gpu_count >= 2 else "cpu"  # 2 ranks need 2 GPUs
BASE = ["--device", DEV, "--model", "mlp", "--hidden", "256", "--depth", "3", "--steps", "12", "--seed", "0"]
work = Path(tempfile.mkdtemp(prefix="nb09-"))
print("ranks run on:", DEV, "with backend", device.dist_backend(DEV))

# %%
# NBVAL_IGNORE_OUTPUT
one = launch("labkit.recipes.ddp", nproc=1, args=[*BASE, "--batch", "128", "--log-every", "4"], timeout=180)

# %% [markdown]
# Now 2 ranks with batch 64 each, same global batch, checkpointing every 2 steps (used in section 7). This time
# quietly: the result holds everything.

# %% [markdown] lang="zh" en="bc3ecacf5078"
# 接下来用 2 个 rank，每个批大小 64，全局批大小不变，并且每 2 步保存一次检查点（第 7 节会用到）。这次不输出日志：
# 所有信息都在返回的结果里。

# %%
two = launch("labkit.recipes.ddp", nproc=2, args=[*BASE, "--batch", "64", "--ckpt-dir", str(work / "ref"),
                                                  "--ckpt-every", "2"], timeout=180, stream=False)
print("world size", two["world_size"], "| backend", two["backend"], "| global batch", two["global_batch"])
print("gradient checksums identical on both ranks: ", len(set(two["grad_checksums"])) == 1)
print("parameter checksums identical on both ranks:", len(set(two["param_checksums"])) == 1)
assert two["world_size"] == 2 and two["global_batch"] == one["global_batch"] == 128
assert two["grad_checksums"][0] == two["grad_checksums"][1] and two["param_sums"][0] == two["param_sums"][1]

# %% [markdown]
# The checksums are sha256 digests of the raw bytes: the two replicas are **bit-identical**, not merely close.
# They are printed here (their values depend on the CPU's arithmetic, theirs being equal does not):

# %% [markdown] lang="zh" en="ac5997a589fd"
# 这些校验和是原始字节的 sha256 摘要：两个副本**逐位一致**，而不只是数值接近。下面把它们打印出来
# （它们的具体值取决于 CPU 的运算细节，而两者相等这一点并不取决于此）：

# %%
# NBVAL_IGNORE_OUTPUT
print("grad  checksums:", two["grad_checksums"], "  param checksums:", two["param_checksums"])

# %% [markdown]
# And 2 ranks × batch 64 is the same training as 1 rank × batch 128, up to rounding: the averaged gradient of
# two halves is the gradient of the whole batch, summed in a different order.

# %% [markdown] lang="zh" en="aff9925e1e10"
# 而且，2 个 rank × 批大小 64 与 1 个 rank × 批大小 128 是同一个训练过程，最多相差舍入误差：两个半批次的平均梯度
# 就是整个批次的梯度，只是求和的顺序不同。

# %%
rel = max(abs(a - b) / abs(b) for a, b in zip(two["losses"], one["losses"]))
print(f"loss, step 1 → 12 (1 rank):  {one['losses'][0]:.3f} → {one['losses'][-1]:.3f}")
print(f"loss, step 1 → 12 (2 ranks): {two['losses'][0]:.3f} → {two['losses'][-1]:.3f}")
print("largest relative loss difference below 1e-5:", rel < 1e-5)
assert rel < 1e-5 and two["losses"][-1] < two["losses"][0]

# %% [markdown]
# **Scaling efficiency.** With the global batch fixed, ideal data parallelism halves the step time on 2 ranks.
# Efficiency = (measured speed-up) / (number of ranks).

# %% [markdown] lang="zh" en="c85f3075605c"
# **扩展效率。** 在全局批大小固定时，理想的数据并行在 2 个 rank 上会让每步时间减半。
# 效率 =（实测加速比）/（rank 数）。

# %%
# NBVAL_IGNORE_OUTPUT
t1 = one["timings"]["step_s_median_per_rank"][0]
t2 = max(two["timings"]["step_s_median_per_rank"])
print(f"1 rank  × batch 128: {t1 * 1e3:6.1f} ms/step")
print(f"2 ranks × batch  64: {t2 * 1e3:6.1f} ms/step   speed-up {t1 / t2:.2f}× (ideal 2×), efficiency {t1 / t2 / 2:.0%}")
print(f"this machine: {os.cpu_count()} CPU cores for the notebook kernel, torchrun and both ranks")

# %% [markdown]
# Read this figure honestly: the two ranks share this machine's CPU cores (counted in the line above) with the
# notebook kernel, `torchrun` and anything else running. On a small machine they compete for those cores and for
# memory bandwidth, and the "network" is loopback inside one machine. So the efficiency here measures CPU contention and gloo's per-call overhead on a
# 0.5 MB gradient, not a network. On GPUs the compute per rank is independent, and the question becomes whether
# the all-reduce hides behind backward (section 5 measures the all-reduce itself; notebook 11 builds the overlap by
# hand).
#
# ## 3. AMP inside DDP
#
# The recipe builds the model (same seed on every rank) and moves it to its device, builds the optimizer, wraps the
# model in `DDP` (which broadcasts rank 0's parameters and buffers), and creates the `GradScaler` (fp16 only). Then
# the loop runs.
#
# > **Common misconception** (seed 000 §4.3): create the GradScaler only after wrapping the model in DDP, or the
# > ranks' scalers may start in different states.
# >
# > **Why it is wrong:** a new GradScaler's state is a constant (`init_scale` 2¹⁶, growth tracker 0, nothing
# > measured yet: see `torch.amp.GradScaler`'s documentation), and DDP neither reads the scaler nor replaces the
# > parameters the optimizer holds. Created before or after the wrap, every rank's scaler starts the same and sees
# > the same all-reduced gradients. The fp16 run below creates rank 1's scaler first and rank 0's last, and the two
# > ranks end bit-identical.
# >
# > **What is true:** the order that matters is elsewhere. The model is on its device before `DDP(model)` (DDP
# > registers the parameters it finds there); a checkpoint is loaded on *every* rank, scaler state included (or
# > loaded on one and broadcast), before training resumes; and with FSDP2 the optimizer is built *after*
# > `fully_shard`, because sharding replaces the parameters with sharded ones (notebook 11).
#
# This is the recipe's whole training loop, `labkit.recipes.ddp.train_loop`, printed from the code that ran above
# (fault injection, timing and checkpoints sit around it, in the batch source and the caller):

# %% [markdown] lang="zh" en="59185d393019"
# 请实事求是地看待这个数字：两个 rank 与 notebook 内核、`torchrun` 以及其他正在运行的程序共用本机的 CPU 核心
# （核心数见上面那一行）。在小机器上，它们要争抢这些核心和内存带宽，而“网络”只是同一台机器内部的回环接口
# （loopback）。所以这里的效率衡量的是 CPU 争用，以及 gloo 在 0.5 MB 梯度上每次调用的开销，而不是网络。
# 在 GPU 上，各 rank 的计算互不干扰，问题就变成了全归约能否隐藏在反向传播背后（第 5 节测量全归约本身；
# notebook 11 手工实现这种重叠）。
#
# ## 3. DDP 中的 AMP
#
# 训练脚本先构建模型（每个 rank 用相同的随机种子）并把它移到设备上，再构建优化器，然后用 `DDP` 包装模型
# （DDP 会广播 rank 0 的参数和缓冲区），最后创建 `GradScaler`（只有 fp16 需要）。之后才进入训练循环。
#
# > **常见误解**（seed 000 §4.3）：GradScaler 只能在用 DDP 包装模型之后创建，否则各 rank 的 scaler
# > 可能从不同的状态起步。
# >
# > **错在哪里：** 新建的 GradScaler 的状态是一个常量（`init_scale` 为 2¹⁶，增长计数器为 0，还没有做过任何测量：
# > 见 `torch.amp.GradScaler` 的文档），而 DDP 既不读取 scaler，也不替换优化器持有的参数。无论在包装之前还是
# > 之后创建，每个 rank 的 scaler 都从相同的状态起步，看到的也是相同的、经过全归约的梯度。下面的 fp16 运行
# > 让 rank 1 最先创建 scaler、rank 0 最后创建，两个 rank 最终仍然逐位一致。
# >
# > **实际情况：** 真正要紧的顺序在别处。模型要在 `DDP(model)` 之前放到它的设备上（DDP 注册的是它在那里找到的参
# > 数）；恢复训练之前，要在*每个* rank 上加载检查点，包括 scaler 的状态（或者在一个 rank 上加载后广播出去）；而
# > 使用 FSDP2 时，优化器要在 `fully_shard` *之后*构建，因为分片会把参数替换成分片后的参数（notebook 11）。
#
# 下面是训练脚本的完整训练循环 `labkit.recipes.ddp.train_loop`，直接从上面运行过的代码中打印出来
# （故障注入、计时和检查点都在它的外围：在批次数据源和调用方中）：

# %%
print(inspect.getsource(ddp_recipe.train_loop))

# %% [markdown]
# Inside it, `precision.backward` is `scaler.scale(loss).backward()` (DDP all-reduces the *scaled* gradients
# during backward) and `precision.update` is `scaler.unscale_(opt)`, then `scaler.step(opt)` (skipped on inf/NaN)
# and `scaler.update()`: notebook 04's AMP step, written once in `labkit.precision`.
#
# Every rank has its own GradScaler. They agree only because each one looks at the *all-reduced* gradients:
# an inf on one rank becomes an inf on all ranks, so all of them skip the step and halve the scale together. If
# the scalers ever disagreed (a scaler state restored on rank 0 only, an inf check before the all-reduce), one
# rank would step while another skips, and the replicas would drift apart silently: DDP never re-broadcasts
# weights. bf16 has fp32's exponent range and needs no scaler at all.
#
# An fp16 run on 2 ranks, with micro-batch 16 and 4 accumulation steps (global batch 16 × 2 × 4 = 128 again). It
# also puts the misconception box to the test: rank 1 creates its GradScaler first, before the optimizer and the DDP
# wrap, rank 0 after the wrap. (Rank 1 also sleeps 20 ms per micro-batch, for section 6.)

# %% [markdown] lang="zh" en="3aa676927416"
# 在这个循环中，`precision.backward` 就是 `scaler.scale(loss).backward()`（DDP 在反向传播期间对*缩放后的*梯度做
# 全归约），`precision.update` 则是 `scaler.unscale_(opt)`，接着是 `scaler.step(opt)`（遇到 inf/NaN 时跳过）和
# `scaler.update()`：也就是 notebook 04 的 AMP 更新步骤，在 `labkit.precision` 中只写了一次。
#
# 每个 rank 都有自己的 GradScaler。它们之所以保持一致，只是因为每个 scaler 看到的都是*全归约之后*的梯度：
# 一个 rank 上的 inf 会变成所有 rank 上的 inf，于是所有 rank 一起跳过这一步，并一起把损失缩放因子减半。
# 一旦各 scaler 出现分歧（只在 rank 0 上恢复了 scaler 状态，或者在全归约之前就检查 inf），就会有一个 rank
# 执行更新而另一个跳过，各副本便会悄无声息地彼此偏离：DDP 从不重新广播权重。bf16 的指数范围与 fp32 相同，
# 根本不需要 scaler。
#
# 下面在 2 个 rank 上做一次 fp16 运行，微批次大小 16，累积 4 步（全局批大小又是 16 × 2 × 4 = 128）。它同时也检验了
# 上面的常见误解：rank 1 最先创建自己的 GradScaler，在构建优化器和 DDP 包装之前；rank 0 则在包装之后创建。
# （rank 1 还会在每个微批次上休眠 20 ms，供第 6 节使用。）

# %%
amp = launch("labkit.recipes.ddp", nproc=2, timeout=180, stream=False,
             args=[*BASE, "--batch", "16", "--accum", "4", "--precision", "fp16", "--scaler-first-rank", "1",
                   "--slow-rank", "1", "--slow-ms", "20"])
print("GradScaler created on each rank:", amp["scaler_created"])
print("loss scale on each rank:", amp["scaler_scales"], "| skipped steps on each rank:", amp["skipped_steps"])
print("parameters identical on both ranks:", amp["param_checksums"][0] == amp["param_checksums"][1])
print(f"final loss fp16 {amp['losses'][-1]:.2f} vs fp32 {two['losses'][-1]:.2f}")
assert amp["scaler_scales"][0] == amp["scaler_scales"][1] and amp["skipped_steps"][0] == amp["skipped_steps"][1]
assert amp["param_checksums"][0] == amp["param_checksums"][1] and amp["global_batch"] == 128
assert amp["scaler_created"] == ["after the wrap", "before the wrap"]  # the order changed nothing above

# %% [markdown]
# **Predict, then run.** That run made 12 optimizer steps, each accumulating 4 micro-batches per rank, with the
# `no_sync()` of `train_loop` above. How many gradient all-reduces did each rank issue? Record a number; section 4
# counts them.

# %% [markdown] lang="zh" en="225015eed774"
# **先预测，再运行。** 刚才那次运行做了 12 次优化器更新，每次在每个 rank 上累积 4 个微批次，并使用了上面
# `train_loop` 中的 `no_sync()`。每个 rank 发起了多少次梯度全归约？记下一个数字；第 4 节会把它们数出来。

# %%
prediction = ...
### BEGIN SOLUTION
prediction = 12
### END SOLUTION
predict("09.allreduce-count", prediction)

# %% [markdown]
# ## 4. Gradient accumulation with `no_sync()`
#
# The recipe counts the all-reduces DDP really issues (a communication hook that counts, then all-reduces):

# %% [markdown] lang="zh" en="0ae39ac0407f"
# ## 4. 用 `no_sync()` 做梯度累积
#
# 训练脚本会统计 DDP 实际发起的全归约次数（用一个通信钩子先计数，再做全归约）：

# %% tags=["workspace-clear"]
for name, r in [("fp32, accumulation 1", two), ("fp16, accumulation 4", amp)]:
    calls, mib = r["allreduce_calls"][0], r["allreduce_bytes"][0] / 2**20
    print(f"{name}: {r['micro_batches']:2d} micro-batches, {calls:2d} all-reduces, {mib:.1f} MiB all-reduced")
reveal("09.allreduce-count", amp["allreduce_calls"][0])

# %% [markdown]
# Accumulating 4 micro-batches needs only one gradient synchronisation, after the last one: one all-reduce per
# bucket, and this model's 136 193 parameters (0.54 MB of fp32 gradients) fit in one bucket (25 MiB on the first step;
# from the second step on, DDP's first bucket is capped at 1 MiB, which they still fit): one all-reduce.
# Inside `ddp.no_sync()` DDP skips the all-reduce and lets gradients add up locally: that is the `sync = ...` line of
# the loop above, and the loss is divided by `accum` so that the summed gradients are the mean over the whole step.

# %% [markdown] lang="zh" en="4dc896b65b41"
# 累积 4 个微批次只需要一次梯度同步，在最后一个微批次之后：每个桶一次全归约。这个模型的 136 193 个参数
# （0.54 MB 的 fp32 梯度）能装进一个桶（第一步的桶上限为 25 MiB；
# 从第二步起，DDP 的首个桶上限为 1 MiB，它们仍然装得下）：所以只有一次全归约。
# 在 `ddp.no_sync()` 内，DDP 跳过全归约，让梯度在本地累加：这就是上面循环中 `sync = ...` 那一行；损失要除以
# `accum`，这样累加起来的梯度才是整个更新步上的平均值。

# %%
assert amp["allreduce_calls"] == [12, 12] and amp["micro_batches"] == 48  # 48 micro-batches, 12 all-reduces
assert two["allreduce_calls"] == [12, 12] and two["allreduce_bytes"] == amp["allreduce_bytes"]

# %% [markdown]
# Same global batch, same traffic, but 4× the micro-batches per all-reduce; without `no_sync()` it would be 48
# all-reduces (`--sync-every-micro` runs that way). Gradients stay fp32 under autocast (the weights are fp32), so
# fp16 compute does not shrink the all-reduce: 136 193 parameters × 4 bytes × 12 steps.
#
# **How much of a step is communication, and what does `no_sync()` save?** Seed 000 §1.1 says that synchronising
# gradients and parameters takes 30-40 % of training time in multi-GPU jobs: the article's figure for its own jobs,
# which depends on the model, the batch and the links. `labkit.recipes.comm_share` measures it for this MLP, with
# micro-batch 16 and 4 accumulation steps as in the fp16 run (fp32 here, and no slow rank), trained twice in one
# launch: all-reducing after every micro-batch, then with `no_sync()`. It runs on CPU ranks with gloo even on a GPU
# node, because a host clock cannot time work that NCCL queues on a CUDA stream (there, use `torch.profiler` or
# Nsight Systems). Its communication hook wraps DDP's default
# all-reduce and reads the clock when DDP hands it a bucket and again when the all-reduce's future completes:

# %% [markdown] lang="zh" en="17007660d34c"
# 全局批大小相同，通信量也相同，但每次全归约对应的微批次数是原来的 4 倍；如果不用 `no_sync()`，就会有 48 次
# 全归约（`--sync-every-micro` 就是这样运行的）。在 autocast 下梯度仍是 fp32（因为权重是 fp32），所以 fp16 计算
# 并不会让全归约的数据量变小：136 193 个参数 × 4 字节 × 12 步。
#
# **一步中有多少时间花在通信上？`no_sync()` 又能省下多少？** seed 000 §1.1 说，在多 GPU 作业中，同步梯度和参数要
# 占训练时间的 30-40 %：这是文章针对它自己的作业给出的数字，它取决于模型、批大小和链
# 路。`labkit.recipes.comm_share` 针对这个 MLP 测量这一比例，微批次大小 16、累积 4 步，与 fp16 运行相同（这里用
# fp32，也没有慢 rank），在一次启动中训练两遍：先在每个微批次之后都做全归约，再使用 `no_sync()`。即使在 GPU 节点
# 上，它也在 CPU rank 上用 gloo 运行，因为主机端的时钟无法为 NCCL 排进 CUDA 流的工作计时（那种情况请用
# `torch.profiler` 或 Nsight Systems）。它的通信钩子包装了 DDP 默认的全归约，在 DDP 把一个桶交给它时读一次时钟，
# 在全归约的 future 完成时再读一次：

# %%
print(inspect.getsource(comm_share.timing_hook([], [], {})))

# %%
comm = launch("labkit.recipes.comm_share", nproc=2, timeout=180, stream=False,
              args=["--hidden", "256", "--depth", "3", "--batch", "16", "--accum", "4", "--steps", "20"])
sync, nosync = comm["sync"], comm["no_sync"]
print("all-reduces per optimizer step without no_sync():", [r["allreduces_per_step"] for r in sync],
      "| with no_sync():", [r["allreduces_per_step"] for r in nosync], "(rank 0, rank 1)")
fewer = all(b["comm_s_per_sample_min"] < a["comm_s_per_sample_min"] for a, b in zip(sync, nosync))
print("all-reduce time per sample (the least-disturbed step) lower with no_sync() on both ranks:", fewer)
print("same weights either way, up to rounding (largest difference below 1e-5):", comm["param_diff"] < 1e-5)
assert [r["allreduces_per_step"] for r in sync] == [4, 4] and [r["allreduces_per_step"] for r in nosync] == [1, 1]
assert all(b["comm_s_per_sample_min"] < a["comm_s_per_sample_min"] for a, b in zip(sync, nosync))
assert comm["param_diff"] < 1e-5

# %%
# NBVAL_IGNORE_OUTPUT
for name, runs in [("without no_sync()", sync), ("with no_sync()   ", nosync)]:
    for rank, r in enumerate(runs):
        print(f"{name} rank {rank}: step {r['step_s'] * 1e3:5.1f} ms, in all-reduce {r['comm_s'] * 1e3:5.1f} ms "
              f"({r['share']:.0%} of the step), {r['comm_s_per_sample'] * 1e6:5.1f} µs per sample")
cut = sync[0]["comm_s_per_sample_min"] / nosync[0]["comm_s_per_sample_min"]
print(f"here, rank 0: all-reduce took {sync[0]['share']:.0%} of the median step without no_sync() and "
      f"{nosync[0]['share']:.0%} with it (seed 000 §1.1 quotes 30-40 % for its GPU jobs); in the least-disturbed "
      f"step, no_sync() {'cut' if cut > 1 else 'raised'} the all-reduce time per sample {max(cut, 1 / cut):.1f}x")

# %% [markdown]
# The counts are exact: `no_sync()` leaves one all-reduce per optimizer step out of `accum`, whatever the
# machine. The share is not a constant of data parallelism: it is communication over compute, so it rises with a
# slower link or a smaller model and falls with a larger micro-batch. On this machine the "link" is loopback TCP
# between two processes sharing a few cores, and the model is tiny, so compare the shares above with each other
# rather than with the article's figure. The lesson carries over: accumulating k micro-batches under `no_sync()`
# divides the number of all-reduces (and the bytes sent per sample) by k, and the weights come out the same.
#
# ## 5. The all-reduce benchmark: algbw and busbw
#
# For a message of $S$ bytes that takes $t$ seconds, nccl-tests reports
#
# - **algbw** $= S / t$: what the caller sees;
# - **busbw** $= \text{algbw} \times 2(n-1)/n$: a ring all-reduce sends (and receives) $2(n-1)/n \cdot S$ bytes
#   per rank, so busbw is comparable with a link's hardware bandwidth whatever the number of ranks.
#
# `labkit.recipes.allreduce` measures both (slowest rank, median of repeats):

# %% [markdown] lang="zh" en="bc5b0bbec9c7"
# 计数是精确的：无论在什么机器上，`no_sync()` 都让每个优化器步的 `accum` 次全归约只剩下一次。而这个比例并不是
# 数据并行的常数：它是通信与计算之比，所以链路越慢或模型越小，它就越高；微批次越大，它就越低。在本机上，
# “链路”是两个共用几个核心的进程之间的回环 TCP，模型也很小，所以请把上面的几个比例相互比较，而不要拿去与
# 文章的数字比较。这个结论可以推广：在 `no_sync()` 下累积 k 个微批次，全归约的次数（以及每个样本发送的字节数）
# 就变为原来的 1/k，而得到的权重相同。
#
# ## 5. 全归约基准测试：algbw 与 busbw
#
# 对一个 $S$ 字节、耗时 $t$ 秒的消息，nccl-tests 报告：
#
# - **algbw** $= S / t$：调用方看到的带宽；
# - **busbw** $= \text{algbw} \times 2(n-1)/n$：环形全归约在每个 rank 上发送（并接收）$2(n-1)/n \cdot S$ 字节，
#   因此无论 rank 数是多少，busbw 都可以直接与链路的硬件带宽比较。
#
# `labkit.recipes.allreduce` 测量这两个值（取最慢的 rank，多次重复取中位数）：

# %%
bench = launch("labkit.recipes.allreduce", nproc=2, timeout=180, stream=False,
               args=["--device", DEV, "--sizes", "1K,4K,16K,64K,256K,1M,4M", "--iters", "10"])
rows = bench["rows"]
n = bench["world_size"]
assert all(r["correct"] for r in rows) and n == 2
assert all(math.isclose(r["algbw_GBps"], r["bytes"] / (r["time_us"] * 1e-6) / 1e9, rel_tol=1e-9) for r in rows)  # S/t
assert all(math.isclose(r["busbw_GBps"], r["algbw_GBps"] * 2 * (n - 1) / n, rel_tol=1e-9) for r in rows)
assert rows[-1]["busbw_GBps"] > 10 * rows[0]["busbw_GBps"]  # large messages use the link far better

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'size':>6} {'time (us)':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}")
for r in rows:
    print(f"{r['size']:>6} {r['time_us']:10.1f} {r['algbw_GBps']:11.4f} {r['busbw_GBps']:11.4f}")
peak = max(rows, key=lambda r: r["busbw_GBps"])
small = min(rows[:3], key=lambda r: r["time_us"])  # 1K-16K: latency-bound, so each takes about α
print(f"here: the fastest small message ({small['size']}) took {small['time_us']:.0f} µs, an estimate of α, the fixed "
      f"cost (at these sizes noise decides which is fastest); busbw peaked at {peak['size']} "
      f"({peak['busbw_GBps']:.2f} GB/s){' and fell after it' if peak is not rows[-1] else ''}")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.loglog([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], "o-")
ax.set(xlabel="message size (bytes)", ylabel="busbw (GB/s)", title=f"all-reduce, {bench['world_size']} ranks, {bench['backend']}")
ax.grid(True, which="both", alpha=0.3)
plt.show()

# %% [markdown]
# A simple model explains the curve: $t(S) \approx \alpha + \frac{2(n-1)}{n}\frac{S}{B}$.
#
# - **Latency-bound** (small $S$): $\alpha$ dominates (with gloo on loopback, the line above says how large: often
#   hundreds of microseconds or more, since each call crosses Python, gloo's bookkeeping and TCP), $t$ hardly changes with $S$,
#   and busbw grows in proportion to $S$. This is why DDP packs gradients into ~25 MiB buckets instead of
#   all-reducing each tensor. NCCL over NVLink brings $\alpha$ down to microseconds.
# - **Bandwidth-bound** (large $S$): busbw approaches the link bandwidth $B$. On a shared CPU it may also *drop*
#   for the largest messages (they no longer fit in cache, and the two ranks compete for memory bandwidth), which
#   is why the line above says where it peaked here.
#
# What the hardware changes is $\alpha$ and $B$. GPUs in one node connected by NVLink reach busbw of hundreds
# of GB/s with NCCL; across nodes one InfiniBand NDR port carries 400 Gb/s = 50 GB/s, and RDMA (GPUDirect) keeps
# the CPU out of the path. Loopback TCP between two processes on this machine is a fraction of a GB/s. On a
# GPU node, run this cell's launch there, or nccl-tests' `all_reduce_perf -b 8 -e 1G -f 2 -g <gpus>`.
#
# ## 6. NCCL: the knobs, the topology, slow ranks and timeouts
#
# On a GPU node the backend is NCCL (the device gate picks it). The environment variables worth knowing:
#
# | variable | what it does | typical use |
# |---|---|---|
# | `NCCL_DEBUG=INFO` | logs version, transports, rings/trees at start-up | **first thing to set** when something is slow or hangs; look for `NET/IB` vs `NET/Socket` and `P2P`/`SHM` lines |
# | `NCCL_IB_DISABLE=1` | forbids InfiniBand/RoCE, falls back to TCP sockets | a debugging switch; left in a job script (often copied from a container recipe) it silently makes multi-node runs many times slower |
# | `NCCL_SOCKET_IFNAME` | which interface NCCL's own sockets and bootstrap use | pin it (`ib0`, `eth0`) when a wrong one (`docker0`, `lo`) makes NCCL's setup hang or fail; it does not affect torch's c10d store, which connects to `MASTER_ADDR:MASTER_PORT` (a hang *before* NCCL starts is that address not being reachable from every node) |
# | `NCCL_IB_HCA` | which InfiniBand adapters (and ports) to use, e.g. `mlx5_0:1,mlx5_1:1` | nodes with several HCAs, or to keep NCCL off a storage HCA |
# | `NCCL_P2P_DISABLE=1` | forbids direct GPU-to-GPU copies (NVLink/PCIe P2P) inside a node | debugging hangs or corruption suspected on P2P; a big slowdown if left on |
# | `NCCL_PROTO` | force `LL`, `LL128` or `Simple` | experiments only, like `NCCL_ALGO` |
# | `NCCL_DEBUG_SUBSYS` | narrows `NCCL_DEBUG` output (`INIT,NET`, `COLL`, ...) | keep INFO logs readable |
# | `TORCH_NCCL_ASYNC_ERROR_HANDLING` | what the watchdog does when a collective fails or times out: 1 aborts the communicators and tears the process down, 2 only aborts the communicators, 3 tears down without cleaning up first. torch's own default is 3, but `torchrun` exports 1 to its ranks when the variable is unset, so the runs of this notebook would get 1 | so a hang becomes an error instead of a stuck job (0 turns that off) |
# | `TORCH_NCCL_BLOCKING_WAIT=1` | collectives block the CPU and raise on timeout | debugging: the timeout surfaces in the calling line |
# | `TORCH_NCCL_DUMP_ON_TIMEOUT=1` | on a timeout, dump the flight recorder of recent collectives per rank (with `TORCH_FR_BUFFER_SIZE`, formerly `TORCH_NCCL_TRACE_BUFFER_SIZE`) | find which rank stopped at which collective |
# | `NCCL_ALGO` | force `Ring`, `Tree`, ... | experiments only; NCCL's tuner picks per message size |
# | `NCCL_BUFFSIZE` | bytes of each channel's buffer per peer (default 4 MiB; 1 MiB when NCCL finds an ARM host CPU) | larger can help bandwidth, costs GPU memory |
# | `NCCL_MAX_NCHANNELS`, `NCCL_MIN_NCHANNELS` | bound the number of channels NCCL spreads a collective over (explained below); deprecated since NCCL 2.17 in favour of `NCCL_MAX_CTAS`, `NCCL_MIN_CTAS` | leave NCCL's choice; a cap frees GPU blocks for compute at some bandwidth |
# | `NCCL_NSOCKS_PERTHREAD`, `NCCL_SOCKET_NTHREADS` | sockets per helper thread and helper threads per connection of the socket (TCP) transport between nodes (threads ≤ 16, product ≤ 64) | only when the nodes talk TCP (no InfiniBand/RoCE): more streams fill a fast Ethernet link; unused on IB, and between GPUs joined by NVLink |
#
# `nvidia-smi topo -m` prints how GPUs and NICs are connected: `NV#` (NVLink, # links), `PIX`/`PXB` (PCIe
# switches), `PHB` (through the CPU's PCIe host bridge), `NODE`/`SYS` (across host bridges or CPU sockets).
# NCCL uses NVLink where it exists; `SYS` between a GPU and its NIC means traffic crosses sockets.
#
# > **Common misconception** (seed 002 §4.2): `NCCL_BUFFSIZE` defaults to 1 MB, so raising it to 4 MB (with
# > `NCCL_ALGO=Tree`) speeds up all-reduce.
# >
# > **Why it is wrong:** on an x86 host such as the article's 8×A100 server, NCCL's default buffer is already 4 MiB
# > (4194304 bytes) per channel and peer, so the suggested value changes nothing. 1 MiB is NCCL's default only when it finds an
# > ARM host CPU (its source: `DEFAULT_BUFFSIZE` 4 MiB, `DEFAULT_BUFFSIZE_ARM` 1 MiB), a choice NVIDIA made for
# > those machines. And forcing `NCCL_ALGO` takes away NCCL's own choice of ring or tree for each message size.
# >
# > **What is true:** leave both at their defaults until a measurement (nccl-tests' `all_reduce_perf`, or section
# > 5's benchmark) shows a gain. NCCL's documentation of its environment variables lists the defaults, and
# > `NCCL_DEBUG=INFO` prints what NCCL chose. A larger buffer costs GPU memory on every channel.
#
# > **Common misconception** (seed 000 §4.3): communication overlaps computation once NCCL is tuned for it, by
# > setting `NCCL_BUFFSIZE` and `NCCL_MAX_NCHANNELS`.
# >
# > **Why it is wrong:** neither variable decides *when* an all-reduce starts. NCCL runs a collective when the
# > framework calls it; `NCCL_BUFFSIZE` sizes the staging buffers of each channel and `NCCL_MAX_NCHANNELS` caps how
# > many channels one collective is spread over (both below). The overlap comes from DDP: it groups the gradients
# > into buckets (`bucket_cap_mb`: 25 MiB by default, and then a first bucket of 1 MiB, from the second step on) and
# > starts each bucket's all-reduce from an autograd hook as soon as all of that bucket's gradients exist, while
# > backward goes on computing the earlier layers (on a GPU, NCCL runs on its own CUDA stream beside the backward
# > kernels).
# >
# > **What is true:** overlap is decided by the buckets and by the order in which gradients become ready. The cell
# > below shows it on this machine's CPU ranks: with one bucket the all-reduce starts only once every gradient exists;
# > with `bucket_cap_mb=0.1` the same MLP has several buckets, and the first all-reduce starts while some parameters
# > still have no gradient. To change overlap, change `bucket_cap_mb` (and check a profiler trace), not NCCL's buffers.
#
# The same launch as in section 4 trained the MLP for 3 steps with `bucket_cap_mb=25` and with `0.1`. Its hook
# noted, for each bucket of the last step, how many of the model's 8 parameter tensors still had no gradient
# when the bucket's all-reduce started (DDP builds its buckets anew after the first step, in the order the gradients
# came):

# %% [markdown] lang="zh" en="92c2202a6f80"
# 一个简单的模型就能解释这条曲线：$t(S) \approx \alpha + \frac{2(n-1)}{n}\frac{S}{B}$。
#
# - **延迟受限**（$S$ 较小）：$\alpha$ 占主导（在回环接口上用 gloo 时，它有多大见上面那一行：往往在几百微秒以上，
#   因为每次调用都要经过 Python、gloo 的簿记工作和 TCP），$t$ 几乎不随 $S$ 变化，busbw 与 $S$ 成正比增长。
#   这就是 DDP 把梯度打包成约 25 MiB 的桶、而不是对每个张量分别做全归约的原因。在 NVLink 上使用 NCCL，
#   $\alpha$ 可以降到微秒级。
# - **带宽受限**（$S$ 较大）：busbw 逼近链路带宽 $B$。在共享的 CPU 上，对最大的几个消息 busbw 还可能*下降*
#   （它们已装不进缓存，两个 rank 还要争抢内存带宽），所以上面那一行会说明它在这里的峰值出现在哪个大小。
#
# 硬件改变的是 $\alpha$ 和 $B$。同一节点内由 NVLink（GPU 直连链路）连接的 GPU，使用 NCCL 时 busbw 可达数百
# GB/s；跨节点时，一个 InfiniBand（无限带宽网络）NDR 端口的速率是 400 Gb/s = 50 GB/s，而 RDMA（远程直接内存访
# 问，这里指 GPUDirect）让 CPU 不必经手数据。本机上两个进程之间的回环 TCP 只有零点几 GB/s。若有 GPU 节点，请在节
# 点上运行本单元格中的这次启动，或者运行 nccl-tests 的 `all_reduce_perf -b 8 -e 1G -f 2 -g <gpus>`。
#
# ## 6. NCCL：参数、拓扑、慢 rank 与超时
#
# 在 GPU 节点上，后端是 NCCL（由设备门控选定）。值得了解的环境变量：
#
# | 变量 | 作用 | 典型用法 |
# |---|---|---|
# | `NCCL_DEBUG=INFO` | 在启动时记录版本、传输方式、环/树 | 变慢或挂起时**首先要设置的变量**；查看 `NET/IB` 与 `NET/Socket` 以及 `P2P`/`SHM` 这几行 |
# | `NCCL_IB_DISABLE=1` | 禁用 InfiniBand/RoCE，退回到 TCP socket | 一个调试开关；如果遗留在作业脚本里（往往是从容器配置中抄来的），它会悄无声息地让多节点运行慢上许多倍 |
# | `NCCL_SOCKET_IFNAME` | NCCL 自己的 socket 和引导（bootstrap）使用哪个网络接口 | 当用错的接口（`docker0`、`lo`）导致 NCCL 初始化挂起或失败时，把它固定下来（`ib0`、`eth0`）；它不影响 torch 的 c10d store，后者连接的是 `MASTER_ADDR:MASTER_PORT`（在 NCCL 启动*之前*就挂起，说明这个地址并非每个节点都能访问） |
# | `NCCL_IB_HCA` | 使用哪些 InfiniBand 网卡（及端口），例如 `mlx5_0:1,mlx5_1:1` | 节点有多块 HCA 时，或者为了让 NCCL 避开存储网络所用的 HCA |
# | `NCCL_P2P_DISABLE=1` | 禁止节点内 GPU 之间的直接拷贝（NVLink/PCIe P2P） | 怀疑 P2P 引起挂起或数据损坏时用于调试；如果一直开着，会大幅变慢 |
# | `NCCL_PROTO` | 强制使用 `LL`、`LL128` 或 `Simple` | 仅用于实验，与 `NCCL_ALGO` 一样 |
# | `NCCL_DEBUG_SUBSYS` | 缩小 `NCCL_DEBUG` 的输出范围（`INIT,NET`、`COLL`……） | 让 INFO 日志保持可读 |
# | `TORCH_NCCL_ASYNC_ERROR_HANDLING` | 集合通信失败或超时时，看门狗（watchdog）做什么：1 中止通信器并终止进程，2 只中止通信器，3 不先清理就直接终止进程。torch 自身的默认值是 3，但在该变量未设置时，`torchrun` 会给它的各个 rank 导出 1，所以本 notebook 中的运行得到的是 1 | 让挂起变成报错，而不是一个卡住的作业（设为 0 则关闭此功能） |
# | `TORCH_NCCL_BLOCKING_WAIT=1` | 集合通信阻塞 CPU，并在超时时抛出异常 | 调试用：超时会在发起调用的那一行暴露出来 |
# | `TORCH_NCCL_DUMP_ON_TIMEOUT=1` | 超时时按 rank 转储最近若干次集合通信的飞行记录器（flight recorder）（需配合 `TORCH_FR_BUFFER_SIZE`，旧名 `TORCH_NCCL_TRACE_BUFFER_SIZE`） | 找出哪个 rank 停在了哪个集合通信上 |
# | `NCCL_ALGO` | 强制使用 `Ring`、`Tree`…… | 仅用于实验；NCCL 的调优器会按消息大小选择 |
# | `NCCL_BUFFSIZE` | 每个通道对每个对端的缓冲区字节数（默认 4 MiB；NCCL 发现主机 CPU 是 ARM 时为 1 MiB） | 调大可能有助于提高带宽，但会多占显存 |
# | `NCCL_MAX_NCHANNELS`、`NCCL_MIN_NCHANNELS` | 限定 NCCL 把一个集合通信分散到多少个通道上（见下文）；自 NCCL 2.17 起已弃用，改用 `NCCL_MAX_CTAS`、`NCCL_MIN_CTAS` | 保留 NCCL 的选择；设上限可以为计算腾出 GPU 线程块，代价是损失一些带宽 |
# | `NCCL_NSOCKS_PERTHREAD`、`NCCL_SOCKET_NTHREADS` | 节点之间 socket（TCP）传输的每个辅助线程的 socket 数，以及每个连接的辅助线程数（线程数 ≤ 16，乘积 ≤ 64） | 仅当节点之间走 TCP（没有 InfiniBand/RoCE）时才有用：更多的流能填满高速以太网链路；在 IB 上以及由 NVLink 连接的 GPU 之间都不使用 |
#
# `nvidia-smi topo -m` 打印 GPU 与网卡之间的连接方式：`NV#`（NVLink，# 为链路条数）、`PIX`/`PXB`（经过 PCIe 交换
# 芯片）、`PHB`（经过 CPU 的 PCIe 主桥）、`NODE`/`SYS`（跨越多个主桥或多个 CPU 插槽）。NCCL 在有 NVLink 的地方就
# 用 NVLink；GPU 与其网卡之间显示 `SYS`，意味着流量要跨越 CPU 插槽（socket）。
#
# > **常见误解**（seed 002 §4.2）：`NCCL_BUFFSIZE` 默认是 1 MB，所以把它调大到 4 MB（再配合 `NCCL_ALGO=Tree`）
# > 就能加快全归约。
# >
# > **错在哪里：** 在 x86 主机上（比如文章中的 8×A100 服务器），NCCL 的默认缓冲区本来就是每个通道、每个对端 4 MiB
# > （4194304 字节），所以文章建议的值什么也没有改变。只有当 NCCL 发现主机 CPU 是 ARM 时，1 MiB 才是它的默认值
# > （见其源码：`DEFAULT_BUFFSIZE` 为 4 MiB，`DEFAULT_BUFFSIZE_ARM` 为 1 MiB），这是 NVIDIA 为那类机器做的选择。
# > 而强制设置 `NCCL_ALGO`，则剥夺了 NCCL 针对每种消息大小自行选择环或树的能力。
# >
# > **实际情况：** 在测量（nccl-tests 的 `all_reduce_perf`，或第 5 节的基准测试）显示出收益之前，两者都保持默认
# > 值。NCCL 关于环境变量的文档列出了各个默认值，`NCCL_DEBUG=INFO` 会打印 NCCL 实际的选择。更大的缓冲区会在每个
# > 通道上多占用显存。
#
# > **常见误解**（seed 000 §4.3）：只要为此把 NCCL 调好，即设置 `NCCL_BUFFSIZE` 和 `NCCL_MAX_NCHANNELS`，
# > 通信就会与计算重叠。
# >
# > **错在哪里：** 这两个变量都不决定全归约*何时*开始。NCCL 在框架调用集合通信时才运行它；`NCCL_BUFFSIZE`
# > 决定每个通道中转缓冲区的大小，`NCCL_MAX_NCHANNELS` 限制一个集合通信最多分散到多少个通道上（两者见下文）。
# > 重叠来自 DDP：它把梯度分组放进桶里（`bucket_cap_mb`：默认 25 MiB，另外从第二步起还有一个 1 MiB 的首个桶），
# > 一旦某个桶的梯度全部算出，就从 autograd 钩子中启动这个桶的全归约，而反向传播则继续计算更靠前的层
# > （在 GPU 上，NCCL 在自己的 CUDA 流上运行，与反向传播的内核并行）。
# >
# > **实际情况：** 重叠由桶以及梯度就绪的顺序决定。下面的单元格在本机的 CPU rank 上展示这一点：只有一个桶时，
# > 全归约要等所有梯度都算出来才开始；设 `bucket_cap_mb=0.1` 时，同一个 MLP 有好几个桶，第一次全归约开始时，
# > 还有一些参数没有梯度。要改变重叠，就改 `bucket_cap_mb`（并查看性能分析器的 trace），而不是改 NCCL 的缓冲区。
#
# 第 4 节中的同一次启动还分别用 `bucket_cap_mb=25` 和 `0.1` 把这个 MLP 训练了 3 步。它的钩子为最后一步的每个桶
# 记录下：这个桶的全归约开始时，模型的 8 个参数张量中还有多少个没有梯度（DDP 在第一步之后，会按梯度到达的顺序
# 重新构建它的桶）：

# %%
for b in comm["buckets"]:
    first, last = b["buckets"][0], b["buckets"][-1]
    print(f"bucket_cap_mb={b['bucket_cap_mb']:g}: {len(b['buckets'])} bucket(s); the first all-reduce started with "
          f"{first['missing']} of {b['params']} tensors still without a gradient, the last with {last['missing']}")
for one, many in comm["buckets_per_rank"]:  # both ranks: the same buckets, the same order
    assert len(one["buckets"]) == 1 and one["buckets"][0]["missing"] == 0  # one bucket waits for every gradient
    assert len(many["buckets"]) > 1 and many["buckets"][0]["missing"] > 0 == many["buckets"][-1]["missing"]

# %%
# NBVAL_IGNORE_OUTPUT
for b in comm["buckets"]:
    spans = ", ".join(f"#{k['index']} {k['start_ms']:.2f}-{k['end_ms']:.2f}" for k in b["buckets"])
    print(f"bucket_cap_mb={b['bucket_cap_mb']:g}: backward() returned after {b['backward_ms']:.2f} ms; "
          f"each bucket's all-reduce, in ms from the start of backward(): {spans}")

# %% [markdown]
# The line above gives, for each bucket, when its all-reduce ran, counted from the start of `backward()` (which
# returns only after every bucket's all-reduce has finished). With several buckets, bucket 0's all-reduce is on the
# wire while backward is still computing the first layers' gradients. On a CPU the two share the cores, so little
# is won; on a GPU the all-reduce runs on the links while the GPU computes, and a step can hide most of it.
#
# **Channels and `NCCL_MAX_NCHANNELS`.** NCCL cuts every collective into *channels*. A channel is one ring (or tree)
# through all the ranks, driven on each GPU by one CUDA block with its own buffers (`NCCL_BUFFSIZE` bytes per peer
# for the Simple protocol), and it carries its own slice of the message. Running several channels at once is how NCCL
# fills several NVLinks or network adapters together: the `Channel 00/16` lines of the log below come from a
# communicator with 16. NCCL picks the number from the topology; `NCCL_MIN_NCHANNELS` and `NCCL_MAX_NCHANNELS` only
# bound it. Capping it leaves more of the GPU to compute kernels that run at the same time (fewer blocks busy with
# communication, fewer buffers), and costs bandwidth on large messages. It starts no all-reduce earlier, so it
# creates no overlap.
#
# > **Common misconception** (seed 002 §8.2): for multi-node training, set `NCCL_SOCKET_NTHREADS` to the number of
# > CPU cores.
# >
# > **Why it is wrong:** the variable belongs to NCCL's socket transport, the TCP path between nodes: it is the
# > number of helper threads per network connection, from 1 to 16 (NCCL lowers a larger value to 16 with a warning),
# > and `NCCL_SOCKET_NTHREADS` × `NCCL_NSOCKS_PERTHREAD` may not exceed 64 sockets. Over InfiniBand or RoCE, which the
# > same section recommends (ibverbs), NCCL does not use it at all, nor between GPUs of one node. A node's core count
# > as its value would be cut to 16 threads per connection, each taking CPU time from the data loader.
# >
# > **What is true:** on InfiniBand leave it alone. On nodes linked only by Ethernet, NCCL's defaults depend on the
# > platform (its documentation: 1 thread with 1 socket in general, more on AWS and Google Cloud network adapters;
# > recent versions start no helper thread at all on a generic adapter); the same documentation suggests trying 4 of
# > each on a 100 Gb/s network. Measure with nccl-tests before keeping
# > any value.

# %% [markdown] lang="zh" en="af2774d8cc9b"
# 上面那一行给出了每个桶的全归约运行的时间段，从 `backward()` 开始时算起（`backward()` 要等每个桶的全归约都完成后
# 才返回）。有多个桶时，桶 0 的全归约已经在传输中，而反向传播还在计算最前面几层的梯度。在 CPU 上，两者共用核心，
# 所以收益不大；在 GPU 上，全归约在链路上进行，同时 GPU 在计算，一步中的大部分通信都可以被隐藏起来。
#
# **通道与 `NCCL_MAX_NCHANNELS`。** NCCL 把每个集合通信切分到多个*通道*（channel）上。一个通道是穿过所有 rank 的
# 一个环（或一棵树），在每块 GPU 上由一个 CUDA 线程块驱动，拥有自己的缓冲区（Simple 协议下，每个对端
# `NCCL_BUFFSIZE` 字节），并承载消息中属于自己的那一片。NCCL 正是靠同时运行多个通道，来同时填满多条 NVLink
# 或多块网卡：下文日志中的 `Channel 00/16` 行就来自一个有 16 个通道的通信器。NCCL 根据拓扑选择通道数；
# `NCCL_MIN_NCHANNELS` 和 `NCCL_MAX_NCHANNELS` 只是给它设定上下界。设上限会把更多 GPU 资源留给同时运行的
# 计算内核（忙于通信的线程块更少，缓冲区也更少），代价是大消息的带宽。它不会让任何全归约更早开始，
# 因此也不会带来重叠。
#
# > **常见误解**（seed 002 §8.2）：多节点训练时，应把 `NCCL_SOCKET_NTHREADS` 设为 CPU 核心数。
# >
# > **错在哪里：** 这个变量属于 NCCL 的 socket 传输，即节点之间的 TCP 路径：它是每个网络连接的辅助线程数，
# > 取值为 1 到 16（更大的值会被 NCCL 降到 16 并发出警告），并且 `NCCL_SOCKET_NTHREADS` × `NCCL_NSOCKS_PERTHREAD`
# > 不得超过 64 个 socket。在 InfiniBand 或 RoCE 上（文章同一节推荐的正是 ibverbs），NCCL 完全不用它，
# > 在节点内的 GPU 之间也不用。若把节点的核心数设为它的值，会被截成每个连接 16 个线程，每个线程都要从数据加载器
# > 那里抢占 CPU 时间。
# >
# > **实际情况：** 在 InfiniBand 上不要动它。在只用以太网互连的节点上，NCCL 的默认值因平台而异（据其文档：一般是
# > 1 个线程、1 个 socket，在 AWS 和 Google Cloud 的网卡上更多；较新的版本在普通网卡上根本不启动辅助线程）；同一
# > 份文档建议在 100 Gb/s 网络上把两者都试设为 4。无论保留什么取值，都先用 nccl-tests 测量。

# %%
# NBVAL_IGNORE_OUTPUT
if device.is_cuda():
    print("NCCL version:", device.nccl_version())
    print(subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=True).stdout)
else:
    print("No CUDA device: torch here has no NCCL, and there is no nvidia-smi. See the example below.")

# %% [markdown]
# *An explained example* (a typical 4-GPU node with one NIC; illustrative, not measured on this machine):
#
# ```
#         GPU0  GPU1  GPU2  GPU3  NIC0   CPU Affinity  NUMA Affinity
# GPU0     X    NV4   NV4   NV4   PXB    0-31          0
# GPU1    NV4    X    NV4   NV4   PXB    0-31          0
# GPU2    NV4   NV4    X    NV4   SYS    32-63         1
# GPU3    NV4   NV4   NV4    X    SYS    32-63         1
# ```
#
# Every GPU pair has 4 NVLinks (fast all-reduce inside the node). GPU0/1 reach the NIC through PCIe switches,
# GPU2/3 only across the CPU sockets (`SYS`): inter-node traffic from them is slower, and NCCL's rings are
# built around that.
#
# **Reading an `NCCL_DEBUG=INFO` log.** Every line starts with `host:pid:tid [cuda device]`. A job of 2 nodes × 8
# GPUs prints, per rank, something like this at its first collective (an illustrative excerpt in NCCL 2.2x's format,
# shortened, not measured here):
#
# ```
# gpu01:81234:81234 [0] NCCL INFO Bootstrap : Using ib0:10.10.0.11<0>                          (1)
# gpu01:81234:81234 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
# gpu01:81234:81290 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.10.0.11<0>   (2)
# gpu01:81234:81290 [0] NCCL INFO Using network IB
# gpu01:81234:81290 [0] NCCL INFO comm 0x55d0c8a04f20 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0   (3)
# gpu01:81234:81290 [0] NCCL INFO Channel 00/16 :    0   7   6   5   4   3   2   1   8  15  14  13  12  11  10   9   (4)
# gpu01:81234:81290 [0] NCCL INFO Channel 00/0 : 0[0] -> 7[7] via P2P/CUMEM/read                 (5)
# gpu01:81234:81290 [0] NCCL INFO Channel 00/0 : 9[1] -> 0[0] [receive] via NET/IB/0/GDRDMA     (6)
# gpu01:81234:81290 [0] NCCL INFO Connected all rings
# gpu01:81234:81290 [0] NCCL INFO Connected all trees
# gpu01:81234:81290 [0] NCCL INFO comm 0x55d0c8a04f20 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 7000 commId 0x8a4f3c21d7e0b915 - Init COMPLETE   (7)
# ```
#
# 1. The interface of NCCL's own bootstrap sockets. `docker0`, `lo` or an address the other node cannot reach here is
#    the classic hang at start-up: set `NCCL_SOCKET_IFNAME`.
# 2. The inter-node transport. `NET/IB` with the adapters it chose is what you want on an InfiniBand or RoCE cluster.
#    `NET/Socket : Using [0]eth0...` followed by `Using network Socket` means TCP: a multi-node job many times slower,
#    usually because of `NCCL_IB_DISABLE=1`, a container without the RDMA devices, or a missing driver.
# 3. The layout NCCL sees: ranks, nodes, ranks per node. A wrong `nNodes` means the launcher placed the ranks
#    differently than you think.
# 4. One ring per channel, as rank numbers. Here it goes round the 8 GPUs of node 1, crosses to node 2 and comes back:
#    two crossings per ring, as a ring should have. More channels spread traffic over more links and adapters.
#    In this ring rank 0 sends to rank 7 (the next line) and receives from rank 9, across the network (line 6).
# 5. Inside a node: `P2P` (NVLink or PCIe peer-to-peer, the fast path). `via SHM` means the GPUs could not talk
#    directly and the data is staged through host memory: expected when P2P is disabled or impossible (some
#    virtual machines, containers without IPC, PCIe ACS), and a large slowdown on a node that has NVLink.
# 6. Between nodes: `NET/IB/<adapter>`, with `GDRDMA` when the adapter reads and writes GPU memory directly
#    (GPUDirect RDMA). Without it the data passes through host memory: slower, but it works.
# 7. `Init COMPLETE` on every rank means the communicator exists. A job that prints it on some ranks and never on
#    others is stuck in initialisation (a rank that never arrived, a firewall); a job that prints it everywhere and
#    then hangs is stuck in a collective: look for the rank that stopped calling (the flight recorder of
#    `TORCH_NCCL_DUMP_ON_TIMEOUT=1` with `TORCH_FR_BUFFER_SIZE` > 0, or `TORCH_DISTRIBUTED_DEBUG=DETAIL`, as
#    in notebook 13).
#
# > **Common misconception** (seed 002 §4.2, seed 000 §6): on one server with 8 A100 GPUs, NCCL's socket and
# > InfiniBand settings tune the all-reduce: seed 002 sets `NCCL_NSOCKS_PERTHREAD=4`, seed 000 exports
# > `NCCL_IB_DISABLE=0` and `NCCL_IB_TIMEOUT=22` for its one 8×A100 node.
# >
# > **Why it is wrong:** inside one node NCCL moves data between GPUs with its intra-node transports: P2P over
# > NVLink or PCIe, or SHM through host memory (line 5 of the log above). The network transports, InfiniBand
# > (`NCCL_IB_*`) and TCP sockets (`NCCL_NSOCKS_PERTHREAD`, `NCCL_SOCKET_NTHREADS`), are for traffic to other nodes.
# > NCCL sends traffic between two GPUs of one node through a network adapter only where it computes that the way
# > through the adapter is faster (some PCIe-only servers; `NCCL_NET_DISABLE_INTRA=1` forbids it), never where
# > NVLink joins the GPUs. `NCCL_IB_DISABLE=0` is the default anyway, and
# > `NCCL_IB_TIMEOUT` sets how long an InfiniBand connection waits before it reports an error (22: 17 s per try,
# > about 2 minutes with the default 7 retries), not how fast it sends.
# >
# > **What is true:** on an 8-GPU NVLink/NVSwitch server (SXM GPUs) the all-reduce runs over NVLink, and the socket
# > and IB settings change nothing there; read `NCCL_DEBUG=INFO`'s `via P2P` lines and `nvidia-smi topo -m` instead.
# > Those settings start to matter with the second node.
#
# > **Common misconception** (seed 000 §5.4): when a multi-GPU job communicates slowly, NCCL has taken TCP where it
# > should have taken NVLink.
# >
# > **Why it is wrong:** between GPUs of one node, NVLink's fallback is not TCP. Without NVLink peer access NCCL uses
# > PCIe peer-to-peer (`P2P` in the log) or, when the GPUs cannot reach each other directly (P2P disabled, some
# > virtual machines and containers, PCIe ACS), shared host memory (`via SHM`). NCCL sends intra-node traffic through
# > a network adapter only when SHM is switched off too (`NCCL_SHM_DISABLE=1`), or on a PCIe server where it
# > computes that the way through an adapter is faster; never where NVLink joins the GPUs. TCP (`NET/Socket`) is
# > NCCL's fallback between nodes, instead of InfiniBand.
# >
# > **What is true:** name the path from the log: `via P2P` (good), `via SHM` (a slow node-internal path: find out
# > why P2P is off), `NET/Socket` (multi-node traffic on TCP: check `NCCL_IB_DISABLE` and the RDMA devices).
#
# > **Common misconception** (seed 000 §2.3): NCCL relays messages through shared memory by default.
# >
# > **Why it is wrong:** SHM is a fallback, not NCCL's default path. Between GPUs of one node NCCL prefers P2P
# > (NVLink, else PCIe peer-to-peer) and takes SHM only when P2P is impossible, disabled, or not allowed over that
# > distance, e.g. across CPU sockets (NCCL's documentation of `NCCL_P2P_LEVEL` and `NCCL_SHM_DISABLE`); between nodes it uses InfiniBand or RoCE (with GPUDirect RDMA where the
# > adapter can reach GPU memory), else TCP sockets, and shared memory plays no part there. Nor does InfiniBand need
# > to be switched on, as the same paragraph of the article says: NCCL uses it whenever it finds an RDMA adapter
# > (`NCCL_IB_DISABLE` defaults to 0), and falls back to TCP only when it finds none or is told not to use it.
# >
# > **What is true:** on a healthy NVLink node the log says `via P2P` for every channel; `via SHM` there is the
# > symptom to chase (line 5 of the log above).
#
# **The slow-rank effect.** A collective finishes only when the *last* rank arrives, so every step runs at the
# pace of the slowest rank (a busy node, a thermally throttled GPU, a rank that also writes logs). In the fp16 run
# of section 3, rank 1 slept 20 ms per micro-batch, 80 ms per step; rank 0 did not sleep. Their step times:

# %% [markdown] lang="zh" en="a6c53de731f2"
# *一个讲解示例*（一个带一块网卡的典型 4-GPU 节点；仅作示意，并非在本机上测得）：
#
# ```
#         GPU0  GPU1  GPU2  GPU3  NIC0   CPU Affinity  NUMA Affinity
# GPU0     X    NV4   NV4   NV4   PXB    0-31          0
# GPU1    NV4    X    NV4   NV4   PXB    0-31          0
# GPU2    NV4   NV4    X    NV4   SYS    32-63         1
# GPU3    NV4   NV4   NV4    X    SYS    32-63         1
# ```
#
# 每一对 GPU 之间都有 4 条 NVLink（节点内的全归约很快）。GPU0/1 经过 PCIe 交换芯片连到网卡，
# GPU2/3 则只能跨越 CPU 插槽（`SYS`）：从它们发出的跨节点流量更慢，NCCL 会围绕这一点来构建它的环。
#
# **读懂 `NCCL_DEBUG=INFO` 日志。** 每一行都以 `host:pid:tid [cuda device]` 开头。一个 2 节点 × 8 GPU 的作业，每
# 个 rank 在第一次集合通信时会打印类似下面的内容（一段示意性的摘录，采用 NCCL 2.2x 的格式，有删节，并非在这里测
# 得）：
#
# ```
# gpu01:81234:81234 [0] NCCL INFO Bootstrap : Using ib0:10.10.0.11<0>                          (1)
# gpu01:81234:81234 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
# gpu01:81234:81290 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.10.0.11<0>   (2)
# gpu01:81234:81290 [0] NCCL INFO Using network IB
# gpu01:81234:81290 [0] NCCL INFO comm 0x55d0c8a04f20 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0   (3)
# gpu01:81234:81290 [0] NCCL INFO Channel 00/16 :    0   7   6   5   4   3   2   1   8  15  14  13  12  11  10   9   (4)
# gpu01:81234:81290 [0] NCCL INFO Channel 00/0 : 0[0] -> 7[7] via P2P/CUMEM/read                 (5)
# gpu01:81234:81290 [0] NCCL INFO Channel 00/0 : 9[1] -> 0[0] [receive] via NET/IB/0/GDRDMA     (6)
# gpu01:81234:81290 [0] NCCL INFO Connected all rings
# gpu01:81234:81290 [0] NCCL INFO Connected all trees
# gpu01:81234:81290 [0] NCCL INFO comm 0x55d0c8a04f20 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 7000 commId 0x8a4f3c21d7e0b915 - Init COMPLETE   (7)
# ```
#
# 1. NCCL 自己的引导（bootstrap）socket 所用的网络接口。如果这里是 `docker0`、`lo`，或者另一个节点访问不到的地址，
#    这就是典型的启动时挂起：设置 `NCCL_SOCKET_IFNAME`。
# 2. 节点间的传输方式。在 InfiniBand 或 RoCE 集群上，你想看到的是 `NET/IB` 以及它选中的网卡。
#    `NET/Socket : Using [0]eth0...` 之后跟着 `Using network Socket` 表示走的是 TCP：多节点作业会慢上许多倍，
#    原因通常是 `NCCL_IB_DISABLE=1`、容器里没有 RDMA 设备，或者缺少驱动。
# 3. NCCL 看到的布局：rank 数、节点数、每个节点的 rank 数。`nNodes` 不对，说明启动器放置各 rank 的方式与你以为的
#    不同。
# 4. 每个通道一个环，用 rank 编号表示。这里的环绕过节点 1 的 8 块 GPU，跨到节点 2，再绕回来：每个环跨节点两次，
#    环本来就该如此。通道越多，流量就分散到越多的链路和网卡上。在这个环中，rank 0 发送给 rank 7（见下一行日志），
#    并通过网络从 rank 9 接收（标记为 (6) 的那一行）。
# 5. 节点内部：`P2P`（NVLink 或 PCIe 点对点，快速路径）。`via SHM` 表示 GPU 之间无法直接通信，数据要经过主机内存
#    中转：在 P2P 被禁用或无法使用时（某些虚拟机、没有 IPC 的容器、PCIe ACS），这是预料之中的；而在有 NVLink 的
#    节点上，这意味着大幅变慢。
# 6. 节点之间：`NET/IB/<adapter>`，当网卡直接读写 GPU 显存时（GPUDirect RDMA，GPU 直连 RDMA）带有 `GDRDMA`。
#    没有它，数据要经过主机内存：更慢，但能用。
# 7. 每个 rank 上都出现 `Init COMPLETE`，表示通信器已经建立。如果作业在一些 rank 上打印了它、在另一些 rank 上
#    始终没有打印，那就是卡在了初始化（某个 rank 从未到达、防火墙）；如果每个 rank 都打印了它然后挂起，那就是
#    卡在了某个集合通信中：找出那个不再发起调用的 rank（借助 `TORCH_NCCL_DUMP_ON_TIMEOUT=1` 并设
#    `TORCH_FR_BUFFER_SIZE` > 0 时的飞行记录器，或者 `TORCH_DISTRIBUTED_DEBUG=DETAIL`，做法同 notebook 13）。
#
# > **常见误解**（seed 002 §4.2，seed 000 §6）：在一台装有 8 块 A100 GPU 的服务器上，NCCL 的 socket 和 InfiniBand
# > 设置可以调优全归约：seed 002 设置了 `NCCL_NSOCKS_PERTHREAD=4`，seed 000 为它那唯一的一个 8×A100 节点导出了
# > `NCCL_IB_DISABLE=0` 和 `NCCL_IB_TIMEOUT=22`。
# >
# > **错在哪里：** 在一个节点内部，NCCL 用节点内的传输方式在 GPU 之间搬运数据：经 NVLink 或 PCIe 的 P2P，或经主
# > 机内存的 SHM（上面日志中标记为 (5) 的那一行）。网络传输方式，即 InfiniBand（`NCCL_IB_*`）和 TCP
# > socket（`NCCL_NSOCKS_PERTHREAD`、`NCCL_SOCKET_NTHREADS`），是为与其他节点之间的流量准备的。只有当 NCCL 算出
# > 经网卡走更快时（某些只有 PCIe 的服务器；`NCCL_NET_DISABLE_INTRA=1` 可以禁止这样做），它才会让同一节点内两块
# > GPU 之间的流量经过网卡；GPU 之间由 NVLink 相连时，绝不会这样做。`NCCL_IB_DISABLE=0` 本来就是默认值；而
# > `NCCL_IB_TIMEOUT` 设置的是 InfiniBand 连接在报错之前等待多久（22：每次尝试 17 s，按默认的 7 次重试约为 2 分
# > 钟），而不是发送得有多快。
# >
# > **实际情况：** 在 8-GPU 的 NVLink/NVSwitch 服务器（SXM GPU）上，全归约走的是 NVLink，socket 和 IB 设置在那里
# > 什么也改变不了；应该去读 `NCCL_DEBUG=INFO` 中的 `via P2P` 行和 `nvidia-smi topo -m` 的输出。
# > 有了第二个节点，这些设置才开始起作用。
#
# > **常见误解**（seed 000 §5.4）：多 GPU 作业通信很慢时，是因为 NCCL 走了 TCP，而本该走 NVLink。
# >
# > **错在哪里：** 在同一节点的 GPU 之间，NVLink 的后备方案不是 TCP。没有 NVLink 对等访问时，NCCL 使用 PCIe 点对点
# > （日志中的 `P2P`）；当 GPU 之间无法直接互访时（P2P 被禁用、某些虚拟机和容器、PCIe ACS），则使用共享的主机内存
# > （`via SHM`）。只有在 SHM 也被关闭时（`NCCL_SHM_DISABLE=1`），或者在 NCCL 算出经网卡走更快的 PCIe 服务器上，
# > NCCL 才会让节点内的流量经过网卡；GPU 之间由 NVLink 相连时，绝不会这样。TCP（`NET/Socket`）是 NCCL 在节点之间
# > 代替 InfiniBand 的后备方案。
# >
# > **实际情况：** 从日志中认出所走的路径：`via P2P`（正常）、`via SHM`（一条较慢的节点内路径：查明 P2P 为什么没
# > 有开启）、`NET/Socket`（多节点流量走了 TCP：检查 `NCCL_IB_DISABLE` 和 RDMA 设备）。
#
# > **常见误解**（seed 000 §2.3）：NCCL 默认通过共享内存中转消息。
# >
# > **错在哪里：** SHM 是后备方案，而不是 NCCL 的默认路径。在同一节点的 GPU 之间，NCCL 优先使用 P2P（NVLink，其
# > 次是 PCIe 点对点），只有当 P2P 无法实现、被禁用，或者在那种距离上不被允许时（例如跨越 CPU 插槽），才使用
# > SHM（见 NCCL 文档中关于 `NCCL_P2P_LEVEL` 和 `NCCL_SHM_DISABLE` 的说明）；在节点之间，它使用 InfiniBand 或
# > RoCE（网卡能访问 GPU 显存时配合 GPUDirect RDMA），否则使用 TCP socket，共享内存在那里根本不起作用。文章同一
# > 段还说 InfiniBand 需要手动开启，这也不对：只要找到 RDMA 网卡，NCCL 就会使用它（`NCCL_IB_DISABLE` 默认为
# > 0），只有在找不到、或者被告知不要使用时，才退回到 TCP。
# >
# > **实际情况：** 在健康的 NVLink 节点上，日志中每个通道都显示 `via P2P`；在那里出现 `via SHM`，才是需要追查的
# > 症状（上面日志中标记为 (5) 的那一行）。
#
# **慢 rank（掉队进程）效应。** 集合通信只有在*最后一个* rank 到达时才会完成，所以每一步都以最慢 rank 的节奏运行
# （一个繁忙的节点、一块因过热而降频的 GPU、一个还要写日志的 rank）。在第 3 节的 fp16 运行中，rank 1 每个微批次
# 休眠 20 ms，即每步 80 ms；rank 0 没有休眠。它们的每步时间：

# %%
# NBVAL_IGNORE_OUTPUT
step_ms = [t * 1e3 for t in amp["timings"]["step_s_median_per_rank"]]
slept = amp["accum"] * 20  # ms per step: 20 ms per micro-batch
print(f"median step time: rank 0 {step_ms[0]:.1f} ms, rank 1 {step_ms[1]:.1f} ms (rank 1's sleep alone: {slept} ms)")
assert min(step_ms) >= slept  # rank 0 too: it waits for rank 1 in every all-reduce

# %% [markdown]
# Rank 0 never sleeps, yet its steps cannot be shorter than rank 1's 80 ms of sleep (the cell asserts it): it waits
# inside the all-reduce.
#
# **Barrier misuse.** Collectives (all-reduce, broadcast, `barrier()`) must be called by *every* rank, in the same
# order. `if rank == 0: save(); dist.barrier()` leaves rank 0 waiting for partners that never come, or pairs its
# barrier with someone else's next collective. The right pattern, used by the recipe: rank 0 saves, then *all*
# ranks call `barrier()`. And barriers that are not needed only add slow-rank waits.
#
# **Timeouts.** A rank that never arrives makes the others wait until the process-group timeout (PyTorch's
# default: 10 minutes for NCCL, 30 for gloo), after which NCCL's watchdog aborts the job with an error instead of
# hanging forever. Set `timeout=` in `init_process_group` (the recipe's `--pg-timeout`) shorter when debugging.
# Here rank 1 sleeps 6 s and the timeout is 2 s:

# %% [markdown] lang="zh" en="8405eb0737b6"
# rank 0 从不休眠，但它的每步时间不可能短于 rank 1 的 80 ms 休眠时间（单元格对此做了断言）：它在全归约中等待。
#
# **屏障同步的误用。** 集合通信（全归约、广播、`barrier()`）必须由*每个* rank 按相同的顺序调用。
# `if rank == 0: save(); dist.barrier()` 会让 rank 0 等待永远不会到来的同伴，或者让它的屏障与别的 rank 的
# 下一个集合通信配成一对。正确的模式（训练脚本用的就是它）：rank 0 保存，然后*所有* rank 都调用 `barrier()`。
# 另外，多余的屏障只会增加等待慢 rank 的时间。
#
# **超时。** 一个始终不到达的 rank 会让其他 rank 一直等到进程组超时（PyTorch 的默认值：NCCL 为 10 分钟，gloo 为
# 30 分钟），之后 NCCL 的看门狗会以报错终止作业，而不是永远挂起。调试时，把 `init_process_group` 中的
# `timeout=`（训练脚本的 `--pg-timeout`）设短一些。这里 rank 1 休眠 6 s，而超时为 2 s：

# %%
try:
    launch("labkit.recipes.ddp", nproc=2, timeout=120, stream=False,
           args=[*BASE, "--steps", "2", "--slow-rank", "1", "--slow-ms", "6000", "--pg-timeout", "2"])
except LaunchError as err:
    timeout_err = err
said = (timeout_err.rank_traceback + timeout_err.log).lower()
print("failed rank:", timeout_err.rank, "| it reports a timeout:", any(w in said for w in ("timed out", "timeout")))
assert timeout_err.rank == 0 and any(w in said for w in ("timed out", "timeout"))

# %% [markdown]
# ## 7. When a rank dies: a clean error, then resume
#
# `--crash-rank 1 --crash-step 3` makes rank 1 raise at the start of step 3. The run checkpoints every 2 steps
# (rank 0 writes atomically, then all ranks meet at a barrier), so step 2's checkpoint exists when it dies.
# The launcher raises within seconds, with rank 1's traceback, and no process is left behind:

# %% [markdown] lang="zh" en="fcd0e4a65250"
# ## 7. 当一个 rank 崩溃时：先得到干净的报错，再恢复训练
#
# `--crash-rank 1 --crash-step 3` 让 rank 1 在第 3 步开始时抛出异常。这次运行每 2 步保存一次检查点
# （rank 0 以原子方式写入，然后所有 rank 在一个屏障处会合），所以在它崩溃时，第 2 步的检查点已经存在。
# 启动器在几秒内就抛出异常，附带 rank 1 的调用栈，并且不留下任何进程：

# %%
crash_args = [*BASE, "--batch", "64", "--ckpt-dir", str(work / "crash"), "--ckpt-every", "2"]
try:
    launch("labkit.recipes.ddp", nproc=2, args=[*crash_args, "--crash-rank", "1", "--crash-step", "3"],
           timeout=180, stream=False)
except LaunchError as err:
    crash = err
print(f"rank {crash.rank} failed:", crash.rank_traceback.splitlines()[-1])
print("processes left behind:", crash.leftover)
assert crash.rank == 1 and "injected crash" in crash.rank_traceback and crash.leftover == []

# %% [markdown]
# Resuming loads model, optimizer (and scaler) state and the step number from the last checkpoint; the
# `DistributedSampler` is set to the right epoch and skips the batches already seen. On the CPU in fp32 every
# operation is deterministic, so the resumed run must end in **exactly** the weights of the uninterrupted run
# from section 2:

# %% [markdown] lang="zh" en="b258a1cd45a6"
# 恢复训练时，从最后一个检查点加载模型、优化器（以及 scaler）的状态和步数；`DistributedSampler` 被设到正确的
# epoch，并跳过已经看过的批次。在 CPU 上用 fp32 时，每个运算都是确定性的，所以恢复后的运行必须**精确地**得到与第
# 2 节中未中断的运行相同的权重：

# %%
resumed = launch("labkit.recipes.ddp", nproc=2, args=[*crash_args, "--resume"], timeout=180, stream=False)
a = train.load_checkpoint(work / "ref" / train.CHECKPOINT_NAME)["model"]
b = train.load_checkpoint(work / "crash" / train.CHECKPOINT_NAME)["model"]
bitwise = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
print("resumed from step", resumed["resumed_from"], "| final weights bitwise equal:", bitwise)
assert resumed["resumed_from"] == 2 and all(torch.allclose(a[k], b[k]) for k in a)
if DEV == "cpu":  # fp32 on the CPU: exactly the same weights and losses
    assert bitwise and resumed["losses"] == two["losses"]

# %% [markdown]
# (On a GPU, bitwise equality additionally needs deterministic kernels and the same NCCL algorithm choice; in
# fp16 the scaler state must come back too, which the checkpoint includes.)
#
# ## 8. Exercises
#
# **8.1** A job runs on 4 nodes × 8 GPUs, with micro-batch 16 per GPU and 4 gradient-accumulation steps. What is
# the global batch per optimizer step?

# %% [markdown] lang="zh" en="1eb9f87d1e64"
# （在 GPU 上，要做到逐位一致，还需要确定性的内核以及相同的 NCCL 算法选择；在 fp16 下，scaler 的状态也必须恢复，
# 检查点中包含了它。）
#
# ## 8. 练习
#
# **8.1** 一个作业运行在 4 个节点 × 8 块 GPU 上，每块 GPU 的微批次大小为 16，梯度累积 4 步。每次优化器更新的
# 全局批大小是多少？

# %%
answer = ...
### BEGIN SOLUTION
answer = 16 * (4 * 8) * 4
### END SOLUTION
check("09.global-batch", answer)

# %% [markdown]
# **8.2** The recipe was tuned with learning rate 3e-4 at global batch 256. With the linear scaling rule, which
# learning rate goes with the global batch of 8.1?
#
# (The linear rule was established for SGD with momentum, with a warm-up; for Adam and AdamW a square-root rule is
# often closer, and at large batches neither holds without re-tuning. Take the rule's answer as the starting point
# of a learning-rate sweep, not as the answer.)

# %% [markdown] lang="zh" en="01e6374bb4e2"
# **8.2** 训练脚本是在全局批大小 256、学习率 3e-4 下调好的。按照线性缩放规则，8.1 的全局批大小应该配多大的学习率？
#
# （线性规则是针对带动量的 SGD、并配合预热（warm-up）建立的；对 Adam 和 AdamW，平方根规则往往更接近，而在很大的
# 批大小下，不重新调参的话两者都不成立。请把这个规则给出的值当作学习率扫描的起点，而不是答案。）

# %%
answer = ...
### BEGIN SOLUTION
answer = 3e-4 * (16 * 32 * 4) / 256
### END SOLUTION
check("09.lr-scaling", answer)

# %% [markdown]
# **8.3** Write `busbw(algbw, n)`: the bus bandwidth nccl-tests reports for an all-reduce over `n` ranks, given
# the measured algbw. (An 8-GPU all-reduce with algbw 120 GB/s should come out at 210 GB/s.)

# %% [markdown] lang="zh" en="f813e0842370"
# **8.3** 写出 `busbw(algbw, n)`：给定实测的 algbw，返回 nccl-tests 对 `n` 个 rank 上的全归约所报告的总线带宽（bus
# bandwidth）。（一个 algbw 为 120 GB/s 的 8-GPU 全归约，结果应为 210 GB/s。）

# %%
def busbw(algbw, n):
    ...
    ### BEGIN SOLUTION
    return algbw * 2 * (n - 1) / n
    ### END SOLUTION


check("09.busbw", busbw)

# %% [markdown]
# **8.4** Three ranks need 100, 100 and 160 ms of compute per step, and the all-reduce takes 20 ms once all have
# arrived. How long is a step, in ms?

# %% [markdown] lang="zh" en="fb749b010472"
# **8.4** 三个 rank 每步分别需要 100、100 和 160 ms 的计算，所有 rank 到齐之后，全归约需要 20 ms。一步需要多长时
# 间，以 ms 计？

# %%
answer = ...
### BEGIN SOLUTION
answer = max(100, 100, 160) + 20
### END SOLUTION
check("09.slow-rank", answer)

# %% [markdown]
# **8.5 Debug: the all-reduce that was not an average.** Hand-written data parallelism (without DDP) averages the
# gradients itself after backward. `all_reduce` is `torch.distributed.all_reduce` in a real run; here
# `simulate_all_reduce` runs the function once per simulated rank, in threads, with an `all_reduce` that does what
# torch's does to each rank's tensor. Rank 0's gradient is [1, 2], rank 1's is [3, 6]:

# %% [markdown] lang="zh" en="b84c600b70c0"
# **8.5 调试：不是平均值的全归约。** 手写的数据并行（不用 DDP）在反向传播之后自己对梯度求平均。`all_reduce` 在真
# 实运行中是 `torch.distributed.all_reduce`；这里的 `simulate_all_reduce` 在多个线程中为每个模拟的 rank 各运行一
# 次该函数，所用的 `all_reduce` 对每个 rank 的张量所做的事与 torch 的完全相同。rank 0 的梯度是 [1, 2]，rank 1 的
# 是 [3, 6]：

# %%
def average_gradients(params, world_size, all_reduce):
    for p in params:
        all_reduce(p.grad)

after = simulate_all_reduce(average_gradients, [[torch.tensor([1.0, 2.0])], [torch.tensor([3.0, 6.0])]])
print("after the 'average':", [r[0].tolist() for r in after], "  the mean is [2.0, 4.0]")
assert [r[0].tolist() for r in after] == [[4.0, 8.0]] * 2  # the sum, on every rank: twice the mean

# %% [markdown]
# Write a fixed `average_gradients(params, world_size, all_reduce)` that leaves every rank with the mean gradient.
# The check runs it on 2, 3 and 4 simulated ranks.

# %% [markdown] lang="zh" en="bb6652573536"
# 写一个修正后的 `average_gradients(params, world_size, all_reduce)`，让每个 rank 最终都得到平均梯度。
# 检查程序会在 2、3 和 4 个模拟 rank 上运行它。

# %%
def average_gradients(params, world_size, all_reduce):
    ...
    ### BEGIN SOLUTION
    for p in params:
        all_reduce(p.grad)
        p.grad /= world_size
    ### END SOLUTION


check("09.average-grads", average_gradients)

# %% [markdown]
# ## Summary
#
# - Data parallelism = replicas + disjoint data shards + an all-reduce of gradients. The global batch is
#   micro-batch × ranks × accumulation; 2 ranks × b trains like 1 rank × 2b, up to rounding.
# - An all-reduce sums; the mean needs a division by the number of ranks. DDP does it first: each gradient is
#   scaled by 1/world size, then the all-reduce sums the scaled gradients (notebook 11's DDP by hand does the same).
#   Dividing after the sum, as 8.5's reference solution does, gives the same mean up to rounding; dividing first
#   also keeps an fp16 sum from overflowing.
# - Launch ranks from a notebook as a `torchrun` subprocess with a timeout (`labkit.dist.launch`), never `!cmd`
#   or `mp.spawn`; a failed rank must become an exception with its traceback, and no process may survive.
# - With AMP: one GradScaler per rank, created before or after the DDP wrap alike (its initial state is a constant);
#   the scalers agree because they see all-reduced gradients. bf16 needs no scaler.
# - `no_sync()` turns accumulation steps into local additions: one synchronisation (one all-reduce per bucket) per
#   optimizer step.
# - Communication's share of a step is a property of the job (model, batch, links), not a constant: measure it. The
#   overlap of all-reduce with backward comes from DDP's buckets (`bucket_cap_mb`), not from NCCL's buffer or channel
#   settings; `NCCL_IB_*` and the socket settings only matter between nodes.
# - busbw = algbw × 2(n-1)/n makes all-reduce speed comparable with link bandwidth; small messages are
#   latency-bound, large ones bandwidth-bound.
# - NCCL: `NCCL_DEBUG=INFO` first, beware a stray `NCCL_IB_DISABLE=1`, read `nvidia-smi topo -m`. The slowest rank
#   sets the pace; collectives must be called by all ranks; timeouts turn hangs into errors.
# - Checkpoint atomically on rank 0 plus a barrier, and a crashed run resumes to the same weights: bitwise on the
#   CPU in fp32 (as here), to rounding on GPUs.
#
# Next, notebook 10 shards the optimizer state, gradients and parameters across ranks with DeepSpeed ZeRO.

# %% [markdown] lang="zh" en="14a33e649b8a"
# ## 小结
#
# - 数据并行 = 模型副本 + 互不相交的数据分片 + 梯度的全归约。全局批大小 = 微批次大小 × rank 数 × 累积步数；
#   2 个 rank × b 与 1 个 rank × 2b 的训练效果相同，最多相差舍入误差。
# - 全归约做的是求和；要得到平均值，还需要除以 rank 数。DDP 先做除法：每个梯度先乘以 1/world size（进程总数），
#   再由全归约对缩放后的梯度求和（notebook 11 中手写的 DDP 也是这样做的）。像 8.5 的参考答案那样在求和之后再除，
#   得到的平均值只在舍入上有差别；先除还能避免 fp16 的求和上溢。
# - 在 notebook 中，要以带超时的 `torchrun` 子进程来启动各个 rank（`labkit.dist.launch`），绝不要用 `!cmd` 或
#   `mp.spawn`；失败的 rank 必须变成一个带有其调用栈的异常，而且不能留下任何进程。
# - 配合 AMP 时：每个 rank 一个 GradScaler，在 DDP 包装之前或之后创建都一样（它的初始状态是常量）；各 scaler 保
#   持一致，是因为它们看到的是全归约之后的梯度。bf16 不需要 scaler。
# - `no_sync()` 把累积步变成本地累加：每个优化器步只做一次同步（每个桶一次全归约）。
# - 通信在一步中所占的比例是作业本身的属性（模型、批大小、链路），而不是常数：要去测量。全归约与反向传播的重叠来
#   自 DDP 的桶（`bucket_cap_mb`），而不是 NCCL 的缓冲区或通道设置；`NCCL_IB_*` 和 socket 设置只在节点之间才起作
#   用。
# - busbw = algbw × 2(n-1)/n 让全归约的速度可以与链路带宽相比较；小消息受延迟限制，大消息受带宽限制。
# - NCCL：首先设置 `NCCL_DEBUG=INFO`，当心遗留的 `NCCL_IB_DISABLE=1`，读懂 `nvidia-smi topo -m`。最慢的 rank 决
#   定节奏；集合通信必须由所有 rank 调用；超时让挂起变成报错。
# - 检查点由 rank 0 以原子方式保存，再加一次屏障同步，这样崩溃的运行就能恢复到相同的权重：在 CPU 上用 fp32 时逐
#   位一致（如本 notebook 所示），在 GPU 上则在舍入误差范围内一致。
#
# 接下来，notebook 10 用 DeepSpeed ZeRO 把优化器状态、梯度和参数分片到各个 rank 上。
