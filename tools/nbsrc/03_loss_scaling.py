# %% [markdown]
# # 03 · Loss scaling
#
# **Objectives**
# - collect the **real gradients** of a small model, and measure which fraction FP16 would flush to zero;
# - pick a static loss scale 2^k that brings them all back without overflow, and apply it by hand;
# - understand **dynamic** loss scaling: `labkit.scaling.DynamicLossScaler` re-implements the rule of
#   `torch.amp.GradScaler` in a few readable lines, and behaves identically;
# - watch the scale during a real FP16 training run, reproduce a **scale collapse**, and know the knobs
#   (`growth_interval`, a minimum scale) that govern both;
# - call the scaler in the right order (`scale → backward → unscale_ → clip → step → update`) and checkpoint it;
# - map all of it onto DeepSpeed's `fp16` config block.
# - find the first NaN: forward hooks for the module that makes it, `torch.autograd.detect_anomaly` for the backward.
#
# **Prerequisites:** notebook 02 (subnormals, flush to zero, overflow).
#
# **Estimated time:** 70 min

# %% [markdown] lang="zh" en="53e209d77862"
# # 03 · 损失缩放
#
# **学习目标**
# - 收集一个小模型的**真实梯度**，测量其中有多大比例会在 FP16 中被清零；
# - 选一个静态损失缩放因子 2^k，让这些梯度全部回到可表示范围内而又不上溢，并手动应用它；
# - 理解**动态**损失缩放：`labkit.scaling.DynamicLossScaler` 用几行易读的代码重新实现了
#   `torch.amp.GradScaler` 的规则，两者行为完全一致；
# - 在一次真实的 FP16 训练中观察缩放因子的变化，复现一次**缩放因子崩塌**，并掌握同时决定这两者的调节参数
#   （`growth_interval`、最小缩放因子）；
# - 按正确的顺序调用 scaler（`scale → backward → unscale_ → clip → step → update`），并把它保存进检查点；
# - 把以上内容全部对应到 DeepSpeed 的 `fp16` 配置块上；
# - 找到第一个 NaN：前向传播用前向钩子找出产生它的模块，反向传播用 `torch.autograd.detect_anomaly`。
#
# **前置知识：** notebook 02（次正规数、下溢清零、上溢）。
#
# **预计用时：** 70 分钟

# %%
# %matplotlib inline
# %load_ext labkit
import importlib.util
import inspect
import io
import json
import math
import os
import textwrap

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from IPython.display import Markdown, display

from labkit import data, debug, device, models, plots, scaling
from labkit.check import check, predict, reveal
from labkit.exercises.nb03 import PATTERN, PATTERN_KNOBS, RULE_KNOBS, exercise_gradients
from labkit.scaling import DynamicLossScaler

torch.set_num_threads(1)  # tiny models: one thread is fastest (and fair on a shared machine)

# %% [markdown]
# With torch 2.13, FP16 autocast computes on any x86 CPU; only its *speed* depends on the hardware (AVX512-FP16
# or AMX-FP16 make it fast, without them it is emulated and slow). `labkit.device.computes` tries a tiny FP16
# autocast matmul instead of guessing. Where it would fail (an older torch, an unusual platform), this notebook
# **emulates** FP16 gradients: it computes in FP32 and rounds each scaled gradient through FP16, which
# reproduces the underflow and overflow of the gradients themselves (though not of every intermediate
# value). The cell below says which path it took.

# %% [markdown] lang="zh" en="9a2cc99fbfbc"
# 在 torch 2.13 中，FP16 autocast 在任何 x86 CPU 上都能计算，硬件只决定它的*速度*（有 AVX512-FP16 或 AMX-FP16
# 就快，没有就只能软件模拟，很慢）。`labkit.device.computes` 不靠猜，而是实际试跑一次很小的 FP16 autocast
# 矩阵乘法。在试跑会失败的环境里（较旧的 torch、少见的平台），本 notebook 会**模拟** FP16 梯度：用 FP32 计算，
# 再把每个缩放后的梯度经 FP16 舍入一遍。这样能重现梯度本身的下溢和上溢，但并非每个中间值的下溢和上溢都能
# 重现。
# 下面的单元格会告诉你走的是哪条路径。

# %%
# NBVAL_IGNORE_OUTPUT
FP16 = device.computes(torch.float16, "cpu")
print("fp16 autocast on this CPU:", FP16, "-> real fp16 runs" if FP16 else "-> fp16 emulated (see above)")

# %% [markdown]
# ## 1. Real gradients, and how many FP16 loses
#
# The model is a 3-hidden-layer MLP with `tanh`, trained on a seeded regression task. Two choices make some
# gradients fall below FP16's range **by construction**, both of them common in real life:
#
# - the targets are small (`target_scale=1e-3`, as when a quantity is measured in the wrong unit), so the
#   residuals, the MSE loss (~1e-5) and its gradient `2 (pred - y) / N` are small;
# - the weights start at half PyTorch's default size (`init_scale=0.5`). Back-propagation multiplies the
#   gradient by each layer's `Wᵀ` (and by `tanh' <= 1`), so it shrinks geometrically with depth: the first
#   layer's gradients are the smallest.
#
# The gradient of a weight is a sum of products, so its magnitudes also spread over many binades. We train
# 10 steps in FP32, then collect every gradient of the next batch.

# %% [markdown] lang="zh" en="1c07597a9b64"
# ## 1. 真实梯度，以及 FP16 会丢掉多少
#
# 模型是一个有 3 个隐藏层、激活函数为 `tanh` 的 MLP，在一个固定随机种子的回归任务上训练。有两处设计**有意**
# 让一部分梯度落到 FP16 的表示范围以下，而这两种情况在实际中都很常见：
#
# - 目标值很小（`target_scale=1e-3`，就像某个物理量用错了单位），因此残差、MSE 损失（约 1e-5）及其梯度
#   `2 (pred - y) / N` 都很小；
# - 权重初始化为 PyTorch 默认大小的一半（`init_scale=0.5`）。反向传播时，梯度每经过一层都要乘以该层的 `Wᵀ`
#   （以及 `tanh' <= 1`），所以会随深度按几何级数缩小：第一层的梯度最小。
#
# 一个权重的梯度是许多乘积之和，所以梯度的大小也分散在许多个二进制数量级（binade）上。我们先用 FP32 训练
# 10 步，再收集下一个批次的全部梯度。

# %%
X, y = data.make_regression(n=1024, in_features=16, target_scale=1e-3, seed=0)
batches = data.Batches(X, y, batch_size=128, seed=0)
model = models.MLP(16, 64, 1, depth=3, activation="tanh", init_scale=0.5, seed=0)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    xb, yb = batches(step)
    opt.zero_grad()
    F.mse_loss(model(xb), yb).backward()
    opt.step()

# %%
xb, yb = batches(10)
opt.zero_grad()
loss = F.mse_loss(model(xb), yb)
loss.backward()
g = scaling.grad_values(model)  # every gradient, flattened (fp32)
a = g[g != 0].abs()
print(f"loss {loss.item():.2g}; {g.numel()} gradients, |g| from 2^{a.min().log2().item():.0f} to 2^{a.max().log2().item():.0f}")

# %% [markdown]
# Where do they sit against each format's range? Below the dashed line of a format, a value flushes to zero;
# in its pale band it survives as a subnormal, with fewer bits.

# %% [markdown] lang="zh" en="3cff9ea0269b"
# 这些梯度相对于各个格式的范围落在哪里？落在某个格式的虚线以下，数值会被清零；落在它的浅色带里，数值以次正规数
# 的形式保留下来，但有效位更少。

