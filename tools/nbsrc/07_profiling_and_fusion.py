# %% [markdown]
# # 07 · Profiling, fusion and the roofline
#
# **Objectives**
# - profile a real training step with `torch.profiler`: read the key_averages table sorted by *self* time,
#   find the few ops that take most of the time, and write a Chrome trace to open in Perfetto;
# - measure **kernel-launch overhead**: many tiny ops against one big op;
# - fuse a memory-bound chain (bias + GELU + dropout) by hand and with `torch.compile`, and explain why fusion
#   helps memory-bound chains and does little for a compute-bound matmul;
# - fuse around matmuls too: the Q, K and V projections as one matmul, BatchNorm folded into a convolution, and a
#   fused op's hand-written backward checked with `torch.autograd.gradcheck`;
# - measure this machine's ceilings (peak matmul FLOP/s per dtype, copy bandwidth), compare them with the
#   theoretical peak, and place measured ops on the **roofline**: memory- or compute-bound, and at what % of the roof;
# - read utilisation correctly: what `nvidia-smi`'s GPU-Util measures (and what DCGM and Nsight add), the busy
#   fraction of a trace, throughput in tokens/s and **MFU**;
# - work like an engineer: baseline first, one change at a time, a notes table.
#
# **Prerequisites:** notebook 04 (the tiny GPT, autocast), notebook 06 (where memory goes).
#
# **Estimated time:** 70 min
#
# All timings below depend on the machine and on what else runs on it, so their cells are not compared by the
# tests; the cells assert only facts that hold everywhere (same results, fewer bytes, which side of the ridge).

# %%
# %matplotlib inline
import os

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # small machines: compile workers steal the cores
import matplotlib.pyplot as plt
import torch
from torch.nn.utils.fusion import fuse_conv_bn_eval

from labkit import bench, device, fusion, models
from labkit import profiling as P
from labkit import roofline as R
from labkit import traffic as T
from labkit.check import check, predict, reveal
from labkit.exercises.nb07 import DGX_A100, H100_BANDWIDTH, H100_BF16_FLOPS, PROFILE_TABLE

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
# ### Fusing matmuls: the Q, K and V projections
#
# Attention projects the same input three times: `q = x Wq + bq`, `k = x Wk + bk`, `v = x Wv + bv`, three matmuls
# that each read `x`. Stack the three weight matrices into one `(3d, d)` matrix and it is one matmul, whose output
# is split into q, k and v. The article reports "about 15 % end-to-end" from this fusion in its Transformer
# (seed 002 §3.1): the article's own figure, for its model on its GPU. The same computation here, with the weights
# copied, so both versions must give the same numbers:

# %%
d = 256
proj = [torch.nn.Linear(d, d, device=dev) for _ in range(3)]               # q, k, v: three Linear(d, d)
qkv = torch.nn.Linear(d, 3 * d, device=dev)                                # one Linear(d, 3d)
with torch.no_grad():
    qkv.weight.copy_(torch.cat([m.weight for m in proj]))
    qkv.bias.copy_(torch.cat([m.bias for m in proj]))
qkv_unfused, qkv_fused = (lambda h: [m(h) for m in proj]), (lambda h: qkv(h).split(d, dim=-1))
xq = torch.randn(64, d, device=dev)                                        # 64 tokens
with torch.no_grad():
    for unf, fus in zip(qkv_unfused(xq), qkv_fused(xq)):
        torch.testing.assert_close(fus, unf, rtol=1e-5, atol=1e-5)         # only the summation order may differ

# %% [markdown]
# What changed: the profiler counts the matmul launches (`aten::addmm`), `T.torch_traffic` (notebook 08 uses it
# too) counts the bytes each op reads, from the tensors it is handed, and `FlopCounterMode` the FLOPs:

# %%
mm_calls, moved = {}, {}
with torch.no_grad():
    for name, f in (("3 x Linear(d, d)", qkv_unfused), ("1 x Linear(d, 3d)", qkv_fused)):
        prof_qkv = P.profile_steps(lambda f=f: f(xq), steps=1, warmup=0, device=dev)
        calls = {e.key: e.count for e in prof_qkv.key_averages()}
        mm_calls[name], moved[name] = calls.get("aten::addmm", 0), T.torch_traffic(f, xq)
        print(f"{name:<18} {mm_calls[name]} matmul launch(es), reads {moved[name].read / 2**10:4.0f} KiB")
