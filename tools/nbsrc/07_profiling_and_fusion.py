# %% [markdown]
# # 07 · Profiling, fusion and the roofline
#
# **Objectives**
# - profile a real training step with `torch.profiler`: read the key_averages table sorted by *self* time,
#   find the few ops that take most of the time, and write a Chrome trace to open in Perfetto;
# - measure **kernel-launch overhead**: many tiny ops against one big op;
# - fuse a memory-bound chain (bias + GELU + dropout) by hand and with `torch.compile`, and explain why fusion
#   helps memory-bound chains and does little for a compute-bound matmul;
# - measure this machine's ceilings (peak matmul FLOP/s per dtype, copy bandwidth), compare them with the
#   theoretical peak, and place measured ops on the **roofline**: memory- or compute-bound, and at what % of the roof;
# - read utilisation correctly: what `nvidia-smi`'s GPU-Util measures (and what DCGM and Nsight add), the busy
#   fraction of a trace, throughput in tokens/s and **MFU**;
# - work like an engineer: baseline first, one change at a time, a notes table.
#
# **Prerequisites:** notebook 04 (the tiny GPT, autocast), notebook 06 (where memory goes).
#
# **Estimated time:** 55 min
#
# All timings below depend on the machine and on what else runs on it, so their cells are not compared by the
# tests; the cells assert only facts that hold everywhere (same results, fewer bytes, which side of the ridge).

# %%
# %matplotlib inline
import os

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # small machines: compile workers steal the cores
import matplotlib.pyplot as plt
import torch

from labkit import bench, device, models
from labkit import profiling as P
from labkit import roofline as R
from labkit.check import check, predict, reveal
from labkit.exercises.nb07 import H100_BANDWIDTH, H100_BF16_FLOPS, PROFILE_TABLE

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: steadier timings on a shared 2-core machine (raise it on your own node)
dev = device.pick_device()
device.inductor_cache_per_cpu_class()  # torch.compile's disk cache is not safe across CPU classes
notes = []  # the lab notebook of this session: one row per measurement

# %% [markdown]
# ## 1. Measure first: profile a training step
#
# The rule: **never optimise what you have not measured.** In a typical step a minority of the distinct ops takes
# most of the time (section 1 counts how many cover 80 % here); an op above ~20 % is worth a look, one below 2 % is
# not, however ugly its code. The profiler records every
# op (`aten::...`) with its **self** time (inside the op, excluding the ops it calls) and its **total** time
# (including them). Sort by self time: total time counts the children again, so `aten::linear` looks expensive
# although the work is in `aten::addmm`.
#
# `P.profile_steps` runs one warm-up step (the first step pays one-off costs: allocations, lazy init), then
# profiles 3 steps of the tiny GPT (forward, backward, AdamW):

# %%
step = P.make_gpt_step(batch=32, device=dev)
baseline_loss = step()
prof = P.profile_steps(step, steps=3, device=dev)

# %%
# NBVAL_IGNORE_OUTPUT
print(P.op_table(prof, row_limit=12))

# %% [markdown]
# The top ops and their share of the total self time (annotations are left out: our `train_step` label, which is
# Python between ops, and torch's own, such as `Optimizer.step#AdamW.step`):

# %%
# NBVAL_IGNORE_OUTPUT
ops = P.top_ops(prof, k=1000)
for op in ops[:8]:
    print(f"{op.name:<40} {op.self_us / 1e3:8.2f} ms  {op.share:6.1%}  x{op.calls}")
n80 = P.ops_to_cover([o.share for o in ops], 0.8)
print(f"\n{n80} of {len(ops)} distinct ops cover 80 % of the self time")

# %%
names = [o.name for o in ops]
assert {"aten::addmm", "aten::native_layer_norm", "aten::mm"} <= set(names)
assert abs(sum(o.share for o in ops) - 1) < 1e-6 and n80 <= len(ops) // 2  # a minority of ops dominates
assert not any("#" in n or n == "train_step" for n in names)                 # no annotation ranked as an op
notes.append(("profile tiny GPT step", f"{n80} of {len(ops)} ops = 80 % of self time"))

