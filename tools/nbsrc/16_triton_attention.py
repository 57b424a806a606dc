# %% [markdown]
# # 16 · Triton II: tiled matmul and FlashAttention, forward and backward
#
# Notebook 08 wrote kernels whose rows fit in one block and whose work was elementwise or a row reduction. The
# kernels that matter most in training are neither: a matmul reuses every input many times, and attention needs a
# backward pass that autograd cannot derive through a kernel. This notebook writes both, in the style of the
# FlashAttention-2 kernels that Stanford CS336's systems assignment asks for.
#
# **Objectives**
# - write a tiled matmul: blocks over M, N and K, an fp32 accumulator, a grouped program order for L2 reuse, and
#   `@triton.autotune` over block sizes, `num_warps` and `num_stages`: what each knob does on a GPU, and what the
#   interpreter can and cannot show;
# - loop over a row longer than one block with an online softmax, the bridge to FlashAttention;
# - complete FlashAttention's forward: the logsumexp saved per row, the causal loop stopped at the diagonal,
#   `exp2` with log2(e) folded into the scale, tile sizes against on-chip memory, and why the rescaling is exact;
# - write backward passes: LayerNorm's (the dW/db reduction across rows, without a race) and FlashAttention's
#   (P recomputed from the logsumexp), each as a `torch.autograd.Function` checked with
#   `torch.autograd.gradcheck` in float64 and against torch's gradients.
#
# **Prerequisites:** notebook 07 (the roofline, bytes moved), notebook 08 (Triton's programming model, the
# fused kernels, FlashAttention's online softmax).
#
# **Estimated time:** 50 min
#
# **Where it runs.** As in notebook 08: compiled on a CUDA GPU, in Triton's interpreter everywhere else. The
# interpreter gives real answers and real byte counts; it cannot time a kernel, coalesce a load or run two programs
# at once, and the text says where that matters.

# %%
# %matplotlib inline
from labkit import kernels

MODE = kernels.setup()  # before triton is imported: interpreter on a CPU, compiled on a CUDA GPU
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from labkit import traffic as T
from labkit.check import check

K = kernels.load()  # labkit's reference kernels, decorated in the mode chosen above
print(MODE)

# %% [markdown]
# ## 1. A tiled matmul
#
# `C = A @ B` with A of shape (M, K) and B of shape (K, N). One program computes one (BLOCK_M, BLOCK_N) tile of C.
# It walks K in steps of BLOCK_K: at each step it loads a (BLOCK_M, BLOCK_K) tile of A and a (BLOCK_K, BLOCK_N)
# tile of B and adds their product into an fp32 accumulator that lives in registers. Every element of A is then
# read by ⌈N / BLOCK_N⌉ programs instead of N times, which is what turns a matmul from memory-bound into
# compute-bound (notebook 07's roofline). On a GPU with bf16 inputs the tiles go to `tl.dot` as bf16, the tensor
# cores multiply them and accumulate in fp32; labkit's kernel does that when compiled (`DOT_16BIT`). In the
# interpreter the tiles are converted to fp32 first (notebook 08, section 4: its bf16 arithmetic is integer
# arithmetic on bit patterns).
#
# Pointers advance through A and B with their **strides**, so the same kernel takes a transposed view without a
# copy. The M, N and K indices are masked: the last tiles of an odd shape run past the matrix.
#
# **16.matmul-k-loop.** The kernel below has everything but its K loop. Write it: per step, load the two tiles
# (masked, with a fill that adds nothing to the sum), accumulate, advance both pointer blocks.

