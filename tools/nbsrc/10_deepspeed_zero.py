# %% [markdown]
# # 10 · DeepSpeed and ZeRO: sharding model states across ranks
#
# **Objectives**
# - explain what ZeRO stages 1, 2 and 3 shard, and what communication each one adds, per micro-batch and per step;
# - build a DeepSpeed config with `labkit.zero.config`, read it key by key, and catch a bad one early;
# - run stages 0-3 in bf16 on 2 ranks, check that they train the same model, and measure each rank's model-state
#   bytes exactly, against the prediction of `labkit.memory` (notebook 06);
# - watch fp16's dynamic loss scale inside DeepSpeed, and relate it to the GradScaler of notebook 03;
# - measure what optimizer offload costs, size the seeds' 13B reference setup, and decide when to leave DDP.
#
# **Prerequisites:** notebooks 03 (loss scaling), 06 (where memory goes) and 09 (DDP, launching ranks).
#
# **Estimated time:** 65 min
#
# Everything below runs for real: DeepSpeed 0.19 on its CPU accelerator, 2 processes talking over gloo. On a GPU
# node the same recipe runs on CUDA with NCCL. One exception, labelled where it appears: where DeepSpeed refuses fp16
# on this CPU, section 4's fp16 trace is a run recorded on a CPU that has fp16.

# %% [markdown] lang="zh" en="16a16a8c4972"
# # 10 · DeepSpeed 与 ZeRO：把模型状态分片到各个 rank 上
#
# **学习目标**
# - 说明 ZeRO 阶段 1、2、3 各自对什么做分片，以及每个阶段在每个微批次、每一步中额外带来哪些通信；
# - 用 `labkit.zero.config` 构建 DeepSpeed 配置，逐个键读懂它，并及早发现有问题的配置；
# - 在 2 个 rank 上以 bf16 运行阶段 0-3，验证它们训练出的是同一个模型，并精确测量每个 rank 的模型状态字节数，
#   与 `labkit.memory`（notebook 06）的预测对照；
# - 观察 DeepSpeed 内部 fp16 的动态损失缩放因子，并把它与 notebook 03 的 GradScaler 对应起来；
# - 测量优化器卸载（offload）的代价，估算 seed 文章中 13B 参考配置的显存需求，并判断何时该离开 DDP。
#
# **前置知识：** notebook 03（损失缩放）、06（显存都去哪儿了）和 09（DDP、启动各个 rank）。
#
# **预计用时：** 65 分钟
#
# 下面的一切都是真实运行的：DeepSpeed 0.19 跑在它的 CPU 加速器上，2 个进程通过 gloo 通信。在 GPU 节点上，
# 同一套训练脚本会在 CUDA 上用 NCCL 运行。只有一个例外，出现的地方都有标注：如果 DeepSpeed 在这台 CPU 上拒绝 fp16，
# 第 4 节的 fp16 轨迹就取自一次在支持 fp16 的 CPU 上录制的运行。

# %%
# %matplotlib inline
# %load_ext labkit
import inspect
import json
import os

import matplotlib.pyplot as plt
import torch

from labkit import device, memory, models, plots, scaling, zero
from labkit.check import check, predict, reveal
from labkit.dist import launch
from labkit.exercises.nb10 import CONFIG_SETUP
from labkit.recipes import zero as zero_recipe

# %% [markdown]
# ## 1. ZeRO in one table
#
# Data parallelism (notebook 09) replicates everything on every rank. With bf16/fp16 mixed precision and Adam,
# a rank holds, per parameter: 2 bytes of 16-bit weights, 2 bytes of 16-bit gradients, and K = 12 bytes of
# optimizer side (4 for the fp32 master weights, 8 for Adam's two moments): **16 bytes per parameter**, 16Ψ
# bytes for Ψ parameters. Most of it is the optimizer side, which every rank updates identically: wasted
# replication. ZeRO (the *Zero Redundancy Optimizer*) partitions it over the N data-parallel ranks:
#
# | stage | sharded over N ranks | bytes per rank | traffic per rank per step, in elements |
# |---|---|---|---|
# | 0 (DDP) | nothing | (2 + 2 + 12)Ψ | all-reduce of gradients = reduce-scatter + all-gather: **2Ψ** |
# | 1 | optimizer states + master weights | (2 + 2)Ψ + 12Ψ/N | reduce-scatter grads, all-gather updated params: **2Ψ** |
# | 2 | + gradients | 2Ψ + (2 + 12)Ψ/N | the same **2Ψ**; each rank keeps only its slice of the reduced gradients |
# | 3 | + parameters | (2 + 2 + 12)Ψ/N | + gathering parameters for forward and again for backward: **3Ψ** |
#
# Units: the memory column is in bytes; the traffic column counts **elements** (parameters' worth of numbers) that
# each rank sends through a ring, for large N (a ring all-reduce moves 2(N−1)/N of its payload per rank, an
# all-gather or a reduce-scatter (N−1)/N). Multiply by the bytes per element (2 for bf16/fp16 gradients and
# weights) to get bytes. Notebook 11 uses the same convention and also lists the payload.
#
# Each rank *owns* 1/N of the parameters: it keeps their master weights and Adam states, receives their summed
# gradients (a reduce-scatter), updates them, and hands the new 16-bit weights to the others (an all-gather).
# With one micro-batch per step, stages 1 and 2 therefore cost no more communication than DDP. Stage 3 keeps even
# the 16-bit weights sharded and gathers each layer just before it is used, costing 1.5x the traffic. The table
# counts one micro-batch per optimizer step; section 3 measures what gradient accumulation changes. **Offload** (ZeRO-Offload) goes
# further: the optimizer side lives in CPU RAM, and the optimizer step runs on the CPU.
#
# Our model is the tiny GPT of notebook 04. Here is what `labkit.memory` predicts per rank for 2 ranks:

# %% [markdown] lang="zh" en="16f238579cb7"
# ## 1. 一张表看懂 ZeRO
#
# 数据并行（notebook 09）在每个 rank 上复制全部内容。使用 bf16/fp16 混合精度和 Adam 时，每个 rank 为每个参数持有：
# 2 字节的 16 位权重、2 字节的 16 位梯度，以及 K = 12 字节的优化器部分（4 字节 fp32 主权重，
# 8 字节 Adam 的两个动量）：**每参数 16 字节**，Ψ 个参数就是 16Ψ 字节。其中大部分是优化器部分，
# 而每个 rank 对它的更新完全相同：这些副本纯属浪费。ZeRO（*Zero Redundancy Optimizer*，零冗余优化器）
# 把它们划分到 N 个数据并行的 rank 上：
#
# | 阶段 | 在 N 个 rank 上分片的内容 | 每个 rank 的字节数 | 每个 rank 每步的通信量（以元素计） |
# |---|---|---|---|
# | 0（DDP） | 无 | (2 + 2 + 12)Ψ | 梯度的全归约（AllReduce）= 归约分散（ReduceScatter）+ 全收集（AllGather）：**2Ψ** |
# | 1 | 优化器状态 + 主权重 | (2 + 2)Ψ + 12Ψ/N | 对梯度做归约分散，对更新后的参数做全收集：**2Ψ** |
# | 2 | + 梯度 | 2Ψ + (2 + 12)Ψ/N | 同样是 **2Ψ**；每个 rank 只保留归约后梯度中属于自己的那一片 |
# | 3 | + 参数 | (2 + 2 + 12)Ψ/N | 再加上前向和反向各收集一次参数：**3Ψ** |
#
# 单位：显存一列以字节计；通信量一列统计的是每个 rank 经环形发送的**元素**个数（相当于多少个参数的数值），
# 取 N 较大时的值：环形全归约中每个 rank 发送其有效载荷的 2(N−1)/N，全收集或归约分散则是 (N−1)/N。
# 乘以每个元素的字节数（bf16/fp16 的梯度和权重为 2）即得字节数。notebook 11 采用同样的约定，并且还列出了有效载荷本身。
#
# 每个 rank *负责* 1/N 的参数：它保存这些参数的主权重和 Adam 状态，接收它们求和后的梯度（一次归约分散），更新它们，
# 再把新的 16 位权重交给其他 rank（一次全收集）。因此，每步只有一个微批次时，阶段 1 和 2 的通信并不比 DDP 多。
# 阶段 3 连 16 位权重也保持分片，每一层即将使用时才把它收集起来，通信量是 DDP 的 1.5 倍。
# 这张表按每个优化器步一个微批次计数；梯度累积会带来什么变化，第 3 节会实测。**卸载**（ZeRO-Offload）更进一步：
# 优化器部分放在 CPU 内存中，优化器更新也在 CPU 上执行。
#
# 我们的模型是 notebook 04 中的小型 GPT。下面是 `labkit.memory` 对 2 个 rank 时每个 rank 显存的预测：

