# %% [markdown]
# # 08 · Fused kernels in Triton
#
# Notebook 07 looked at fusion from the outside: `torch.compile` generated one kernel for a chain of ops, and the
# profiler counted the launches. Here you write the fused kernels yourself, in [Triton](https://triton-lang.org),
# the Python-embedded language that `torch.compile` itself emits for GPUs, and count what each kernel saves.
#
# **Objectives**
# - Triton's programming model on the smallest useful kernel: programs and the grid, blocks, masks, pointer
#   arithmetic, `tl.load` / `tl.store`;
# - write fused kernels for bias + GELU, a row softmax and a LayerNorm forward, and read an AdamW update written as
#   one kernel; check each against torch in fp32 and with bf16 inputs (fp32 arithmetic inside), within a stated
#   tolerance;
# - count the bytes each kernel reads and writes against the unfused sequence of torch ops, and place both on
#   notebook 07's roofline;
# - (stretch) FlashAttention's forward pass: a tiled kernel with an online softmax that never stores the N × N
#   score matrix;
# - know where Triton's CPU interpreter is not the hardware, and why tests of low-precision kernels need the real
#   device.
#
# **Prerequisites:** notebook 07 (fusion, bytes moved, the roofline), notebook 05 (bf16, TF32).
#
# **Estimated time:** 105 min (core 70 min, stretch 35 min)
#
# **Where it runs.** On a CUDA GPU the kernels are compiled and timed. Everywhere else they run in Triton's
# *interpreter* (`TRITON_INTERPRET=1`), which executes each program of a kernel as NumPy code on the CPU, one after
# another: the answers are real, the timings are not. Which of the two ran is decided by the device gate
# (`labkit.device`), below, and printed. The notebook needs the `triton` package (`pip install -e '.[kernels]'`);
# without it, the first cell says how to install it.

# %%
# %matplotlib inline
from labkit import device, kernels

MODE = kernels.setup()  # asks the device gate; on a CPU it sets TRITON_INTERPRET=1 *before* triton is imported
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from labkit import bench
from labkit import kernelbench as KB
from labkit import roofline as R
from labkit import traffic as T
from labkit.check import check, predict, reveal

torch.set_num_threads(1)  # steadier timings on a shared machine (raise it on your own node)
K = kernels.load()  # labkit's reference kernels, decorated in the mode chosen above
dev = MODE.device
print(MODE)
if MODE.interpreted:
    print(f"Triton {triton.__version__}: section 4's findings about the interpreter's numerics are this version's")

# %% [markdown]
# ## 1. Triton's programming model
#
# A Triton kernel is a Python function decorated with `@triton.jit`. You launch it on a **grid** of **programs**;
# every program runs the same code and asks `tl.program_id(axis)` which one it is (CUDA would say: a grid of thread
# blocks). A program works on whole **blocks** of values: `tl.arange(0, BLOCK)` is a vector of `BLOCK` indices, and
# `BLOCK` is a compile-time constant (`tl.constexpr`, a power of two). Pointers are numbers: `x_ptr + offs` is a
# block of addresses, `tl.load` reads them and `tl.store` writes them. How a block maps onto the GPU's threads,
# registers and shared memory is the compiler's job: you think in blocks, not in threads.
#
# The smallest useful kernel, `out = x + y`:

# %%
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)  # which program am I?
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # the BLOCK elements this program owns
    mask = offs < n  # the last program runs past the end: switch those lanes off
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


# %% [markdown]
# Launching it: the grid is a tuple with the number of programs per axis, the tensors are passed as pointers to
# their first element, and constexprs by keyword. 1000 elements in blocks of 256 need `cdiv(1000, 256) = 4`
# programs, and the last one has 24 lanes too many:

# %%
n, BLOCK = 1000, 256
x, y = kernels.randn(n, seed=1), kernels.randn(n, seed=2)
out = torch.empty_like(x)
grid = (triton.cdiv(n, BLOCK),)
add_kernel[grid](x, y, out, n, BLOCK=BLOCK)
assert torch.equal(out, x + y)
print(f"grid = {grid}: {grid[0]} programs x {BLOCK} lanes = {grid[0] * BLOCK} slots for {n} elements; out == x + y")

# %% [markdown]
# Which program wrote which element? A kernel that stores its own program id says so:

# %%
@triton.jit
def owner_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.program_id(0), mask=offs < n)


owner = torch.full((n,), -1, dtype=torch.int32, device=dev)
owner_kernel[grid](owner, n, BLOCK=BLOCK)
per_program = torch.bincount(owner.long().cpu()).tolist()
print(f"elements per program: {per_program}")
assert per_program == [256, 256, 256, 232] and (owner >= 0).all()

# %% [markdown]
# Without the mask, program 3 would read 24 values past the end of `x` and write 24 values past the end of `out`:
# on a GPU an illegal memory access (if you are lucky) or silent corruption of a neighbouring tensor. The exercise
# graders below catch exactly that.
#
# **Offsets in int64.** `tl.program_id` is an int32, and so is an integer argument like `row_stride` or `n` below
# 2³¹: their product is computed in int32. A (70 000, 40 000) fp32 activation has 2.8 × 10⁹ elements, and the
# offset of its last row, `row * row_stride`, no longer fits:

