# %% [markdown]
# # 06 · Where memory goes
#
# **Objectives**
# - name every byte of a training step: parameters, gradients, fp32 master weights, optimizer states,
#   activations and temporaries, and say which grow with the model and which with the batch;
# - reconcile the **16, 18 and 20 bytes per parameter** quoted for mixed-precision Adam: each counts a
#   different, real memory layout;
# - **predict** the memory of the tiny GPT, then **measure** it exactly (tensor storages, saved-tensor hooks)
#   and see the two agree to the byte;
# - explain why "memory went up when we turned on AMP";
# - predict per-GPU memory under ZeRO stages 0-3 and CPU offload, with an interactive calculator;
# - weigh the levers: batch size, gradient accumulation, activation checkpointing, sequence length, optimizer.
# - find memory that does not drop: lingering references (a kept loss and its graph, views, optimizer state) vs
#   the GPU caching allocator (`memory_allocated` vs `memory_reserved`, `empty_cache`, fragmentation).
#
# **Prerequisites:** notebook 02 (why fp32 master weights), notebook 04 (autocast, the tiny GPT).
#
# **Estimated time:** 65 min

# %% [markdown] lang="zh" en="a5de36c83db2"
# # 06 · 显存都去哪儿了
#
# **学习目标**
# - 说清训练一步中的每个字节：参数、梯度、fp32 主权重、优化器状态、激活值和临时张量，并指出哪些随模型增长、
#   哪些随批大小增长；
# - 厘清混合精度 Adam 常被引用的**每参数 16、18 和 20 字节**：三种说法各自统计了一种不同的、真实存在的
#   显存布局；
# - 先**预测**小型 GPT（tiny GPT）的显存，再精确地**测量**它（张量存储、保存张量钩子），看到两者精确到字节地吻合；
# - 解释为什么“打开 AMP 之后显存反而涨了”；
# - 用交互式计算器预测 ZeRO 0-3 各阶段以及 CPU 卸载（offload）下每块 GPU 的显存；
# - 权衡各种手段：批大小、梯度累积、激活重计算（梯度检查点）、序列长度、优化器；
# - 找出降不下来的显存：是残留的引用（保留下来的 loss 及其计算图、视图、优化器状态），还是 GPU 的缓存分配器
#   （`memory_allocated` 与 `memory_reserved`、`empty_cache`、碎片化）。
#
# **前置知识：** notebook 02（为什么需要 fp32 主权重）、notebook 04（autocast、小型 GPT）。
#
# **预计用时：** 65 分钟

# %%
# %matplotlib inline
# %load_ext labkit
import collections
from unittest import mock

import matplotlib.pyplot as plt
import torch

from labkit import data, device, models, plots, precision, train, widgets
from labkit import memory as mem
from labkit.check import check, predict, reveal

torch.manual_seed(0)
torch.set_num_threads(1)  # tiny tensors: one thread is fastest (and CI shares 2 cores)
dev = device.pick_device()

# %% [markdown]
# ## 1. The anatomy of a training step
#
# Two kinds of memory live on a GPU while it trains:
#
# - **Model states** grow with the parameter count Ψ and nothing else: the weights used in forward and backward,
#   their gradients, and what the optimizer keeps: fp32 **master weights** (in mixed precision) and its
#   **states** (Adam: two moments per weight; SGD with momentum: one).
# - **Activations** grow with batch × sequence length × layers: every tensor autograd saves in the forward pass
#   because backward needs it. On top come **temporaries**: autocast's 16-bit copies of the weights, the fp32
#   gradient during an update, communication buckets.
#
# For mixed-precision Adam, the literature quotes 16, 18 or 20 bytes per parameter. They are all right:
# they count different layouts. The ZeRO paper writes (2 + 2 + K)Ψ with K = 12 (fp32 master + two fp32
# moments); Hugging Face keeps fp32 gradients instead of 16-bit ones (18); DeepSpeed's ZeRO-2 estimator keeps both
# (20), while its ZeRO-3 estimator counts 18 (section 5 compares both with this model).
# Plain fp32 Adam is 16 as well:

# %% [markdown] lang="zh" en="568694807ee0"
# ## 1. 解剖训练的一步
#
# GPU 训练时，显存里有两类东西：
#
# - **模型状态**只随参数量 Ψ 增长，与其他因素无关：前向和反向中使用的权重、它们的梯度，以及优化器保存的内容，
#   即 fp32 **主权重**（混合精度时）和优化器**状态**（Adam：每个权重两个动量；带动量的 SGD：一个）。
# - **激活值**随批大小 × 序列长度 × 层数增长：它们是 autograd 在前向中保存下来的每一个张量，因为反向需要它们。
#   此外还有**临时张量**：autocast 生成的 16 位权重副本、参数更新期间的 fp32 梯度、通信桶（bucket）。
#
# 对于混合精度 Adam，文献给出的数字是每参数 16、18 或 20 字节。三者都对：它们统计的是不同的布局。ZeRO 论文
# 写作 (2 + 2 + K)Ψ，其中 K = 12（fp32 主权重 + 两个 fp32 动量）；Hugging Face 保存的是 fp32 梯度而不是 16 位梯度
# （18）；DeepSpeed 的 ZeRO-2 估算器两种梯度都算上（20），而它的 ZeRO-3 估算器算的是 18（第 5 节把这两者与本模型
# 做了对比）。
# 纯 fp32 的 Adam 同样是 16：

# %%
print(mem.conventions_table("adam"))
assert [mem.bytes_per_param(p, "adam") for p in ("bf16-master", "bf16-master-fp32-grads", "bf16-master-fp32-accum")] == [16, 18, 20]
assert mem.bytes_per_param("fp32", "adam") == mem.bytes_per_param("bf16-master", "adam") == 16

# %% [markdown]
# The same numbers per precision policy and optimizer, as stacked bars (bytes per parameter; `weight_copies` is
# autocast's temporary bf16 copy of the weights; Adafactor's factored second moment is ~0 bytes per parameter):

# %% [markdown] lang="zh" en="98fcf0f14894"
# 同样的数字按精度策略和优化器分列，画成堆叠条形图（单位为每参数字节数；`weight_copies` 是 autocast 生成的临时
# bf16 权重副本；Adafactor 的二阶动量经过因子分解，每参数约为 0 字节）：

# %%
setups = [("fp32", "adam"), ("bf16", "adam"), ("bf16-master", "adam"), ("bf16-master-fp32-grads", "adam"),
          ("bf16-master-fp32-accum", "adam"), ("bf16-master", "sgd-momentum"), ("bf16-master", "adam-8bit"),
          ("bf16-master", "adafactor"), ("bf16-pure", "adam")]
bars = {f"{p}\n{o}": mem.model_state_bytes(1, p, o).device for p, o in setups}
plots.memory_bars(bars, title="model-state bytes per parameter (no ZeRO)")
plt.show()

# %% [markdown]
# Read the bars from the top: the optimizer side (master weights + states, red and green) is 12 of the 16
# bytes of mixed-precision Adam. Casting the weights to 16 bits only shrinks the blue and orange parts.

# %% [markdown] lang="zh" en="fc444a84cf14"
# 从上往下读这些条形：在混合精度 Adam 的 16 字节中，优化器一侧（主权重 + 状态，红色和绿色）占了 12 字节。
# 把权重转换为 16 位，缩小的只是蓝色和橙色两部分。

