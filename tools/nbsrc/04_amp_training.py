# %% [markdown]
# # 04 · AMP training: precision policies side by side
#
# **Objectives**
# - write the three-step AMP recipe with `torch.amp` and say what each line does;
# - measure **which op runs in which dtype** under autocast on this device, and compare with CUDA autocast;
# - train the same tiny GPT under six precision policies and explain why two of them fail;
# - break a hand-written attention softmax in half precision, and fix it with an **fp32 island**;
# - clip gradients *after* unscaling, and resume a run from a checkpoint, scaler included, identically.
#
# **Prerequisites:** notebook 03 (loss scaling, `GradScaler`).
#
# **Estimated time:** 70 min

# %% [markdown] lang="zh" en="b04b91ecb0f5"
# # 04 · AMP 训练：几种精度策略的对比
#
# **学习目标**
# - 用 `torch.amp` 写出 AMP 的三步流程，并说明每一行的作用；
# - 实测本设备上的 autocast（自动精度转换）让**哪个算子以哪种数据类型运行**，并与 CUDA autocast 对比；
# - 在六种精度策略下训练同一个小型 GPT，并解释其中两种为什么失败；
# - 在半精度下让一个手写的注意力 softmax 出错，再用 **FP32 局部计算区** 修复它；
# - 在反缩放*之后*裁剪梯度，并从检查点（连同 scaler 一起）恢复训练，结果与不中断时完全一致。
#
# **前置知识：** notebook 03（损失缩放、`GradScaler`）。
#
# **预计用时：** 70 分钟

# %%
# %matplotlib inline
# %load_ext labkit
import dataclasses
import inspect
import math
import tempfile

import matplotlib.pyplot as plt
import torch

from labkit import data, device, models, plots, precision, train
from labkit.check import check, predict, reveal
from labkit.exercises.nb04 import PREDICT_OPS

torch.set_num_threads(1)  # tiny models: one thread is fastest, and fair on a shared machine
DEV = device.pick_device()
AMP = torch.float16 if device.computes(torch.float16, DEV) else torch.bfloat16
# where fp16 does not compute at all, the scaler demos run bf16 autocast with a GradScaler instead
SCALED = "fp16" if AMP == torch.float16 else dataclasses.replace(precision.get_policy("bf16"), scaler=True)

# %%
# NBVAL_IGNORE_OUTPUT
caps = device.capabilities(DEV)
print(f"device: {DEV} ({caps.device_name}); bf16 computes {caps.bf16} (fast: {caps.bf16_fast}), "
      f"fp16 computes {caps.fp16} (fast: {caps.fp16_fast})")

# %% [markdown]
# ## 1. The task and the model
#
# `labkit.data.make_token_task("reverse")` makes seeded sequences `d1 … d6 SEP a1 … a6` where the answer is the
# prompt reversed. The model reads the sequence and is scored only on the answer tokens (the prompt targets are
# `-100`, ignored by the loss). `labkit.models.TinyGPT` is a 2-layer decoder with hand-written attention.

# %% [markdown] lang="zh" en="8a9685861c56"
# ## 1. 任务与模型
#
# `labkit.data.make_token_task("reverse")` 生成固定随机种子的序列 `d1 … d6 SEP a1 … a6`，其中答案是
# 倒序排列的提示部分。模型读入整个序列，但只在答案 token 上计分（提示部分的目标值为 `-100`，损失函数会忽略
# 它们）。`labkit.models.TinyGPT` 是一个 2 层的解码器，注意力是手写的。

# %%
task = data.make_token_task("reverse", n=4096, n_digits=6, vocab_size=12, seed=0)
batches = data.Batches(task.inputs, task.targets, batch_size=16, seed=0)  # batches(step) -> (x, y)
print("input :", task.inputs[0].tolist())
print("target:", task.targets[0].tolist())
make_model = lambda: models.TinyGPT(vocab_size=task.vocab_size, seq_len=task.seq_len, seed=0)
print(f"TinyGPT: {models.count_parameters(make_model()):,} parameters")

# %% [markdown]
# ## 2. The AMP recipe in three steps
#
# 1. **A scaler**, created once: `torch.amp.GradScaler(device_type)` (FP16 only; BF16 needs none).
# 2. **Autocast** around the forward pass *and the loss*: ops on its low-precision list (matmuls) run in FP16,
#    ops on its FP32 list (losses, on CUDA also softmax & co) run in FP32, and all others follow their inputs'
#    dtype. The weights stay FP32: autocast casts copies on the fly.
# 3. **Scaled backward, then step through the scaler**: `scaler.scale(loss).backward()` multiplies the loss by
#    `S` so small gradients survive FP16; `scaler.unscale_(opt)` divides them by `S` again (clipping, if any,
#    comes after it); `scaler.step(opt)` skips the step on inf/NaN, and `scaler.update()` adapts `S`.
#
# Step 3 is written once in labkit, as `labkit.precision.backward` and `labkit.precision.update`; every training
# loop in the workbook (this notebook's `train.train`, notebook 09's DDP loop, the benchmarks) calls these two:

# %% [markdown] lang="zh" en="45b4787848ed"
# ## 2. AMP 的三步流程
#
# 1. **一个 scaler**，只创建一次：`torch.amp.GradScaler(device_type)`（只有 FP16 需要；BF16 不需要）。
# 2. 用 **autocast** 包住前向传播*以及损失计算*：autocast 低精度列表上的算子（矩阵乘法）以 FP16 运行，
#    FP32 列表上的算子（损失函数；在 CUDA 上还有 softmax 等）以 FP32 运行，其余算子跟随输入的数据类型。
#    权重保持 FP32：autocast 在运行时临时转换出副本。
# 3. **缩放后反向传播，再经由 scaler 执行优化器更新**：`scaler.scale(loss).backward()` 把损失乘以 `S`，
#    让小梯度在 FP16 中得以保留；`scaler.unscale_(opt)` 再把梯度除以 `S`（如果要做梯度裁剪，放在它之后）；
#    `scaler.step(opt)` 在出现 inf/NaN 时跳过这一步，`scaler.update()` 则调整 `S`。
#
# 第 3 步在 labkit 中只写了一次，即 `labkit.precision.backward` 和 `labkit.precision.update`；本练习册中的
# 每个训练循环（本 notebook 的 `train.train`、notebook 09 的 DDP 循环、各个基准测试）都调用这两个函数：

# %%
print(inspect.getsource(precision.backward))
print(inspect.getsource(precision.update))

# %% [markdown]
# The three steps, on a tiny GPT:

# %% [markdown] lang="zh" en="de0b2f9ee646"
# 在一个小型 GPT 上运行这三步：