# %%
@triton.jit
def my_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m, num_pid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group_size_m = tl.minimum(num_pid_m - (pid // (GROUP_M * num_pid_n)) * GROUP_M, GROUP_M)
    pid_m = (pid // (GROUP_M * num_pid_n)) * GROUP_M + (pid % (GROUP_M * num_pid_n)) % group_size_m
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_size_m
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ...  # the K loop: masked loads of the A and B tiles, acc += their product (fp32), advance the pointers
    ### BEGIN SOLUTION
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    ### END SOLUTION
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=c_mask)


check("16.matmul-k-loop", my_matmul_kernel)

# %% [markdown]
# The grader ran your kernel on 64 × 64 × 64, on 33 × 70 × 47, on transposed views (strides that are not those of a
# contiguous matrix) and with bf16 inputs, with every input in a larger buffer whose tail holds NaN and every load
# checked against the tensors (in the interpreter). The tolerance is the
# classic bound of a dot product of length K summed in fp32: `K · 2⁻²⁴ · (|A| @ |B|)` per element
# (`kernels.matmul_close`), plus one bf16 ulp of the result for a bf16 output. A bound relative to the result
# itself would be wrong wherever the terms cancel.
#
# ### 1.1 The program order: grouping for L2
#
# The grid is one-dimensional, and the kernel's first lines turn the program id into a tile (pid_m, pid_n). In
# row-major order, consecutive programs take consecutive tiles of one row of C: they share one tile-row of A but
# each needs a different tile-column of B. A GPU runs a few hundred programs at once, and the tiles they load stay
# in L2 while they run. **Grouped order** sweeps GROUP_M tile-rows column by column instead, so the programs
# running together touch a square of C and share both A's rows and B's columns. The same arithmetic as the kernel,
# in Python, for a 16 × 16 grid of tiles and the first 64 programs to run:

# %%
def tile(pid, num_m, num_n, group_m):
    first = (pid // (group_m * num_n)) * group_m  # the group's first tile-row
    size = min(num_m - first, group_m)
    return first + (pid % (group_m * num_n)) % size, (pid % (group_m * num_n)) // size


touched = {}
for group_m in (1, 8):  # GROUP_M = 1 is plain row-major order
    tiles = [tile(pid, 16, 16, group_m) for pid in range(64)]
    rows, cols = len({m for m, _ in tiles}), len({n for _, n in tiles})
    touched[group_m] = rows + cols
    print(f"GROUP_M = {group_m}: the first 64 programs read {rows} tile-rows of A and {cols} tile-columns of B")
assert touched[8] < touched[1]

# %% [markdown]
# ### 1.2 Autotuning
#
# Which tile sizes are fastest depends on the GPU, the dtype and the shape. `@triton.autotune` takes a list of
# `triton.Config`s and a `key`: on the first launch for each new value of the key arguments it compiles and times
# every config and keeps the fastest. The knobs:
#
# - **BLOCK_M, BLOCK_N, BLOCK_K**: the tile sizes. Larger tiles reuse each load more (intensity grows with the
#   tile) but need more registers and shared memory per program, so fewer programs fit on an SM at once;
# - **GROUP_M**: the grouped order above;
# - **num_warps**: threads per program (32 per warp); more warps share the tile's work and hide latency;
# - **num_stages**: how many shared-memory buffers the K loop gets (software pipelining): the loads of the next
#   `num_stages - 1` steps are in flight while the `tl.dot` of step k runs; each stage costs shared memory for one
#   A and one B tile.
#
# labkit's configurations and the autotuned launch:

# %%
for c in kernels.MATMUL_CONFIGS:
    print(c)
tuned = triton.autotune(configs=kernels.matmul_configs(), key=["M", "N", "K"])(K.matmul_kernel)  # as kernels.matmul
print(f"{MODE.name}: the autotuner gets {len(kernels.matmul_configs())} config(s) here")

# %% [markdown]
# In the interpreter the autotuner gets one config, because it has nothing to time with: Triton's interpreter runs
# each program as NumPy code, one after another, with no GPU driver, and a timing there would measure Python anyway.
# Nor can the interpreter show **coalescing**: a warp's 32 loads of consecutive addresses are served in a few 32-byte
# sectors, while 32 loads a row apart need 32; the interpreter counts bytes, never sectors. `num_warps` and
# `num_stages` change nothing in its answers, and the tile sizes only the order of the fp32 sums, which is the
# point: the logic is checked here, the speed on the GPU (`make gpu-check`). The launcher `kernels.matmul` wraps
# the same kernel in the same `triton.autotune`; against `torch.matmul` on odd shapes and a transposed view:

# %%
for m, k, n, dtype in ((33, 70, 47, "fp32"), (100, 37, 65, "fp32"), (33, 70, 47, "bf16")):
    a, b = kernels.randn(m, k, seed=1, dtype=dtype), kernels.randn(n, k, seed=2, dtype=dtype).t()  # b: a view
    ok, worst = kernels.matmul_close(kernels.matmul(a, b), a, b)
    print(f"{dtype} {m} x {k} x {n} (B transposed, strides {b.stride()}): within the fp32 accumulation bound: {ok}")
    assert ok

# %% [markdown]
# ## 2. A row longer than one block: the looped online softmax
#
# Notebook 08's softmax kept a row in one block, and its launcher refuses rows past `kernels.MAX_ROW_BLOCK`
# columns (registers). A longer row is read in blocks. Three passes would do (max, then sum, then write); the online
# softmax folds the first two into one: a running max `m` and a running sum `l`, and when a block raises the max
# from `m` to `m'`, the sum so far is rescaled by `exp(m - m')`. The second pass writes `exp(x - m) / l`. It is
# FlashAttention's trick on one row:

# %%
print(kernels.source(K.softmax_looped_kernel))

# %%
x = kernels.randn(3, 20_000, seed=3, scale=4.0)  # past MAX_ROW_BLOCK
y = kernels.softmax_looped(x, block=4096)
print(f"rows of {x.shape[1]:,} in blocks of 4096: within tolerance of torch.softmax: "
      f"{kernels.close(y, torch.softmax(x.double(), -1))[0]}")
assert kernels.close(y, torch.softmax(x.double(), -1))[0]

# %% [markdown]
# Two reads of the row and one write, against three reads for max, sum and write as separate passes. Counted in the
# interpreter, on a smaller matrix:

# %%
xs = kernels.randn(4, 3000, seed=4)
if MODE.interpreted:
    counted = T.triton_traffic(kernels.softmax_looped, xs, block=1024)
    print(f"requested {counted.requested:,} B = {counted.requested / xs.nbytes:g} x the matrix")
    assert counted.requested == 3 * xs.nbytes and (counted.read, counted.written) == (xs.nbytes, xs.nbytes)

# %% [markdown]
# ## 3. FlashAttention's forward, complete
#
# Notebook 08's kernel returned O. A training kernel must also leave what the backward needs, and do less work:
#
# - **The logsumexp.** Per query row, `L = m + log(l)` with the final max and sum. Then
#   `P = exp(S - L)` is the softmax row exactly, and the backward can recompute any tile of P from S and L without
#   the running statistics. One number per row: the N × N matrix is still never stored.
# - **The causal stop.** With a causal mask, query block i needs keys up to its own last row only. The loop ends at
#   `min((i + 1) · BLOCK_M, N)`, so the tiles above the diagonal are never loaded: about half the work and half the
#   K and V traffic.
# - **exp2.** A GPU's special-function unit computes `2^x` (`ex2`); `exp(x)` costs a multiply by log2(e) more.
#   Scaling the scores once by `scale · log2(e)` turns every exponential into `exp2` and removes one multiply per
#   score; the running max is then in base-2 units (the sum `l` is the same number either way), and `L` is
#   converted back (`· ln 2`).
#
# **Why the rescaling is exact.** After the tiles seen so far, `l = Σ exp(s_j - m)` and `acc = Σ exp(s_j - m) v_j`
# with the current max m. A new tile raises the max to m' ≥ m; since `exp(s_j - m') = exp(s_j - m) · exp(m - m')`,
# multiplying `l` and `acc` by `α = exp(m - m')` gives exactly the sums against m', and the new tile's terms are
# added against m' too. At the end, `acc / l` is `Σ exp(s_j - m) v_j / Σ exp(s_j - m)` for the true max: the
# softmax, whatever the order of the tiles. (Only the roundings differ.)

# %%
print(kernels.source(K.flash_fwd_kernel).split("    start_m = tl.program_id(0)")[1])

# %%
for n_pos, causal in ((37, False), (100, True), (64, True)):
    q, k, v = (kernels.randn(2, 1, n_pos, 16, seed=s) for s in (5, 6, 7))
    o, lse = kernels.flash_attention_fwd(q, k, v, causal)
    s = (q.double() @ k.double().transpose(-1, -2)) * 16**-0.5
    s = s.masked_fill(torch.ones(n_pos, n_pos, dtype=torch.bool).triu(1), float("-inf")) if causal else s
    ok_o = kernels.close(o, F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal))[0]
    ok_l = kernels.close(lse, torch.logsumexp(s, -1))[0]
    print(f"N = {n_pos:>3}, causal = {causal!s:<5}: O within tolerance of SDPA {ok_o}, L of torch.logsumexp {ok_l}")
    assert ok_o and ok_l

# %% [markdown]
# **16.causal-tiles.** With N = 160 and BLOCK_M = BLOCK_N = 32, how many K tiles does the causal forward load in
# all, over the query blocks of one head? (The loop without the stop would load every tile for every block.)

# %%
answer = ...  # a number of K tiles
### BEGIN SOLUTION
answer = sum(min(i + 1, 5) for i in range(5))  # block i loads the tiles 0 .. i
### END SOLUTION
check("16.causal-tiles", answer)

# %% [markdown]
# The causal stop, counted: with BLOCK_M = BLOCK_N = 16 and N = 64, query block i loads (i + 1) key tiles instead of
# all 4. The bytes requested, against the formula (Q read and O written once, L written once, K and V for the keys
# each block loads):

# %%
n_pos, d, bm = 64, 16, 16
q, k, v = (kernels.randn(1, 1, n_pos, d, seed=s) for s in (5, 6, 7))
for causal in (False, True):
    keys = sum(min((i + 1) * bm, n_pos) if causal else n_pos for i in range(triton.cdiv(n_pos, bm)))
    want = 4 * (2 * n_pos * d + 2 * keys * d + n_pos)
    if MODE.interpreted:
        assert T.triton_traffic(kernels.flash_attention_fwd, q, k, v, causal).requested == want, causal
    print(f"causal = {causal!s:<5}: {keys} key rows loaded, {want:,} B requested")

# %% [markdown]
# **Tile sizes against on-chip memory.** A program keeps its Q tile, the K and V tiles of `num_stages` steps in
# flight, and the fp32 accumulator. With bf16 and head dim 128 (the H100 has 228 KB of shared memory per SM, of
# which one thread block may use 227 KB, from NVIDIA's Hopper tuning guide), the bytes per program:

# %%
for bm, bn, stages in ((64, 64, 2), (128, 64, 2), (128, 128, 3)):
    q_tile, kv_tiles, acc_tile = bm * 128 * 2, stages * 2 * bn * 128 * 2, bm * 128 * 4
    total = q_tile + kv_tiles
    print(f"BLOCK_M {bm:>3}, BLOCK_N {bn:>3}, {stages} stages: Q {q_tile // 1024:>3} KB + K, V {kv_tiles // 1024:>3} KB "
          f"= {total // 1024:>3} KB of shared memory (+ {acc_tile // 1024} KB of fp32 acc in registers); "
          f"{'fits' if total <= 227 * 1024 else 'does not fit'} in 227 KB")

# %% [markdown]
# The larger the query tile, the fewer times K and V are read (notebook 08: Θ(N² d² / M)); the limit is the SM's
# memory, and a tile that leaves room for only one program per SM hides no latency (the last line also leaves
# Triton almost no scratch for its layout conversions, so it may not compile at all). This is the trade-off the
# autotuner settles on a real GPU.
#
# ## 4. Backward passes
#
# A kernel is opaque to autograd: `kernels.layernorm` returns tensors without a graph. To train through it, wrap
# it in a `torch.autograd.Function` whose `forward` saves what the backward needs and whose `backward` runs a
# backward kernel. The check is `torch.autograd.gradcheck`: it compares the backward with finite differences of
# the forward, which needs float64 (fp32 finite differences are noise), so the kernels take a compute dtype and
# run in float64 here, in the interpreter. `fast_mode=True` checks the Jacobian along random directions, a few
# launches instead of one per input element.
#
# ### 4.1 LayerNorm backward, and the reduction across rows
#
# With `x̂ = (x - mean) · rstd` and `y = x̂ · w + b`, per row:
# `dx = rstd · (w·dy - mean(w·dy) - x̂ · mean(w·dy · x̂))`, from the saved mean and rstd. That part is per row, like
# the forward. The weight gradients are not: `dw = Σ_rows dy · x̂` and `db = Σ_rows dy` sum over **all** rows, and
# the rows belong to different programs. If every program added its row into `dw` with a load, an add and a store,
# two programs running at once would both load the old value and one addition would be lost: a **race**. The
# interpreter runs programs one after another, so it would never show it. Atomics (`tl.atomic_add`) are correct but
# add in whatever order the programs arrive, so fp32 results change from run to run. labkit's backward does it in
# two stages without either: `groups` programs each sum every `groups`-th row into their **own** row of a
# (groups, cols) buffer, then a second kernel sums the buffer's columns in a fixed order. Stage 1 (the autograd
# wrapper, `kernels.LayerNorm`, saves x, w, mean and rstd in its forward and calls this in its backward):

# %%
print(kernels.source(K.layernorm_bwd_kernel))

# %%
x, w, b = kernels.randn(5, 30, seed=7), kernels.randn(30, seed=8, shift=1.0), kernels.randn(30, seed=9)
x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
ok = torch.autograd.gradcheck(lambda *t: kernels.LayerNorm.apply(*t, 1e-5), (x64, w64, b64), fast_mode=True)
print(f"gradcheck of the LayerNorm kernels in float64 (5 x 30): {ok}")
assert ok

# %%
x32, w32, b32 = (t.clone().requires_grad_() for t in (x, w, b))
dy = kernels.randn(5, 30, seed=10)
kernels.LayerNorm.apply(x32, w32, b32, 1e-5).backward(dy)
F.layer_norm(x64, [30], w64, b64, 1e-5).backward(dy.double())  # torch's gradients, in float64
for name, mine, ref in (("dx", x32, x64), ("dw", w32, w64), ("db", b32, b64)):
    print(f"{name}: fp32 kernels within tolerance of torch's float64 gradient: {kernels.close(mine.grad, ref.grad)[0]}")
    assert kernels.close(mine.grad, ref.grad)[0]

# %% [markdown]
# ### 4.2 FlashAttention's backward
#
# Forward, per row: `S = Q Kᵀ · scale`, `P = softmax(S)`, `O = P V`. Backward, from `dO`:
#
# - `dV = Pᵀ dO` and `dP = dO Vᵀ`;
# - through the softmax, row by row: `dS = P ∘ (dP - δ)` with `δ = rowsum(dP ∘ P) = rowsum(dO ∘ O)` (one number
#   per row, computed once before the kernel);
# - `dQ = dS K · scale` and `dK = dSᵀ Q · scale`.
#
# No P is stored: each program recomputes its tiles as `P = exp(S - L)` from the saved logsumexp. One program per
# block of keys walks the query blocks (from the diagonal on, when causal). It owns its rows of dK and dV, which
# accumulate in registers. dQ is different: every key block contributes to every query row, so the programs must add
# their shares into dQ in memory, with `tl.atomic_add` (FlashAttention-2's Triton tutorial instead runs a second
# loop, one program per query block, to keep dQ deterministic).
#
# **16.flash-bwd.** The kernel below recomputes P; write the update: dV, dP, dS, dK, and add this tile's share of
# dQ into `dq_ptr + q_offs` (masked by `m_mask`).

# %%
@triton.jit
def my_flash_bwd_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, seq_len, scale,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                        CDT: tl.constexpr):
    start_n, head = tl.program_id(0), tl.program_id(1).to(tl.int64)
    base = head * seq_len * HEAD_DIM
    offs_n, offs_d = start_n * BLOCK_N + tl.arange(0, BLOCK_N), tl.arange(0, HEAD_DIM)
    n_mask = offs_n < seq_len
    kv_offs = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
    v = tl.load(v_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
    dk, dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=CDT), tl.zeros([BLOCK_N, HEAD_DIM], dtype=CDT)
    lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0  # earlier queries see none of these keys
    for start_m in range(lo, seq_len, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_mask = offs_m < seq_len
        q_offs = base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(q_ptr + q_offs, mask=m_mask[:, None], other=0.0).to(CDT)
        do = tl.load(do_ptr + q_offs, mask=m_mask[:, None], other=0.0).to(CDT)
        lse = tl.load(lse_ptr + head * seq_len + offs_m, mask=m_mask, other=0.0).to(CDT)
        delta = tl.load(delta_ptr + head * seq_len + offs_m, mask=m_mask, other=0.0).to(CDT)
        keep = m_mask[:, None] & n_mask[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        p = tl.where(keep, tl.exp2((s - lse[:, None]) * 1.4426950408889634), 0.0)  # P = exp(S - L)
        ...  # dv, dp, ds, dk; then add this tile's share of dQ into dq_ptr + q_offs
        ### BEGIN SOLUTION
        dv += tl.dot(tl.trans(p), do, input_precision="ieee")
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds), q, input_precision="ieee") * scale
        tl.atomic_add(dq_ptr + q_offs, tl.dot(ds, k, input_precision="ieee") * scale, mask=m_mask[:, None])
        ### END SOLUTION
    tl.store(dk_ptr + kv_offs, dk.to(dk_ptr.dtype.element_ty), mask=n_mask[:, None])
    tl.store(dv_ptr + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=n_mask[:, None])


check("16.flash-bwd", my_flash_bwd_kernel)

# %% [markdown]
# labkit's kernels as one autograd op, `kernels.FlashAttention`: the forward saves Q, K, V, O and L, the backward
# launches the backward kernel. gradcheck in float64 on 20 positions (two key blocks, causal), then the fp32
# kernels against torch's gradients of `F.scaled_dot_product_attention` on 40 positions:

# %%
q64, k64, v64 = (kernels.randn(1, 1, 20, 16, seed=s).double().requires_grad_() for s in (11, 12, 13))
ok = torch.autograd.gradcheck(lambda *t: kernels.FlashAttention.apply(*t, True), (q64, k64, v64), fast_mode=True)
print(f"gradcheck of FlashAttention forward + backward in float64 (causal, 20 positions): {ok}")
assert ok

# %%
qs, ks, vs = (kernels.randn(2, 2, 40, 16, seed=s).requires_grad_() for s in (14, 15, 16))
ref = [t.detach().double().requires_grad_() for t in (qs, ks, vs)]
do = kernels.randn(2, 2, 40, 16, seed=17)
kernels.FlashAttention.apply(qs, ks, vs, True).backward(do)
F.scaled_dot_product_attention(*ref, is_causal=True).backward(do.double())
oks = {name: kernels.close(mine.grad, theirs.grad)[0] for name, mine, theirs in zip("QKV", (qs, ks, vs), ref)}
print("fp32 kernels within tolerance of SDPA's float64 gradients: " + ", ".join(f"d{n} {ok}" for n, ok in oks.items()))
assert all(oks.values())

# %% [markdown]
# What the interpreter cannot show here: the atomics' contention and their run-to-run differences in fp32 (its
# programs run one after another, in one order), and whether the backward kernel is fast, which on a GPU depends on
# the same tile-size and `num_stages` trade-offs as the matmul. FlashAttention-2's backward does about 2.5 times the
# matmul work of its forward (five matmuls per tile, one of them recomputing S, against two), which is why its
# tuning matters. On a GPU the atomics also meet `gradcheck`, which runs the backward twice and by default demands
# the same bits (`nondet_tol=0`): here each dQ row gets at most two key blocks' shares, and two additions onto 0
# give the same result in either order, but with three or more the order can change the last bit. Pass a small
# `nondet_tol`, or use the deterministic two-loop backward.
#
# ## Summary
#
# - A tiled matmul reuses each loaded tile BLOCK_N (or BLOCK_M) times, accumulates in fp32 and masks M, N and K.
#   Grouped program order makes co-running programs share tiles in L2; `@triton.autotune` picks tile sizes,
#   `num_warps` and `num_stages` by timing them on the GPU, which the interpreter cannot.
# - The online softmax reads a row of any length in blocks, rescaling its running sum when the max grows, and it
#   is exact, not an approximation: the same two lines prove FlashAttention's rescaling.
# - A complete FlashAttention forward saves the logsumexp per row, stops the causal loop at the diagonal and uses
#   `exp2`; its tile sizes are bounded by the SM's on-chip memory.
# - A backward kernel recomputes what is cheap (P from L) and saves what is small (mean, rstd, L). Sums across
#   programs (LayerNorm's dW and db, FlashAttention's dQ) need a race-free plan: per-program partial buffers and
#   a second reduction, or atomics. `torch.autograd.gradcheck` in float64 checks a hand-written backward.
#
# Back in [notebook 08](08_triton_kernels.ipynb) the interpreter's limits are listed in full; notebook 09 goes on to
# several processes.