# %% [markdown]
# ## 2. Predicted vs measured, on the tiny GPT
#
# `mem.predict_torch_state` predicts, tensor by tensor, what a model and its optimizer hold after one step
# (including torch's 4-byte `step` counter per tensor for Adam). `mem.measure_model_state` then counts the
# bytes of the real storages: every parameter, every `.grad`, every fp32 master copy and every optimizer-state
# tensor. The policies come from the one table, `labkit.precision.POLICIES`: first exactly the six that notebook 04
# trains (`train.POLICIES`), then the three `-master` layouts, which use `mem.MasterWeightOptimizer`: bf16 model,
# fp32 masters, and three gradient layouts (16: bf16 grads; 18: fp32 grads; 20: both).
#
# Two names changed when the policies moved into one table: what this notebook called `mixed` is now
# `bf16-master`, and `amp` is now `bf16` (autocast over fp32 weights, as in notebook 04). The old names still work
# as aliases, each with one meaning; `bf16` no longer stands for the master-copy layout.

# %% [markdown] lang="zh" en="421eddfe5dc6"
# ## 2. 预测与测量：以小型 GPT 为例
#
# `mem.predict_torch_state` 逐个张量地预测模型及其优化器在一步之后持有的内容（对 Adam 还包括 torch 为每个张量
# 保存的 4 字节 `step` 计数器）。随后 `mem.measure_model_state` 统计真实存储的字节数：每个参数、每个 `.grad`、
# 每份 fp32 主权重副本以及每个优化器状态张量。各种策略都来自同一张表 `labkit.precision.POLICIES`：先是
# notebook 04 训练的那六种（`train.POLICIES`），不多不少；然后是三种 `-master` 布局，它们使用
# `mem.MasterWeightOptimizer`：bf16 模型、fp32 主权重，外加三种梯度布局（16：bf16 梯度；18：fp32 梯度；
# 20：两者都有）。
#
# 策略并入同一张表时，有两个名字变了：本 notebook 原先所说的 `mixed` 现在叫 `bf16-master`，`amp` 现在叫 `bf16`
# （对 fp32 权重做 autocast，与 notebook 04 相同）。旧名字仍可作为别名使用，每个别名只有一种含义；`bf16` 不再
# 表示主权重副本布局。

# %%
task = data.make_token_task("reverse", n=512, n_digits=6, vocab_size=12, seed=0)
cfg = models.GPTConfig(vocab_size=task.vocab_size, seq_len=task.seq_len)
x, y = task.inputs[:32].clone(), task.targets[:32].clone()  # own storage: a view would keep all 512 alive

def one_step(policy, optimizer, batch=(x, y)):
    model, opt = mem.setup_training(models.TinyGPT(cfg, seed=0), policy, optimizer)
    with precision.autocast(policy, "cpu"):
        models.lm_loss(model(batch[0]).float(), batch[1]).backward()
    opt.step()
    return model, opt

# %%
n = models.count_parameters(models.TinyGPT(cfg))
print(f"tiny GPT: {n:,} parameters in {len(list(models.TinyGPT(cfg).parameters()))} tensors\n")
print(f"{'policy':<23} {'optimizer':<13} {'predicted B':>12} {'measured B':>11} {'B/param':>8}")
masters = [name for name, pol in precision.POLICIES.items() if pol.master]
for policy, optimizer in [*[(p, "adamw") for p in train.POLICIES], *[(p, "adamw") for p in masters],
                          ("fp32", "sgd-momentum"), ("fp32", "adafactor")]:
    model, opt = one_step(policy, optimizer)
    measured, predicted = mem.measure_model_state(model, opt), mem.predict_torch_state(model, policy, optimizer)
    assert measured == predicted, (policy, optimizer, measured, predicted)
    total = sum(measured.values())
    print(f"{policy:<23} {optimizer:<13} {sum(predicted.values()):>12,} {total:>11,} {total / n:>8.2f}")

# %% [markdown]
# Every row matches to the byte. The bytes per parameter are 16, 18 and 20 plus a little: 29 `step` counters of
# 4 bytes. Adafactor's row is the cheapest: its second moment is a row and a column vector per matrix.
#
# The breakdown of the 20-byte layout, category by category:

# %% [markdown] lang="zh" en="df0d08190d55"
# 每一行都精确到字节地吻合。每参数字节数是 16、18 和 20 再多一点：多出来的是 29 个 4 字节的 `step` 计数器。
# Adafactor 那一行最省：它的二阶动量对每个矩阵只是一个行向量加一个列向量。
#
# 20 字节布局按类别的明细：

# %%
model, opt = one_step("bf16-master-fp32-accum", "adamw")
for k, v in mem.measure_model_state(model, opt).items():
    print(f"{k:<11} {v:>9,} B = {v / n:.2f} B/param")

# %% [markdown]
# **A rough cross-check from the operating system.** The process's resident memory (RSS) should grow by about
# what the tensors take. It is only rough: the allocator keeps freed memory for reuse, and pages are shared. We
# use a larger MLP (about 8.4 M parameters) so that the delta stands out from the noise:

# %% [markdown] lang="zh" en="1abbaf96a948"
# **用操作系统做一次粗略的交叉验证。** 进程的常驻内存（RSS）应当大约增长张量所占的量。这只是粗略的：分配器会
# 留着已释放的内存以便复用，而且有些内存页是共享的。我们用一个更大的 MLP（约 8.4 M 参数），好让增量从噪声中
# 显现出来：

# %%
# NBVAL_IGNORE_OUTPUT
big = models.MLP(1024, 1024, 1024, depth=7, seed=0)
xb = torch.randn(64, 1024)
rss0 = mem.process_rss()
opt = torch.optim.AdamW(big.parameters(), lr=1e-3)
big(xb).pow(2).mean().backward()
opt.step()
state = mem.measure_model_state(big, opt)
extra = state["grads"] + state["optimizer"]
if rss0 is not None:
    print(f"grads + Adam states: {extra / 1e6:.1f} MB exact; RSS grew by {(mem.process_rss() - rss0) / 1e6:.1f} MB")
del big, opt

# %% [markdown]
# **On a GPU** torch's caching allocator counts every byte it hands out. `torch.cuda.max_memory_allocated` gives
# the peak of a step (model states + activations + temporaries) and `torch.cuda.memory_summary` the allocator's
# counters (section 7 shows what it contains).
# `labkit.device` wraps both (`max_memory_allocated`, `memory_summary`); on a CPU they return `None`, and this
# notebook then relies on the exact tensor counts above. The cell runs the same step on CUDA when there is one:

# %% [markdown] lang="zh" en="c12e2482b6c5"
# **在 GPU 上**，torch 的缓存分配器会记下它分配出去的每个字节。`torch.cuda.max_memory_allocated` 给出一步的峰值
# （模型状态 + 激活值 + 临时张量），`torch.cuda.memory_summary` 给出分配器的各项计数器（第 7 节会说明其中的内容）。
# `labkit.device` 封装了这两者（`max_memory_allocated`、`memory_summary`）；在 CPU 上它们返回 `None`，此时本
# notebook 就依靠上面精确的张量统计。有 CUDA 设备时，下面的单元格会在 CUDA 上运行同样的一步：

# %%
# NBVAL_IGNORE_OUTPUT
if device.is_cuda(dev):
    model, opt = mem.setup_training(models.TinyGPT(cfg, seed=0).to(dev), "fp32", "adamw")
    device.reset_peak_memory_stats(dev)
    models.lm_loss(model(x.to(dev)), y.to(dev)).backward()
    opt.step()
    print(f"CUDA peak: {device.max_memory_allocated(dev):,} B; exact model states: "
          f"{sum(mem.measure_model_state(model, opt).values()):,} B\n{device.memory_summary(dev)}")