# %%
model = make_model().to(DEV)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
scaler = torch.amp.GradScaler(DEV.type)                          # (1) once
for step in range(3):
    x, y = (t.to(DEV) for t in batches(step))
    opt.zero_grad()
    with torch.autocast(device_type=DEV.type, dtype=AMP):        # (2) forward + loss
        logits = model(x)
        loss = models.lm_loss(logits, y)
    precision.backward(loss, scaler)                             # (3) scaled backward,
    precision.update(opt, scaler)                                #     unscale, (maybe) step, adapt the scale

# %%
w = model.blocks[0].mlp[0].weight
print("logits:", logits.dtype, "| loss:", loss.dtype, "| weights:", w.dtype, "| grads:", w.grad.dtype)
print("scale:", scaler.get_scale())
assert logits.dtype == AMP and loss.dtype == torch.float32 and w.dtype == w.grad.dtype == torch.float32

# %% [markdown]
# The logits come out of a matmul, so they are in the autocast dtype (FP16 here); `cross_entropy` is on autocast's FP32 list, so the loss is
# FP32. The weights and their gradients are FP32: the FP32 "master" copy is the model itself.
#
# > **Common misconception** (seed 000 §4.1): a batch and model inputs created *outside* the autocast block stay
# > FP32, so they miss the benefit of half precision.
# >
# > **Why it is wrong:** autocast does not care where a tensor was made. It decides per operation, when the
# > operation runs inside the block: a matmul there casts its FP32 inputs to FP16/BF16 on the fly, whatever their
# > origin.
# >
# > **What is true:** the batch above was made outside the block, on the line before `torch.autocast`, and so were
# > the FP32 weights; the logits still came out in half precision (asserted above). What must be inside is the
# > forward pass and the loss.
#
# > **Common misconception** (seed 000 §4.1, seed 002 §2.1): AMP is written with `torch.cuda`'s own `amp` module
# > (its `autocast()` and `GradScaler()`), as both articles' code does.
# >
# > **Why it is wrong:** that module is deprecated in current PyTorch (it warns and points to `torch.amp`), and it
# > knows only CUDA, so the same script cannot run on a CPU or another accelerator.
# >
# > **What is true:** `torch.amp.autocast(device_type=..., dtype=...)` and `torch.amp.GradScaler(device)` do the
# > same on every device, with the same arguments; PyTorch's AMP documentation records the deprecation, and the
# > workbook's tests reject the old spelling anywhere in the repository.
#
# ## 3. Which op runs in which dtype?
#
# Autocast keeps op lists: ops that *can* run in low precision (matmuls, convolutions), ops that must run in
# FP32 (reductions, `exp`, norms, losses), and the rest, which follow their inputs. The lists differ by device,
# so we **measure** them here: each op gets the input it would get in a network (matmuls get FP32 tensors;
# everything else gets the output of a matmul, i.e. a low-precision tensor), and we read the output dtype.
#
# **Predict, then run.** Before you look at the table: on this device (the setup cell printed which one), which of
# `PREDICT_OPS` come out of autocast in low precision (`"low"`) and which in `"fp32"`?

# %% [markdown] lang="zh" en="cbbd88e90d16"
# logits 是矩阵乘法的输出，所以是 autocast 的数据类型（这里是 FP16）；`cross_entropy` 在 autocast 的 FP32 列表上，所以损失是 FP32。
# 权重及其梯度是 FP32：FP32 的“主”副本（主权重）就是模型本身。
#
# > **常见误解**（seed 000 §4.1）：在 autocast 块*之外*创建的批次数据和模型输入会保持 FP32，因此享受不到
# > 半精度的好处。
# >
# > **错在哪里：** autocast 并不在乎张量是在哪里创建的。它在算子于块内运行的那一刻逐个算子地做决定：块内的
# > 矩阵乘法会把 FP32 输入临时转换为 FP16/BF16，不管这些输入从何而来。
# >
# > **实际情况：** 上面的批次数据就是在块外、`torch.autocast` 的前一行创建的，FP32 权重也是在块外创建的；
# > logits 仍然以半精度输出（上面的断言已验证这一点）。必须放在块内的是前向传播和损失计算。
#
# > **常见误解**（seed 000 §4.1，seed 002 §2.1）：AMP 要用 `torch.cuda` 自己的 `amp` 模块来写（即它的
# > `autocast()` 和 `GradScaler()`），两篇文章的代码都是这样写的。
# >
# > **错在哪里：** 这个模块在当前的 PyTorch 中已被弃用（调用时会发出警告，并指向 `torch.amp`），而且它只认
# > CUDA，同一个脚本无法在 CPU 或其他加速器上运行。
# >
# > **实际情况：** `torch.amp.autocast(device_type=..., dtype=...)` 和 `torch.amp.GradScaler(device)` 在所有
# > 设备上作用相同，参数也相同；PyTorch 的 AMP 文档记载了这次弃用，而本练习册的测试会拒绝仓库中任何地方出现的
# > 旧写法。
#
# ## 3. 哪个算子以哪种数据类型运行？
#
# autocast 维护着几张算子列表：*可以*以低精度运行的算子（矩阵乘法、卷积），必须以 FP32 运行的算子（归约、
# `exp`、归一化、损失函数），以及其余跟随输入类型的算子。这些列表因设备而异，所以我们在这里**实测**：给每个
# 算子它在网络中会得到的那种输入（矩阵乘法得到 FP32 张量；其余算子得到矩阵乘法的输出，即低精度张量），
# 然后读出输出的数据类型。
#
# **先预测，再运行。** 在看表之前先想一想：在本设备上（开头的设置单元格打印了是哪种设备），`PREDICT_OPS`
# 中哪些算子经 autocast 后输出低精度（`"low"`），哪些输出 `"fp32"`？

# %%
print(PREDICT_OPS)
prediction = {op: ... for op in PREDICT_OPS}   # e.g. prediction["linear"] = "low"
### BEGIN SOLUTION
prediction = {"linear": "low", "softmax": "low", "layer_norm": "low", "exp": "low", "cross_entropy": "fp32"}
### END SOLUTION
predict("04.autocast-dtypes", prediction)

# %%
short = precision.dtype_name   # torch.bfloat16 -> "bf16"
low = [dt for dt in (torch.bfloat16, torch.float16) if device.computes(dt, DEV)]
measured = {short(dt): train.autocast_op_dtypes(DEV, dt) for dt in low}
ref = {"low": "low", "fp32": "fp32", "input": "= input"}
print(f"{'op':<14}" + "".join(f"{DEV.type + ' ' + k:>12}" for k in measured) + f"{'CUDA (ref.)':>14}")
for op in train.AUTOCAST_OPS:
    cells = "".join(f"{short(i) + '->' + short(o):>12}" for i, o in (m[op] for m in measured.values()))
    print(f"{op:<14}{cells}{ref[train.CUDA_AUTOCAST_REFERENCE[op]]:>14}")

