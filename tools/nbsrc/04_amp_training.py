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

# %%
# %matplotlib inline
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

# %%
print(inspect.getsource(precision.backward))
print(inspect.getsource(precision.update))

# %% [markdown]
# The three steps, on a tiny GPT:

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
# The logits come out of a matmul, so they are FP16; `cross_entropy` is on autocast's FP32 list, so the loss is
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