else:
    print(f"No CUDA device ({dev}): max_memory_allocated -> {device.max_memory_allocated(dev)}. "
          "On a GPU the peak is model states + activations + allocator rounding (512-byte blocks).")

# %% [markdown]
# ## 3. Why "memory went up when we turned on AMP"
#
# `torch.autocast` does not change what is stored: parameters, gradients and Adam states stay fp32 (16 B/param,
# exactly as measured above for `bf16`). It *adds* something: every Linear weight is cast to bf16 in the forward
# pass, and autograd keeps those copies until backward (2 B/param more). Activations are partly bf16 (matmul
# inputs) and partly still fp32 (LayerNorm inputs, the fp32 softmax island, the residual stream).
# Saved-tensor hooks show exactly what the tiny GPT's forward pass keeps for backward.
#
# **Predict, then run.** With bf16 autocast, what fraction of the fp32 run's saved bytes (activations + weight copies)
# does the forward pass keep? (`1.0`: the same; `0.5`: half.)

# %% [markdown] lang="zh" en="48bb30fb9920"
# ## 3. 为什么“打开 AMP 之后显存反而涨了”
#
# `torch.autocast` 不改变存储的内容：参数、梯度和 Adam 状态都仍是 fp32（每参数 16 B，与上面对 `bf16` 的测量结果
# 完全一致）。它反而*增加*了一样东西：前向中每个 Linear 层的权重都会被转换成 bf16，而 autograd 会把这些副本一直
# 保留到反向（每参数再多 2 B）。激活值一部分是 bf16（矩阵乘法的输入），一部分仍是 fp32（LayerNorm 的输入、softmax
# 所在的 fp32 局部计算区、残差流）。
# 保存张量钩子能准确显示小型 GPT 的前向为反向保留了什么。
#
# **先预测，再运行。** 使用 bf16 autocast 时，前向保留的字节（激活值 + 权重副本）是 fp32 运行时的几分之几？
# （`1.0`：一样多；`0.5`：一半。）

# %%
prediction = ...
### BEGIN SOLUTION
prediction = 0.7
### END SOLUTION
predict("06.amp-saved", prediction)

# %% tags=["workspace-clear"]
small = models.TinyGPT(cfg, seed=0)
saved = {}
for name, enabled in (("fp32", False), ("bf16 autocast", True)):
    def fwd():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            return small(x)
    out, saved[name] = mem.measure_saved_tensors(fwd, small.parameters())
    print(f"{name:<14} activations {saved[name].activations:>9,} B   weight copies {saved[name].weight_copies:>7,} B")
    del out
kept = {k: v.activations + v.weight_copies for k, v in saved.items()}
reveal("06.amp-saved", kept["bf16 autocast"] / kept["fp32"])
assert 0.5 < kept["bf16 autocast"] / kept["fp32"] < 1

# %% [markdown]
# Activations shrink by less than half, and the weight copies come on top. For a 7B model the model states do
# not move at all, and the weight copies add 14 GB:

# %% [markdown] lang="zh" en="6eef240ab089"
# 激活值减少的幅度不到一半，权重副本还要另外加上。对于 7B 模型，模型状态纹丝不动，权重副本却多出 14 GB：

# %%
for policy in ("fp32", "bf16"):
    e = mem.model_state_bytes(7 * 10**9, policy, "adamw")
    print(f"{policy:<5} {mem.fmt_bytes(e.device_total):>10}  {e.device}")
assert mem.model_state_bytes(7 * 10**9, "bf16", "adamw").device_total > mem.model_state_bytes(7 * 10**9, "fp32", "adamw").device_total
adam_share = (12 * 10**9 * 7) / mem.model_state_bytes(7 * 10**9, "bf16-master", "adam").device_total
print(f"master + Adam states: {adam_share:.0%} of mixed-precision model states")

# %% [markdown]
# So with Adam, mixed precision buys **speed** (16-bit matmuls) and smaller activations, not smaller model states.
# What does shrink the model states is sharding them (ZeRO, section 5), a leaner optimizer (section 6), or
# offloading them to the CPU.
#
# > **Common misconception** (seed 002 §2.1, seed 000 §3.2): mixed precision keeps FP16 model weights beside an FP32
# > master copy (both articles), FP16 "cuts memory by 50 %" (seed 002), and the `autocast` + `GradScaler` code the
# > articles give (seed 002 §2.1, seed 000 §4.1) implements that scheme.
# >
# > **Why it is wrong:** the prose and the code describe two different schemes. Persistent 16-bit weights plus an
# > FP32 master copy (apex's "O2", DeepSpeed's fp16/bf16 engines, `bf16-master` here) hold 2 + 4 bytes of weights
# > per parameter. `autocast` (apex's "O1", the articles' code, `bf16` here) keeps the FP32 parameters as the only
# > weights, 4 bytes, and makes 16-bit copies on the fly in the forward pass, kept until backward (measured above).
# > Neither halves the model states: with Adam both come to 16 B/param (section 2).
# >
# > **What is true:** the halving applies to what is actually stored in 16 bits: the activations that autocast
# > computes in BF16/FP16 (part of them, as measured above) and, in the master-weights scheme, the weights the
# > forward pass reads. The cell below counts the weight bytes of both schemes from the real tensors.

# %% [markdown] lang="zh" en="002058256641"
# 所以在使用 Adam 时，混合精度换来的是**速度**（16 位矩阵乘法）和更小的激活值，而不是更小的模型状态。
# 真正能缩小模型状态的，是把它们分片（ZeRO，第 5 节）、换用更精简的优化器（第 6 节），或者把它们卸载到 CPU。
#
# > **常见误解**（seed 002 §2.1，seed 000 §3.2）：混合精度在一份 FP32 主权重副本之外再保存一份 FP16 模型权重（两篇
# > 文章都这么说），FP16 能“把显存减少 50 %”（seed 002），而且文章给出的 `autocast` + `GradScaler` 代码
# > （seed 002 §2.1，seed 000 §4.1）实现的正是这种方案。
# >
# > **错在哪里：** 文字和代码描述的是两种不同的方案。常驻的 16 位权重加一份 FP32 主权重副本（apex 的“O2”、
# > DeepSpeed 的 fp16/bf16 引擎、这里的 `bf16-master`），每个参数的权重占 2 + 4 字节。`autocast`（apex 的“O1”、
# > 文章中的代码、这里的 `bf16`）只保留 FP32 参数这一份权重，占 4 字节，在前向中临时生成 16 位副本，并一直保留
# > 到反向（上面已经测过）。两者都不能让模型状态减半：使用 Adam 时都是每参数 16 B（第 2 节）。
# >
# > **实际情况：** 减半只适用于真正以 16 位存储的东西：autocast 以 BF16/FP16 计算的激活值（如上面所测，只是其中
# > 一部分），以及在主权重方案中前向读取的那份权重。下面的单元格根据真实的张量，统计两种方案的权重字节数。

# %%
o1 = models.TinyGPT(cfg, seed=0)                                                      # autocast: the model stays fp32
o2, o2_opt = mem.setup_training(models.TinyGPT(cfg, seed=0), "bf16-master", "adamw")  # 16-bit weights, fp32 masters
weights = {"autocast": mem.tensor_bytes(o1.parameters()),
           "master": mem.tensor_bytes([*o2.parameters(), *o2_opt.masters])}