# %% [markdown]
# ### The timeline: a Chrome trace
#
# The table aggregates; the **trace** shows every op on a timeline, per thread (and per CUDA stream on a GPU).
# Open the file in <https://ui.perfetto.dev> ("Open trace file"; it stays in your browser) or in
# `chrome://tracing`. Look for gaps between ops: on a GPU, gaps on the stream mean the GPU waits for Python.

# %%
trace = P.write_chrome_trace(prof, "_out/07_gpt_step_trace.json")
events = P.read_chrome_trace(trace)["traceEvents"]
# the CPU's spans ("user_annotation"); a GPU trace repeats each on the GPU's timeline ("gpu_user_annotation")
steps_seen = sum(1 for e in events if e.get("name") == "train_step" and e.get("cat") == "user_annotation")
print(f"trace written to notebooks/{trace.as_posix()}: {steps_seen} train_step spans, open it in ui.perfetto.dev")
assert trace.exists() and steps_seen == 3

# %% [markdown]
# **On a GPU** the same call also records the CUDA activity: the table gets *Self CUDA* / *CUDA total* columns,
# and you should sort by device time (`P.op_table(prof, by="device")`), because the CPU only *launches* kernels
# and its times are launch times. For deeper GPU work use NVIDIA's tools: **Nsight Systems**
# (`nsys profile -o step python train.py`) for the whole timeline (CPU, CUDA API, kernels, NCCL, memcpy) and
# **Nsight Compute** (`ncu --set full -k regex:gemm python train.py`) for one kernel's achieved FLOP/s, memory
# throughput and its own roofline.

# %%
# NBVAL_IGNORE_OUTPUT
if device.is_cuda(dev):
    print(P.op_table(prof, by="device", row_limit=10))
else:
    print("No GPU here: the table above has CPU columns only. On a CUDA device this cell prints the table\n"
          "sorted by Self CUDA time; run nsys / ncu from a terminal on the GPU node.")

# %% [markdown]
# ## 2. Kernel-launch overhead: many tiny ops vs one big op
#
# **Predict, then run.** 2000 adds of 64 elements race one add of 128 000 elements: the same arithmetic. Which
# finishes first: `"one big add"`, `"2000 tiny adds"`, or are they `"about the same"`?

# %%
prediction = ...
### BEGIN SOLUTION
prediction = "one big add"
### END SOLUTION
predict("07.launch-overhead", prediction)

# %% [markdown]
# Every op costs a fixed overhead before any arithmetic: Python, PyTorch's dispatcher, and on a GPU the kernel
# launch (a few µs). The race, measured round-robin in one run, median of 5:

# %%
# NBVAL_IGNORE_OUTPUT
lo = P.launch_overhead(n_ops=2000, size=64, device=dev)
print(f"2000 tiny adds: {lo['many_s'] * 1e3:.2f} ms, one big add: {lo['one_s'] * 1e3:.3f} ms "
      f"-> {lo['ratio']:.0f}x slower, {lo['overhead_us']:.1f} µs per op")
notes.append(("launch overhead", f"{lo['overhead_us']:.1f} µs/op, many/one = {lo['ratio']:.0f}x"))

# %% tags=["workspace-clear"]
reveal("07.launch-overhead", "one big add" if lo["ratio"] > 2 else "2000 tiny adds" if lo["ratio"] < 0.5 else
       "about the same")
assert lo["ratio"] > 2  # per-op overhead dwarfs 64 elements of work on any device

# %% [markdown]
# This is why small models are slow out of proportion, why frameworks batch work (`torch._foreach_*` optimizers,
# fused Adam) and why CUDA graphs exist: they replay a whole step's launches as one.
#
# ## 3. Operator fusion
#
# A GPT-2-style MLP computes `dropout(gelu(x @ W + b))`, and old code writes GELU's tanh formula out by hand.
# Each line of `P.gelu_chain_unfused` is its own kernel that reads its inputs from memory and writes a new tensor:

# %%
for i, (what, reads, writes, mask) in enumerate(P.CHAIN_STEPS, 1):
    print(f"{i:>2}. {what:<20} reads {reads + mask} tensor(s), writes {writes}")

# %% [markdown]
# Three versions compute the same thing (the dropout mask is passed in, so all agree; a fused dropout kernel
# draws it in-kernel from a counter-based RNG instead):
#
# - **unfused**: 12 kernels, 12 round trips through memory;
# - **fused by hand** (`P.gelu_chain_fused`): the chain runs block by block on rows that fit in the L2 cache,
#   in place, so each element goes to memory once: the idea of a fused kernel, done with the cache;
# - **`torch.compile`**: Inductor traces the function and generates *one* loop (C++/OpenMP on CPU, Triton on a
#   GPU) that reads x and the mask once and writes y once.
#
# The byte counts, from the model (12 FLOPs per element in every version):