# %%
ax = plots.grad_histogram(g, ("fp16", "bf16", "e5m2"))
plt.show()

# %%
for fmt in ("fp16", "bf16", "e5m2"):
    zero, sub = scaling.underflow_fraction(g, fmt), scaling.underflow_fraction(g, fmt, to="subnormal")
    print(f"{fmt:>5}: flush to zero {zero:6.1%}   below the normals {sub:6.1%}")
assert scaling.underflow_fraction(g, "fp16") > 0      # FP16 loses real gradients...
assert scaling.underflow_fraction(g, "bf16") == 0     # ...BF16, with FP32's exponent range, loses none

# %% [markdown]
# Around 1 % of the gradients would become exactly 0 in FP16, and nearly all of them would be subnormal, with
# reduced precision. (E5M2, the FP8 format for gradients, loses far more; notebook 05 handles it with per-tensor
# scales.) BF16 loses none: this is why BF16 training usually needs no loss scaling at all.
#
# ### A static scale 2^k
#
# Multiplying the loss by `S` multiplies every gradient by `S` (the chain rule is linear). A power of two shifts
# the exponents without touching a mantissa bit. Which powers bring every gradient above the flush-to-zero line
# without pushing the largest beyond 65504?

# %% [markdown] lang="zh" en="f40ca11a344b"
# 在 FP16 中，约 1 % 的梯度会恰好变成 0，而且几乎所有梯度都会成为次正规数，精度降低。（E5M2 是 FP8 中
# 用于梯度的格式，丢失的要多得多；notebook 05 用逐张量的缩放因子来处理它。）BF16 一个都不丢：这就是 BF16
# 训练通常完全不需要损失缩放的原因。
#
# ### 静态缩放因子 2^k
#
# 把损失乘以 `S`，每个梯度也都会乘以 `S`（链式法则是线性的）。乘以 2 的幂只平移指数，不改动任何一个尾数位。
# 哪些 2 的幂能把所有梯度都抬到清零线以上，同时又不把最大的梯度推过 65504？

# %%
lo, hi = scaling.safe_scale_powers(g, "fp16")
k = scaling.choose_scale_power(g, "fp16")  # the middle of the safe range: headroom on both sides
print(f"safe powers: 2^{lo} ... 2^{hi}; chosen k = {k}")
for kk in (0, k, hi + 1):
    print(f"  S = 2^{kk:<3}: flush to zero {scaling.underflow_fraction(g, 'fp16', 2.0**kk):.1%}, "
          f"overflow {scaling.overflow_fraction(g, 'fp16', 2.0**kk):.3%}")
assert scaling.underflow_fraction(g, "fp16", 2.0**k) == 0 and scaling.overflow_fraction(g, "fp16", 2.0**k) == 0
assert scaling.overflow_fraction(g, "fp16", 2.0 ** (hi + 1)) > 0   # one power more and the largest overflows
ax = plots.grad_histogram(g, ("fp16",), scale=2.0**k)
plt.show()

# %% [markdown]
# ## 2. Static loss scaling by hand
#
# Now the real thing: forward and backward under FP16 autocast, where FP16 underflow happens *inside* the
# backward pass (the weight gradients come out of FP16 matmuls). Scale the loss, back-propagate, then
# **unscale** the gradients (divide by `S`) before using them. The parameters, and so their gradients, stay
# FP32: only the FP16 intermediate values need the scale.

# %% [markdown] lang="zh" en="5fd9e1793c0e"
# ## 2. 手动实现静态损失缩放
#
# 现在来看真实的情形：在 FP16 autocast 下做前向和反向传播，这时 FP16 的下溢发生在反向传播*内部*（权重梯度由 FP16
# 矩阵乘法算出）。先缩放损失，再反向传播，然后在使用梯度之前先对它们**反缩放**（除以 `S`）。参数及其梯度仍然是
# FP32：只有 FP16 的中间值需要缩放。

# %%
def scaled_grads(S):
    """Gradients of the same batch with loss scale S, unscaled again; fp16 autocast (or its emulation)."""
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16, enabled=FP16):
        loss = F.mse_loss(model(xb), yb)
    (loss * S).backward()
    grads = scaling.grad_values(model)
    return (grads if FP16 else grads.half().float()) / S

# %%
# NBVAL_IGNORE_OUTPUT
for S in (1.0, 2.0**k, 2.0 ** (hi + 8)):
    gs = scaled_grads(S)
    lost = ((gs == 0) & (g != 0)).float().mean().item()
    err = ((gs - g).norm() / g.norm()).item()
    print(f"S = 2^{math.log2(S):<3.0f} lost {lost:6.2%}  all finite {bool(torch.isfinite(gs).all())}  rel. error {err:.1e}")

# %%
assert ((scaled_grads(1.0) == 0) & (g != 0)).any()          # unscaled: real gradients are lost
good = scaled_grads(2.0**k)
assert not ((good == 0) & (g != 0)).any() and torch.isfinite(good).all()
assert not torch.isfinite(scaled_grads(2.0 ** (hi + 8))).all()  # too big: inf, then NaN after unscaling

# %% [markdown]
# With `S = 1` real gradients are lost; with `S = 2^k` none is, and what is left is FP16's rounding error
# (relative ~5e-4). With too big a scale the gradients overflow to inf and the whole step is garbage. A static
# scale has to be chosen for the *whole* training run, whose gradients drift over orders of magnitude; hence:
#
# ## 3. Dynamic loss scaling
#
# The rule of `torch.amp.GradScaler`: start high (2^16); if a step's gradients hold an inf or NaN, **skip** the
# optimizer step and **halve** the scale; after `growth_interval` (2000) clean steps in a row, **double** it. It
# keeps the scale just below where gradients overflow. `DynamicLossScaler` is that rule in plain Python (you write
# it yourself in exercise 7.3; its code is printed after that exercise). The scale is stored as an FP32 number, as
# in GradScaler. `tests/test_scaling.py`
# checks on 240 random sequences with injected inf/NaN that `DynamicLossScaler` and `GradScaler("cpu")` produce
# the same scales, skip the same steps and leave bit-identical weights. Here is one pattern, by hand:

# %% [markdown] lang="zh" en="cca34099c96b"
# `S = 1` 时会丢失真实梯度；`S = 2^k` 时一个都不丢，剩下的只有 FP16 的舍入误差（相对误差约 5e-4）。缩放
# 因子过大时，梯度上溢为 inf，这一步的结果就全部作废了。静态缩放因子必须为*整个*训练过程选定，而训练中梯度
# 的大小会漂移好几个数量级。于是有了：
#
# ## 3. 动态损失缩放
#
# `torch.amp.GradScaler` 的规则是：从一个较大的值（2^16）开始；如果某一步的梯度中含有 inf 或 NaN，就**跳过**
# 这一步的优化器更新，并把缩放因子**减半**；连续 `growth_interval`（2000）个正常步（没有 inf/NaN）之后，就把
# 它**翻倍**。这样，缩放因子始终保持在略低于梯度上溢的水平。`DynamicLossScaler` 就是用纯 Python 写成的这条
# 规则（你会在练习 7.3 中亲手实现它；该练习之后会打印出它的代码）。和 GradScaler 一样，缩放因子以 FP32 数值
# 存储。`tests/test_scaling.py` 在 240 个注入了 inf/NaN 的随机序列上检查：`DynamicLossScaler` 与
# `GradScaler("cpu")` 给出相同的缩放因子、跳过相同的步，并留下逐位相同的权重。下面手动演示其中一种模式：