copies = saved["bf16 autocast"].weight_copies                                          # measured above
print(f"weights held: autocast {weights['autocast'] / n:.0f} B/param (plus {copies / n:.2f} B/param of bf16 copies "
      f"from forward to backward); 16-bit + master {weights['master'] / n:.0f} B/param")
assert weights == {"autocast": 4 * n, "master": 6 * n} and {p.element_size() for p in o1.parameters()} == {4}
assert {p.element_size() for p in o2.parameters()} == {2} and {m.element_size() for m in o2_opt.masters} == {4}

# %% [markdown]
# ## 4. Activations: predict, measure, checkpoint
#
# `mem.gpt_activation_bytes` counts, op by op, what the tiny GPT saves: per block the LayerNorm inputs and
# statistics, the inputs of the four matmuls, q and kᵀ copies, the attention matrix and the softmax's saved
# tensors, the GELU input and output, the causal mask. It is checked against the hooks here for several batch
# sizes and sequence lengths, with and without autocast:

# %% [markdown] lang="zh" en="bdb018a05a55"
# ## 4. 激活值：预测、测量、重计算（梯度检查点）
#
# `mem.gpt_activation_bytes` 逐个算子地统计小型 GPT 保存的内容：每个块中 LayerNorm 的输入和统计量、四次矩阵乘法
# 的输入、q 和 kᵀ 的副本、注意力矩阵和 softmax 保存的张量、GELU 的输入和输出、因果掩码。这里用钩子对它进行核对，
# 覆盖几种批大小和序列长度，并分别开启和关闭 autocast：

# %%
for batch, t, amp in [(8, 12, None), (32, 12, None), (32, 6, None), (32, 12, "bf16")]:
    est = mem.gpt_activation_bytes(cfg, batch, t, autocast=amp)
    def fwd():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp is not None):
            return small(x[:batch, :t].clone())
    out, got = mem.measure_saved_tensors(fwd, small.parameters())
    assert (got.activations, got.weight_copies) == (est.activations, est.weight_copies)
    print(f"B={batch:>2} T={t:>2} {amp or 'fp32':<5} saved {est.saved:>9,} B  per block {est.per_layer:>8,} B"
          f"  = {est.per_token_per_layer:,.0f} B/token/layer")

# %% [markdown]
# **Activation checkpointing** keeps only each block's input in the forward pass and recomputes the block during
# backward. `mem.checkpointed(model)` turns it on (per block) for the duration of a `with`:

# %% [markdown] lang="zh" en="38de64aeaf36"
# **激活重计算**（梯度检查点）在前向中只保留每个块的输入，在反向时重新计算这个块。`mem.checkpointed(model)` 在
# `with` 语句的范围内（按块）开启它：

# %%
_, without = mem.measure_saved_tensors(lambda: small(x), small.parameters())
with mem.checkpointed(small):  # each block runs as torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
    out, got = mem.measure_saved_tensors(lambda: small(x), small.parameters())
plain, ckpt = mem.gpt_activation_bytes(cfg, 32), mem.gpt_activation_bytes(cfg, 32, checkpointing=True)
assert got.activations == ckpt.activations and without.activations == plain.activations   # as predicted
print(f"saved after forward (measured): {without.activations:,} B without, {got.activations:,} B with "
      f"checkpointing, {1 - got.activations / without.activations:.0%} less")
print(f"peak during backward with checkpointing: {ckpt.peak:,} B (one block recomputed at a time)")

# %% [markdown]
# The price is compute: each block's forward runs twice. Count the calls instead of timing them:

# %% [markdown] lang="zh" en="d49c87ec8f10"
# 代价是计算：每个块的前向要运行两次。我们不计时，而是数调用次数：

# %%
calls = []
hook = small.blocks[0].register_forward_pre_hook(lambda *a: calls.append(1))
with mem.checkpointed(small):
    models.lm_loss(small(x), y).backward()
hook.remove()
print("forward calls of block 0 in one checkpointed step:", len(calls))
assert len(calls) == 2

# %% [markdown]
# > **Common misconception** (seed 002 §5.2): activation (gradient) checkpointing "reduces memory by 50 %".
# >
# > **Why it is wrong:** there is no fixed figure. A checkpointed segment drops what its ops save inside it and keeps
# > only its input, so the saving is the segments' inner activations minus their inputs, and it depends on where the
# > segments are cut. Per block in the tiny GPT it is the share printed above; an MLP of ReLU layers checkpointed layer
# > by layer saves nothing at all, because such a layer saves only its input (the ReLU keeps its output, which is
# > the next layer's input), and that is exactly what a checkpoint keeps. Checkpointing touches only activations,
# > never the model states, and during backward one segment is recomputed on top.
# >
# > **What is true:** saving = (inner activations − inputs kept) of the checkpointed segments, paid for with one more
# > forward pass per segment. The next cell runs each block alone under the same hooks, counts what it saves, and
# > checks that this accounts for the measured saving to the byte; the one after measures the ReLU MLP.

# %% [markdown] lang="zh" en="0803c49d93d2"
# > **常见误解**（seed 002 §5.2）：激活重计算（梯度检查点）能“减少 50 % 的显存”。
# >
# > **错在哪里：** 并不存在一个固定的比例。一个做重计算的分段会丢掉其内部各算子保存的内容，只保留它的输入，所以
# > 节省量等于各分段内部的激活值减去它们的输入，取决于分段切在哪里。在小型 GPT 中按块切分，节省的比例就是上面打印
# > 的那个数；而一个由 ReLU 层组成的 MLP 若逐层做重计算，则什么也省不下，因为这样的层只保存自己的输入（ReLU 保存
# > 的是它的输出，也就是下一层的输入），而这恰恰就是重计算分段要保留的东西。重计算只涉及激活值，从不触及模型状态，
# > 而且在反向中，正在重计算的那个分段的激活值还要另外算上。
# >
# > **实际情况：** 节省量 = 各重计算分段的（内部激活值 − 保留的输入），代价是每个分段多一次前向。下一个单元格在同样的
# > 钩子下单独运行每个块，统计它保存的内容，并核对这些内容能精确到字节地解释测得的节省量；再下一个单元格测量 ReLU MLP。

# %%
h = small.tok(x) + small.pos(torch.arange(x.shape[1]))            # the first block's input, (B, T, C) fp32
inner = []
for block in small.blocks:                                          # each block alone, as the forward pass runs it
    h, s = mem.measure_saved_tensors(lambda: block(h), small.parameters())
    inner.append(s.activations)
kept = cfg.n_layers * h.nbytes                                      # a checkpoint keeps its block's (B, T, C) input
assert without.activations - got.activations == sum(inner) - kept > 0
states = sum(mem.measure_model_state(*one_step("fp32", "adamw")).values())
share = (sum(inner) - kept) / (without.activations + states)
print(f"inner activations of the blocks {sum(inner):,} B - inputs kept {kept:,} B = the measured saving; of the "
      f"activations plus fp32 Adam's model states ({states:,} B) that is {share:.0%}")

# %%
relu, xr = models.MLP(64, 256, 1, depth=6, activation="relu", seed=0), torch.randn(32, 64)
_, relu_plain = mem.measure_saved_tensors(lambda: relu(xr), relu.parameters())
with mem.checkpointed(relu):                                        # one checkpoint per Linear + ReLU
    _, relu_ck = mem.measure_saved_tensors(lambda: relu(xr), relu.parameters())
print(f"ReLU MLP, checkpointed per layer: {relu_plain.activations:,} B without, {relu_ck.activations:,} B with")
assert relu_ck.activations == relu_plain.activations

