# %% [markdown]
# # 05 · BF16, TF32, FP8
#
# **Objectives**
# - train the same tiny GPT in fp32, fp16 (with a loss scaler) and bf16, **compare the runs**, and measure why
#   bf16 is noisier: 8 significant bits against fp16's 11;
# - know what `torch.backends.cuda.matmul.allow_tf32` and `torch.set_float32_matmul_precision` change, what
#   PyTorch's default is and why NGC containers differ;
# - **emulate TF32** on a CPU and measure the matmul error it costs against fp32, fp16 and bf16;
# - cast real activations to FP8 **E4M3** and real gradients to **E5M2**, with and without **per-tensor
#   scaling**, and run the **amax-history** (delayed) scaling recipe of Transformer Engine over a training run;
# - run an FP8 matmul with `torch._scaled_mm`, and measure what bf16 buys on this CPU (with or without AMX) and
#   what odd matrix shapes cost.
#
# **Prerequisites:** notebook 01 (bit layouts), notebook 03 (loss scaling), notebook 04 (autocast, `labkit.train`).
#
# **Estimated time:** 65 min

# %% [markdown] lang="zh" en="76d75b1ccb49"
# # 05 · BF16、TF32 与 FP8
#
# **学习目标**
# - 分别用 fp32、fp16（配合损失缩放）和 bf16 训练同一个小型 GPT，**比较这几次训练**，并测量 bf16 噪声更大的原因：
#   它的有效位只有 8 位，而 fp16 有 11 位；
# - 了解 `torch.backends.cuda.matmul.allow_tf32` 和 `torch.set_float32_matmul_precision` 分别改变什么、PyTorch 的
#   默认值是什么，以及 NGC 容器为什么与之不同；
# - 在 CPU 上**模拟 TF32**，测量它给矩阵乘法带来的误差，并与 fp32、fp16 和 bf16 对比；
# - 把真实的激活值转换为 FP8 **E4M3**、把真实的梯度转换为 **E5M2**，比较有无**逐张量缩放**的差别，并在一次训练过程中
#   运行 Transformer Engine 的 **amax 历史**（延迟）缩放方案；
# - 用 `torch._scaled_mm` 运行一次 FP8 矩阵乘法，测量 bf16 在这台 CPU 上（无论有没有 AMX）能带来多少收益，以及不规整的
#   矩阵形状要付出多少代价。
#
# **前置知识：** notebook 01（位布局）、notebook 03（损失缩放）、notebook 04（autocast、`labkit.train`）。
#
# **预计用时：** 65 分钟

# %%
# %matplotlib inline
# %load_ext labkit
import math

import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np
import torch

from labkit import bench, data, device, formats, fp8, models, scaling, tf32, train
from labkit.check import check, predict, reveal
from labkit.exercises.nb05 import FORMAT_CHOICES, WORKLOADS, exercise_tensor

torch.set_num_threads(1)  # tiny models: one thread is fastest (and CI shares 2 cores)
caps = device.capabilities()

# %% [markdown]
# ## 1. BF16 vs FP16: range against precision
#
# Both are 16 bits. FP16 spends 5 on the exponent and 10 on the mantissa; BF16 spends 8 and 7. So BF16 has
# FP32's **range** (no gradient underflow, no loss scaler) and FP16 has 8 times the **precision**
# (eps 2^-10 against 2^-7). TF32 and the FP8 formats of sections 2 and 3 make the same trade at other sizes:

# %% [markdown] lang="zh" en="ba921b9d6e70"
# ## 1. BF16 与 FP16：范围与精度的取舍
#
# 两者都是 16 位。FP16 把 5 位分给指数、10 位分给尾数；BF16 则是 8 位和 7 位。因此 BF16 拥有与 FP32 相同的**范围**
# （梯度不会下溢，不需要损失缩放），而 FP16 的**精度**是它的 8 倍（eps 为 2^-10，BF16 为 2^-7）。第 2 节的 TF32 和
# 第 3 节的 FP8 格式，在别的位宽上做的也是同样的取舍：

# %%
print(formats.table(["fp32", "tf32", "bf16", "fp16", "e4m3fn", "e5m2"]))

# %% [markdown]
# ### Run both, compare
#
# The advice for choosing between them is empirical: *train a few hundred steps in each on your model, compare the
# curves with an fp32 run, and keep the cheaper one that tracks it.* Here is that procedure on a small scale: the
# tiny GPT learns to reverse 6 digits, 60 AdamW steps per policy, same seed, same batches. `labkit.train` runs
# fp16 as autocast + GradScaler and bf16 as autocast alone. The fp32 run also carries a `TensorTap`, which records
# the gradient flowing into one linear layer at every step: section 3 casts those to FP8.

# %% [markdown] lang="zh" en="4786195fce3c"
# ### 两者都跑一遍，再做比较
#
# 在两者之间如何选择，要靠实验来定：*在你自己的模型上用每种格式各训练几百步，把曲线与 fp32 的训练对比，留下跟得上 fp32
# 而又更便宜的那一种。* 下面以小规模演示这一流程：小型 GPT 学习把 6 位数字倒序，每种精度策略训练 60 步 AdamW，种子相同，
# 批次也相同。`labkit.train` 把 fp16 按 autocast + GradScaler 运行，把 bf16 只按 autocast 运行。fp32 那次训练还挂了一个
# `TensorTap`，它在每一步记录流入某个线性层的梯度：第 3 节会把这些梯度转换为 FP8。

# %%
task = data.make_token_task("reverse", n=4096, n_digits=6, vocab_size=12, seed=0)
batches = data.Batches(task.inputs, task.targets, batch_size=32, seed=0)
runs, STEPS, TAPPED = {}, 60, "blocks.1.mlp.2"
for policy in ("fp32", "fp16", "bf16"):
    model = models.TinyGPT(vocab_size=task.vocab_size, seq_len=task.seq_len, d_model=64, seed=0)
    if policy == "fp32":
        tap = fp8.TensorTap(model, layers=[TAPPED], keep_all=True)
    runs[policy] = train.train(model, batches, policy=policy, steps=STEPS, lr=3e-3, device="cpu", progress=False)
    tap.close()  # removes the hooks; what they captured stays
step_grads = tap.gradients[TAPPED]  # one real gradient tensor per fp32 training step

# %%
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.5))
ref = np.array(runs["fp32"].loss)
for name, r in runs.items():
    ax0.plot(r.loss, label=name)
    if name != "fp32":
        ax1.plot(np.abs(np.array(r.loss) - ref) / ref, label=f"{name} vs fp32")
ax0.set(yscale="log", xlabel="step", ylabel="loss", title="same seed, same batches")
ax1.set(yscale="log", xlabel="step", ylabel="|loss - loss_fp32| / loss_fp32", title="how far each run drifts")
ax0.legend(), ax1.legend()
plt.show()

# %% [markdown]
# The three curves lie on top of each other. The final losses depend on this CPU's kernels in their last digits,
# so they are printed in a cell whose output nbval ignores; the assertions below hold on any machine.

# %% [markdown] lang="zh" en="a91e762b575f"
# 三条曲线几乎完全重合。最终损失的最后几位数字取决于这台 CPU 上的内核，所以它们在一个输出会被 nbval 忽略的单元格里打印；
# 下面的断言在任何机器上都成立。

# %%
# NBVAL_IGNORE_OUTPUT
for name, r in runs.items():
    print(f"{name:>5}: loss {r.loss[0]:.3f} -> {r.final_loss():.4f}, skipped steps {r.n_skipped}, final scale {r.scale[-1]:g}")

# %%
first, last = runs["fp32"].loss[0], runs["fp32"].final_loss()
assert last < 0.1 * first                                       # it learned
for name in ("fp16", "bf16"):
    assert abs(runs[name].final_loss() - last) < 0.25 * last    # both track fp32
# bf16 needs no loss scale: none of the real gradients recorded at each fp32 step would flush to zero in bf16
# (torch's own cast decides), while in fp16, unscaled, some would
assert all((g.bfloat16() == 0).sum() == (g == 0).sum() for g in step_grads)
assert any((g.half() == 0).sum() > (g == 0).sum() for g in step_grads)
assert runs["fp16"].n_skipped == 0                              # the scaler kept fp16's gradients in range

