# %% [markdown]
# # 13 · Troubleshooting clinic: broken training runs to diagnose and fix
#
# **Objectives**
# - work through a failed run the way the seed articles recommend: read the symptom as it appears (a log, a loss
#   curve, a memory trace, a profiler table, an error), find the evidence that separates the candidate causes,
#   then change one thing and check that the symptom is gone;
# - recognise twelve failures that cost real training time: clipping before `unscale_`, fp16 without loss scaling,
#   an fp16 softmax overflow, a scaler missing from a checkpoint, a GradScaler under bf16, a loss kept with its
#   graph, a starved data loader, runs that do not reproduce, a failed rendezvous, a collective called by one rank,
#   a DeepSpeed batch that does not multiply out, and an unscaled learning rate;
# - use the tools that make the evidence: `labkit.debug.first_nonfinite`, `torch.profiler`,
#   `TORCH_DISTRIBUTED_DEBUG=DETAIL`, process-group timeouts, DeepSpeed's own messages, checksums of weights.
#
# **Prerequisites:** notebooks 03 and 04 (loss scaling, AMP), 06 (memory), 07 (profiling), 09 (DDP) and 10
# (DeepSpeed).
#
# **Estimated time:** 115 min
#
# Every case is a small training script in `labkit.clinic.cases` that goes wrong for a real reason, run as its own
# process (or as 2 gloo ranks under `torchrun`, through `labkit.dist.launch`). Nothing is mocked: the symptoms
# below are what the scripts printed when this notebook ran. The scripts run on the CPU, so that each takes
# seconds; on a GPU node the same mistakes fail the same way, with other numbers (case 3 says where CUDA autocast
# differs).

# %%
# %matplotlib inline
import math
import re

import matplotlib.pyplot as plt

from labkit import clinic, plots
from labkit.check import check, predict, reveal
from labkit.exercises.nb13 import lr_outcome

# %% [markdown]
# ## How a visit works
#
# Each case has the same four steps:
#
# 1. **The script.** Read the code that ran, and its settings (`CONFIG`), printed from the script itself.
# 2. **The symptom.** Read what the run printed, as you would in a job's log.
# 3. **The cause.** Pick it from four candidates (`clinic.causes(case)`): each wrong one is ruled out by something in
#    the evidence, and the checker says what.
# 4. **The fix.** Change *one* setting of the script's `CONFIG`: `fix = {"setting": value}`. The checker runs the
#    case again with `clinic.run_case(case, fix=fix)` and asks the case's detector whether the symptom is gone.
#
# The seed articles' rule applies throughout: measure first, change one variable at a time, and check the result
# against a measurement, not a feeling. All twelve broken runs are made now, in about a minute: the one-process
# cases one after the other in a single Python process (each is still its own script; they share only the start-up
# of Python and torch), each 2-rank case under `torchrun`, two of these jobs at a time.

# %%
for c in clinic.CASES.values():
    print(f"{c.number:2d}  {c.key:<12} {'2 ranks' if c.nproc == 2 else '1 process':<10} {c.title}")
broken = {r.key: r for r in clinic.run_cases(list(clinic.CASES), parallel=2)}
print("symptom present in every broken run:", all(r.symptom for r in broken.values()))
assert all(r.symptom for r in broken.values())

# %% [markdown]
# ## Part A · Numbers: mixed precision that goes wrong
#
# ### Case 1 · Gradient clipping before `unscale_`
#
# fp16 autocast with a `GradScaler`, plain SGD, gradients clipped to a norm of 1.0. It is notebook 04's recipe with
# two lines in another order. The loop:

# %%
print(clinic.source("clip"))
print("\n" + clinic.causes("clip"))

# %%
# NBVAL_IGNORE_OUTPUT
run = broken["clip"]
print("\n".join(run.lines(last=3)))
plots.loss_curves({"loss on the whole data set": run.result["loss"]}, title="Case 1: the loss does not move")
plt.show()
assert run.symptom and min(run.result["clip_saw"]) > 1000 and run.result["loss"][-1] > 0.9 * run.result["loss"][0]

# %%
cause = ...  # a letter from the list above
fix = ...    # a dict of one CONFIG setting, e.g. {"lr": 0.1}
### BEGIN SOLUTION
cause = "b"
fix = {"unscale_first": True}
### END SOLUTION
check("13.clip-cause", cause)
check("13.clip-fix", fix)

