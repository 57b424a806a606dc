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

# %%
# %matplotlib inline
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
# (20), while its ZeRO-3 estimator counts 18 (section 4 compares both with this model).
# Plain fp32 Adam is 16 as well:

# %%
print(mem.conventions_table("adam"))
assert [mem.bytes_per_param(p, "adam") for p in ("bf16-master", "bf16-master-fp32-grads", "bf16-master-fp32-accum")] == [16, 18, 20]
assert mem.bytes_per_param("fp32", "adam") == mem.bytes_per_param("bf16-master", "adam") == 16

# %% [markdown]
# The same numbers per precision policy and optimizer, as stacked bars (bytes per parameter; `weight_copies` is
# autocast's temporary bf16 copy of the weights; Adafactor's factored second moment is ~0 bytes per parameter):

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

# %%
model, opt = one_step("bf16-master-fp32-accum", "adamw")
for k, v in mem.measure_model_state(model, opt).items():
    print(f"{k:<11} {v:>9,} B = {v / n:.2f} B/param")

# %% [markdown]
# **A rough cross-check from the operating system.** The process's resident memory (RSS) should grow by about
# what the tensors take. It is only rough: the allocator keeps freed memory for reuse, and pages are shared. We
# use a larger MLP (about 8.4 M parameters) so that the delta stands out from the noise:

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

# %%
calc = widgets.memory_calculator("13B", gpus_per_node=8, nodes=1, stage=2, offload="optimizer",
                                 policy="bf16-master", gpu_gb=80)
calc

# %%
print(calc.result.value)
assert "fits" in calc.result.value and calc.result.value.startswith("per GPU: 26.00 GB")

# %% [markdown]
# The 26 GB are the replicated bf16 weights (2 B × 13B); the fp32 masters, the Adam states and the fp32 gradient
# partition DeepSpeed keeps beside them (16 B/param, measured in notebook 10) live in the node's CPU memory. Change the stage and watch the per-GPU figure:

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

# %%
answer = ...
### BEGIN SOLUTION
answer = 2 + 2 + 4 + 4
### END SOLUTION
check("06.bytes-per-param", answer)

# %% [markdown]
# **8.2** A 7B model, mixed precision with Adam (16 B/param), 8 GPUs of 32 GB each. Counting model states only,
# what is the smallest ZeRO stage at which it fits? (Work it out by hand first, then use `mem.model_state_bytes`.)

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
