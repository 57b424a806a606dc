# %% [markdown]
# # 11 · Parallelism by hand: DDP, ZeRO-1, tensor and pipeline parallelism
#
# **Objectives**
# - write data parallelism three ways (all-reduce after backward, hooks that overlap communication with backward,
#   buckets), get gradients **bit-identical** to `torch.nn.parallel.DistributedDataParallel`, and know why they are;
# - shard AdamW over the ranks (ZeRO-1): the same weights as unsharded AdamW, bit for bit, with per-rank optimizer
#   bytes equal to `labkit.memory`'s prediction and to DeepSpeed stage 1's;
# - split an MLP the Megatron way (column-parallel, then row-parallel, with the conjugate operators f and g), add
#   sequence parallelism (an all-gather and a reduce-scatter in their place), and split a model into a 2-stage GPipe
#   pipeline; measure their communication and the pipeline bubble against the formulas;
# - run PyTorch's FSDP2 next to DeepSpeed ZeRO-3 on one model: same loss curve, different bytes and messages; with
#   gradient accumulation, mixed precision and sharded checkpoints (DCP, `zero_to_fp32`);
# - choose: what each rank holds, what it sends per step, and when each strategy is worth it; size a 70B run on 64
#   GPUs with tensor, pipeline and data parallelism.
#
# **Prerequisites:** notebooks 06 (the memory model), 09 (DDP, launching ranks) and 10 (ZeRO, DeepSpeed).
#
# **Estimated time:** 160 min (core 90 min, stretch 70 min)
#
# Sections 4-6 are **stretch**: tensor and pipeline parallelism by hand and FSDP2. A first pass can take sections
# 1-3 and 7 (data parallelism and ZeRO-1 by hand, then choosing a strategy) and come back for the rest; their
# cells still run in order, so run them even when you skip their reading.
#
# Everything runs for real on 2 ranks: two processes started by `torchrun`, talking over gloo. They are CPU
# processes wherever this notebook runs (`--device cpu`), because the point is the mechanism. The code follows its
# parameters' device and dtype and takes its backend from the device gate, so on a node with 2 GPUs
# `torchrun --nproc_per_node 2 -m labkit.recipes.handpar --device cuda` runs the same strategies on NCCL, and the
# messages go over NVLink or PCIe within a node and InfiniBand between nodes instead of loopback TCP. What then
# differs: NCCL has a real reduce-scatter (section 3 counts gloo's emulation), and the timings are the GPU's.

# %%
# %matplotlib inline
import inspect
import math

import matplotlib.pyplot as plt
import torch

from labkit import handpar, memory, models, sizing
from labkit.check import check, predict, reveal
from labkit.dist import launch
from labkit.exercises.nb11 import PREDICT_SETUP, rank_module

# %% [markdown]
# ## 1. Two processes, one model
#
# A rank is another process: it cannot see this notebook's variables. Code that runs on the ranks lives in files.
# `labkit.recipes.handpar` runs every strategy of this notebook next to the library that does the same thing
# (torch DDP, AdamW, DeepSpeed, the single-process model, `torch.distributed.pipelining`, FSDP2), in **one** launch
# (section 2), because starting the processes costs seconds. Your exercises run on the ranks too: `check()` writes
# the imports, functions and classes of your cell into a module file and runs it on 2 ranks next to the real thing.
#
# Data parallelism, ZeRO and FSDP below share one model: an MLP 64 → 256 → 256 → 256 → 1 with GELU, 148,481
# parameters in 8 tensors. Each rank trains on its own 64 rows per step.

# %%
mlp = models.MLP(64, 256, 1, depth=3, activation="gelu", seed=0)
for name, p in mlp.named_parameters():
    print(f"{name:<14} {str(tuple(p.shape)):<11} {p.numel():>7,} elements")
n_params = models.count_parameters(mlp)
print(f"{'total':<26} {n_params:>7,} elements, {4 * n_params:,} bytes in fp32")

# %% [markdown]
# ## 2. Data parallelism by hand, in three steps
#
# Every rank holds the whole model and computes the gradient of *its* rows. Averaged over the ranks (equal row
# counts), those gradients are the gradient of the mean loss over the global batch, so every rank takes the same
# step and the replicas stay identical.
#
# ### Step 0: start from the same weights
#
# "Stay identical" needs the replicas to *start* identical. A script without a common seed, or a checkpoint loaded
# on rank 0 only, starts each rank elsewhere, and nothing later would bring them together. So DDP's constructor
# broadcasts rank 0's parameters and buffers to every rank. By hand (the launch below seeds rank 1 differently on
# purpose, so that this step is what makes the replicas equal):

# %%
print(inspect.getsource(handpar.broadcast_parameters))

# %% [markdown]
# ### Step 1: all-reduce after backward
#
# The simplest version waits until backward is done, then all-reduces each gradient, one tensor at a time:

# %%
print(inspect.getsource(handpar.allreduce_gradients))

# %% [markdown]
# Each gradient is scaled by 1/world *before* the sum. That detail is what DDP does too, and it matters for
# bitwise equality (below).
#
# ### Step 2: overlap communication with backward
#
# Backward produces gradients from the last layer to the first. The last layer's gradient is ready long before
# the first layer's, so its all-reduce can already travel while backward goes on. Two tools do it:
#
# - `p.register_post_accumulate_grad_hook(hook)` calls `hook(p)` as soon as `p.grad` is complete;
# - `dist.all_reduce(t, async_op=True)` starts the all-reduce and returns at once with a *work* handle; `work.wait()`
#   blocks until it is done.
#
# **Exercise 11.ddp-overlap.** Write `overlap_gradients(model)`: register a hook on every parameter that scales its
# gradient by 1/world and starts its all-reduce without waiting; return a function `wait()` that waits for all of
# them (the training loop calls it after `loss.backward()`, before `optimizer.step()`). The check runs your cell on
# 2 ranks and compares the gradients with torch DDP's, bit for bit, for 2 steps. Import what you use in the cell.

# %%
import torch.distributed as dist


def overlap_gradients(model):
    """Start each gradient's all-reduce from a hook as soon as it is ready; return wait()."""
    ...
    ### BEGIN SOLUTION
    world = dist.get_world_size()
    pending = []

    def hook(p):
        p.grad.mul_(1.0 / world)
        pending.append(dist.all_reduce(p.grad, async_op=True))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def wait():
        for work in pending:
            work.wait()
        pending.clear()

    return wait
    ### END SOLUTION


check("11.ddp-overlap", overlap_gradients)

# %% [markdown]
# This is the file `check()` sent to the ranks, built from your cell (its `check(...)` line left out):

# %% tags=["workspace-clear"]
print(rank_module(overlap_gradients))

# %% [markdown]
# ### Step 3: buckets
#
# Every all-reduce has a fixed cost α, whatever its size (notebook 09 measured it for gloo on loopback; with NCCL on
# NVLink it is a few microseconds). Eight small all-reduces pay 8α. DDP therefore copies gradients into
# **buckets** and all-reduces a bucket as soon as all its gradients are in: fewer, larger messages, still
# overlapped with backward. The buckets are filled in the order gradients arrive, last layer first, and a bucket
# closes once it holds its capacity or more (what DDP does when it rebuilds its buckets after the first step):

# %%
print(inspect.getsource(handpar.bucket_layout))
print(inspect.getsource(handpar.BucketedGradients))

# %% [markdown]
# A bucket is sent when *all* its gradients are in. A parameter that takes no part in the loss (a head used only in
# evaluation, a branch skipped this step) never gets a gradient, so its bucket never fills and is never sent. If
# another rank did send it, that rank now waits for a partner that will never come. DDP therefore checks: at the
# next forward it raises "Expected to have finished reduction in the prior iteration", unless it was built with
# `find_unused_parameters=True` (which searches the graph for such parameters after every forward, at a cost).
# `wait()` above checks the same and raises, naming the parameters; section 2's launch tried it with a model that
# has an extra, unused linear layer (below).

# %% [markdown]
# **Predict, then run (11.allreduce-count).** How many all-reduce calls per step does each version make on our
# model: naive (step 1), bucketed with 0.25 MiB buckets (step 3), and torch DDP with its defaults (it starts with a
# 1 MiB first bucket and 25 MiB for the others)?

# %%
print(PREDICT_SETUP)
prediction = ...   # a dict: {"naive": ..., "bucketed": ..., "ddp": ...}
### BEGIN SOLUTION
prediction = {"naive": 8, "bucketed": 3, "ddp": 1}
### END SOLUTION
predict("11.allreduce-count", prediction)