# %% [markdown]
# ### Where bf16 is noisier
#
# A curve is a poor microscope: Adam normalises its updates, and one rounding error per step is averaged away over
# many steps. Hold the weights fixed instead and compute the loss and the gradients of one batch three ways. The
# fp16 pass uses a loss scale of 2^16 (as the GradScaler did), so what remains is each format's precision:

# %% [markdown] lang="zh" en="48ea9b1d475e"
# ### bf16 的噪声更大，体现在哪里
#
# 训练曲线是一台很差的显微镜：Adam 会对更新做归一化，每步一次的舍入误差会在许多步中被平均掉。不如把权重固定下来，用三种
# 方式计算同一个批次的损失和梯度。fp16 这一遍使用 2^16 的损失缩放因子（与 GradScaler 当时所用的一样），这样剩下的差别就
# 只来自各个格式的精度：

# %%
def loss_and_grads(model, batch, dtype=None, scale=1.0):
    model.zero_grad()
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = models.lm_loss(model(batch[0]), batch[1])
    (loss * scale).backward()
    return loss.item(), scaling.grad_values(model) / scale

trained, batch = runs["fp32"].model, batches(STEPS + 1)
l32, g32 = loss_and_grads(trained, batch)
noise = {}
for name, dtype, scale in (("fp16", torch.float16, 2.0**16), ("bf16", torch.bfloat16, 1.0)):
    loss_h, g = loss_and_grads(trained, batch, dtype, scale)
    noise[name] = (abs(loss_h - l32) / l32, float((g - g32).norm() / g32.norm()))

# %%
# NBVAL_IGNORE_OUTPUT
for name, (dl, dg) in noise.items():
    print(f"{name}: loss off by {dl:.1e} (relative), gradient off by {dg:.1e} (relative norm)")

# %%
assert noise["bf16"][1] > 3 * noise["fp16"][1]  # 3 fewer mantissa bits: about 8x the gradient error

# %% [markdown]
# The bf16 gradient is about an order of magnitude further from the fp32 one than the fp16 gradient: 2^3 = 8 for
# 3 fewer mantissa bits. (Part of both errors comes from softmax and layer norm, which CPU autocast runs in low
# precision and CUDA autocast upcasts to fp32; see notebook 04.) When does it show in the curves?
#
# - **Late in training**, when the loss improves by less per step than the noise: bf16 curves look ragged where
#   fp16 and fp32 still look smooth. Compare runs by averages over windows, never by single steps.
# - **Small learning rates and long runs**, where tiny systematic errors add up; and any **reduction computed in
#   bf16** (a sum over a long sequence, a loss averaged in bf16).
# - **Weights stored in bf16** without an fp32 master copy: an update smaller than 2^-9 of a weight is rounded
#   away entirely (notebook 02's swamping; `bf16-pure` in notebook 04).
#
# FP16 pays for its precision with range: without the scaler, its gradients underflow (notebook 03). Here the
# GradScaler held 2^16 for all 60 steps without skipping one; bf16 needed no scaler at all. That is the trade: on
# hardware that has both, bf16 is the default because it cannot fail by underflow, and fp16 + scaler is what you
# use where bf16 is missing (V100, T4) or where its precision matters and you can afford the scaler.
#
# ## 2. TF32: fp32 tensors, tensor-core matmuls
#
# TF32 is not a storage type: tensors stay fp32. On an Ampere or newer GPU, a matmul **may** round its fp32 inputs
# to 10 mantissa bits, multiply exactly and accumulate in fp32, on tensor cores. Two settings decide:
#
# - `torch.backends.cuda.matmul.allow_tf32` (matmuls) and `torch.backends.cudnn.allow_tf32` (convolutions);
# - `torch.set_float32_matmul_precision("highest" | "high" | "medium")`: "high" allows TF32, "medium" also allows
#   bf16 internally; setting one updates the other.
#
# PyTorch's default since 1.12 is **off for matmuls** ("highest") and **on for cuDNN convolutions**. NVIDIA's NGC
# PyTorch containers set `TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1`, which makes "high" the default: the same script gives
# slightly different fp32 numbers in and out of the container. labkit reads and sets all of this through the
# device gate:

# %% [markdown] lang="zh" en="64c651aac6ca"
# bf16 梯度偏离 fp32 梯度的程度，大约比 fp16 梯度高一个数量级：少 3 个尾数位，就是 2^3 = 8 倍。（两者的误差中
# 都有一部分来自 softmax 和层归一化：CPU autocast 以低精度运行它们，而 CUDA autocast 会把它们提升到 fp32；见
# notebook 04。）那么，这种差别什么时候会在曲线上显现出来？
#
# - **训练后期**，每步的损失改善已经小于噪声时：fp16 和 fp32 的曲线仍然平滑，bf16 的曲线却已参差不齐。比较几次训练时，
#   要看窗口内的平均值，不要看单步。
# - **学习率小、训练时间长**时，微小的系统误差会不断累积；还有任何**以 bf16 计算的归约**（对长序列求和、以 bf16 求平均
#   的损失）。
# - **权重以 bf16 存储**、又没有 fp32 主权重副本时：小于权重值 2^-9 倍的更新会被完全舍入掉
#   （即 notebook 02 讲的大数吃小数；也就是 notebook 04 中的 `bf16-pure`）。
#
# FP16 的精度是用范围换来的：没有损失缩放，它的梯度就会下溢（notebook 03）。这里 GradScaler 在全部 60 步中一直保持
# 2^16，一步也没有跳过；bf16 则根本不需要损失缩放。这就是取舍所在：在两者都支持的硬件上，bf16 是默认选择，因为它不会
# 因下溢而失败；fp16 + GradScaler 则用在没有 bf16 的硬件上（V100、T4），或者用在 fp16 的精度确有必要、而你也负担得起
# 损失缩放的场合。
#
# ## 2. TF32：fp32 张量，张量核心上的矩阵乘法
#
# TF32 不是一种存储类型：张量仍然是 fp32。在 Ampere 或更新的 GPU 上，矩阵乘法**可能**把 fp32 输入舍入到 10 个尾数位，
# 在张量核心上精确相乘，再以 fp32 累加。是否这样做，由两个设置决定：
#
# - `torch.backends.cuda.matmul.allow_tf32`（矩阵乘法）和 `torch.backends.cudnn.allow_tf32`（卷积）；
# - `torch.set_float32_matmul_precision("highest" | "high" | "medium")`："high" 允许 TF32，"medium" 还允许在内部
#   使用 bf16；设置其中一个，另一个也会随之更新。
#
# PyTorch 从 1.12 起的默认值是：**矩阵乘法关闭**（"highest"），**cuDNN 卷积开启**。NVIDIA 的 NGC PyTorch 容器设置了
# `TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1`，使 "high" 成为默认值：同一个脚本在容器内外得到的 fp32 数值会略有不同。labkit
# 通过设备门控（device gate）读取和设置这一切：

# %%
# NBVAL_IGNORE_OUTPUT
print(device.fp32_matmul_settings())

# %% [markdown]
# ### Emulating TF32
#
# `labkit.tf32.round_mantissa` rounds an fp32 tensor's mantissa to fewer bits with integer arithmetic on the bit
# pattern (round to nearest, ties to even); `tests/test_tf32.py` checks it against `labkit.formats` and torch's
# bf16 cast. TF32 keeps fp32's range; fp16, with the same 10 bits, does not:

# %% [markdown] lang="zh" en="9202ac3b28e3"
# ### 模拟 TF32
#
# `labkit.tf32.round_mantissa` 对 fp32 张量的位模式做整数运算，把尾数舍入到更少的位数（就近舍入，偶数优先）；
# `tests/test_tf32.py` 用 `labkit.formats` 和 torch 自带的 bf16 转换来检验它。TF32 保留了 fp32 的范围；同样只有 10 个
# 尾数位的 fp16 则没有：

# %%
x = torch.tensor([1 / 3, 1000.1, 1e5, 1e-30])
for fmt in ("fp32", "tf32", "fp16", "bf16"):
    print(f"{fmt:>5}:", "  ".join(f"{v:.9g}" for v in tf32.emulate(x, fmt).tolist()))