# %%
model = models.TinyGPT(vocab_size=12, seq_len=12, seed=0)
n_params = models.count_parameters(model)
pred = {s: memory.model_state_bytes(n_params, "bf16-master", "adamw", stage=s, world_size=2) for s in range(4)}
print(f"TinyGPT: {n_params:,} parameters")
for s, p in pred.items():
    print(f"ZeRO-{s}: {p.device_total:>9,} bytes per rank = {p.device_total / n_params:5.2f} bytes/param  {p.device}")

# %% [markdown]
# ## 2. A DeepSpeed config, built and explained
#
# DeepSpeed is driven by a JSON config. `labkit.zero.config` builds one from a few arguments and checks it
# first. The batch triple must satisfy `train_batch_size = micro_batch × gradient_accumulation_steps × ranks`;
# give two and the third is derived. `explain` prints what every key does:

# %% [markdown] lang="zh" en="63b8cf0e1c54"
# ## 2. 构建并解读一份 DeepSpeed 配置
#
# DeepSpeed 由一份 JSON 配置驱动。`labkit.zero.config` 根据几个参数构建这份配置，并先对它做检查。
# 批大小三元组必须满足 `train_batch_size = micro_batch × gradient_accumulation_steps × ranks`；给出其中两个，
# 第三个就会自动推导出来。`explain` 会打印每个键的作用：

# %%
cfg = zero.config(2, "bf16", micro_batch=8, grad_accum=2, world_size=2, reduce_bucket_size=32768)
print(zero.explain(cfg))

# %% [markdown]
# An inconsistent batch is caught with a message that says what to change, before DeepSpeed starts (DeepSpeed's
# own check also explains itself, but only from inside `deepspeed.initialize`, after the process group is up):

# %% [markdown] lang="zh" en="d6292e46377f"
# 不一致的批大小会在 DeepSpeed 启动之前就被发现，报错信息会说明该改什么（DeepSpeed 自己的检查也会给出解释，
# 但只能在 `deepspeed.initialize` 内部、进程组建立之后才报出来）：

# %%
try:
    zero.config(2, "bf16", micro_batch=8, grad_accum=2, world_size=2, train_batch_size=64)
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# ## 3. Stages 0-3 in bf16 on 2 ranks
#
# `labkit.recipes.zero` trains the tiny GPT on the `reverse` task with each config. Each `stage:dtype[:offload]`
# entry of `--runs` gets a **fresh model and a fresh DeepSpeed engine** inside the same two processes, which
# saves the process start-up per run. Every run uses the same seed, data and AdamW (`torch_adam`, so no C++
# compile). Two more runs ride along in the same launch: stage 2 with the optimizer offloaded to the CPU (section
# 5), and stage 2 in fp16 (section 4). The fp16 run is included only where fp16 computes **and** DeepSpeed's
# accelerator accepts it: DeepSpeed's CPU accelerator asks oneDNN, which says yes only on CPUs with AVX512-FP16 or
# AMX-FP16, while torch's autocast computes fp16 (slowly) on any CPU. Elsewhere only the bf16 runs go.
#
# Rank 0 reports the losses, each rank's checksum of the final parameters, and each rank's **exact model-state
# bytes**. These are counted from the storages of the tensors the engine and its optimizer hold, taken after the
# backward of a micro-batch while gradients are being accumulated. This is where stages 1 and 2 differ.
#
# Two set-up details are handled by the recipe:
# - DeepSpeed's CPU accelerator would first JIT-compile a shared-memory all-reduce (a C++ build, once per machine). The
#   recipe marks that op unavailable (`--shm-comm off`), so all collectives go through gloo, as DDP's do, and no
#   `/dev/shm` buffers are created.
# - At stage 0, DeepSpeed's bf16 wrapper steps the optimizer once with zero gradients to allocate Adam's states.
#   With torch's AdamW, that advances Adam's step counter to 1 before training. Every bias correction is then
#   one step off, the first update is 0.74x as large, and stage 0 drifts away from the other stages. The recipe
#   resets that counter and reports it (`adam_prestep`); `--keep-prestep` shows DeepSpeed as is.

# %% [markdown] lang="zh" en="33e702b389ad"
# ## 3. 在 2 个 rank 上以 bf16 运行阶段 0-3
#
# `labkit.recipes.zero` 用每份配置在 `reverse` 任务上训练小型 GPT。`--runs` 中的每一项 `stage:dtype[:offload]`
# 都会在同样的两个进程中得到一个**全新的模型和全新的 DeepSpeed 引擎**，这样每次运行都省去了启动进程的开销。
# 每次运行使用相同的随机种子、数据和 AdamW（`torch_adam`，因此无需编译 C++）。同一次启动中还顺带跑了另外两次运行：
# 优化器卸载到 CPU 的阶段 2（第 5 节），以及 fp16 的阶段 2（第 4 节）。
# 只有当 fp16 能够计算**并且** DeepSpeed 的加速器接受它时，才会加入 fp16 这次运行：
# DeepSpeed 的 CPU 加速器会询问 oneDNN，而 oneDNN 只在带有 AVX512-FP16 或 AMX-FP16 的 CPU 上给出肯定的答复；
# torch 的 autocast 则在任何 CPU 上都能（缓慢地）以 fp16 计算。在其他机器上只跑 bf16 的那几次运行。
#
# rank 0 报告各次运行的损失、每个 rank 对最终参数算出的校验和，以及每个 rank **精确的模型状态字节数**。
# 这些字节数是从引擎及其优化器所持有张量的存储中统计出来的，统计时机是梯度累积过程中某个微批次的反向之后。
# 阶段 1 和阶段 2 的差别正体现在这里。
#
# 有两个设置细节由训练脚本处理：
# - DeepSpeed 的 CPU 加速器原本会先即时编译（JIT）一个共享内存全归约（一次 C++ 构建，每台机器一次）。
#   训练脚本把这个算子标记为不可用（`--shm-comm off`），于是所有集合通信都和 DDP 一样走 gloo，
#   也不会创建 `/dev/shm` 缓冲区。
# - 在阶段 0，DeepSpeed 的 bf16 包装器会先用全零梯度执行一次优化器更新，以分配 Adam 的状态。配合 torch 的 AdamW，
#   这会在训练开始前就把 Adam 的步数计数器推进到 1。于是每一次偏差校正都错开一步，
#   第一次更新的幅度只有应有的 0.74 倍，阶段 0 也就逐渐偏离其他阶段。训练脚本会重置这个计数器并报告它
#   （`adam_prestep`）；`--keep-prestep` 则展示 DeepSpeed 原本的行为。

# %%
# NBVAL_IGNORE_OUTPUT
caps = device.capabilities()
on_gpus = caps.device_type == "cuda" and caps.gpu_count >= 2  # 2 ranks need 2 GPUs; otherwise DeepSpeed's CPU
if not on_gpus:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # ask the accelerator the ranks will use
ds_fp16 = device.deepspeed_accepts(torch.float16)  # DeepSpeed's own answer, not torch's
fp16_ok = ds_fp16 and device.computes(torch.float16, "cuda" if on_gpus else "cpu")
run_list = "0:bf16,1:bf16,2:bf16,3:bf16,2:bf16:cpu" + (",2:fp16" if fp16_ok else "")
res = launch("labkit.recipes.zero", nproc=2, timeout=300, stream=False,
             args=["--runs", run_list, "--steps", "8", "--micro-batch", "8", "--grad-accum", "2",
                   "--bucket", "32768", "--initial-scale-power", "21", "--loss-scale-window", "2",
                   "--hysteresis", "1", "--torch-adam"],  # torch's AdamW: no C++ compile (section 5)
             env=None if on_gpus else {"DS_ACCELERATOR": "cpu"})
runs = {(r["stage"], r["offload"], r["dtype"]): r for r in res["runs"]}
print(f"DeepSpeed {res['deepspeed']} on {res['accelerator']}, backend {res['backend']}, "
      f"world size {res['world_size']}: {res['timings']['total_s']:.1f} s in the ranks")

# %% [markdown]
# Each run built its engine with one call, and then trained with the loop below: the recipe's
# `labkit.recipes.zero.train_loop`, printed from the code that ran. Compare it with notebook 09's DDP loop: there is no
# `/ accum`, no `no_sync()`, no `GradScaler`, no `clip_grad_norm_` and no `zero_grad()`. `engine.backward` divides
# the loss by the accumulation steps, scales it (fp16), and reduces the gradients (in which micro-batch depends on
# the stage: measured below). `engine.step` only counts the micro-batch, except at the accumulation boundary, where
# it unscales and clips (in one multiplication), steps the optimizer, gathers the new weights (stages 1 and 2) and clears the gradients. The
# recipe's instrumentation (`watch`, `between`) records the collectives and counts the bytes; it changes no number
# (the profiler slows the last step).