# %%
pattern = [False] * 4 + [True] + [False] * 7 + [True, True] + [False] * 4
mine = scaling.simulate_scales(pattern, init_scale=2.0**10, growth_interval=3)
gs_scaler, w = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3), torch.nn.Parameter(torch.ones(2))
sgd, theirs = torch.optim.SGD([w], lr=0.0), [gs_scaler.get_scale()]
for bad in pattern:  # a loss that is inf on the "bad" steps
    sgd.zero_grad()
    gs_scaler.scale((w * (math.inf if bad else 1.0)).sum()).backward()
    gs_scaler.step(sgd), gs_scaler.update(), theirs.append(gs_scaler.get_scale())
print([int(s) for s in mine])
assert mine == theirs

# %% [markdown]
# > **Common misconception** (seed 002 §6.1): when accuracy drops under mixed precision, "try dynamic loss scaling
# > instead of automatic adjustment".
# >
# > **Why it is wrong:** there is nothing to switch: GradScaler's automatic adjustment *is* dynamic loss scaling,
# > the rule stated at the top of this section, and `DynamicLossScaler` reproduces it step for step (asserted above). The alternative to
# > it is a fixed scale, section 2.
# >
# > **What is true:** the choice is static or dynamic, and with FP16 dynamic is the one to keep. If accuracy drops,
# > look elsewhere: a scale that collapses (below), an FP16 softmax or norm (notebook 04), or a warm-up that is too
# > short.
#
# ### A real FP16 training run
#
# Start far too high (2^32) and grow every 20 clean steps, so the scale has to find its level and then keeps
# probing it. `scaling.train_with_scaler` runs the standard loop (autocast forward, scaled backward, `unscale_`,
# `step`, `update`) and records, per step, the scale used and whether the step was skipped.

# %% [markdown] lang="zh" en="8100d73057c8"
# > **常见误解**（seed 002 §6.1）：混合精度训练的准确率下降时，“尝试用动态损失缩放代替自动调整”。
# >
# > **错在哪里：** 这里根本没有什么可切换的：GradScaler 的自动调整*就是*动态损失缩放，也就是本节开头给出的规则，
# > 而 `DynamicLossScaler` 一步不差地复现了它（上面已经断言过）。与它相对的另一种做法是固定缩放因子，即第 2 节。
# >
# > **实际情况：** 可选的只有静态和动态两种，而用 FP16 时应当坚持用动态。如果准确率下降，请到别处找原因：
# > 缩放因子崩塌（见下文）、用 FP16 计算的 softmax 或归一化层（notebook 04），或者预热太短。
#
# ### 一次真实的 FP16 训练
#
# 从一个高得离谱的值（2^32）开始，每 20 个正常步增长一次，这样缩放因子得先找到合适的水平，之后还会不断
# 试探这个水平。
# `scaling.train_with_scaler` 执行标准的训练循环（autocast 前向、缩放后反向、`unscale_`、`step`、`update`），
# 并逐步记录所用的缩放因子以及这一步是否被跳过。

# %%
def fp16_run(scaler, steps=150, data_fn=batches, dev="cpu"):
    net = models.MLP(16, 64, 1, depth=3, activation="tanh", init_scale=0.5, seed=0).to(dev)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    emulate = torch.device(dev).type == "cpu" and not FP16
    return net, scaling.train_with_scaler(net, F.mse_loss, data_fn, sgd, scaler, steps, emulate=emulate)

net, run = fp16_run(torch.amp.GradScaler("cpu", init_scale=2.0**32, growth_interval=20))
_, run_mine = fp16_run(DynamicLossScaler(init_scale=2.0**32, growth_interval=20))

# %%
# NBVAL_IGNORE_OUTPUT
first_ok = run["skipped"].index(False)
print(f"{sum(run['skipped'])} of {len(run['skipped'])} steps skipped; the first {first_ok} while the scale came "
      f"down from 2^32 to 2^{math.log2(run['scale'][first_ok]):.0f}")
print(f"loss {run['loss'][0]:.3g} -> {run['loss'][-1]:.3g}")

# %%
assert run_mine["scale"] == run["scale"] and run_mine["skipped"] == run["skipped"]   # same rule, same run
assert all(run["skipped"][:first_ok]) and 0 < first_ok < 20                           # backed off, then trained
assert any(run["skipped"][first_ok:])          # growing again found the overflow edge again
assert all(math.isfinite(v) for v in run["loss"]) and run["loss"][-1] < run["loss"][0]
ax = plots.scale_history(run["scale"], run["skipped"])
plt.show()

# %% [markdown]
# The saw-tooth is the rule at work: every 20 clean steps the scale doubles, sometimes the doubled scale makes a
# gradient overflow, that step is skipped and the scale halves back. A skipped step costs one batch; an
# overflow that went unnoticed would have cost the weights.
#
# **On a GPU** the loop is the same with `torch.amp.GradScaler("cuda")`; CUDA autocast additionally runs
# `softmax`, `exp`, `sum` and friends in FP32, and the FP16 matmuls run on tensor cores, so where the overflow
# edge lies can shift a little. When `labkit.device` finds a GPU, the next cell repeats the run there:

# %% [markdown] lang="zh" en="f1ca4ef6c1cc"
# 锯齿状的曲线正是这条规则在起作用：每过 20 个正常步，缩放因子翻倍一次；有时翻倍后的缩放因子会让某个梯度
# 上溢，于是这一步被跳过，缩放因子再减半回去。跳过一步的代价是一个批次；而一次没被察觉的上溢，代价会是整套
# 权重。
#
# **在 GPU 上**，循环完全一样，只是换成 `torch.amp.GradScaler("cuda")`；CUDA autocast 还会把 `softmax`、
# `exp`、`sum` 等算子放在 FP32 中运行，FP16 矩阵乘法则在张量核心上执行，所以上溢边界的位置可能略有偏移。
# 当 `labkit.device` 找到 GPU 时，下一个单元格会在 GPU 上重复这次训练：

# %%
# NBVAL_IGNORE_OUTPUT
dev = device.pick_device()
if device.is_cuda(dev):
    _, gpu = fp16_run(torch.amp.GradScaler("cuda", init_scale=2.0**32, growth_interval=20), dev=dev)
    _, gpu_mine = fp16_run(DynamicLossScaler(init_scale=2.0**32, growth_interval=20), dev=dev)
    assert gpu["scale"] == gpu_mine["scale"] and gpu["skipped"] == gpu_mine["skipped"]
    print(f"CUDA: {sum(gpu['skipped'])} of 150 steps skipped (CPU: {sum(run['skipped'])})")
else:
    print(f"no GPU here ({dev.type}): on a CUDA machine this cell repeats the run with GradScaler('cuda')")

