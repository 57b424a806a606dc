"""Serving under load: open-loop arrivals, coordinated omission, static vs continuous batching, KV-cache arithmetic.

- :func:`poisson_arrivals` draws a request schedule at a set rate; :func:`open_loop` serves it on a real callable,
  one request at a time in arrival order (a single first-in, first-out server), and records each latency twice:
  from the time the request was due (what its user waited) and from the time it was actually sent (what a
  closed-loop client, which waits for each reply before sending the next, records: *coordinated omission*).
- :func:`simulate_batching` replays one set of generation requests through a static or a continuous batcher in
  virtual time, each decode step costing what the real model was measured to take at that batch size.
- :func:`kv_cache_bytes_per_token` and :func:`kv_capacity` are the memory arithmetic of a KV cache, contiguous
  (reserved for the longest sequence) or paged (blocks of a few tokens, as vLLM's PagedAttention).

Introduced in notebook 15.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from labkit._validate import safe_repr
from labkit.inference import LatencyStats

__all__ = [
    "BatchingRun",
    "LoadRun",
    "kv_cache_bytes_per_token",
    "kv_capacity",
    "open_loop",
    "poisson_arrivals",
    "simulate_batching",
    "stall_once",
]

_MAX_REQUESTS = 1_000_000


def _positive(name: str, value: object, *, integer: bool = False) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise TypeError(f"{name} must be a positive {'int' if integer else 'number'}, got {safe_repr(value)}")
    if not (math.isfinite(value) and value > 0):  # type: ignore[arg-type]
        raise ValueError(f"{name} must be a positive finite {'int' if integer else 'number'}, got {value!r}")
    return value  # type: ignore[return-value]


def _times(name: str, values: object) -> list[float]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list of seconds, got {type(values).__name__}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must hold finite times >= 0 in seconds, got {safe_repr(v)}")
        out.append(float(v))
    if not out:
        raise ValueError(f"{name} is empty")
    if any(b < a for a, b in zip(out, out[1:])):
        raise ValueError(f"{name} must be in increasing order (a schedule of arrivals)")
    return out


def poisson_arrivals(rate: float, n: int, seed: int = 0) -> list[float]:
    """Return ``n`` arrival times in seconds from 0: a Poisson process at ``rate`` requests per second.

    The gaps between arrivals are independent and exponential with mean ``1 / rate``: users who do not wait
    for each other. Introduced in notebook 15.
    """
    _positive("rate", rate)
    _positive("n", n, integer=True)
    if n > _MAX_REQUESTS:
        raise ValueError(f"n must be at most {_MAX_REQUESTS:,}, got {n:,}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


@dataclass(frozen=True)
class LoadRun:
    """One :func:`open_loop` run: each request's latency from when it was due and from when it was sent.

    Introduced in notebook 15.
    """

    #: Latency from the request's scheduled arrival to its reply: what its user waited (queueing + service).
    from_due: tuple[float, ...]
    #: Latency from the moment the request was actually sent to its reply: what a closed-loop client records.
    from_send: tuple[float, ...]
    #: Seconds from the schedule's time 0 to the last reply.
    duration: float
    #: The schedule's rate as the run saw it: requests / the last arrival time (inf for a single arrival at 0).
    rate: float

    @property
    def open_loop(self) -> LatencyStats:
        """Percentiles of :attr:`from_due` (``n`` beside them)."""
        return LatencyStats.of(self.from_due)

    @property
    def closed_loop(self) -> LatencyStats:
        """Percentiles of :attr:`from_send`: the same run, measured the coordinated-omission way."""
        return LatencyStats.of(self.from_send)

    @property
    def throughput(self) -> float:
        """Requests served per second over the run."""
        return len(self.from_due) / self.duration


def _wait_until(deadline: float) -> None:
    """Sleep until ``deadline`` (a ``time.perf_counter`` value), spinning the last 0.2 ms: ``time.sleep`` overshoots
    by tens of microseconds, as much as a small model's forward pass."""
    while (left := deadline - time.perf_counter()) > 2e-4:
        time.sleep(left - 2e-4)
    while time.perf_counter() < deadline:
        pass