# %% [markdown] lang="zh" en="32b6c2b08789"
# 每次运行都只用一次调用构建引擎，然后用下面的循环训练：它就是训练脚本中的 `labkit.recipes.zero.train_loop`，
# 打印的是实际运行的代码。把它与 notebook 09 的 DDP 循环比较一下：这里没有 `/ accum`，没有 `no_sync()`，
# 没有 `GradScaler`，没有 `clip_grad_norm_`，也没有 `zero_grad()`。`engine.backward` 把损失除以累积步数，
# 对它做缩放（fp16），并对梯度做归约（在哪个微批次归约取决于阶段：下面会实测）。`engine.step` 平时只是给微批次计数，
# 只有在累积边界处才会反缩放并裁剪梯度（一次乘法同时完成）、执行优化器更新、收集新的权重（阶段 1 和 2）并清空梯度。
# 训练脚本的插桩代码（`watch`、`between`）记录集合通信并统计字节数；它不改变任何数值（性能分析器会让最后一步变慢）。

# %%
print(*(line.strip() for line in inspect.getsource(zero_recipe._one_run).splitlines()
        if "deepspeed.initialize(" in line), sep="\n")
print(inspect.getsource(zero_recipe.train_loop))

# %% [markdown]
# The ranks agree bit for bit at every stage. Even at stage 3, where no rank ever holds the whole model between
# steps, gathering the final parameters gives the same checksum on both ranks.
#
# One setting of the recipe differs from DeepSpeed's default, and it matters at stage 3:
# `stage3_param_persistence_threshold` is set to 0. By default DeepSpeed keeps every parameter smaller than 10⁵
# elements unsharded on all ranks (small tensors are not worth a gather each); in a model this small that would be
# every parameter, and stage 3 would shard nothing. With 0, every tensor is sharded, as the byte counts below
# assume. Keep the default on a real model.

# %% [markdown] lang="zh" en="451cb78e01e7"
# 在每个阶段，各个 rank 都逐位一致。即使在阶段 3，两步之间没有任何一个 rank 持有完整的模型，收集最终参数之后，
# 两个 rank 上的校验和也完全相同。
#
# 训练脚本有一项设置与 DeepSpeed 的默认值不同，它在阶段 3 中很关键：`stage3_param_persistence_threshold` 被设为 0。
# 默认情况下，DeepSpeed 会让所有小于 10⁵ 个元素的参数在所有 rank 上保持不分片（小张量不值得每次都收集一遍）；
# 在这么小的模型里，这会是全部参数，阶段 3 就什么也不分片了。设为 0 后，每个张量都会被分片，
# 正如下面的字节统计所假设的那样。在真实模型上请保留默认值。

# %%
bf16_runs = [runs[(s, "none", "bf16")] for s in range(4)]
for r in bf16_runs:
    same = r["checksums"][0] == r["checksums"][1]
    print(f"ZeRO-{r['stage']}: {r['optimizer']:<30} ranks identical: {same}")
    assert same and r["param_sums"][0] == r["param_sums"][1]

# %% [markdown]
# The losses are the same across stages, to bf16 rounding. ZeRO changes *where* the states live, not the
# arithmetic. (The differences come from summing bf16 gradients in different orders and buckets.)

# %% [markdown] lang="zh" en="ffaac6463d91"
# 各阶段的损失相同，差别只在 bf16 的舍入范围之内。ZeRO 改变的是状态*存放在哪里*，而不是算术运算本身。
# （这些差别来自以不同的顺序、在不同的桶中对 bf16 梯度求和。）

# %%
# NBVAL_IGNORE_OUTPUT
for r in bf16_runs:
    print(f"ZeRO-{r['stage']} losses:", " ".join(f"{x:.4f}" for x in r["losses"]),
          f"  (adam_prestep {r['adam_prestep']})")

# %%
ref = bf16_runs[0]["losses"]
worst = max(abs(a - b) / b for r in bf16_runs[1:] for a, b in zip(r["losses"], ref))
print("first loss identical at every stage:", all(r["losses"][0] == ref[0] for r in bf16_runs))
print("largest relative difference to stage 0 over 8 steps < 0.5%:", worst < 5e-3)
assert worst < 5e-3 and ref[-1] < ref[0]

# %% [markdown]
# ### Communication with gradient accumulation, measured
#
# Each step of these runs accumulates 2 micro-batches. The recipe recorded every collective of the last step, micro-batch by
# micro-batch (`labkit.handpar.recorded_collectives`, which reads them from the profiler, so DeepSpeed's own calls
# count). Sizes are in units of Ψ, the parameter count; an all-gather is counted by the size of what it assembles:

# %% [markdown] lang="zh" en="ba86402bd5b7"
# ### 实测：梯度累积下的通信
#
# 这几次运行的每一步都累积 2 个微批次。训练脚本逐个微批次地记录了最后一步中的每一次集合通信
# （`labkit.handpar.recorded_collectives`，它从性能分析器中读取这些调用，所以 DeepSpeed 自己发起的调用也算在内）。
# 大小以 Ψ（参数个数）为单位；全收集按它拼出的结果的大小计：

# %%
n, world = bf16_runs[0]["n_params"], res["world_size"]
for r in bf16_runs:
    per_mb = [", ".join(f"{op} {c['elements'] * (world if op == 'all_gather' else 1) / n:.2f}Ψ "
                        f"({c['calls']} call{'s' if c['calls'] > 1 else ''})"
                        for op, c in sorted(mb.items())) or "nothing" for mb in r["collectives_per_micro"]]
    print(f"ZeRO-{r['stage']}: " + " | ".join(f"micro-batch {i + 1}: {t}" for i, t in enumerate(per_mb)))
first_mb = [r["collectives_per_micro"][0] for r in bf16_runs]
summed = [sum(c["elements"] for op, c in mb.items() if op in ("all_reduce", "reduce_scatter")) for mb in first_mb]
last_mb = [r["collectives_per_micro"][-1] for r in bf16_runs]
assert first_mb[0] == first_mb[1] == {}  # stages 0 and 1 accumulate locally: nothing crosses the network
assert round(summed[2] / n, 2) == 1.0 and "all_gather" not in first_mb[2]  # stage 2 sums every micro-batch's grads
assert all(round(world * last_mb[s]["all_gather"]["elements"] / n, 2) == 1.0 for s in (1, 2))  # weights, once
assert summed[3] >= n / world and round(world * first_mb[3]["all_gather"]["elements"] / n, 2) == 1.0  # one gather

# %% [markdown]
# Two patterns, and the reason for each:
# - **Stages 0 and 1 communicate once per step.** Every rank holds the whole gradient, so it can add up its
#   micro-batches locally (DDP does the same inside `no_sync()`, notebook 09) and sum across ranks only at the
#   last one. Stage 1 then all-gathers the updated weights.
# - **Stages 2 and 3 communicate on every micro-batch.** A stage-2 rank keeps only its slice of the gradients, so it
#   cannot hold on to the other ranks' parts until the end of the step: it sums each bucket across the ranks as
#   backward produces it, micro-batch after micro-batch. Stage 3 also gathers the weights for every micro-batch.
#
# Reading the rows: at stages 1 and 2, DeepSpeed sums each gradient bucket with an **all-reduce** and then keeps its
# own slices (`use_multi_rank_bucket_allreduce`, on by default; turned off, each slice is reduced to the rank that
# owns it instead): fewer, larger calls, but twice the bytes of the reduce-scatter the ZeRO paper counts. Stage 3 sums
# with a reduce-scatter (`reduce_scatter_coalesced`); gloo has none, so torch emulates it with an all-reduce of the
# whole bucket, and it shows up as an all-reduce here too. At stage 3 DeepSpeed gathered this tiny model's weights
# once per micro-batch, not twice: `stage3_max_live_parameters` and `stage3_max_reuse_distance` (10⁹ elements by
# default) let it keep gathered weights from forward until backward reuses them. A model larger than those limits
# releases them after forward and gathers them again in backward.
#
# The table counts each micro-batch of a step of k, in the ring units of the table above (Ψ per reduce-scatter or all-gather, 2Ψ per
# all-reduce), counting the reduce-scatters the ZeRO paper assumes (DeepSpeed's bucket all-reduces add Ψ per
# reduction at stages 1 and 2). Adding them up per optimizer step is exercise 10.comm-volume (section 8).
#
# | | each of the first k − 1 micro-batches | the last micro-batch of the step |
# |---|---|---|
# | DDP with `no_sync()`, ZeRO-0, ZeRO-1 | nothing (gradients add up locally) | reduce-scatter Ψ + all-gather Ψ (DDP: all-reduce 2Ψ) |
# | ZeRO-2 | reduce-scatter Ψ | reduce-scatter Ψ + all-gather Ψ |
# | ZeRO-3 | all-gather Ψ forward + Ψ backward, reduce-scatter Ψ | the same (the updated shard stays where it is) |
# | FSDP2 with `set_requires_gradient_sync(False)` until the last | all-gathers 2Ψ | all-gathers 2Ψ + reduce-scatter Ψ |
#
# The saving has a price. FSDP2 without gradient sync keeps each micro-batch's *unsharded* gradients until the last
# one, which is the memory sharding was meant to save (notebook 11 measures it). ZeRO-2 keeps its memory and pays
# k reductions instead; at large k, that is a reason to prefer ZeRO-1 when its gradients fit.
#
# ### Memory per rank: measured vs predicted
#
# The measured bytes are exact (no sampling, no allocator noise), so we can compare them with the prediction
# byte for byte. The recipe sorts the tensors into params, grads, master and optimizer. It counts the
# communication buckets (`buffers`) and one-element tensors (Adam's `step` counters, norms) separately.
#
# **Predict, then run.** At ZeRO-2 each of the 2 ranks keeps "its half" of the gradients. Will each rank's measured
# gradient bytes be `"equal"` to 2 bytes × Ψ/2, `"more"`, or `"less"`?