# %% [markdown]
# What does that rounding cost a matmul? The relative error ‖C − C_ref‖ / ‖C_ref‖ of a 256 × 256 product of seeded
# random matrices, with the inputs rounded to each format and the products summed in fp64 (so only the input
# rounding counts, and the figures are the same on every machine).
#
# **Predict, then run.** How many times larger is the error with the inputs rounded to bf16 than with TF32? Record a
# number before you run the measurement.

# %% [markdown] lang="zh" en="b4235d8d79a2"
# 这种舍入会让矩阵乘法付出多大代价？下面计算两个用固定种子生成的随机矩阵的 256 × 256 乘积的相对误差
# ‖C − C_ref‖ / ‖C_ref‖：输入先舍入到各个格式，乘积在 fp64 中求和（因此只计入输入舍入带来的误差，结果在每台机器上都
# 相同）。
#
# **先预测，再运行。** 把输入舍入到 bf16 时的误差，是 TF32 时的多少倍？在运行测量之前，先记下一个数字。

# %%
prediction = ...
### BEGIN SOLUTION
prediction = 2 ** (10 - 7)
### END SOLUTION
predict("05.bf16-vs-tf32", prediction)

# %%
g = torch.Generator().manual_seed(0)
A, B = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
errors = {fmt: tf32.input_rounding_error(A, B, fmt) for fmt in ("fp32", "tf32", "fp16", "bf16")}
for fmt, e in errors.items():
    print(f"{fmt:>5}: relative error {e:.3g}")
big = A * 2.0**17  # the same matrix scaled exactly: values up to ~6e5
print(f"A * 2^17: tf32 {tf32.input_rounding_error(big, B, 'tf32'):.3g}, fp16 {tf32.input_rounding_error(big, B, 'fp16')}")

# %% tags=["workspace-clear"]
reveal("05.bf16-vs-tf32", errors["bf16"] / errors["tf32"])
assert 2**-13 < errors["tf32"] < 2**-10 and errors["bf16"] > 7 * errors["tf32"]
normal16 = A.abs() >= 2**-14  # where fp16 is normal, TF32's 10-bit rounding must equal torch's own fp16 cast
assert torch.equal(tf32.emulate(A, "tf32")[normal16], A.half().float()[normal16])
assert math.isinf(tf32.input_rounding_error(big, B, "fp16"))

# %% [markdown]
# TF32 costs about 3·10⁻⁴ relative error, the same as fp16 inputs and 8 times less than bf16, with none of fp16's
# overflow. That is why it is a safe default for most training, and why it is not for code that needs fp32 accuracy
# (solvers, a reference run, checks like the one above).
#
# ### On this machine
#
# A CPU has no TF32 units, but the flag is not dead on one: oneDNN honours `set_float32_matmul_precision`, and on
# a CPU with AMX-BF16 "medium" makes it compute **fp32 matmuls in bf16** (without AMX, oneDNN leaves them in fp32).
# Measured (real kernels, so the digits are this machine's):

# %% [markdown] lang="zh" en="8e63e6215cfe"
# TF32 带来约 3·10⁻⁴ 的相对误差，与 fp16 输入相同，只有 bf16 的八分之一，而且没有 fp16 的上溢问题。这就是为什么它对
# 大多数训练来说是安全的默认值，也是为什么对需要 fp32 准确度的代码（求解器、参考运行、上面那样的检查）来说它并不安全。
#
# ### 在这台机器上
#
# CPU 没有 TF32 单元，但这个开关在 CPU 上并非无效：oneDNN 遵循 `set_float32_matmul_precision`，在支持 AMX-BF16 的 CPU
# 上，"medium" 会让它**以 bf16 计算 fp32 矩阵乘法**（没有 AMX 时，oneDNN 仍以 fp32 计算）。实测结果如下（运行的是真实
# 内核，所以这些数字只属于这台机器）：

# %%
# NBVAL_IGNORE_OUTPUT
real = {}
try:
    for precision in ("highest", "high", "medium"):
        device.set_float32_matmul_precision(precision)
        real[precision] = tf32.matmul_error(A, B, torch.float32)
finally:
    device.set_float32_matmul_precision("highest")
real["bf16 tensors"] = tf32.matmul_error(A, B, torch.bfloat16)
print({k: f"{v:.1e}" for k, v in real.items()})
switched = real["medium"] > 100 * real["highest"]
print(f"Here (CPU class {caps.cpu_class}): \"medium\" {'moved fp32 matmuls to bf16' if switched else 'changed nothing'}.")

# %%
assert real["highest"] < 1e-6 and device.fp32_matmul_settings()["float32_matmul_precision"] == "highest"
if caps.device_type == "cpu" and caps.cpu_class == "amx":
    assert switched                                 # AMX: oneDNN really switched to bf16
elif caps.device_type == "cpu" and not caps.bf16_fast:
    assert not switched                             # no bf16 hardware: oneDNN keeps fp32

# %% [markdown]
# ### How much faster: the datasheet's ratios
#
# > **Common misconception** (seed 000 §1.2, seed 000 §3.1, seed 000 §3.4): FP16 on tensor cores runs about twice
# > as fast as FP32, and switching TF32 on speeds matrix multiplications up by nearly a factor of two.
# >
# > **Why it is wrong:** on tensor cores neither ratio is 2, and neither is fixed. Tensor cores are units of their
# > own beside the FP32 cores, each format has its own peak, and the ratio is a property of the chip. NVIDIA's A100
# > datasheet gives, dense: 19.5 TFLOP/s FP32 (CUDA cores), 156 TF32 and 312 FP16/BF16 (tensor cores). TF32 has 8
# > times FP32's peak and FP16 16 times; on tensor cores the factor 2 holds only between FP16 and TF32 (the
# > 2:4-sparse figures, 312 TF32 and 624 FP16, double both again). "FP16 = 2 × FP32" is the rate of FP16 on the
# > ordinary CUDA cores, two values packed per instruction (V100: 31.4 against 15.7 TFLOP/s; the A100 has 4 ×),
# > not what tensor cores give. On a CPU the bf16/fp32 ratio depends on its matrix hardware: from well below 1
# > (emulated bf16) to several times (AMX).
# >
# > **What is true:** a peak ratio bounds the speed-up of the matmuls alone. A real step gains less, because its
# > elementwise and memory-bound work does not run on tensor cores (Amdahl, section 4), so measure the step. The
# > A100 whitepaper and datasheet give the peaks; section 4 prints the ratio this CPU reaches (it depends on the
# > machine, so nothing asserts it).
#
# On a GPU, TF32's point is speed. `labkit.tf32.time_tf32` times fp32, TF32 and bf16 matmuls interleaved in one run
# (CUDA events, median of repeats) where the device has TF32 tensor cores, and returns `None` elsewhere:

# %% [markdown] lang="zh" en="a048c3492466"
# ### 快多少：数据手册给出的比例
#
# > **常见误解**（seed 000 §1.2、seed 000 §3.1、seed 000 §3.4）：FP16 在张量核心上的速度大约是 FP32 的两倍，打开 TF32
# > 能让矩阵乘法的速度提高到将近两倍。
# >
# > **错在哪里：** 在张量核心上，这两个比例都不是 2，也都不是固定值。张量核心是 FP32 核心之外独立的单元，每种格式都有
# > 各自的峰值，比例是芯片本身的属性。NVIDIA 的 A100 数据手册给出的稠密算力是：FP32 19.5 TFLOP/s（CUDA 核心），TF32
# > 156、FP16/BF16 312（张量核心）。TF32 的峰值是 FP32 的 8 倍，FP16 是 16 倍；在张量核心上，2 倍的关系只存在于 FP16 与
# > TF32 之间（2:4 稀疏的数字为 TF32 312、FP16 624，两者又各翻一倍）。“FP16 = 2 × FP32”是 FP16 在普通 CUDA 核心上的
# > 速率，每条指令打包两个值（V100：31.4 对 15.7 TFLOP/s；A100 是 4 倍），并不是张量核心给出的速率。在 CPU 上，
# > bf16/fp32 的比例取决于它的矩阵硬件：从远低于 1（软件模拟的 bf16）到好几倍（AMX）。
# >
# > **实际情况：** 峰值比例只是矩阵乘法本身加速的上限。一个真实训练步的收益更少，因为其中的逐元素运算和访存密集型工作
# > 不在张量核心上运行（阿姆达尔定律，见第 4 节），所以要测量整个训练步。A100 白皮书和数据手册给出了峰值；第 4 节会打印
# > 这台 CPU 实际达到的比例（它取决于机器，所以没有对它做断言）。
#
# 在 GPU 上，TF32 的意义在于速度。在有 TF32 张量核心的设备上，`labkit.tf32.time_tf32` 在一次运行中交错计时 fp32、TF32
# 和 bf16 的矩阵乘法（用 CUDA 事件计时，取多次重复的中位数）；在其他设备上，它返回 `None`：

