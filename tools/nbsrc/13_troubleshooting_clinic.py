# %% [markdown]
# # 13 · Troubleshooting clinic: broken training runs to diagnose and fix
#
# **Objectives**
# - work through a failed run the way the seed articles recommend: read the symptom as it appears (a log, a loss
#   curve, a memory trace, a profiler table, an error), find the evidence that separates the candidate causes,
#   then change one thing and check that the symptom is gone;
# - diagnose sixteen failures that cost real training time, from mixed precision (a loss that will not move, NaN,
#   a resume that skips steps) through memory and data loading to several processes (runs that differ, ranks that
#   never meet or never finish, a DeepSpeed config refused, slower learning on more ranks) and the cluster's own
#   (an epoch that never ends, a DDP error, weights that drift without an error, a job that fails at its start,
#   a saved model that cannot be loaded);
# - use the tools that make the evidence: `labkit.debug.first_nonfinite`, `torch.profiler`,
#   `TORCH_DISTRIBUTED_DEBUG=DETAIL`, process-group timeouts, DeepSpeed's own messages, checksums of weights.
#
# **Prerequisites:** notebooks 03 and 04 (loss scaling, AMP), 06 (memory), 07 (profiling), 09 (DDP) and 10
# (DeepSpeed).
#
# **Estimated time:** 150 min
#
# Every case is a small training script in `labkit.clinic.cases` that goes wrong for a real reason, run as its own
# process (or as 2 gloo ranks under `torchrun`, through `labkit.dist.launch`). Nothing is mocked: the symptoms
# below are what the scripts printed when this notebook ran. The scripts run on the CPU, so that each takes
# seconds; on a GPU node the same mistakes fail the same way, with other numbers (where a GPU differs, the explanation of a solved case says so).

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
# 4. **The fix.** Change *one* setting of the script's `CONFIG`: `fix = {"setting": value}`. Some settings are lines
#    of the script (the order of two calls, an expression): the values they may take are listed under `CONFIG`. The
#    checker runs the case again with `clinic.run_case(case, fix=fix)` and asks the case's detector whether the
#    symptom is gone, and whether the run still does its job: a "fix" that changes the number of steps, the data,
#    its tuned values, or gives up the precision the run was moved to, avoids the failure instead of curing it, and is
#    refused.
#
# The seed articles' rule applies throughout: measure first, change one variable at a time, and check the result
# against a measurement, not a feeling. All sixteen broken runs are made now, in about a minute: the one-process
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
# ### Case 1 · The loss does not move
#
# fp16 autocast with a `GradScaler`, plain SGD, gradients clipped to a norm of 1.0. The loop:

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("clip"), end="\n\n")
run = broken["clip"]
print("\n".join(run.lines(last=3)))
plots.loss_curves({"loss on the whole data set": run.result["loss"]}, title="Case 1: the loss does not move")
plt.show()
assert run.symptom and min(run.result["clip_saw"]) > 1000 and run.result["loss"][-1] > 0.9 * run.result["loss"][0]
print("\n" + clinic.causes("clip"))

# %%
cause = ...  # a letter from the list above
fix = ...    # a dict of one CONFIG setting, e.g. {"lr": 0.1}
### BEGIN SOLUTION
cause = "a"
fix = {"after_backward": "scaler.unscale_, clip_grad_norm_, scaler.step"}
### END SOLUTION
check("13.clip-cause", cause)
check("13.clip-fix", fix)