# %% tags=["workspace-clear"]
reveal("04.autocast-dtypes", {op: "fp32" if measured[short(AMP)][op][1] == torch.float32 else "low" for op in PREDICT_OPS})
if device.is_cuda(DEV):  # measured on this GPU: it must agree with PyTorch's documented CUDA lists
    for op, kind in train.CUDA_AUTOCAST_REFERENCE.items():
        out = measured[short(AMP)][op][1]
        assert out == (torch.float32 if kind == "fp32" else AMP), op
    print("CUDA column: measured on this GPU, and it matches the reference lists")
else:
    print("CUDA column: reference data (PyTorch AMP docs, 'CUDA Ops that can autocast to float32'), "
          "not measured: no GPU here")
    some = measured[short(AMP)]
    assert some["softmax"][1] == AMP and some["layer_norm"][1] == AMP      # CPU autocast: stays low
    assert some["cross_entropy"][1] == torch.float32                        # ...but losses go FP32

# %% [markdown]
# On **CUDA**, `softmax`, `log_softmax`, `layer_norm`, `exp`, `sum`, `pow` and the losses are upcast to FP32
# whatever their input. On this **CPU** (torch 2.13) only the losses are: softmax and layer_norm run in
# BF16/FP16. So "autocast protects my softmax" is true on a GPU and false here. A softmax you write yourself
# (section 5) gets only what its ops get one by one (on CUDA, `exp` and `sum` in FP32; here nothing), and a custom
# kernel gets nothing anywhere. Never assume a table: measure it on the device you train on.
#
# > **Common misconception** (seed 002 §2.2): operations such as softmax and layer normalisation still need FP32,
# > and "modern frameworks handle these exceptions automatically".
# >
# > **Why it is wrong:** that holds for CUDA autocast only. The table above was measured: CPU autocast in torch 2.13
# > runs softmax and layer_norm in BF16/FP16, so it does not protect a softmax you write yourself (section 5) either,
# > and no autocast, on any device, protects a model converted with `.half()` or a custom kernel.
# >
# > **What is true:** measure the op table on the device you train on (the cell above asserts the CPU's), and write
# > fragile ops as FP32 islands.
#
# > **Common misconception** (seed 000 §4.1): a custom LayerNorm or softmax that has no FP16 kernel registered is
# > "forced back to FP32" under autocast: safe, only slower.
# >
# > **Why it is wrong:** autocast never looks at whether a kernel is registered. It recasts, op by op, only the torch
# > ops on its lists. A custom op as a whole is on none of them: a Python function or an `autograd.Function` receives
# > whatever dtype the previous op produced (BF16 or FP16 after a matmul), and each torch op inside it then gets its
# > own treatment: upcast if it is on the device's FP32 list (on CUDA `exp`, `rsqrt`, `softmax`, `layer_norm`; on the
# > CPU mainly losses and linear algebra), otherwise computed in the dtype it receives. A custom kernel (C++/CUDA
# > extension, Triton) gets no help at all. And an op with no kernel for that dtype does not fall back to FP32: it
# > raises an error.
# >
# > **What is true:** FP32 for a custom op is opt-in. Decorate the `forward` of an `autograd.Function` with
# > `torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32)` (and its `backward` with
# > `torch.amp.custom_bwd(device_type=...)`), or write an FP32 island (section 5). The cells below run both kinds of
# > custom op under BF16 autocast on the CPU, then, still under autocast, an op on CPU autocast's FP32 list
# > (`linalg.inv`, upcast) and one on no list that has no BF16 kernel (`linalg.det`, an error).

# %% [markdown] lang="zh" en="16910a58cdb5"
# 在 **CUDA** 上，`softmax`、`log_softmax`、`layer_norm`、`exp`、`sum`、`pow` 以及各种损失函数，不论输入
# 是什么类型，都会被提升到 FP32。在本 **CPU** 上（torch 2.13），只有损失函数会：softmax 和 layer_norm
# 以 BF16/FP16 运行。所以“autocast 会保护我的 softmax”这句话在 GPU 上成立，在这里却不成立。你自己写的
# softmax（第 5 节）只能得到其中各个算子分别得到的待遇（在 CUDA 上，`exp` 和 `sum` 以 FP32 计算；在这里
# 什么都没有），而自定义内核在哪里都得不到任何保护。永远不要想当然地套用一张表：在你训练所用的设备上实测。
#
# > **常见误解**（seed 002 §2.2）：softmax 和层归一化这类运算仍然需要 FP32，而“现代框架会自动处理这些
# > 例外”。
# >
# > **错在哪里：** 这只对 CUDA autocast 成立。上面的表是实测的：torch 2.13 的 CPU autocast 以 BF16/FP16
# > 运行 softmax 和 layer_norm，因此它也保护不了你自己写的 softmax（第 5 节）；而且在任何设备上，autocast
# > 都保护不了用 `.half()` 转换过的模型或自定义内核。
# >
# > **实际情况：** 在你训练所用的设备上实测算子表（上面的单元格对 CPU 上的结果做了断言），并把数值敏感的
# > 算子写成 FP32 局部计算区。
#
# > **常见误解**（seed 000 §4.1）：没有注册 FP16 内核的自定义 LayerNorm 或 softmax，在 autocast 下会被
# > “强制退回 FP32”：安全，只是慢一些。
# >
# > **错在哪里：** autocast 从不检查某个内核是否已注册。它只对自己列表上的 torch 算子逐个重新转换类型。
# > 一个自定义算子作为整体不在任何列表上：Python 函数或 `autograd.Function` 接收的是上一个算子产生的数据
# > 类型（矩阵乘法之后就是 BF16 或 FP16），它内部的每个 torch 算子再各自接受处理：在该设备的 FP32 列表上
# > 就提升为 FP32（CUDA 上有 `exp`、`rsqrt`、`softmax`、`layer_norm`；CPU 上主要是损失函数和线性代数
# > 运算），否则就以收到的数据类型计算。自定义内核（C++/CUDA 扩展、Triton）则得不到任何帮助。而且，一个
# > 没有该数据类型内核的算子并不会退回 FP32，而是直接报错。
# >
# > **实际情况：** 自定义算子要以 FP32 计算，必须由你显式启用。给 `autograd.Function` 的 `forward` 加上装饰器
# > `torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32)`（并给它的 `backward` 加上
# > `torch.amp.custom_bwd(device_type=...)`），或者写一个 FP32 局部计算区（第 5 节）。下面的单元格在 CPU
# > 的 BF16 autocast 下运行这两种自定义算子；然后仍在 autocast 下，运行一个位于 CPU autocast FP32 列表上的
# > 算子（`linalg.inv`，被提升为 FP32），以及一个不在任何列表上、又没有 BF16 内核的算子（`linalg.det`，报错）。

# %%
seen = {}
def my_norm(x):                                     # a custom op: plain Python
    seen["plain function"] = x.dtype
    return (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)

class MyNorm32(torch.autograd.Function):            # the same op, opting in to FP32
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, x):
        seen["custom_fwd(cast_inputs=float32)"] = x.dtype
        return (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)