def open_loop(serve: Callable[[], object], arrivals: Sequence[float]) -> LoadRun:
    """Serve one request per arrival, in order, on one server; return each request's two latencies.

    A request is sent when it is due, or, when the server is still busy with earlier ones, as soon as it is free:
    exactly a first-in, first-out queue in front of one server. ``serve()`` handles one request (e.g. one forward
    pass). Introduced in notebook 15.
    """
    if not callable(serve):
        raise TypeError(f"serve must be a callable that handles one request, got {type(serve).__name__}")
    due = _times("arrivals", arrivals)
    from_due, from_send = [], []
    start = time.perf_counter()
    for t in due:
        _wait_until(start + t)          # the request is due: send it, unless the server is still busy
        sent = time.perf_counter()
        serve()
        done = time.perf_counter()
        from_due.append(done - (start + t))   # its user waited since it was due: queueing + service
        from_send.append(done - sent)         # a closed-loop client starts its clock only when it sends
    return LoadRun(tuple(from_due), tuple(from_send), time.perf_counter() - start,
                   len(due) / due[-1] if due[-1] > 0 else math.inf)


def stall_once(serve: Callable[[], object], at: int, seconds: float) -> Callable[[], object]:
    """Wrap ``serve`` so that its ``at``-th call (counting from 1) first pauses ``seconds``: a server's hiccup (a
    garbage collection, a checkpoint, a noisy neighbour) injected once. Introduced in notebook 15."""
    if not callable(serve):
        raise TypeError(f"serve must be a callable, got {type(serve).__name__}")
    _positive("at", at, integer=True)
    _positive("seconds", seconds)
    calls = 0

    def stalling() -> object:
        nonlocal calls
        calls += 1
        if calls == at:
            time.sleep(seconds)
        return serve()
    return stalling


@dataclass(frozen=True)
class BatchingRun:
    """One :func:`simulate_batching` replay: per-request latency and time to first token, in virtual seconds.

    Introduced in notebook 15.
    """

    policy: str
    latency: tuple[float, ...]
    ttft: tuple[float, ...]
    #: Virtual seconds from the first arrival to the last completion.
    makespan: float
    tokens: int
    #: Mean number of requests in a decode step (the batch's occupancy).
    mean_batch: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.makespan


def _step_cost(step_s: Mapping[int, float], max_batch: int) -> Callable[[int], float]:
    if not isinstance(step_s, Mapping) or not step_s:
        raise TypeError("step_s must be a non-empty {batch size: seconds per step} mapping")
    pts = sorted((int(_positive("a batch size in step_s", b, integer=True)), float(_positive("a step time", s)))
                 for b, s in step_s.items())
    if pts[0][0] != 1 or pts[-1][0] < max_batch:
        raise ValueError(f"step_s must hold batch 1 and a batch >= max_batch ({max_batch}); it holds "
                         f"{[b for b, _ in pts]}")

    def cost(b: int) -> float:  # linear between the measured batch sizes
        for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
            if b0 <= b <= b1:
                return s0 + (s1 - s0) * (b - b0) / (b1 - b0)
        return pts[0][1]
    return cost


def _check_replay(arrivals: object, lengths: object, step_s: object, max_batch: object,
                  policy: object) -> tuple[list[float], list[int], Callable[[int], float]]:
    if policy not in ("static", "continuous"):
        raise ValueError(f"policy must be 'static' or 'continuous', got {safe_repr(policy)}")
    due = _times("arrivals", arrivals)
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
        raise TypeError("lengths must be a list of output lengths, one per arrival")
    if len(lengths) != len(due):
        raise ValueError(f"lengths has {len(lengths)} entries for {len(due)} arrivals: one per arrival")
    need = [int(_positive("an output length", n, integer=True)) for n in lengths]
    _positive("max_batch", max_batch, integer=True)
    return due, need, _step_cost(step_s, max_batch)  # type: ignore[arg-type]