# %% [markdown]
# > **Common misconception** (seed 002 §2.2): for mixed precision to be fast, "make sure the driver supports Tensor
# > Cores".
# >
# > **Why it is wrong:** Tensor Cores are hardware units of the GPU itself, present from the Volta generation (V100,
# > compute capability 7.0) on. A driver cannot add them to an older GPU, and there is no driver setting that turns
# > them on; the driver only has to be recent enough for the CUDA version the PyTorch build was made with (NVIDIA's
# > CUDA compatibility guide).
# >
# > **What is true:** whether a matmul or convolution runs on Tensor Cores is decided call by call, by cuBLAS and
# > cuDNN: they choose Tensor Core kernels when the GPU has them, the dtype suits them (FP16; from Ampere on also
# > BF16, and TF32 for FP32 inputs where it is enabled, notebook 05; FP8 from Ada and Hopper on). Shapes matter too:
# > dimensions that are multiples of 8 FP16 elements (16 bytes) were a requirement before cuBLAS 11 and cuDNN 7.6.3,
# > and are still the most efficient (notebook 05). NVIDIA's deep-learning performance guide ("matrix
# > multiplication background") documents the rules per generation; `torch.cuda.get_device_capability()` tells a
# > GPU's generation. Nothing in this box runs on a CPU.
#
# ### Scale collapse
#
# What if *every* step produces inf or NaN, because of a bug or a corrupt sample rather than the scale? The
# scaler cannot tell the difference: it halves, and halves again.
#
# **Predict, then run.** A `GradScaler` with its defaults (2^16) sees 170 steps in a row that all overflow. What is its
# scale at the end? Record a number:

# %% [markdown] lang="zh" en="c2fc83ad68e0"
# > **常见误解**（seed 002 §2.2）：为了让混合精度跑得快，“要确保驱动支持 Tensor Core”。
# >
# > **错在哪里：** 张量核心（Tensor Core）是 GPU 自身的硬件单元，从 Volta 架构（V100，计算能力 7.0）起才有。驱动
# > 无法给较老的 GPU 添上张量核心，也没有哪个驱动设置能“开启”它们；驱动只需足够新，能支持构建 PyTorch 时所用的
# > CUDA 版本即可（见 NVIDIA 的 CUDA 兼容性指南）。
# >
# > **实际情况：** 一次矩阵乘法或卷积是否在张量核心上运行，由 cuBLAS 和 cuDNN 在每次调用时决定：只要 GPU
# > 有张量核心、数据类型也合适（FP16；从 Ampere 起还有 BF16，以及启用后用于 FP32 输入的 TF32，见 notebook 05；
# > 从 Ada 和 Hopper 起还有 FP8），它们就会选用张量核心内核。形状也有影响：维度为 8 个 FP16 元素（16 字节）
# > 的整数倍，在 cuBLAS 11 和 cuDNN 7.6.3 之前是硬性要求，如今也仍然效率最高（notebook 05）。NVIDIA 的深度
# > 学习性能指南（“matrix multiplication background”一节）按架构代际列出了这些规则；
# > `torch.cuda.get_device_capability()` 可以查出一块 GPU 属于哪一代。这一部分的内容在 CPU 上都不会运行。
#
# ### 缩放因子崩塌
#
# 如果*每一步*都产生 inf 或 NaN，而原因是 bug 或损坏的样本、不是缩放因子，会怎样？scaler 分辨不出两者：它减半，
# 再减半。
#
# **先预测，再运行。** 一个使用默认设置（2^16）的 `GradScaler` 连续遇到 170 步，每一步都上溢。最后它的缩放因子是
# 多少？记下一个数：

# %%
prediction = ...
### BEGIN SOLUTION
prediction = 0.0
### END SOLUTION
predict("03.collapse", prediction)

# %% [markdown]
# Here one target in every batch is inf:

# %% [markdown] lang="zh" en="e53c8b0b8d7d"
# 这里每个批次中都有一个目标值是 inf：

# %% tags=["workspace-clear"]
def corrupt_batches(step):
    xb_, yb_ = batches(step)
    yb_ = yb_.clone()
    yb_[0] = math.inf            # one broken label per batch
    return xb_, yb_

net, bad = fp16_run(torch.amp.GradScaler("cpu"), steps=170, data_fn=corrupt_batches)
print({i: bad["scale"][i] for i in (0, 1, 16, 50, 100, 140, 160, 169)})
reveal("03.collapse", bad["scale"][-1])
assert all(bad["skipped"]) and bad["scale"][-1] == 0.0

# %% [markdown]
# After 16 halvings the scale is 1, after 142 it is FP32's smallest normal (2^-126), then it walks down the
# FP32 subnormals and reaches **exactly 0**. GradScaler has no floor, and the damage starts well before 0. Once
# the scale is 2^-128 or less, `1/scale` overflows FP32 to inf. GradScaler's inf check looks at the gradients as
# they are, and they are finite, so the step is taken, but unscaling has multiplied them by inf: inf where a
# gradient was non-zero, and 0 × inf = NaN where it was 0. That is 22 halvings before the scale reaches 0:

# %% [markdown] lang="zh" en="180db9270b6a"
# 减半 16 次后缩放因子为 1，减半 142 次后为 FP32 最小的正规数（2^-126），此后它一路走过 FP32 的次正规数，
# 最终**恰好变成 0**。GradScaler 没有下限，而损害远在到达 0 之前就开始了。一旦缩放因子小于等于 2^-128，
# `1/scale` 就会在 FP32 中上溢为 inf。GradScaler 的 inf 检查看的是梯度原本的值，而它们是有限的，所以这一步
# 照常执行；但反缩放已经把它们乘上了 inf：原本非零的梯度变成 inf，原本为 0 的梯度变成 0 × inf = NaN。这比
# 缩放因子到达 0 早了 22 次减半：

# %%
poisoned = {}
for k in (127, 128):  # 1/2^-127 = 2^127 is a float32; 1/2^-128 = 2^128 is not
    w = torch.nn.Parameter(torch.ones(3))
    gs_k, sgd_k = torch.amp.GradScaler("cpu", init_scale=2.0**-k), torch.optim.SGD([w], lr=0.1)
    gs_k.scale((w * torch.tensor([1.0, 2.0, 0.0])).sum()).backward()
    gs_k.step(sgd_k)
    gs_k.update()
    poisoned[k] = not torch.isfinite(w).all().item()
print("weights poisoned after one clean step, by scale:", {f"2^-{k}": v for k, v in poisoned.items()})
assert poisoned == {127: False, 128: True} and float(torch.tensor(2.0**128, dtype=torch.float64).float()) == math.inf

# %% [markdown]
# At exactly 0 it is the same story: the loss times 0 gives gradients of 0, unscaling multiplies by 1/0 = inf,
# 0 × inf is NaN, and the next clean step writes NaN into every weight:

# %% [markdown] lang="zh" en="baca1e747295"
# 缩放因子恰好为 0 时也是同样的情形：损失乘以 0 得到全为 0 的梯度，反缩放再乘以 1/0 = inf，0 × inf 是 NaN，
# 于是下一个正常步把 NaN 写进了每一个权重：

# %%
gs_dead = torch.amp.GradScaler("cpu", init_scale=2.0**-149)  # the last scale before 0
net, after = fp16_run(gs_dead, steps=2, data_fn=lambda s: corrupt_batches(s) if s == 0 else batches(s))
print("scale", after["scale"], "skipped", after["skipped"], "weights NaN:", torch.isnan(net.net[0].weight).all().item())
assert after["scale"] == [2.0**-149, 0.0] and after["skipped"] == [True, False]
assert torch.isnan(net.net[0].weight).all()