# %% [markdown]
# ## 5. ZeRO: sharding the model states
#
# With N data-parallel GPUs, ZeRO stage 1 shards the optimizer side (master + states) over the GPUs, stage 2
# also the gradients, stage 3 also the parameters. The ZeRO paper's example, 7.5B parameters on 64 GPUs:

# %% [markdown] lang="zh" en="81e131d6d0c0"
# ## 5. ZeRO：对模型状态分片
#
# 有 N 块数据并行的 GPU 时，ZeRO 阶段 1 把优化器一侧（主权重 + 状态）分片到各块 GPU 上，阶段 2 再加上梯度，
# 阶段 3 再加上参数。ZeRO 论文中的例子：7.5B 参数，64 块 GPU：

# %%
for stage, e in mem.zero_table(7_500_000_000, 64, "bf16-master", "adam").items():
    print(f"ZeRO-{stage}: {mem.fmt_bytes(e.device_total):>10} per GPU")
assert [round(e.device_total / 1e9, 1) for e in mem.zero_table(7_500_000_000, 64).values()] == [120.0, 31.4, 16.6, 1.9]

# %% [markdown]
# DeepSpeed ships its own estimators (`estimate_zero2_model_states_mem_needs_all_cold`, ...). `tests/test_memory.py`
# compares them with this model for many sizes and world sizes: its ZeRO-2 estimate is our 20 B/param layout,
# its ZeRO-3 estimate our 18 B/param layout plus the largest layer gathered, and its CPU figures add a 1.5×
# safety factor and the fp32 copy each process makes while loading the model. Notebook 10 measures a real
# DeepSpeed engine.
#
# **The calculator.** Pick a model size, the GPUs, the ZeRO stage, offload and precision; it says whether the
# model states fit and how much is left for activations. It starts on the seeds' configuration: a 13B model on
# 8 × A100-80GB with ZeRO-2, bf16 weights with fp32 masters (`bf16-master`) and the optimizer offloaded to the CPU.

# %% [markdown] lang="zh" en="c6e6165035ba"
# DeepSpeed 自带估算函数（如 `estimate_zero2_model_states_mem_needs_all_cold` 等）。`tests/test_memory.py`
# 针对多种模型规模和进程总数（world size），把它们与本模型进行比较：它的 ZeRO-2 估算就是我们每参数 20 B 的布局，
# ZeRO-3 估算是我们每参数 18 B 的布局再加上全收集（AllGather）到本地的最大一层，而它给出的 CPU 数字还加上了
# 1.5 倍的安全系数，以及每个进程在加载模型时生成的那份 fp32 副本。notebook 10 测量一个真实的 DeepSpeed 引擎。
#
# **计算器。** 选择模型规模、GPU、ZeRO 阶段、卸载方式和精度，它会告诉你模型状态能否放下，以及还剩多少显存留给
# 激活值。它的初始设置就是 seed 文章中的配置：13B 模型，8 × A100-80GB，ZeRO-2，bf16 权重加 fp32 主权重
# （`bf16-master`），优化器卸载到 CPU。

# %%
calc = widgets.memory_calculator("13B", gpus_per_node=8, nodes=1, stage=2, offload="optimizer",
                                 policy="bf16-master", gpu_gb=80)
calc

# %%
print(calc.result.value)
assert "26.00 GB" in calc.result.value and "54.00 GB" in calc.result.value  # states per GPU; left: it fits

# %% [markdown]
# The 26 GB are the replicated bf16 weights (2 B × 13B); the fp32 masters, the Adam states and the fp32 gradient
# partition DeepSpeed keeps beside them (16 B/param, measured in notebook 10) live in the node's CPU memory. Change the stage (offload off) and watch the per-GPU figure:

# %% [markdown] lang="zh" en="84e2f944faeb"
# 这 26 GB 是每块 GPU 上都有一份的 bf16 权重（2 B × 13B）；fp32 主权重、Adam 状态，以及 DeepSpeed 在它们旁边保存的
# fp32 梯度分区（每参数 16 B，在 notebook 10 中测量）都放在节点的 CPU 内存里。改变阶段（不开启卸载），观察每块 GPU 上的数字：

# %%
for stage in (0, 1, 2, 3):
    calc.controls["stage"].value = stage
    calc.controls["offload"].value = "none"
    print(f"ZeRO-{stage}, no offload: {calc.result.value}")

# %% [markdown]
# ## 6. Levers, and what each one costs
#
# | lever | saves | costs |
# |---|---|---|
# | smaller micro-batch | activations ∝ batch | throughput; noisier gradients (unless accumulated) |
# | gradient accumulation | activations of one micro-batch for the gradient of the whole batch | more sequential steps |
# | activation checkpointing | all but the block inputs | one extra forward per block (~33 % more compute) |
# | shorter sequences | activations ∝ T, attention ∝ T² | context the model sees |
# | leaner optimizer | model states (16 → 12, 10, ~8 B/param) | convergence behaviour to re-tune |
# | ZeRO / offload | model states ÷ N, or moved to CPU | communication; PCIe traffic and CPU time |
#
# The activation levers, predicted for the tiny GPT (fp32, batch 32 by default):

# %% [markdown] lang="zh" en="ca66bdce265b"
# ## 6. 各种手段及其代价
#
# | 手段 | 节省 | 代价 |
# |---|---|---|
# | 更小的微批次 | 激活值 ∝ 批大小 | 吞吐量；梯度噪声更大（除非做梯度累积） |
# | 梯度累积 | 只需一个微批次的激活值，就能得到整个批次的梯度 | 更多的串行步骤 |
# | 激活重计算 | 除块输入以外的全部激活值 | 每个块多一次前向（计算量约多 33 %） |
# | 更短的序列 | 激活值 ∝ T，注意力 ∝ T² | 模型能看到的上下文 |
# | 更精简的优化器 | 模型状态（每参数 16 → 12、10、~8 B） | 收敛行为需要重新调参 |
# | ZeRO / 卸载 | 模型状态 ÷ N，或移到 CPU | 通信；PCIe 流量和 CPU 时间 |
#
# 下面是对小型 GPT 预测的各项激活值手段（fp32，默认批大小 32）：

# %%
levers = {"baseline B=32": mem.gpt_activation_bytes(cfg, 32), "B=8": mem.gpt_activation_bytes(cfg, 8),
          "T=6": mem.gpt_activation_bytes(cfg, 32, seq_len=6),
          "checkpointing": mem.gpt_activation_bytes(cfg, 32, checkpointing=True),
          "bf16 autocast": mem.gpt_activation_bytes(cfg, 32, autocast="bf16")}
for name, e in levers.items():
    print(f"{name:<14} peak {e.peak:>9,} B  ({e.peak / levers['baseline B=32'].peak:.2f}×)")

# %% [markdown]
# **Gradient accumulation** gives the same gradient as the big batch with a quarter of the activations:
# four micro-batches of 8, each loss divided by 4 (the loss is a mean over supervised tokens, and every sequence
# here has the same number of them):

# %% [markdown] lang="zh" en="79f8c26a5cc9"
# **梯度累积**用四分之一的激活值得到与大批次相同的梯度：分成 4 个大小为 8 的微批次，每个损失除以 4（损失是对
# 有监督 token 取的平均值，而这里每个序列的有监督 token 数都相同）：