# %%
with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
    h = torch.nn.functional.linear(torch.randn(4, 16), torch.randn(16, 16))   # on autocast's list: BF16
    plain, opted = my_norm(h), MyNorm32.apply(h)
print({k: short(v) for k, v in seen.items()}, "| outputs:", short(plain.dtype), short(opted.dtype))
assert h.dtype == plain.dtype == torch.bfloat16 and opted.dtype == torch.float32
assert seen["plain function"] == torch.bfloat16 and seen["custom_fwd(cast_inputs=float32)"] == torch.float32

# %%
with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
    listed = torch.linalg.inv(torch.eye(4, dtype=torch.bfloat16))   # on CPU autocast's FP32 list: upcast
    try:
        torch.linalg.det(torch.eye(4, dtype=torch.bfloat16)); no_kernel = None   # on no list, no BF16 kernel
    except RuntimeError as err:
        no_kernel = str(err)
print("under autocast: linalg.inv ->", short(listed.dtype), "| linalg.det:", no_kernel)
assert listed.dtype == torch.float32 and no_kernel is not None   # an error, not a silent FP32 fallback

# %% [markdown]
# ## 4. Six precision policies, one model
#
# `labkit.train.train(model, batches, policy=...)` runs the same loop under a policy. The policies live in one
# table, `labkit.precision.POLICIES`, with one meaning per name; notebook 06 counts the bytes of exactly these:
#
# | policy | compute | weights / optimizer state | loss scaling |
# |---|---|---|---|
# | `fp32` | FP32 | FP32 | none |
# | `fp16` | FP16 autocast | FP32 | `GradScaler` |
# | `fp16-noscale` | FP16 autocast | FP32 | none |
# | `bf16` | BF16 autocast | FP32 | none |
# | `fp16-pure` / `bf16-pure` | FP16 / BF16 | FP16 / BF16, no FP32 master | none |
#
# (The table has three more, `bf16-master` and its two variants: 16-bit weights with an FP32 master copy inside
# the optimizer, as DeepSpeed does it. Notebooks 06 and 10 use them.)
#
# **A realistic gradient size.** A real LLM step averages its loss over ~10^5–10^6 tokens, so each logit's
# gradient is ~1/tokens. Our batch has 96 scored tokens (16 sequences × 6 answer digits). `loss_weight=2**-12`
# multiplies the loss by 1/4096, giving every gradient the size it would have in a batch of ~390 K tokens. (The
# batch is small so that the six runs stay quick on CPUs that emulate half precision.) That is exactly the regime where
# FP16 needs a loss scale (and a power of two changes no mantissa bit).

# %% [markdown] lang="zh" en="11dc0a879d64"
# ## 4. 六种精度策略，同一个模型
#
# `labkit.train.train(model, batches, policy=...)` 在给定的策略下运行同一个训练循环。这些策略都收在一张表
# 里，即 `labkit.precision.POLICIES`，每个名称只有一种含义；notebook 06 统计的正是这些策略的字节数：
#
# | 策略 | 计算 | 权重 / 优化器状态 | 损失缩放 |
# |---|---|---|---|
# | `fp32` | FP32 | FP32 | 无 |
# | `fp16` | FP16 autocast | FP32 | `GradScaler` |
# | `fp16-noscale` | FP16 autocast | FP32 | 无 |
# | `bf16` | BF16 autocast | FP32 | 无 |
# | `fp16-pure` / `bf16-pure` | FP16 / BF16 | FP16 / BF16，没有 FP32 主权重 | 无 |
#
# （`POLICIES` 中还有另外三个策略：`bf16-master` 及其两个变体，即 16 位权重加上优化器内部的一份 FP32
# 主权重，也就是 DeepSpeed 的做法。notebook 06 和 10 会用到它们。）
#
# **贴近实际的梯度大小。** 真实的 LLM 训练中，一步的损失是在约 10^5–10^6 个 token 上求平均的，所以每个
# logit 的梯度约为 1/token 数。我们的批次只有 96 个计分 token（16 个序列 × 6 个答案数字）。`loss_weight=2**-12`
# 把损失乘以 1/4096，让每个梯度都具有在约 390 K 个 token 的批次中应有的大小。（批次取得小，是为了让六次
# 训练在用软件模拟半精度的 CPU 上也能很快跑完。）这正是 FP16 需要损失缩放因子的情形（而且乘以 2 的幂
# 不会改变任何一个尾数位）。

# %%
# NBVAL_IGNORE_OUTPUT
W = 2.0**-12
names = [p for p in train.POLICIES if device.computes(train.get_policy(p).compute_dtype, DEV)]
runs = {p: train.train(make_model(), batches, policy=p, steps=60, lr=3e-3, loss_weight=W, device=DEV, desc=p)
        for p in names}  # a tqdm bar per run while it trains

# %%
ax = plots.loss_curves({p: r.loss for p, r in runs.items()}, styles={"fp16": "--", "bf16": ":"},
                       title="Tiny GPT, reverse task: one model, six precision policies")
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
base = runs["fp32"].median_step_time()
print(f"{'policy':<13} {'final loss':>10} {'skipped':>8} {'time/step vs fp32':>18} {'memory MB':>10}")
for p, r in runs.items():
    mem = f"{r.peak_memory / 2**20:.2f}" if r.peak_memory is not None else "n/a"
    print(f"{p:<13} {r.final_loss():>10.4f} {r.n_skipped:>8} {r.median_step_time() / base:>18.2f} {mem:>10}")
print("memory:", runs["fp32"].memory_source)
half = [r.median_step_time() / base for p, r in runs.items() if p != "fp32"]
verdict = "slower than" if min(half) > 1 else "faster than" if max(half) < 1 else "some faster, some slower than"
print(f"Here the half-precision steps took {min(half):.1f}x to {max(half):.1f}x the fp32 step time: {verdict} fp32.")

# %% [markdown]
# Final losses and times depend on this machine's kernels, so that table is not checked; the verdicts below are.
# Time ratios on a CPU say little about a GPU: with one thread and tiny matrices, the casts and half-precision
# kernels can cost more than they save (the line under the table gives the verdict; notebook 05 measures when BF16
# wins on a CPU). On the CPU, "memory" is a count of tensor bytes (weights,
# gradients, optimizer state, and the activations autograd saved), not an allocator peak; on a GPU it is
# `torch.cuda.max_memory_allocated`.

# %% [markdown] lang="zh" en="e704f14313d2"
# 最终损失和耗时取决于这台机器的内核，所以上面那张表不做检查；下面的结论则会检查。CPU 上的耗时比例对 GPU
# 几乎没有参考价值：在单线程、小矩阵的情况下，类型转换和半精度内核的开销可能超过它们节省的时间（表下方的
# 那一行给出了结论；notebook 05 会测量 BF16 在 CPU 上何时更快）。在 CPU 上，“memory”一列统计的是张量的
# 字节数（权重、梯度、优化器状态，以及 autograd 保存的激活值），而不是分配器的峰值；在 GPU 上它是
# `torch.cuda.max_memory_allocated`。