# %%
row, row_stride = torch.tensor(69_999, dtype=torch.int32), 40_000
print(f"int32: {int(row * row_stride):,}   int64: {int(row.long() * row_stride):,}")
assert int(row * row_stride) < 0 < int(row.long() * row_stride)

# %% [markdown]
# The wrapped offset points before the tensor: silent garbage, or an illegal address. labkit's kernels therefore
# write `tl.program_id(0).to(tl.int64)` (or cast the base offset) before multiplying, and so do the solutions below;
# the cost is 64-bit integer arithmetic for the offsets and a few more registers to hold them, usually nothing next
# to the loads.
#
# Around every kernel sits a **launcher**, a plain Python function that checks the inputs, allocates the output,
# chooses the block and the grid, and launches. labkit's softmax launcher, whole:

# %%
print(kernels.source(kernels.softmax))

# %% [markdown]
# ## 2. Fused kernels
#
# A fused kernel does in one pass through memory what a chain of torch ops does in several: each op of the chain
# reads its inputs from memory and writes its result back, while the fused kernel keeps the intermediates in
# registers. Every kernel here follows the mixed-precision rule: **load, convert to fp32, compute, convert back only
# when storing.** With bf16 tensors that gives bf16 traffic and fp32 arithmetic.
#
# The patterns worth fusing are the ones this section writes: a linear layer's epilogue (bias + activation), the
# normalisations (softmax, LayerNorm), the optimizer's elementwise update, and attention (section 3).
#
# Writing ops on one line does not fuse them. A module whose `forward` returns `F.relu(self.linear(x))` still runs
# two kernels in eager PyTorch, one per op, as the dispatcher sees them:

# %%
lin = torch.nn.Linear(64, 64).to(dev)
eager = T.torch_traffic(lambda inp: F.relu(lin(inp)), torch.ones(8, 64, device=dev))
print(f"F.relu(linear(x)): {eager.launches} ops, {[o.op for o in eager.ops]}")
assert eager.launches == 2

# %% [markdown]
# Fusion takes a compiler (`torch.compile`, XLA, TensorRT) or a kernel you write.
#
# ### 2.1 bias + GELU
#
# A transformer MLP computes `gelu(x @ W + b)`. After the matmul, eager torch runs `x + b` and `gelu` as two
# kernels: the sum goes to memory and comes back. The fused kernel reads `x` and `b` and writes `y` once.
# (`torch.compile` fuses the two the same way; on a GPU it emits a Triton kernel much like yours.)
#
# **08.bias-gelu.** Write the kernel's body: one program per `BLOCK` elements of the flattened `(rows, n_cols)`
# tensor (as `add_kernel`), the bias of each element's column (element `i` is in column `i % n_cols`), the exact
# GELU `gelu(h) = 0.5 * h * (1 + erf(h / sqrt(2)))` with `tl.math.erf`, and the store in `y`'s dtype
# (`y_ptr.dtype.element_ty`).

# %%
@triton.jit
def my_bias_gelu_kernel(x_ptr, b_ptr, y_ptr, n, n_cols, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    ...  # offsets and mask; load x and its column's bias, convert to fp32; gelu(x + b); store in y's dtype
    ### BEGIN SOLUTION
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs % n_cols, mask=mask).to(tl.float32)
    h = x + b
    tl.store(y_ptr + offs, (0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))).to(y_ptr.dtype.element_ty),
             mask=mask)
    ### END SOLUTION


check("08.bias-gelu", my_bias_gelu_kernel)

# %% [markdown]
# The grader launched your kernel on three problems, in the interpreter here: a size that fills whole blocks, one
# that needs the mask (its output sits in a larger buffer, so a write past the end is seen), and bf16 inputs.
#
# ### 2.2 Row softmax
#
# `softmax(x)_j = exp(x_j - m) / sum_k exp(x_k - m)` for any `m`; with `m` the row's max, every exponent is at most
# 0 and nothing overflows (fp32 `exp` overflows to inf above 88.7, and inf / inf is NaN). Eager torch written out
# takes five ops:

# %%
print(kernels.source(kernels.softmax_unfused))

# %% [markdown]
# **08.softmax.** One program per row, the whole row in one block (`BLOCK` is the next power of two of `n_cols`,
# see the launcher above; consecutive rows are `row_stride` elements apart). Lanes past the end of the row must
# not win the max nor add to the sum: load them as `-inf` (a 0 would win the max of a row whose values all lie
# below -88, and every exponential of that row would underflow to 0; the grader tries such a row).
#
# One block per row has a limit: the row lives in registers, spread over the program's threads. With 16 warps
# (512 threads) a row of 16 384 fp32 values costs 32 registers per thread for each live copy (`x`, then its
# exponentials); a row of 65 536 would cost 128 per copy, and a thread has at most 255, so the compiler would spill
# to slow local memory. The launcher refuses such rows; notebook 16 loops over them instead:

# %%
try:
    kernels.softmax(torch.zeros(1, kernels.MAX_ROW_BLOCK + 1))
except ValueError as err:
    print(f"ValueError: {err}")

# %%
@triton.jit
def my_softmax_kernel(x_ptr, y_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ...  # load the row (masked, -inf past the end) in fp32; subtract its max; exp; divide by the sum; store
    ### BEGIN SOLUTION
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * row_stride + offs, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=mask)
    ### END SOLUTION