# %% [markdown] lang="zh" en="d99e16ee0d68"
# 两种模式，以及各自的原因：
# - **阶段 0 和 1 每步只通信一次。** 每个 rank 都持有完整的梯度，因此可以在本地把各个微批次的梯度加起来（DDP
#   在 `no_sync()` 中也是这样做的，见 notebook 09），只在最后一个微批次才跨 rank 求和。
#   随后阶段 1 对更新后的权重做全收集。
# - **阶段 2 和 3 每个微批次都要通信。** 阶段 2 的 rank 只保留梯度中属于自己的那一片，
#   因此不能把其他 rank 的部分一直留到这一步结束：反向每产出一个桶，它就跨 rank 对这个桶求和，
#   一个微批次接一个微批次。阶段 3 还要为每个微批次收集权重。
#
# 怎么读这几行输出：在阶段 1 和 2，DeepSpeed 用一次**全归约**对每个梯度桶求和，
# 然后只保留属于自己的那几片（`use_multi_rank_bucket_allreduce`，默认开启；关闭后，
# 每一片改为只归约到拥有它的那个 rank 上）：调用次数更少、每次的数据更大，但字节数是 ZeRO 论文所计的归约分散的两倍。
# 阶段 3 用归约分散求和（`reduce_scatter_coalesced`）；gloo 没有归约分散，于是 torch 用对整个桶的全归约来模拟它，
# 所以它在这里也显示为全归约。在阶段 3，DeepSpeed 对这个微型模型的权重每个微批次只收集了一次，
# 而不是两次：`stage3_max_live_parameters` 和 `stage3_max_reuse_distance`（默认都是 10⁹ 个元素）
# 允许它把收集来的权重从前向一直保留到反向再次使用。超过这些上限的模型会在前向之后释放权重，并在反向中再收集一次。
#
# 下表列出在累积 k 个微批次的一步中，每个微批次的通信量，单位与上面那张表相同，按环形计（每次归约分散或全收集为 Ψ，
# 每次全归约为 2Ψ），并按 ZeRO 论文所假设的归约分散计数（在阶段 1 和 2，DeepSpeed 的桶全归约每次归约还要多出 Ψ）。
# 把它们按每个优化器步加总，就是练习 10.comm-volume（第 8 节）。
#
# | | 前 k − 1 个微批次中的每一个 | 这一步的最后一个微批次 |
# |---|---|---|
# | 使用 `no_sync()` 的 DDP、ZeRO-0、ZeRO-1 | 无（梯度在本地累加） | 归约分散 Ψ + 全收集 Ψ（DDP：全归约 2Ψ） |
# | ZeRO-2 | 归约分散 Ψ | 归约分散 Ψ + 全收集 Ψ |
# | ZeRO-3 | 全收集：前向 Ψ + 反向 Ψ，归约分散 Ψ | 相同（更新后的分片留在原处） |
# | 在最后一个微批次之前一直 `set_requires_gradient_sync(False)` 的 FSDP2 | 全收集 2Ψ | 全收集 2Ψ + 归约分散 Ψ |
#
# 这种节省是有代价的。不做梯度同步的 FSDP2 会把每个微批次*未分片*的梯度一直保留到最后一个微批次，
# 而这正是分片本来要省下的显存（notebook 11 会测量它）。ZeRO-2 守住了显存，代价是 k 次归约；k 较大时，
# 如果 ZeRO-1 的梯度放得下，这就是选择 ZeRO-1 的一个理由。
#
# ### 每个 rank 的显存：实测与预测
#
# 实测的字节数是精确的（没有采样，也没有分配器带来的噪声），所以可以与预测逐字节地比较。训练脚本把张量分为 params、
# grads、master 和 optimizer 四类，并把通信桶（`buffers`）和单元素张量（Adam 的 `step` 计数器、范数）单独统计。
#
# **先预测，再运行。** 在 ZeRO-2 中，2 个 rank 各自保留梯度的“一半”。每个 rank 实测的梯度字节数会是 `"equal"`（等于
# 2 字节 × Ψ/2）、`"more"`（更多），还是 `"less"`（更少）？

# %%
prediction = ...
### BEGIN SOLUTION
prediction = "more"
### END SOLUTION
predict("10.stage2-grads", prediction)

# %%
print(f"{'':8}{'category':<10}{'predicted':>11}{'rank 0':>11}{'rank 1':>11}")
for r in bf16_runs:
    p = pred[r["stage"]].device
    for k in ("params", "grads", "master", "optimizer"):
        got = [b["bytes"][k] for b in r["bytes_per_rank"]]
        print(f"ZeRO-{r['stage']}  {k:<10}{p.get(k, 0):>11,}{got[0]:>11,}{got[1]:>11,}")
    print(f"{'':8}{'buffers':<10}{'':>11}" + "".join(f"{b['bytes']['buffers']:>11,}" for b in r["bytes_per_rank"]))

