# %% [markdown]
# # 09 · DDP and communication: multi-rank training from a notebook
#
# **Objectives**
# - explain data parallelism: replicas, the all-reduce of gradients, and the global batch;
# - launch 1 and 2 ranks with `torchrun` from a notebook, safely, and check that the ranks stay bit-identical;
# - combine AMP with DDP (bf16, and fp16 with a GradScaler) and accumulate gradients with `no_sync()`;
# - measure all-reduce bandwidth the way nccl-tests does (algbw, busbw) and read the NCCL knobs that matter;
# - survive a crashed rank: a clean error in the notebook, then a resume that ends in the same weights.
#
# **Prerequisites:** notebooks 03 and 04 (loss scaling, AMP, checkpoints).
#
# **Estimated time:** 80 min
#
# Every run below is real multi-process training: on this machine two CPU processes talking over gloo, on a GPU
# node the same module with NCCL. Each launch costs a few seconds of process start-up.

# %%
# %matplotlib inline
import inspect
import math
import os
import subprocess
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from torch.utils.data import DistributedSampler

from labkit import device, train
from labkit.check import check, predict, reveal
from labkit.dist import LaunchError, launch
from labkit.exercises.nb09 import simulate_all_reduce
from labkit.recipes import comm_share
from labkit.recipes import ddp as ddp_recipe

# %% [markdown]
# ## 1. Data parallelism in one picture
#
# Every rank (process, usually one per GPU) holds a full **replica** of the model and optimizer. Each step:
#
# 1. every rank takes *its own* slice of the global batch (a `DistributedSampler` hands out disjoint indices);
# 2. forward and backward run locally, giving different local gradients;
# 3. an **all-reduce** combines the ranks' gradients into their mean (DDP starts it bucket by bucket while backward is
#    still running);
# 4. every rank applies the same averaged gradient with the same optimizer, so the replicas stay identical.
#
# $$\text{global batch} = \text{micro-batch per rank} \times \text{ranks} \times \text{accumulation steps}$$
#
# The sampler shuffles with a shared seed and deals the permutation out round-robin, so two ranks with batch 2
# see exactly the four examples one rank with batch 4 would see:

# %%
data = list(range(16))
one_rank = list(DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0))
two_ranks = [list(DistributedSampler(data, num_replicas=2, rank=r, shuffle=True, seed=0)) for r in (0, 1)]
print("1 rank,  batch 4:", one_rank[:4])
print("rank 0,  batch 2:", two_ranks[0][:2], "  rank 1, batch 2:", two_ranks[1][:2])
assert sorted(two_ranks[0][:2] + two_ranks[1][:2]) == sorted(one_rank[:4])
assert not set(two_ranks[0]) & set(two_ranks[1])  # disjoint shards

# %% [markdown]
# ## 2. Launching ranks from a notebook
#
# `mp.spawn` of a function defined in a notebook fails (the child processes cannot import `__main__`), and
# `!torchrun ...` never fails a cell when a rank crashes. So the training code lives in a module,
# `labkit.recipes.ddp`, and `labkit.dist.launch` runs it under `torchrun` as a subprocess:
#
# - a free `MASTER_PORT` on 127.0.0.1, `OMP_NUM_THREADS=1` per rank, logs streamed into the cell as they come
#   (prefixed `[default0]:`, `[default1]:`);
# - it returns the one JSON line rank 0 prints (`LABKIT_RESULT {...}`);
# - on a failed rank or a timeout it kills every process of the launch and raises `LaunchError` carrying the
#   failing rank's traceback.
#
# From a shell the same run is `torchrun --nproc_per_node 2 -m labkit.recipes.ddp --batch 64 --steps 12`; under
# Slurm, `srun python -m labkit.recipes.ddp ...` (the recipe reads `SLURM_PROCID`/`SLURM_NTASKS`).
#
# The problem: an MLP (136 K parameters) regressing a smooth function, AdamW, 12 steps, global batch 128. First
# 1 rank with batch 128, streaming its log:

# %%
caps = device.capabilities()
DEV = "cuda" if caps.device_type == "cuda" and caps.gpu_count >= 2 else "cpu"  # 2 ranks need 2 GPUs
BASE = ["--device", DEV, "--model", "mlp", "--hidden", "256", "--depth", "3", "--steps", "12", "--seed", "0"]
work = Path(tempfile.mkdtemp(prefix="nb09-"))
print("ranks run on:", DEV, "with backend", device.dist_backend(DEV))

# %%
# NBVAL_IGNORE_OUTPUT
one = launch("labkit.recipes.ddp", nproc=1, args=[*BASE, "--batch", "128", "--log-every", "4"], timeout=180)

# %% [markdown]
# Now 2 ranks with batch 64 each, same global batch, checkpointing every 2 steps (used in section 7). This time
# quietly: the result holds everything.

# %%
two = launch("labkit.recipes.ddp", nproc=2, args=[*BASE, "--batch", "64", "--ckpt-dir", str(work / "ref"),
                                                  "--ckpt-every", "2"], timeout=180, stream=False)
print("world size", two["world_size"], "| backend", two["backend"], "| global batch", two["global_batch"])
print("gradient checksums identical on both ranks: ", len(set(two["grad_checksums"])) == 1)
print("parameter checksums identical on both ranks:", len(set(two["param_checksums"])) == 1)
assert two["world_size"] == 2 and two["global_batch"] == one["global_batch"] == 128
assert two["grad_checksums"][0] == two["grad_checksums"][1] and two["param_sums"][0] == two["param_sums"][1]

# %% [markdown]
# The checksums are sha256 digests of the raw bytes: the two replicas are **bit-identical**, not merely close.
# They are printed here (their values depend on the CPU's arithmetic, theirs being equal does not):

# %%
# NBVAL_IGNORE_OUTPUT
print("grad  checksums:", two["grad_checksums"], "  param checksums:", two["param_checksums"])

# %% [markdown]
# And 2 ranks × batch 64 is the same training as 1 rank × batch 128, up to rounding: the averaged gradient of
# two halves is the gradient of the whole batch, summed in a different order.