weights = sum(t.nbytes for t in qkv.parameters())  # the same weights in both: the saving is reading x once
print(f"weights and biases {weights / 2**10:.0f} KiB either way; x is {xq.nbytes / 2**10:.0f} KiB")
assert list(mm_calls.values()) == [3, 1]
assert P.count_flops(lambda: qkv_fused(xq)) == P.count_flops(lambda: qkv_unfused(xq))  # same FLOPs
assert [m.read for m in moved.values()] == [weights + 3 * xq.nbytes, weights + xq.nbytes]

# %% [markdown]
# Same FLOPs, two fewer launches, `x` read once instead of three times. The launches saved are a fixed cost, which
# shrinks next to the matmul's work as the number of tokens grows; the bytes saved (two reads of `x`) grow with the
# tokens, but so do the FLOPs, and the weights, read either way, are most of the bytes while the tokens are fewer
# than 3d. The race, for a decoding step (4 tokens) and a long prompt (512 tokens), round-robin, median of 21:

# %%
# NBVAL_IGNORE_OUTPUT
with torch.no_grad():
    for n_tok in (4, 512):
        tq = P.interleaved_times({"3": qkv_unfused, "1": qkv_fused}, torch.randn(n_tok, d, device=dev),
                                 repeats=21, warmup=3, device=dev)
        print(f"{n_tok:>3} tokens: three matmuls {tq['3'] * 1e6:7.1f} µs, one {tq['1'] * 1e6:7.1f} µs: the fused "
              f"projection ran {abs(tq['3'] / tq['1'] - 1):.0%} {'faster' if tq['1'] < tq['3'] else 'slower'}")
        notes.append((f"QKV fusion, {n_tok} tokens", f"3 matmuls / 1 matmul = {tq['3'] / tq['1']:.2f}"))

# %% [markdown]
# The lines above say what this machine made of it. On a GPU the fused projection has one more advantage: a
# `(tokens, 3d)` output has three times as many tiles as a `(tokens, d)` one, so it can keep more of the SMs busy
# where a small matmul leaves some idle. How much that buys end to end depends on the model's size and on what else the
# step does, so treat the article's 15 % as one measurement, not a constant: measure it on your model.
#
# ### Folding BatchNorm into a convolution
#
# In eval mode BatchNorm is a fixed affine map per channel, `y = γ (z − μ) / σ + β` with
# `σ = sqrt(running_var + eps)`, and a convolution `z = W ∗ x + b` is affine too, so the two fold into one
# convolution with
#
# $$W' = W \cdot \frac{\gamma}{\sigma}, \qquad b' = (b - \mu) \cdot \frac{\gamma}{\sigma} + \beta$$
#
# (per output channel). Inference tools (TensorRT, ONNX Runtime) do this among their first graph passes;
# `torch.nn.utils.fusion.fuse_conv_bn_eval` does it for one pair. A small CNN, whose BatchNorm layers get a scale,
# a shift and running statistics (five training-mode batches), then switches to eval mode:

# %%
cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                          torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU()).to(dev)
with torch.no_grad():
    for bn_ in (cnn[1], cnn[4]):                                                    # γ and β
        bn_.weight.uniform_(0.5, 1.5)
        bn_.bias.uniform_(-0.5, 0.5)
    for _ in range(5):
        cnn(torch.randn(16, 3, 16, 16, device=dev) * 2 + 1)                         # μ and σ move
cnn.eval()
folded = torch.nn.Sequential(fuse_conv_bn_eval(cnn[0], cnn[1]), cnn[2], fuse_conv_bn_eval(cnn[3], cnn[4]), cnn[5])

# %% [markdown]
# The folded network against the original (float32, tolerance `1e-5` absolute and relative: only rounding
# differs; on an Ampere or newer GPU cuDNN would run fp32 convolutions in TF32 by default, whose 10-bit rounding of
# the folded weights exceeds that, so the check turns it off), its operations as the profiler counts them, and the
# formula above against the folded layer's weights:

# %%
img = torch.randn(4, 3, 16, 16, device=dev)
with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # plain fp32 on a GPU too
    torch.testing.assert_close(folded(img), cnn(img), rtol=1e-5, atol=1e-5)
    top = ("aten::conv2d", "aten::batch_norm", "aten::relu")
    n_ops = {name: sum(e.count for e in P.profile_steps(lambda m=m: m(img), steps=1, warmup=0, device=dev)
                       .key_averages() if e.key in top) for name, m in (("conv+BN+ReLU", cnn), ("folded", folded))}
print(f"operations per forward (conv2d, batch_norm, relu): {n_ops}")
sigma = torch.sqrt(cnn[1].running_var + cnn[1].eps)
gain = cnn[1].weight / sigma                                                        # γ / σ, per output channel
torch.testing.assert_close(folded[0].weight, cnn[0].weight * gain.reshape(-1, 1, 1, 1))               # W'
torch.testing.assert_close(folded[0].bias, (cnn[0].bias - cnn[1].running_mean) * gain + cnn[1].bias)  # b'
assert n_ops == {"conv+BN+ReLU": 6, "folded": 4}

# %% [markdown]
# The ReLUs are still ops of their own. Fusing an activation into the convolution needs a compiler or a library
# kernel: `torch.compile` for inference with Inductor's `freezing` option folds BatchNorm the same way and, on a CPU,
# asks oneDNN for a convolution that applies the ReLU as it writes its output (a "post-op": the generated code calls
# `mkldnn._convolution_pointwise(..., 'relu', ...)`); on a GPU, TensorRT and cuDNN's fused convolutions do the
# same. It is not run here: compiling it would take a good part of this notebook's time budget, for a lesson the
# GELU chain above already showed.
#
# ### A fused op needs its own backward
#
# The article warns that a fused op can make the gradient vanish (seed 002 §6.2). The reason: autograd cannot see
# inside a hand-written fused kernel (CUDA, Triton, notebook 08), so its author writes the backward by hand too, and
# a forgotten term of the derivative goes unnoticed, since the forward is right. (`torch.compile` is the exception:
# it derives the backward with autograd before it fuses.) `fusion.fused_bias_gelu` is bias + GELU as one `torch.autograd.Function`;
# its backward, from the saved `h = x + b` and `u = sqrt(2/π) (h + 0.044715 h³)`, is
#
# $$\frac{\partial y}{\partial h} = \tfrac12 (1 + \tanh u) + \tfrac12\, h\, (1 - \tanh^2 u)\,
# \sqrt{2/\pi}\, (1 + 3 \cdot 0.044715\, h^2),$$
#
# and the bias gradient sums it over the rows. `torch.autograd.gradcheck` compares a backward with finite differences
# of the forward, in float64 (in float32 the differences drown in rounding). It passes the exact backward and
# fails the typical mistake, a backward that treats `tanh u` as a constant and keeps only the first term:

# %%
xg = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)
bg = torch.randn(16, dtype=torch.float64, requires_grad=True)
torch.testing.assert_close(fusion.fused_bias_gelu(xg, bg), torch.nn.functional.gelu(xg + bg, approximate="tanh"))
exact = torch.autograd.gradcheck(fusion.fused_bias_gelu, (xg, bg))
buggy = torch.autograd.gradcheck(lambda a_, b_: fusion.fused_bias_gelu(a_, b_, backward="tanh-held-constant"),
                                 (xg, bg), raise_exception=False)
print(f"gradcheck: the exact backward {'passes' if exact else 'fails'}; "
      f"with tanh held constant it {'passes' if buggy else 'fails'}")
assert exact and not buggy

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
# **07.peak-formula.** The same formula for a GPU node, from NVIDIA's A100 whitepaper: a DGX A100 holds 8 A100 GPUs,
# each with 108 SMs at a boost clock of 1410 MHz, and the four tensor cores of an SM together perform 1024 dense FP16
# fused multiply-adds (FMA) per clock (`DGX_A100`). Its theoretical dense FP16 peak, in FLOP/s
# (devices × units × clock × FLOPs per unit per cycle)?

# %%
peak_dgx = ...   # FLOP/s, a Python float
### BEGIN SOLUTION
peak_dgx = DGX_A100["gpus"] * DGX_A100["sms_per_gpu"] * DGX_A100["boost_clock_mhz"] * 1e6 \
    * DGX_A100["dense_fp16_fma_per_sm_per_clock"] * 2   # an FMA is two FLOPs
