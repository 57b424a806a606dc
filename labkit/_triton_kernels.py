"""The Triton kernels of notebook 08, decorated with ``@triton.jit`` when this module is imported.

Do not import this module directly: :func:`labkit.kernels.load` imports it after :func:`labkit.kernels.setup` has
chosen the mode, because ``@triton.jit`` reads ``$TRITON_INTERPRET`` when it decorates a function (interpreter
on the CPU, or a kernel compiled for the GPU). The launchers in :mod:`labkit.kernels` allocate the outputs,
choose the grid and launch these.

Every kernel converts what it loads to fp32 at once and computes in fp32; it converts back to the output's
dtype only when it stores. With bf16 inputs that is "bf16 storage, fp32 arithmetic", the mixed-precision rule,
and it is also the only way to get right answers from Triton's interpreter, which stores bf16 as 16-bit
integers and does arithmetic on those integers (notebook 08, section 4).

The second half holds typical mistakes, one per exercise of notebook 08: the exercise tests prove that each
grader rejects them. Introduced in notebook 08.
"""

from __future__ import annotations

import triton
import triton.language as tl

# ---------------------------------------------------------------------------------------------------------------
# reference kernels
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def bias_gelu_kernel(x_ptr, b_ptr, y_ptr, n, n_cols, BLOCK: tl.constexpr):
    """y = gelu(x + b) over a contiguous (rows, n_cols) tensor seen as n = rows * n_cols elements; exact (erf) GELU."""
    pid = tl.program_id(0).to(tl.int64)  # int64 offsets: pid * BLOCK overflows int32 past 2**31 elements
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs % n_cols, mask=mask).to(tl.float32)  # the column of each element
    h = x + b
    y = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))  # gelu(h) = h * Phi(h)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    """One program per row: y = exp(x - max(x)) / sum(exp(x - max(x))), the whole row in one block."""
    row = tl.program_id(0).to(tl.int64)  # row * row_stride overflows int32 past 2**31 elements
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=float("-inf")).to(tl.float32)
    z = x - tl.max(x, axis=0)  # exp of at most 0: never overflows; masked lanes: exp(-inf) = 0
    e = tl.exp(z)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * row_stride + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, row_stride, eps,
                     BLOCK: tl.constexpr, CDT: tl.constexpr = tl.float32):
    """One program per row: y = (x - mean) * rstd * w + b; also stores mean and rstd (what the backward needs).

    Two passes over the row in registers: the mean, then the variance of the centred values (the one-pass
    E[x^2] - E[x]^2 cancels catastrophically when the mean is large against the spread). ``CDT`` is the
    arithmetic dtype: fp32, or float64 for notebook 16's gradcheck.
    """
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=0.0).to(CDT)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)  # masked lanes must not count in the variance
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + offs, mask=mask).to(CDT)
    b = tl.load(b_ptr + offs, mask=mask).to(CDT)
    tl.store(y_ptr + row * row_stride + offs, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean.to(mean_ptr.dtype.element_ty))
    tl.store(rstd_ptr + row, rstd.to(rstd_ptr.dtype.element_ty))


@triton.jit
def adamw_kernel(p_ptr, g_ptr, m_ptr, v_ptr, n, lr, beta1, beta2, eps, weight_decay, bias_corr1,
                 bias_corr2_sqrt, BLOCK: tl.constexpr):
    """One AdamW step, in place, as torch.optim.AdamW computes it: p, m, v in fp32, g in any float dtype."""
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(p_ptr + offs, mask=mask)
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask)
    v = tl.load(v_ptr + offs, mask=mask)
    p = p * (1.0 - lr * weight_decay)  # decoupled weight decay (the W of AdamW)
    m = m + (1.0 - beta1) * (g - m)  # m.lerp_(g, 1 - beta1)
    v = beta2 * v + (1.0 - beta2) * g * g
    denom = tl.sqrt(v) / bias_corr2_sqrt + eps
    p = p - (lr / bias_corr1) * (m / denom)
    tl.store(p_ptr + offs, p, mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)