# %%
final = {p: r.final_loss() for p, r in runs.items()}
verdict = lambda v: "diverged (NaN)" if math.isnan(v) else ("learned" if v < 0.1 else "stuck")
for p, v in final.items():
    print(f"{p:<13} {verdict(v)}")
good = [final[p] for p in ("fp32", "fp16", "bf16") if p in final]
assert max(good) < 0.1                                          # the three AMP-safe policies learn it
if "fp16-noscale" in final:
    assert final["fp16-noscale"] > 1.0 > max(good)              # no scale: stuck near ln(11) = 2.4
    assert not final["fp16-pure"] < 1.0                         # pure fp16: NaN (or stuck)
assert runs["bf16-pure"].peak_memory < runs["fp32"].peak_memory  # half the bytes per weight
if not device.is_cuda(DEV):  # tensor bytes: autocast also halves the saved activations
    assert runs["bf16-pure"].peak_memory < runs["bf16"].peak_memory < runs["fp32"].peak_memory

# %% [markdown]
# **Why `fp16-noscale` is stuck.** With gradients of realistic size, the gradients flowing back through the FP16
# matmuls fall below FP16's smallest subnormal (6e-8) and become exactly zero. Most weights get no gradient;
# the model learns only what the last layer can (roughly the digit frequencies: loss ≈ ln 11). The same run
# with a `GradScaler` (`fp16`) keeps them, and `bf16`, with FP32's exponent range, never loses them.

# %% [markdown] lang="zh" en="0261122b1f34"
# **`fp16-noscale` 为什么停滞不前。** 在贴近实际的梯度大小下，经 FP16 矩阵乘法反向传回的梯度会低于 FP16
# 最小的次正规数（6e-8），变成精确的 0。大多数权重得不到梯度；模型只能学到最后一层能学到的东西（大致是
# 各个数字的出现频率：损失 ≈ ln 11）。同样的训练加上 `GradScaler`（即 `fp16`）就能保住这些梯度，而 `bf16`
# 拥有 FP32 的指数范围，根本不会丢失它们。

# %%
def zero_grad_fraction(r):
    g = torch.cat([p.grad.flatten() for p in r.model.parameters() if p.grad is not None])
    return (g == 0).float().mean().item()

if "fp16-noscale" in runs:
    z = {p: zero_grad_fraction(runs[p]) for p in ("fp16", "fp16-noscale")}
    print("gradients exactly zero in the last step: more than half with fp16-noscale:", z["fp16-noscale"] > 0.5,
          "| more than half with fp16:", z["fp16"] > 0.5)
    assert z["fp16-noscale"] > 0.5 > z["fp16"]  # the exact fractions differ between CPUs' fp16 kernels

# %% [markdown]
# **Why `fp16-pure` diverges.** Without an FP32 master copy the optimizer state is FP16 too. Adam divides by
# `sqrt(v) + eps` where `v` averages `g²`: with `g ~ 1e-5`, `g² = 1e-10` underflows to 0, and `eps = 1e-8`
# is itself 0 in FP16. The update becomes `m / 0 = inf`, and the weights turn to NaN after one step.

# %% [markdown] lang="zh" en="ae1bee3c1605"
# **`fp16-pure` 为什么发散。** 没有 FP32 主权重，优化器状态也是 FP16。Adam 要除以 `sqrt(v) + eps`，其中
# `v` 是 `g²` 的平均值：当 `g ~ 1e-5` 时，`g² = 1e-10` 下溢为 0，而 `eps = 1e-8` 在 FP16 中本身就是 0。
# 更新量变成 `m / 0 = inf`，一步之后权重就变成了 NaN。

# %%
g = torch.tensor(1e-5, dtype=torch.float16)
print("g*g in fp16:", (g * g).item(), "| eps=1e-8 in fp16:", torch.tensor(1e-8, dtype=torch.float16).item())
if "fp16-pure" in runs:
    first_bad = next(i for i, v in enumerate(runs["fp16-pure"].loss) if not math.isfinite(v))
    print("fp16-pure: first non-finite loss at step", first_bad)
    assert first_bad <= 5

# %% [markdown]
# **Lost updates in `bf16-pure`.** BF16 has FP32's range, so nothing overflows or underflows, but only 8
# significant bits: the spacing between BF16 numbers just above 1.0 is 2^-7 ≈ 0.0078. Adam's steps are about
# `lr = 0.003`, less than half of that, so a weight at 1.0 (every LayerNorm gain starts there) that should grow
# rounds back to 1.0: the update is **lost**. Just *below* 1.0 the spacing is half as large (2^-8 ≈ 0.0039), so
# a step down survives, rounded to 0.99609375. An FP32 master copy accumulates the small steps either way.

# %% [markdown] lang="zh" en="725fffddbad7"
# **`bf16-pure` 中丢失的更新。** BF16 拥有 FP32 的范围，所以既不会上溢也不会下溢，但只有 8 位有效位：
# 紧挨在 1.0 之上的 BF16 数，间距是 2^-7 ≈ 0.0078。Adam 每一步的步长约为 `lr = 0.003`，不到这个间距的
# 一半，所以一个值为 1.0、本该增大的权重（每个 LayerNorm 的增益都从 1.0 开始）会被舍入回 1.0：这次更新
# **丢失**了。而在 1.0 *之下*，间距只有一半（2^-8 ≈ 0.0039），所以向下的一步能保留下来，舍入为
# 0.99609375。有了 FP32 主权重，这些小步长无论朝哪个方向都能累积起来。

# %%
def frac_ln_gains_at_one(r):
    gains = [p for n, p in r.model.named_parameters() if ".ln" in n and n.endswith("weight")]
    return torch.cat([(p == 1).flatten() for p in gains]).float().mean().item()

one = torch.tensor(1.0, dtype=torch.bfloat16)
print("1.0 + 0.003 in bf16 =", (one + 0.003).item(), "| 1.0 - 0.003 in bf16 =", (one - 0.003).item())
assert (one + 0.003).item() == 1.0 and (one - 0.003).item() == 0.99609375
lost = {p: frac_ln_gains_at_one(runs[p]) for p in ("fp32", "bf16-pure")}
print(f"LayerNorm gains never updated (still exactly 1.0) after 60 steps: fp32 {lost['fp32']:.0%}, "
      f"bf16-pure {'more' if lost['bf16-pure'] > 0.3 else 'less'} than 30%")
assert lost["fp32"] == 0 and lost["bf16-pure"] > 0.3

# %% [markdown]
# ## 5. A hand-written softmax in half precision, and the fp32 island
#
# Custom attention code often writes the softmax out: `exp(s) / sum(exp(s))`. In FP16, `exp(s)` overflows to
# `inf` as soon as `s > 11.09` (e^11.09 ≈ 65504), and `inf / inf = NaN`. `labkit.models.softmax` has the
# variants: `naive`, `stable` (subtract the row max first), and `fp32` (an **fp32 island**: autocast off,
# upcast, stable softmax, cast back).