# %%
rel = max(abs(a - b) / abs(b) for a, b in zip(two["losses"], one["losses"]))
print(f"loss, step 1 → 12 (1 rank):  {one['losses'][0]:.3f} → {one['losses'][-1]:.3f}")
print(f"loss, step 1 → 12 (2 ranks): {two['losses'][0]:.3f} → {two['losses'][-1]:.3f}")
print("largest relative loss difference below 1e-5:", rel < 1e-5)
assert rel < 1e-5 and two["losses"][-1] < two["losses"][0]

# %% [markdown]
# **Scaling efficiency.** With the global batch fixed, ideal data parallelism halves the step time on 2 ranks.
# Efficiency = (measured speed-up) / (number of ranks).

# %%
# NBVAL_IGNORE_OUTPUT
t1 = one["timings"]["step_s_median_per_rank"][0]
t2 = max(two["timings"]["step_s_median_per_rank"])
print(f"1 rank  × batch 128: {t1 * 1e3:6.1f} ms/step")
print(f"2 ranks × batch  64: {t2 * 1e3:6.1f} ms/step   speed-up {t1 / t2:.2f}× (ideal 2×), efficiency {t1 / t2 / 2:.0%}")
print(f"this machine: {os.cpu_count()} CPU cores for the notebook kernel, torchrun and both ranks")

# %% [markdown]
# Read this figure honestly: the two ranks share this machine's CPU cores (counted in the line above) with the
# notebook kernel, `torchrun` and anything else running. On a small machine they compete for those cores and for
# memory bandwidth, and the "network" is loopback inside one machine. So the efficiency here measures CPU contention and gloo's per-call overhead on a
# 0.5 MB gradient, not a network. On GPUs the compute per rank is independent, and the question becomes whether
# the all-reduce hides behind backward (section 5 measures the all-reduce itself; notebook 11 builds the overlap by
# hand).
#
# ## 3. AMP inside DDP
#
# The recipe builds the model (same seed on every rank) and moves it to its device, builds the optimizer, wraps the
# model in `DDP` (which broadcasts rank 0's parameters and buffers), and creates the `GradScaler` (fp16 only). Then
# the loop runs.
#
# > **Common misconception** (seed 000 §4.3): create the GradScaler only after wrapping the model in DDP, or the
# > ranks' scalers may start in different states.
# >
# > **Why it is wrong:** a new GradScaler's state is a constant (`init_scale` 2¹⁶, growth tracker 0, nothing
# > measured yet: see `torch.amp.GradScaler`'s documentation), and DDP neither reads the scaler nor replaces the
# > parameters the optimizer holds. Created before or after the wrap, every rank's scaler starts the same and sees
# > the same all-reduced gradients. The fp16 run below creates rank 1's scaler first and rank 0's last, and the two
# > ranks end bit-identical.
# >
# > **What is true:** the order that matters is elsewhere. The model is on its device before `DDP(model)` (DDP
# > registers the parameters it finds there); a checkpoint is loaded on *every* rank, scaler state included (or
# > loaded on one and broadcast), before training resumes; and with FSDP2 the optimizer is built *after*
# > `fully_shard`, because sharding replaces the parameters with sharded ones (notebook 11).
#
# This is the recipe's whole training loop, `labkit.recipes.ddp.train_loop`, printed from the code that ran above
# (fault injection, timing and checkpoints sit around it, in the batch source and the caller):

# %%
print(inspect.getsource(ddp_recipe.train_loop))

# %% [markdown]
# Inside it, `precision.backward` is `scaler.scale(loss).backward()` (DDP all-reduces the *scaled* gradients
# during backward) and `precision.update` is `scaler.unscale_(opt)`, then `scaler.step(opt)` (skipped on inf/NaN)
# and `scaler.update()`: notebook 04's AMP step, written once in `labkit.precision`.
#
# Every rank has its own GradScaler. They agree only because each one looks at the *all-reduced* gradients:
# an inf on one rank becomes an inf on all ranks, so all of them skip the step and halve the scale together. If
# the scalers ever disagreed (a scaler state restored on rank 0 only, an inf check before the all-reduce), one
# rank would step while another skips, and the replicas would drift apart silently: DDP never re-broadcasts
# weights. bf16 has fp32's exponent range and needs no scaler at all.
#
# An fp16 run on 2 ranks, with micro-batch 16 and 4 accumulation steps (global batch 16 × 2 × 4 = 128 again). It
# also puts the misconception box to the test: rank 1 creates its GradScaler first, before the optimizer and the DDP
# wrap, rank 0 after the wrap. (Rank 1 also sleeps 20 ms per micro-batch, for section 6.)

# %%
amp = launch("labkit.recipes.ddp", nproc=2, timeout=180, stream=False,
             args=[*BASE, "--batch", "16", "--accum", "4", "--precision", "fp16", "--scaler-first-rank", "1",
                   "--slow-rank", "1", "--slow-ms", "20"])
print("GradScaler created on each rank:", amp["scaler_created"])
print("loss scale on each rank:", amp["scaler_scales"], "| skipped steps on each rank:", amp["skipped_steps"])
print("parameters identical on both ranks:", amp["param_checksums"][0] == amp["param_checksums"][1])
print(f"final loss fp16 {amp['losses'][-1]:.2f} vs fp32 {two['losses'][-1]:.2f}")
assert amp["scaler_scales"][0] == amp["scaler_scales"][1] and amp["skipped_steps"][0] == amp["skipped_steps"][1]
assert amp["param_checksums"][0] == amp["param_checksums"][1] and amp["global_batch"] == 128
assert amp["scaler_created"] == ["after the wrap", "before the wrap"]  # the order changed nothing above

# %% [markdown]
# **Predict, then run.** That run made 12 optimizer steps, each accumulating 4 micro-batches per rank, with the
# `no_sync()` of `train_loop` above. How many gradient all-reduces did each rank issue? Record a number; section 4
# counts them.

# %%
prediction = ...
### BEGIN SOLUTION
prediction = 12
### END SOLUTION
predict("09.allreduce-count", prediction)

# %% [markdown]
# ## 4. Gradient accumulation with `no_sync()`
#
# The recipe counts the all-reduces DDP really issues (a communication hook that counts, then all-reduces):

# %% tags=["workspace-clear"]
for name, r in [("fp32, accumulation 1", two), ("fp16, accumulation 4", amp)]:
    calls, mib = r["allreduce_calls"][0], r["allreduce_bytes"][0] / 2**20
    print(f"{name}: {r['micro_batches']:2d} micro-batches, {calls:2d} all-reduces, {mib:.1f} MiB all-reduced")