# %%
# NBVAL_IGNORE_OUTPUT
timing = tf32.time_tf32(4096)
if timing is not None:
    print(timing.table(f"{timing.extra['n']}x{timing.extra['n']} matmul on {caps.device_name}"))
else:
    print(f"no TF32 hardware on this {caps.device_type} device: nothing to time here. (NVIDIA's datasheets give "
          "the dense peaks: A100 19.5 TFLOPS fp32 vs 156 TF32 vs 312 bf16; real matmuls reach a good part of that.)")

# %% [markdown]
# ## 3. FP8: E4M3 forward, E5M2 backward, one scale per tensor
#
# FP8 training (Hopper, Ada and later) keeps master weights in fp32 and computes in 16 bits, but casts the
# **inputs of each matmul** to 8 bits: activations and weights to **E4M3** (3 mantissa bits, range 2^-9 to 448) in the
# forward pass, and the output gradients to **E5M2** (2 mantissa bits, range 2^-16 to 57344) in the backward pass.
# 18 binades (E4M3) or 32 (E5M2) hold a tensor only if it sits at the right height, and tensors sit anywhere from
# 10⁻⁷ to 10³, so every tensor gets its own **scale**: it is multiplied by `scale` before the cast and divided by
# it after.
#
# > **Common misconception** (seed 000 §3.4): FP8's two variants, E4M3 and E5M2, serve training and inference
# > respectively.
# >
# > **Why it is wrong:** both are used *in training*, by tensor role: E4M3 (3 mantissa bits, max 448) holds the
# > forward pass's activations and weights, where precision matters; E5M2 (2 mantissa bits, max 57344) holds the
# > gradients of the backward pass, which need the wider range. Inference, which has no backward pass, uses E4M3.
# >
# > **What is true:** the split is forward against backward (Transformer Engine calls it the "hybrid" recipe). The
# > cells of this section show why: in some layers a share of the real gradients flushes to zero in E4M3 even with
# > the best scale, while E5M2 holds them.
#
# First, the casts themselves, which are real on a CPU. Overflow is where libraries disagree: torch **saturates**
# E4M3FN to ±448 (it has no inf), ml_dtypes and the OCP spec's non-saturating mode give **NaN**, and E5M2 overflows
# to **inf** like fp16. `labkit.fp8.quantize` names the rule:

# %% [markdown] lang="zh" en="387e23a2d4e0"
# ## 3. FP8：前向用 E4M3，反向用 E5M2，每个张量一个缩放因子
#
# FP8 训练（Hopper、Ada 及更新的架构）把主权重保存在 fp32 中，以 16 位进行计算，但把**每个矩阵乘法的输入**转换为 8 位：
# 前向传播中，激活值和权重转换为 **E4M3**（3 个尾数位，范围 2^-9 到 448）；反向传播中，输出梯度转换为 **E5M2**（2 个
# 尾数位，范围 2^-16 到 57344）。E4M3 的 18 个 binade（binade 即区间 [2^k, 2^(k+1))）或 E5M2 的 32 个，只有在张量
# 处在合适的量级时才装得下它，而张量的量级从 10⁻⁷ 到 10³ 都有，所以每个张量都有自己的**缩放因子**：转换前乘以 `scale`，
# 转换后再除以它。
#
# > **常见误解**（seed 000 §3.4）：FP8 的两种变体 E4M3 和 E5M2，分别用于训练和推理。
# >
# > **错在哪里：** 两者都用于*训练*，按张量的角色分工：E4M3（3 个尾数位，最大值 448）存放前向传播的激活值和权重，这里
# > 精度更重要；E5M2（2 个尾数位，最大值 57344）存放反向传播的梯度，梯度需要更宽的范围。推理没有反向传播，用的是 E4M3。
# >
# > **实际情况：** 分工是前向对反向（Transformer Engine 把它叫作“hybrid”方案）。本节的单元格会说明原因：在某些层中，
# > 即使用最佳的缩放因子，E4M3 中仍有一部分真实梯度下溢为 0，而 E5M2 能保住它们。
#
# 先看转换本身，它们在 CPU 上是真实执行的。各个库在上溢时的处理并不一致：torch 把 E4M3FN **饱和**到 ±448（它没有 inf），
# ml_dtypes 和 OCP 规范的非饱和模式给出 **NaN**，而 E5M2 像 fp16 一样上溢为 **inf**。`labkit.fp8.quantize` 要求明确
# 指定规则：

# %%
v = torch.tensor([1.0, 300.0, 500.0, 70000.0, 1e-3])
print("torch  e4m3fn:", v.to(torch.float8_e4m3fn).float().tolist())
print("ml_dtypes e4m3fn:", v.numpy().astype(ml_dtypes.float8_e4m3fn).astype(np.float32).tolist())
print("torch  e5m2:  ", v.to(torch.float8_e5m2).float().tolist())
for fmt, rule in (("e4m3fn", "saturate"), ("e4m3fn", "nan"), ("e5m2", "inf"), ("e5m2", "saturate")):
    print(f"fp8.quantize {fmt:>6} {rule:>8}:", fp8.quantize(v, fmt, overflow=rule).float().tolist())

# %% [markdown]
# Saturation hides an overflow (the value is silently wrong); NaN makes it loud. Transformer Engine saturates, and
# relies on the scale to keep overflows rare.
#
# ### Real activations and gradients, with and without a scale
#
# A `TensorTap` on every linear layer of the trained model captures what an FP8 recipe would cast: the input of
# each layer (an activation) and the gradient arriving at its output. Per-tensor scaling uses
# `scale = fp8_max / amax`, so the largest magnitude lands on the format's maximum:

# %% [markdown] lang="zh" en="eb545d9bafe3"
# 饱和会掩盖上溢（数值悄无声息地错了）；NaN 则让它暴露出来。Transformer Engine 采用饱和，并依靠缩放因子让上溢保持罕见。
#
# ### 真实的激活值和梯度：有无缩放因子
#
# 在训练好的模型的每个线性层上挂一个 `TensorTap`，捕获 FP8 方案要转换的内容：每一层的输入（激活值），以及到达该层输出
# 的梯度。逐张量缩放使用 `scale = fp8_max / amax`，让绝对值最大的那个数正好落在格式的最大值上：

# %%
with fp8.TensorTap(trained) as cap:
    trained.zero_grad()
    models.lm_loss(trained(batch[0]), batch[1]).backward()
names = list(cap.activations)
stats = {}
for n in names:
    a, gr = cap.activations[n][0], cap.gradients[n][0]
    stats[n] = {"act E4M3, scale 1": fp8.quant_stats(a, "e4m3fn"),
                "act E4M3, scaled": fp8.quant_stats(a, "e4m3fn", fp8.compute_scale(fp8.amax(a), "e4m3fn")),
                "grad E5M2, scale 1": fp8.quant_stats(gr, "e5m2"),
                "grad E5M2, scaled": fp8.quant_stats(gr, "e5m2", fp8.compute_scale(fp8.amax(gr), "e5m2")),
                "grad E4M3, scaled": fp8.quant_stats(gr, "e4m3fn", fp8.compute_scale(fp8.amax(gr), "e4m3fn"))}

# %%
fig, ax = plt.subplots(figsize=(11, 3.8))
kinds = list(stats[names[0]])
for i, kind in enumerate(kinds):
    ax.bar(np.arange(len(names)) + (i - 2) * 0.16, [stats[n][kind].rel_error for n in names], 0.16, label=kind)