# %%
full = models.TinyGPT(cfg, seed=0)
models.lm_loss(full(x), y).backward()
acc = models.TinyGPT(cfg, seed=0)
for i in range(4):
    (models.lm_loss(acc(x[8 * i:8 * i + 8]), y[8 * i:8 * i + 8]) / 4).backward()
for a, b in zip(acc.parameters(), full.parameters()):
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)
print("accumulated gradient == full-batch gradient (to fp32 rounding)")

# %% [markdown]
# **Optimizer choice**, for a 7B model in mixed precision on one GPU (no ZeRO):

# %% [markdown] lang="zh" en="e4b13afc70ee"
# **优化器的选择**：7B 模型，混合精度，单块 GPU（不用 ZeRO）：

# %%
for opt_name in ("adam", "sgd-momentum", "adam-8bit", "adafactor", "sgd"):
    e = mem.model_state_bytes(7 * 10**9, "bf16-master", opt_name)
    print(f"{opt_name:<13} {mem.bytes_per_param('bf16-master', opt_name):>3} B/param  {mem.fmt_bytes(e.device_total):>10}")

# %% [markdown]
# ## 7. Memory that does not drop
#
# "I deleted the tensor and the memory is still used." There are two different causes, and they need different fixes:
#
# 1. **Something still refers to it.** `del x` removes one *name*; the memory is freed only when the last
#    reference goes. The usual hidden references: a loss kept as a tensor (it holds its whole autograd graph),
#    a view of a larger tensor, the optimizer's state, gradients that are zeroed instead of freed.
# 2. **The allocator keeps it for reuse.** On a GPU, PyTorch's caching allocator does not give freed blocks back
#    to the driver, so `nvidia-smi` still counts them. That memory *is* free for PyTorch's next tensor.
#
# **A lingering loss.** A validation loop outside `torch.no_grad()` that appends `loss` to a list keeps every
# activation of every batch alive: the loss is the root of a graph that owns the saved tensors.
# `mem.graph_saved_bytes(t)` walks that graph and counts what it still holds (the parameters excluded: the model
# holds those anyway). `loss.item()` is a Python float and holds nothing:

# %% [markdown] lang="zh" en="c5f5767b3b9f"
# ## 7. 降不下来的显存
#
# “我已经删掉了张量，显存却仍被占着。”这有两种不同的原因，解决办法也不同：
#
# 1. **还有东西引用着它。** `del x` 删掉的只是一个*名字*；只有最后一个引用消失，内存才会释放。常见的隐藏引用：
#    以张量形式保留下来的 loss（它持有整张 autograd 计算图）、一个大张量的视图、优化器的状态、被填零而非释放的梯度。
# 2. **分配器把它留着以便复用。** 在 GPU 上，PyTorch 的缓存分配器不会把释放的块还给驱动，所以 `nvidia-smi` 仍然
#    把它们算作已占用。对 PyTorch 的下一个张量来说，这部分显存*确实*是空闲的。
#
# **残留的 loss。** 一个验证循环如果不在 `torch.no_grad()` 中运行，又把 `loss` 追加到列表里，就会让每个批次的
# 每个激活值都一直无法释放：loss 是一张计算图的根，而保存下来的张量归这张图所有。
# `mem.graph_saved_bytes(t)` 遍历这张图，统计它仍持有的内容（参数除外：模型本来就持有它们）。`loss.item()` 是
# 一个 Python 浮点数，什么也不持有：

# %%
model = models.TinyGPT(cfg, seed=0)
params = list(model.parameters())
kept, logged = [], []
for _ in range(4):  # "validation": forward only, no backward, no torch.no_grad()
    loss = models.lm_loss(model(x), y)
    kept.append(loss)          # the bug: the tensor, with its graph
    logged.append(loss.item())  # the fix: a Python float
held = [mem.graph_saved_bytes(t, exclude=params) for t in kept]
_, hooks = mem.measure_saved_tensors(lambda: models.lm_loss(model(x), y), params)
print(f"each kept loss holds {held[0]:,} B (the saved-tensor hooks counted {hooks.activations:,} B in its forward)")
print(f"the list of 4 holds ~{sum(held) / 1e6:.0f} MB (they share only the batch and the mask); the floats hold 0 B")
assert held == [hooks.activations] * 4

# %% [markdown]
# The graph grows with every batch kept: on a GPU, 4 batches here, or 1000 validation batches of a real model,
# and the run dies with out-of-memory in the middle of evaluation. Under `torch.no_grad()` no graph is built at
# all, and after `backward()` the graph frees its saved tensors (the nodes stay until the loss is dropped):

# %% [markdown] lang="zh" en="d5e385bf6795"
# 每多保留一个批次，计算图就多一份：在 GPU 上，这里是 4 个批次，换成真实模型就是 1000 个验证批次，运行会在评估
# 中途因显存不足（OOM）而崩溃。在 `torch.no_grad()` 下根本不会构建计算图；而 `backward()` 之后，计算图会释放它
# 保存的张量（图的节点则一直留到 loss 被丢弃为止）：

# %%
with torch.no_grad():
    print("no_grad loss holds", mem.graph_saved_bytes(models.lm_loss(model(x), y)), "B")
loss = models.lm_loss(model(x), y)
before = mem.graph_saved_bytes(loss, exclude=params)
loss.backward()
print(f"training loss: {before:,} B before backward, {mem.graph_saved_bytes(loss):,} B after")
assert before > 0 and mem.graph_saved_bytes(loss) == 0
kept.clear()  # the list was the last reference: the 4 graphs are freed now

# %% [markdown]
# **A view keeps its whole storage.** Slicing does not copy: a 10-element view of a 4 MiB tensor keeps all
# 4 MiB alive after `del`. `.clone()` copies the 10 elements and lets the big storage go:

# %% [markdown] lang="zh" en="724f43e345a0"
# **视图会保住它的整个存储。** 切片不会复制：一个 4 MiB 张量的 10 元素视图，在 `del` 之后仍让整整 4 MiB 无法释放。
# `.clone()` 只复制这 10 个元素，让大的存储得以释放：

# %%
big_t = torch.empty(2**20)  # 4 MiB of fp32
first10 = big_t[:10]
del big_t
print(f"the view holds {mem.tensor_bytes([first10]):,} B; a clone holds {mem.tensor_bytes([first10.clone()]):,} B")
assert mem.tensor_bytes([first10]) == 4 * 2**20 and mem.tensor_bytes([first10.clone()]) == 40

# %% [markdown]
# **Optimizer state and gradients** are long-lived by design. Adam's two moments appear at the first `step()` and
# stay for the whole run (that is the 8 B/param of section 1); gradients stay between steps unless
# `zero_grad(set_to_none=True)` (the default since torch 2.0) drops them instead of filling them with zeros:

# %% [markdown] lang="zh" en="8cb5858b3166"
# **优化器状态和梯度**本来就是长期存在的。Adam 的两个动量在第一次 `step()` 时出现，并在整个运行期间一直存在
# （这就是第 1 节中的每参数 8 B）；梯度在两步之间一直保留，除非 `zero_grad(set_to_none=True)`（torch 2.0 起的
# 默认值）把它们丢掉，而不是填成零：

# %%
model, opt = mem.setup_training(models.TinyGPT(cfg, seed=0), "fp32", "adamw")
models.lm_loss(model(x), y).backward()
print("after backward:          ", mem.measure_model_state(model, opt))
opt.step()
opt.zero_grad(set_to_none=False)
print("step + zero_grad(False): ", mem.measure_model_state(model, opt))
opt.zero_grad(set_to_none=True)
print("zero_grad(set_to_none):  ", mem.measure_model_state(model, opt))
assert "grads" not in mem.measure_model_state(model, opt) and mem.measure_model_state(model, opt)["optimizer"] > 0