### END SOLUTION
check("07.peak-formula", peak_dgx)

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
# whose ridge point lies between ~2 and ~150 FLOP/byte (CPUs: ~5-30; GPUs: ~10-20 on their FP32 cores, ~100-300 on
# tensor cores, where even the 1024³ fp32 matmul, run in TF32, is closer to the ridge):

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
# > **Common misconception** (seed 002 §7.2): "compute density" should be above 30 %; below that, a kernel is
# > memory-bound.
# >
# > **Why it is wrong:** arithmetic intensity is a ratio of FLOPs to bytes moved, in FLOP/byte, not a percentage,
# > and no fixed threshold separates memory- from compute-bound. The threshold is the machine's ridge point, its
# > peak FLOP/s divided by its bandwidth, which differs per machine and per dtype. From the datasheets: an A100
# > (40 GB, 1.555 TB/s) has its ridge at about 12.5 FLOP/byte in FP32 (19.5 TFLOP/s), about 100 with TF32 tensor
# > cores (156 TFLOP/s) and about 200 in FP16 (312 TFLOP/s); an H100 at about 295 in bf16. (Read as a utilisation
# > instead, a kernel's achieved share of the peak FLOP/s, a low figure says the kernel is not compute-bound, not
# > that memory limits it: it may wait on latency or launches; Nsight Compute shows its memory throughput beside it.)
# >
# > **What is true:** compare an op's intensity with the ridge point of the machine and the dtype it runs in. The
# > cell below computes two intensities from what torch counts (`FlopCounterMode`'s FLOPs, the tensors' bytes) and
# > puts them on either side of this machine's measured ridge; then it takes one fp32 matmul that is compute-bound
# > on an A100's FP32 roof and memory-bound on its TF32 roof: same op, same bytes, another threshold.

# %%
mm_intensity = P.count_flops(lambda: a @ b) / (a.nbytes + b.nbytes + (a @ b).nbytes)  # FlopCounterMode: 2·n³ FLOPs
add_intensity = a.numel() / (a.nbytes + b.nbytes + (a + b).nbytes)                  # a + b: 1 FLOP per element
print(f"{n}³ fp32 matmul: {mm_intensity:.1f} FLOP/byte; add: {add_intensity:.3f} FLOP/byte; "
      f"this machine's fp32 ridge lies {'between them' if add_intensity < ridge < mm_intensity else 'elsewhere'}")
a256, b256 = a[:256, :256].contiguous(), b[:256, :256].contiguous()
mm256 = P.count_flops(lambda: a256 @ b256) / (3 * a256.nbytes)                       # ~43 FLOP/byte
assert add_intensity < ridge < mm_intensity and mm_intensity > 1000 * add_intensity
assert 19.5e12 / 1.555e12 < mm256 < 156e12 / 1.555e12  # A100: right of the FP32 ridge, left of the TF32 one

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
# - Matmuls fuse by stacking weights (Q, K, V: same FLOPs, two fewer launches, the input read once) or by folding
#   (BatchNorm into the convolution before it, in eval mode: W' = W·γ/σ, b' = (b − μ)·γ/σ + β). A fused op's
#   backward is written by hand: check it with `gradcheck` in float64 before trusting a loss curve.
# - The roofline: attainable = min(peak, intensity × bandwidth), with *measured* ceilings. The theoretical peak,
#   devices × units × frequency × FLOPs per unit per cycle (an FMA is two FLOPs; dense, not sparse), is an upper
#   bound real jobs reach only part of. Intensity is FLOP/byte, judged against the ridge point of the machine and
#   dtype, never a fixed percentage.
# - `python -m labkit.bench peak` prints this machine's measured vs theoretical peaks.
# - GPU-Util is the share of time *some* kernel runs, not how hard the GPU works: read DCGM's SM/tensor activity,
#   and judge a run by tokens/s and MFU (model FLOPs ≈ 6 × parameters × tokens, over the peak; 30-50 % is good
#   for large models on GPUs).
#
# Next, notebook 08 writes fused kernels yourself, in Triton, and counts the bytes they save; notebook 09 spreads the
# step over several processes, where the bottleneck becomes communication.