# %% [markdown] lang="zh" en="0775f4cc6b36"
# ## 5. 半精度下手写的 softmax，以及 FP32 局部计算区
#
# 自定义的注意力代码常常把 softmax 直接写出来：`exp(s) / sum(exp(s))`。在 FP16 中，只要 `s > 11.09`
# （e^11.09 ≈ 65504），`exp(s)` 就会上溢为 `inf`，而 `inf / inf = NaN`。`labkit.models.softmax` 提供了
# 几种变体：`naive`（朴素公式）、`stable`（先减去行最大值）和 `fp32`（一个 **FP32 局部计算区**：关闭
# autocast，提升为 FP32，计算稳定的 softmax，再转换回原来的类型）。

# %%
s = torch.tensor([[12.0, 1.0, 0.0]], dtype=torch.float16)
for impl in ("naive", "stable", "fp32"):
    out = models.softmax(s, impl)
    print(f"{impl:<7}", [float(f"{v:.3g}") for v in out.float().flatten().tolist()], out.dtype)

# %% [markdown]
# > **Common misconception** (seed 000 §5.3): a custom attention's FP16 softmax made the loss explode because FP16 is
# > not precise enough: the small errors of `exp` were amplified, so the softmax has to be computed in FP32.
# >
# > **Why it is wrong:** a softmax that works for thousands of steps and then blows up as the scores sharpen fails by
# > range, not precision. `exp(s)` is larger than FP16's largest value, 65504, as soon as `s > 11.09`: the result is
# > inf, and `inf / inf` is NaN. The scores themselves, `q @ k.T`, can also pass 65504 in FP16, which the article's
# > fix avoids by computing that matmul in FP32 as well. FP32 does not remove the failure of the naive formula, it
# > moves it: FP32's `exp` overflows above 88.7.
# >
# > **What is true:** subtract the row maximum before `exp` (the "stable" softmax, which `torch.softmax` uses). Every
# > exponent is then at most 0, nothing overflows in any format, and the FP16 result is within FP16's rounding of the
# > FP32 one. The cell below shows `exp(12)` overflowing FP16, the stable softmax written out in FP16, and the naive
# > formula failing in FP32 once the scores pass 88.7. An FP32 island (the `fp32` variant) is still worth having for
# > accuracy, on top of the max subtraction.

# %% [markdown] lang="zh" en="66ffefbefaec"
# > **常见误解**（seed 000 §5.3）：某个自定义注意力的 FP16 softmax 让损失爆炸，是因为 FP16 的精度不够：
# > `exp` 的微小误差被放大了，所以 softmax 必须用 FP32 计算。
# >
# > **错在哪里：** 一个 softmax 正常运行了几千步，随着注意力分数变得越来越尖锐才突然崩溃，这是范围问题，
# > 而不是精度问题。只要 `s > 11.09`，`exp(s)` 就超过 FP16 的最大值 65504：结果是 inf，而 `inf / inf`
# > 是 NaN。分数本身，即 `q @ k.T`，在 FP16 中也可能超过 65504；文章的修复办法把这个矩阵乘法也放到 FP32
# > 中计算，因而避开了这一点。FP32 并没有消除朴素公式的失败，只是把门槛挪高了：FP32 的 `exp` 在 88.7 以上
# > 同样会上溢。
# >
# > **实际情况：** 在 `exp` 之前减去行最大值（即“稳定”的 softmax，`torch.softmax` 就是这样做的）。这样每个
# > 指数都不大于 0，在任何格式中都不会上溢，FP16 的结果与 FP32 的结果只相差 FP16 的舍入误差。下面的单元格
# > 展示了 `exp(12)` 在 FP16 中上溢、用 FP16 写出的稳定 softmax，以及分数超过 88.7 后朴素公式在 FP32 中
# > 同样失败。在减去最大值之外，FP32 局部计算区（`fp32` 变体）仍然值得保留，因为它算得更准。

# %%
e = torch.exp(s - s.amax(dim=-1, keepdim=True))    # the stable softmax in FP16: every exponent <= 0
stable = e / e.sum(dim=-1, keepdim=True)
print("exp(12) in fp16:", torch.exp(s[0, 0]).item(), "| stable, in fp16:",
      [float(f"{v:.3g}") for v in stable.flatten().tolist()])
assert math.isinf(torch.exp(s[0, 0]).item()) and stable.dtype == torch.float16 and torch.isfinite(stable).all()
assert torch.allclose(stable.float(), torch.softmax(s.float(), dim=-1), atol=1e-3)
assert torch.isnan(models.softmax(s.float() + 80, "naive")).any()   # FP32 overflows too, from 88.7 up

# %% [markdown]
# Does that happen in a real model? After training, attention scores are much sharper than at initialisation.
# We take the FP32-trained model, copy it in FP16, and run the naive softmax, then the fp32 island. (A pure FP16
# copy fails on every device; under CUDA *autocast* `exp` and `sum` would be upcast for you, but a fused or
# custom kernel gets no such help.)

# %% [markdown] lang="zh" en="772013350d57"
# 这在真实模型中会发生吗？训练之后，注意力分数比初始化时尖锐得多。我们取用 FP32 训练好的模型，复制出一份
# FP16 版本，先运行朴素 softmax，再运行 FP32 局部计算区。（纯 FP16 副本在任何设备上都会失败；在 CUDA
# *autocast* 下，`exp` 和 `sum` 会自动提升到 FP32，但融合内核或自定义内核得不到这种帮助。）

# %%
trained = runs["fp32"].model
x, y = (t.to(DEV) for t in batches(10_000))
with torch.no_grad():
    trained(x)
    top = max(a.last_scores_absmax for a in trained.attentions)
    print("largest |attention score| above 11.09, where exp overflows fp16:", top > 11.09)
    assert top > 11.09
    half = make_model().to(DEV)
    half.load_state_dict(trained.state_dict())
    half = half.half()

# %%
with torch.no_grad():
    for impl in ("naive", "fp32"):
        half.set_softmax(impl)
        out = half(x)
        print(f"{impl:<6} NaN logits {torch.isnan(out).float().mean().item():.0%}, "
              f"answer accuracy {task.answer_accuracy(out.float(), y):.0%}")
assert torch.isfinite(out).all() and task.answer_accuracy(out.float(), y) > 0.95

# %% [markdown]
# The fix costs two casts on a small tensor and nothing else: keep the matmuls in half precision, and compute
# the one numerically fragile op in FP32. That is exactly what CUDA autocast's FP32 list does for built-in ops.
#
# ## 6. Gradient clipping goes *after* `unscale_`
#
# After `scaler.scale(loss).backward()` the gradients are multiplied by `S`. Clipping them then would compare
# `S × ‖g‖` with `max_norm`: with `S = 65536` the clip always fires and shrinks the true gradient by a huge
# factor. `scaler.unscale_(opt)` divides by `S` in place (and `scaler.step` knows not to do it twice).