# %% [markdown]
# **The caching allocator (GPU).** `cudaMalloc`/`cudaFree` are slow and synchronise the device, so PyTorch asks the
# driver for large segments once and carves tensors out of them itself. Two counters follow it:
#
# - `torch.cuda.memory_allocated()`: bytes in live tensors. It drops as soon as the last reference goes.
# - `torch.cuda.memory_reserved()`: bytes the allocator holds from the driver, live or cached. It does **not**
#   drop after `del`; `nvidia-smi` shows this plus the CUDA context (a few hundred MB per process).
#
# `torch.cuda.empty_cache()` returns the *unused* cached segments to the driver: useful when another process (or
# a notebook next to yours) needs the memory, useless against an out-of-memory error in your own process (PyTorch
# already frees its cache and retries before it raises). What can make an OOM happen with plenty of
# reserved-but-free memory is **fragmentation**: free blocks scattered between live tensors, none large enough
# for the next request (the OOM message then shows "reserved but unallocated" memory far above the request).
# Variable shapes make it worse; `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (set before the first CUDA
# call) lets segments grow in place and usually cures it. `torch.cuda.memory_summary()` tabulates the allocator's
# counters, and a memory snapshot (`torch.cuda.memory._record_memory_history()`, viewed at
# https://pytorch.org/memory_viz) shows who holds what. `labkit.device` wraps the counters; the cell measures them
# when a CUDA device is present:

# %% [markdown] lang="zh" en="bfea5bc60a45"
# **缓存分配器（GPU）。** `cudaMalloc`/`cudaFree` 很慢，而且会同步设备，所以 PyTorch 一次性向驱动申请大的内存段
# （segment），再自己从中切出张量。有两个计数器跟踪它：
#
# - `torch.cuda.memory_allocated()`：存活张量所占的字节数。最后一个引用一消失，它就下降。
# - `torch.cuda.memory_reserved()`：分配器从驱动那里持有的字节数，无论在用还是已缓存。`del` 之后它**不会**下降；
#   `nvidia-smi` 显示的是它再加上 CUDA 上下文（每个进程几百 MB）。
#
# `torch.cuda.empty_cache()` 把*未使用*的缓存段还给驱动：当另一个进程（或你旁边的另一个 notebook）需要这块
# 显存时它有用，但对付你自己进程中的显存不足错误毫无用处（PyTorch 在报错之前已经会释放缓存并重试）。保留但
# 空闲的显存还很多时仍发生 OOM，可能的原因是**碎片化**：空闲块散落在存活的张量之间，没有一块大到足以满足下一次
# 请求（此时 OOM 信息中显示的“reserved but unallocated”显存远大于请求的大小）。形状多变会让碎片化更严重；
# `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`（在第一次 CUDA 调用之前设置）让内存段可以原地增长，通常
# 就能解决问题。`torch.cuda.memory_summary()` 把分配器的计数器列成表格，而显存快照
# （`torch.cuda.memory._record_memory_history()`，在 https://pytorch.org/memory_viz 查看）能显示谁持有什么。
# `labkit.device` 封装了这些计数器；有 CUDA 设备时，下面的单元格会测量它们：

# %%
# NBVAL_IGNORE_OUTPUT
if device.is_cuda(dev):
    device.empty_cache(dev)
    base = (device.memory_allocated(dev), device.memory_reserved(dev))
    t = torch.empty(256 * 2**20, device=dev)  # 1 GiB
    with_t = (device.memory_allocated(dev), device.memory_reserved(dev))
    del t
    after_del = (device.memory_allocated(dev), device.memory_reserved(dev))
    device.empty_cache(dev)
    after_empty = (device.memory_allocated(dev), device.memory_reserved(dev))
    for what, (a, r) in [("start", base), ("1 GiB tensor", with_t), ("del", after_del), ("empty_cache", after_empty)]:
        print(f"{what:<13} allocated {a / 2**20:8.1f} MiB   reserved {r / 2**20:8.1f} MiB")
else:
    print(f"No CUDA device ({dev}): memory_allocated -> {device.memory_allocated(dev)}, memory_reserved -> "
          f"{device.memory_reserved(dev)}.\nOn a GPU: a 1 GiB tensor raises both by 1 GiB; `del` drops allocated, "
          "reserved stays; empty_cache() drops reserved.")

# %% [markdown]
# > **Common misconception** (seed 000 §5.1): `torch.cuda.memory_summary()` shows the memory "of each tensor".
# >
# > **Why it is wrong:** it prints the caching allocator's statistics, no tensor at all: allocated, active, requested
# > and reserved bytes, non-releasable memory, and the counts of allocations and segments, each as current, peak,
# > total allocated and total freed, split into the large pool and the small pool (requests of 1 MB or less). Its
# > documentation calls it "a human-readable printout of the current memory allocator statistics"
# > (https://docs.pytorch.org/docs/stable/generated/torch.cuda.memory_summary.html), and it formats
# > `torch.cuda.memory_stats()`: the cell below lists every key it reads.
# >
# > **What is true:** per-allocation detail (size, stack trace, and so the tensor behind it) comes from a memory
# > snapshot: `torch.cuda.memory._record_memory_history()`, then `torch.cuda.memory._dump_snapshot(path)`, viewed at
# > https://pytorch.org/memory_viz; the tensors of a model and optimizer can be counted as section 2 does. So that it
# > runs without a GPU, the cell below gives torch's own `memory_summary` a statistics dict with every counter at 0
# > (section 2 prints a real one when there is a GPU): the numbers mean nothing, the rows are the real report's.

# %% [markdown] lang="zh" en="aed9f52b7cc9"
# > **常见误解**（seed 000 §5.1）：`torch.cuda.memory_summary()` 显示“每个张量”的显存。
# >
# > **错在哪里：** 它打印的是缓存分配器的统计信息，根本不涉及任何张量：已分配（allocated）、活跃（active）、请求
# > （requested）和保留（reserved）的字节数，不可释放的内存，以及分配次数和内存段个数；每一项都分为当前值、峰值、
# > 累计分配和累计释放，并按大块池和小块池（1 MB 及以下的请求）分列。它的文档称之为“a human-readable printout of
# > the current memory allocator statistics”（当前内存分配器统计信息的可读打印）
# > （https://docs.pytorch.org/docs/stable/generated/torch.cuda.memory_summary.html），它格式化的是
# > `torch.cuda.memory_stats()`：下面的单元格列出了它读取的每一个键。
# >
# > **实际情况：** 每次分配的细节（大小、调用栈，由此可知背后是哪个张量）要靠显存快照：先调用
# > `torch.cuda.memory._record_memory_history()`，再调用 `torch.cuda.memory._dump_snapshot(path)`，然后在
# > https://pytorch.org/memory_viz 查看；模型和优化器的张量则可以像第 2 节那样统计。为了在没有 GPU 时也能运行，
# > 下面的单元格给 torch 自己的 `memory_summary` 传入一个所有计数器都为 0 的统计字典（有 GPU 时，第 2 节会打印
# > 一份真实的）：数字没有意义，但各行正是真实报告中的那些行。

# %%
zeros = collections.defaultdict(int, num_ooms=0, num_alloc_retries=0)  # every counter 0: only the layout is real
with mock.patch("torch.cuda.memory.memory_stats", return_value=zeros):
    report = torch.cuda.memory_summary(device=0)
