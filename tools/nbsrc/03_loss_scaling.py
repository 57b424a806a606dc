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

# %%
# %matplotlib inline
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
# (relative ~1e-3). With too big a scale the gradients overflow to inf and the whole step is garbage. A static
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
# > GPU's generation. A CPU has nothing here to run.
#
# ### Scale collapse
#
# What if *every* step produces inf or NaN, because of a bug or a corrupt sample rather than the scale? The
# scaler cannot tell the difference: it halves, and halves again.
#
# **Predict, then run.** A `GradScaler` with its defaults (2^16) sees 170 steps in a row that all overflow. What is its
# scale at the end? Record a number:

# %%
prediction = ...
### BEGIN SOLUTION
prediction = 0.0
### END SOLUTION
predict("03.collapse", prediction)

# %% [markdown]
# Here one target in every batch is inf:

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
# > grows too far overflows and halves again, so a ceiling is rarely needed. The cell below puts a floor under
# > `DynamicLossScaler`, and shows a real GradScaler passing 2^24 upwards and (in the collapse run) 2^10 downwards.

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

# %%
rows = ["| DeepSpeed `fp16` key | GradScaler | DeepSpeed default | GradScaler default | difference |",
        "|---|---|---|---|---|"]
rows += [f"| `{r['deepspeed']}` | `{r['gradscaler']}` | {r['ds_default']} | {r['torch_default']} | {r['note']} |"
         for r in scaling.DEEPSPEED_KNOBS]
display(Markdown("\n".join(rows)))

# %% [markdown]
# `deepspeed_fp16_config` writes the block closest to a given GradScaler, and `scaler_kwargs_from_deepspeed` goes
# back (`tests/test_scaling.py` checks that DeepSpeed's own config class accepts the block):

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
# - **hysteresis** (default 2): DeepSpeed tolerates that many overflows before it halves; the counter is refilled
#   only when the scale grows (or after every clean step with `consecutive_hysteresis`);
# - **the window is one step later**: DeepSpeed counts clean steps *since the last overflow* and grows when that
#   count, before the current step, is a multiple of `loss_scale_window`, so the first growth needs window + 1
#   clean steps.

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

# %%
hit = debug.backward_anomaly(log_loss)
print(hit.message)
print("created at", hit.forward_line)
assert hit.function == "LogBackward0" and "torch.log(p)" in hit.forward_line

# %% [markdown]
# The fix keeps the log away from 0 in *both* branches (the "double where"), or clamps: `torch.log(p.clamp_min(eps))`:

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

# %% tags=["workspace-clear"]
print(textwrap.dedent(inspect.getsource(DynamicLossScaler.grow_or_back_off)))

# %% [markdown]
# **7.4** Write DeepSpeed's `fp16` block (a dict) that behaves as closely as possible like
# `torch.amp.GradScaler("cuda", init_scale=2**12, growth_interval=500)`.

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