# %% [markdown]
# After `scaler.scale(loss).backward()` every gradient is 65536 times its true size until `unscale_` divides it
# back. Anything that *reads* gradients (clipping, a norm you log, a check for NaN) belongs after `unscale_`.
#
# ### Case 2 · fp16 without a loss scaler
#
# A small MLP predicts a 256-sample signal whose values are about 1e-4 (the data are in the wrong unit), under fp16
# autocast, with SGD. The last layer starts at zero, as output layers often do.

# %%
print(clinic.source("noscale"))
print("\n" + clinic.causes("noscale"))

# %%
# NBVAL_IGNORE_OUTPUT
run = broken["noscale"]
print("\n".join(run.lines()[:3] + ["..."] + run.lines(last=1)))
assert run.symptom and all(z == 1.0 for z in run.result["zero_grads"]) and len(set(run.result["loss"])) == 1

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
fix = {"loss_scaling": True}
### END SOLUTION
check("13.noscale-cause", cause)
check("13.noscale-fix", fix)

# %% [markdown]
# "Exactly 0" is the tell: rounding makes values wrong, underflow makes them vanish. Loss scaling (notebook 03) or
# bf16, whose exponent range is fp32's, brings them back.
#
# ### Case 3 · A softmax that overflows in fp16
#
# Fine-tuning notebook 04's tiny GPT, whose attention softmax is written by hand, from a checkpoint of a long run
# (large attention logits are a known effect of long training). The loss is NaN from the first step. Where does
# the first NaN appear? `labkit.debug.first_nonfinite` (notebook 03) hooks every module and reports the first one
# whose output is not finite, and whether its inputs still were.

# %%
print(clinic.source("softmax"))
print("\n" + clinic.causes("softmax"))

# %%
# NBVAL_IGNORE_OUTPUT
run = broken["softmax"]
print("\n".join(run.lines("step")[-2:] + run.lines("first_nonfinite") + run.lines("largest |attention")))
assert run.symptom and run.result["first_nonfinite"] == "blocks.0.attn.proj"
assert run.result["scores_absmax"][0] > math.log(65504)  # exp overflows fp16 above log(65504) = 11.09

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "d"
fix = {"softmax": "fp32"}
### END SOLUTION
check("13.softmax-cause", cause)
check("13.softmax-fix", fix)

# %% [markdown]
# CPU autocast runs `exp` in the input's dtype (notebook 04). CUDA autocast would run this `exp` in fp32 and hide
# the bug, but a model cast to fp16 (`model.half()`), a fused fp16 kernel or an fp16 inference engine does not: the
# seed article's custom attention blew up on GPUs. Keep reductions and `exp` in fp32 (an *fp32 island*), or subtract
# the maximum first.
#
# ### Case 4 · The scaler missing from the checkpoint
#
# An fp16 run on unnormalised targets is stopped at step 15, checkpointed, and resumed by a new job. For
# comparison the script first trains the same 30 steps without a break. The checkpoint code:

# %%
print(clinic.source("scaler-ckpt"))
print("\n" + clinic.causes("scaler-ckpt"))

# %%
# NBVAL_IGNORE_OUTPUT
run = broken["scaler-ckpt"]
r, at = run.result, run.result["config"]["resume_at"]
print("\n".join(run.lines(last=3)))
plots.scale_history(r["resumed"]["scale"], r["resumed"]["skipped"], title="Case 4: the loss scale of the resumed run")
plt.show()
assert run.symptom and r["resumed"]["scale"][at] == 65536 > r["reference"]["scale"][at]

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
fix = {"save_scaler": True}
### END SOLUTION
check("13.scaler-ckpt-cause", cause)
check("13.scaler-ckpt-fix", fix)

# %% [markdown]
# A checkpoint is everything the next step depends on: weights, optimizer state, the step, the scaler, and the
# RNG and data position when they matter. The test of a checkpoint is the one the script makes: resumed and
# uninterrupted runs must end with the same bits.
#
# ### Case 5 · A GradScaler with bf16: "why is my scale stuck at 65536?"
#
# An fp16 recipe switched to bf16 by changing the autocast dtype. The scale printed in the log never moves.