ax.set(yscale="log", ylabel="relative error (norm)", title="FP8 cast of real tensors of the trained tiny GPT")
ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
ax.legend(fontsize=8, ncol=3)
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'layer':<20}" + "".join(f"{k:>20}" for k in kinds) + "   (relative error / flushed to zero)")
for n in names:
    print(f"{n:<20}" + "".join(f"{s.rel_error:>11.3f} / {s.underflow:5.1%}" for s in stats[n].values()))

# %%
for n in names:
    s = stats[n]
    assert s["grad E5M2, scaled"].rel_error < 0.1 < s["grad E5M2, scale 1"].rel_error  # scaling rescues gradients
    assert s["act E4M3, scaled"].rel_error < 0.05
assert max(stats[n]["grad E4M3, scaled"].underflow for n in names) > 10 * max(
    stats[n]["grad E5M2, scaled"].underflow for n in names)  # E4M3's range is too short for some gradients
unscaled = {n: stats[n]["grad E5M2, scale 1"].underflow for n in names}
assert all(v > 0.9 for n, v in unscaled.items() if n != "head") and unscaled["head"] < 0.9  # see the table
# the relative errors come from labkit's cast: check one against ml_dtypes' own E4M3 cast (no scale, in range)
a0 = cap.activations[names[0]][0].double()
ref_back = torch.from_numpy(a0.numpy().astype(ml_dtypes.float8_e4m3fn).astype(np.float64))
assert math.isclose(stats[names[0]]["act E4M3, scale 1"].rel_error,
                    float((ref_back - a0).norm() / a0.norm()), rel_tol=1e-9)

# %% [markdown]
# Read the picture by column:
#
# - **Activations** sit after a layer norm, with amax of a few units: E4M3 holds them with or without a scale, at the
#   ~2.6 % relative error its 3 mantissa bits allow. The scale only rescues the few tiny values that fell below 2^-9.
# - **Gradients** of a mean loss over a batch are tiny (amax around 10⁻⁶ in most layers, below E5M2's smallest
#   subnormal 2^-16 ≈ 1.5·10⁻⁵): without a scale **nearly all of them flush to zero** (relative error close to 1).
#   The head's gradients, those of the logits, are larger, and about half of them survive. With a per-tensor
#   scale, E5M2 holds every layer at ~5 % error: 2 mantissa bits.
# - **E4M3 for gradients** would be more precise (~2.6 %), but its 18 binades are too few for some gradients: in
#   at least one layer a sizable share of values still flushes to zero even with the best scale (see the table).
#   The norm barely shows it, because the lost values are the smallest; but each of them is a contribution that
#   no longer reaches the weight gradients or the layers below. That is why the recipe uses E5M2 backward: range over precision, the same trade as bf16 over fp16.
#
# ### Delayed scaling: the scale from an amax history
#
# Computing `amax` of a tensor before casting it costs an extra pass over memory. Transformer Engine's *delayed
# scaling* instead uses the amaxes of **earlier steps**: each tensor keeps a history of its last `history_len`
# amaxes, the scale for this step comes from their maximum, and this step's amax is recorded after the cast.
# `labkit.fp8.DelayedScaling` is that recipe in 40 lines. Replay it over the gradients the tap recorded during
# the fp32 training run:

# %% [markdown] lang="zh" en="fc17355afb60"
# 按列来读这张图：
#
# - **激活值**位于层归一化之后，amax 只有几个单位：无论有没有缩放因子，E4M3 都能容纳它们，相对误差约 2.6 %，这正是 3 个
#   尾数位所能达到的水平。缩放因子只挽救了少数低于 2^-9 的极小值。
# - 对一个批次取平均的损失，其**梯度**非常小（多数层的 amax 约为 10⁻⁶，低于 E5M2 最小的次正规数 2^-16 ≈ 1.5·10⁻⁵）：
#   没有缩放因子时，**几乎全部下溢为 0**（相对误差接近 1）。输出头（head）的梯度，也就是 logits 的梯度，要大一些，大约
#   一半能保留下来。有了逐张量缩放因子，E5M2 在每一层的误差都约为 5 %：这是 2 个尾数位的水平。
# - **用 E4M3 存放梯度**会更精确（约 2.6 %），但它的 18 个 binade 对某些梯度来说不够：至少在一层中，即使用最佳的缩放因子，
#   仍有相当比例的值下溢为 0（见上表）。范数几乎看不出这一点，因为丢掉的是最小的那些值；但其中每一个，都是一份再也传不到
#   权重梯度和下面各层的贡献。这就是该方案在反向传播中使用 E5M2 的原因：范围优先于精度，与 bf16 优先于 fp16 是同样的取舍。
#
# ### 延迟缩放：从 amax 历史得到缩放因子
#
# 在转换之前计算张量的 `amax`，要额外读一遍内存。Transformer Engine 的*延迟缩放*（delayed scaling）改用**之前各步**的
# amax：每个张量保存最近 `history_len` 个 amax 的历史，本步的缩放因子取自其中的最大值，本步的 amax 在转换之后才记录下来。
# `labkit.fp8.DelayedScaling` 用 40 行代码实现了这一方案。下面把它在 fp32 训练过程中由 `TensorTap` 记录的梯度上重放一遍：

# %%
def replay(grads, fmt="e5m2", history_len=16):
    ds, rows = fp8.DelayedScaling(fmt, history_len=history_len), []
    for gr in grads:
        used = ds.scale                                   # from earlier steps only
        rows.append((fp8.amax(gr), fp8.fp8_max(fmt) / used, fp8.quant_stats(gr, fmt, used),
                     fp8.quant_stats(gr, fmt, fp8.compute_scale(fp8.amax(gr), fmt))))
        ds.update(fp8.amax(gr))
    return rows

rows = replay(step_grads)

# %%
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.5))
ax0.plot([r[0] for r in rows], label="amax of this step's gradient")
ax0.plot([r[1] for r in rows], "--", label="largest value the delayed scale can hold")
ax0.set(yscale="log", xlabel="step", title=f"{TAPPED}: gradient amax vs E5M2 ceiling")
ax1.plot([r[2].rel_error for r in rows], label="delayed scaling (history 16)")
ax1.plot([r[3].rel_error for r in rows], ":", label="current scaling (this step's amax)")
ax1.plot([fp8.quant_stats(gr, "e5m2").rel_error for gr in step_grads], label="no scaling")
ax1.set(yscale="log", xlabel="step", ylabel="relative error", title="E5M2 cast of the real gradients")
ax0.legend(fontsize=8), ax1.legend(fontsize=8)
plt.show()

# %%
assert fp8.quant_stats(step_grads[-1], "e5m2").rel_error > 0.5  # unscaled: the late, small gradients are lost
assert all(r[2].saturated == 0 for r in rows)                  # shrinking gradients never overflow the ceiling
assert max(r[2].rel_error for r in rows[1:]) < 2 * max(r[3].rel_error for r in rows)  # as good as current scaling

# %% [markdown]
# The gradients shrink by three orders of magnitude while the model learns. Unscaled, the cast is fine while they
# are large and loses nearly everything once they fall below E5M2's range. The delayed ceiling follows a staircase:
# it stays at the largest amax of the last 16 steps, so it lags behind. That costs nothing here, because E5M2 has
# 32 binades to spare below the ceiling. (Step 0 has no history and uses a scale of 1; the first gradients were
# still large enough for that.)
#
# The failure mode is the opposite direction: a **sudden jump**. What if one step's gradient were 1000 times larger
# (a loss spike, a bad batch)? The tensor is real, the spike is made up:

# %% [markdown] lang="zh" en="0ed792c2a27a"
# 在模型学习的过程中，梯度缩小了三个数量级。不加缩放时，梯度还大的时候转换没有问题，一旦它们降到 E5M2 的范围以下，就几乎
# 全部丢失。延迟缩放的上限（它所能容纳的最大值）呈阶梯状：它停留在最近 16 步中最大的 amax 上，因此会滞后。这在这里没有
# 任何代价，因为 E5M2 在上限之下还有 32 个 binade 的余量。（第 0 步没有历史，使用缩放因子 1；最初的梯度还足够大，这样
# 也没有问题。）
#
# 失效发生在相反的方向：**突然跃升**。如果某一步的梯度大了 1000 倍（一次损失尖峰、一个坏批次），会怎样？张量是真实的，
# 尖峰是人为制造的：