def simulate_batching(arrivals: Sequence[float], lengths: Sequence[int], step_s: Mapping[int, float],
                      max_batch: int, policy: str) -> BatchingRun:
    """Replay generation requests through one batcher in virtual time; return their latencies.

    Request ``i`` arrives at ``arrivals[i]`` and needs ``lengths[i]`` decode steps (one output token each). A step
    runs every request in the batch once and costs ``step_s[b]`` seconds for ``b`` requests (linear between the
    batch sizes given). ``policy="static"``: when idle, the server takes up to ``max_batch`` waiting requests and
    runs them until the *longest* finishes; finished ones keep their slot (padding, still computed) and newcomers
    wait for the whole batch. ``policy="continuous"``: after every step, finished requests leave and waiting ones
    take their slots. Introduced in notebook 15.
    """
    due, left, cost = _check_replay(arrivals, lengths, step_s, max_batch, policy)
    need = list(left)
    done_at, first_at = [0.0] * len(due), [0.0] * len(due)
    now, nxt, batch, steps, busy = 0.0, 0, [], 0, 0
    while nxt < len(due) or batch:
        if policy == "continuous" or not any(left[i] for i in batch):    # static: only when all are done
            batch = [i for i in batch if left[i]]                        # finished requests leave
            if not batch and due[nxt] > now:
                now = due[nxt]                                           # idle: wait for the next arrival
            while nxt < len(due) and due[nxt] <= now and len(batch) < max_batch:
                batch.append(nxt)                                        # waiting requests take free slots
                nxt += 1
        active = [i for i in batch if left[i]]
        now += cost(len(batch))            # one step; static still computes its finished slots (padding)
        steps, busy = steps + 1, busy + len(active)
        for i in active:
            left[i] -= 1
            if left[i] == need[i] - 1:
                first_at[i] = now          # the request's first token
            if left[i] == 0:
                done_at[i] = now
        if not any(left[i] for i in batch):
            batch = []
    return BatchingRun(policy, tuple(d - a for d, a in zip(done_at, due)),
                       tuple(f - a for f, a in zip(first_at, due)), now - due[0], sum(need), busy / steps)


def kv_cache_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_value: float) -> float:
    """Bytes of KV cache one token occupies: a key and a value vector per layer and KV head.

    2 x layers x kv_heads x head_dim x bytes_per_value (2 for fp16/bf16, 1 for an fp8 cache). Models with
    grouped-query attention have fewer KV heads than query heads. Introduced in notebook 15.
    """
    for name, v in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        _positive(name, v, integer=True)
    _positive("bytes_per_value", bytes_per_value)
    return 2 * layers * kv_heads * head_dim * bytes_per_value


def kv_capacity(budget_bytes: float, per_token: float, lengths: Sequence[int], max_len: int,
                block: int = 16) -> dict[str, int]:
    """How many of the requests ``lengths`` (tokens each, in order) fit in ``budget_bytes`` of KV cache.

    ``contiguous``: each request reserves ``max_len`` tokens up front (the longest it may grow to).
    ``paged``: each holds ceil(length / block) blocks of ``block`` tokens, allocated as it grows.
    ``exact``: each holds exactly its tokens (the bound no allocator beats). Introduced in notebook 15.
    """
    _positive("budget_bytes", budget_bytes)
    _positive("per_token", per_token)
    _positive("max_len", max_len, integer=True)
    _positive("block", block, integer=True)
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
        raise TypeError("lengths must be a list of token counts")
    toks = [int(_positive("a request length", n, integer=True)) for n in lengths]
    if any(n > max_len for n in toks):
        raise ValueError(f"a request is longer than max_len={max_len}")

    def fit(tokens_of: Callable[[int], int]) -> int:
        used, count = 0, 0                    # whole tokens: a float sum of bytes would drift below the budget
        for n in toks:
            used += tokens_of(n)
            if used * per_token > budget_bytes * (1 + 1e-12):
                break
            count += 1
        return count
    return {"contiguous": fit(lambda n: max_len), "paged": fit(lambda n: -(-n // block) * block),
            "exact": fit(lambda n: n)}