check("08.softmax", my_softmax_kernel)

# %% [markdown]
# ### 2.3 LayerNorm forward
#
# `y = (x - mean) / sqrt(var + eps) * w + b` over each row. Written op by op it takes nine kernels
# (`kernels.layernorm_unfused`); `F.layer_norm` is one hand-written fused kernel, and so is yours. A real forward
# kernel also stores each row's mean and `rstd = 1 / sqrt(var + eps)`: the backward pass needs them
# (`torch.ops.aten.native_layer_norm` returns the same three tensors).
#
# **08.layernorm.** Mind the masked lanes: they must count neither in the mean nor in the variance. Mind the
# dtype: with bf16 inputs, sums in bf16 lose digits (a sum of 50 values near 8 needs more than bf16's 8 bits).
# And mind the variance: the grader tries a constant row (variance 0, where `eps` is all that keeps `rstd` finite)
# and rows of 1000 + 10⁻³·N(0, 1), where the one-pass formula E[x²] − E[x]² subtracts two numbers near 10⁶ that
# agree in every digit fp32 keeps. Centre the row first, then square.

# %%
@triton.jit
def my_layernorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, row_stride, eps,
                        BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ...  # load x (fp32); mean; x - mean (0 on masked lanes); var; rstd; y = xc * rstd * w + b; store y, mean, rstd
    ### BEGIN SOLUTION
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + row * row_stride + offs, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    ### END SOLUTION


check("08.layernorm", my_layernorm_kernel)

# %% [markdown]
# ### 2.4 The AdamW update as one kernel
#
# `torch.optim.AdamW` with `foreach=False` updates each parameter with about ten ops (decay, two moment updates, a
# square root, a division, ...), each a pass over the parameter-sized tensors. The whole update is elementwise, so
# one kernel can read `p, g, m, v` once and write `p, m, v` once. It is what PyTorch's `fused=True` and DeepSpeed's
# FusedAdam do. The gradient may arrive in bf16 (read as 2 bytes, converted in registers), while the master weights
# and the moments stay fp32 (notebook 06). labkit's kernel, whole:

# %%
print(kernels.source(K.adamw_kernel))

# %% [markdown]
# ### 2.5 Every kernel against torch
#
# Each reference kernel on fresh inputs with 300 columns (not a power of two, so the masks matter), compared with
# torch's own op computed in float64 on the same values (bf16 inputs are upcast exactly). The tolerance, stated
# (`kernels.tolerance`): **fp32 outputs within `1e-5 * |ref| + 1e-6`**, a few fp32 roundings, since a kernel sums in
# another order than torch; **bf16 outputs within one bf16 ulp (`2**-7 * |ref|`)** more, the single rounding when
# the kernel stores. The yardstick is float64, not torch's fp32 op: both make fp32 rounding errors of their own.
# (In the interpreter the kernel's `tl.math.erf` is Python's float64 `math.erf`, rounded once to fp32, so here the
# kernel even lands closer to float64 than fp32 `F.gelu` does; compiled, `erf` is an fp32 library routine of a few
# ulp and neither is ahead by rule.) AdamW: `p, m, v` after one step against `torch.optim.AdamW`.

# %%
checks = [KB.verify(name, 16, 300, dtype) for name in KB.NAMES for dtype in ("fp32", "bf16")]
for c in checks:
    print(f"{c.name:<10} {c.dtype:<9} vs {c.reference:<17}  rtol {c.rtol:.3g}, atol {c.atol:.0e}: "
          f"{'within' if c.ok else 'OUTSIDE'}")
assert all(c.ok for c in checks)

# %% [markdown]
# This is the discipline for any fused kernel: check it alone, against the unfused reference, in every dtype it
# will see and on sizes that exercise its masks, before trusting an end-to-end run, where a wrong kernel shows up
# only as a loss curve that is slightly off. Two more things a forward kernel does not give you: a **backward**
# (autograd cannot see inside a kernel; wrap it in a `torch.autograd.Function` whose backward uses what the forward
# saved, such as LayerNorm's mean and rstd), and **portability** (check it on each GPU generation you run on).
#
# How close, as a multiple of the tolerance (this depends on the machine's math libraries, so it is not compared):

# %%
# NBVAL_IGNORE_OUTPUT
print("  ".join(f"{c.name} {c.dtype}: {c.worst:.2f}" for c in checks))

# %% [markdown]
# ### 2.6 Bytes: the unfused torch sequence against the fused kernel
#
# Fusion is about bytes. `T.torch_traffic` runs a torch function under a `TorchDispatchMode` that sees every ATen
# op, and adds up, per op, the bytes of the distinct tensors it reads and the tensors it writes (views move
# nothing; in-place ops read and write). For the five-op softmax of a 64 × 1000 fp32 matrix (256 000 bytes):

# %%
x = KB.make_inputs("softmax", 64, 1000)["x"]
unfused = T.torch_traffic(kernels.softmax_unfused, x)
for op in unfused.ops:
    print(f"{op.op:<18} reads {op.read:>8,} B, writes {op.written:>8,} B")
print(f"{unfused.launches} launches, {unfused.total:,} bytes in all")