# %%
rows, cols, p = 2048, 2048, 0.1
x = torch.randn(rows, cols, device=dev)
bias = torch.randn(cols, device=dev)
mask = torch.rand(rows, cols, device=dev) > p
cost_unfused = P.gelu_chain_cost(x.numel(), x.dtype, fused=False)
cost_fused = P.gelu_chain_cost(x.numel(), x.dtype, fused=True)
print(f"unfused moves {cost_unfused.bytes / 2**20:.0f} MiB ({cost_unfused.intensity:.2f} FLOP/B), "
      f"fused {cost_fused.bytes / 2**20:.0f} MiB ({cost_fused.intensity:.2f} FLOP/B)")
assert cost_fused.bytes * 10 < cost_unfused.bytes and cost_fused.flops == cost_unfused.flops

# %% [markdown]
# Compile it. The first call traces and compiles (seconds to tens of seconds on 2 cores; cached on disk for next
# time), so it is timed on its own and never mixed into the steady-state comparison:

# %%
# NBVAL_IGNORE_OUTPUT
chain_compiled, first_call_s = P.compile_timed(P.gelu_chain_unfused, x, bias, mask, p)
print(f"torch.compile first call (trace, generate and compile the kernel): {first_call_s:.1f} s")
notes.append(("torch.compile first call", f"{first_call_s:.1f} s"))

# %% [markdown]
# Same numbers from all four, then the race (round-robin, median of 5, one run):

# %%
ref = P.gelu_chain_reference(x, bias, mask, p)
versions = {"unfused (12 ops)": P.gelu_chain_unfused, "fused by hand": P.gelu_chain_fused,
            "F.gelu (library)": P.gelu_chain_reference, "torch.compile": chain_compiled}
for fn in versions.values():
    torch.testing.assert_close(fn(x, bias, mask, p), ref, atol=1e-5, rtol=1e-5)
print("all versions agree with F.gelu(approximate='tanh') + dropout to 1e-5")

# %%
# NBVAL_IGNORE_OUTPUT
times = P.interleaved_times(versions, x, bias, mask, p, repeats=5, device=dev)
for name, t in times.items():
    print(f"{name:<18} {t * 1e3:8.2f} ms   {times['unfused (12 ops)'] / t:5.2f}x vs unfused")
notes.append(("fusion (2048x2048 fp32)", ", ".join(f"{k}: {v * 1e3:.1f} ms" for k, v in times.items())))

# %% [markdown]
# **When fusion helps, when it does not.** Even fused, the chain does only about 1 FLOP per byte moved (section 5
# prints its intensity): it is memory-bound, so time is bytes moved, and cutting the bytes 12x is the whole game. A large matmul is the opposite: each element
# is reused ~n times from cache, the time is arithmetic, and fusing its bias or activation in (an *epilogue*)
# saves one pass over the output, a few percent. Fuse chains of elementwise ops, norms and softmaxes; for a
# matmul, get a faster matmul (lower precision, tensor cores / AMX). Section 4 puts numbers on this.
#
# > **Common misconception** (seed 002 §3.2): a module whose `forward` returns `relu(linear(x))` is a "fused"
# > Linear+ReLU that runs as a single kernel.
# >
# > **Why it is wrong:** putting two operations in one `forward` changes nothing about how they run: eager PyTorch
# > still runs the matmul, writes its output to memory, then runs ReLU, which reads it back. Fusion is done by a
# > compiler or a kernel author.
# >
# > **What is true:** the profiler below lists the module's operations: `aten::addmm` and `aten::relu`, two
# > kernels. `torch.compile` (above) or a hand-written kernel (notebook 08) fuses them into one.

# %%
class FusedLinearReLU(torch.nn.Module):          # the article's "fused" module, as it writes it
    def __init__(self, d_in, d_out):
        super().__init__(); self.linear = torch.nn.Linear(d_in, d_out)
    def forward(self, x):
        return torch.relu(self.linear(x))