# %% [markdown]
# This is the situation of pytorch/pytorch#40497 (and #99640 proposes never letting the scale drop below 1).
# Two knobs govern it:
#
# - **a minimum scale.** `DynamicLossScaler(min_scale=1.0)` stops at 1, so the weights are never poisoned.
#   DeepSpeed has this as `min_loss_scale` (default 1) and goes further: an overflow *at* the floor stops the
#   run with an error, because a scale of 1 that still overflows means something other than the scale is wrong.
# - **`growth_interval`.** It sets how fast the scale recovers. After a collapse to 1 (16 halvings from 2^16), it
#   takes 16 × `growth_interval` clean steps to climb back: 32 000 steps with GradScaler's default of 2000. A short
#   interval recovers faster but probes the overflow edge (and skips a step) more often.
#
# > **Common misconception** (seed 002 §2.2): start the loss scale at 2^16 and give its dynamic adjustment the range
# > [2^10, 2^24], as if the scaler had such a setting and that range were a safe one.
# >
# > **Why it is wrong:** `torch.amp.GradScaler` has no such range and no argument for one (its knobs are
# > `init_scale`, 2^16 by default, `growth_factor`, `backoff_factor`, `growth_interval` and `enabled`). It halves on
# > every overflow with no floor: the collapse above passed 2^10 after seven overflows and went on to 0. It doubles
# > after every `growth_interval` clean steps with no ceiling short of FP32's largest power of two.
# >
# > **What is true:** bounds are yours to add, and the floor is the one that matters: `min_scale` here,
# > `min_loss_scale` in DeepSpeed (default 1). A floor as high as 2^10 would be a trap: any true gradient above
# > 65504 / 2^10 ≈ 64 then overflows at every step, and the run skips steps forever (DeepSpeed stops). A scale that
# > grows too far makes the gradients overflow and halves again, so a ceiling is rarely needed. The cell below puts a floor under
# > `DynamicLossScaler`, and shows a real GradScaler passing 2^24 upwards and (in the collapse run) 2^10 downwards.

# %% [markdown] lang="zh" en="942da6cdb34b"
# 这正是 pytorch/pytorch#40497 中的情形（#99640 则提议永远不让缩放因子降到 1 以下）。有两个调节参数决定着它：
#
# - **最小缩放因子。** `DynamicLossScaler(min_scale=1.0)` 降到 1 就停住，因此权重永远不会被污染。DeepSpeed 中
#   对应的是 `min_loss_scale`（默认为 1），而且它做得更进一步：已经*处在*下限时仍然上溢，就报错终止训练，因为缩放
#   因子为 1 还在上溢，说明出问题的不是缩放因子，而是别的东西。
# - **`growth_interval`。** 它决定缩放因子恢复得有多快。崩塌到 1 之后（从 2^16 减半 16 次），需要
#   16 × `growth_interval` 个正常步才能爬回去：按 GradScaler 默认的 2000，就是 32 000 步。间隔短则恢复得快，
#   但也会更频繁地试探上溢边界（每次都要跳过一步）。
#
# > **常见误解**（seed 002 §2.2）：把损失缩放因子的初始值设为 2^16，并把它的动态调整范围设为 [2^10, 2^24]，仿佛
# > scaler 有这样一个设置，而且这个范围是安全的。
# >
# > **错在哪里：** `torch.amp.GradScaler` 既没有这样的范围，也没有设置范围的参数；它的调节参数只有 `init_scale`
# > （默认 2^16）、`growth_factor`、`backoff_factor`、`growth_interval` 和 `enabled`。它每遇到一次上溢就减半，
# > 没有下限：上面的崩塌在 7 次上溢后就越过了 2^10，一路降到 0。它每过 `growth_interval` 个正常步就翻倍，
# > 除了 FP32 能表示的最大的 2 的幂之外没有上限。
# >
# > **实际情况：** 上下限要你自己加，而真正要紧的是下限：这里是 `min_scale`，DeepSpeed 中是 `min_loss_scale`
# > （默认为 1）。把下限设到 2^10 那么高反而是个陷阱：任何大于 65504 / 2^10 ≈ 64 的真实梯度都会在每一步
# > 上溢，训练就会永远在跳步（DeepSpeed 则会终止训练）。缩放因子涨得太高时，梯度会上溢，缩放因子随即再减半，
# > 所以很少需要上限。下面的单元格给 `DynamicLossScaler` 加上下限，并展示真实的 GradScaler 向上越过 2^24、
# > （在那次崩塌中）向下越过 2^10。

# %%
net, floored = fp16_run(DynamicLossScaler(min_scale=1.0), steps=40, data_fn=corrupt_batches)
assert floored["scale"][-1] == 1.0 and torch.isfinite(net.net[0].weight).all()
gs_up, w_up = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_interval=1), torch.nn.Parameter(torch.ones(1))
for _ in range(3):  # three clean steps from the "upper bound" 2^24
    gs_up.scale(w_up.sum()).backward(), gs_up.step(torch.optim.SGD([w_up], lr=0.0)), gs_up.update()
print("GradScaler, 3 clean steps from 2^24:", gs_up.get_scale(), "| collapse run, 7 overflows:", bad["scale"][7])
assert gs_up.get_scale() == 2.0**27 and bad["scale"][7] == 2.0**9   # no ceiling at 2^24, no floor at 2^10
try:
    scaling.deepspeed_scale_sequence([True] * 40, initial_scale_power=16, hysteresis=1, min_loss_scale=1)
except RuntimeError as exc:
    print("DeepSpeed:", exc)
recover = scaling.simulate_scales([False] * 32_000, init_scale=1.0, growth_interval=2000)
print("clean steps from 1 back to 2^16:", recover.index(2.0**16))

# %% [markdown]
# ## 4. The right order, and checkpoints
#
# ```python
# scaler.scale(loss).backward()     # gradients are S times too big
# scaler.unscale_(optimizer)        # now they are true gradients (and inf/NaN has been noted)
# torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
# scaler.step(optimizer)            # skipped if inf/NaN was found; does not unscale twice
# scaler.update()                   # adjust the scale for the next step
# ```
#
# Clipping compares the gradient norm with `max_norm`. Before `unscale_`, that norm is `S` times too big, so
# clipping fires when it should not and shrinks the true gradients by a factor of about `S`:

# %% [markdown] lang="zh" en="091ad19b2489"
# ## 4. 正确的调用顺序，以及检查点
#
# ```python
# scaler.scale(loss).backward()     # 梯度是真实值的 S 倍
# scaler.unscale_(optimizer)        # 现在是真实梯度了（inf/NaN 也已记录在案）
# torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
# scaler.step(optimizer)            # 若发现过 inf/NaN 就跳过；不会重复反缩放
# scaler.update()                   # 为下一步调整缩放因子
# ```
#
# 梯度裁剪把梯度范数与 `max_norm` 相比较。在 `unscale_` 之前，这个范数是真实值的 `S` 倍，于是裁剪会在不该触发时
# 触发，把真实梯度缩小约 `S` 倍：

# %%
def clipped_norm(unscale_first, max_norm, S=2.0**16):
    scaler = torch.amp.GradScaler("cpu", init_scale=S)
    net = models.MLP(16, 64, 1, depth=3, activation="tanh", init_scale=0.5, seed=0)
    sgd = torch.optim.SGD(net.parameters(), lr=0.0)
    scaler.scale(F.mse_loss(net(xb), yb)).backward()
    if unscale_first:
        scaler.unscale_(sgd)
    torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm)
    scaler.step(sgd)              # unscales here if not done yet
    return scaling.grad_values(net).norm().item()

# %%
true_norm = clipped_norm(True, math.inf)
right, wrong = clipped_norm(True, 1.0), clipped_norm(False, 1.0)
print(f"true gradient norm {true_norm:.3g}, max_norm 1.0: nothing to clip")
print(f"unscale_ then clip: {right:.3g};  clip then unscale: {wrong:.3g}  ({right / wrong:.2g} x too small)")
assert abs(right - true_norm) / true_norm < 1e-5                  # right order: untouched
assert abs(wrong * 2.0**16 - 1.0) < 1e-4                          # wrong order: max_norm / S