# %% [markdown]
# **08.softmax-bytes (predict, then run).** How many times more bytes does this five-op sequence move than the fused
# kernel, which reads the matrix once and writes it once? Write a number, then run the next cell.

# %%
prediction = ...
### BEGIN SOLUTION
prediction = 4
### END SOLUTION
predict("08.softmax-bytes", prediction)

# %% [markdown]
# The kernel's side is counted in the interpreter: `T.triton_traffic` watches every `tl.load` and `tl.store` of a
# launch and counts each distinct byte once. (A compiled kernel cannot be watched from Python; on a GPU the cell
# uses the model, `T.fused_traffic`, which the interpreter's count matches: see the next cells.)

# %%
fused = T.triton_traffic(kernels.softmax, x) if MODE.interpreted else T.fused_traffic("softmax", 64, 1000)
print(f"fused softmax: {fused.launches} launch, reads {fused.read:,} B, writes {fused.written:,} B ({fused.how})")
_ = reveal("08.softmax-bytes", unfused.total / fused.total)

# %% [markdown]
# All four kernels, fp32 and bf16, on a 64 × 1000 problem (AdamW: 64 000 parameters): the unfused torch sequence
# (AdamW: `torch.optim.AdamW(foreach=False)`, whose bf16 case first converts the gradient to fp32) against the
# fused kernel, measured in the interpreter and checked against the model:

# %%
rows, cols = 64, 1000
print(f"{'kernel':<10} {'dtype':<5} {'torch ops':>9} {'unfused B':>11} {'fused B':>10} {'saving':>7}")
for name in KB.NAMES:
    for dtype in ("fp32", "bf16"):
        u = T.torch_traffic(KB.run_unfused, name, KB.make_inputs(name, rows, cols, dtype))
        f = T.fused_traffic(name, rows, cols, dtype)
        if MODE.interpreted:  # the interpreter's count of the real kernel equals the model, byte for byte
            m = T.triton_traffic(KB.run_fused, name, KB.make_inputs(name, rows, cols, dtype))
            assert (m.read, m.written, m.launches) == (f.read, f.written, 1), (name, dtype, m, f)
        print(f"{name:<10} {dtype:<5} {u.launches:>9} {u.total:>11,} {f.total:>10,} {u.total / f.total:>6.2f}x")

# %% [markdown]
# The saving is the number of passes the chain makes over the data: 2x for bias + GELU (two ops), 4x for the
# softmax, about 5.9x for LayerNorm. AdamW saves less in proportion (2.9x) because even the fused kernel must read
# four tensors and write three; with bf16 gradients the unfused path also pays for converting them.
#
# ### 2.7 On the roofline
#
# Same FLOPs, fewer bytes: fusion moves an op to the right on notebook 07's roofline (higher arithmetic intensity),
# and for memory-bound ops the roof rises with it. This machine's ceilings, measured as in notebook 07:

# %%
# NBVAL_IGNORE_OUTPUT
shapes = None if device.is_cuda(dev) else ((512, 512, 512), (1024, 1024, 1024))
peak = bench.peak_matmul_flops("fp32", dev, shapes)
bw = bench.memory_bandwidth(256 * 2**20, dev)
print(f"fp32 matmul peak {peak.flops_per_s / 1e9:.1f} GFLOP/s, copy bandwidth {bw.bytes_per_s / 1e9:.1f} GB/s: "
      f"ridge point {R.ridge_point(peak.flops_per_s, bw.bytes_per_s):.1f} FLOP/byte (fp32, one thread)")

# %% [markdown]
# Then the timings, on a problem big enough to time (2048 × 2048 on a CPU, 4096 × 4096 on a GPU), round-robin in one
# run (`KB.race`). **On a CPU the Triton kernels are not timed: an interpreter timing measures NumPy and Python, not
# a kernel**, so the fused point is drawn *at its roof* (the time its bytes need at the measured bandwidth), marked
# "(roof)", and torch's own fused library ops (`torch.softmax`, `F.layer_norm`, `AdamW(fused=True)`; bias + GELU
# has none), timed and placed as a third point, show where a real one-pass kernel lands on this CPU. On a GPU the
# Triton kernels are timed like the rest.

# %%
# NBVAL_IGNORE_OUTPUT
big = (2048, 2048) if MODE.interpreted else (4096, 4096)
times = {name: KB.race(name, *big, repeats=5, compile=not MODE.interpreted) for name in KB.NAMES}
points = {}
for name in KB.NAMES:
    counted = {how: T.torch_traffic(KB.run_unfused, name, KB.make_inputs(name, *big), library=how == "eager library")
               for how in ("eager unfused", "eager library") if how in times[name]}
    fus = T.cost(name, *big, T.fused_traffic(name, *big))
    t_fused = times[name].get("triton") or max(fus.bytes / bw.bytes_per_s, fus.flops / peak.flops_per_s)
    points[name] = [R.place(T.cost(name, *big, c), times[name][how], peak.flops_per_s, bw.bytes_per_s,
                            f"{name} {'unfused' if how == 'eager unfused' else 'torch library'}")
                    for how, c in counted.items()]
    points[name].insert(1, R.place(fus, t_fused, peak.flops_per_s, bw.bytes_per_s,
                                   f"{name} triton" + ("" if "triton" in times[name] else " (roof)")))