# %% [markdown]
# ### Case 2 · A loss frozen from the first step
#
# A small MLP predicts a 256-sample signal whose values are about 1e-4 (the data are in the wrong unit), under fp16
# autocast, with SGD. The last layer starts at zero, as output layers often do.

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("noscale"), end="\n\n")
run = broken["noscale"]
print("\n".join(run.lines()[:3] + ["..."] + run.lines(last=1)))
assert run.symptom and all(z == 1.0 for z in run.result["zero_grads"]) and len(set(run.result["loss"])) == 1
print("\n" + clinic.causes("noscale"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "d"
fix = {"scaler_enabled": True}
### END SOLUTION
check("13.noscale-cause", cause)
check("13.noscale-fix", fix)

# %% [markdown]
# ### Case 3 · NaN from the first step of a fine-tune
#
# Fine-tuning notebook 04's tiny GPT from a checkpoint of a long run. The loss is NaN from the first step. Where does
# the first NaN appear? `labkit.debug.first_nonfinite` (notebook 03) hooks every module and reports the first one
# whose output is not finite, and whether its inputs still were.

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("softmax"), end="\n\n")
run = broken["softmax"]
print("\n".join(run.lines("step")[-2:] + run.lines("first_nonfinite") + run.lines("largest |attention")))
assert run.symptom and run.result["first_nonfinite"] == "blocks.0.attn.proj"
assert run.result["scores_absmax"][0] > math.log(65504)  # exp overflows fp16 above log(65504) = 11.09
print("\n" + clinic.causes("softmax"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "b"
fix = {"softmax": "fp32"}
### END SOLUTION
check("13.softmax-cause", cause)
check("13.softmax-fix", fix)

# %% [markdown]
# ### Case 4 · A resumed job that skips steps
#
# An fp16 run on unnormalised targets is stopped at step 15, checkpointed, and resumed by a new job. For
# comparison the script first trains the same 30 steps without a break. The checkpoint code:

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("scaler-ckpt"), end="\n\n")
run = broken["scaler-ckpt"]
r, at = run.result, run.result["config"]["resume_at"]
print("\n".join(run.lines(last=3)))
plots.scale_history(r["resumed"]["scale"], r["resumed"]["skipped"], title="Case 4: the loss scale of the resumed run")
plt.show()
assert run.symptom and r["resumed"]["scale"][at] == 65536 > r["reference"]["scale"][at]
print("\n" + clinic.causes("scaler-ckpt"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "a"
fix = {"checkpoint_keys": "model, optimizer, step, scaler"}
### END SOLUTION
check("13.scaler-ckpt-cause", cause)
check("13.scaler-ckpt-fix", fix)

# %% [markdown]
# ## Part B · Memory and speed
#
# ### Case 5 · Memory that grows every step
#
# A training loop that also measures a validation loss after every step, for the log. The process's memory (RSS,
# what `top`, `htop` or Slurm's accounting show) grows by a few MiB with every step. The script also measures,
# exactly, the bytes that autograd graphs still reachable from the loop's variables hold
# (`labkit.memory.graph_saved_bytes`, notebook 06).

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("graph"), end="\n\n")
run = broken["graph"]
print("\n".join(run.lines()[:2] + ["..."] + run.lines(last=1)))
fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(run.result["rss_mb"], "o-", label="process RSS (MiB)")
ax.plot(run.result["graph_mb"], "s-", label="held by the graph of val_total (MiB)")
ax.set(xlabel="step", title="Case 5: memory that grows step after step")
ax.legend()
plt.show()
assert run.symptom and all(b > a for a, b in zip(run.result["graph_mb"], run.result["graph_mb"][1:]))
print("\n" + clinic.causes("graph"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "d"
fix = {"val_accumulate": "val_total += val_loss.item()"}
### END SOLUTION
check("13.graph-cause", cause)
check("13.graph-fix", fix)

# %% [markdown]
# RSS is what the job's memory limit sees, but it is a rough measure (the allocator keeps freed memory); the exact
# count of what a tensor keeps alive is what tells the cause. On a GPU, `torch.cuda.memory_allocated()` gives the
# exact figure; a real model's activations are far larger, and the same leak ends in an out-of-memory error.
#
# ### Case 6 · Steps slower than the model needs
#
# Each record is read from slow shared storage (about 1 ms, nearly all of it waiting on the file system). The
# profiler (notebook 07) shows where each step goes. The data loader:

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("loader"), end="\n\n")
run = broken["loader"]
print(run.result["table"])
print(run.lines(last=1)[0])
assert run.symptom and "DataLoader" in run.result["table"].splitlines()[3]  # the top row of the table
print("\n" + clinic.causes("loader"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
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
# ### Case 7 · Two runs that should match differ
#
# The same script started twice, at once, with the same seed: each process trains on its own and they meet only at
# the end, to compare notes.

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("repro"), end="\n\n")
run = broken["repro"]
print("\n".join(line.split(":", 1)[1] for line in run.lines("]:run ")))
runs = run.result["runs"]
assert run.symptom and runs[0]["init_digest"] == runs[1]["init_digest"] and runs[0]["order"] != runs[1]["order"]
print("\n" + clinic.causes("repro"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "b"
fix = {"shard_list": "sorted(set(shards))"}
### END SOLUTION
check("13.repro-cause", cause)
check("13.repro-fix", fix)

# %% [markdown]
# To find where two runs part, log checksums at each stage (data order, initial weights, first step) and compare
# the first line that differs. Then record what makes a run repeatable: code version, data version and order,
# seeds, environment, launch parameters (004 §9.4).
#
# ### Case 8 · Ranks that never start training
#
# A 2-rank job whose ranks never start training. The script came from a single-node tutorial:

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("rdzv"), end="\n\n")
run = broken["rdzv"]
print("\n".join(run.lines("joining via")))
print(run.error_line())
assert run.symptom and "timed out" in run.error and "connect" in run.error
print("\n" + clinic.causes("rdzv"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "d"
fix = {"tutorial_sets": ""}
### END SOLUTION
check("13.rdzv-cause", cause)
check("13.rdzv-fix", fix)

# %% [markdown]
# How to read a rendezvous error: *client socket timed out while trying to connect to (host, port)* means nothing
# answered there (a wrong address or port, a store that never started, a firewall between nodes); *address already
# in use* comes from the process that tried to *open* the store, at once, and means the port is taken. Either way,
# print `MASTER_ADDR:MASTER_PORT` on every rank first.
#
# ### Case 9 · A job that stops at its first checkpoint
#
# A data-parallel loop that averages gradients with `all_reduce` (DDP does the same, in buckets) and checkpoints every
# 3 steps. The process group has a 5 s timeout, so that a hang becomes an error here instead of 30 minutes of
# waiting.

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("hang"), end="\n\n")
run = broken["hang"]
print(*run.lines("step 2"), "", *(line[:150] for line in run.lines("]: RuntimeError")), sep="\n")
detail = clinic.run_case("hang", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
own = sorted({re.search(r"Rank \d is running collective: [^)]*?OpType=\w+", line).group()
              for line in detail.lines("Detected mismatch between collectives")})
print("\nwith TORCH_DISTRIBUTED_DEBUG=DETAIL, each rank says which collective it is in:", *own, sep="\n")
assert run.symptom and "Timed out" in run.log and "BARRIER" in own[0] and "ALLREDUCE" in own[1]
print("\n" + clinic.causes("hang"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "a"
fix = {"barrier_ranks": "0, 1"}
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
# **On NCCL the same bug can be worse than an error.** NCCL matches collectives by their order on each
# communicator, not by kind: a barrier (itself a tiny all-reduce) paired with a gradient all-reduce of another size
# can hang, or exchange the wrong bytes and corrupt the result without any error, where gloo fails. Two tools make it
# visible: the *flight recorder* (`TORCH_FR_BUFFER_SIZE`, formerly `TORCH_NCCL_TRACE_BUFFER_SIZE`, above 0, dumped per rank with
# `TORCH_NCCL_DUMP_ON_TIMEOUT=1`) keeps each rank's last collectives with their sizes, and
# `TORCH_NCCL_ASYNC_ERROR_HANDLING` (torchrun exports 1, the library's own default is 3: both tear the process down
# on an error or a timeout) turns a stuck collective into a process that exits, so that the job fails instead of
# idling.
#
# ### Case 10 · DeepSpeed refuses to start
#
# A DeepSpeed config tuned on one GPU, started on 2 ranks (DeepSpeed's CPU accelerator here, gloo).

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("ds-batch"), end="\n\n")
run = broken["ds-batch"]
print(run.error_line())
assert run.symptom and "32 != 8 * 4 * 2" in run.error
print("\n" + clinic.causes("ds-batch"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "b"
fix = {"train_batch_size": 64}
### END SOLUTION
check("13.ds-batch-cause", cause)
check("13.ds-batch-fix", fix)

# %% [markdown]
# ### Case 11 · Two ranks learn slower than one
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
                        "2 ranks, batch 64": ([64 * (i + 1) for i in range(len(two))], two)}, title="Case 11")
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
# ## Part D · At scale: the cluster's own failures
#
# Five failures that belong to multi-rank jobs on a cluster, each run for real on 2 gloo ranks. On a GPU cluster
# they look the same, with NCCL in gloo's place (the error texts differ, the causes do not).
#
# ### Case 12 · The last step of an epoch never ends
#
# Data parallelism with DDP, where each rank reads its own shard file of the data set: a common layout when the data
# is stored as files rather than as one indexed set. The process group has a 5 s timeout.

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("uneven"), end="\n\n")
run = broken["uneven"]
print(*run.lines("step 4/"), *run.lines("epoch done"), run.error_line().split("] ")[-1], sep="\n")
assert run.symptom and any("epoch done after 4 steps" in ln for ln in run.lines("rank 1"))
print("\n" + clinic.causes("uneven"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "b"
fix = {"loop": "with model.join(): for xb, yb in shard"}
### END SOLUTION
check("13.uneven-cause", cause)
check("13.uneven-fix", fix)

# %% [markdown]
# ### Case 13 · DDP stops at its second step
#
# A model with a shared trunk and two heads, one per task, trained with DDP on one of its tasks.

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("unused"), end="\n\n")
run = broken["unused"]
print(*run.lines("step 0 loss"), *(ln.strip()[:160] for ln in run.lines("Expected to have finished")[:1]),
      *(ln for ln in run.lines("Parameter indices") if ln.startswith("[default")), sep="\n")
assert run.symptom and run.lines("Parameter indices")   # DDP names the parameters that got no gradient
print("\n" + clinic.causes("unused"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "d"
fix = {"find_unused_parameters": True}
### END SOLUTION
check("13.unused-cause", cause)
check("13.unused-fix", fix)

# %% [markdown]
# ### Case 14 · A tensor-parallel run whose loss looks right
#
# A model with a tensor-parallel MLP block in the middle (notebook 11's Megatron split) between layers that every rank
# keeps whole. Rank 0 also trains the same model in one process, from the same weights on the same batches: a
# reference every multi-rank layout should be checked against before it is scaled out.

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("tp-grad"), end="\n\n")
run = broken["tp-grad"]
print(*run.lines("rank 0 step"), *run.lines("rank 1 step 4"), *run.lines("differ from"), sep="\n")
r = run.result
assert run.symptom and r["loss"][-1] < r["loss"][0] and abs(r["loss"][0] - r["ref_loss"][0]) < 1e-6
print("\n" + clinic.causes("tp-grad"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "a"
fix = {"f_backward": "all_reduce"}
### END SOLUTION
check("13.tp-grad-cause", cause)
check("13.tp-grad-fix", fix)

# %% [markdown]
# ### Case 15 · A job that fails before its first step
#
# A job script copied from another cluster, started on this machine. It exports the settings its collectives used
# there.

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("ifname"), end="\n\n")
run = broken["ifname"]
print(*run.lines("SOCKET_IFNAME"), run.error_line().split("] ")[-1], sep="\n")
assert run.symptom and "Unable to find address for: ib0" in run.error
print("\n" + clinic.causes("ifname"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
fix = {"GLOO_SOCKET_IFNAME": "lo"}
### END SOLUTION
check("13.ifname-cause", cause)
check("13.ifname-fix", fix)

# %% [markdown]
# On a GPU cluster the same mistake reads differently. NCCL ignores `GLOO_SOCKET_IFNAME`; a wrong `NCCL_SOCKET_IFNAME`
# fails with "no socket interface found", often only at the first collective. Worse, a job can run on the wrong
# network without any error: with `NCCL_DEBUG=INFO`, the line `Using network IB` (InfiniBand, or RoCE) or `Using
# network Socket` (TCP) says which one NCCL uses between nodes (inside a node, traffic takes NVLink, PCIe or shared
# memory, not the network). A job that should use InfiniBand and says `Socket` runs, slowly. Read that line on the
# first run of every new cluster.
#
# ### Case 16 · A trained model that nobody can load
#
# DeepSpeed ZeRO-3 on 2 ranks (its CPU accelerator here) trains a small model for a few steps. At the end, the
# script exports the weights for a user who has plain PyTorch and the model's class, and that user loads the file.

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("zero3-save"), end="\n\n")
run = broken["zero3-save"]
print(*run.lines("rank 0 step"), *run.lines("exported"), *(ln[:150] for ln in run.lines("load_state_dict")), sep="\n")
assert run.symptom and all(shape == [0] for shape in run.result["shapes"].values())
print("\n" + clinic.causes("zero3-save"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
fix = {"export": "GatheredParameters(...): engine.module.state_dict()"}
### END SOLUTION
check("13.zero3-save-cause", cause)
check("13.zero3-save-fix", fix)

# %% [markdown]
# ## Summary: a checklist
#
# The table to keep, for the cases you have solved (cause and fix both ✓): the symptom, the first thing to look at,
# the cause and the fix. A case you have not solved yet is only listed, so the table never answers for you.

# %% tags=["workspace-clear"]
print(clinic.checklist())

# %% [markdown]
# - One change at a time, and a measurement that says whether it worked: the clinic's checker does exactly that.
# - Adding a case to the clinic is a row in `labkit.clinic.table.CASES` and a script in `labkit.clinic.cases`.