# %%
print(clinic.source("bf16-scaler"))
print("\n" + clinic.causes("bf16-scaler"))

# %%
# NBVAL_IGNORE_OUTPUT
run = broken["bf16-scaler"]
print("\n".join(run.lines(last=2)))
r = run.result
assert run.symptom and set(r["scale"]) == {65536.0} and not any(r["skipped"])
assert max(r["max_scaled_grad"]) < r["format_max"] / 1e30  # nowhere near bf16's largest value

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "b"
fix = {"grad_scaler": False}
### END SOLUTION
check("13.bf16-scaler-cause", cause)
check("13.bf16-scaler-fix", fix)

# %% [markdown]
# ## Part B · Memory and speed
#
# ### Case 6 · A loss kept with its graph
#
# A training loop that also measures a validation loss after every step, for the log. The process's memory (RSS,
# what `top`, `htop` or Slurm's accounting show) grows by a few MiB with every step. The script also measures,
# exactly, the bytes the autograd graph behind `val_total` still holds (`labkit.memory.graph_saved_bytes`,
# notebook 06).

# %%
print(clinic.source("graph"))
print("\n" + clinic.causes("graph"))

# %%
# NBVAL_IGNORE_OUTPUT
run = broken["graph"]
print("\n".join(run.lines()[:2] + ["..."] + run.lines(last=1)))
fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(run.result["rss_mb"], "o-", label="process RSS (MiB)")
ax.plot(run.result["graph_mb"], "s-", label="held by the graph of val_total (MiB)")
ax.set(xlabel="step", title="Case 6: memory that grows step after step")
ax.legend()
plt.show()
assert run.symptom and all(b > a for a, b in zip(run.result["graph_mb"], run.result["graph_mb"][1:]))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
fix = {"log_with_item": True}
### END SOLUTION
check("13.graph-cause", cause)
check("13.graph-fix", fix)

# %% [markdown]
# RSS is what the job's memory limit sees, but it is a rough measure (the allocator keeps freed memory); the exact
# count of what a tensor keeps alive is what tells the cause. On a GPU, `torch.cuda.memory_allocated()` gives the
# exact figure; a real model's activations are far larger, and the same leak ends in an out-of-memory error.
#
# ### Case 7 · Data loading starves compute
#
# Each record is read from slow shared storage (about 1 ms, nearly all of it waiting on the file system). The
# profiler (notebook 07) shows where each step goes. The data loader:

# %%
print(clinic.source("loader"))
print("\n" + clinic.causes("loader"))

# %%
# NBVAL_IGNORE_OUTPUT
run = broken["loader"]
print(run.result["table"])
print(run.lines(last=1)[0])
assert run.symptom and "DataLoader" in run.result["table"].splitlines()[3]  # the top row of the table

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "b"
fix = {"num_workers": 4}
### END SOLUTION
check("13.loader-cause", cause)
check("13.loader-fix", fix)

# %% [markdown]
# The checker's test is relative: a step may wait in `next(loader)` at most half of what reading its batch took
# (each record reports its read time, wherever it was read), so it holds on a fast disk and a slow one, and on a
# busy machine. How much faster is a step once the batches are read ahead? The reference fix, measured on this
# machine (the ratio of the median step times of the two runs, each profiled after its warm-up steps):

# %%
# NBVAL_IGNORE_OUTPUT
fixed = clinic.run_case("loader", fix=clinic.CASES["loader"].fix)
speedup = run.result["step_s"] / fixed.result["step_s"]
print(f"waiting for data: {run.result['wait_share']:.0%} of the time before, {fixed.result['wait_share']:.0%} after;"
      f" median step {run.result['step_s'] * 1e3:.1f} -> {fixed.result['step_s'] * 1e3:.1f} ms: {speedup:.1f}x")
assert not fixed.symptom and speedup > 1.0