# %% [markdown]
# Now the launch that runs everything in this notebook: the three DDP versions and torch DDP, ZeRO-1 by hand and
# DeepSpeed stage 1, the tensor-parallel MLP, GPipe with 1 to 8 micro-batches and `torch.distributed.pipelining`,
# FSDP2 and DeepSpeed stage 3. Each section below reads its part of the result.
#
# Collectives are counted by `torch.profiler`, which records every one that torch issues (torch DDP's internal
# bucket all-reduces included), with its size; "during backward" counts those *started* before `backward()`
# returned.

# %%
res = launch("labkit.recipes.handpar", nproc=2, timeout=600, stream=False, args=["--device", "cpu"])
print(f"{res['world_size']} ranks, backend {res['backend']}; ran {', '.join(res['timings_s'])}")
ddp = res["ddp"]
print(f"{'version':<10}{'all-reduces/step':>18}{'during backward':>17}{'bytes/step':>12}")
for name in ("naive", "overlap", "bucketed", "ddp"):
    c = ddp["collectives"][name]
    print(f"{name:<10}{c['all_reduce']['calls']:>18}{c['issued_in_backward']:>17}{4 * c['all_reduce']['elements']:>12,}")
calls = {k: ddp["collectives"][k]["all_reduce"]["calls"] for k in ("naive", "overlap", "bucketed", "ddp")}
verdict = reveal("11.allreduce-count", calls)

# %%
cs = ddp["collectives"]
assert all(cs[k]["all_reduce"]["elements"] == n_params for k in cs)  # the same data, in fewer messages
assert cs["naive"]["issued_in_backward"] == 0 and cs["overlap"]["issued_in_backward"] == 8
assert ddp["bucket_layout"] == [[7, 6, 5, 4], [3, 2], [1, 0]] and calls["bucketed"] == 3 and calls["ddp"] == 1

# %% [markdown]
# ### Bit for bit equal to torch DDP, and why
#
# For 3 training steps (AdamW in between) every version's gradients were compared with torch DDP's on both ranks,
# with `torch.equal`:

# %%
start = ddp["start_digests"]
print("each rank initialised its models with its own seed; before step 0 they differed from rank 0's:",
      ddp["differed_before_step0"])
print("after step 0, every version's weights identical on both ranks:", start[0] == start[1])
for rank, flags in enumerate(ddp["bitwise_grads_vs_ddp"]):
    print(f"rank {rank}: gradients bitwise equal to torch DDP at every step: {flags}")
print("weights after 3 steps bitwise equal:", ddp["bitwise_params_vs_ddp"][0])
assert ddp["differed_before_step0"] == [False, True] and start[0] == start[1]  # step 0 made rank 1 rank 0's
print("a model with an unused layer, bucketed by hand:", ddp["unused_param_error"][0].split(";")[0])
assert all("unused.weight" in e and "unused.bias" in e for e in ddp["unused_param_error"])
assert all(all(f.values()) for f in ddp["bitwise_grads_vs_ddp"] + ddp["bitwise_params_vs_ddp"])

# %% [markdown]
# Same bits, not just close. DDP (without a communication hook) multiplies each gradient by 1/world while it copies
# it into its bucket, then sums the buckets with all-reduce; our three versions do the same. With **2 ranks** that
# would not even matter, for three reasons that the next cell checks on 100,000 random numbers: multiplying by 0.5
# is exact (a power of two only changes the exponent), so dividing before or after the sum gives the same bits; x·0.5
# is x/2; and a sum of two numbers does not depend on the order. With **3 ranks** none of that holds: 1/3 is
# rounded in fp32, so x·fl(1/3) and x/3 differ in the last bit for some x, and (a + b) + c is not a + (b + c). A
# ring all-reduce sums each element in an order set by its *position* in the flat buffer, so the bucket layout
# decides the rounding. Bitwise equality with DDP at 3 ranks needs DDP's exact recipe: scale by fl(1/3) before the
# sum, and the same bucket layout (DDP rebuilds its buckets after the first step in the order gradients arrive,
# which is what `bucket_layout` does). `tests/test_handpar.py` checks all of this on 3 ranks.

# %%
g = torch.Generator().manual_seed(0)
a, b, c = torch.randn(3, 100_000, generator=g).unbind()
print("x * 0.5 == x / 2 everywhere:          ", torch.equal(a * 0.5, a / 2))
print("x * fl(1/3) == x / 3 everywhere:      ", torch.equal(a * (1 / 3), a / 3))
print("a + b == b + a everywhere:            ", torch.equal(a + b, b + a))
print("(a + b) + c == a + (b + c) everywhere:", torch.equal((a + b) + c, a + (b + c)))
assert torch.equal(a * 0.5, a / 2) and not torch.equal(a * (1 / 3), a / 3) and not torch.equal((a + b) + c, a + (b + c))

# %% [markdown]
# ### What overlap and buckets buy
#
# One step (forward, backward, gradient sync) of each version, timed in turn, interleaved, after a barrier; the
# median of each rank, then the slower rank:

# %%
# NBVAL_IGNORE_OUTPUT
t = ddp["step_s"]
for name in ("naive", "overlap", "bucketed", "ddp"):
    print(f"{name:<9} {1e3 * t[name]:6.2f} ms/step   {t['naive'] / t[name]:4.2f}x the speed of naive")
print(f"here, overlapping made a step {t['naive'] / t['overlap']:.2f}x as fast as all-reducing after backward; "
      f"torch DDP ran at {t['naive'] / t['ddp']:.2f}x")

# %% [markdown]
# Read the line above with the machine in mind. With gloo, an asynchronous all-reduce runs on gloo's own threads,
# so it can proceed while the main thread computes the earlier layers' gradients, if there is a free core for it.
# On a GPU, NCCL runs on its own CUDA stream, and overlap hides communication behind the backward kernels. Buckets
# matter most where α is large compared with the time a bucket takes to send.
#
# ## 3. ZeRO-1: a sharded optimizer, by hand
#
# In DDP every rank keeps AdamW's two moments for every parameter (8 bytes per parameter in fp32) and updates all
# of them, identically: wasted replication. ZeRO stage 1 keeps them once, spread over the ranks:
#
# 1. flatten the parameters into one vector and pad it with zeros to a multiple of 2 × world size (as DeepSpeed
#    does), so it splits into equal slices; rank r **owns** slice r;
# 2. after backward, **reduce-scatter** the gradients: each rank receives the sum of everyone's gradients *for its
#    slice* (scaled by 1/world, as in DDP);
# 3. step AdamW on the slice;
# 4. **all-gather** the updated slices, so every rank has the whole new model for the next forward.
#
# AdamW works element by element, so stepping it on slices gives exactly the arithmetic of stepping it on the
# whole model: the weights must come out bit for bit the same.
#
# **Exercise 11.zero1-step.** Write `zero1_step(flat_param, flat_grad, shard, optimizer)`: `flat_param` holds every
# parameter (flattened and padded, the same on every rank) and must be overwritten with the updated parameters;
# `flat_grad` is this rank's gradient in the same layout; `shard` is this rank's slice of the parameters (a leaf
# tensor), the only tensor `optimizer` updates. `dist.reduce_scatter_single(out, inp)` and
# `dist.all_gather_single(out, inp)` are the two collectives. The check trains 3 steps and compares the
# weights with AdamW on the whole model.

# %%
import torch
import torch.distributed as dist


def zero1_step(flat_param, flat_grad, shard, optimizer):
    """Reduce-scatter the averaged gradients, step this rank's slice, all-gather the new parameters."""
    ...
    ### BEGIN SOLUTION
    world = dist.get_world_size()
    grad_shard = torch.empty_like(shard)
    dist.reduce_scatter_single(grad_shard, flat_grad.mul(1.0 / world))
    shard.grad = grad_shard
    optimizer.step()
    dist.all_gather_single(flat_param, shard.detach())
    ### END SOLUTION


check("11.zero1-step", zero1_step)

# %% [markdown]
# labkit's sharded AdamW, which calls such a step function (its own `handpar.zero1_step` by default). ZeRO exists
# to save memory, so the by-hand version must not spend it: each parameter becomes a view into one flat buffer and
# each gradient a view into a flat gradient (backward accumulates straight into it), the slice a rank updates is its
# part of the flat buffer, and the all-gather writes straight into the flat buffer, which *is* the parameters. No
# tensor is held twice. (PyTorch ships the same idea as `torch.distributed.optim.ZeroRedundancyOptimizer`, which
# shards the states of any optimizer per parameter tensor; DeepSpeed stage 1 shards one flat vector, like ours.)

# %% tags=["workspace-clear"]
print(inspect.getsource(handpar.zero1_step))
print(inspect.getsource(handpar.ShardedAdamW.__init__))

# %% [markdown]
# The launch trained it for 5 steps next to AdamW on the whole model (each rank all-reducing its gradients as in
# step 1) and next to DeepSpeed ZeRO stage 1 (fp32, torch's AdamW, same data):