fused, x_small = FusedLinearReLU(256, 256), torch.randn(64, 256)
pr = P.profile_steps(lambda: fused(x_small), steps=1, warmup=0)   # torch.profiler, as in section 1
ran = sorted({e.key for e in pr.key_averages()} & {"aten::addmm", "aten::relu", "aten::clamp_min"})
print("operations that ran as kernels of their own:", ran)
assert {"aten::addmm", "aten::relu"} <= set(ran)

# %% [markdown]
# ## 4. This machine's ceilings
#
# **Compute:** the best matmul FLOP/s over a few shapes (the "maximum achievable matmul FLOPs": what a real
# kernel reaches, not the datasheet), for fp32 and bf16. **Memory:** a large copy, counting the bytes read
# *and* written.

# %%
# NBVAL_IGNORE_OUTPUT
shapes = ((512, 512, 512), (1024, 1024, 1024), (2048, 1024, 1024))
BF16_FAST = device.fast(torch.bfloat16, dev)  # emulated bf16 is slow: measure it on the smallest shape only
peaks = {"fp32": bench.peak_matmul_flops("fp32", dev, shapes)}
if device.computes(torch.bfloat16, dev):
    peaks["bf16"] = bench.peak_matmul_flops("bf16", dev, shapes if BF16_FAST else shapes[:1])
bw = bench.memory_bandwidth(256 * 2**20, dev)
for name, pk in peaks.items():
    print(f"{name}: {pk.flops_per_s / 1e9:8.1f} GFLOP/s (best shape {pk.shape})")
print(f"copy bandwidth: {bw.bytes_per_s / 1e9:.1f} GB/s (read + write)")

# %% [markdown]
# The **theoretical** peak is units × frequency × FLOPs per cycle: on a CPU, cores × clock × what the ISA does
# per cycle (AVX-512 FMA: 16 fp32 lanes × 2 FLOPs × 2 units; AMX-BF16: 1024 FLOPs/cycle); on a GPU, SMs × clock
# × FLOPs/clock/SM of its tensor cores. The formula rests on assumptions, printed with it. Real jobs reach part of it:

# %%
# NBVAL_IGNORE_OUTPUT
for name, pk in peaks.items():
    theo = bench.theoretical_peak(name, dev)
    print(theo.describe())
    print(f"  measured {pk.flops_per_s / 1e9:.1f} GFLOP/s = {pk.flops_per_s / theo.flops_per_s:.0%} of it")
    print("  " + (bench.excess_note(theo, pk.flops_per_s) or "below it, as a measurement should be") + "\n")
    notes.append((f"peak {name}", f"{pk.flops_per_s / 1e9:.0f} of {theo.flops_per_s / 1e9:.0f} GFLOP/s"))
notes.append(("copy bandwidth", f"{bw.bytes_per_s / 1e9:.1f} GB/s"))

# %% [markdown]
# ## 5. The roofline
#
# Time four kinds of op on this machine and place them: a 1024³ fp32 matmul (the shape measured above), a bf16
# matmul, LayerNorm and softmax over 2048 × 2048, and the GELU chain unfused and compiled.

# %%
n = 1024
a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
ab16, bb16 = a.bfloat16(), b.bfloat16()
ln = torch.nn.LayerNorm(cols).to(dev).requires_grad_(False)
timed = {"mm fp32 1024": (lambda: a @ b, R.matmul_cost(n, n, n, "fp32")),
         "layernorm": (lambda: ln(x), R.layernorm_cost(rows, cols, "fp32")),
         "softmax": (lambda: torch.softmax(x, -1), R.softmax_cost(rows, cols, "fp32")),
         "chain unfused": (lambda: P.gelu_chain_unfused(x, bias, mask, p), cost_unfused),
         "chain compiled": (lambda: chain_compiled(x, bias, mask, p), cost_fused)}
if "bf16" in peaks:
    timed["mm bf16 1024"] = (lambda: ab16 @ bb16, R.matmul_cost(n, n, n, "bf16"))
secs = P.interleaved_times({k: f for k, (f, _) in timed.items()}, repeats=5, device=dev)

# %%
# NBVAL_IGNORE_OUTPUT
points = [R.place(c, secs[k], peaks["bf16" if "bf16" in k else "fp32"].flops_per_s, bw.bytes_per_s, name=k)
          for k, (_, c) in timed.items()]