print(report)
assert {k.split(".")[0] for k in zeros} == {"num_ooms", "num_alloc_retries", "allocated_bytes", "active_bytes",
    "requested_bytes", "reserved_bytes", "inactive_split_bytes", "allocation", "active", "segment", "inactive_split",
    "oversize_allocations", "oversize_segments"}                   # everything it reads: allocator counters

# %% [markdown]
# ## 8. Exercises
#
# **8.1** How many bytes per parameter of model state does this setup keep: bf16 weights and bf16 gradients,
# fp32 master weights, SGD with momentum (fp32 momentum), no ZeRO?

# %% [markdown] lang="zh" en="faefc57e3416"
# ## 8. 练习
#
# **8.1** 下面这个配置每个参数要保存多少字节的模型状态：bf16 权重和 bf16 梯度、fp32 主权重、带动量的 SGD
# （fp32 动量），不用 ZeRO？

# %%
answer = ...
### BEGIN SOLUTION
answer = 2 + 2 + 4 + 4
### END SOLUTION
check("06.bytes-per-param", answer)

# %% [markdown]
# **8.2** A 7B model, mixed precision with Adam (16 B/param), 8 GPUs of 32 GB each. Counting model states only,
# what is the smallest ZeRO stage at which it fits? (Work it out by hand first, then use `mem.model_state_bytes`.)

# %% [markdown] lang="zh" en="ed2a01b942c8"
# **8.2** 一个 7B 模型，混合精度加 Adam（每参数 16 B），8 块 32 GB 的 GPU。只计模型状态，最低要用哪个 ZeRO 阶段
# 才能放得下？（先手算，再用 `mem.model_state_bytes` 验证。）

# %%
answer = ...
### BEGIN SOLUTION
answer = next(s for s in range(4)
              if mem.model_state_bytes(7 * 10**9, "bf16-master", "adam", stage=s, world_size=8).device_total <= 32e9)
### END SOLUTION
check("06.smallest-stage", answer)

# %% [markdown]
# **8.3** Write `per_gpu_bytes(n_params, stage, world_size)`: the ZeRO paper's per-GPU model-state bytes for
# 16 B/param (2 bf16 weights + 2 bf16 grads + K = 12). The check calls it on fresh inputs, including the
# paper's 7.5B on 64 GPUs.

# %% [markdown] lang="zh" en="2215b44807c6"
# **8.3** 写出 `per_gpu_bytes(n_params, stage, world_size)`：按 ZeRO 论文计算每块 GPU 上模型状态的字节数，取每参数
# 16 B（2 字节 bf16 权重 + 2 字节 bf16 梯度 + K = 12）。检查程序会用新的输入调用它，其中包括论文中 7.5B 参数、
# 64 块 GPU 的例子。

# %%
def per_gpu_bytes(n_params, stage, world_size):
    ...
    ### BEGIN SOLUTION
    psi, n = n_params, world_size
    return [16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n][stage]
    ### END SOLUTION

check("06.zero-per-gpu", per_gpu_bytes)

# %% [markdown]
# **8.4 Debug: validation that eats memory.** This function logs the loss of every validation batch. Memory grows with
# every batch it sees:

# %% [markdown] lang="zh" en="fceb81437bdd"
# **8.4 调试：吃显存的验证。** 这个函数记录每个验证批次的损失。它每处理一个批次，显存就涨一截：

# %%
def validation_losses(model, batches):
    losses = []
    for xb, yb in batches:
        losses.append(models.lm_loss(model(xb), yb))
    return losses

model = models.TinyGPT(cfg, seed=0)
logged = validation_losses(model, [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)])
held = sum(mem.graph_saved_bytes(v, exclude=list(model.parameters())) for v in logged)
print(f"{len(logged)} logged losses hold {held:,} B of saved tensors")
assert held > 0

# %% [markdown]
# Write a fixed `validation_losses(model, batches)` that returns the same losses, one per batch, and keeps nothing
# alive. The check runs it on a fresh model and batches.

# %% [markdown] lang="zh" en="005ab5455d6e"
# 写一个修正后的 `validation_losses(model, batches)`：返回同样的损失（每个批次一个），并且不让任何东西残留。检查程序
# 会在新的模型和新的批次上运行它。

# %%
def validation_losses(model, batches):
    ...
    ### BEGIN SOLUTION
    losses = []
    with torch.no_grad():
        for xb, yb in batches:
            losses.append(models.lm_loss(model(xb), yb).item())
    return losses
    ### END SOLUTION


check("06.kept-loss", validation_losses)

# %% [markdown]
# ## Summary
#
# - Model states cost 16 (ZeRO paper), 18 (HF: fp32 grads) or 20 (DeepSpeed: both) bytes per parameter for
#   mixed-precision Adam, and 16 for fp32 Adam: the fp32 master weights and Adam's two moments (12 bytes) dominate.
# - Autocast keeps fp32 model states and adds 16-bit weight copies, so turning on AMP does not halve memory;
#   with Adam it can even grow. It buys speed and smaller activations.
# - Activations grow with batch × sequence × layers (plus T² for attention). Predicted op by op, they matched
#   the saved-tensor hooks to the byte; checkpointing keeps only block inputs at the cost of a second forward.
# - ZeRO shards optimizer states (1), gradients (2) and parameters (3): 120 → 31.4 → 16.6 → 1.9 GB for 7.5B on
#   64 GPUs. Offload moves the optimizer side to CPU memory.
# - Memory that does not drop is either still referenced (a loss kept as a tensor holds its graph: log
#   `loss.item()`; a view holds its whole storage; optimizer states live all run) or cached by the GPU allocator
#   (`memory_reserved` stays after `del`; `empty_cache()` gives it back; `expandable_segments` against fragmentation).
#
# Next, notebook 07 profiles where the *time* goes; notebook 10 runs ZeRO for real with DeepSpeed.

# %% [markdown] lang="zh" en="129a7df4b8b7"
# ## 小结
#
# - 对于混合精度 Adam，模型状态每参数占 16（ZeRO 论文）、18（HF：fp32 梯度）或 20（DeepSpeed：两种梯度都有）字节，
#   fp32 Adam 则是 16 字节：占大头的是 fp32 主权重和 Adam 的两个动量（12 字节）。
# - autocast 保留 fp32 的模型状态，又增加了 16 位权重副本，所以打开 AMP 并不能让显存减半；使用 Adam 时显存甚至
#   可能增加。它换来的是速度和更小的激活值。
# - 激活值随批大小 × 序列长度 × 层数增长（注意力还有 T² 项）。逐个算子的预测与保存张量钩子的测量精确到字节地吻合；
#   激活重计算只保留块的输入，代价是多一次前向。
# - ZeRO 对优化器状态（1）、梯度（2）和参数（3）分片：7.5B 参数、64 块 GPU 时，每块 GPU 依次为
#   120 → 31.4 → 16.6 → 1.9 GB。卸载则把优化器一侧移到 CPU 内存。
# - 降不下来的显存，要么仍被引用（以张量形式保留的 loss 持有它的计算图：应记录 `loss.item()`；视图持有整个存储；
#   优化器状态在整个运行期间都存在），要么被 GPU 分配器缓存着（`del` 之后 `memory_reserved` 不降；`empty_cache()`
#   把它还给驱动；用 `expandable_segments` 对付碎片化）。
#
# 接下来，notebook 07 剖析*时间*花在了哪里；notebook 10 用 DeepSpeed 真正运行 ZeRO。