# %%
spiky = [gr * (1000.0 if i == 40 else 1.0) for i, gr in enumerate(step_grads)]
spike = replay(spiky)[40]
print(f"step 40 x1000: delayed scaling saturates {spike[2].saturated:.0%} of the values "
      f"(error {spike[2].rel_error:.2f}); current scaling: {spike[3].saturated:.0%} (error {spike[3].rel_error:.2f})")
assert spike[2].saturated > 0.1 and spike[3].saturated == 0

# %% [markdown]
# Delayed scaling clamps the spike to the old ceiling; the next step's scale already includes it (and keeps it for
# `history_len` steps). This is the trade the recipe makes: no extra pass, a one-step lag. Newer recipes (current
# scaling, MXFP8's per-block scales on Blackwell) pay for the extra pass or use finer scales instead.
#
# ### An FP8 matmul: `torch._scaled_mm`
#
# On a GPU, FP8 pays only inside the matmul: the tensor cores read FP8 inputs and accumulate in fp32. PyTorch exposes
# that as `torch._scaled_mm(a_fp8, b_fp8, scale_a, scale_b, out_dtype)`, which takes the **inverse** scales and
# applies them to the accumulator. On many CPUs it runs too, through oneDNN, but not on all: oneDNN has no E4M3
# matmul for some CPU classes (an AVX-512 CPU without AVX512-FP16, for one). The device gate tries it
# (`device.computes(torch.float8_e4m3fn)`). `fp8.scaled_mm` casts a real activation and the layer's real weight to
# E4M3 with per-tensor scales and calls it; `fp8.scaled_mm_reference` computes the same product from the
# dequantised FP8 values, which is what the kernel must equal.

# %% [markdown] lang="zh" en="23d9b682605a"
# 延迟缩放把这次尖峰钳制在旧的上限上；下一步的缩放因子已经把它计入了（并会保留 `history_len` 步）。这就是该方案所做的
# 取舍：不用额外读一遍内存，代价是滞后一步。较新的方案（即时缩放，即 current scaling；Blackwell 上 MXFP8 的逐块缩放因子）
# 则要么付出额外读一遍的代价，要么改用更细粒度的缩放因子。
#
# ### 一次 FP8 矩阵乘法：`torch._scaled_mm`
#
# 在 GPU 上，FP8 只在矩阵乘法内部带来收益：张量核心读取 FP8 输入，以 fp32 累加。PyTorch 通过
# `torch._scaled_mm(a_fp8, b_fp8, scale_a, scale_b, out_dtype)` 提供这一能力，它接受的是缩放因子的**倒数**，并把它们
# 作用在累加器上。在许多 CPU 上它也能通过 oneDNN 运行，但不是全部：对某些 CPU 类别，oneDNN 没有 E4M3 矩阵乘法（比如
# 不带 AVX512-FP16 的 AVX-512 CPU）。设备门控会实际试一次（`device.computes(torch.float8_e4m3fn)`）。`fp8.scaled_mm`
# 以逐张量缩放把一个真实的激活值和该层真实的权重转换为 E4M3，然后调用它；`fp8.scaled_mm_reference` 用反量化后的 FP8
# 值计算同一个乘积，内核的结果必须与它相等。

# %%
# NBVAL_IGNORE_OUTPUT
FP8_MM = device.computes(torch.float8_e4m3fn)
print("torch._scaled_mm with E4M3 runs here:", FP8_MM,
      "" if FP8_MM else f"(no oneDNN kernel on this {device.cpu_class()} CPU: the reference stands in below)")

# %%
layer = "blocks.0.mlp.0"
act = cap.activations[layer][0].reshape(-1, 64)              # (batch * tokens, d_model)
w_t = trained.blocks[0].mlp[0].weight.detach().t()           # (d_model, 4 * d_model)
ref = fp8.scaled_mm_reference(act, w_t)                      # the dequantised FP8 inputs, multiplied in fp64
out = fp8.scaled_mm(act, w_t) if FP8_MM else ref
exact = act.double() @ w_t.double()
assert torch.allclose(out.double(), ref.double(), rtol=1e-5, atol=1e-5)
fp8_err = float((out.double() - exact).norm() / exact.norm())
print(f"{tuple(act.shape)} @ {tuple(w_t.shape)} in FP8: equals the dequantised reference; error vs fp64 "
      f"{'below 5 %' if fp8_err < 0.05 else 'above 5 %'}")

# %% [markdown]
# The product of two E4M3 tensors is a few per cent off, well within what training tolerates once the master weights
# and the optimizer stay in fp32. On a GPU with compute capability 8.9 or higher (Ada, Hopper, Blackwell),
# `labkit.fp8.time_fp8_matmul` times the FP8 matmul against bf16 in one run; elsewhere it returns `None`:

# %% [markdown] lang="zh" en="5d106f87d7a4"
# 两个 E4M3 张量的乘积会偏差几个百分点；只要主权重和优化器保持在 fp32，这完全在训练能承受的范围之内。在计算能力 8.9 及
# 以上的 GPU（Ada、Hopper、Blackwell）上，`labkit.fp8.time_fp8_matmul` 会在一次运行中对比 FP8 与 bf16 矩阵乘法的耗时；
# 在其他设备上，它返回 `None`：

# %%
# NBVAL_IGNORE_OUTPUT
timing = fp8.time_fp8_matmul(4096)
if timing is not None:
    print(timing.table(f"{timing.extra['n']}x{timing.extra['n']} matmul on {caps.device_name}"))
else:
    print(f"no FP8 tensor cores on this {caps.device_type} device (tier {caps.tier}): the casts ran above, "
          "nothing to time. (H100 SXM datasheet, dense: 989 TFLOPS bf16, 1979 TFLOPS fp8.)")

# %% [markdown]
# ## 4. Speed on this machine
#
# What bf16 buys on a CPU depends on its matrix hardware, and CPUs differ:
#
# - **AMX-BF16** (Intel Xeon since Sapphire Rapids): tile registers and a unit that multiplies 16 × 32 bf16 tiles
#   per instruction, about 1024 bf16 flops per cycle per core, against 64 fp32 flops per cycle from two AVX-512
#   FMA units. bf16 matmuls run several times faster than fp32.
# - **AVX512-BF16** without AMX: a bf16 dot-product instruction; bf16 matmuls run at roughly the fp32 rate, and
#   the gain is mostly the halved memory traffic.
# - **Neither** (most laptops, many cluster nodes): bf16 is *emulated*, converted to fp32 and back around every
#   operation, and is slower than fp32, often several times.
#
# `labkit.device.fast(torch.bfloat16)` says which case this machine is. `labkit.bench.amp_benchmark` measures the
# bf16/fp32 ratio of a matmul and of a tiny-GPT training step, each interleaved in one run (warm-up, median of
# repeats), so both dtypes see the same machine load:

# %% [markdown] lang="zh" en="dc9f9c2c5773"
# ## 4. 这台机器上的速度
#
# bf16 在 CPU 上能带来多少收益，取决于它的矩阵硬件，而各种 CPU 差别很大：
#
# - **AMX-BF16**（Intel Xeon，自 Sapphire Rapids 起）：有 tile 寄存器，以及一个每条指令完成 16 × 32 bf16 tile 乘法的
#   单元，每核每周期约 1024 次 bf16 浮点运算，而两个 AVX-512 FMA 单元每周期只有 64 次 fp32 浮点运算。bf16 矩阵乘法比
#   fp32 快好几倍。
# - **有 AVX512-BF16 但没有 AMX**：有一条 bf16 点积指令；bf16 矩阵乘法的速度与 fp32 大致相当，收益主要来自减半的访存量。
# - **两者都没有**（大多数笔记本电脑、许多集群节点）：bf16 是*模拟*的，每次运算前后都要与 fp32 来回转换，比 fp32 更慢，
#   往往慢好几倍。
#
# `labkit.device.fast(torch.bfloat16)` 会告诉你这台机器属于哪种情况。`labkit.bench.amp_benchmark` 测量一次矩阵乘法和
# 一个小型 GPT 训练步的 bf16/fp32 速度比，两项各自在一次运行中交错进行（先预热，再取多次重复的中位数），这样两种数据
# 类型面对的是同样的机器负载：