# %% [markdown] lang="zh" en="18074efa6216"
# 修复的代价只是对一个小张量做两次类型转换，别无其他：矩阵乘法仍以半精度运行，只有那个数值敏感的算子用
# FP32 计算。CUDA autocast 的 FP32 列表对内置算子做的正是这件事。
#
# ## 6. 梯度裁剪要放在 `unscale_` *之后*
#
# `scaler.scale(loss).backward()` 之后，梯度都乘上了 `S`。此时裁剪，比较的就是 `S × ‖g‖` 与 `max_norm`：
# 当 `S = 65536` 时，裁剪每次都会触发，把真实梯度缩小一个巨大的倍数。`scaler.unscale_(opt)` 原地除以 `S`
# （而且 `scaler.step` 知道不要再除一次）。

# %%
m = make_model().to(DEV)
ref = make_model().to(DEV)                         # the same weights: an unscaled backward, for comparison
opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
scaler = torch.amp.GradScaler(DEV.type)
x, y = (t.to(DEV) for t in batches(0))
with torch.autocast(device_type=DEV.type, dtype=AMP):
    loss = models.lm_loss(m(x), y)
    ref_loss = models.lm_loss(ref(x), y)
scaler.scale(loss).backward()
ref_loss.backward()                                # never scaled
scaled_norm = precision.grad_norm(m.parameters())  # what clipping here would see

# %%
scaler.unscale_(opt)                               # true gradients from here on
true_norm = torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm=1.0).item()
scaler.step(opt)
scaler.update()
print(f"norm seen before unscale / true norm = {scaled_norm / true_norm:.0f} = scale {scaler.get_scale():.0f}")
unscaled = precision.grad_norm(ref.parameters())   # the gradient norm of a backward that was never scaled
print("after unscale_, the norm equals an unscaled backward's (to 1 %):", math.isclose(true_norm, unscaled, rel_tol=1e-2))
assert math.isclose(true_norm, unscaled, rel_tol=1e-2) and scaled_norm > 1.0  # the clip would fire on the scaled norm

# %% [markdown]
# `train.train(..., clip_grad_norm=1.0)` does the same inside its loop. Here a clipped FP16 run still learns:

# %% [markdown] lang="zh" en="c3d6495a064a"
# `train.train(..., clip_grad_norm=1.0)` 在它的循环内部做的是同一件事。下面这次带梯度裁剪的 FP16 训练
# 仍然能学会：

# %%
clipped = train.train(make_model(), batches, policy=SCALED, steps=30, lr=3e-3, loss_weight=W,
                      clip_grad_norm=1.0, device=DEV, progress=False)
print("clipped fp16 run: loss below 1 after 30 steps:", clipped.final_loss() < 1.0)
assert clipped.final_loss() < 1.0 < clipped.loss[0]

# %% [markdown]
# ## 7. Checkpoint, crash, resume: the curve continues identically
#
# `train.train` writes a checkpoint every `checkpoint_every` steps **atomically** (to a temporary file, then
# `os.replace`, so a crash mid-write never leaves a torn file). It holds the model, the optimizer, the
# `GradScaler` state (its scale and growth tracker), the RNG state and the history. Batches are a function of
# the step number, so the resumed run sees the same data. We let the scale grow every 10 steps so that the
# scaler state matters. The file starts with a sha256 of its contents and is read back with
# `torch.load(..., weights_only=True)`: a corrupted or tampered checkpoint (checkpoints often live on shared
# scratch) is refused with one clear `CheckpointError` instead of running code or loading garbage.

# %% [markdown] lang="zh" en="2f8e26a7fee3"
# ## 7. 检查点、崩溃、恢复：曲线分毫不差地接续下去
#
# `train.train` 每隔 `checkpoint_every` 步**原子地**写一次检查点（先写入临时文件，再用 `os.replace` 替换，
# 这样写到一半时崩溃也不会留下残缺的文件）。检查点中包含模型、优化器、`GradScaler` 的状态（损失缩放因子及
# 其增长计数器）、随机数生成器的状态和训练历史。批次是步数的函数，所以恢复后的训练看到的数据完全相同。我们让
# 损失缩放因子每 10 步增长一次，这样 scaler 的状态才真正起作用。文件开头是其内容的 sha256 校验值，读取时使用
# `torch.load(..., weights_only=True)`：损坏或被篡改的检查点（检查点常常放在共享的临时存储上）会被拒绝，
# 并给出一个明确的 `CheckpointError`，而不会去执行其中的代码或加载一堆垃圾数据。

# %%
kw = dict(policy=SCALED, lr=3e-3, loss_weight=W, device=DEV, progress=False,
          scaler_kwargs={"growth_interval": 10})
full = train.train(make_model(), batches, steps=30, **kw)
with tempfile.TemporaryDirectory() as ckpt:
    part = train.train(make_model(), batches, steps=20, checkpoint_dir=ckpt, checkpoint_every=5, **kw)
    # ... the job is killed here; a new process starts from scratch and resumes:
    resumed = train.train(make_model(), batches, steps=30, checkpoint_dir=ckpt, checkpoint_every=5, resume=True,
                          **kw)

# %%
print("resumed from step", resumed.resumed_from, "| scale at the end:", resumed.scale[-1])
same = resumed.loss == full.loss and resumed.scale == full.scale
print("loss and scale curves identical to the uninterrupted run:", same)
if device.is_cuda(DEV):   # GPU kernels may be non-deterministic: compare closely instead of bitwise
    assert resumed.scale == full.scale and all(math.isclose(a, b, rel_tol=1e-3) for a, b in zip(resumed.loss, full.loss))
else:
    assert same and resumed.scale[-1] > resumed.scale[0]

# %%
fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.4))
plots.loss_curves({"uninterrupted": full.loss, "resumed at step 20": (resumed.steps[20:], resumed.loss[20:])},
                  ax=a1, styles={"resumed at step 20": "--"}, title="Loss")
plots.scale_history(resumed.scale, resumed.skipped, ax=a2, title="GradScaler scale, restored at step 20")
plt.show()

# %% [markdown]
# ## 8. Exercises
#
# **8.1** Write `amp_step(model, opt, scaler, x, y, dtype)`: one AMP training step of a TinyGPT with
# `models.lm_loss`, clipping the gradient norm to 1.0. The checker runs it against fresh models, including one
# whose scaled loss overflows.

# %% [markdown] lang="zh" en="0ebb8b13c667"
# ## 8. 练习
#
# **8.1** 编写 `amp_step(model, opt, scaler, x, y, dtype)`：用 `models.lm_loss` 完成 TinyGPT 的一个 AMP
# 训练步，并把梯度范数裁剪到 1.0。检查程序会用几个全新的模型运行它，其中一个模型缩放后的损失会上溢。