pairs = [(pts[0], pts[1]) for pts in points.values()]
print(R.table([p for pts in points.values() for p in pts]))

# %%
fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
for ax, (name, pts) in zip(axes.flat, points.items()):
    R.plot({"fp32": peak.flops_per_s}, bw.bytes_per_s, pts, ax=ax, intensity_range=(0.05, 50),
           title=f"{name}: unfused torch, fused Triton" + (", torch library" if len(pts) > 2 else ""))
plt.tight_layout()
plt.show()

# %% [markdown]
# A measured point *above* 100 % of its roof is not an error (notebook 07), for two reasons. **Write-allocate:**
# the roof was measured with `dst.copy_(src)` and counted as 2 bytes moved per byte copied, but a CPU that stores
# into a cache line it does not hold first reads that line from memory (read for ownership), so the bus carried 3.
# An op that mostly reads (a reduction such as `amax`, whose output is one value per row) pays that tax on few
# bytes, and an op that updates in place (AdamW's `p.mul_`, `m.lerp_`, `v.mul_`) writes lines it has just read and
# pays none: their counted bytes per second can beat the copy's. **Cache reuse:** the copies were 256 MiB, far larger
# than the caches, while part of a 16 MiB tensor can stay in the last-level cache between two ops.

# %% [markdown]
# The bounds follow from the intensities, which are exact (counted bytes, the FLOP convention of
# `T.FLOPS_PER_ELEMENT`). A machine has one ridge point per roof, peak FLOP/s over bandwidth: this CPU's fp32 ridge
# is printed above, from its measured peak and copy bandwidth. A GPU has several roofs, and they differ by an order
# of magnitude; from the H100 SXM datasheet (dense figures, 3.35 TB/s of HBM3):

# %%
H100_TFLOPS = {"fp32 (CUDA cores)": 67, "TF32 (tensor cores)": 495, "bf16 (tensor cores)": 989}  # NVIDIA datasheet
ridges = {roof: tflops * 1e12 / 3.35e12 for roof, tflops in H100_TFLOPS.items()}
print("  ".join(f"{roof}: ridge {r:.0f} FLOP/B" for roof, r in ridges.items()))
assert max(f.intensity for _, f in pairs) < min(ridges.values()) / 4

# %% [markdown]
# Every one of these ops, fused or not, sits far left of even the lowest of them: memory-bound everywhere. Fusion
# multiplies each intensity by the saving counted in section 2.6:

# %%
for unf_pt, fus_pt in pairs:
    print(f"{unf_pt.name:<18} {unf_pt.intensity:6.3f} FLOP/B -> fused {fus_pt.intensity:6.3f} FLOP/B")
assert all(f.intensity > 1.9 * u.intensity and f.intensity < 5 for u, f in pairs)

# %% [markdown]
# ### 2.8 Timings: a GPU question
#
# On a GPU, the cell below prints each Triton kernel's time against torch eager (unfused and library) and
# `torch.compile`, as ratios measured in one run. On a CPU it prints why it does not: the interpreter runs every
# program as Python and NumPy, thousands of times slower than any kernel, and says nothing about the kernel's speed.
# What carries over from the CPU is the bytes, above, and the bytes are what a memory-bound kernel's time is made of.

# %%
# NBVAL_IGNORE_OUTPUT
if not MODE.interpreted:
    for name, t in times.items():
        print(f"{name:<10} triton {t['triton'] * 1e6:8.1f} µs  " + "  ".join(
            f"{k} {v / t['triton']:.2f}x" for k, v in t.items() if k != "triton"))
else:
    interp = bench.time_fn(lambda: kernels.softmax(x), warmup=1, repeats=3).median
    torch_s = bench.time_fn(lambda: torch.softmax(x, -1), warmup=1, repeats=3).median
    print(f"Interpreter timings mean nothing: softmax of 64 x 1000 took {interp * 1e3:.0f} ms in the interpreter "
          f"and {torch_s * 1e6:.0f} µs as torch.softmax ({interp / torch_s:,.0f}x): that is NumPy and Python, not a "
          "kernel. Run this notebook on a CUDA GPU (make gpu-check) for real Triton timings.")

# %% [markdown]
# ## 3. Stretch: FlashAttention's forward pass
#
# Attention `softmax(Q K^T / sqrt(d)) V` done the textbook way writes the N × N score matrix `S` to memory,
# reads it for the softmax, writes the probabilities `P`, and reads them again for `P V`: O(N²) bytes per head,
# which at N = 16 384 is 1 GiB per head in fp32. FlashAttention never stores them. Each program takes a block of
# `BLOCK_M` queries and walks K and V in tiles of `BLOCK_N` keys; for each tile it computes the
# (BLOCK_M, BLOCK_N) scores in registers and folds them into three running quantities per query row:
#
# - `m_i`, the max of the scores seen so far;
# - `l_i`, the sum of `exp(s - m_i)` seen so far;
# - `acc`, the sum of `exp(s - m_i) * v` seen so far.
#
# When a tile raises the max from `m_i` to `m_new`, everything summed so far used the old max and is too large by
# `exp(m_new - m_i)`: multiply `l_i` and `acc` by `alpha = exp(m_i - m_new)` before adding the new tile (the
# **online softmax**). At the end `o = acc / l_i`. This is the algorithm of FlashAttention-2's forward pass, the
# kernel that Stanford CS336's assignment 2 asks its students to write.
#
# **08.flash-attention.** Complete the update inside the loop; `tl.dot(p, v, input_precision="ieee")` multiplies
# a probability tile by a V tile. (The tiles are converted to fp32 after loading, section 4 says why, and `tl.dot`
# is asked for IEEE fp32 rather than the TF32 a GPU would use by default. A production kernel feeds bf16 tiles to
# `tl.dot` and lets the tensor cores accumulate in fp32: labkit's kernel does that when it is compiled for a GPU
# with bf16 inputs (its `DOT_16BIT` flag), and `make gpu-check` times it against PyTorch's SDPA.)