# %%
# NBVAL_IGNORE_OUTPUT
res = bench.amp_benchmark("cpu", ("bf16",), matmul_size=512, warmup=2, repeats=5,
                          train_kwargs={"batch_size": 32, "d_model": 64})
mm, ts = res["matmul"], res["train_step"]
print(mm.table("matmul 512 x 512, 1 thread"))
print(ts.table("tiny-GPT train step (AdamW, batch 32)"))
print(f"bf16 speed-up: matmul {mm.speedup('bf16'):.1f}x, train step {ts.speedup('bf16'):.1f}x")
print(f"This machine: {device.cpu_summary()}.")
print(f"So bf16 matmuls here are {'faster' if mm.speedup('bf16') > 1 else 'slower'} than fp32 "
      f"({'native bf16 hardware' if device.fast(torch.bfloat16, 'cpu') else 'emulated bf16'}), and the train step's "
      f"ratio is {'closer to 1 than' if abs(ts.speedup('bf16') - 1) < abs(mm.speedup('bf16') - 1) else 'not closer to 1 than'}"
      " the matmul's.")

# %%
# the benchmark ran on the CPU; a large margin either way: AMX wins, emulated bf16 loses
if device.cpu_class() == "amx":
    assert mm.speedup("bf16") > 1.2
elif not device.fast(torch.bfloat16, "cpu"):
    assert mm.speedup("bf16") < 0.8

# %% [markdown]
# Where the ratio comes from:
#
# - With AMX the **matmul** speed-up is large (the peak ratio is 16×) because AMX only exists for bf16 (and int8):
#   fp32 matmuls run on AVX-512. Packing the inputs into tiles and the memory traffic keep it below the peak.
#   Without bf16 hardware the ratio is below 1: every bf16 operation pays for conversions.
# - The **train step**'s ratio is usually closer to 1 than the matmul's (the cell above says whether it was here), and
#   with matrix hardware it can still lose. The tiny GPT's matmuls are small
#   (32 sequences of 16 tokens, 64 features), and most of a step is elementwise work (layer norm, GELU, softmax,
#   the AdamW update in fp32), per-op overhead, and autocast's casts of weights and activations to bf16 and back:
#   work that matrix units do not accelerate, and that the casts add to. Amdahl's law: speeding up a small share of the time 10×
#   saves less than that share. A large model spends most of its time in big matmuls, and then the matmul ratio is
#   what it gets; that is why a benchmark must time the real step, not only a matmul.
#
# ### Tensor-core-friendly shapes
#
# Matrix units work on fixed tiles: NVIDIA tensor cores want dimensions that are multiples of 8 (fp16/bf16; 16
# for FP8), AMX tiles hold 16 rows of 32 bf16. A dimension that does not divide pads a tile or falls back to a
# slower path. Compare 512 with its neighbours, both dtypes interleaved in one run:

# %% [markdown] lang="zh" en="a37badde8f3a"
# 这个比例从何而来：
#
# - 有 AMX 时，**矩阵乘法**的加速比很大（峰值比例为 16×），因为 AMX 只支持 bf16（和 int8）：fp32 矩阵乘法在 AVX-512 上
#   运行。把输入打包成 tile 以及访存开销，使它达不到峰值。没有 bf16 硬件时，比例低于 1：每一次 bf16 运算都要为类型转换
#   付出代价。
# - **训练步**的比例通常比矩阵乘法的更接近 1（上面的单元格说明了这里是否如此），而且即使有矩阵硬件，它也可能反而更慢。
#   小型 GPT 的矩阵乘法很小（32 条序列、每条 16 个 token、64 个特征），一个训练步的大部分时间花在逐元素运算（层归一化、
#   GELU、softmax、以 fp32 进行的 AdamW 更新）、每个算子的固定开销，以及 autocast 把权重和激活值转换为 bf16 再转回来上：
#   矩阵单元加速不了这些工作，而类型转换还会让它们更多。阿姆达尔定律：把只占一小部分的时间加速 10 倍，省下的时间也
#   不会超过这一部分。大模型的大部分时间花在大矩阵乘法上，这时它得到的就是矩阵乘法的比例；所以基准测试必须对真实的
#   训练步计时，而不能只测一次矩阵乘法。
#
# ### 对张量核心友好的形状
#
# 矩阵单元按固定大小的 tile 工作：NVIDIA 张量核心希望维度是 8 的倍数（fp16/bf16；FP8 为 16），AMX 的 tile 容纳 16 行、
# 每行 32 个 bf16。不能整除的维度要么填充 tile，要么退回较慢的路径。下面把 512 与相邻的尺寸对比，两种数据类型在一次
# 运行中交错进行：

# %%
# NBVAL_IGNORE_OUTPUT
cands = {}
for n in (512, 511, 520):
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a_, b_ = torch.randn(n, n, generator=g).to(dt), torch.randn(n, n, generator=g).to(dt)
        cands[f"{name} {n}"] = lambda a_=a_, b_=b_: a_ @ b_
shapes = bench.compare(cands, warmup=2, repeats=5, device="cpu")
for k, t in shapes.timings.items():
    print(f"{k:>9}: {2 * int(k.split()[1]) ** 3 / t.median / 1e9:7.1f} GFLOP/s (spread {t.spread:.0%})")

# %% [markdown]
# Read GFLOP/s, not time: 520 does (520/512)³ − 1 = 4.8 % more work than 512. On a GPU the odd size can cost far more (a fallback to
# non-tensor-core kernels in older cuBLAS versions); the rule of thumb is to pad the matmul dimensions (tokens per
# step, hidden, vocabulary) to multiples of 8, or 64 to be safe. On a shared CPU, repeat the cell: the spread column says how much to trust one
# run. The speed part is the one place this notebook prints figures that belong to this machine alone.
#
# > **Common misconception** (seed 002 §2.2): for tensor cores, "the batch size should be a multiple of 8".
# >
# > **Why it is wrong:** tensor cores see matrix dimensions, not the batch: for a linear layer those are the tokens
# > per step (batch × sequence length) and its input and output features; for the output layer, the vocabulary. A
# > batch of 8 does not help a hidden size of 1000 or a vocabulary of 50257.
# >
# > **What is true:** make every matmul dimension a multiple of 8 for FP16/BF16 (16 for FP8; 64 is safer); nanoGPT
# > pads GPT-2's vocabulary from 50257 to 50304 for this reason (the released GPT-2 keeps 50257). NVIDIA's
# > deep-learning performance guide (its "matrix multiplication background" chapter) gives the rules per GPU
# > generation.
#
# ## 5. Exercises
#
# **5.1 Choose a format.** For each workload, pick one of `FORMAT_CHOICES`:

# %% [markdown] lang="zh" en="cc3cdd65c718"
# 要看 GFLOP/s，而不是时间：520 的计算量比 512 多 (520/512)³ − 1 = 4.8 %。在 GPU 上，不规整的尺寸代价可能大得多（在较老的
# cuBLAS 版本中会退回不使用张量核心的内核）；经验法则是把矩阵乘法的各个维度（每步的 token 数、隐藏层大小、词表大小）填充到 8 的倍数，稳妥起见填充到 64
# 的倍数。在共享的 CPU 上，请把这个单元格多运行几次：spread 一栏告诉你单次运行有多可信。速度这一部分，是本 notebook 唯一
# 打印只属于这台机器的数字的地方。
#
# > **常见误解**（seed 002 §2.2）：为了用好张量核心，“批大小应当是 8 的倍数”。
# >
# > **错在哪里：** 张量核心看到的是矩阵的维度，而不是批大小：对线性层来说，这些维度是每步的 token 数（批大小 × 序列
# > 长度）以及它的输入和输出特征数；对输出层来说，还有词表大小。批大小取 8，帮不了隐藏层大小为 1000 或词表大小为 50257
# > 的模型。
# >
# > **实际情况：** 对 FP16/BF16，让每个矩阵乘法的维度都是 8 的倍数（FP8 为 16；64 更稳妥）；nanoGPT 正是出于这个原因，
# > 把 GPT-2 的词表从 50257 填充到 50304（官方发布的 GPT-2 仍是 50257）。NVIDIA 的深度学习性能指南（其中的“matrix
# > multiplication background”一章）按 GPU 代际给出了这些规则。
#
# ## 5. 练习
#
# **5.1 选择格式。** 对每种工作负载，从 `FORMAT_CHOICES` 中选出一个：