reveal("09.allreduce-count", amp["allreduce_calls"][0])

# %% [markdown]
# Accumulating 4 micro-batches needs only one gradient synchronisation, after the last one: one all-reduce per
# bucket, and this model's 136 193 parameters (0.54 MB of fp32 gradients) fit in DDP's first bucket, which is capped
# at 1 MiB (the later ones at 25 MiB): one all-reduce.
# Inside `ddp.no_sync()` DDP skips the all-reduce and lets gradients add up locally: that is the `sync = ...` line of
# the loop above, and the loss is divided by `accum` so that the summed gradients are the mean over the whole step.

# %%
assert amp["allreduce_calls"] == [12, 12] and amp["micro_batches"] == 48  # 48 micro-batches, 12 all-reduces
assert two["allreduce_calls"] == [12, 12] and two["allreduce_bytes"] == amp["allreduce_bytes"]

# %% [markdown]
# Same global batch, same traffic, but 4× the micro-batches per all-reduce; without `no_sync()` it would be 48
# all-reduces (`--sync-every-micro` runs that way). Gradients stay fp32 under autocast (the weights are fp32), so
# fp16 compute does not shrink the all-reduce: 136 193 parameters × 4 bytes × 12 steps.
#
# **How much of a step is communication, and what does `no_sync()` save?** Seed 000 §1.1 says that synchronising
# gradients and parameters takes 30-40 % of training time in multi-GPU jobs: the article's figure for its own jobs,
# which depends on the model, the batch and the links. `labkit.recipes.comm_share` measures it for this MLP, with
# micro-batch 16 and 4 accumulation steps as in the fp16 run (fp32 here, and no slow rank), trained twice in one
# launch: all-reducing after every micro-batch, then with `no_sync()`. It runs on CPU ranks with gloo even on a GPU
# node, because a host clock cannot time work that NCCL queues on a CUDA stream (there, use `torch.profiler` or
# Nsight Systems). Its communication hook wraps DDP's default
# all-reduce and reads the clock when DDP hands it a bucket and again when the all-reduce's future completes:

# %%
print(inspect.getsource(comm_share.timing_hook([], [], {})))

# %%
comm = launch("labkit.recipes.comm_share", nproc=2, timeout=180, stream=False,
              args=["--hidden", "256", "--depth", "3", "--batch", "16", "--accum", "4", "--steps", "20"])
sync, nosync = comm["sync"], comm["no_sync"]
print("all-reduces per optimizer step without no_sync():", [r["allreduces_per_step"] for r in sync],
      "| with no_sync():", [r["allreduces_per_step"] for r in nosync], "(rank 0, rank 1)")
fewer = all(b["comm_s_per_sample_min"] < a["comm_s_per_sample_min"] for a, b in zip(sync, nosync))
print("all-reduce time per sample (the least-disturbed step) lower with no_sync() on both ranks:", fewer)
print("same weights either way, up to rounding (largest difference below 1e-5):", comm["param_diff"] < 1e-5)
assert [r["allreduces_per_step"] for r in sync] == [4, 4] and [r["allreduces_per_step"] for r in nosync] == [1, 1]
assert all(b["comm_s_per_sample_min"] < a["comm_s_per_sample_min"] for a, b in zip(sync, nosync))
assert comm["param_diff"] < 1e-5

# %%
# NBVAL_IGNORE_OUTPUT
for name, runs in [("without no_sync()", sync), ("with no_sync()   ", nosync)]:
    for rank, r in enumerate(runs):
        print(f"{name} rank {rank}: step {r['step_s'] * 1e3:5.1f} ms, in all-reduce {r['comm_s'] * 1e3:5.1f} ms "
              f"({r['share']:.0%} of the step), {r['comm_s_per_sample'] * 1e6:5.1f} µs per sample")
cut = sync[0]["comm_s_per_sample_min"] / nosync[0]["comm_s_per_sample_min"]
print(f"here, rank 0: all-reduce took {sync[0]['share']:.0%} of the median step without no_sync() and "
      f"{nosync[0]['share']:.0%} with it (seed 000 §1.1 quotes 30-40 % for its GPU jobs); in the least-disturbed "
      f"step, no_sync() {'cut' if cut > 1 else 'raised'} the all-reduce time per sample {max(cut, 1 / cut):.1f}x")

# %% [markdown]
# The counts are exact: `no_sync()` leaves one all-reduce per optimizer step out of `accum`, whatever the
# machine. The share is not a constant of data parallelism: it is communication over compute, so it rises with a
# slower link or a smaller model and falls with a larger micro-batch. On this machine the "link" is loopback TCP
# between two processes sharing a few cores, and the model is tiny, so compare the shares above with each other
# rather than with the article's figure. The lesson carries over: accumulating k micro-batches under `no_sync()`
# divides the number of all-reduces (and the bytes sent per sample) by k, and the weights come out the same.
#
# ## 5. The all-reduce benchmark: algbw and busbw
#
# For a message of $S$ bytes that takes $t$ seconds, nccl-tests reports
#
# - **algbw** $= S / t$: what the caller sees;
# - **busbw** $= \text{algbw} \times 2(n-1)/n$: a ring all-reduce sends (and receives) $2(n-1)/n \cdot S$ bytes
#   per rank, so busbw is comparable with a link's hardware bandwidth whatever the number of ranks.
#
# `labkit.recipes.allreduce` measures both (slowest rank, median of repeats):

# %%
bench = launch("labkit.recipes.allreduce", nproc=2, timeout=180, stream=False,
               args=["--device", DEV, "--sizes", "1K,4K,16K,64K,256K,1M,4M", "--iters", "10"])
rows = bench["rows"]
n = bench["world_size"]
assert all(r["correct"] for r in rows) and n == 2
assert all(math.isclose(r["algbw_GBps"], r["bytes"] / (r["time_us"] * 1e-6) / 1e9, rel_tol=1e-9) for r in rows)  # S/t
assert all(math.isclose(r["busbw_GBps"], r["algbw_GBps"] * 2 * (n - 1) / n, rel_tol=1e-9) for r in rows)
assert rows[-1]["busbw_GBps"] > 10 * rows[0]["busbw_GBps"]  # large messages use the link far better

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'size':>6} {'time (us)':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}")
for r in rows:
    print(f"{r['size']:>6} {r['time_us']:10.1f} {r['algbw_GBps']:11.4f} {r['busbw_GBps']:11.4f}")