@triton.jit
def flash_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq_len, scale, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                           DOT_16BIT: tl.constexpr = False):
    """FlashAttention's forward pass: one program per (block of BLOCK_M queries, head); K and V in tiles.

    q, k, v, o are contiguous (heads, seq_len, HEAD_DIM). The (BLOCK_M, BLOCK_N) scores live in registers only:
    the running max m_i, the running sum l_i and the accumulator acc are rescaled when the max grows. By default
    the tiles are fp32 (the interpreter cannot multiply bf16 tiles) and tl.dot is told IEEE fp32. ``DOT_16BIT``
    (compiled, bf16/fp16 inputs) feeds tl.dot the 16-bit tiles as loaded, and P cast to V's dtype, with fp32
    accumulation: the tensor-core path a real kernel takes; the softmax statistics stay fp32.
    """
    start_m = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    base = head * seq_len * HEAD_DIM  # int64: heads * seq_len * HEAD_DIM passes 2**31 in long-context batches
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_mask = offs_m < seq_len
    q = tl.load(q_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=m_mask[:, None], other=0.0)
    if not DOT_16BIT:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_mask = offs_n < seq_len
        kv_offs = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(k_ptr + kv_offs, mask=n_mask[:, None], other=0.0)
        v = tl.load(v_ptr + kv_offs, mask=n_mask[:, None], other=0.0)
        if DOT_16BIT:  # tensor cores: 16-bit tiles in, fp32 out
            s = tl.dot(q, tl.trans(k)) * scale
        else:
            k, v = k.to(tl.float32), v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (BLOCK_M, BLOCK_N) scores: never in memory
        keep = n_mask[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)  # how much the old max overstated: rescale what was summed so far
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT_16BIT:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=m_mask[:, None])