# %%
z, zds = res["zero1"], res["zero1"]["deepspeed"]
print("weights after", z["steps"], "steps bitwise equal to unsharded AdamW, per rank:", z["bitwise_vs_adamw"])
print("DeepSpeed ZeRO-1's weights bitwise equal to ours:", zds["bitwise_vs_hand"], "| its losses equal ours:",
      zds["losses"] == z["losses"])
print(f"{z['n_params']:,} parameters padded to {z['padded']:,}: each rank owns {z['part']:,}; "
      f"AdamW state shapes on each rank: {z['state_shapes'][0]}")
assert all(z["bitwise_vs_adamw"]) and z["ranks_identical"] and z["losses"] == z["reference_losses"]
assert zds["bitwise_vs_hand"] and zds["losses"] == z["losses"]

# %% [markdown]
# Now the bytes. Three independent numbers per rank: what our sharded AdamW holds (the storages of `exp_avg` and
# `exp_avg_sq`), what `labkit.memory` predicts for ZeRO stage 1 (notebook 06's model, with DeepSpeed's padding),
# and what DeepSpeed stage 1 really holds (counted from its optimizer's tensors by `labkit.zero.count_model_states`,
# notebook 10):

# %%
pred1 = memory.model_state_bytes(z["n_params"], "fp32", "adamw", stage=1, world_size=2).device["optimizer"]
pred0 = memory.model_state_bytes(z["n_params"], "fp32", "adamw", stage=0, world_size=2).device["optimizer"]
ds1 = [b["optimizer"] for b in zds["bytes"]]
print(f"{'':14}{'rank 0':>10}{'rank 1':>10}")
print(f"{'by hand':<14}{z['state_bytes'][0]:>10,}{z['state_bytes'][1]:>10,}")
print(f"{'labkit.memory':<14}{pred1:>10,}{pred1:>10,}")
print(f"{'DeepSpeed':<14}{ds1[0]:>10,}{ds1[1]:>10,}")
print(f"unsharded AdamW would hold {pred0:,} bytes per rank")
assert z["state_bytes"] == [pred1, pred1] == ds1 and pred1 == 8 * z["part"] and 2 * pred1 == pred0 + 8 * (z["padded"] - z["n_params"])

# %% [markdown]
# The states are what ZeRO-1 shards, but what a rank must fit is everything it holds for the model. Totals per
# rank, counted from the tensors' storages at the end of the run (fp32 here, so there is no separate master copy:
# the shard *is* the parameters' slice):

# %%
mine, full = z["memory_bytes"][0], z["adamw_memory_bytes"]
print(f"{'':18}{'params':>10}{'grads':>10}{'states':>11}{'total':>11}")
for name, m in (("AdamW, replicated", full), ("ZeRO-1 by hand", mine)):
    print(f"{name:<18}{m['params']:>10,}{m['grads']:>10,}{m['states']:>11,}{m['total']:>11,}")
print(f"ZeRO-1 by hand holds {mine['total'] / full['total']:.2f} of replicated AdamW's bytes on each of 2 ranks; "
      f"the parameters live in the flat buffer: {z['params_in_flat']}")
assert z["params_in_flat"] and z["memory_bytes"][0] == z["memory_bytes"][1]
pred_total = memory.model_state_bytes(z["n_params"], "fp32", "adamw", stage=1, world_size=2).device_total
assert mine["states"] == pred1 and mine["total"] < full["total"]
assert abs(mine["total"] - pred_total) <= 16 * (z["padded"] - z["n_params"])  # labkit.memory, but for the padding

# %% [markdown]
# **Gradient clipping when the gradients are sharded.** `clip_grad_norm_` scales every gradient by
# max_norm / ‖g‖ when the norm of the *whole* gradient exceeds max_norm. After the reduce-scatter no rank holds the
# whole gradient, and clipping each shard by its own norm would give each rank a different factor: wrong, and the
# ranks would no longer apply one consistent update. The norm of the whole vector is the square root of the sum of
# the shards' sums of squares, so one all-reduce of a single number per rank is enough. DeepSpeed and FSDP do this;
# so does `zero1_step(..., max_norm=...)` here:

# %%
print(inspect.getsource(handpar.clip_sharded_grad_norm_))

# %% [markdown]
# The launch trained ZeRO-1 by hand with `max_norm` = 0.05 next to replicated AdamW with `clip_grad_norm_`:

# %%
c = z["clip"]
clipped = min(c["norms"]) > c["max_norm"]
same_norms = all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(c["norms"], c["reference_norms"]))
print(f"{len(c['norms'])} steps; the gradient norm exceeded {c['max_norm']} at every step (so every step clipped): "
      f"{clipped}")
print("global norm from the shards = clip_grad_norm_'s on the whole gradient (to 1e-5):", same_norms)
at_max = all(math.isclose(a, c["max_norm"], rel_tol=1e-4) for a in c["norms_after"])
print(f"the gradients the optimizer stepped with had global norm {c['max_norm']} (to 1e-4):", at_max)
print("weights equal unsharded clipping (to 1e-5, relative):", c["rel_vs_adamw"] < 1e-5)
assert clipped and same_norms and at_max and c["rel_vs_adamw"] < 1e-5

# %% [markdown]
# The communication of one step, as the profiler saw it on rank 0 (elements per call):

# %%
for name, c in z["collectives"].items():
    print(f"by hand    {name:<11} {c['calls']} call(s), sizes {c['sizes']}")
for name, c in zds["collectives"].items():
    print(f"DeepSpeed  {name:<11} {c['calls']} call(s), sizes {c['sizes']}")
rs = z["collectives"].get("reduce_scatter") or z["collectives"]["all_reduce"]  # NCCL's name, or gloo's emulation
assert z["collectives"]["all_gather"]["sizes"] == [z["part"]] and rs["sizes"] in ([z["padded"]], [z["part"]])
assert sum(zds["collectives"]["all_reduce"]["sizes"]) == z["n_params"] + 1  # every gradient, plus one element

# %% [markdown]
# Two things to read here. Our `reduce_scatter_single` shows up as an **all-reduce of the whole padded vector**:
# gloo has no reduce-scatter, and torch emulates it with an all-reduce, then keeps the slice. On NCCL it is a real
# reduce-scatter, which sends half the bytes of an all-reduce: ZeRO-1 then costs reduce-scatter (Ψ) + all-gather
# (Ψ) = 2Ψ per step, the same as DDP's all-reduce (2Ψ as reduce-scatter + all-gather inside the ring). The
# all-gather's input is this rank's slice; the whole gathered vector is world × that. DeepSpeed stage 1 does it its
# own way, on NCCL too: after backward (with `overlap_comm` off, as here) it goes through the parameters in order and
# sums their gradients in buckets of `reduce_bucket_size` (65,536 elements here) with **all-reduces**, each rank then
# keeping its slice (`use_multi_rank_bucket_allreduce`, on by default: twice the bytes of a reduce-scatter, in fewer
# calls; off, each slice is reduced to its owner). The sizes add up to the 148,481 unpadded gradients plus one
# all-reduce of a single element, as the cell asserts; then one all-gather of the slices.
#
# ## 4. Tensor parallelism: a Megatron MLP on 2 ranks
#
# **Stretch.**
#
# **Two ways to split one model, and their names.** Seed 004 §6.2 calls *model parallelism* placing different layers
# or modules of a model on different devices, and §6.3 calls *pipeline parallelism* cutting the model into stages
# that work on different mini-batches at the same time. Both describe one split: whole layers per device, with
# activations passed from one device to the next. This notebook calls it **pipeline parallelism** (section 5), and
# §6.3's batches in flight together (GPipe's micro-batches) are what keep its stages busy at once. **Tensor parallelism**, this section, splits
# *each* layer instead: every rank holds a slice of every weight matrix and the ranks combine partial results inside
# the layer. The literature uses "model parallelism" for either split, or for both (Megatron-LM's paper calls its
# tensor split model parallelism), so read which one a text means. The launch's results below show what a rank
# held: half of every matrix of the block, against the shapes of the whole layers (`torch.nn.Linear`); section 5's
# first results cell checks that a pipeline stage holds whole layers.
#
# A transformer's MLP is Y = GELU(X A) B, with A of d × 4d and B of 4d × d. Megatron splits it so that a
# whole block needs one all-reduce forward and one backward:
#
# - **column-parallel A** = [A₁ A₂]: rank r computes H_r = GELU(X A_r), its half of the hidden units. GELU acts
#   element by element, so no communication is needed between the two layers;
# - **row-parallel B** = [B₁; B₂]: rank r computes H_r B_r, a *partial* sum of Y. Y = H₁B₁ + H₂B₂ takes one
#   all-reduce (the operator **g**), and the bias of B is added once, after it;
# - backward mirrors it: the gradient of X is the sum of both ranks' contributions (each used its own A_r), so
#   the operator **f** in front of the block is the identity forward and an all-reduce backward, and g is the
#   identity backward.
#
# **Exercise 11.tp-conjugates.** Write f and g as `torch.autograd.Function` classes, `CopyToTP` and `ReduceFromTP`
# (each with `@staticmethod forward(ctx, x)` and `backward(ctx, grad)`). `dist.all_reduce` works in place: clone
# first. The check builds the 2-way MLP with them and compares its output and *every* gradient, the input's too,
# with the single-process MLP.