peak = max(rows, key=lambda r: r["busbw_GBps"])
small = min(rows[:3], key=lambda r: r["time_us"])  # 1K-16K: latency-bound, so each takes about α
print(f"here: the fastest small message ({small['size']}) took {small['time_us']:.0f} µs, an estimate of α, the fixed "
      f"cost (at these sizes noise decides which is fastest); busbw peaked at {peak['size']} "
      f"({peak['busbw_GBps']:.2f} GB/s){' and fell after it' if peak is not rows[-1] else ''}")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.loglog([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], "o-")
ax.set(xlabel="message size (bytes)", ylabel="busbw (GB/s)", title=f"all-reduce, {bench['world_size']} ranks, {bench['backend']}")
ax.grid(True, which="both", alpha=0.3)
plt.show()

# %% [markdown]
# A simple model explains the curve: $t(S) \approx \alpha + \frac{2(n-1)}{n}\frac{S}{B}$.
#
# - **Latency-bound** (small $S$): $\alpha$ dominates (with gloo on loopback, the line above says how large: often
#   a millisecond or more, since each call crosses Python, gloo's bookkeeping and TCP), $t$ hardly changes with $S$,
#   and busbw grows in proportion to $S$. This is why DDP packs gradients into ~25 MB buckets instead of
#   all-reducing each tensor. NCCL over NVLink brings $\alpha$ down to microseconds.
# - **Bandwidth-bound** (large $S$): busbw approaches the link bandwidth $B$. On a shared CPU it may also *drop*
#   for the largest messages (they no longer fit in cache, and the two ranks compete for memory bandwidth), which
#   is why the line above says where it peaked here.
#
# What the hardware changes is $\alpha$ and $B$. GPUs in one node connected by NVLink reach busbw of hundreds
# of GB/s with NCCL; across nodes one InfiniBand NDR port carries 400 Gb/s = 50 GB/s, and RDMA (GPUDirect) keeps
# the CPU out of the path. Loopback TCP between two processes on this machine is a fraction of a GB/s. On a
# GPU node, run this cell's launch there, or nccl-tests' `all_reduce_perf -b 8 -e 1G -f 2 -g <gpus>`.
#
# ## 6. NCCL: the knobs, the topology, slow ranks and timeouts
#
# On a GPU node the backend is NCCL (the device gate picks it). The environment variables worth knowing:
#
# | variable | what it does | typical use |
# |---|---|---|
# | `NCCL_DEBUG=INFO` | logs version, transports, rings/trees at start-up | **first thing to set** when something is slow or hangs; look for `NET/IB` vs `NET/Socket` and `P2P`/`SHM` lines |
# | `NCCL_IB_DISABLE=1` | forbids InfiniBand/RoCE, falls back to TCP sockets | a debugging switch; left in a job script (often copied from a container recipe) it silently makes multi-node runs many times slower |
# | `NCCL_SOCKET_IFNAME` | which interface NCCL's own sockets and bootstrap use | pin it (`ib0`, `eth0`) when a wrong one (`docker0`, `lo`) makes NCCL's setup hang or fail; it does not affect torch's c10d store, which connects to `MASTER_ADDR:MASTER_PORT` (a hang *before* NCCL starts is that address not being reachable from every node) |
# | `NCCL_IB_HCA` | which InfiniBand adapters (and ports) to use, e.g. `mlx5_0:1,mlx5_1:1` | nodes with several HCAs, or to keep NCCL off a storage HCA |
# | `NCCL_P2P_DISABLE=1` | forbids direct GPU-to-GPU copies (NVLink/PCIe P2P) inside a node | debugging hangs or corruption suspected on P2P; a big slowdown if left on |
# | `NCCL_PROTO` | force `LL`, `LL128` or `Simple` | experiments only, like `NCCL_ALGO` |
# | `NCCL_DEBUG_SUBSYS` | narrows `NCCL_DEBUG` output (`INIT,NET`, `COLL`, ...) | keep INFO logs readable |
# | `TORCH_NCCL_ASYNC_ERROR_HANDLING` | what the watchdog does when a collective fails or times out: 1 aborts the communicators and tears the process down, 2 only aborts the communicators, 3 tears down without cleaning up first. torch's own default is 3, but `torchrun` exports 1 to its ranks when the variable is unset, so the runs of this notebook would get 1 | so a hang becomes an error instead of a stuck job (0 turns that off) |
# | `TORCH_NCCL_BLOCKING_WAIT=1` | collectives block the CPU and raise on timeout | debugging: the timeout surfaces in the calling line |
# | `TORCH_NCCL_DUMP_ON_TIMEOUT=1` | on a timeout, dump the flight recorder of recent collectives per rank (with `TORCH_FR_BUFFER_SIZE`, formerly `TORCH_NCCL_TRACE_BUFFER_SIZE`) | find which rank stopped at which collective |
# | `NCCL_ALGO` | force `Ring`, `Tree`, ... | experiments only; NCCL's tuner picks per message size |
# | `NCCL_BUFFSIZE` | bytes of each channel's buffer per peer (default 4 MiB; 1 MiB when NCCL finds an ARM host CPU) | larger can help bandwidth, costs GPU memory |
# | `NCCL_MAX_NCHANNELS`, `NCCL_MIN_NCHANNELS` | bound the number of channels NCCL spreads a collective over (explained below); deprecated since NCCL 2.17 in favour of `NCCL_MAX_CTAS`, `NCCL_MIN_CTAS` | leave NCCL's choice; a cap frees GPU blocks for compute at some bandwidth |
# | `NCCL_NSOCKS_PERTHREAD`, `NCCL_SOCKET_NTHREADS` | sockets per helper thread and helper threads per connection of the socket (TCP) transport between nodes (threads ≤ 16, product ≤ 64) | only when the nodes talk TCP (no InfiniBand/RoCE): more streams fill a fast Ethernet link; unused on IB, and between GPUs joined by NVLink |
#
# `nvidia-smi topo -m` prints how GPUs and NICs are connected: `NV#` (NVLink, # links), `PIX`/`PXB` (PCIe
# switches), `PHB` (through the CPU's PCIe host bridge), `NODE`/`SYS` (across host bridges or CPU sockets).
# NCCL uses NVLink where it exists; `SYS` between a GPU and its NIC means traffic crosses sockets.
#
# > **Common misconception** (seed 002 §4.2): `NCCL_BUFFSIZE` defaults to 1 MB, so raising it to 4 MB (with
# > `NCCL_ALGO=Tree`) speeds up all-reduce.
# >
# > **Why it is wrong:** on an x86 host such as the article's 8×A100 server, NCCL's default buffer is already 4 MiB
# > (4194304 bytes) per channel, so the suggested value changes nothing. 1 MiB is NCCL's default only when it finds an
# > ARM host CPU (its source: `DEFAULT_BUFFSIZE` 4 MiB, `DEFAULT_BUFFSIZE_ARM` 1 MiB), a choice NVIDIA made for
# > those machines. And forcing `NCCL_ALGO` takes away NCCL's own choice of ring or tree for each message size.
# >
# > **What is true:** leave both at their defaults until a measurement (nccl-tests' `all_reduce_perf`, or section
# > 5's benchmark) shows a gain. NCCL's documentation of its environment variables lists the defaults, and
# > `NCCL_DEBUG=INFO` prints what NCCL chose. A larger buffer costs GPU memory on every channel.
#
# > **Common misconception** (seed 000 §4.3): communication overlaps computation once NCCL is tuned for it, by
# > setting `NCCL_BUFFSIZE` and `NCCL_MAX_NCHANNELS`.
# >
# > **Why it is wrong:** neither variable decides *when* an all-reduce starts. NCCL runs a collective when the
# > framework calls it; `NCCL_BUFFSIZE` sizes the staging buffers of each channel and `NCCL_MAX_NCHANNELS` caps how
# > many channels one collective is spread over (both below). The overlap comes from DDP: it groups the gradients
# > into buckets (`bucket_cap_mb`: 25 MiB by default, and then a first bucket of 1 MiB, from the second step on) and
# > starts each bucket's all-reduce from an autograd hook as soon as all of that bucket's gradients exist, while
# > backward goes on computing the earlier layers (on a GPU, NCCL runs on its own CUDA stream beside the backward
# > kernels).
# >
# > **What is true:** overlap is decided by the buckets and by the order in which gradients become ready. The cell
# > below shows it on this machine's CPU ranks: with one bucket the all-reduce starts only once every gradient exists;
# > with `bucket_cap_mb=0.1` the same MLP has several buckets, and the first all-reduce starts while some parameters
# > still have no gradient. To change overlap, change `bucket_cap_mb` (and check a profiler trace), not NCCL's buffers.
#
# The same launch as in section 4 trained the MLP for 3 steps with `bucket_cap_mb=25` and with `0.1`. Its hook
# noted, for each bucket of the last step, how many of the model's 8 parameter tensors still had no gradient
# when the bucket's all-reduce started (DDP builds its buckets anew after the first step, in the order the gradients
# came):