# %% [markdown]
# In the wrong order, clipping saw the *scaled* norm (0.0012 × 2^16 ≈ 77), "clipped" it to `max_norm` = 1, and then
# the unscale divided by 2^16 again: the step is 77 times too small, and the factor changes with the scale from
# step to step. Nothing fails; training just crawls.
#
# > **Common misconception** (seed 000 §5.3): clipping before `unscale_` clips the scaled gradients, "which amounts
# > to no clipping".
# >
# > **Why it is wrong:** it is the opposite of no clipping. The scaled norm is S times the true one, so the clip
# > fires on nearly every step and shrinks the true gradient to about `max_norm / S`: the step becomes tiny, and its
# > size now depends on the loss scale.
# >
# > **What is true:** clip after `scaler.unscale_(optimizer)`. The cell above measured it: in the wrong order the
# > gradient norm ended at `max_norm / 2^16`, where the right order left it alone.
#
# **Checkpoints** must include the scaler's state (the scale and the count of clean steps), or a resumed run
# restarts at 2^16 and pays for it in skipped steps. Its `state_dict` is tiny:

# %% [markdown] lang="zh" en="49402b24eca4"
# 顺序错误时，裁剪看到的是*缩放后*的范数（0.0012 × 2^16 ≈ 77），把它“裁剪”到 `max_norm` = 1，随后反缩放又除以
# 2^16：这一步小了 77 倍，而且这个倍数还会随缩放因子一步步变化。什么都不会报错，训练只是慢得像在爬。
#
# > **常见误解**（seed 000 §5.3）：在 `unscale_` 之前裁剪，裁剪的是缩放后的梯度，“相当于没有裁剪”。
# >
# > **错在哪里：** 恰恰相反，这远不是没有裁剪。缩放后的范数是真实范数的 S 倍，所以几乎每一步都会触发裁剪，把真实
# > 梯度缩小到约 `max_norm / S`：更新步长变得极小，而且它的大小现在取决于损失缩放因子。
# >
# > **实际情况：** 在 `scaler.unscale_(optimizer)` 之后再裁剪。上面的单元格已经测过：顺序错误时，梯度范数最终为
# > `max_norm / 2^16`，而顺序正确时梯度原封未动。
#
# **检查点**必须包含 scaler 的状态（缩放因子和连续正常步的计数），否则恢复训练时缩放因子会从 2^16 重新
# 开始，并为此付出跳过若干步的代价。它的 `state_dict` 很小：

# %%
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=5)
net, _ = fp16_run(scaler, steps=12)
buf = io.BytesIO()
torch.save({"model": net.state_dict(), "scaler": scaler.state_dict()}, buf)
print(scaler.state_dict())

# %%
buf.seek(0)
ckpt = torch.load(buf, weights_only=True)  # tensors and plain types only: never code from a file
resumed = torch.amp.GradScaler("cpu")
resumed.load_state_dict(ckpt["scaler"])
assert resumed.state_dict() == scaler.state_dict()
mine = DynamicLossScaler()
mine.load_state_dict(ckpt["scaler"])  # the same keys: the two are interchangeable
assert mine.get_scale() == scaler.get_scale() and mine.state_dict()["_growth_tracker"] == scaler.state_dict()["_growth_tracker"]

# %% [markdown]
# ## 5. The same knobs in DeepSpeed
#
# DeepSpeed (notebook 10) does its own loss scaling, configured by the `fp16` block of its JSON config.
# **`"loss_scale": 0` means dynamic**; any other value is a fixed scale.

# %% [markdown] lang="zh" en="dd1b41d444ef"
# ## 5. DeepSpeed 中的同一组调节参数
#
# DeepSpeed（notebook 10）自己实现损失缩放，由其 JSON 配置中的 `fp16` 块来配置。
# **`"loss_scale": 0` 表示动态**；其他任何值都是固定缩放因子。

# %%
display(Markdown(scaling.deepspeed_knobs_markdown()))  # labkit.scaling.DEEPSPEED_KNOBS as a table

# %% [markdown]
# `deepspeed_fp16_config` writes the block closest to a given GradScaler, and `scaler_kwargs_from_deepspeed` goes
# back (`tests/test_scaling.py` checks that DeepSpeed's own config class accepts the block):

# %% [markdown] lang="zh" en="3d478027dc7a"
# `deepspeed_fp16_config` 写出最接近给定 GradScaler 的配置块，`scaler_kwargs_from_deepspeed` 则做反向转换
# （`tests/test_scaling.py` 会检查 DeepSpeed 自己的配置类能接受这个配置块）：

# %%
gs_default = torch.amp.GradScaler("cpu")
ds_fp16 = scaling.deepspeed_fp16_config(gs_default)
print(json.dumps({"fp16": ds_fp16}, indent=1))
if importlib.util.find_spec("deepspeed"):  # DeepSpeed parses the block with its own config class
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device.is_cuda() else "cpu")
    from deepspeed.runtime.precision_config import DeepSpeedFP16Config

    parsed = DeepSpeedFP16Config(**ds_fp16)
    assert parsed.loss_scale == 0 and parsed.initial_dynamic_scale() == gs_default.get_scale()
    assert parsed.loss_scale_window == gs_default.get_growth_interval() and parsed.hysteresis == 1
assert scaling.scaler_kwargs_from_deepspeed(ds_fp16)["init_scale"] == gs_default.get_scale()

# %% [markdown]
# Two differences remain even with `hysteresis: 1`, and `deepspeed_scale_sequence` (checked against DeepSpeed's
# own `DynamicLossScaler` on 200 random sequences) shows both on one pattern:
#
# - **hysteresis** (default 2): the scale halves only when the overflows reach that count (one is tolerated); the
#   counter is refilled only when the scale grows (or after every clean step with `consecutive_hysteresis`);
# - **the window is one step later**: DeepSpeed counts clean steps *since the last overflow* and grows when that
#   count, before the current step, is a multiple of `loss_scale_window`, so the first growth needs window + 1
#   clean steps.

# %% [markdown] lang="zh" en="3012ecc7ea6f"
# 即使设置了 `hysteresis: 1`，仍有两处差异；`deepspeed_scale_sequence`（已在 200 个随机序列上与 DeepSpeed 自己的
# `DynamicLossScaler` 对照检查过）在同一个模式上把两处都展示出来：
#
# - **hysteresis（迟滞）**（默认为 2）：DeepSpeed 要等上溢累计到这个次数才减半（默认值下可以容忍一次上溢）；
#   这个计数器只在缩放因子增长时才重新填满（若设置了 `consecutive_hysteresis`，则每个正常步之后都会重新填满）；
# - **窗口晚一步**：DeepSpeed 统计的是*自上次上溢以来*的正常步数，当这个计数（不含当前步）是 `loss_scale_window`
#   的整数倍时才增长，因此第一次增长需要 window + 1 个正常步。

# %%
pat = [False] * 5 + [True] + [False] * 5 + [True] + [False] * 9
show = {"GradScaler": scaling.simulate_scales(pat, init_scale=16.0, growth_interval=4),
        "DeepSpeed, hysteresis 1": scaling.deepspeed_scale_sequence(pat, initial_scale_power=4, loss_scale_window=4, hysteresis=1),
        "DeepSpeed, hysteresis 2": scaling.deepspeed_scale_sequence(pat, initial_scale_power=4, loss_scale_window=4)}
