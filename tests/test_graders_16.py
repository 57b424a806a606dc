"""Notebook 16's graders against the wrong kernels a learner writes: each is rejected with a message naming the
bug, the references pass, and a stub is "not attempted". Written as plain functions, as in the notebook's cells."""

from __future__ import annotations

import pytest
import triton.language as tl

from labkit import kernels
from labkit.check import evaluate
from labkit.exercises import get_exercise

MODE = kernels.setup()


def matmul_no_advance(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """The pointers are never advanced: every K step multiplies the first tiles again."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = pid // num_pid_n, pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k), other=0.0).to(tl.float32)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k) & (offs_n[None, :] < N), other=0.0).to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def matmul_contiguous_steps(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                            stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr):
    """The pointers advance by BLOCK_K and BLOCK_K * N: right for contiguous A and B only, not for a transposed view."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    offs_m = (pid // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k), other=0.0).to(tl.float32)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k) & (offs_n[None, :] < N), other=0.0).to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * N
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def matmul_bf16_dot(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """tl.dot on the tiles as loaded: right on a GPU (tensor cores), bit patterns multiplied in the interpreter."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    offs_m = (pid // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def matmul_stub(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """The notebook's cell before the learner writes the loop."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ...
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def flash_bwd_no_delta(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, seq_len, scale,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                       CDT: tl.constexpr):
    """dS = P * dP: the softmax's backward without the row term delta."""
    start_n, head = tl.program_id(0), tl.program_id(1).to(tl.int64)
    base = head * seq_len * HEAD_DIM
    offs_n, offs_d = start_n * BLOCK_N + tl.arange(0, BLOCK_N), tl.arange(0, HEAD_DIM)
    n_mask = offs_n < seq_len
    kv_offs = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
    v = tl.load(v_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
    dk, dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=CDT), tl.zeros([BLOCK_N, HEAD_DIM], dtype=CDT)
    lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for start_m in range(lo, seq_len, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_mask = offs_m < seq_len
        q_offs = base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(q_ptr + q_offs, mask=m_mask[:, None], other=0.0).to(CDT)
        do = tl.load(do_ptr + q_offs, mask=m_mask[:, None], other=0.0).to(CDT)
        lse = tl.load(lse_ptr + head * seq_len + offs_m, mask=m_mask, other=0.0).to(CDT)
        keep = m_mask[:, None] & n_mask[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        p = tl.where(keep, tl.exp2((s - lse[:, None]) * 1.4426950408889634), 0.0)
        dv += tl.dot(tl.trans(p), do, input_precision="ieee")
        ds = p * tl.dot(do, tl.trans(v), input_precision="ieee")
        dk += tl.dot(tl.trans(ds), q, input_precision="ieee") * scale
        tl.atomic_add(dq_ptr + q_offs, tl.dot(ds, k, input_precision="ieee") * scale, mask=m_mask[:, None])
    tl.store(dk_ptr + kv_offs, dk.to(dk_ptr.dtype.element_ty), mask=n_mask[:, None])
    tl.store(dv_ptr + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=n_mask[:, None])


def flash_bwd_dq_unmasked(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, seq_len, scale,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                          CDT: tl.constexpr):
    """tl.atomic_add into dQ without the row mask: the padded query rows of the last head add (zeros) past dq's end."""
    start_n, head = tl.program_id(0), tl.program_id(1).to(tl.int64)
    base = head * seq_len * HEAD_DIM
    offs_n, offs_d = start_n * BLOCK_N + tl.arange(0, BLOCK_N), tl.arange(0, HEAD_DIM)
    n_mask = offs_n < seq_len
    kv_offs = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
    v = tl.load(v_ptr + kv_offs, mask=n_mask[:, None], other=0.0).to(CDT)
    dk, dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=CDT), tl.zeros([BLOCK_N, HEAD_DIM], dtype=CDT)
    lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0
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
        p = tl.where(keep, tl.exp2((s - lse[:, None]) * 1.4426950408889634), 0.0)
        dv += tl.dot(tl.trans(p), do, input_precision="ieee")
        ds = p * (tl.dot(do, tl.trans(v), input_precision="ieee") - delta[:, None])
        dk += tl.dot(tl.trans(ds), q, input_precision="ieee") * scale
        tl.atomic_add(dq_ptr + q_offs, tl.dot(ds, k, input_precision="ieee") * scale)
    tl.store(dk_ptr + kv_offs, dk.to(dk_ptr.dtype.element_ty), mask=n_mask[:, None])
    tl.store(dv_ptr + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=n_mask[:, None])


@pytest.mark.parametrize(("ex_id", "kernel", "words"), [
    ("16.matmul-k-loop", matmul_no_advance, "off by"),
    ("16.matmul-k-loop", matmul_contiguous_steps, "strides"),
    ("16.flash-bwd", flash_bwd_no_delta, "delta"),
])
def test_a_learners_wrong_kernel_is_rejected(ex_id, kernel, words):
    v = evaluate(ex_id, kernel)
    assert v.status == "wrong" and words in v.message, v.message


def test_bf16_tiles_into_tl_dot_are_right_on_a_gpu_and_explained_in_the_interpreter():
    v = evaluate("16.matmul-k-loop", matmul_bf16_dot)
    if MODE.interpreted:  # the interpreter multiplies bf16 bit patterns; the message must not call the GPU path wrong
        assert v.status == "wrong" and "tensor-core path" in v.message, v.message
    else:
        assert v.status == "correct", v.message


def test_an_unmasked_atomic_add_is_caught_in_the_interpreter():
    """Its values are right (the padded rows add zeros); only the interpreter's address check sees the stray adds."""
    v = evaluate("16.flash-bwd", flash_bwd_dq_unmasked)
    if MODE.interpreted:
        assert v.status == "wrong" and "atomic_add needs a mask" in v.message, v.message


@pytest.mark.parametrize(("ex_id", "words"), [("16.matmul-k-loop", "mask"), ("16.flash-bwd", "atomically")])
def test_each_grader_names_its_typical_mistake_and_passes_the_reference(ex_id, words):
    ex = get_exercise(ex_id)
    ok, message = ex.grade(ex.wrong)
    assert not ok and words in message and message == ex.grade(ex.wrong)[1]
    assert ex.grade(ex.reference)[0]


def test_the_stub_is_not_attempted():
    assert evaluate("16.matmul-k-loop", matmul_stub).status == "not attempted"