# %% [markdown]
# DataLoader warns when `num_workers` exceeds the cores it can use (it does where fewer than 4 are available): the
# warning assumes that workers compete for cores; these wait on storage, so more of them than cores is fine. On a GPU node, `pin_memory=True` with
# `.to(device, non_blocking=True)` is the next step: it overlaps the host-to-GPU copy, which this CPU run does not
# have.
#
# ## Part C · Several processes
#
# From here on, every case runs 2 processes under `torchrun` through `labkit.dist.launch`, as notebook 09 does:
# a free port, the ranks' logs prefixed `[default0]:`/`[default1]:`, a timeout, and every process killed at the
# end, also when the run hangs. Their broken runs were made at the top; the checks run the fixes now.
#
# ### Case 8 · Two runs that should match differ
#
# The same script started twice, at once, with the same seed: each process trains on its own and they meet only at
# the end, to compare notes.

# %%
print(clinic.source("repro"))
print("\n" + clinic.causes("repro"))

# %%
# NBVAL_IGNORE_OUTPUT
run = broken["repro"]
print("\n".join(line.split(":", 1)[1] for line in run.lines("]:run ")))
runs = run.result["runs"]
assert run.symptom and runs[0]["init_digest"] == runs[1]["init_digest"] and runs[0]["order"] != runs[1]["order"]

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
fix = {"sort_shards": True}
### END SOLUTION
check("13.repro-cause", cause)
check("13.repro-fix", fix)

# %% [markdown]
# To find where two runs part, log checksums at each stage (data order, initial weights, first step) and compare
# the first line that differs. Then record what makes a run repeatable: code version, data version and order,
# seeds, environment, launch parameters (004 §9.4).
#
# ### Case 9 · A rendezvous that never happens
#
# A 2-rank job whose ranks never start training. The script came from a single-node tutorial:

# %%
print(clinic.source("rdzv"))
print("\n" + clinic.causes("rdzv"))

# %%
# NBVAL_IGNORE_OUTPUT
run = broken["rdzv"]
print("\n".join(run.lines("joining via")))
print(run.error_line())
assert run.symptom and "timed out" in run.error and "connect" in run.error

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "b"
fix = {"set_master_env": False}
### END SOLUTION
check("13.rdzv-cause", cause)
check("13.rdzv-fix", fix)

# %% [markdown]
# How to read a rendezvous error: *client socket timed out while trying to connect to (host, port)* means nothing
# answered there (a wrong address or port, a store that never started, a firewall between nodes); *address already
# in use* comes from the process that tried to *open* the store, at once, and means the port is taken. Either way,
# print `MASTER_ADDR:MASTER_PORT` on every rank first.
#
# ### Case 10 · A collective called by only some ranks
#
# A data-parallel loop that averages gradients with `all_reduce` (DDP does the same, in buckets) and checkpoints every
# 3 steps. The process group has a 5 s timeout, so that a hang becomes an error here instead of 30 minutes of
# waiting.

# %%
print(clinic.source("hang"))
print("\n" + clinic.causes("hang"))