print("overflow:".rjust(25), "".join(" X" if b else " ." for b in pat))
for name, seq in show.items():
    print(f"{name:>24}:", " ".join(f"{int(math.log2(s))}" for s in seq[1:]), " (log2 of the scale after each step)")
assert show["GradScaler"][4] == 32.0 and show["DeepSpeed, hysteresis 1"][4] == 16.0   # window vs window + 1
assert show["DeepSpeed, hysteresis 1"][5] == 32.0
assert show["DeepSpeed, hysteresis 2"][6] == show["DeepSpeed, hysteresis 2"][5]       # first overflow tolerated

# %% [markdown]
# ## 6. Finding the first NaN
#
# The scaler cannot tell a scale that is too big from a bug: both give inf/NaN, and it skips and halves either
# way. When steps keep being skipped with the scale already small, or the loss itself turns NaN, something else is
# wrong, and the loss does not say where: one NaN spreads through every later layer, the loss and every gradient.
# Find the **first** one. In the forward pass, `labkit.debug.first_nonfinite` puts a forward hook on every module
# (`register_forward_hook`) and reports the first, in execution order, whose output is not finite. Here one
# weight of the third Linear is NaN, as a poisoned update would leave it:

# %% [markdown] lang="zh" en="1c1f545a1730"
# ## 6. 找到第一个 NaN
#
# scaler 分辨不出是缩放因子过大还是代码有 bug：两者都会产生 inf/NaN，而它一律跳过这一步并减半。如果缩放因子
# 已经很小了还在不断跳步，或者损失本身变成了 NaN，那就是别处出了问题，而损失不会告诉你是哪里：一个 NaN 会
# 传遍之后的每一层、损失和每一个梯度。要找的是**第一个** NaN。在前向传播中，`labkit.debug.first_nonfinite`
# 给每个模块都挂上前向钩子（`register_forward_hook`），按执行顺序报告第一个输出不是有限值的模块。这里让第三个
# Linear 层的一个权重为 NaN，就像一次被污染的更新留下的那样：

# %%
net = models.MLP(16, 64, 1, depth=3, activation="tanh", init_scale=0.5, seed=0)
with torch.no_grad():
    net.net[4].weight[3, 7] = math.nan
print("NaN outputs:", torch.isnan(net(xb)).sum().item(), "of", len(xb))
hit = debug.first_nonfinite(net, lambda: net(xb))
print(hit.describe())
assert (hit.module, hit.kind, hit.inputs_finite, hit.bad) == ("net.4", "Linear", True, len(xb))

# %% [markdown]
# If every module's output is finite and the loss is still not, the model is innocent: look at the data and the
# loss. The broken label of the scale-collapse demo, found this way:

# %% [markdown] lang="zh" en="39a94076a5f9"
# 如果每个模块的输出都是有限的，而损失仍然不是，那模型就是清白的：去查数据和损失函数。用这种方法找出缩放因子崩塌
# 演示中那个损坏的标签：

# %%
xb_bad, yb_bad = corrupt_batches(0)
clean = models.MLP(16, 64, 1, depth=3, activation="tanh", init_scale=0.5, seed=0)
print("loss:", F.mse_loss(clean(xb_bad), yb_bad).item(), "| first non-finite module:",
      debug.first_nonfinite(clean, lambda: F.mse_loss(clean(xb_bad), yb_bad)))
print("non-finite inputs:", debug.nonfinite_count(xb_bad), "| non-finite targets:", debug.nonfinite_count(yb_bad))
assert debug.nonfinite_count(yb_bad) == 1

# %% [markdown]
# **The backward pass.** A forward pass can be finite and its gradient NaN. A classic: `torch.where` to "protect" a
# log. The forward picks 0 where p = 0, but backward still runs through `log(p)` everywhere and multiplies its
# derivative 1/0 = inf by the 0 that `where` sends down that branch: 0 × inf = NaN. Scores min-max scaled to
# [0, 1] have an exact 0, the smallest:

# %% [markdown] lang="zh" en="4cd38defe993"
# **反向传播。** 前向传播的结果可以是有限的，而梯度却是 NaN。一个经典的例子：用 `torch.where` 来“保护”
# log。前向传播在 p = 0 处选取 0，但反向传播仍会在所有位置经过 `log(p)`，并把它的导数 1/0 = inf 乘以 `where`
# 传给这一分支的 0：0 × inf = NaN。经过 min-max 缩放到 [0, 1] 的分数中恰好有一个 0，即最小值：

# %%
score_net = models.MLP(16, 64, 1, depth=2, activation="tanh", seed=0)

def log_loss():
    out = score_net(xb)
    p = (out - out.min()) / (out.max() - out.min())  # in [0, 1]; the smallest is exactly 0
    return torch.where(p > 0, torch.log(p), 0.0).mean()

loss = log_loss()
loss.backward()
print(f"loss {loss.item():.4f} (finite); NaN gradients in the first layer: "
      f"{torch.isnan(score_net.net[0].weight.grad).sum().item()} of {score_net.net[0].weight.numel()}")
assert torch.isfinite(loss) and torch.isnan(score_net.net[0].weight.grad).all()

# %% [markdown]
# `torch.autograd.detect_anomaly()` checks the output of every backward function and raises at the first that
# returns NaN; with the forward run inside it too, it also records where each node was created. (It slows the
# step several times: a debugging tool, not a setting for production runs.) `debug.backward_anomaly` runs it and
# returns the function and the forward line:

# %% [markdown] lang="zh" en="e6f01802ecf6"
# `torch.autograd.detect_anomaly()` 检查每个反向函数的输出，在第一个返回 NaN 的函数处抛出异常；如果前向
# 传播也在它里面运行，它还会记录每个节点是在哪里创建的。（它会让每一步慢上好几倍：它是调试工具，不应在正式
# 训练中开启。）
# `debug.backward_anomaly` 运行它，并返回出错的函数和对应的前向代码行：

# %%
hit = debug.backward_anomaly(log_loss)
print(hit.message)
print("created at", hit.forward_line)
assert hit.function == "LogBackward0" and "torch.log(p)" in hit.forward_line

# %% [markdown]
# The fix keeps the log away from 0 in *both* branches (the "double where"), or clamps: `torch.log(p.clamp_min(eps))`:

# %% [markdown] lang="zh" en="34d6767002f2"
# 修复方法是在*两个*分支里都让 log 远离 0（即“双重 where”），或者做截断：`torch.log(p.clamp_min(eps))`：

# %%
def log_loss_fixed():
    out = score_net(xb)
    p = (out - out.min()) / (out.max() - out.min())
    return torch.where(p > 0, torch.log(torch.where(p > 0, p, 1.0)), 0.0).mean()

assert debug.backward_anomaly(log_loss_fixed) is None and log_loss_fixed().item() == log_loss().item()
print("fixed: same loss, finite gradients")

# %% [markdown]
# ## 7. Exercises
#
# **7.1** These are the gradients of some model (`exercise_gradients()`); their histogram is below. Choose a
# static loss scale `S` so that, in FP16, none of them flushes to zero and none overflows.

# %% [markdown] lang="zh" en="4c99b2a0b006"
# ## 7. 练习
#
# **7.1** `exercise_gradients()` 给出某个模型的梯度，下面是它们的直方图。选一个静态损失缩放因子 `S`，使这些
# 梯度在 FP16 中既没有一个被清零，也没有一个上溢。

# %%
ax = plots.grad_histogram(exercise_gradients(), ("fp16",))
plt.show()

# %%
S = ...
### BEGIN SOLUTION
S = 2.0**14
### END SOLUTION
check("03.static-scale", S)