# %%
import torch
import torch.distributed as dist


class CopyToTP(torch.autograd.Function):
    """f: the identity forward; all-reduce the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        ...
        ### BEGIN SOLUTION
        return x
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ...
        ### BEGIN SOLUTION
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad
        ### END SOLUTION


class ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward (sum the partial outputs); the identity backward."""

    @staticmethod
    def forward(ctx, x):
        ...
        ### BEGIN SOLUTION
        x = x.clone()
        dist.all_reduce(x)
        return x
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ...
        ### BEGIN SOLUTION
        return grad
        ### END SOLUTION


check("11.tp-conjugates", (CopyToTP, ReduceFromTP))

# %% [markdown]
# labkit's version of the block (its `CopyToTP` and `ReduceFromTP` are the ones above):

# %%
print(inspect.getsource(handpar.TensorParallelMLP))

# %% [markdown]
# The launch ran it with d = 128 (hidden 512) on 256 tokens, next to the single-process MLP on every rank:

# %%
tp = res["tp"]
for rank, r in enumerate(tp["ranks"]):
    close = {k: v < 1e-5 for k, v in r["rel"].items()}
    print(f"rank {rank} holds w1 {r['held']['w1']}, w2 {r['held']['w2']}, b2 {r['held']['b2']}; "
          f"equal to one process within 1e-5 (relative): {close}")
