# %% [markdown]
# # 05 · BF16, TF32, FP8
#
# **Objectives**
# - train the same tiny GPT in fp32, fp16 (with a loss scaler) and bf16, **compare the runs**, and measure why
#   bf16 is noisier: 8 mantissa bits against fp16's 11;
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

# %%
# %matplotlib inline
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

# %%
# NBVAL_IGNORE_OUTPUT
print(device.fp32_matmul_settings())

# %% [markdown]
# ### Emulating TF32
#
# `labkit.tf32.round_mantissa` rounds an fp32 tensor's mantissa to fewer bits with integer arithmetic on the bit
# pattern (round to nearest, ties to even); `tests/test_tf32.py` checks it against `labkit.formats` and torch's
# bf16 cast. TF32 keeps fp32's range; fp16, with the same 10 bits, does not:

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
# non-tensor-core kernels in older cuBLAS versions); the rule of thumb is to pad vocabulary, hidden and batch sizes
# to multiples of 8, or 64 to be safe. On a shared CPU, repeat the cell: the spread column says how much to trust one
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