print(R.table(points))
R.plot({k: v.flops_per_s for k, v in peaks.items()}, bw.bytes_per_s, points)
plt.show()

# %% [markdown]
# A point *above* 100 % of its roof is not an error: the copy measured main-memory bandwidth with tensors far
# larger than the cache, while a 16 MiB activation can stay partly in L2/L3, whose bandwidth is higher. Real
# machines have one bandwidth roof per memory level (the *hierarchical* roofline; Nsight Compute draws it on a GPU).
#
# Read it: the matmuls sit right of the ridge point (compute-bound; the bf16 roof is higher, which is why mixed
# precision speeds matmuls up); LayerNorm, softmax and the GELU chain sit far left (memory-bound: their roof is
# the bandwidth slope, and only moving fewer bytes helps). Fusion moved the chain *right* (same FLOPs, fewer
# bytes): that is what fusion does on a roofline. The bounds follow from the intensities and hold on any machine
# whose ridge point lies between ~2 and ~150 FLOP/byte (CPUs: ~5-30; GPUs: ~100-300, where even the 1024³ fp32
# matmul is closer to the ridge):

# %%
bounds = {pt.name: pt.bound for pt in points}
ridge = R.ridge_point(peaks["fp32"].flops_per_s, bw.bytes_per_s)
assert 2 < ridge < 150, f"this machine's fp32 ridge point is {ridge:.0f} FLOP/byte, outside the range the text assumes"
assert bounds["mm fp32 1024"] == "compute"
assert bounds["softmax"] == bounds["layernorm"] == bounds["chain unfused"] == "memory"
compiled_pt = next(pt for pt in points if pt.name == "chain compiled")
assert compiled_pt.intensity > 10 * next(pt for pt in points if pt.name == "chain unfused").intensity
assert 1 <= compiled_pt.intensity < 2  # "about 1 FLOP per byte, even fused" (section 3)
for pt in points:  # the intensities are exact: they come from the FLOP and byte model, not the clock
    print(f"{pt.name:<15} {pt.intensity:8.2f} FLOP/byte")

# %% [markdown]
# ## 6. Utilisation, throughput and MFU
#
# **What `nvidia-smi`'s "GPU-Util" measures.** The fraction of the last sample period (1/6 s to 1 s) during which
# *at least one kernel* was running on the GPU. One small kernel occupying 1 of an H100's 132 SMs for the whole
# period reads 100 %. So GPU-Util answers "is the GPU ever idle?" (0-60 % means it waits for the CPU, the data
# loader or the network: the gaps of section 1's trace), never "is it working hard?". For the second question:
#
# - **DCGM** profiling metrics (`dcgmi dmon -e 1002,1003,1004,1005`, or the DCGM exporter for Prometheus):
#   *SM activity* (`DCGM_FI_PROF_SM_ACTIVE`: the share of time each SM has at least one warp, averaged over all
#   SMs), *SM occupancy* (resident warps / the maximum), *tensor pipe activity* (`PIPE_TENSOR_ACTIVE`: how busy
#   the tensor cores are) and *DRAM activity*;
# - **Nsight Systems** `nsys profile --gpu-metrics-devices=all python train.py` draws SM activity, tensor activity
#   and DRAM bandwidth on the same timeline as the kernels; **Nsight Compute** gives one kernel's achieved occupancy;
# - the end-to-end figures, which need no tool at all: **throughput** (samples/s, tokens/s) and **MFU**.
#
# GPU-Util is the busy fraction of a kernel timeline. `P.busy_fraction` computes it from a Chrome trace: the share
# of the `train_step` spans covered by at least one event of a category (`"kernel"` on a GPU trace, `"cpu_op"` on
# this CPU trace, where the rest is Python and dispatcher time between ops). First on a made-up trace, to see how
# little it takes to read 100 %:

# %%
window = {"ph": "X", "name": "train_step", "ts": 0, "dur": 1000}
one_tiny_kernel = {"ph": "X", "cat": "kernel", "name": "tiny", "ts": 0, "dur": 1000}   # 1 block on 1 SM, all along
burst = {"ph": "X", "cat": "kernel", "name": "big gemm", "ts": 0, "dur": 300}            # every SM, 30 % of the time
print(f"one tiny kernel: {P.busy_fraction([window, one_tiny_kernel], 'kernel'):.0%} 'utilised'; "
      f"one big kernel then idle: {P.busy_fraction([window, burst], 'kernel'):.0%}")