assert all(v < 1e-5 for r in tp["ranks"] for v in r["rel"].values())
fc1, fc2 = torch.nn.Linear(tp["d_model"], tp["hidden"]), torch.nn.Linear(tp["hidden"], tp["d_model"])  # one process
assert all(r["held"]["w1"] == [fc1.weight.shape[0] // 2, fc1.weight.shape[1]] and
           r["held"]["w2"] == [fc2.weight.shape[0], fc2.weight.shape[1] // 2] for r in tp["ranks"])  # half of each

# %% [markdown]
# Not bitwise this time: Y is now summed in two halves and then added, a different order than one matmul.
# Communication per step, measured and from the formula (tokens × d elements each way, fp32):

# %%
want = handpar.tp_comm_bytes(tp["tokens"], tp["d_model"])
for rank, r in enumerate(tp["ranks"]):
    fwd, bwd = (4 * r[k]["all_reduce"]["elements"] for k in ("forward", "backward"))
    calls = (r["forward"]["all_reduce"]["calls"], r["backward"]["all_reduce"]["calls"])
    print(f"rank {rank}: all-reduces forward/backward {calls}, bytes {fwd:,} + {bwd:,}; formula "
          f"{want['forward']:,} + {want['backward']:,}")
    assert calls == (1, 1) and (fwd, bwd) == (want["forward"], want["backward"])

# %% [markdown]
# Tensor parallelism sends **activations**, inside every layer, in the critical path. In this naive form nothing
# overlaps with the all-reduce of g: the next layer needs its result. Real implementations hide part of it.
# Megatron starts f's backward all-reduce (of the input gradient) and computes the weight gradients while it runs,
# and collective matmuls split a GEMM into chunks so that each chunk's communication overlaps the next chunk's
# compute. The volume still grows with tokens × d, not with the parameter count, and whatever is not hidden waits on
# the link. That is why tensor parallelism stays inside a node, on NVLink: 2-8 GPUs.
#
# ### Sequence parallelism
#
# Around the MLP, a transformer layer also runs LayerNorm, dropout and the residual add. With tensor parallelism
# alone every rank runs them on every token and keeps all of their activations: in Megatron's accounting
# (Korthikanti et al., 2022) that is 10·s·b·h of a layer's 34·s·b·h bytes that tensor parallelism does not divide
# by t. Megatron's **sequence parallelism** splits these regions by tokens: rank r keeps tokens r·T/n to
# (r+1)·T/n. Entering the MLP, f becomes an **all-gather** of the token slices (its backward: a reduce-scatter of
# the input gradient); leaving it, g becomes a **reduce-scatter**, which hands each rank the finished sum for its
# own tokens (its backward: an all-gather). A ring all-reduce *is* a reduce-scatter followed by an all-gather, so
# the link carries the same bytes as before. The cost is elsewhere: the LayerNorm's weight and bias and fc2's bias
# are whole on every rank but each rank's copy sees only its tokens, so their gradients are partial sums that one
# more (small) all-reduce adds up. Below, labkit's entry operator and block (in the order they run). The launch ran
# the pre-norm block x + MLP(LayerNorm(x)) this way, each rank given only its 128 tokens, against the whole block in
# one process. It also measured what autograd keeps for backward on each rank (as notebook 06 does), with and
# without sequence parallelism:

# %%
print(inspect.getsource(handpar.GatherFromSequence))
print(inspect.getsource(handpar.SequenceParallelBlock.forward))
T, d = tp["tokens"], tp["d_model"]
for rank, r in enumerate(tp["sp"]):
    sizes = {when: {op: c["sizes"] for op, c in r[when].items()} for when in ("forward", "backward")}
    print(f"rank {rank}: holds {r['tokens_held']} of {T} tokens; the output of its tokens and all "
          f"{len(r['rel']) - 1} gradients equal one process within 1e-5: {max(r['rel'].values()) < 1e-5}")
    print(f"  collectives (elements): {sizes}")
    print(f"  saved for backward: {r['saved_sp']:,} B, against {r['saved_tp']:,} B with tensor parallelism only "
          f"({1 - r['saved_sp'] / r['saved_tp']:.1%} less)")
    assert max(r["rel"].values()) < 1e-5 and r["tokens_held"] == T // 2
    assert r["saved_tp"] - r["saved_sp"] == (T - T // 2) * (d + 2) * 4  # the norm's input and 2 statistics, fp32

# %% [markdown]
# Read the collectives with gloo in mind: it has no reduce-scatter, so torch emulates each one with an all-reduce of
# the whole tensor (the 32,768 elements) and keeps a slice. On NCCL these are real reduce-scatters of 16,384
# elements per rank, and the forward and backward each move what one all-reduce moved before. The three 128-element
# all-reduces are the partial gradients of the LayerNorm's weight and bias and of b2.
#
# The saving measured here is exactly the LayerNorm's input (and its mean and inverse deviation) for the other
# rank's tokens: small, because this block is mostly MLP, whose hidden activations tensor parallelism already
# splits, and because fc1 keeps the gathered, full-length LayerNorm output for its backward. Megatron saves that
# one in its sharded form too and all-gathers it again during backward, so every activation outside the split
# GEMMs is divided by t: leaving the attention scores aside, 34·s·b·h/t per layer instead of (10 + 24/t)·s·b·h.
#
# ## 5. Pipeline parallelism: GPipe on 2 stages
#
# **Stretch.**
# Split the model's layers into stages, one per rank: here 6 linear layers of width 1024, 3 per stage. Stage 0 sends
# its output activations to stage 1; stage 1 sends the gradient of those activations back. With the whole batch at
# once, stage 1 waits through stage 0's forward, then stage 0 waits through stage 1's forward and backward. GPipe
# cuts the batch into m **micro-batches**: stage 0 runs all m forwards, handing each micro-batch on as soon as it is
# done, so both stages work at once; then all m backwards run, last micro-batch first. Gradients accumulate over
# the micro-batches, and each micro-batch loss is divided by m, so they add up to the gradient of the mean loss
# over the whole batch.
#
# What remains idle is the **bubble**: with p stages of equal cost, each idles for p − 1 of the m + p − 1 slots of a
# step (a slot is one micro-batch's forward plus backward):
#
# $$\text{bubble} = \frac{p-1}{m+p-1}$$
#
# **Exercise 11.gpipe.** Write `gpipe_step(stage, inputs, targets, loss_fn, act_shape)` for 2 ranks: rank 0 gets its
# micro-batches in `inputs` (a list), the last rank its `targets`; `act_shape` is the shape of one micro-batch's
# activations between the stages. Use `dist.send(t, dst)` / `dist.recv(t, src)` (or `dist.isend`, which does not
# wait). Return the mean loss on the last rank, `None` elsewhere. The check compares loss and gradients with the
# whole model on the whole batch, with 4 micro-batches.

# %%
import torch
import torch.distributed as dist


def gpipe_step(stage, inputs, targets, loss_fn, act_shape):
    """One GPipe step: every micro-batch forward, then every backward; return the mean loss on the last rank."""
    ...
    ### BEGIN SOLUTION
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    m = len(inputs if first else targets)
    p = next(stage.parameters())  # received activations live where the stage does, in its dtype
    ins, outs = [], []
    for i in range(m):
        if first:
            x = inputs[i]
        else:
            x = torch.empty(act_shape, dtype=p.dtype, device=p.device)
            dist.recv(x, rank - 1)
            x.requires_grad_(True)
        y = stage(x)
        if last:
            y = loss_fn(y, targets[i]) / m
        else:
            dist.send(y.detach(), rank + 1)
        ins.append(x)
        outs.append(y)
    for i in reversed(range(m)):
        if last:
            outs[i].backward()
        else:
            grad = torch.empty_like(outs[i])
            dist.recv(grad, rank + 1)
            outs[i].backward(grad)
        if not first:
            dist.send(ins[i].grad, rank - 1)
    return float(sum(float(y) for y in outs)) if last else None
    ### END SOLUTION


check("11.gpipe", gpipe_step)

# %% [markdown]
# labkit's version sends with `isend`: a stage does not wait for its message to arrive before it starts on the next
# micro-batch (with gloo, a blocking `send` of a large tensor can wait for the receiver, and then the stages take
# turns instead of working at once):

# %% tags=["workspace-clear"]
print(inspect.getsource(handpar.gpipe_step))

# %% [markdown]
# The launch ran it with 1, 2, 4 and 8 micro-batches (batch 256), next to the whole model on the whole batch. Loss
# and gradients agree to fp32 rounding for every m, and the bytes between the stages do not depend on m: m
# micro-batches of 256/m rows each way.
# The cell also cuts section 1's MLP into two stages the pipeline way (seed 004 §6.2's "model parallelism"): no
# parameter sits on both stages, unlike section 4's split of every matrix; what passes from stage 0 to stage 1 is a
# batch of activations (8 rows × 256 here), and the two stages in a row compute exactly what the whole model does.

# %%
pp = res["pp"]
want = handpar.pipeline_p2p_bytes(pp["batch"], pp["width"])
for m, r in pp["runs"].items():
    sent = [4 * sum(c["elements"] for k, c in p2p.items() if k == "send") for p2p in r["p2p"]]
    same = r["loss_rel"] < 1e-5 and max(r["grad_rel"]) < 1e-5
    print(f"m = {m}: loss and gradients equal one process (1e-5): {same}; bytes sent by stage 0 / stage 1: "
          f"{sent[0]:,} / {sent[1]:,} (formula {want['forward']:,} / {want['backward']:,})")
    assert same and sent == [want["forward"], want["backward"]]
stages, xb = [mlp.net[:4], mlp.net[4:]], torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
h = stages[0](xb)  # section 1's MLP cut in two: what stage 0 would send to stage 1
shared = {id(p) for p in stages[0].parameters()} & {id(p) for p in stages[1].parameters()}
assert not shared and h.shape == (8, 256) and torch.equal(stages[1](h), mlp(xb))  # activations cross, not weights

# %% [markdown]
# The bubble, measured: hooks around each stage module record when its forward and backward run (instrumentation
# outside the schedule). A rank's idle share is the part of the step (first start to last end, over both ranks) in
# which that rank computed nothing; the bubble is the mean of the two ranks' idle shares, which is what the formula
# counts. The formula assumes free communication and stages of equal cost. Our real stages are not that: the two
# ranks share this machine's cores, so a stage can wait for a core as well as for the other stage. So the launch
# measured the schedule twice: with the real stages, and with stages whose work has a **fixed cost** that needs no
# core (a narrow layer, then a wait of 160 ms forward and 320 ms backward per whole batch, split over the
# micro-batches by rows; a stand-in for a GPU that runs the kernels while the CPU waits). A busy machine can only
# add idle time, so each fixed-cost bubble is the smaller of two timed steps.

# %%
# NBVAL_IGNORE_OUTPUT
fixed = pp["fixed_cost"]["bubble"]
print(f"{'m':>3}{'(p-1)/(m+p-1)':>15}{'fixed cost':>12}{'real stages':>13}{'real step (ms)':>16}")
for m, r in pp["runs"].items():
    print(f"{m:>3}{handpar.bubble_fraction(2, int(m)):>15.3f}{fixed[m]:>12.3f}{r['bubble']:>13.3f}"
          f"{1e3 * r['span_s']:>16.1f}")
gap = {m: fixed[m] - handpar.bubble_fraction(2, int(m)) for m in fixed}
worst = max(gap, key=gap.get)
print(f"fixed cost: at most {gap[worst]:+.3f} from the formula (at m = {worst}); real stages: from "
      f"{pp['runs']['1']['bubble']:.2f} at m = 1 down to {min(r['bubble'] for r in pp['runs'].values()):.2f} at best")

# %% [markdown]
# With fixed-cost stages only the schedule and the hand-offs remain. Every micro-batch is one more hand-off between
# the stages (a message, a process waking up): idle time that the formula does not count, and the reason the
# fixed-cost column can sit above the formula (the line under the table prints by how much, here). The real stages add two more effects: on a small CPU the ranks
# compete for cores, and each micro-batch is a smaller matrix product, which runs at a lower fraction of the
# machine's peak. That is the trade-off on GPUs too: a larger m shrinks the bubble, but a micro-batch too small to
# keep the GPU's matrix units busy makes every slot slower, so m is raised only while the micro-batch stays large
# enough for efficient GEMMs (and the activation memory allows it). With one micro-batch the stages cannot overlap
# at all: about half of each step is idle whatever the machine (the cells assert at least 0.45, leaving room for
# timer noise).
#
# Memory is the other side of it. GPipe runs all m forwards before the first backward, so each stage keeps the
# activations of all m micro-batches, that is of the whole batch. Here the batch is fixed (256 rows, cut into m
# pieces), so that is the same amount for every m, and the cost of a larger m is smaller matrix products and more
# messages. In practice the micro-batch size is what is fixed (by memory and GEMM efficiency) and m is raised to
# shrink the bubble: then GPipe's activation memory grows with m. The schedules that came next work on memory or on
# the bubble, and it is worth keeping the two apart:
# - **1F1B** (one forward, one backward) starts a micro-batch's backward as soon as the last stage has its forward.
#   A stage then holds at most p micro-batches' activations instead of m. Its bubble is GPipe's, (p − 1)/(m + p − 1):
#   the same idle slots, moved around.
# - **Interleaved 1F1B** gives each rank v chunks of layers (virtual stages) instead of one block. The idle time
#   shrinks by a factor v, the bubble fraction becomes (p − 1)/(v·m + p − 1), and it costs v times as many
#   point-to-point messages (Megatron also needs m to be a multiple of p).
# - **Zero-bubble** schedules split each backward into the input-gradient part (which the previous stage waits for)
#   and the weight-gradient part (which nobody waits for), and fill the idle slots with the latter.

# %%
m4 = pp["runs"]["4"]["timeline"]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.2))
ms = [int(m) for m in pp["runs"]]
ax1.plot(ms, [handpar.bubble_fraction(2, m) for m in ms], "o-", label="(p-1)/(m+p-1)")
ax1.plot(ms, [fixed[str(m)] for m in ms], "^-", label="measured, fixed-cost stages")
ax1.plot(ms, [pp["runs"][str(m)]["bubble"] for m in ms], "s--", label="measured, real stages")
ax1.set(xscale="log", xticks=ms, xticklabels=ms, xlabel="micro-batches m", ylabel="bubble fraction", ylim=(0, 1))
ax1.legend()
for rank, spans in enumerate(m4):
    for kind, t0, t1 in spans:
        ax2.barh(rank, 1e3 * (t1 - t0), left=1e3 * t0, color="tab:blue" if kind == "F" else "tab:orange", edgecolor="k")
ax2.set(yticks=[0, 1], yticklabels=["stage 0", "stage 1"], xlabel="ms (blue: forward, orange: backward)",
        title="GPipe, m = 4, as measured")
ax2.invert_yaxis()
plt.show()
first = pp["runs"]["1"]["bubble"]
assert first >= 0.45 and all(0 <= r["bubble"] < 1 for r in pp["runs"].values())
assert all(fixed[str(a)] > fixed[str(b)] for a, b in zip(ms, ms[1:]))  # more micro-batches, a smaller bubble
assert all(abs(g) < 0.1 for g in gap.values())

# %% [markdown]
# PyTorch has this built in: `torch.distributed.pipelining` (a `PipelineStage` per rank and a `ScheduleGPipe`).
# The launch ran the same 2 stages with it, 4 micro-batches, on gloo:

# %%
pl = pp["pipelining"]
if pl["works"]:
    print(f"{pl['schedule']} with {pl['micro_batches']} micro-batches works on gloo; loss and gradients equal one "
          f"process (1e-5): {pl['loss_rel'] < 1e-5 and max(pl['grad_rel']) < 1e-5}")
else:
    print("torch.distributed.pipelining failed here:", pl["error"])
assert pl["works"] and pl["loss_rel"] < 1e-5 and max(pl["grad_rel"]) < 1e-5

# %% [markdown]
# ## 6. FSDP2 beside DeepSpeed ZeRO-3
#
# **Stretch.**
# ZeRO stage 3 and PyTorch's FSDP shard the parameters too: between uses, a rank holds only its slice of every
# weight. Before a layer runs, its slices are all-gathered into the whole weight, used, and freed again; gradients
# are reduce-scattered so that each rank keeps its slice of the averaged gradient (FSDP divides by the number of
# ranks, as DDP does). FSDP2 (`torch.distributed.fsdp.fully_shard`, applied
# here to each linear layer and then to the whole model) is PyTorch's own implementation. The launch trained our MLP
# for 5 steps with FSDP2, with DeepSpeed stage 3 (fp32, torch's AdamW), and with plain AdamW in one process on the
# global batch (both ranks' rows):

# %%
fs = res["fsdp"]
f2, ds3 = fs["fsdp2"], fs["deepspeed"]
print("FSDP2 works on gloo (CPU):", f2["works"])
rel = max(abs(a - b) / b for curve in (f2["losses"], ds3["losses"]) for a, b in zip(curve, fs["reference_losses"]))
print(f"FSDP2 and DeepSpeed ZeRO-3 losses equal one process within 1e-5 (relative), every step: {rel < 1e-5}")
print("FSDP2 and DeepSpeed ZeRO-3 losses bitwise equal to each other:", f2["losses"] == ds3["losses"])
assert f2["works"] and rel < 1e-5
fig, ax = plt.subplots(figsize=(6, 3.2))
steps = range(1, fs["steps"] + 1)
ax.plot(steps, fs["reference_losses"], "k-", lw=4, alpha=0.3, label="one process, global batch")
ax.plot(steps, f2["losses"], "o-", label="FSDP2 (fully_shard)")
ax.plot(steps, ds3["losses"], "x--", label="DeepSpeed ZeRO-3")
ax.set(xlabel="step", ylabel="loss", title="Same model, same data, 2 ranks", xticks=list(steps))
ax.legend()
plt.show()

# %% [markdown]
# The bytes each rank holds (after the last backward, so the gradients exist too), against `labkit.memory`'s
# prediction for stage 3 (the whole model as one flat vector, split in two), and FSDP2's own rule (below):

# %%
pred3 = memory.model_state_bytes(n_params, "fp32", "adamw", stage=3, world_size=2).device
print(f"{'':22}{'params':>9}{'grads':>9}{'master':>9}{'optimizer':>11}")
print(f"{'labkit.memory':<22}{pred3['params']:>9,}{pred3['grads']:>9,}{'-':>9}{pred3['optimizer']:>11,}")
for rank in (0, 1):
    b = ds3["bytes"][rank]
    print(f"{f'DeepSpeed-3 rank {rank}':<22}{b['params']:>9,}{b['grads']:>9,}{b['master']:>9,}{b['optimizer']:>11,}")
for rank in (0, 1):
    b = f2["bytes"][rank]
    print(f"{f'FSDP2 rank {rank}':<22}{b['params']:>9,}{b['grads']:>9,}{'-':>9}{b['optimizer']:>11,}")
print("FSDP2 local shards on rank 1:", f2["bytes"][1]["shards"])
assert all({k: b[k] for k in ("params", "grads", "optimizer")} == {k: pred3[k] for k in ("params", "grads", "optimizer")}
           for b in ds3["bytes"])
shapes = [tuple(p.shape) for p in mlp.parameters()]
dim0_rule = sum(-(-s[0] // 2) * (s[1] if len(s) > 1 else 1) for s in shapes)  # ceil(rows / 2) x columns
print(f"FSDP2 storage per rank by the dim-0 rule: {dim0_rule:,} elements = {4 * dim0_rule:,} bytes")
assert all(b["params"] == b["grads"] == 4 * dim0_rule for b in f2["bytes"])
assert f2["bytes"][0]["optimizer"] - f2["bytes"][1]["optimizer"] == 8 * (256 + 1)  # rank 1: no states for the empty row

# %% [markdown]
# DeepSpeed pads each parameter to a multiple of the world size and splits it flat: 74,241 elements per rank, as
# predicted. Even in fp32 it also keeps a separate fp32 copy of its slice (`master`), which the optimizer updates.
# FSDP2 splits every tensor along its **first dimension** and pads that dimension: the last layer's 1 × 256 weight
# and its one-element bias cannot be split, so rank 0 holds them whole and rank 1 a padded, empty row. Its
# parameters and gradients take 74,369 elements' storage on both ranks (the rule, checked above), its AdamW states
# only the real elements. FSDP2 in fp32 keeps no master copy: AdamW steps the shards in place.
#
# And what they send per step (profiler, rank 0; an all-gather's size is this rank's piece, the gathered tensor is
# twice that; on gloo a reduce-scatter appears as an all-reduce of the whole tensor):

# %%
for who, c in (("FSDP2", f2["collectives"]), ("DeepSpeed-3", ds3["collectives"])):
    ag, ar = c["all_gather"], c.get("reduce_scatter") or c["all_reduce"]  # NCCL's reduce-scatter, or gloo's emulation
    print(f"{who:<12} all-gather: {ag['calls']} calls, {2 * ag['elements']:,} elements gathered | "
          f"reduce: {ar['calls']} calls, {ar['elements']:,} elements")
gathered = {who: 2 * c["all_gather"]["elements"] / n_params for who, c in (("fsdp2", f2["collectives"]),
                                                                             ("ds3", ds3["collectives"]))}
print(f"parameters gathered per step, in units of the model size Ψ: FSDP2 {gathered['fsdp2']:.3f}, "
      f"DeepSpeed-3 {gathered['ds3']:.3f}")
assert round(gathered["fsdp2"], 2) == 2.0 and round(gathered["ds3"], 2) == 1.0

# %% [markdown]
# FSDP2 gathers every layer twice, for forward and again for backward (`reshard_after_forward=True`, its
# default, frees the gathered weights after forward): 2Ψ gathered + Ψ reduce-scattered = **3Ψ** per step, the ZeRO-3
# figure of notebook 10. DeepSpeed gathered only once: by default it keeps gathered parameters that will be used
# again soon (`stage3_max_reuse_distance`, 10⁹ parameters, far more than this model), so backward reuses forward's
# copies: 2Ψ, at the price of holding the whole model during the step. Both knobs trade memory for messages; FSDP2's
# is `reshard_after_forward=False`.
#
# **Accumulation and mixed precision with FSDP2.** The launch made two more FSDP2 runs. One accumulates 2
# micro-batches with `model.set_requires_gradient_sync(False)` before the first (FSDP2's `no_sync()`) and looks after
# each micro-batch at what was sent and what gradients are held. The other trains with
# `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`:

# %%
acc, mp = fs["fsdp2_accumulation"], fs["fsdp2_mixed"]
for i, m in enumerate(acc["per_micro"], 1):
    c = m["collectives"]
    print(f"micro-batch {i}: gathered {2 * c['all_gather']['elements'] / n_params:.2f}Ψ, reduced "
          f"{c.get('all_reduce', {}).get('elements', 0) / n_params:.2f}Ψ; gradients held: whole "
          f"{m['unsharded_grad_bytes']:,} B, sharded {m['sharded_grad_bytes']:,} B")
b, b32 = mp["bytes"][0], f2["bytes"][0]
print(f"bf16 policy: layers compute in {mp['compute_dtypes']}; rank 0 holds {b['dtypes']} parameters "
      f"{b['params']:,} B, {b['grad_dtypes']} gradients {b['grads']:,} B, AdamW {b['optimizer']:,} B "
      f"(fp32 run: {b32['params']:,} / {b32['grads']:,} / {b32['optimizer']:,} B)")
first, second = acc["per_micro"]
assert "all_reduce" not in first["collectives"] and first["unsharded_grad_bytes"] == 4 * n_params
assert second["unsharded_grad_bytes"] == 0 and second["sharded_grad_bytes"] == f2["bytes"][0]["grads"]
assert mp["compute_dtypes"] == ["bfloat16"] and all(
    {k: x[k] for k in ("params", "grads", "optimizer")} == {k: y[k] for k in ("params", "grads", "optimizer")}
    for x, y in zip(mp["bytes"], f2["bytes"]))

# %% [markdown]
# Without gradient sync FSDP2 behaves like DDP under `no_sync()`: no reduce-scatter until the last micro-batch. It
# still gathers every layer twice per micro-batch, so a step of k micro-batches moves (2k + 1)Ψ (notebook 10's
# table), and between micro-batches each rank keeps the **whole** model's gradients in fp32, here 4 bytes × Ψ, N
# times the sharded gradients on N ranks: the memory sharding was meant to save. Leaving sync on keeps the
# gradients sharded and pays a reduce-scatter per micro-batch instead, ZeRO-2's choice.
#
# With the bf16 policy FSDP2 keeps its shards in fp32 (they *are* the master weights) and casts them to bf16 when it
# gathers them: the all-gathers carry bf16, half the bytes of the fp32 run for the same elements (FSDP2's documented
# behaviour: `param_dtype` is the dtype of the unsharded parameter and of the parameter all-gather), and the layers
# compute in bf16 (measured above: they saw bf16 weights). Gradients are reduced in `reduce_dtype` (fp32) into fp32
# shards. What a rank holds between uses is therefore byte for byte the fp32 run's, 4 + 4 + 8 = 16 bytes per parameter
# over N (asserted). DeepSpeed ZeRO-3 in bf16
# (notebook 10) also comes to 16/N, split differently: bf16 weight and gradient shards (2 + 2) plus an fp32 master
# copy and Adam's moments (12). Mixed precision saves activation memory, bandwidth and time, not model-state bytes.
#
# **Checkpoints of a sharded model.** No rank holds the whole model, so `torch.save(model.state_dict())` on rank 0
# would save one shard (or first gather everything into one rank's memory). Each library has its own answer:
# - FSDP2 uses **`torch.distributed.checkpoint`** (DCP): `dcp.save({"model": model.state_dict()}, checkpoint_id=dir)`
#   has every rank write its own shards, in parallel, plus one metadata file; `dcp.load` reads them back into any
#   layout, a different number of ranks or no sharding at all (`get_state_dict`/`set_state_dict` from
#   `torch.distributed.checkpoint.state_dict` add the optimizer).
# - DeepSpeed's `engine.save_checkpoint(dir)` writes each rank's partitions of the fp32 weights and optimizer states.
#   To get one ordinary fp32 state dict out, offline and without GPUs, use `zero_to_fp32.py`, which DeepSpeed puts
#   next to the checkpoint, or `deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(dir)`.
#
# The launch did both after training: FSDP2's shards loaded by DCP into a plain, unsharded MLP, and DeepSpeed's
# ZeRO-3 checkpoint merged by `zero_to_fp32`, each compared with the trained weights:

# %%
ck, z2f = f2["dcp"], ds3["zero_to_fp32"]
print(f"DCP: files {ck['files']}; loaded into an unsharded MLP, equal to FSDP2's full weights on each rank: "
      f"{ck['equal']}")
print(f"zero_to_fp32: from {len(z2f['files'])} partition files, {z2f['keys']} tensors in {z2f['dtypes']}, equal to the "
      f"engine's gathered weights: {z2f['equal']}")
assert ck["works"] and ck["equal"] == [True, True] and z2f["works"] and z2f["equal"]

# %% [markdown]
# **Across nodes: HSDP and ZeRO++.** FSDP and ZeRO-3 gather every layer's weights from all n ranks, twice per
# micro-batch, on the critical path. Inside a node that runs over NVLink; across nodes every gather waits on the
# slower network. Two remedies:
# - **HSDP** (hybrid sharding; in FSDP2, `fully_shard(..., mesh=...)` with a 2-D mesh of (replicate, shard)
#   dimensions) shards inside a group of g GPUs, usually a node, and replicates across groups. The per-layer
#   gathers stay inside the node; only gradients cross nodes: after the reduce-scatter inside the node, each rank
#   all-reduces its 1/g shard with the ranks that hold the same shard in the other nodes, DDP-style. Model states
#   are then divided by g, not by n.
# - **ZeRO++** (DeepSpeed) keeps full sharding and makes the cross-node traffic cheaper: quantised weight
#   all-gathers (qwZ, `zero_quantized_weights`: int8, half the bytes of bf16), a secondary copy of the weights
#   sharded only inside each node so that backward's gathers stay there (hpZ, `zero_hpz_partition_size`: costs
#   that copy's memory), and quantised gradient reduction through all-to-all (qgZ, `zero_quantized_gradients`).
#
# **What works on CPU/gloo with this torch**, as run above: FSDP2 (`fully_shard`, with `MixedPrecisionPolicy` and
# without gradient sync), `torch.distributed.pipelining`
# (`ScheduleGPipe`), DeepSpeed stages 1 and 3, and every collective used here. What gloo lacks is a native
# reduce-scatter: torch emulates it with an all-reduce, which sends twice the bytes a ring reduce-scatter would. That
# changes the speed, not the results.
#
# ## 7. Which strategy, when
#
# If you skipped the stretch sections 4-6, what this section needs from them, in three lines: **tensor
# parallelism** splits every weight matrix of a block over the ranks (Megatron's MLP: one all-reduce forward and
# one backward per block); **pipeline parallelism** gives each rank a run of layers (a stage) and streams
# micro-batches through them, leaving each stage idle for a *bubble* of (p−1)/(m+p−1) of the step with p stages and
# m micro-batches (GPipe; 1F1B reorders the same work so that a stage holds at most p micro-batches' activations
# instead of m); **FSDP / ZeRO-3** shards the weights too and all-gathers each layer just before it runs.
#
# Ψ is the parameter count, n the number of ranks, b·s·d the activations at a layer boundary (tokens × width). The
# volumes are the collectives' payloads per step; a ring all-reduce moves 2(n−1)/n of its payload through every
# rank, an all-gather or a reduce-scatter (n−1)/n.
#
# | strategy | each rank holds | communicates per step: payload (ring traffic per rank) | use it when |
# |---|---|---|---|
# | DDP | the whole model, gradients and optimizer states | all-reduce of the gradients: Ψ (≈ 2Ψ), overlapped with backward | the model states fit on one GPU |
# | ZeRO-1 | the whole model and gradients; 1/n of the optimizer states | reduce-scatter Ψ + all-gather Ψ (≈ 2Ψ, as DDP) | the optimizer states do not fit (ZeRO-2: also shard the gradients, same traffic per micro-batch, but it reduces on every micro-batch: notebook 10) |
# | FSDP / ZeRO-3 | 1/n of everything; one layer whole while it runs | all-gather 2Ψ (forward and backward) + reduce-scatter Ψ (≈ 3Ψ) | even the weights do not fit; any number of nodes |
# | tensor (Megatron) | 1/n of every weight matrix | per MLP block: all-reduce of b·s·d forward and of b·s·d backward (≈ 4 b·s·d), in the critical path | one layer is too big or too slow; inside a node (NVLink) |
# | pipeline (GPipe) | 1/n of the layers | per stage boundary: b·s·d forward + b·s·d backward, point to point; plus a bubble | the model is too deep for a node; across nodes |
#
# The same formulas against what the profiler counted in this notebook's launch (elements per step, rank 0; Ψ
# padded where the sharding pads it):

# %%
f2c, psi_pad, fsdp_pad = f2["collectives"], z["padded"], 2 * dim0_rule  # DeepSpeed's flat padding; FSDP2's dim-0 one
sent = {k: sum(c["elements"] for op, c in p.items() if op == "send") for k, p in enumerate(pp["runs"]["4"]["p2p"])}
table = [  # strategy, measured, formula
    ("DDP", ddp["collectives"]["ddp"]["all_reduce"]["elements"], n_params),
    ("ZeRO-1", rs["elements"] + 2 * z["collectives"]["all_gather"]["elements"], 2 * psi_pad),
    ("FSDP2", 2 * f2c["all_gather"]["elements"] + (f2c.get("reduce_scatter") or f2c["all_reduce"])["elements"], 3 * fsdp_pad),
    ("tensor", sum(tp["ranks"][0][k]["all_reduce"]["elements"] for k in ("forward", "backward")), 2 * tp["tokens"] * tp["d_model"]),
    ("pipeline", sent[0] + sent[1], 2 * pp["batch"] * pp["width"]),
]
for name, got, formula in table:
    print(f"{name:<9} measured {got:>9,}   formula {formula:>9,}")
assert all(got == formula for _, got, formula in table)

# %% [markdown]
# **Each strategy's loop, whole.** The pieces above come together in a training loop of about ten lines per
# strategy, with nothing in it but the training. The launch ran each one and checked it against the real thing in
# a wrapper (`labkit.recipes.handpar`): DDP by hand against torch DDP and ZeRO-1 by hand against AdamW (bit for bit,
# from each rank's own initial weights), the sequence-parallel block and GPipe against the same model trained in
# one process:

# %%
for loop in (handpar.train_ddp, handpar.train_zero1, handpar.train_sequence_parallel, handpar.train_gpipe):
    src = inspect.getsource(loop)
    print(src[:src.index('    """')] + src[src.index('"""', src.index('    """') + 7) + 4:])  # without the docstring
checks = {"DDP": ddp["loop_bitwise_vs_ddp"], "ZeRO-1": z["loop_bitwise_vs_adamw"],
          "TP + SP (within 1e-5)": [r < 1e-5 for r in tp["loop_rel"]], "GPipe (within 1e-5)": [r < 1e-5 for r in pp["loop_rel"]]}
print("each loop equals the real thing, rank 0 and rank 1:", checks)
assert all(v == [True, True] for v in checks.values())

# %% [markdown]
# ### Sizing a real run: 3D parallelism
#
# How they combine in practice ("3D parallelism"): tensor parallel inside a node, where NVLink makes its per-layer
# collectives affordable; pipeline parallel across groups of nodes, where only activations at a few boundaries
# cross the slower network; data parallel, usually with ZeRO-1 or FSDP, over everything else. Context parallelism
# (splitting a long sequence over ranks that exchange keys and values for attention) is a fourth dimension; it needs
# attention, which our MLPs do not have, and is not run here.
#
# `labkit.sizing` does the arithmetic for a GPT-style model: model states from `labkit.memory` (ZeRO over the
# data-parallel group), activations from Korthikanti et al. (2022) with tensor and sequence parallelism and selective
# recomputation, 1F1B's live micro-batches, and the bubble. A GPT-style model with Llama-2-70B's depth, width and
# sequence (80 layers, width 8192, 64 heads, 4096 tokens; 65 billion parameters by the GPT count, since it keeps a
# 4h GELU MLP and full multi-head attention) on 64 GPUs of 80 GB, global batch 1024 sequences, ZeRO-1 in
# DeepSpeed's layout (bf16 weights and gradients whole; the fp32 gradient partition, master weights and Adam states
# sharded: 20 bytes per parameter before sharding), one sequence per micro-batch:

# %%
plans = sizing.search_plans(64, 80 * memory.GB, model="70B")
best = plans[0]
print(best)
print("\nother layouts that fit (tp x pp x dp: GB per GPU, bubble):",
      ", ".join(f"{p.tp}x{p.pp}x{p.dp}: {p.total_bytes / memory.GB:.1f}, {p.bubble:.1%}" for p in plans[1:]))
for recompute in ("selective", "full"):
    dp64 = sizing.plan_3d(64, 80 * memory.GB, 1, 1, 64, model="70B", zero=3, recompute=recompute)
    print(f"pure data parallel, ZeRO-3 over 64, {recompute} recomputation: model states "
          f"{dp64.model_state_bytes / memory.GB:.1f} GB, activations {dp64.activation_bytes / memory.GB:.1f} GB, "
          f"total {dp64.total_bytes / memory.GB:.1f} GB: fits = {dp64.fits}")
    assert dp64.fits == (recompute == "full")
megatron = best.params_per_gpu * (2 + 4 + 12 / best.dp)  # bf16 weights, a whole fp32 main_grad, 12 B sharded
print(f"Megatron-LM's layout instead (gradients accumulated in a whole fp32 buffer): model states "
      f"{megatron / memory.GB:.1f} GB, total {(best.total_bytes - best.model_state_bytes + megatron) / memory.GB:.1f} GB")
states = memory.model_state_bytes(best.params_per_gpu, best.policy, "adam", stage=1, world_size=best.dp)
assert best.model_state_bytes == states.device_total and best.fits
s_len, width = 4096, 8192  # Korthikanti et al., sequence-parallel and selective: 34·s·b·h / t bytes per layer
assert best.act_per_layer == s_len * 1 * width * 34 // best.tp and best.activation_bytes == (
    best.layers_per_stage * best.act_per_layer * best.live_micro_batches)

# %% [markdown]
# Read the winner from the bottom up. Pure data parallelism fits only with full recomputation: with every model state
# sharded 64 ways (ZeRO-3), each GPU still holds all 80 layers' activations for its sequence, unless it keeps only
# each layer's input and recomputes the rest in backward (about a third more compute), and its per-layer gathers of
# ZeRO-3 then cross the network between nodes for every micro-batch. Tensor parallelism of 8, inside
# a node, with sequence parallelism divides both the weights and the activations by 8, and ZeRO-1 over the 8
# data-parallel replicas divides the optimizer states further. Pipeline parallelism would divide the weights too,
# but not the activations of its first stage: under 1F1B that stage holds L/pp layers for up to pp micro-batches in
# flight, L layers' worth, the same as without a pipeline. It adds a bubble (small here, with hundreds of
# micro-batches per step) and point-to-point messages, so the calculator prefers the smallest model-parallel degree
# that fits. The numbers are estimates for planning: leave room for the CUDA context, communication
# buffers, fragmentation and the logits (`reserve_bytes`), and measure the first steps.
#
# **What this notebook leaves out**, for the next step on real GPUs:
# - Memory is measured here after backward; the peak is often inside `optimizer.step()` (DeepSpeed ZeRO-1/2
#   allocate an fp32 gradient partition there). Plan with `torch.cuda.max_memory_allocated`, not a snapshot.
# - FSDP2's prefetching (forward and backward) and `set_reshard_after_backward(False)` with accumulation, and
#   DeepSpeed's `stage3_prefetch_bucket_size`, take gathers off the critical path at the price of memory.
# - DDP's knobs: `bucket_cap_mb`, `gradient_as_bucket_view=True` (no second copy of the gradients), `static_graph`,
#   and communication hooks such as `bf16_compress_hook`.
# - A loss averaged per rank is the global per-token mean only when every rank sees the same number of tokens
#   (padding breaks it); sum and divide by the all-reduced count instead.
# - Megatron's overlap of tensor-parallel communication needs `CUDA_DEVICE_MAX_CONNECTIONS=1`, and a pipeline with
#   tied input and output embeddings needs an extra all-reduce between its first and last stage.
#
# ## Summary
#
# - DDP by hand starts with a broadcast of rank 0's weights (step 0), then all-reduces scaled gradients. Hooks
#   start each all-reduce as soon as its gradient exists, so communication overlaps backward; buckets send fewer,
#   larger messages, and a parameter without a gradient must raise, not leave a bucket unsent. All three equal
#   torch DDP bit for bit, because they scale by 1/world before summing as DDP does and, with 2 ranks, halving and
#   a two-term sum are exact; with 3 ranks bitwise equality also needs DDP's bucket layout.
# - ZeRO-1 is reduce-scatter, a local AdamW step on 1/n of the parameters, and all-gather: bit for bit the same
#   weights as AdamW, with 1/n of the states (here 593,936 bytes per rank: by hand, `labkit.memory` and DeepSpeed
#   agree). It saves memory only if nothing is held twice: parameters and gradients as views into flat buffers.
#   Clipping sharded gradients needs the global norm: one all-reduce of the shards' sums of squares.
# - Megatron's MLP needs one all-reduce forward (g) and one backward (f) per block, of activations, in the critical
#   path; forgetting f's backward all-reduce leaves the input with half a gradient and no error message. Sequence
#   parallelism turns f and g into an all-gather and a reduce-scatter (the same bytes on a ring) so that LayerNorm,
#   dropout and the residual run on 1/t of the tokens; their replicated parameters then need their gradients summed.
# - GPipe trades a bubble of (p − 1)/(m + p − 1) for splitting the layers; more micro-batches shrink it, while the
#   bytes between stages stay the same; at a fixed micro-batch size the activations GPipe holds grow with m. 1F1B
#   keeps the bubble and bounds the activations to p micro-batches; interleaving and zero-bubble schedules shrink
#   the bubble itself.
# - FSDP2 and DeepSpeed ZeRO-3 train the same curve; they differ in how they split tensors (first dimension vs flat)
#   and in whether backward gathers the weights again. FSDP2 without gradient sync accumulates whole gradients (its
#   memory saving gone until the last micro-batch); its bf16 policy keeps fp32 shards and gathers bf16 copies.
#   Sharded models are saved by every rank (DCP; DeepSpeed's partitions, merged offline by `zero_to_fp32`); HSDP and
#   ZeRO++ keep the per-layer gathers off the slow network between nodes.
# - Every strategy's loop is ten lines of ordinary training; what differs is where the collectives hide. Sizing a
#   real run (`labkit.sizing`) is the same memory model with tensor, pipeline and data degrees: 70B on 64 × 80 GB
#   fits with tensor parallelism 8 inside each node and ZeRO-1 across nodes; data parallelism alone needs ZeRO-3 and
#   full recomputation.
#
# Next, notebook 12 takes the multi-rank recipes to a cluster with Slurm.