# %%
@triton.jit
def my_flash_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq_len, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr):
    start_m, head = tl.program_id(0), tl.program_id(1).to(tl.int64)
    base = head * seq_len * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_m[:, None] < seq_len,
                other=0.0).to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(k_ptr + kv, mask=offs_n[:, None] < seq_len, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + kv, mask=offs_n[:, None] < seq_len, other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (BLOCK_M, BLOCK_N) scores, registers only
        keep = offs_n[None, :] < seq_len
        if CAUSAL:  # a constexpr: the compiler keeps only one branch
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(keep, s, float("-inf"))
        ...  # m_new, alpha, p; update l_i and acc (rescaled by alpha), then m_i
        ### BEGIN SOLUTION
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
        ### END SOLUTION
    o = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < seq_len)


check("08.flash-attention", my_flash_kernel)

# %% [markdown]
# One case the update above does not guard: a query row whose *first* key tile is entirely masked. Its max stays
# `-inf`, and `exp(-inf - -inf)` is NaN. The masks of this workbook cannot produce one (the loop starts at key 0,
# which the causal mask keeps for every query, and the length mask removes keys only from the last tile), so the
# grader does not try it; a kernel with padding or sliding-window masks replaces `m_new` by 0 where it is `-inf`
# before the two exponentials.

# %% [markdown]
# The reference kernel (`K.flash_attention_kernel`, launched by `kernels.flash_attention`) against
# `F.scaled_dot_product_attention` in float64, on small shapes: 2 sequences × 2 heads × 100 positions × head dim 16,
# so 4 query blocks of 32 and 4 key tiles of 32, the last ones partly masked. With fp32 tiles the only bf16
# error is the final store, one rounding of the output. Compiled on a GPU, the bf16 path also rounds each
# probability tile P to bf16 before `P @ V` while the row sum keeps fp32: every weight is off by up to 2⁻⁸ of
# itself (half a bf16 ulp), so the output can be off by 2⁻⁸ · max|v| however small it is. `kernels.attention_tolerance(v)` adds that
# absolute term exactly when the kernel takes that path (on this machine, it prints which):