assert P.busy_fraction([window, one_tiny_kernel], "kernel") == 1.0 and P.busy_fraction([window, burst], "kernel") == 0.3

# %% [markdown]
# And on the trace of section 1 (on a GPU, with `category="kernel"`: the same figure `nvidia-smi` would show):

# %%
# NBVAL_IGNORE_OUTPUT
busy = P.busy_fraction(events, "kernel" if device.is_cuda(dev) else "cpu_op")
print(f"busy fraction of the tiny GPT step: {busy:.0%} (the rest: Python and framework overhead between ops)")
assert 0 < busy <= 1
notes.append(("busy fraction (GPU-Util analogue)", f"{busy:.0%}"))

# %% [markdown]
# **Throughput and MFU.** Tokens per second is the figure to compare runs by (step time alone hides the batch
# size). **MFU**, *model FLOPs utilisation*, relates it to the hardware: the FLOPs the model needs per second at
# that throughput, divided by the peak FLOP/s. A dense transformer needs about **6 FLOPs per parameter per token**
# for training (2 forward, 4 backward), plus attention's 12 × layers × sequence length × d_model
# (`P.gpt_train_flops`; PaLM's appendix). PyTorch's `FlopCounterMode` (`P.count_flops`) counts the matmuls of a
# real step, and the two agree exactly. Recomputation under activation checkpointing does not count: with it
# counted, the figure is HFU (*hardware* FLOPs utilisation).

# %%
gpt_cfg = models.GPTConfig(vocab_size=12, seq_len=12)  # the model P.make_gpt_step built
flops_per_step = P.count_flops(step)
assert flops_per_step == P.gpt_train_flops(gpt_cfg, 32)
print(f"one step of 32 x 12 tokens: {flops_per_step / 1e6:.1f} MFLOP = {flops_per_step / (32 * 12) / 1e6:.2f} MFLOP/token")

# %%
# NBVAL_IGNORE_OUTPUT
step_s = bench.time_fn(step, warmup=1, repeats=5, device=dev).median
theo32 = bench.theoretical_peak("fp32", dev).flops_per_s
mfu_measured = P.mfu(flops_per_step, step_s, peaks["fp32"].flops_per_s)
print(f"step {step_s * 1e3:.1f} ms -> {32 * 12 / step_s:,.0f} tokens/s, {flops_per_step / step_s / 1e9:.2f} GFLOP/s")
print(f"MFU: {mfu_measured:.1%} of the measured fp32 matmul peak, {P.mfu(flops_per_step, step_s, theo32):.1%} "
      "of the theoretical one")
assert 0 < mfu_measured < 0.9  # far below the peak, whatever the machine
notes.append(("tiny GPT throughput", f"{32 * 12 / step_s:,.0f} tokens/s, MFU {mfu_measured:.1%} of measured peak"))

# %% [markdown]
# Far below the peak (the line above says how far on this machine): d_model = 96 gives matmuls too small to reach
# it, and the busy fraction above says
# part of the step is not even inside an op. Large-model training on GPUs reports an MFU of about 30-50 %
# (PaLM 540B: 46 %). Published MFU divides by the **datasheet** peak (the theoretical one); the first figure above
# divides by the peak measured here, which is lower, so it reads higher: compare an MFU only with one that used the
# same denominator, which is why the cell prints both. The same formula, for a 7B model at 3000 tokens/s per H100 (989 TFLOP/s dense bf16), and the
# throughput 40 % MFU would give (attention left out: small next to 6 × 7B at moderate sequence lengths):

# %%
mfu_7b = P.mfu(6 * 7e9 * 3000, 1.0, H100_BF16_FLOPS)
print(f"7B at 3000 tokens/s: MFU {mfu_7b:.1%}; 40 % MFU would be {0.4 * H100_BF16_FLOPS / (6 * 7e9):,.0f} tokens/s")
assert round(mfu_7b, 3) == 0.127

# %% [markdown]
# ## 7. Method: one change at a time, baseline first
#
# Every figure above was measured against a baseline in the *same run* (round-robin, medians), because a busy
# machine drifts by tens of percent between runs. Change one variable at a time (fusion, dtype, shape, threads),
# and write each result down with what changed. This session's notes:

# %%
# NBVAL_IGNORE_OUTPUT
for what, result in notes:
    print(f"{what:<26} | {result}")

# %% [markdown]
# ## 8. Exercises
#
# **07.axpy-intensity.** The arithmetic intensity (FLOP/byte) of `y = a * x + y` on fp32 vectors, `a` a scalar.

# %%
answer = ...
### BEGIN SOLUTION
answer = 2 / (3 * 4)  # a multiply and an add; read x, read y, write y
### END SOLUTION
check("07.axpy-intensity", answer)

# %% [markdown]
# **07.matmul-intensity.** Write `intensity(m, n, k, bytes_per_element)` for `(m, k) @ (k, n)`, reading A and B
# and writing C once. (`R.matmul_cost` does it; write it yourself.)

# %%
def intensity(m, n, k, bytes_per_element):
    ...
    ### BEGIN SOLUTION
    return 2 * m * n * k / ((m * k + k * n + m * n) * bytes_per_element)
    ### END SOLUTION


check("07.matmul-intensity", intensity)

# %% [markdown]
# **07.optimise-first** and **07.ops-for-80.** A profile of a bigger model's step (self and total time in ms):

# %%
print(f"{'op':<28} {'self ms':>8} {'total ms':>9} {'calls':>6}")
for op, self_ms, total_ms, calls in PROFILE_TABLE:
    print(f"{op:<28} {self_ms:>8.1f} {total_ms:>9.1f} {calls:>6}")

# %% [markdown]
# Which op do you optimise first? And how many ops, largest self time first, cover 80 % of the self time?

# %%
first = ...
n_for_80 = ...
### BEGIN SOLUTION
first = max(PROFILE_TABLE, key=lambda r: r[1])[0]
total = sum(r[1] for r in PROFILE_TABLE)
n_for_80 = P.ops_to_cover([r[1] / total for r in PROFILE_TABLE], 0.8)
### END SOLUTION
check("07.optimise-first", first)
check("07.ops-for-80", n_for_80)

# %% [markdown]
# **07.bound.** On an H100 (datasheet: `H100_BF16_FLOPS` = 989 TFLOP/s dense bf16, `H100_BANDWIDTH` = 3.35 TB/s),
# say `"memory"` or `"compute"` for: a bf16 8192³ matmul; a bf16 softmax over 8192 × 8192; a bf16
# (8, 8192) @ (8192, 8192) matmul (a decoding step with batch 8).

# %%
bounds_h100 = ...
### BEGIN SOLUTION
ops_h100 = (R.matmul_cost(8192, 8192, 8192, "bf16"), R.softmax_cost(8192, 8192, "bf16"),
            R.matmul_cost(8, 8192, 8192, "bf16"))
bounds_h100 = tuple(R.bound(c.intensity, H100_BF16_FLOPS, H100_BANDWIDTH) for c in ops_h100)
### END SOLUTION
check("07.bound", bounds_h100)

# %% [markdown]
# ## Summary
#
# - Profile before optimising: sort by **self** time; a few ops cover 80 %. The Chrome trace (Perfetto) shows
#   the timeline; on a GPU, sort by CUDA time and use Nsight Systems / Nsight Compute.
# - Every op pays a fixed launch/dispatch overhead: many tiny ops are slow out of proportion.
# - A chain of elementwise ops is memory-bound: fusing it (by hand or with `torch.compile`, whose first call
#   compiles) cuts the bytes and raises its intensity. A large matmul is compute-bound: fusion gains little there.
# - The roofline: attainable = min(peak, intensity × bandwidth), with *measured* ceilings. The theoretical peak,
#   units × frequency × FLOPs/cycle, is an upper bound real jobs reach only part of.
# - `python -m labkit.bench peak` prints this machine's measured vs theoretical peaks.
# - GPU-Util is the share of time *some* kernel runs, not how hard the GPU works: read DCGM's SM/tensor activity,
#   and judge a run by tokens/s and MFU (model FLOPs ≈ 6 × parameters × tokens, over the peak; 30-50 % is good
#   for large models on GPUs).
#
# Next, notebook 08 writes fused kernels yourself, in Triton, and counts the bytes they save; notebook 09 spreads the
# step over several processes, where the bottleneck becomes communication.