# %%
for k, text in WORKLOADS.items():
    print(f"{k:>15}: {text}")
print("choices:", FORMAT_CHOICES)

# %%
answer = {k: ... for k in WORKLOADS}   # e.g. answer["a100-mixed"] = "bf16"
### BEGIN SOLUTION
answer = {"a100-mixed": "bf16", "a100-fp32-code": "tf32", "v100-mixed": "fp16", "fp8-forward": "e4m3fn",
          "fp8-backward": "e5m2", "master-weights": "fp32"}
### END SOLUTION
check("05.choose-format", answer)

# %% [markdown]
# **5.2 Compute an FP8 scale.** `exercise_tensor()` holds activation-like values with a few outliers. Compute the
# per-tensor E4M3 scale with a **margin of one binade** (so amax lands at 224, not 448), by hand, without
# `labkit.fp8`:

# %% [markdown] lang="zh" en="5104265098f4"
# **5.2 计算 FP8 缩放因子。** `exercise_tensor()` 中是一些类似激活值的数据，其中有少数离群值。请不借助 `labkit.fp8`，
# 手工计算逐张量的 E4M3 缩放因子，并留出**一个 binade 的余量**（使 amax 落在 224，而不是 448）：

# %%
xt = exercise_tensor()
scale = ...   # a Python float
### BEGIN SOLUTION
scale = 448.0 / xt.abs().max().item() / 2**1
### END SOLUTION
check("05.fp8-scale", scale)

# %% [markdown]
# **5.3 The delayed-scaling rule.** Write `delayed_scale(amax_history, history_len, fmt_max, margin)`: the scale that
# delayed scaling uses for the next cast, given the amaxes recorded so far (oldest first). The checker compares it
# with `fp8.DelayedScaling` on random histories.

# %% [markdown] lang="zh" en="91186c422039"
# **5.3 延迟缩放规则。** 编写 `delayed_scale(amax_history, history_len, fmt_max, margin)`：给定迄今记录的各个 amax
# （最旧的在前），返回延迟缩放在下一次转换时使用的缩放因子。检查程序会在随机生成的历史上，把它与 `fp8.DelayedScaling`
# 对比。

# %%
def delayed_scale(amax_history, history_len, fmt_max, margin):
    ...
    ### BEGIN SOLUTION
    return fmt_max / max(amax_history[-history_len:]) / 2**margin
    ### END SOLUTION

check("05.delayed-scale", delayed_scale)

# %% [markdown]
# **5.4 Debug: the round trip that lost the gradient.** This per-tensor-scaled E4M3 round trip is meant to show what
# an FP8 matmul's inputs look like after the cast. On the real gradient of the last training step it loses almost
# everything:

# %% [markdown] lang="zh" en="60c34c678a5d"
# **5.4 调试：丢掉了梯度的往返转换。** 下面这个带逐张量缩放的 E4M3 往返转换，本意是展示 FP8 矩阵乘法的输入在转换之后
# 是什么样子。但在最后一个训练步的真实梯度上，它几乎丢掉了一切：

# %%
def fp8_roundtrip(x):
    scale = 448.0 / x.abs().max()
    return (x / scale).to(torch.float8_e4m3fn).float() * scale

gr = step_grads[-1]
err = ((fp8_roundtrip(gr) - gr).norm() / gr.norm()).item()
print(f"gradient amax below 1e-4: {fp8.amax(gr) < 1e-4}; relative error of the round trip: {err:.2f}")
assert err > 0.9  # nearly every value flushed to zero

# %% [markdown]
# Write a fixed `fp8_roundtrip(x)`: scale, cast to E4M3, cast back and unscale, with ~3 % error whatever the size of
# `x`. The check runs it on fresh tensors from 1e-6 to 1e4.

# %% [markdown] lang="zh" en="6b665a1b7794"
# 写一个修正后的 `fp8_roundtrip(x)`：缩放、转换为 E4M3、再转换回来并撤销缩放，无论 `x` 的量级如何，误差都在 3 % 左右。
# 检查程序会在从 1e-6 到 1e4 的新生成张量上运行它。

# %%
def fp8_roundtrip(x):
    ...
    ### BEGIN SOLUTION
    scale = 448.0 / x.abs().max()
    return (x * scale).to(torch.float8_e4m3fn).float() / scale
    ### END SOLUTION


check("05.fp8-roundtrip", fp8_roundtrip)

# %% [markdown]
# ## Summary
#
# - **BF16 vs FP16**: the same 16 bits, split for range (bf16) or precision (fp16). Run both and compare with fp32:
#   here both tracked fp32, bf16 needed no scaler, and its gradients were ~8× noisier. Expect that noise late in
#   training, with small learning rates, in bf16 reductions, and with bf16 weights without an fp32 master copy.
# - **TF32** is a math mode for fp32 tensors: inputs rounded to 10 mantissa bits (3·10⁻⁴ relative matmul error
#   here), fp32 range and accumulation. PyTorch leaves it off for matmuls ("highest"), NGC containers turn it on;
#   `labkit.device` reads and sets it. On a CPU with AMX, "medium" silently moves fp32 matmuls to bf16.
# - **FP8** needs a scale per tensor: E4M3 (precision) for activations and weights, E5M2 (range) for gradients. Without
#   a scale, nearly all real gradients flush to zero; with one, 2-3 mantissa bits of error remain. Delayed scaling takes the
#   scale from an amax history: free, but it lags a spike by one step.
# - **Speed** comes from matrix units: with AMX-BF16 (or tensor cores) bf16 matmuls run many times faster, a tiny
#   model's step barely faster (Amdahl); without bf16 hardware bf16 is emulated and slower than fp32. Shapes in
#   multiples of 8 keep the units fed. Section 4 printed which case this machine is.
#
# Next: notebook 06 counts where the memory of a training step goes.

# %% [markdown] lang="zh" en="aa3a168fd6f7"
# ## 小结
#
# - **BF16 与 FP16**：同样的 16 位，为范围（bf16）或为精度（fp16）而划分。两者都跑一遍，再与 fp32 对比：这里两者都跟住了
#   fp32，bf16 不需要损失缩放，而它的梯度噪声约为 fp16 的 8 倍。这种噪声会出现在训练后期、学习率小的时候、bf16 归约中，
#   以及没有 fp32 主权重副本的 bf16 权重上。
# - **TF32** 是针对 fp32 张量的一种计算模式：输入舍入到 10 个尾数位（这里矩阵乘法的相对误差为 3·10⁻⁴），保留 fp32 的
#   范围，并以 fp32 累加。PyTorch 对矩阵乘法默认关闭它（"highest"），NGC 容器则把它打开；`labkit.device` 负责读取和设置。
#   在有 AMX 的 CPU 上，"medium" 会悄悄把 fp32 矩阵乘法改用 bf16 计算。
# - **FP8** 需要每个张量一个缩放因子：E4M3（精度）用于激活值和权重，E5M2（范围）用于梯度。没有缩放因子时，几乎所有
#   真实梯度都下溢为 0；有了缩放因子，剩下的是 2-3 个尾数位水平的误差。延迟缩放从 amax 历史中得到缩放因子：不需要额外
#   开销，但遇到尖峰会滞后一步。
# - **速度**来自矩阵单元：有 AMX-BF16（或张量核心）时，bf16 矩阵乘法快很多倍，而小型模型的训练步几乎不变快
#   （阿姆达尔定律）；没有 bf16 硬件时，bf16 靠软件模拟，比 fp32 还慢。让形状取 8 的倍数，才能让这些单元充分
#   运转。第 4 节已经打印出这台机器属于哪种情况。
#
# 下一步：notebook 06 将统计一个训练步的显存都花在了哪里。