# %%
# NBVAL_IGNORE_OUTPUT
run = broken["hang"]
print(*run.lines("step 2"), "", *(line[:150] for line in run.lines("]: RuntimeError")), sep="\n")
detail = clinic.run_case("hang", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
own = sorted({re.search(r"Rank \d is running collective: [^)]*?OpType=\w+", line).group()
              for line in detail.lines("Detected mismatch between collectives")})
print("\nwith TORCH_DISTRIBUTED_DEBUG=DETAIL, each rank says which collective it is in:", *own, sep="\n")
assert run.symptom and "Timed out" in run.log and "BARRIER" in own[0] and "ALLREDUCE" in own[1]

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
fix = {"barrier_on_all_ranks": True}
### END SOLUTION
check("13.hang-cause", cause)
check("13.hang-fix", fix)

# %% [markdown]
# Each rank's last error line is printed above. The rank that waited longest reports the timeout; the other may
# report that its partner went away ("Connection closed by peer") once the first one exited: in a job with many
# ranks, look for the *first* error in time, the rest are consequences.
#
# `DETAIL` makes every collective check, before it runs, that all ranks are calling the same one with the same
# shapes: slow, so only while debugging. Read each rank's own line, "Rank N is running collective: ..."; the second
# half of each message, what the partner runs, comes out garbled when the partners sit in different collectives
# (that is a sign too). With the default timeouts (30 minutes for gloo, 10 for NCCL) the same bug is a job that
# sits idle that long before it fails; with NCCL, `TORCH_NCCL_DUMP_ON_TIMEOUT=1` writes each rank's recent
# collectives (notebook 09). No process of either run is left over: `labkit.dist.launch` kills the whole launch
# when it fails. (The script averages the gradients itself because, with the torch 2.13 CPU build this notebook
# was written with, constructing DDP under `DETAIL` crashed with a segmentation fault.)
#
# ### Case 11 · A DeepSpeed batch config that does not multiply out
#
# A DeepSpeed config tuned on one GPU, started on 2 ranks (DeepSpeed's CPU accelerator here, gloo).

# %%
print(clinic.source("ds-batch"))
print("\n" + clinic.causes("ds-batch"))

# %%
# NBVAL_IGNORE_OUTPUT
run = broken["ds-batch"]
print(run.error_line())
assert run.symptom and "32 != 8 * 4 * 2" in run.error

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
fix = {"train_batch_size": 64}
### END SOLUTION
check("13.ds-batch-cause", cause)
check("13.ds-batch-fix", fix)

# %% [markdown]
# DeepSpeed's message is the product written out: read the last line of a traceback before anything else. Moving a
# config between machines changes the world size, and with it the batch arithmetic.
#
# ### Case 12 · The learning rate not scaled from 1 to N ranks
#
# A recipe tuned on one GPU (batch 32, SGD, lr 0.1, 960 examples) moved to 2 ranks that keep batch 32 each. Rank 0
# first replays the 1-GPU run from the notes, to compare the curves at the same number of examples.

# %%
print(clinic.source("lr"))
print("\n" + clinic.causes("lr"))

# %% [markdown]
# **Predict first.** After the same 960 examples, will the 2-rank run's loss be `"higher"`, `"the same"` or
# `"lower"` than the 1-GPU run's?

# %%
prediction = ...
### BEGIN SOLUTION
prediction = "higher"
### END SOLUTION
predict("13.lr-predict", prediction)

# %%
# NBVAL_IGNORE_OUTPUT
run = broken["lr"]
one, two = run.result["one_gpu"], run.result["curve"]
ax = plots.loss_curves({"1 GPU, batch 32": ([32 * (i + 1) for i in range(len(one))], one),
                        "2 ranks, batch 64": ([64 * (i + 1) for i in range(len(two))], two)}, title="Case 12")
ax.set_xlabel("examples seen")
plt.show()
reveal("13.lr-predict", lr_outcome(run))
assert run.symptom and clinic.lr_ratio(run) > 1.3

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
fix = {"lr": 0.2}
### END SOLUTION
check("13.lr-cause", cause)
check("13.lr-fix", fix)

# %% [markdown]
# The linear rule is a starting point for SGD, usually with a warm-up for large batches; Adam-type optimizers
# often need less than linear. Whatever the rule, compare curves at the same number of examples, not steps.
#
# ## Summary: a checklist
#
# | symptom | first check | case |
# |---|---|---|
# | loss flat from step 0 under fp16 | norms read before `unscale_`? gradients exactly 0? | 1, 2 |
# | NaN loss | `first_nonfinite`: which module, were its inputs finite? exp/softmax/reductions in fp32 | 3 |
# | skipped steps or a spike after resume | is the scaler (and everything else the step uses) in the checkpoint? | 4 |
# | loss scale that never moves | bf16? Then drop the scaler | 5 |
# | memory grows every step | a tensor kept across steps (`.item()`, `torch.no_grad()`) | 6 |
# | slow steps, low utilisation | profile: waiting in `next(loader)`? workers and prefetching | 7 |
# | runs that do not reproduce | checksums stage by stage; data order, seeds, environment | 8 |
# | ranks that never start | the `MASTER_ADDR:MASTER_PORT` every rank really uses | 9 |
# | a hang or a collective timeout | short timeout + `TORCH_DISTRIBUTED_DEBUG=DETAIL`; collectives on every rank | 10 |
# | DeepSpeed refuses its config | its last line; train = micro x accumulation x world | 11 |
# | worse curves after scaling out | learning rate vs global batch, compared at equal examples | 12 |
#
# - One change at a time, and a measurement that says whether it worked: the clinic's checker does exactly that.
# - Adding a case to the clinic is a row in `labkit.clinic.table.CASES` and a script in `labkit.clinic.cases`.