# %%
for b in comm["buckets"]:
    first, last = b["buckets"][0], b["buckets"][-1]
    print(f"bucket_cap_mb={b['bucket_cap_mb']:g}: {len(b['buckets'])} bucket(s); the first all-reduce started with "
          f"{first['missing']} of {b['params']} tensors still without a gradient, the last with {last['missing']}")
for one, many in comm["buckets_per_rank"]:  # both ranks: the same buckets, the same order
    assert len(one["buckets"]) == 1 and one["buckets"][0]["missing"] == 0  # one bucket waits for every gradient
    assert len(many["buckets"]) > 1 and many["buckets"][0]["missing"] > 0 == many["buckets"][-1]["missing"]

# %%
# NBVAL_IGNORE_OUTPUT
for b in comm["buckets"]:
    spans = ", ".join(f"#{k['index']} {k['start_ms']:.2f}-{k['end_ms']:.2f}" for k in b["buckets"])
    print(f"bucket_cap_mb={b['bucket_cap_mb']:g}: backward() returned after {b['backward_ms']:.2f} ms; "
          f"each bucket's all-reduce, in ms from the start of backward(): {spans}")

# %% [markdown]
# The line above gives, for each bucket, when its all-reduce ran, counted from the start of `backward()` (which
# returns only after every bucket's all-reduce has finished). With several buckets, bucket 0's all-reduce is on the
# wire while backward is still computing the first layers' gradients. On a CPU the two share the cores, so little
# is won; on a GPU the all-reduce runs on the links while the GPU computes, and a step can hide most of it.
#
# **Channels and `NCCL_MAX_NCHANNELS`.** NCCL cuts every collective into *channels*. A channel is one ring (or tree)
# through all the ranks, driven on each GPU by one CUDA block with its own buffers (`NCCL_BUFFSIZE` bytes per peer
# for the Simple protocol), and it carries its own slice of the message. Running several channels at once is how NCCL
# fills several NVLinks or network adapters together: the `Channel 00/16` lines of the log below come from a
# communicator with 16. NCCL picks the number from the topology; `NCCL_MIN_NCHANNELS` and `NCCL_MAX_NCHANNELS` only
# bound it. Capping it leaves more of the GPU to compute kernels that run at the same time (fewer blocks busy with
# communication, fewer buffers), and costs bandwidth on large messages. It starts no all-reduce earlier, so it
# creates no overlap.
#
# > **Common misconception** (seed 002 §8.2): for multi-node training, set `NCCL_SOCKET_NTHREADS` to the number of
# > CPU cores.
# >
# > **Why it is wrong:** the variable belongs to NCCL's socket transport, the TCP path between nodes: it is the
# > number of helper threads per network connection, from 1 to 16 (NCCL lowers a larger value to 16 with a warning),
# > and `NCCL_SOCKET_NTHREADS` × `NCCL_NSOCKS_PERTHREAD` may not exceed 64 sockets. Over InfiniBand or RoCE, which the
# > same section recommends (ibverbs), NCCL does not use it at all, nor between GPUs of one node. A node's core count
# > as its value would be cut to 16 threads per connection, each taking CPU time from the data loader.
# >
# > **What is true:** on InfiniBand leave it alone. On nodes linked only by Ethernet, NCCL's defaults depend on the
# > platform (its documentation: 1 thread with 1 socket in general, more on AWS and Google Cloud network adapters;
# > recent versions start no helper thread at all on a generic adapter); the same documentation suggests trying 4 of
# > each on a 100 Gb/s network. Measure with nccl-tests before keeping
# > any value.