# %%
amp_step = ...  # your function: def amp_step(model, opt, scaler, x, y, dtype): ...
### BEGIN SOLUTION
def amp_step(model, opt, scaler, x, y, dtype):
    opt.zero_grad()
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        loss = models.lm_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(opt)
    scaler.update()
### END SOLUTION
check("04.amp-step", amp_step)

# %% [markdown]
# **8.2** Write `pick_amp(caps)`: given a device's capabilities (a dict with at least `bf16` and `fp16`, as
# `device.capabilities().as_dict()` returns), return `(dtype_name, use_scaler)`, e.g. `("fp16", True)`.

# %% [markdown] lang="zh" en="76abcb0ab69c"
# **8.2** 编写 `pick_amp(caps)`：给定一个设备的能力信息（一个至少包含 `bf16` 和 `fp16` 的字典，即
# `device.capabilities().as_dict()` 的返回值），返回 `(dtype_name, use_scaler)`，例如 `("fp16", True)`。

# %%
pick_amp = ...  # your function: def pick_amp(caps): ... return dtype_name, use_scaler
### BEGIN SOLUTION
def pick_amp(caps):
    if caps["bf16"]:
        return "bf16", False
    if caps["fp16"]:
        return "fp16", True
    return "fp32", False
### END SOLUTION
check("04.pick-dtype", pick_amp)

# %% [markdown]
# **8.3** Write `island_softmax(scores)`: the softmax over the last dimension, computed in an fp32 island and
# returned in the input's dtype, finite for any FP16 scores (including masked `-inf` entries) and inside autocast.

# %% [markdown] lang="zh" en="ccf87dd59863"
# **8.3** 编写 `island_softmax(scores)`：在最后一个维度上计算 softmax，计算放在 FP32 局部计算区中进行，
# 返回与输入相同的数据类型；对任意 FP16 分数（包括被掩码为 `-inf` 的元素），以及在 autocast 内部调用时，
# 结果都必须是有限值。

# %%
island_softmax = ...  # your function: def island_softmax(scores): ...
### BEGIN SOLUTION
def island_softmax(scores):
    with torch.autocast(device_type=scores.device.type, enabled=False):
        return torch.softmax(scores.float(), dim=-1).to(scores.dtype)
### END SOLUTION
check("04.fp32-island", island_softmax)

# %% [markdown]
# **8.4 Debug: the resume that forgot something.** These two functions checkpoint and resume a run. The resumed run
# trains, but it does not continue where the first one stopped:

# %% [markdown] lang="zh" en="895c1ec93c3f"
# **8.4 调试：恢复时忘了一样东西。** 下面两个函数用于保存检查点和恢复训练。恢复后的训练能正常进行，却没有
# 从第一次训练停下的地方接着往下走：

# %%
def save_checkpoint(path, model, opt, scaler):
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)

def load_checkpoint(path, model, opt, scaler):
    ckpt = torch.load(path, weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])

# %%
model, scaler = make_model().to(DEV), torch.amp.GradScaler(DEV.type, init_scale=2.0**10, growth_interval=2)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
for step in range(5):   # five clean AMP steps: the scale grows from 2^10 to 2^12
    x, y = (t.to(DEV) for t in batches(step))
    opt.zero_grad()
    with torch.autocast(device_type=DEV.type, dtype=AMP):
        loss = models.lm_loss(model(x), y)
    precision.backward(loss, scaler)
    precision.update(opt, scaler)
with tempfile.TemporaryDirectory() as d:
    save_checkpoint(f"{d}/ckpt.pt", model, opt, scaler)
    model2, scaler2 = make_model().to(DEV), torch.amp.GradScaler(DEV.type, growth_interval=2)
    load_checkpoint(f"{d}/ckpt.pt", model2, torch.optim.AdamW(model2.parameters(), lr=3e-3), scaler2)
print(f"scale when saved: {scaler.get_scale():g}   scale after resuming: {scaler2.get_scale():g}")
assert scaler2.get_scale() != scaler.get_scale()

# %% [markdown]
# Write fixed versions of both functions. The check saves a run with them, resumes it into fresh objects and compares
# model, optimizer and scaler state.

# %% [markdown] lang="zh" en="341293632f8d"
# 写出这两个函数修正后的版本。检查程序会用它们保存一次训练，把它恢复到全新的对象中，然后比较模型、优化器和
# scaler 的状态。

# %%
def save_checkpoint(path, model, opt, scaler):
    ...
    ### BEGIN SOLUTION
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "scaler": scaler.state_dict()}, path)
    ### END SOLUTION

def load_checkpoint(path, model, opt, scaler):
    ...
    ### BEGIN SOLUTION
    ckpt = torch.load(path, weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    scaler.load_state_dict(ckpt["scaler"])
    ### END SOLUTION


check("04.resume-scaler", (save_checkpoint, load_checkpoint))

# %% [markdown]
# ## Summary
#
# - AMP = a `GradScaler` (FP16 only) + `torch.autocast` around forward and loss + `scale → backward → unscale_ →
#   clip → step → update`. Weights and optimizer state stay FP32.
# - Autocast's op lists depend on the device: CUDA upcasts softmax, layer_norm, exp, sum to FP32; CPU autocast
#   (torch 2.13) does not. Measure the table on the device you use.
# - At realistic gradient sizes FP16 without a loss scale loses most gradients; BF16 does not need a scale.
#   Pure half precision breaks the optimizer (FP16: Adam's `g²` and `eps` underflow) or loses small updates
#   (BF16: 8 significant bits), which is why mixed precision keeps an FP32 master copy.
# - Write fragile ops (softmax, norms, exp) as fp32 islands in custom code.
# - Checkpoint the scaler with the model and optimizer, atomically; a resumed run then continues identically.

# %% [markdown] lang="zh" en="9aa09e9eb941"
# ## 小结
#
# - AMP = 一个 `GradScaler`（仅 FP16 需要）+ 包住前向传播和损失计算的 `torch.autocast` +
#   `scale → backward → unscale_ → clip → step → update`。权重和优化器状态保持 FP32。
# - autocast 的算子列表取决于设备：CUDA 会把 softmax、layer_norm、exp、sum 提升到 FP32；CPU autocast
#   （torch 2.13）不会。请在你使用的设备上实测这张表。
# - 在贴近实际的梯度大小下，不用损失缩放因子的 FP16 会丢失大部分梯度；BF16 不需要损失缩放因子。纯半精度会破坏
#   优化器（FP16：Adam 的 `g²` 和 `eps` 下溢），或者丢失小的更新（BF16：只有 8 位有效位），这就是混合精度
#   要保留一份 FP32 主权重副本的原因。
# - 在自定义代码中，把数值敏感的算子（softmax、归一化、exp）写成 FP32 局部计算区。
# - 把 scaler 与模型、优化器一起原子地保存进检查点；这样恢复后的训练就能分毫不差地接续下去。