# %% [markdown]
# **7.2** A scaler with `PATTERN_KNOBS` sees the overflow pattern `PATTERN` (True = that step had inf/NaN).
# What is its scale afterwards? Work it out by hand, then check.

# %% [markdown] lang="zh" en="269f8b2b2951"
# **7.2** 一个按 `PATTERN_KNOBS` 设置的 scaler 遇到上溢模式 `PATTERN`（True 表示这一步出现了 inf/NaN）。之后它的
# 缩放因子是多少？先手算，再检查。

# %%
print(PATTERN_KNOBS)
print(PATTERN)
answer = ...
### BEGIN SOLUTION
answer = 512.0
### END SOLUTION
check("03.predict-scale", answer)

# %% [markdown]
# **7.3** Write GradScaler's rule yourself: `update(scale, tracker, found_inf)` returns the new scale and the new
# count of clean steps, with the knobs in `RULE_KNOBS`. The check runs it against `DynamicLossScaler` on random
# overflow patterns.

# %% [markdown] lang="zh" en="9b1fb5abfdd3"
# **7.3** 亲手写出 GradScaler 的规则：`update(scale, tracker, found_inf)` 返回新的缩放因子和新的正常步计数，调节
# 参数取自 `RULE_KNOBS`。检查程序会在随机的上溢模式上把它与 `DynamicLossScaler` 对照运行。

# %%
print(RULE_KNOBS)
update = ...  # your function: def update(scale, tracker, found_inf): ... return new_scale, new_tracker
### BEGIN SOLUTION
def update(scale, tracker, found_inf):
    if found_inf:
        return scale * RULE_KNOBS["backoff_factor"], 0
    tracker += 1
    if tracker == RULE_KNOBS["growth_interval"]:
        return scale * RULE_KNOBS["growth_factor"], 0
    return scale, tracker
### END SOLUTION
check("03.update-rule", update)

# %% [markdown]
# `DynamicLossScaler`'s version, for comparison once you have written yours:

# %% [markdown] lang="zh" en="5316d31c4c43"
# `DynamicLossScaler` 的实现，写完自己的版本后可以拿来对照：

# %% tags=["workspace-clear"]
print(textwrap.dedent(inspect.getsource(DynamicLossScaler.grow_or_back_off)))

# %% [markdown]
# **7.4** Write DeepSpeed's `fp16` block (a dict) that behaves as closely as possible like
# `torch.amp.GradScaler("cuda", init_scale=2**12, growth_interval=500)`.

# %% [markdown] lang="zh" en="3f9127eeec05"
# **7.4** 写出 DeepSpeed 的 `fp16` 配置块（一个 dict），让它的行为尽可能接近
# `torch.amp.GradScaler("cuda", init_scale=2**12, growth_interval=500)`。

# %%
fp16_block = ...
### BEGIN SOLUTION
fp16_block = {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
              "hysteresis": 1, "min_loss_scale": 1}
### END SOLUTION
check("03.deepspeed-config", fp16_block)

# %% [markdown]
# **7.5 Debug: the step that let NaN in.** This training step runs, and on clean batches it even trains. Feed it one
# batch with a broken label (the `corrupt_batches` of section 3) and look at the weights:

# %% [markdown] lang="zh" en="c8851d19956b"
# **7.5 调试：放 NaN 进来的那一步。** 这个训练步能运行，在正常的批次上甚至能训练。给它喂一个含有损坏标签的批次
# （第 3 节的 `corrupt_batches`），再看看权重：

# %%
def train_step(model, opt, scaler, xb, yb):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16, enabled=FP16):
        loss = F.mse_loss(model(xb), yb)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    scaler.update()
    opt.step()

net = models.MLP(16, 64, 1, depth=3, activation="tanh", init_scale=0.5, seed=0)
train_step(net, torch.optim.SGD(net.parameters(), lr=0.1), torch.amp.GradScaler("cpu"), *corrupt_batches(0))
finite = all(torch.isfinite(p).all().item() for p in net.parameters())
print("weights still finite after one bad batch:", finite)
assert not finite  # the bad batch went straight into the weights

# %% [markdown]
# Write a fixed `train_step(model, opt, scaler, xb, yb)`: a bad batch must be skipped (weights untouched, scale
# halved), a clean one must train and let the scale grow. The check runs it on fresh models and batches.

# %% [markdown] lang="zh" en="225765b686b0"
# 写一个修正后的 `train_step(model, opt, scaler, xb, yb)`：遇到坏批次必须跳过（权重不动，缩放因子减半），
# 遇到正常批次则必须照常训练，并让缩放因子得以增长。检查程序会在新建的模型和批次上运行它。

# %%
def train_step(model, opt, scaler, xb, yb):
    ...
    ### BEGIN SOLUTION
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16, enabled=FP16):
        loss = F.mse_loss(model(xb), yb)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    ### END SOLUTION


check("03.scaler-step", train_step)

# %% [markdown]
# ## Summary
#
# - Real gradients span many binades; with small targets and a deep, small-initialised model about 1 % of them
#   fall below FP16's smallest subnormal and become 0. BF16 loses none.
# - Multiplying the loss by 2^k shifts every gradient up by k binades, exactly; unscale (divide) before using them.
#   Too big a scale overflows to inf.
# - Dynamic scaling (GradScaler, `DynamicLossScaler`) skips a step and halves on inf/NaN and doubles after
#   `growth_interval` clean steps. Without a floor, a run that keeps producing inf collapses the scale to 0 and then
#   poisons the weights with NaN; `min_scale`/`min_loss_scale` prevent that.
# - Order: `scale(loss).backward()`, `unscale_`, clip, `step`, `update`; checkpoint `scaler.state_dict()`.
# - DeepSpeed: `loss_scale: 0` = dynamic, `initial_scale_power`, `loss_scale_window` (one step later),
#   `hysteresis` (default 2), `min_loss_scale` (default 1).
# - A NaN spreads; find the first: forward hooks name the first module with a non-finite output (all finite:
#   suspect the data or the loss), `detect_anomaly` names the backward function and the forward line that made it.

# %% [markdown] lang="zh" en="36634eec01bc"
# ## 小结
#
# - 真实梯度横跨许多个二进制数量级；目标值很小、模型较深且初始化偏小时，约 1 % 的梯度会低于 FP16 最小的
#   次正规数而变成 0。BF16 一个都不丢。
# - 把损失乘以 2^k，会把每个梯度精确地上移 k 个二进制数量级；使用梯度之前要先反缩放（除回去）。缩放因子
#   太大会上溢为 inf。
# - 动态缩放（GradScaler、`DynamicLossScaler`）遇到 inf/NaN 就跳过这一步并减半，连续 `growth_interval` 个
#   正常步后翻倍。没有下限时，一次不断产生 inf 的训练会让缩放因子崩塌到 0，继而用 NaN 污染权重；
#   `min_scale`/`min_loss_scale` 可以防止这种情况。
# - 顺序：`scale(loss).backward()`、`unscale_`、裁剪、`step`、`update`；检查点中要保存 `scaler.state_dict()`。
# - DeepSpeed：`loss_scale: 0` = 动态，`initial_scale_power`，`loss_scale_window`（晚一步），
#   `hysteresis`（默认 2），`min_loss_scale`（默认 1）。
# - NaN 会扩散，要找第一个：前向钩子能指出第一个输出非有限值的模块（如果全都有限，就怀疑数据或损失函数），
#   `detect_anomaly` 能指出出错的反向函数，以及产生它的那行前向代码。
