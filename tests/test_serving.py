"""labkit.serving: arrivals, the open-loop server, the batching replay and the KV-cache arithmetic (notebook 15)."""

from __future__ import annotations

import math
import random
import time

import pytest
import torch

from labkit import serving as S


def test_poisson_arrivals_have_the_rate_and_exponential_gaps():
    t = S.poisson_arrivals(500.0, 20000, seed=3)
    gaps = [b - a for a, b in zip([0.0, *t], t)]
    assert all(g > 0 for g in gaps)
    assert abs(sum(gaps) / len(gaps) - 1 / 500) < 0.03 / 500
    # exponential: P(gap > mean) = e^-1, and the gaps' coefficient of variation is 1
    assert abs(sum(g > 1 / 500 for g in gaps) / len(gaps) - math.exp(-1)) < 0.02
    assert S.poisson_arrivals(500.0, 10, seed=3) == t[:10]


def test_open_loop_queues_a_burst_and_the_closed_loop_clock_hides_it():
    def serve():
        time.sleep(0.004)
    run = S.open_loop(serve, [0.0] * 5)                        # five requests due at once
    for k, (due, sent) in enumerate(zip(run.from_due, run.from_send)):
        assert due >= 0.004 * (k + 1)                          # each waits for all the ones before it
        assert 0.004 <= sent < 0.004 * 1.9 + 0.05 or k == 0    # ... but its own service is one sleep
    assert run.from_due[-1] > 3 * run.from_send[-1]
    assert run.open_loop.n == run.closed_loop.n == 5


def test_open_loop_sends_on_schedule_when_the_server_is_idle():
    t0 = time.perf_counter()
    sends = []

    def serve():
        sends.append(time.perf_counter() - t0)
    run = S.open_loop(serve, [0.01, 0.03, 0.05])
    assert all(s >= due for s, due in zip(sends, [0.01, 0.03, 0.05]))
    assert all(d < 0.02 for d in run.from_due)                 # no queue: each is served as it arrives


def _lindley(arrivals, service):
    """Completion times of a single FIFO server: an independent formula for max_batch=1."""
    out, free = [], 0.0
    for a, s in zip(arrivals, service):
        free = max(free, a) + s
        out.append(free)
    return out


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_batch_of_one_is_a_fifo_queue(policy):
    rng = random.Random(1)
    arrivals = sorted(rng.uniform(0, 20) for _ in range(60))
    lengths = [rng.randint(1, 9) for _ in arrivals]
    run = S.simulate_batching(arrivals, lengths, {1: 0.25, 4: 0.4}, 1, policy)
    want = [c - a for c, a in zip(_lindley(arrivals, [n * 0.25 for n in lengths]), arrivals)]
    assert run.latency == pytest.approx(want)
    assert run.tokens == sum(lengths)


def test_static_and_continuous_on_a_hand_worked_case():
    # A (1 token) and B (3 tokens) at t=0, C (1 token) at t=0.5; 1 s per step, two slots.
    static = S.simulate_batching([0, 0, 0.5], [1, 3, 1], {1: 1.0, 2: 1.0}, 2, "static")
    cont = S.simulate_batching([0, 0, 0.5], [1, 3, 1], {1: 1.0, 2: 1.0}, 2, "continuous")
    assert static.latency == (1.0, 3.0, 3.5)     # C waits for B's whole batch
    assert cont.latency == (1.0, 3.0, 1.5)       # C takes A's slot after the first step
    assert static.ttft == (1.0, 1.0, 3.5) and cont.ttft == (1.0, 1.0, 1.5)
    assert static.makespan == 4.0 and cont.makespan == 3.0


def test_static_batching_pays_for_its_finished_slots():
    # one long and one short request: static steps cost batch 2 until the long one ends
    static = S.simulate_batching([0, 0], [4, 1], {1: 1.0, 2: 3.0}, 2, "static")
    cont = S.simulate_batching([0, 0], [4, 1], {1: 1.0, 2: 3.0}, 2, "continuous")
    assert static.makespan == 12.0 and cont.makespan == 3.0 + 3 * 1.0


def test_kv_bytes_per_token_matches_real_cache_tensors():
    layers, kv_heads, head_dim, tokens = 3, 2, 8, 5
    cache = [(torch.empty(kv_heads, tokens, head_dim, dtype=torch.float16),
              torch.empty(kv_heads, tokens, head_dim, dtype=torch.float16)) for _ in range(layers)]
    nbytes = sum(k.nbytes + v.nbytes for k, v in cache)
    assert S.kv_cache_bytes_per_token(layers, kv_heads, head_dim, 2) * tokens == nbytes
    assert S.kv_cache_bytes_per_token(32, 32, 128, 2) == 512 * 1024       # Llama-2 7B in fp16: 0.5 MiB per token
    assert S.kv_cache_bytes_per_token(80, 8, 128, 2) == 320 * 1024        # Llama-2 70B, grouped-query attention


def test_kv_capacity_counts_reservations_blocks_and_tokens():
    cap = S.kv_capacity(1000.0, 1.0, [10, 20, 30, 100, 200], max_len=200, block=16)
    assert cap == {"contiguous": 5, "paged": 5, "exact": 5}                # 5 x 200 = 1000 fits exactly
    cap = S.kv_capacity(100.0, 1.0, [10, 17, 30, 40], max_len=50, block=16)
    assert cap == {"contiguous": 2, "paged": 3, "exact": 4}      # 50+50 | 16+32+32=80, +48 > 100 | 10+17+30+40=97


@pytest.mark.parametrize("call, exc", [
    (lambda: S.poisson_arrivals(0, 5), ValueError),
    (lambda: S.poisson_arrivals("5", 5), TypeError),
    (lambda: S.poisson_arrivals(5, 2.5), TypeError),
    (lambda: S.open_loop("model", [0.0]), TypeError),
    (lambda: S.open_loop(lambda: None, [0.2, 0.1]), ValueError),
    (lambda: S.open_loop(lambda: None, []), ValueError),
    (lambda: S.simulate_batching([0], [1], {1: 1.0}, 1, "dynamic"), ValueError),
    (lambda: S.simulate_batching([0], [1], {2: 1.0}, 2, "static"), ValueError),
    (lambda: S.simulate_batching([0], [0], {1: 1.0}, 1, "static"), ValueError),
    (lambda: S.simulate_batching([0, 1], [1], {1: 1.0}, 1, "static"), ValueError),
    (lambda: S.kv_cache_bytes_per_token(32, 32, 128, 0), ValueError),
    (lambda: S.kv_capacity(100.0, 1.0, [60], max_len=50), ValueError),
])
def test_bad_input_is_refused_clearly(call, exc):
    with pytest.raises(exc):
        call()


def test_kv_capacity_does_not_lose_a_request_to_float_rounding():
    assert S.kv_capacity(0.3, 0.1, [1, 1, 1], max_len=1, block=1)["exact"] == 3