# %% tags=["workspace-clear"]
half = 2 * -(-n_params // 2)  # bf16 gradient bytes of an even split: 2 x ceil(Ψ/2)
grads2 = [b["bytes"]["grads"] for b in runs[(2, "none", "bf16")]["bytes_per_rank"]]
reveal("10.stage2-grads", "more" if min(grads2) > half else "equal" if grads2 == [half, half] else
       "less" if max(grads2) < half else "mixed")
assert min(grads2) > half

# %% [markdown]
# Everything matches exactly, except stage 2's gradients, which are larger than Ψ/N on both ranks. The reason is
# DeepSpeed's granularity. At stage 2, a rank accumulates the gradients of every parameter tensor that *touches*
# its slice of the flattened model, and it keeps each of those tensors **whole**. So the one tensor that the
# boundary between the two slices cuts through is held whole by both ranks: each rank's extra is the part of that
# tensor that lies in the *other* rank's slice. `labkit.zero.partition_layout` predicts this from the parameter
# sizes alone:

# %% [markdown] lang="zh" en="703a22c461c9"
# 除了阶段 2 的梯度之外，一切都精确吻合：阶段 2 的梯度在两个 rank 上都大于 Ψ/N。原因在于 DeepSpeed 的粒度。
# 在阶段 2，一个 rank 会为每一个*触及*它那一片扁平化模型的参数张量累积梯度，并且把这些张量**完整地**保留下来。所以，
# 被两片之间的边界切开的那一个张量，两个 rank 都会完整持有：每个 rank 多出来的，
# 就是这个张量中位于*另一个* rank 那一片里的部分。`labkit.zero.partition_layout` 仅凭各参数的大小就能预测出这一点：

# %%
numels = [p.numel() for p in model.parameters()]
layout = zero.partition_layout(numels, 2, 2)
(cut,) = zero.cut_tensors(numels, 2)  # the one tensor the boundary between the two slices cuts through
name, below, above = list(dict(model.named_parameters()))[cut["tensor"]], cut["below"], cut["numel"] - cut["below"]
print(f"slice boundary at element {cut['boundary']:,}: inside {name} ({cut['numel']:,} elements, {below:,} of them "
      f"in rank 0's slice, {above:,} in rank 1's)")
for rank, lay in enumerate(layout):
    print(f"rank {rank}: owns {lay['partition']:,} elements, accumulates gradients for {lay['grads']:,} "
          f"(+{lay['grads'] - lay['partition']:,})")
assert [lay["grads"] - lay["partition"] for lay in layout] == [above, below]
assert grads2 == [2 * lay["grads"] for lay in layout]  # the bf16 gradient bytes DeepSpeed held, measured above

# %% [markdown]
# For a model with billions of parameters in thousands of tensors, one cut tensor per boundary is noise. For
# our 29-tensor toy it is visible. Now the assertion, rank by rank and category by category: prediction
# (+ the stage-2 granularity) = measurement.

# %% [markdown] lang="zh" en="51d3b54e88a2"
# 对于拥有数千个张量、数十亿参数的模型，每个边界上一个被切开的张量只是噪声。对于我们这个只有 29 个张量的玩具模型，
# 它就看得出来了。下面是断言，逐个 rank、逐个类别地核对：预测（+ 阶段 2 的粒度）= 实测。

# %%
for r in bf16_runs:
    s, p = r["stage"], pred[r["stage"]].device
    lay = zero.partition_layout(r["param_numels"], 2, s)
    for rank, b in enumerate(r["bytes_per_rank"]):
        extra = 2 * (lay[rank]["grads"] - (-(-n_params // 2) if s >= 2 else n_params))
        expected = dict(p, grads=p["grads"] + extra)
        assert {k: b["bytes"][k] for k in expected} == expected, (s, rank)
print("measured == predicted, exactly, for 4 stages x 2 ranks x 4 categories")

# %%
bars = {}
for r in bf16_runs:
    s = r["stage"]
    bars[f"Z{s} predicted"] = pred[s].device
    for rank, b in enumerate(r["bytes_per_rank"]):
        bars[f"Z{s} rank {rank}"] = {k: b["bytes"][k] for k in ("params", "grads", "master", "optimizer")}
ax = plots.memory_bars(bars, unit=n_params, title="Model states per rank, 2 ranks, bf16 + AdamW")
plt.show()

# %% [markdown]
# Read the bars as bytes per parameter: 16 → 10 → 9 (a little more, measured) → 8. With only 2 ranks the
# savings look modest, because each stage shards just one more piece, and only in halves. With N ranks, stage 2
# tends to 2 bytes per parameter (the 16-bit weights stay whole), and stage 3 to 16/N. Activations are not
# model states: they come on top and depend on the micro-batch (notebook 06).
#
# No shared-memory files were left in `/dev/shm` by this launch. Rank 0 looked for the job's
# `deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>` files after every rank had cleaned up:

# %% [markdown] lang="zh" en="58c1a3d8e988"
# 按每参数字节数来读这些柱条：16 → 10 → 9（实测略多一点）→ 8。只有 2 个 rank 时，节省看起来不多，
# 因为每个阶段只多分片一样东西，而且只分成两半。有 N 个 rank 时，阶段 2 趋近于每参数 2 字节（16 位权重保持完整），
# 阶段 3 趋近于 16/N。激活值不属于模型状态：它们要另外加在上面，大小取决于微批次（notebook 06）。
#
# 这次启动没有在 `/dev/shm` 中留下任何共享内存文件。在所有 rank 都清理完毕之后，
# rank 0 查找了本作业的 `deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>` 文件：

# %%
print("this job's /dev/shm/deepspeed_allreduce_buffer_* files left:", res["shm_files_left"])
assert res["shm_files_left"] == []

# %% [markdown]
# ## 4. fp16 with dynamic loss scaling
#
# fp16's exponent range is narrow, so DeepSpeed scales the loss before backward and unscales the gradients
# before the step, as `torch.amp.GradScaler` does (notebook 03). Its knobs map one to one:
#
# | DeepSpeed `fp16` key | GradScaler | meaning |
# |---|---|---|
# | `loss_scale: 0` | (enabled) | dynamic scaling; a positive value is a static scale |
# | `initial_scale_power: k` | `init_scale=2**k` | the first scale |
# | `loss_scale_window` | `growth_interval` | the scale doubles every `window` clean steps; the first doubling after an overflow (and at the start) comes on clean step window+1 (GradScaler: on clean step `growth_interval`) |
# | `hysteresis: h` | (always 1) | the h-th overflow halves the scale, h−1 are tolerated; every overflowing step is skipped; refilled only when the scale grows (unless `consecutive_hysteresis`) |
# | `min_loss_scale` | (none) | a floor; DeepSpeed stops if it overflows there |
#
# The fp16 run (section 3's, where DeepSpeed accepts fp16 here; otherwise the recording of the same run) starts
# deliberately too high (2**21), with window 2 and hysteresis 1, so the trace shows both directions. Whether it ran
# on this machine came from the device gate and from DeepSpeed, never from an assumption:

# %% [markdown] lang="zh" en="d27a8bbe18a0"
# ## 4. 使用动态损失缩放的 fp16
#
# fp16 的指数范围很窄，因此 DeepSpeed 会在反向之前缩放损失，在优化器更新之前对梯度做反缩放，
# 与 `torch.amp.GradScaler` 的做法相同（notebook 03）。两者的参数一一对应：
#
# | DeepSpeed `fp16` 键 | GradScaler | 含义 |
# |---|---|---|
# | `loss_scale: 0` | （启用） | 动态缩放；取正值则为静态缩放因子 |
# | `initial_scale_power: k` | `init_scale=2**k` | 初始缩放因子 |
# | `loss_scale_window` | `growth_interval` | 每经过 `window` 个无溢出的步，缩放因子翻倍；溢出之后（以及刚开始时）的第一次翻倍出现在第 window+1 个无溢出的步（GradScaler：在第 `growth_interval` 个无溢出的步） |
# | `hysteresis: h` | （恒为 1） | 第 h 次溢出才让缩放因子减半，前 h−1 次被容忍；每个溢出的步都会被跳过；只有在缩放因子增长时才重新补满（除非设置了 `consecutive_hysteresis`） |
# | `min_loss_scale` | （无） | 下限；如果在下限处仍然溢出，DeepSpeed 就停止 |
#
# fp16 这次运行（即第 3 节中的那次，前提是 DeepSpeed 在这里接受 fp16；否则就是同一次运行的录制记录）
# 故意从过高的缩放因子（2**21）开始，窗口为 2，hysteresis 为 1，这样轨迹就能同时展示增大和减小两个方向。
# 它是否在本机上运行，取决于设备检查和 DeepSpeed 的答复，而从不凭假设：

# %%
# NBVAL_IGNORE_OUTPUT
print(f"torch autocast computes fp16 here: {device.computes(torch.float16)}; DeepSpeed accepts fp16 here: {ds_fp16}")
if fp16_ok:
    fp = runs[(2, "none", "fp16")]
    assert fp["checksums"][0] == fp["checksums"][1]  # the ranks agree in fp16 too
    print("overflow:", fp["overflow"])
    print("scale after each step:", [f"2^{int(s).bit_length() - 1}" for s in fp["loss_scales"]])
else:
    fp = None
    print(f"So the fp16 run did not go: DeepSpeed refuses fp16 on this {device.cpu_class()} CPU (no AVX512-FP16/AMX "
          "for oneDNN), and section 3 trained in bf16 only. The trace below is a stored example: the same run, "
          f"recorded on {zero.RECORDED_FP16_RUN['recorded_on']}. On a GPU or an AMX Xeon it is this machine's own.")

# %% [markdown]
# By the rule, every overflowing step is skipped (the weights do not move) and the scale halves; after 3 clean steps
# (window + 1) it doubles, and if the doubled scale overflows it halves straight back. So the scale hovers around the
# largest power of two at which the model's gradients fit in fp16 (the cell prints where this trace ended). The trace is exactly DeepSpeed's rule replayed on the
# observed overflows (`labkit.scaling.deepspeed_scale_sequence`). Where DeepSpeed refused fp16, the figure is labelled
# as the stored example (`labkit.zero.RECORDED_FP16_RUN`), and the same replay is checked against it:

# %% [markdown] lang="zh" en="2b02c0be5ccb"
# 按照这条规则，每个溢出的步都会被跳过（权重不动），缩放因子减半；经过 3 个无溢出的步（window + 1）之后，
# 缩放因子翻倍；如果翻倍后的缩放因子又溢出，它会立刻减半回来。因此，缩放因子会在能让模型梯度放进 fp16 的最大的 2
# 的幂附近徘徊（单元格会打印这条轨迹最后停在哪里）。这条轨迹与在观测到的溢出上重放 DeepSpeed
# 的规则（`labkit.scaling.deepspeed_scale_sequence`）所得的结果完全一致。如果 DeepSpeed 拒绝了 fp16，
# 图中会标明这是存储的示例（`labkit.zero.RECORDED_FP16_RUN`），并用同样的重放来核对它：

# %%
# NBVAL_IGNORE_OUTPUT
source = "this machine" if fp is not None else f"stored example, {zero.RECORDED_FP16_RUN['recorded_on']}"
fp = fp if fp is not None else zero.RECORDED_FP16_RUN  # DeepSpeed refused fp16 here: the recorded run
knobs = {k: fp[k] for k in ("initial_scale_power", "loss_scale_window", "hysteresis")}  # the run's own settings
replay = scaling.deepspeed_scale_sequence(fp["overflow"], **knobs)
assert fp["loss_scales"] == replay[1:] and fp["skipped_steps"] == sum(fp["overflow"])
plots.scale_history(replay[:-1], fp["overflow"], title=f"DeepSpeed fp16 loss scale (ZeRO-2, 2 ranks)\n{source}")
plt.show()
print(f"DeepSpeed's trace ({source}) == the replayed rule: True; {sum(fp['overflow'])} of {len(fp['overflow'])} "
      f"steps overflowed, and the scale ended at 2^{int(fp['loss_scales'][-1]).bit_length() - 1} "
      f"(started at 2^{knobs['initial_scale_power']})")

# %% [markdown]
# Compared with GradScaler: both halve on overflow and double after a run of clean steps. With `hysteresis: 2`
# (DeepSpeed's default) the first overflow only uses up one unit of hysteresis: the step is skipped but the scale
# stays; every later overflow halves, until the next growth refills it. DeepSpeed grows when the clean steps
# *before* the current one, counted since the last overflow, are a multiple of the window, so each first growth
# (after an overflow, and at the start) comes one step later than GradScaler's (see
# `labkit.scaling.DEEPSPEED_KNOBS`). bf16 needs none of this: it has fp32's
# exponent range.
#
# ## 5. Optimizer offload: what moves, and what it costs
#
# With `offload_optimizer.device = "cpu"`, the fp32 master weights, Adam's moments, and the fp32 gradient slice
# live in host RAM, and the optimizer step runs on the CPU. Each step, the reduced gradient slice is copied to the
# host, and the updated 16-bit weights are copied back. On a GPU that frees the optimizer side (12 bytes per
# parameter of master weights and Adam moments, plus the gradient shard) divided by the number of ranks N: 12-14
# bytes per parameter only when N = 1. It costs PCIe traffic plus a CPU-speed optimizer step. Here, device and host are the same memory, so we
# measure only the overhead of the offload path itself:

# %% [markdown] lang="zh" en="d98dbc876e8e"
# 与 GradScaler 相比：两者都在溢出时减半，在连续若干个无溢出的步之后翻倍。在 `hysteresis: 2`（DeepSpeed 的默认值）
# 下，第一次溢出只用掉一个单位的 hysteresis：这一步被跳过，但缩放因子不变；之后的每次溢出都会让它减半，
# 直到下一次增长把 hysteresis 补满。DeepSpeed 在当前步*之前*、自上次溢出以来的无溢出步数是窗口的整数倍时增长，
# 所以每次溢出之后（以及刚开始时）的第一次增长都比 GradScaler 晚一步（见 `labkit.scaling.DEEPSPEED_KNOBS`）。
# bf16 完全不需要这些：它拥有与 fp32 相同的指数范围。
#
# ## 5. 优化器卸载：搬走了什么，代价是什么
#
# 设置 `offload_optimizer.device = "cpu"` 后，fp32 主权重、Adam 的动量以及 fp32 梯度分片都放在主机内存中，
# 优化器更新在 CPU 上执行。每一步，归约后的梯度分片被复制到主机，更新后的 16 位权重再被复制回来。在 GPU 上，
# 这样腾出的显存是优化器部分（每参数 12 字节的主权重和 Adam 动量，再加上梯度分片）除以 rank 数 N：只有当 N = 1 时，
# 才是每参数 12-14 字节。代价是 PCIe 传输，外加以 CPU 的速度执行的优化器更新。在这里，设备和主机是同一块内存，
# 所以我们只测量卸载路径本身的开销：

# %%
# NBVAL_IGNORE_OUTPUT
on, off = runs[(2, "cpu", "bf16")], runs[(2, "none", "bf16")]
for name, r in (("ZeRO-2", off), ("ZeRO-2 + offload", on)):
    t = r["timings"]
    print(f"{name:<17} step {1e3 * t['step_s_median']:6.1f} ms (median)   init {t['init_s']:5.2f} s")
print(f"offload costs {on['timings']['step_s_median'] / off['timings']['step_s_median']:.1f}x per step here")

# %%
print("same losses with and without offload (to bf16 rounding):",
      max(abs(a - b) / b for a, b in zip(on["losses"], off["losses"])) < 5e-3)
print("where the offloaded run's tensors live:", sorted(on["bytes_per_rank"][0]["by_device"]))
shard = on["bytes_per_rank"][0]["bytes"]["master"] / 4    # elements of this rank's (padded) fp32 master shard
host_per_elem = sum(on["bytes_per_rank"][0]["bytes"][k] for k in ("master", "optimizer", "grads")) / shard
print(f"offloaded side, per shard element: {host_per_elem:g} B (fp32 master 4 + Adam 8 + an fp32 gradient "
      f"partition 4), plus {on['bytes_per_rank'][0]['bytes']['buffers']:,} B of staging buffers")
assert host_per_elem == 16
pred = memory.model_state_bytes(on["n_params"], "bf16-master", "adamw", stage=2, world_size=2, offload_optimizer=True)
print(f"labkit.memory's offload model for this run: host {pred.host_total:,} B = measured "
      f"{int(host_per_elem * shard):,} B: {pred.host_total == host_per_elem * shard}")

# %% [markdown]
# On this CPU-only machine, "offloaded" tensors were on the CPU all along. On a GPU node, `by_device` splits them
# into `cuda` and `cpu`. The Adam step on the host is the bottleneck of offload. DeepSpeed's `DeepSpeedCPUAdam`
# (AVX-vectorised C++) is several times faster than `torch.optim.AdamW` there, but it is compiled on first use
# (a C++ build of a minute or more on a small machine, once, cached in `TORCH_EXTENSIONS_DIR`). This notebook uses `torch_adam` to skip
# that compile. On a GPU cluster, set `torch_adam=False` in `zero.config`.
#
# ## 6. The seeds' reference setup: 13B parameters on 8×A100-80GB
#
# The article's config, key for key: bf16, ZeRO-2, the optimizer offloaded to the CPU, communication overlapped,
# contiguous gradients, clipping at 1.0, `train_batch_size` 64 with 2 accumulation steps on 8 GPUs. The article
# leaves the micro-batch out; DeepSpeed derives it from the other two: 64 / (2 × 8) = 4 per GPU.

# %% [markdown] lang="zh" en="111511a42f72"
# 在这台只有 CPU 的机器上，“被卸载”的张量本来就一直在 CPU 上。在 GPU 节点上，`by_device` 会把它们分成 `cuda`
# 和 `cpu` 两类。主机上的 Adam 更新是卸载的瓶颈。在那里，DeepSpeed 的 `DeepSpeedCPUAdam`（用 AVX 向量化的 C++）
# 比 `torch.optim.AdamW` 快好几倍，但它要在第一次使用时编译（在小机器上是一分钟或更久的 C++ 构建，只需一次，
# 结果缓存在 `TORCH_EXTENSIONS_DIR` 中）。本 notebook 使用 `torch_adam` 来跳过这次编译。在 GPU 集群上，
# 请在 `zero.config` 中设置 `torch_adam=False`。
#
# ## 6. seed 文章的参考配置：8×A100-80GB 上的 13B 参数
#
# 文章中的配置，逐个键照搬：bf16、ZeRO-2、优化器卸载到 CPU、通信计算重叠、连续梯度（contiguous gradients）、
# 梯度裁剪阈值 1.0、`train_batch_size` 为 64，8 块 GPU，2 个累积步。文章没有给出微批次大小；
# DeepSpeed 会根据另外两个值推导出来：64 / (2 × 8) = 每块 GPU 4 个。

# %%
ref13 = zero.config(2, "bf16", offload="cpu", micro_batch=4, grad_accum=2, world_size=8, overlap_comm=True,
                    contiguous_gradients=True, gradient_clipping=1.0, reduce_bucket_size=500_000_000,
                    torch_adam=False)
print(json.dumps(ref13, indent=1))
assert (ref13["train_batch_size"], ref13["gradient_accumulation_steps"]) == (64, 2)  # the article's two numbers

# %%
est = memory.model_state_bytes(13 * 10**9, "bf16-master", "adam", stage=2, world_size=8, offload_optimizer=True)
print(est.table("GB"))
print(f"CPU RAM per node for the 8 ranks' offloaded states, DeepSpeed's host layout as measured in section 5 "
      f"({est.host_total / (13e9 / 8):.0f} B/param, staging buffers not counted): "
      f"{memory.fmt_bytes(est.host_per_node(8))}")
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

ds_cpu, ds_gpu = estimate_zero2_model_states_mem_needs(13 * 10**9, 8, 1, cpu_offload=True)
print(f"... DeepSpeed's own estimator: {memory.fmt_bytes(ds_cpu)} (1.5 x max(4 N Ψ, 16 Ψ): it also counts the "
      "fp32 copy each of the N processes makes while loading)")
assert est.host_per_node(8) == host_per_elem * 13e9 < ds_cpu and ds_gpu == est.device_total
no_off = memory.model_state_bytes(13 * 10**9, "bf16-master", "adam", stage=2, world_size=8).device_total
ddp13 = memory.model_state_bytes(13 * 10**9, "bf16-master", "adam", stage=0).device_total
print(f"model states per GPU: DDP {memory.fmt_bytes(ddp13)}, ZeRO-2 {memory.fmt_bytes(no_off)}, "
      f"ZeRO-2 + offload {memory.fmt_bytes(est.device_total)} (of 80 GB, before activations and buffers)")
assert est.device_total < no_off < 80e9 < ddp13

# %% [markdown]
# Without ZeRO the same model cannot start: its model states alone exceed a GPU. ZeRO-2 alone already fits the
# model states on 8 GPUs; whether the activations of micro-batch 4 fit in what is left depends on the sequence
# length, and at this size usually needs activation checkpointing. So the article's offload is a choice, not a
# necessity: it moves the sharded optimizer side (and the reduced gradient partitions) to the host and leaves each
# GPU the bf16 weights plus the gradient buckets in flight (the line above counts the weights), which buys room for
# larger micro-batches or longer sequences. What it costs: every step, the reduced gradients cross PCIe to the host
# and the updated weights come back, and the Adam step runs on the CPU. Section 5 measured only the offload path's
# own overhead, on a machine without PCIe transfers; on a GPU node the transfers add to it. Offload pays when
# memory, not step time, is what stops a run; a model that fits without it usually trains faster without it. For the node's CPU RAM, the two host figures above disagree because they count different things. The steady state is DeepSpeed 0.19.8's host layout, which section 5 measured and
# `labkit.memory` models: the fp32 master, Adam's two moments and an fp32 gradient partition, 16 B/param over the
# node, 208 GB, plus pinned staging buffers. (The ZeRO-Offload paper's design keeps a 16-bit gradient shard,
# 14 B/param; DeepSpeed copies the reduced gradients into an fp32 `.grad` of the master partition instead.)
# DeepSpeed's estimator adds the fp32 copies of the model that every process makes while loading, times a safety
# factor of 1.5. Plan for the measured layout plus buffers, and for the loading peak unless you load the model
# sharded. Check that before you submit. The config above is plain
# JSON: save it and pass it to `deepspeed.initialize(config=...)`. On a GPU cluster,
# `ZERO_CONFIG=zero2-bf16-offload sbatch slurm/deepspeed.sbatch` runs this notebook's recipe with the same
# stage, precision and offload (notebook 12).
#
# ## 7. DeepSpeed or DDP?
#
# - **Stay with DDP** while the model states fit on one GPU with room for activations. DDP overlaps its
#   all-reduce with backward, needs no config, and ZeRO-1/2 communicate just as much (per micro-batch: with
#   gradient accumulation, ZeRO-2 communicates k times per step where DDP and ZeRO-1 communicate once).
# - **Switch to ZeRO** when they do not fit. Try stage 1 first, then 2: up to 8x less memory, the same
#   communication as DDP per micro-batch (stage 2 pays it on every micro-batch). Then try 3 (1.5x communication), then offload (PCIe and CPU speed).
#   `labkit.memory.smallest_fitting_stage` does the arithmetic.
# - **`overlap_comm: true`** reduces gradient buckets while backward is still running, like DDP's buckets, at the
#   cost of extra bucket memory. It matters on GPUs, where the reduce can run concurrently with compute.
#   On 2 CPU processes there is nothing to overlap with, so we leave it off.
#
# ### The kinds of parallelism
#
# Data parallelism (DDP, notebook 09) and ZeRO (this notebook) both give every rank a whole copy of the *computation*
# and split the *data*; ZeRO also splits the model states. When one layer's activations or weights no longer fit, or
# the per-rank batch gets too small to keep a GPU busy, the model itself has to be split:
#
# | kind | what each rank holds | what it communicates, and when | typical span |
# |---|---|---|---|
# | data (DDP) | whole model, a slice of the batch | all-reduce of all gradients, once per step | any number of nodes |
# | ZeRO-1/2/3 / FSDP | whole computation; a shard of optimizer states, gradients (and weights, stage 3) | reduce-scatter of gradients, all-gather of weights (stage 3: every layer, forward and backward) | any number of nodes |
# | tensor | a slice of every weight matrix (columns or rows) | an all-reduce of activations inside every layer, forward and backward | within one node (NVLink) |
# | pipeline | a contiguous group of layers | activations to the next stage and gradients back, per micro-batch; idle "bubbles" at start and end | across nodes |
# | sequence (Megatron) | with tensor parallelism: a slice of the tokens outside the split layers (LayerNorm, dropout, residual) | tensor parallelism's all-reduces become all-gathers and reduce-scatters of the same volume | within one node, with tensor parallelism |
# | context | a slice of a long sequence, in every layer | the pieces of attention that need other positions (all-gather or ring exchange of keys/values) | long sequences |
#
# Large runs combine them ("3D parallelism"): tensor parallel inside a node, pipeline across groups of nodes, data
# parallel (often with ZeRO-1) across the rest. **Notebook 11 runs the first four rows for real, by hand:** you write
# DDP (with hooks and buckets), a ZeRO-1 optimizer, a Megatron tensor-parallel MLP (with sequence parallelism) and a
# GPipe pipeline, run them on 2 ranks, and check them against torch DDP, AdamW, DeepSpeed, FSDP2 and
# `torch.distributed.pipelining`, with the communication of each measured against these formulas. Context
# parallelism needs attention to split and stays described here.

# %% [markdown] lang="zh" en="a0013e6d90e2"
# 不用 ZeRO，同样的模型根本无法启动：光是它的模型状态就超出了一块 GPU 的显存。
# 只用 ZeRO-2 就已经能把模型状态放进 8 块 GPU；微批次为 4 时，剩下的显存能否放下激活值取决于序列长度，
# 在这个规模上通常需要激活重计算（梯度检查点）。所以文章中的卸载是一种选择，而不是必需：
# 它把分片后的优化器部分（以及归约后的梯度分区）搬到主机上，每块 GPU 上只留下 bf16
# 权重和正在传输中的梯度桶（上面那一行统计的是权重），从而为更大的微批次或更长的序列腾出空间。代价是：每一步，
# 归约后的梯度都要经 PCIe 传到主机，更新后的权重再传回来，而且 Adam 更新在 CPU 上运行。
# 第 5 节只测量了卸载路径本身的开销，而且是在一台没有 PCIe 传输的机器上；在 GPU 节点上，还要再加上传输的开销。
# 当卡住一次训练的是显存而不是每步耗时，卸载才划算；不卸载也放得下的模型，通常不卸载训练得更快。
# 至于节点的 CPU 内存，上面两个主机内存数字对不上，因为两者统计的是不同的东西。
# 稳态下的占用就是 DeepSpeed 0.19.8 的主机内存布局，即第 5 节实测、`labkit.memory` 所建模的那种：
# fp32 主权重、Adam 的两个动量和一个 fp32 梯度分区，
# 整个节点合计每参数 16 B，共 208 GB，另外还有锁页（pinned）暂存缓冲区。
# （ZeRO-Offload 论文的设计保留的是 16 位梯度分片，每参数 14 B；DeepSpeed 则把归约后的梯度复制到主权重分区的一个
# fp32 `.grad` 中。）DeepSpeed 的估算器还算上了每个进程在加载时创建的模型 fp32 副本，再乘以 1.5 的安全系数。
# 请按实测的布局加上缓冲区来规划；除非以分片方式加载模型，还要为加载时的峰值留出余量。提交作业之前先核对这一点。
# 上面的配置就是普通的 JSON：保存下来，传给 `deepspeed.initialize(config=...)` 即可。
# 在 GPU 集群上，`ZERO_CONFIG=zero2-bf16-offload sbatch slurm/deepspeed.sbatch` 会以同样的阶段、
# 精度和卸载设置运行本 notebook 的训练脚本（notebook 12）。
#
# ## 7. DeepSpeed 还是 DDP？
#
# - **继续使用 DDP**，只要模型状态能放进一块 GPU，并且给激活值留有余地。DDP 把全归约与反向重叠，不需要配置，
#   而 ZeRO-1/2 的通信量与它一样多（按每个微批次计：有梯度累积时，ZeRO-2 每步通信 k 次，
#   而 DDP 和 ZeRO-1 只通信一次）。
# - **放不下时就换用 ZeRO。** 先试阶段 1，再试阶段 2：显存最多可降到原来的 1/8，
#   每个微批次的通信量与 DDP 相同（阶段 2 在每个微批次都要付出这份通信）。然后试阶段 3（1.5 倍的通信量），
#   再试卸载（受限于 PCIe 和 CPU 的速度）。`labkit.memory.smallest_fitting_stage` 会替你做这笔计算。
# - **`overlap_comm: true`** 在反向还在运行时就归约梯度桶，与 DDP 的桶类似，代价是额外的桶显存。
#   它在 GPU 上才有意义，因为在 GPU 上归约可以与计算并发执行。在 2 个 CPU 进程上没有可以与之重叠的计算，
#   所以我们把它关掉。
#
# ### 几种并行方式
#
# 数据并行（DDP，notebook 09）和 ZeRO（本 notebook）都让每个 rank 承担一份完整的*计算*，并切分*数据*；
# ZeRO 还切分了模型状态。当一层的激活值或权重已经放不下，或者每个 rank 的批大小小到无法让 GPU 保持忙碌时，
# 就必须切分模型本身：
#
# | 方式 | 每个 rank 持有什么 | 通信什么、何时通信 | 典型范围 |
# |---|---|---|---|
# | 数据并行（DDP） | 完整的模型，批次的一部分 | 对全部梯度做全归约，每步一次 | 任意数量的节点 |
# | ZeRO-1/2/3 / FSDP | 完整的计算；优化器状态、梯度（阶段 3 还有权重）的一个分片 | 对梯度做归约分散，对权重做全收集（阶段 3：每一层，前向和反向都要） | 任意数量的节点 |
# | 张量并行 | 每个权重矩阵的一部分（按列或按行） | 在每一层内部，前向和反向都要对激活值做全归约 | 单个节点内（NVLink） |
# | 流水线并行 | 一组连续的层 | 每个微批次把激活值传给下一级、把梯度传回上一级；开头和结尾有空闲的“气泡” | 跨节点 |
# | 序列并行（Megatron） | 与张量并行配合：在被切分的层之外（LayerNorm、dropout、残差），持有 token 的一部分 | 张量并行的全归约变成通信量相同的全收集和归约分散 | 单个节点内，与张量并行配合 |
# | 上下文并行 | 长序列的一部分，在每一层中都是如此 | 注意力中需要其他位置的那部分（键/值的全收集或环形交换） | 长序列 |
#
# 大规模训练会把它们组合起来（“3D 并行”）：节点内用张量并行，跨节点组用流水线并行，
# 其余部分用数据并行（常配合 ZeRO-1）。**notebook 11 会亲手实现前四行，并真实运行：** 你将编写 DDP（带钩子和桶）、
# 一个 ZeRO-1 优化器、一个 Megatron 张量并行 MLP（带序列并行）和一个 GPipe 流水线，在 2 个 rank 上运行它们，
# 并与 torch DDP、AdamW、DeepSpeed、FSDP2 以及 `torch.distributed.pipelining` 对照检查，
# 每一种的通信量都会实测并与这里的公式比较。上下文并行需要切分注意力，这里只做介绍。

# %%
for size in ("1B", "7B", "13B", "70B"):
    n = memory.MODEL_PRESETS[size]
    st = memory.smallest_fitting_stage(n, 80e9, 8, "bf16-master", "adam", reserve_bytes=20e9)
    print(f"{size:>4} on 8 x 80 GB (20 GB kept for activations): smallest stage = {st}")

# %% [markdown]
# ## 8. Exercises
#
# **10.config.** Write the DeepSpeed config for this setup: ZeRO-3 on 16 GPUs, micro-batch 2 per GPU, 4 gradient
# accumulation steps, fp16 with dynamic loss scaling starting at 2**12, halving at the first overflow, and
# doubling after 500 clean steps. Clip gradients at 1.0 and overlap communication.

# %% [markdown] lang="zh" en="7bc06683611c"
# ## 8. 练习
#
# **10.config.** 为下面的设置编写 DeepSpeed 配置：16 块 GPU 上的 ZeRO-3，每块 GPU 的微批次为 2，4 个梯度累积步，
# fp16 动态损失缩放，初始缩放因子为 2**12，第一次溢出就减半，连续 500 个无溢出的步之后翻倍。梯度裁剪阈值为 1.0，
# 并开启通信计算重叠。

# %%
print(CONFIG_SETUP)
my_config = ...   # a dict
### BEGIN SOLUTION
my_config = zero.config(3, "fp16", micro_batch=2, grad_accum=4, world_size=16, initial_scale_power=12,
                        hysteresis=1, loss_scale_window=500, gradient_clipping=1.0, overlap_comm=True)
### END SOLUTION
check("10.config", my_config)

# %% [markdown]
# **10.batch-triple (debug).** This helper writes DeepSpeed's batch keys for a target global batch. On one GPU it
# works; on 16, DeepSpeed (and `zero.validate`, which makes the same check before DeepSpeed starts) rejects it:

# %% [markdown] lang="zh" en="5423130c9e83"
# **10.batch-triple（调试）。** 这个辅助函数为目标全局批大小写出 DeepSpeed 的批大小相关键。
# 在一块 GPU 上它能正常工作；在 16 块 GPU 上，DeepSpeed（以及 `zero.validate`，它在 DeepSpeed 启动前做同样的检查）
# 会拒绝它：

# %%
def batch_keys(global_batch, micro_batch, world_size):
    return {"train_batch_size": global_batch, "train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": global_batch // micro_batch}

try:
    zero.validate({**batch_keys(256, 8, 16), "zero_optimization": {"stage": 2}}, world_size=16)
except ValueError as err:
    print("ValueError:", err)
else:
    raise AssertionError("the broken triple should have been rejected")

# %% [markdown]
# Write a fixed `batch_keys(global_batch, micro_batch, world_size)`: a triple that multiplies out for any world size,
# and a `ValueError` for a global batch that cannot be split evenly.

# %% [markdown] lang="zh" en="01e1f796a19d"
# 写出修正后的 `batch_keys(global_batch, micro_batch, world_size)`：对任意进程总数（world size），
# 返回的三元组都满足乘积关系；全局批大小无法均分时，抛出 `ValueError`。

# %%
def batch_keys(global_batch, micro_batch, world_size):
    ...
    ### BEGIN SOLUTION
    accum, rest = divmod(global_batch, micro_batch * world_size)
    if rest or accum < 1:
        raise ValueError(f"{global_batch} is not a multiple of {micro_batch} x {world_size}")
    return {"train_batch_size": global_batch, "train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": accum}
    ### END SOLUTION


check("10.batch-triple", batch_keys)

# %% [markdown]
# **10.comm-volume.** A step accumulates 4 micro-batches. Per optimizer step, how much data does each rank move at
# ZeRO-1, ZeRO-2 and ZeRO-3, in units of Ψ? Count as the ZeRO paper does (a reduce-scatter or an all-gather of Ψ
# elements is Ψ; stage 3 gathers the weights before each forward and again before each backward). Give a triple.

# %% [markdown] lang="zh" en="dff0f91c603b"
# **10.comm-volume.** 一步累积 4 个微批次。在 ZeRO-1、ZeRO-2 和 ZeRO-3 下，
# 每个优化器步中每个 rank 各要传输多少数据，以 Ψ 为单位？按 ZeRO 论文的方式计数（对 Ψ
# 个元素做一次归约分散或全收集记为 Ψ；阶段 3 在每次前向之前收集一次权重，在每次反向之前再收集一次）。
# 给出一个三元组。

# %%
comm_volume = ...   # (ZeRO-1, ZeRO-2, ZeRO-3)
### BEGIN SOLUTION
comm_volume = (2, 5, 12)
### END SOLUTION
check("10.comm-volume", comm_volume)

# %% [markdown]
# ## Summary
#
# - ZeRO partitions what data parallelism replicates. Stage 1 shards the optimizer states and master weights,
#   stage 2 also the gradients, stage 3 also the parameters. Per rank, that is 16 → 4 + 12/N → 2 + 14/N → 16/N
#   bytes per parameter.
# - With one micro-batch per step, stages 1 and 2 cost the same 2Ψ communication as DDP and stage 3 costs 3Ψ. With
#   k accumulated micro-batches, DDP (under `no_sync()`) and stage 1 still communicate once per step, stage 2
#   reduces every micro-batch ((k + 1)Ψ), and stage 3 gathers and reduces on every micro-batch (3kΨ in the paper's
#   count): the measured pattern.
#   Offload trades GPU memory for PCIe and CPU time.
# - Measured exactly, DeepSpeed holds what the model predicts. The exception is stage 2, which accumulates
#   gradients for whole tensors at the slice boundaries. We also found one stage-0 quirk, DeepSpeed's pre-step of
#   Adam, and undid it.
# - fp16 in DeepSpeed is GradScaler's rule with a hysteresis; bf16 needs no scaler.
# - `labkit.zero.config` writes the JSON and checks the batch triple before DeepSpeed does;
#   `labkit.recipes.zero` runs it under torchrun, here or on a cluster.

# %% [markdown] lang="zh" en="b1c458c52ef3"
# ## 小结
#
# - ZeRO 对数据并行所复制的内容进行划分。阶段 1 对优化器状态和主权重做分片，阶段 2 再加上梯度，阶段 3 再加上参数。
#   按每个 rank 计，就是每参数 16 → 4 + 12/N → 2 + 14/N → 16/N 字节。
# - 每步一个微批次时，阶段 1 和 2 的通信量与 DDP 相同，都是 2Ψ，阶段 3 则是 3Ψ。累积 k 个微批次时，
#   DDP（在 `no_sync()` 下）和阶段 1 仍然每步只通信一次，阶段 2 每个微批次都要归约（(k + 1)Ψ），
#   阶段 3 每个微批次都要收集和归约（按论文的计法为 3kΨ）：这正是实测到的模式。
#   卸载是用 PCIe 传输和 CPU 时间来换取 GPU 显存。
# - 精确测量下，DeepSpeed 持有的正是模型所预测的内容。例外是阶段 2，它在切片边界处为完整的张量累积梯度。
#   我们还发现了阶段 0 的一个怪癖，即 DeepSpeed 预先对 Adam 执行的那一步，并把它撤销了。
# - DeepSpeed 中的 fp16 就是 GradScaler 的规则加上 hysteresis；bf16 不需要损失缩放器。
# - `labkit.zero.config` 写出 JSON，并在 DeepSpeed 之前检查批大小三元组；`labkit.recipes.zero` 在 torchrun
#   下运行它，在这里或在集群上都可以。
