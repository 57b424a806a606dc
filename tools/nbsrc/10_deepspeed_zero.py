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

# %%
# %matplotlib inline
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
# counts one micro-batch per optimizer step; section 2 measures what gradient accumulation changes. **Offload** (ZeRO-Offload) goes
# further: the optimizer side lives in CPU RAM, and the optimizer step runs on the CPU.
#
# Our model is the tiny GPT of notebook 04. Here is what `labkit.memory` predicts per rank for 2 ranks:

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

# %%
cfg = zero.config(2, "bf16", micro_batch=8, grad_accum=2, world_size=2, reduce_bucket_size=32768)
print(zero.explain(cfg))

# %% [markdown]
# An inconsistent batch is caught with a message that says what to change, before DeepSpeed starts (DeepSpeed's
# own check also explains itself, but only from inside `deepspeed.initialize`, after the process group is up):

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
# it clips, unscales, steps the optimizer, gathers the new weights (stages 1 and 2) and clears the gradients. The
# recipe's instrumentation (`watch`, `between`) records the collectives and counts the bytes; it changes no number
# (the profiler slows the last step).

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

# %%
bf16_runs = [runs[(s, "none", "bf16")] for s in range(4)]
for r in bf16_runs:
    same = r["checksums"][0] == r["checksums"][1]
    print(f"ZeRO-{r['stage']}: {r['optimizer']:<30} ranks identical: {same}")
    assert same and r["param_sums"][0] == r["param_sums"][1]

# %% [markdown]
# The losses are the same across stages, to bf16 rounding. ZeRO changes *where* the states live, not the
# arithmetic. (The differences come from summing bf16 gradients in different orders and buckets.)

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
# Per micro-batch of a step of k, in the ring units of the table above (Ψ per reduce-scatter or all-gather, 2Ψ per
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
# | `loss_scale_window` | `growth_interval` | the scale doubles every `window` clean steps; after an overflow (and at the start) on clean step window+1 (GradScaler: on clean step `growth_interval`) |
# | `hysteresis: h` | (always 1) | the h-th overflow halves the scale, h−1 are tolerated; every overflowing step is skipped; refilled only when the scale grows (unless `consecutive_hysteresis`) |
# | `min_loss_scale` | (none) | a floor; DeepSpeed stops if it overflows there |
#
# The fp16 run (section 3's, where DeepSpeed accepts fp16 here; otherwise the recording of the same run) starts
# deliberately too high (2**21), with window 2 and hysteresis 1, so the trace shows both directions. Whether it ran
# on this machine came from the device gate and from DeepSpeed, never from an assumption:

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

# %%
# NBVAL_IGNORE_OUTPUT
source = "this machine" if fp is not None else "stored example, " + zero.RECORDED_FP16_RUN["recorded_on"]
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
# memory, not step time, is what stops a run; a model that fits without it usually trains faster without it. The node's CPU RAM is where the two host figures above differ. The steady state is DeepSpeed 0.19.8's host layout, which section 5 measured and
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