@triton.jit
def cast_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = x converted to y's dtype (e.g. fp32 -> bf16): how does this Triton round?"""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, UPCAST: tl.constexpr):
    """out[0] = sum of x[:n] (n <= BLOCK), in fp32 if UPCAST, else in x's own dtype."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    if UPCAST:
        x = x.to(tl.float32)
    tl.store(out_ptr, tl.sum(x, axis=0).to(out_ptr.dtype.element_ty))


# ---------------------------------------------------------------------------------------------------------------
# notebook 16: a tiled matmul, a looped softmax, FlashAttention forward and backward, LayerNorm backward
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  DOT_16BIT: tl.constexpr = False):
    """C = A @ B, one program per (BLOCK_M, BLOCK_N) tile of C, walking K in steps of BLOCK_K; fp32 accumulator.

    Programs are numbered in grouped order: GROUP_M tile-rows of C are swept column by column, so the programs
    that run at the same time share A's rows and B's columns in L2. ``DOT_16BIT`` (compiled, bf16/fp16 inputs)
    feeds tl.dot the 16-bit tiles (tensor cores, fp32 accumulation); otherwise the tiles are fp32, IEEE.
    """
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)  # the last group may be short
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k) & (offs_n[None, :] < N), other=0.0)
        if DOT_16BIT:
            acc = tl.dot(a, b, acc)
        else:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=c_mask)


@triton.jit
def softmax_looped_kernel(x_ptr, y_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    """One program per row of any length, BLOCK columns at a time: an online pass for the max and the sum
    (rescaled when the max grows), then a pass that writes exp(x - m) / l. Reads the row twice, writes it once."""
    row = tl.program_id(0).to(tl.int64)
    m = tl.full([], float("-inf"), dtype=tl.float32)
    l_sum = tl.zeros([], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * row_stride + offs, mask=offs < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        l_sum = l_sum * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * row_stride + offs, mask=offs < n_cols, other=float("-inf")).to(tl.float32)
        tl.store(y_ptr + row * row_stride + offs, (tl.exp(x - m) / l_sum).to(y_ptr.dtype.element_ty),
                 mask=offs < n_cols)


@triton.jit
def flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, seq_len, scale, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, CDT: tl.constexpr):
    """FlashAttention-2's forward: O and the logsumexp L = m + log(l) of every query row (what the backward needs).

    Scores are scaled by scale * log2(e) once, so every exponential is an exp2 (the GPU's native ex2 instruction);
    L is stored in natural-log units. The causal loop stops at the diagonal: key tiles past it are never loaded.
    ``CDT`` is the arithmetic dtype (fp32; float64 for gradcheck).
    """
    start_m = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    base = head * seq_len * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_mask = offs_m < seq_len
    q = tl.load(q_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=m_mask[:, None], other=0.0)
    q = q.to(CDT)
    qk_scale = scale * 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e))
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=CDT)
    l_i = tl.zeros([BLOCK_M], dtype=CDT)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=CDT)
    hi = tl.minimum((start_m + 1) * BLOCK_M, seq_len) if CAUSAL else seq_len
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_mask = offs_n < seq_len
        kv_offs = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(k_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
        v = tl.load(v_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # log2 units
        keep = n_mask[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=m_mask[:, None])
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453  # back to natural log: L = m + log(l)
    tl.store(lse_ptr + head * seq_len + offs_m, lse.to(lse_ptr.dtype.element_ty), mask=m_mask)


@triton.jit
def flash_bwd_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, seq_len, scale,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                     CDT: tl.constexpr):
    """FlashAttention's backward: one program per (block of BLOCK_N keys, head) walks the query blocks.

    P is recomputed tile by tile from the saved logsumexp (P = exp(S - L)), never stored. dK and dV of the
    program's keys accumulate in registers; dQ gets a contribution from every key block, so programs add it with
    tl.atomic_add (dq must start at zero). delta = rowsum(dO * O), computed before the launch.
    """
    start_n = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    base = head * seq_len * HEAD_DIM
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    n_mask = offs_n < seq_len
    kv_offs = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
    v = tl.load(v_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=CDT)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=CDT)
    lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0  # queries before the diagonal see none of these keys
    for start_m in range(lo, seq_len, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_mask = offs_m < seq_len
        q_offs = base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(q_ptr + q_offs, mask=m_mask[:, None], other=0.0).to(CDT)
        do = tl.load(do_ptr + q_offs, mask=m_mask[:, None], other=0.0).to(CDT)
        lse = tl.load(lse_ptr + head * seq_len + offs_m, mask=m_mask, other=0.0).to(CDT)
        delta = tl.load(delta_ptr + head * seq_len + offs_m, mask=m_mask, other=0.0).to(CDT)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        keep = m_mask[:, None] & n_mask[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        p = tl.where(keep, tl.exp2((s - lse[:, None]) * 1.4426950408889634), 0.0)  # P recomputed from L
        dv += tl.dot(tl.trans(p), do, input_precision="ieee")
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds), q, input_precision="ieee") * scale
        tl.atomic_add(dq_ptr + q_offs, tl.dot(ds, k, input_precision="ieee") * scale, mask=m_mask[:, None])
    tl.store(dk_ptr + kv_offs, dk.to(dk_ptr.dtype.element_ty), mask=n_mask[:, None])
    tl.store(dv_ptr + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=n_mask[:, None])


@triton.jit
def layernorm_bwd_kernel(x_ptr, w_ptr, mean_ptr, rstd_ptr, dy_ptr, dx_ptr, dw_part_ptr, db_part_ptr, n_rows, n_cols,
                         row_stride, GROUPS: tl.constexpr, BLOCK: tl.constexpr, CDT: tl.constexpr):
    """LayerNorm's backward, stage 1: program g handles rows g, g + GROUPS, ...; writes dx of each row and its own
    partial sums of dW and db into row g of two (GROUPS, n_cols) buffers. No two programs write the same address:
    the cross-row sum of dW and db is finished by a second, deterministic reduction over the GROUPS rows.

    dx = rstd * (w * dy - mean(w * dy) - xhat * mean(w * dy * xhat)), xhat = (x - mean) * rstd.
    """
    g = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(CDT)
    dw = tl.zeros([BLOCK], dtype=CDT)
    db = tl.zeros([BLOCK], dtype=CDT)
    for row in range(g, n_rows, GROUPS):
        start = tl.cast(row, tl.int64) * row_stride  # cast the row, not row_stride: an int argument equal to 1
        # is compiled as a constexpr, which has no .to()
        x = tl.load(x_ptr + start + offs, mask=mask, other=0.0).to(CDT)
        dy = tl.load(dy_ptr + start + offs, mask=mask, other=0.0).to(CDT)
        mean = tl.load(mean_ptr + row).to(CDT)
        rstd = tl.load(rstd_ptr + row).to(CDT)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / n_cols
        c2 = tl.sum(wdy, axis=0) / n_cols
        tl.store(dx_ptr + start + offs, ((wdy - (xhat * c1 + c2)) * rstd).to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    tl.store(dw_part_ptr + g * n_cols + offs, dw.to(dw_part_ptr.dtype.element_ty), mask=mask)
    tl.store(db_part_ptr + g * n_cols + offs, db.to(db_part_ptr.dtype.element_ty), mask=mask)


@triton.jit
def column_sum_kernel(x_ptr, out_ptr, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[j] = sum over rows of x[:, j] (a contiguous (n_rows, n_cols) x): one program per BLOCK_C columns, rows
    in a fixed order, so the result is the same bits on every run (stage 2 of LayerNorm's dW/db)."""
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros([BLOCK_C], dtype=out_ptr.dtype.element_ty)
    for start in range(0, n_rows, BLOCK_R):
        offs_r = start + tl.arange(0, BLOCK_R)
        tile = tl.load(x_ptr + offs_r[:, None].to(tl.int64) * n_cols + offs_c[None, :],
                       mask=(offs_r[:, None] < n_rows) & (offs_c[None, :] < n_cols), other=0.0)
        acc += tl.sum(tile.to(acc.dtype), axis=0)
    tl.store(out_ptr + offs_c, acc, mask=offs_c < n_cols)


# ---------------------------------------------------------------------------------------------------------------
# typical mistakes: the exercises' graders must reject each of these (tests/test_exercises.py)
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def bias_gelu_no_mask(x_ptr, b_ptr, y_ptr, n, n_cols, BLOCK: tl.constexpr):
    """Mistake: no mask. The last program reads and writes past the end when n is not a multiple of BLOCK."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs).to(tl.float32)
    b = tl.load(b_ptr + offs % n_cols).to(tl.float32)
    h = x + b
    y = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty))


@triton.jit
def softmax_no_max(x_ptr, y_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    """Mistake: the row max is not subtracted, so exp overflows to inf for inputs above ~88."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * row_stride + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layernorm_bf16_accumulation(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, row_stride, eps,
                                BLOCK: tl.constexpr):
    """Mistake: no .to(tl.float32) after the loads, so sums and differences run in the input's dtype (bf16)."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(y_ptr + row * row_stride + offs, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean.to(tl.float32))
    tl.store(rstd_ptr + row, rstd.to(tl.float32))


@triton.jit
def flash_attention_no_rescale(q_ptr, k_ptr, v_ptr, o_ptr, seq_len, scale, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr):
    """Mistake: the running sum and the accumulator are not rescaled when the running max grows."""
    start_m = tl.program_id(0)
    head = tl.program_id(1)
    base = head * seq_len * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_mask = offs_m < seq_len
    q = tl.load(q_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=m_mask[:, None], other=0.0)
    q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_mask = offs_n < seq_len
        kv_offs = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(k_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        keep = n_mask[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        l_i = l_i + tl.sum(p, axis=1)
        acc = acc + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=m_mask[:, None])


@triton.jit
def matmul_no_k_mask(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Mistake (notebook 16): the K loop's loads mask only M and N, so the last K step reads past K: the next row
    of A, past the end of B."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _k in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=offs_m[:, None] < M, other=0.0).to(tl.float32)
        b = tl.load(b_ptrs, mask=offs_n[None, :] < N, other=0.0).to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=c_mask)


@triton.jit
def flash_bwd_dq_store(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, seq_len, scale,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                       CDT: tl.constexpr):
    """Mistake (notebook 16): dQ is written with tl.store, so each key block overwrites the others' share (in the
    interpreter the last program wins; on a GPU whichever program stores last, a race)."""
    start_n = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    base = head * seq_len * HEAD_DIM
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    n_mask = offs_n < seq_len
    kv_offs = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
    v = tl.load(v_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=CDT)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=CDT)
    lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for start_m in range(lo, seq_len, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_mask = offs_m < seq_len
        q_offs = base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(q_ptr + q_offs, mask=m_mask[:, None], other=0.0).to(CDT)
        do = tl.load(do_ptr + q_offs, mask=m_mask[:, None], other=0.0).to(CDT)
        lse = tl.load(lse_ptr + head * seq_len + offs_m, mask=m_mask, other=0.0).to(CDT)
        delta = tl.load(delta_ptr + head * seq_len + offs_m, mask=m_mask, other=0.0).to(CDT)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        keep = m_mask[:, None] & n_mask[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        p = tl.where(keep, tl.exp2((s - lse[:, None]) * 1.4426950408889634), 0.0)
        dv += tl.dot(tl.trans(p), do, input_precision="ieee")
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds), q, input_precision="ieee") * scale
        tl.store(dq_ptr + q_offs, tl.dot(ds, k, input_precision="ieee") * scale, mask=m_mask[:, None])
    tl.store(dk_ptr + kv_offs, dk.to(dk_ptr.dtype.element_ty), mask=n_mask[:, None])
    tl.store(dv_ptr + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=n_mask[:, None])