# %%
for dtype, causal in (("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)):
    q, k, v = (kernels.randn(2, 2, 100, 16, seed=s, dtype=dtype) for s in (1, 2, 3))
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    rtol, atol = kernels.attention_tolerance(v)  # kernels.tolerance(dtype), plus P's rounding on a GPU's bf16 path
    ok, _ = kernels.close(kernels.flash_attention(q, k, v, causal), want, tol=(rtol, atol))
    print(f"{dtype} causal={causal!s:<5}: within rtol {rtol:.3g}, atol {atol:.0e} of SDPA: {ok}")
    assert ok

# %% [markdown]
# The memory it avoids, counted: the textbook attention of `kernels.flash_attention_unfused` (matmul, scale,
# softmax, matmul) under `T.torch_traffic`, against the FlashAttention kernel, for one sequence of 128 positions,
# 2 heads, head dim 16, fp32:

# %%
q, k, v = (kernels.randn(1, 2, 128, 16, seed=s) for s in (4, 5, 6))
naive = T.torch_traffic(kernels.flash_attention_unfused, q, k, v)
scores = 2 * 128 * 128 * 4  # one (N, N) fp32 matrix per head
print(f"textbook: {naive.launches} ops, {naive.total:,} B; largest single write "
      f"{max(o.written for o in naive.ops):,} B = the (N, N) scores of 2 heads ({scores:,} B)")
if MODE.interpreted:
    flash = T.triton_traffic(kernels.flash_attention, q, k, v)
    print(f"flash:    {flash.launches} kernel, {flash.total:,} distinct B (Q, K, V read, O written); "
          f"{flash.requested:,} B requested, K and V once per query block")
    assert flash.total == 4 * q.nbytes and max(o.written for o in naive.ops) == scores

# %% [markdown]
# FlashAttention's extra **footprint** is linear in N: a max and a sum per query row, no N × N matrix. Its
# **traffic** is not. Each of the ⌈N / BLOCK_M⌉ query-block programs reads all of K and V, so a head requests
#
# $$ N d b \left(2 + 2 \lceil N / \mathrm{BLOCK\_M} \rceil\right) \text{ bytes} \quad (b \text{ bytes per element: Q and O once, K and V once per query block}), $$
#
# quadratic in N. Shared memory cannot absorb the re-reads: it belongs to one program, and another program's
# re-read of the same K tile goes out to L2 (and to HBM, unless the head's K and V stay in L2 while its programs
# run). BLOCK_M itself is bounded by the on-chip memory M of an SM: the Q tile (BLOCK_M × d), the K and V tiles and
# the accumulator must fit, so BLOCK_M = Θ(M / d) and the traffic is **Θ(N² d² / M)**, the FlashAttention paper's
# bound (against Θ(N d + N²) for the textbook version). The gain is a factor Θ(M / d²), roughly 2 to 10 for d = 64
# to 128 and 100 to 200 KB of SRAM. The formula against the interpreter's count, for several N and BLOCK_M:

# %%
for n_pos, bm in ((64, 16), (64, 32), (100, 16), (100, 32), (128, 32), (128, 64)):
    want = T.flash_requested(n_pos, 16, bm)  # one head, d = 16, fp32
    if MODE.interpreted:
        q, k, v = (kernels.randn(1, 1, n_pos, 16, seed=s) for s in (4, 5, 6))
        assert T.triton_traffic(kernels.flash_attention, q, k, v, block_m=bm).requested == want, (n_pos, bm)
    print(f"N = {n_pos:>3}, BLOCK_M = {bm:>2}: {want:>8,} B requested = N d 4 (2 + 2 cdiv(N, BLOCK_M))")

# %% [markdown]
# Per head at scale, in fp32 with head dim 64 and BLOCK_M = 128: the K and V reads (all ⌈N / BLOCK_M⌉ of them) are
# Θ(N²) too, 2 d / BLOCK_M score matrices' worth (here exactly one), while the textbook version moves several (S written and read, P
# written and read), and on a GPU many of the re-reads are served by L2:

# %%
for n_pos in (1024, 4096, 16384, 65536):
    qkvo, rereads = 4 * n_pos * 64 * 4, T.flash_requested(n_pos, 64, 128) - 2 * n_pos * 64 * 4
    print(f"N = {n_pos:>6}: Q, K, V, O {qkvo / 2**20:8.1f} MiB   K, V reads {rereads / 2**20:8.1f} MiB   "
          f"one N x N score matrix {n_pos**2 * 4 / 2**20:10.1f} MiB")

# %% [markdown]
# ## 4. The interpreter is not the hardware
#
# The interpreter runs a kernel's Python with NumPy arrays standing in for blocks. It is excellent for logic
# (indices, masks, the online softmax above) and for counting bytes. But its numerics are not the GPU's. A cast to
# bf16 is the simplest case: torch rounds fp32 to bf16 to nearest (ties to even, notebook 02), and the GPU's
# `cvt.rn.bf16.f32` instruction does the same. The interpreter:

# %%
xs = kernels.randn(4096, seed=0)
got, want = kernels.cast(xs, torch.bfloat16), xs.to(torch.bfloat16)
ulps = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()  # same sign: bit distance = ulps
truncated = (xs.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)  # low 16 bits dropped
print(f"Triton {triton.__version__}, {MODE.name}: its cast vs torch's: {int((ulps > 0).sum())} of 4096 values "
      f"differ, by at most {int(ulps.max())} ulp; equal to plain truncation everywhere: {torch.equal(got, truncated)}")

# %%
if MODE.interpreted:
    assert 0 < int((ulps > 0).sum()) < 4096 and int(ulps.max()) == 1 and torch.equal(got, truncated)
else:  # compiled for a GPU: round to nearest even, as torch
    assert torch.equal(got, want)

# %% [markdown]
# The interpreter **truncates** (rounds toward zero): about half of random values land one ulp closer to zero than
# torch's result, and the error is biased, always toward zero. Asking for round-to-nearest in the kernel
# (`x.to(tl.bfloat16, fp_downcast_rounding="rtne")`) changes nothing in the Triton printed above: "rtne" is already
# the default, and its interpreter casts both the same way. The second difference is
# worse. The interpreter stores bf16 values as 16-bit integers, and arithmetic on them without a conversion to fp32
# first is integer arithmetic on bit patterns. The same sum of 4096 bf16 values near 3, with and without
# `.to(tl.float32)` before `tl.sum`:

# %%
xb = kernels.randn(4096, seed=3, shift=3.0, dtype="bf16")
exact = float(xb.double().sum())
up, raw = kernels.kernel_sum(xb, upcast=True), kernels.kernel_sum(xb, upcast=False)
print(f"exact {exact:.1f}; fp32 sum {up:.1f}; sum in bf16: {raw:.4g} ({abs(raw - exact) / exact:.1e} relative error)")
assert abs(up - exact) < 1e-5 * exact
assert (abs(raw - exact) > exact) if MODE.interpreted else (abs(raw - exact) < 0.05 * exact)

# %% [markdown]
# On a GPU the sum in bf16 is close, within bf16's precision (a few percent at most for 4096 terms). In the
# interpreter it is nonsense, which is why every kernel here converts right after loading (and why the
# FlashAttention tiles are fp32 here: the interpreter's `tl.dot` of bf16 tiles multiplies bit patterns too).
#
# "Close" holds because `tl.sum` is mostly a **tree**: each thread first adds its own few elements (here 32 per
# thread with 4 warps), then the threads' partial sums are combined in pairs, then pairs of pairs, so no running
# sum gets long enough to dwarf what is added to it. The real hazard of a 16-bit accumulator is a **loop-carried** one, `acc = acc + x`
# across a loop: once `acc` is large, its ulp exceeds `x` and the sum stops growing. torch rounds each operation
# as a GPU does, so it shows both on 4096 ones:

# %%
one = torch.ones((), dtype=torch.bfloat16)
loop = {dt: torch.zeros((), dtype=dt) for dt in (torch.bfloat16, torch.float16, torch.float32)}
for _ in range(4096):
    loop = {dt: acc + one.to(dt) for dt, acc in loop.items()}
tree = torch.ones(4096, dtype=torch.bfloat16)
while tree.numel() > 1:
    tree = tree[0::2] + tree[1::2]  # one level of the tree, each sum rounded to bf16
print("loop-carried: " + ", ".join(f"{str(dt)[6:]} {float(a):g}" for dt, a in loop.items()) + f"; bf16 tree {float(tree):g}")
assert [float(a) for a in loop.values()] == [256, 2048, 4096] and float(tree) == 4096

# %% [markdown]
# The bf16 accumulator stalls at 256 = 2⁸ (8 significant bits: there the ulp is 2, and 256 + 1 is a tie that rounds
# back to even 256), the fp16 one at 2048 = 2¹¹; the tree, in bf16 too, is exact. This is why FlashAttention's
# `acc` and `l_i` are fp32 even when Q, K and V are bf16: they are loop-carried across all ⌈N / BLOCK_N⌉ key tiles,
# and the tensor cores' `tl.dot` returns fp32 for the same reason.
#
# The other differences worth knowing:
#
# - **Programs run one after another.** On a GPU they run at the same time, so two programs writing the same
#   address race, and atomics contend; the interpreter cannot show a race.
# - **No hardware limits.** A `BLOCK` too large for the GPU's registers or shared memory, `num_warps`, the
#   occupancy: the interpreter ignores them all.
# - **Different math.** On a GPU `tl.exp`, `/` and `tl.sqrt` are fast approximate instructions (a few ulp), and
#   `tl.dot` of fp32 tiles uses TF32 (10-bit mantissa, notebook 05) unless told `input_precision="ieee"`, as the
#   FlashAttention kernels here are: the interpreter computes in full fp32 either way, so it would never show the
#   TF32 error.
# - **Out-of-bounds access.** Without a mask the interpreter reads and writes host memory next to the tensor; a
#   GPU may fault with "illegal memory access", or corrupt silently. The graders above catch it with guard zones
#   and, in the interpreter, by checking every loaded and stored address against the launch's tensors
#   (`T.triton_strays`, the hook `T.triton_traffic` uses); on a GPU, `compute-sanitizer` does that.
# - **No coalescing.** A GPU serves a warp's 32 loads in 32-byte sectors: 32 consecutive fp32 values are 4 sectors
#   (coalesced), 32 values a row apart are 32 sectors, 8 times the traffic for the same bytes used. The
#   interpreter counts elements and bytes requested, never sectors or cache lines, so a kernel that walks a column
#   of a row-major matrix looks as cheap here as one that walks a row; Nsight Compute's sectors per request shows
#   the difference.
#
# So: develop and test a kernel's logic in the interpreter, on a laptop, in CI. But a low-precision kernel's
# numerics (rounding, accumulation, TF32, fast math) can only be tested on the device it will run on, against a
# float64 reference, with a tolerance derived from the format. `make gpu-check` runs this notebook compiled.
#
# ## Summary
#
# - A Triton kernel is launched on a grid of programs; each program handles a block (`tl.arange`), masks the
#   lanes past the end, and moves data with `tl.load` / `tl.store`. A Python launcher chooses block and grid.
# - Fusion is counted in bytes: a chain of torch ops makes one pass through memory per op, a fused kernel one pass
#   in all. Here: 2x for bias + GELU, 4x for softmax, 5.9x for LayerNorm, 2.9x for AdamW. On the roofline fusion
#   moves each op to the right, with the same FLOPs, and for these memory-bound ops the roof rises with it.
# - Load, convert to fp32, compute, convert back when storing: bf16 traffic, fp32 arithmetic. Check against a
#   float64 reference with a tolerance stated from the format (fp32: a few roundings; bf16: one ulp).
# - FlashAttention tiles K and V, keeps the scores in registers and rescales its running sums with an online
#   softmax: no N × N matrix, so its extra memory is linear in N; its traffic is still quadratic, Θ(N² d² / M),
#   because K and V are re-read once per query block, but smaller than the textbook version's.
# - Offsets in int64 (`program_id(0).to(tl.int64)`) once a tensor can pass 2³¹ elements; a row kept in one block
#   must fit in registers, so longer rows loop. A bf16 accumulator carried across a loop stalls (at 256 on ones):
#   accumulate in fp32.
# - Triton's interpreter runs kernels on any CPU, for logic and byte counts. Its numerics (bf16 truncation,
#   integer arithmetic on bf16, no TF32, no concurrency) are not the GPU's, and its timings mean nothing.
#
# Next, [notebook 16](16_triton_attention.ipynb) (optional, after this one) takes Triton further: a tiled matmul
# with autotuning, a looped softmax, FlashAttention's forward with the logsumexp and its backward pass, and a
# LayerNorm backward, checked with `torch.autograd.gradcheck`. In the main sequence, notebook 09 spreads the
# training step over several processes, where the bottleneck becomes communication.