# %%
# NBVAL_IGNORE_OUTPUT
if device.is_cuda():
    print("NCCL version:", device.nccl_version())
    print(subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=True).stdout)
else:
    print("No CUDA device: torch here has no NCCL, and there is no nvidia-smi. See the example below.")

# %% [markdown]
# *An explained example* (a typical 4-GPU node with one NIC; illustrative, not measured on this machine):
#
# ```
#         GPU0  GPU1  GPU2  GPU3  NIC0   CPU Affinity  NUMA Affinity
# GPU0     X    NV4   NV4   NV4   PXB    0-31          0
# GPU1    NV4    X    NV4   NV4   PXB    0-31          0
# GPU2    NV4   NV4    X    NV4   SYS    32-63         1
# GPU3    NV4   NV4   NV4    X    SYS    32-63         1
# ```
#
# Every GPU pair has 4 NVLinks (fast all-reduce inside the node). GPU0/1 reach the NIC through PCIe switches,
# GPU2/3 only across the CPU sockets (`SYS`): inter-node traffic from them is slower, and NCCL's rings are
# built around that.
#
# **Reading an `NCCL_DEBUG=INFO` log.** Every line starts with `host:pid:tid [cuda device]`. A job of 2 nodes × 8
# GPUs prints, per rank, something like this at its first collective (an illustrative excerpt in NCCL 2.2x's format,
# shortened, not measured here):
#
# ```
# gpu01:81234:81234 [0] NCCL INFO Bootstrap : Using ib0:10.10.0.11<0>                          (1)
# gpu01:81234:81234 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
# gpu01:81234:81290 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.10.0.11<0>   (2)
# gpu01:81234:81290 [0] NCCL INFO Using network IB
# gpu01:81234:81290 [0] NCCL INFO comm 0x55d0c8a04f20 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0   (3)
# gpu01:81234:81290 [0] NCCL INFO Channel 00/16 :    0   7   6   5   4   3   2   1   8  15  14  13  12  11  10   9   (4)
# gpu01:81234:81290 [0] NCCL INFO Channel 00/0 : 0[0] -> 7[7] via P2P/CUMEM/read                 (5)
# gpu01:81234:81290 [0] NCCL INFO Channel 00/0 : 9[1] -> 0[0] [receive] via NET/IB/0/GDRDMA     (6)
# gpu01:81234:81290 [0] NCCL INFO Connected all rings
# gpu01:81234:81290 [0] NCCL INFO Connected all trees
# gpu01:81234:81290 [0] NCCL INFO comm 0x55d0c8a04f20 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 7000 commId 0x8a4f3c21d7e0b915 - Init COMPLETE   (7)
# ```
#
# 1. The interface of NCCL's own bootstrap sockets. `docker0`, `lo` or an address the other node cannot reach here is
#    the classic hang at start-up: set `NCCL_SOCKET_IFNAME`.
# 2. The inter-node transport. `NET/IB` with the adapters it chose is what you want on an InfiniBand or RoCE cluster.
#    `NET/Socket : Using [0]eth0...` followed by `Using network Socket` means TCP: a multi-node job many times slower,
#    usually because of `NCCL_IB_DISABLE=1`, a container without the RDMA devices, or a missing driver.
# 3. The layout NCCL sees: ranks, nodes, ranks per node. A wrong `nNodes` means the launcher placed the ranks
#    differently than you think.
# 4. One ring per channel, as rank numbers. Here it goes round the 8 GPUs of node 1, crosses to node 2 and comes back:
#    two crossings per ring, as a ring should have. More channels spread traffic over more links and adapters.
#    In this ring rank 0 sends to rank 7 (the next line) and receives from rank 9, across the network (line 6).
# 5. Inside a node: `P2P` (NVLink or PCIe peer-to-peer, the fast path). `via SHM` means the GPUs could not talk
#    directly and the data is staged through host memory: expected when P2P is disabled or impossible (some
#    virtual machines, containers without IPC, PCIe ACS), and a large slowdown on a node that has NVLink.
# 6. Between nodes: `NET/IB/<adapter>`, with `GDRDMA` when the adapter reads and writes GPU memory directly
#    (GPUDirect RDMA). Without it the data passes through host memory: slower, but it works.
# 7. `Init COMPLETE` on every rank means the communicator exists. A job that prints it on some ranks and never on
#    others is stuck in initialisation (a rank that never arrived, a firewall); a job that prints it everywhere and
#    then hangs is stuck in a collective: look for the rank that stopped calling (the flight recorder of
#    `TORCH_NCCL_DUMP_ON_TIMEOUT=1` with `TORCH_FR_BUFFER_SIZE` > 0, or `TORCH_DISTRIBUTED_DEBUG=DETAIL`, as
#    in notebook 13).
#
# > **Common misconception** (seed 002 §4.2, seed 000 §6): on one server with 8 A100 GPUs, NCCL's socket and
# > InfiniBand settings tune the all-reduce: seed 002 sets `NCCL_NSOCKS_PERTHREAD=4`, seed 000 exports
# > `NCCL_IB_DISABLE=0` and `NCCL_IB_TIMEOUT=22` for its one 8×A100 node.
# >
# > **Why it is wrong:** inside one node NCCL moves data between GPUs with its intra-node transports: P2P over
# > NVLink or PCIe, or SHM through host memory (line 5 of the log above). The network transports, InfiniBand
# > (`NCCL_IB_*`) and TCP sockets (`NCCL_NSOCKS_PERTHREAD`, `NCCL_SOCKET_NTHREADS`), are for traffic to other nodes.
# > NCCL sends traffic between two GPUs of one node through a network adapter only where it computes that the way
# > through the adapter is faster (some PCIe-only servers; `NCCL_NET_DISABLE_INTRA=1` forbids it), never where
# > NVLink joins the GPUs. `NCCL_IB_DISABLE=0` is the default anyway, and
# > `NCCL_IB_TIMEOUT` sets how long an InfiniBand connection waits before it reports an error (22: 17 s per try,
# > about 2 minutes with the default 7 retries), not how fast it sends.
# >
# > **What is true:** on an 8-GPU NVLink/NVSwitch server (SXM GPUs) the all-reduce runs over NVLink, and the socket
# > and IB settings change nothing there; read `NCCL_DEBUG=INFO`'s `via P2P` lines and `nvidia-smi topo -m` instead.
# > Those settings start to matter with the second node.
#
# > **Common misconception** (seed 000 §5.4): when a multi-GPU job communicates slowly, NCCL has taken TCP where it
# > should have taken NVLink.
# >
# > **Why it is wrong:** between GPUs of one node, NVLink's fallback is not TCP. Without NVLink peer access NCCL uses
# > PCIe peer-to-peer (`P2P` in the log) or, when the GPUs cannot reach each other directly (P2P disabled, some
# > virtual machines and containers, PCIe ACS), shared host memory (`via SHM`). NCCL sends intra-node traffic through
# > a network adapter only when SHM is switched off too (`NCCL_SHM_DISABLE=1`), or on a PCIe server where it
# > computes that the way through an adapter is faster; never where NVLink joins the GPUs. TCP (`NET/Socket`) is
# > NCCL's fallback between nodes, instead of InfiniBand.
# >
# > **What is true:** name the path from the log: `via P2P` (good), `via SHM` (a slow node-internal path: find out
# > why P2P is off), `NET/Socket` (multi-node traffic on TCP: check `NCCL_IB_DISABLE` and the RDMA devices).
#
# > **Common misconception** (seed 000 §2.3): NCCL relays messages through shared memory by default.
# >
# > **Why it is wrong:** SHM is a fallback, not NCCL's default path. Between GPUs of one node NCCL prefers P2P
# > (NVLink, else PCIe peer-to-peer) and takes SHM only when P2P is impossible, disabled, or not allowed over that
# > distance, e.g. across CPU sockets (NCCL's documentation of `NCCL_P2P_LEVEL` and `NCCL_SHM_DISABLE`); between nodes it uses InfiniBand or RoCE (with GPUDirect RDMA where the
# > adapter can reach GPU memory), else TCP sockets, and shared memory plays no part there. Nor does InfiniBand need
# > to be switched on, as the same paragraph of the article says: NCCL uses it whenever it finds an RDMA adapter
# > (`NCCL_IB_DISABLE` defaults to 0), and falls back to TCP only when it finds none or is told not to use it.
# >
# > **What is true:** on a healthy NVLink node the log says `via P2P` for every channel; `via SHM` there is the
# > symptom to chase (line 5 of the log above).
#
# **The slow-rank effect.** A collective finishes only when the *last* rank arrives, so every step runs at the
# pace of the slowest rank (a busy node, a thermally throttled GPU, a rank that also writes logs). In the fp16 run
# of section 3, rank 1 slept 20 ms per micro-batch, 80 ms per step; rank 0 did not sleep. Their step times:

# %%
# NBVAL_IGNORE_OUTPUT
step_ms = [t * 1e3 for t in amp["timings"]["step_s_median_per_rank"]]
slept = amp["accum"] * 20  # ms per step: 20 ms per micro-batch
print(f"median step time: rank 0 {step_ms[0]:.1f} ms, rank 1 {step_ms[1]:.1f} ms (rank 1's sleep alone: {slept} ms)")
assert min(step_ms) >= slept  # rank 0 too: it waits for rank 1 in every all-reduce

# %% [markdown]
# Rank 0 never sleeps, yet its steps cannot be shorter than rank 1's 80 ms of sleep (the cell asserts it): it waits
# inside the all-reduce.
#
# **Barrier misuse.** Collectives (all-reduce, broadcast, `barrier()`) must be called by *every* rank, in the same
# order. `if rank == 0: save(); dist.barrier()` leaves rank 0 waiting for partners that never come, or pairs its
# barrier with someone else's next collective. The right pattern, used by the recipe: rank 0 saves, then *all*
# ranks call `barrier()`. And barriers that are not needed only add slow-rank waits.
#
# **Timeouts.** A rank that never arrives makes the others wait until the process-group timeout (PyTorch's
# default: 10 minutes for NCCL, 30 for gloo), after which NCCL's watchdog aborts the job with an error instead of
# hanging forever. Set `timeout=` in `init_process_group` (the recipe's `--pg-timeout`) shorter when debugging.
# Here rank 1 sleeps 6 s and the timeout is 2 s:

# %%
try:
    launch("labkit.recipes.ddp", nproc=2, timeout=120, stream=False,
           args=[*BASE, "--steps", "2", "--slow-rank", "1", "--slow-ms", "6000", "--pg-timeout", "2"])
except LaunchError as err:
    timeout_err = err
said = (timeout_err.rank_traceback + timeout_err.log).lower()
print("failed rank:", timeout_err.rank, "| it reports a timeout:", any(w in said for w in ("timed out", "timeout")))
assert timeout_err.rank == 0 and any(w in said for w in ("timed out", "timeout"))

# %% [markdown]
# ## 7. When a rank dies: a clean error, then resume
#
# `--crash-rank 1 --crash-step 3` makes rank 1 raise at the start of step 3. The run checkpoints every 2 steps
# (rank 0 writes atomically, then all ranks meet at a barrier), so step 2's checkpoint exists when it dies.
# The launcher raises within seconds, with rank 1's traceback, and no process is left behind:

# %%
crash_args = [*BASE, "--batch", "64", "--ckpt-dir", str(work / "crash"), "--ckpt-every", "2"]
try:
    launch("labkit.recipes.ddp", nproc=2, args=[*crash_args, "--crash-rank", "1", "--crash-step", "3"],
           timeout=180, stream=False)
except LaunchError as err:
    crash = err
print(f"rank {crash.rank} failed:", crash.rank_traceback.splitlines()[-1])
print("processes left behind:", crash.leftover)
assert crash.rank == 1 and "injected crash" in crash.rank_traceback and crash.leftover == []

# %% [markdown]
# Resuming loads model, optimizer (and scaler) state and the step number from the last checkpoint; the
# `DistributedSampler` is set to the right epoch and skips the batches already seen. On the CPU in fp32 every
# operation is deterministic, so the resumed run must end in **exactly** the weights of the uninterrupted run
# from section 2:

# %%
resumed = launch("labkit.recipes.ddp", nproc=2, args=[*crash_args, "--resume"], timeout=180, stream=False)
a = train.load_checkpoint(work / "ref" / train.CHECKPOINT_NAME)["model"]
b = train.load_checkpoint(work / "crash" / train.CHECKPOINT_NAME)["model"]
bitwise = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
print("resumed from step", resumed["resumed_from"], "| final weights bitwise equal:", bitwise)
assert resumed["resumed_from"] == 2 and all(torch.allclose(a[k], b[k]) for k in a)
if DEV == "cpu":  # fp32 on the CPU: exactly the same weights and losses
    assert bitwise and resumed["losses"] == two["losses"]

# %% [markdown]
# (On a GPU, bitwise equality additionally needs deterministic kernels and the same NCCL algorithm choice; in
# fp16 the scaler state must come back too, which the checkpoint includes.)
#
# ## 8. Exercises
#
# **8.1** A job runs on 4 nodes × 8 GPUs, with micro-batch 16 per GPU and 4 gradient-accumulation steps. What is
# the global batch per optimizer step?

# %%
answer = ...
### BEGIN SOLUTION
answer = 16 * (4 * 8) * 4
### END SOLUTION
check("09.global-batch", answer)

# %% [markdown]
# **8.2** The recipe was tuned with learning rate 3e-4 at global batch 256. With the linear scaling rule, which
# learning rate goes with the global batch of 8.1?
#
# (The linear rule was established for SGD with momentum, with a warm-up; for Adam and AdamW a square-root rule is
# often closer, and at large batches neither holds without re-tuning. Take the rule's answer as the starting point
# of a learning-rate sweep, not as the answer.)

# %%
answer = ...
### BEGIN SOLUTION
answer = 3e-4 * (16 * 32 * 4) / 256
### END SOLUTION
check("09.lr-scaling", answer)

# %% [markdown]
# **8.3** Write `busbw(algbw, n)`: the bus bandwidth nccl-tests reports for an all-reduce over `n` ranks, given
# the measured algbw. (An 8-GPU all-reduce with algbw 120 GB/s should come out at 210 GB/s.)

# %%
def busbw(algbw, n):
    ...
    ### BEGIN SOLUTION
    return algbw * 2 * (n - 1) / n
    ### END SOLUTION


check("09.busbw", busbw)

# %% [markdown]
# **8.4** Three ranks need 100, 100 and 160 ms of compute per step, and the all-reduce takes 20 ms once all have
# arrived. How long is a step, in ms?

# %%
answer = ...
### BEGIN SOLUTION
answer = max(100, 100, 160) + 20
### END SOLUTION
check("09.slow-rank", answer)

# %% [markdown]
# **8.5 Debug: the all-reduce that was not an average.** Hand-written data parallelism (without DDP) averages the
# gradients itself after backward. `all_reduce` is `torch.distributed.all_reduce` in a real run; here
# `simulate_all_reduce` runs the function once per simulated rank, in threads, with an `all_reduce` that does what
# torch's does to each rank's tensor. Rank 0's gradient is [1, 2], rank 1's is [3, 6]:

# %%
def average_gradients(params, world_size, all_reduce):
    for p in params:
        all_reduce(p.grad)

after = simulate_all_reduce(average_gradients, [[torch.tensor([1.0, 2.0])], [torch.tensor([3.0, 6.0])]])
print("after the 'average':", [r[0].tolist() for r in after], "  the mean is [2.0, 4.0]")
assert [r[0].tolist() for r in after] == [[4.0, 8.0]] * 2  # the sum, on every rank: twice the mean

# %% [markdown]
# Write a fixed `average_gradients(params, world_size, all_reduce)` that leaves every rank with the mean gradient.
# The check runs it on 2, 3 and 4 simulated ranks.

# %%
def average_gradients(params, world_size, all_reduce):
    ...
    ### BEGIN SOLUTION
    for p in params:
        all_reduce(p.grad)
        p.grad /= world_size
    ### END SOLUTION


check("09.average-grads", average_gradients)

# %% [markdown]
# ## Summary
#
# - Data parallelism = replicas + disjoint data shards + an all-reduce of gradients. The global batch is
#   micro-batch × ranks × accumulation; 2 ranks × b trains like 1 rank × 2b, up to rounding.
# - An all-reduce sums; the mean needs a division by the number of ranks. DDP does it first: each gradient is
#   scaled by 1/world size, then the all-reduce sums the scaled gradients (notebook 11's DDP by hand does the same).
#   Dividing after the sum, as 8.5's reference solution does, gives the same mean up to rounding; dividing first
#   also keeps an fp16 sum from overflowing.
# - Launch ranks from a notebook as a `torchrun` subprocess with a timeout (`labkit.dist.launch`), never `!cmd`
#   or `mp.spawn`; a failed rank must become an exception with its traceback, and no process may survive.
# - With AMP: one GradScaler per rank, created before or after the DDP wrap alike (its initial state is a constant);
#   the scalers agree because they see all-reduced gradients. bf16 needs no scaler.
# - `no_sync()` turns accumulation steps into local additions: one synchronisation (one all-reduce per bucket) per
#   optimizer step.
# - Communication's share of a step is a property of the job (model, batch, links), not a constant: measure it. The
#   overlap of all-reduce with backward comes from DDP's buckets (`bucket_cap_mb`), not from NCCL's buffer or channel
#   settings; `NCCL_IB_*` and the socket settings only matter between nodes.
# - busbw = algbw × 2(n-1)/n makes all-reduce speed comparable with link bandwidth; small messages are
#   latency-bound, large ones bandwidth-bound.
# - NCCL: `NCCL_DEBUG=INFO` first, beware a stray `NCCL_IB_DISABLE=1`, read `nvidia-smi topo -m`. The slowest rank
#   sets the pace; collectives must be called by all ranks; timeouts turn hangs into errors.
# - Checkpoint atomically on rank 0 plus a barrier, and a crashed run resumes to the same weights: bitwise on the
#   CPU in fp32 (as here), to rounding on GPUs.
#
# Next, notebook 10 shards the optimizer state, gradients and parameters across ranks with DeepSpeed ZeRO.
