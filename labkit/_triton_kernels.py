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
    pid = tl.program_id(0)
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
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=float("-inf")).to(tl.float32)
    z = x - tl.max(x, axis=0)  # exp of at most 0: never overflows; masked lanes: exp(-inf) = 0
    e = tl.exp(z)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * row_stride + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, row_stride, eps,
                     BLOCK: tl.constexpr):
    """One program per row: y = (x - mean) * rstd * w + b; also stores mean and rstd (what the backward needs)."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)  # masked lanes must not count in the variance
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + row * row_stride + offs, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def adamw_kernel(p_ptr, g_ptr, m_ptr, v_ptr, n, lr, beta1, beta2, eps, weight_decay, bias_corr1,
                 bias_corr2_sqrt, BLOCK: tl.constexpr):
    """One AdamW step, in place, as torch.optim.AdamW computes it: p, m, v in fp32, g in any float dtype."""
    pid = tl.program_id(0)
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
    head = tl.program_id(1)
    base = head * seq_len * HEAD_DIM
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
