# %% [markdown]
# # 15 · Serving: latency, load and batching
#
# **Objectives**
# - measure inference as a service sees it: latency percentiles with their sample counts, throughput against batch
#   size, time to first token;
# - drive a model with open-loop (Poisson) arrivals, find the load where queueing takes over, and see how a
#   closed-loop client's measurement hides the tail (coordinated omission);
# - compare static and continuous batching on the same arrivals;
# - place prefill and decode on the roofline, and say why weight-only INT8/INT4 speeds up decode but not prefill;
# - work out a KV cache's memory, contiguous and paged;
# - quantize a model to INT8 and measure its accuracy and its speed, with a verdict the noise cannot fake.
#
# **Prerequisites:** notebook 04 (the tiny GPT), 07 (profiling, the roofline).
#
# **Estimated time:** 50 min
#
# Everything here runs on any CPU: the server is one CPU thread and the model the tiny GPT, so the times differ from
# machine to machine and the tests compare only what holds everywhere. What the same ideas look like on a GPU is said
# where it differs.

# %%
# %matplotlib inline
import inspect
import math
import random
import statistics
import warnings

import matplotlib.pyplot as plt
import torch

from labkit import bench, data, models, train
from labkit import inference as I
from labkit import serving as S
from labkit.check import check

torch.set_num_threads(1)  # one server worker; steadier timings on a shared machine

# %% [markdown]
# ## 1. A model to serve, and the numbers that judge it
#
# Each kind of work asks for different resources and is judged by different numbers:
#
# | workload | what it is like | resources that matter first | metrics |
# |---|---|---|---|
# | pre-training | huge data, weeks, constant communication | many GPUs and nodes, GPU memory, network, checkpoint storage | tokens/s, scaling efficiency, time to recover from a failure |
# | fine-tuning | smaller, many experiments | one to a few GPUs, GPU memory, data loading | step time, convergence, experiments per day |
# | inference (serving) | steady traffic, users waiting | GPU memory, batching, concurrency, CPU and network | throughput, time to first token, P95/P99 latency |
# | embeddings and retrieval | heavy preprocessing and index building | CPU, RAM, storage throughput and capacity | index build time, query latency, queries per second |
# | scientific AI | simulation, data processing and models mixed | CPU and GPU together, I/O, inter-node traffic | time per sample, end-to-end time, error against ground truth |
#
# **Run here.** A service is judged by its **latency distribution**, not its mean: P50 (the median) is the typical
# request, P99 the one in a hundred that users complain about. **Throughput** is requests (or tokens) per second.
# Batching requests together raises throughput, because one call does more work for the same fixed overhead, and
# raises latency, because every request in a batch waits for the whole batch. Every measurement here runs on the CPU,
# even on a GPU node (dynamic INT8, section 8, is a CPU path in PyTorch), one thread: a server's worker. First a model
# worth serving: the tiny GPT of notebook 04, trained on the reverse task, and a held-out test set it has never seen.

# %%
task = data.make_token_task("reverse", n=4096, n_digits=6, vocab_size=12, seed=0)
test = data.make_token_task("reverse", n=512, n_digits=6, vocab_size=12, seed=1)  # independent data
run = train.train(models.TinyGPT(vocab_size=12, seq_len=task.seq_len, seed=0),
                  data.Batches(task.inputs, task.targets, batch_size=32, seed=0),
                  policy="fp32", steps=100, lr=3e-3, device="cpu", progress=False)  # on the CPU, on any machine
model = run.model.eval()
with torch.inference_mode():
    acc_fp32 = test.answer_accuracy(model(test.inputs), test.targets)
print("held-out answer accuracy above 95 %:", acc_fp32 > 0.95)
assert acc_fp32 > 0.95

# %% [markdown]
# ## 2. Latency percentiles and batch size
#
# Now time its forward pass at batch sizes 1 to 256 (interleaved, 200 rounds, in one run). A percentile needs its
# sample count beside it: by nearest rank, the P99 of 30 samples is simply the slowest one, and of 200 the third
# slowest; a service's P99 comes from thousands of requests. Throughput is the batch over the *mean* time per batch,
# what a server sustains with batches back to back (the slow batches cost it too; the wait for a batch to fill,
# which a real server adds, is not in it):

# %%
# NBVAL_IGNORE_OUTPUT
points = I.batch_sweep(model, test.inputs, [1, 4, 16, 64, 256], repeats=200)
n = points[0].latency.n
print(f"{'batch':>6} {'P50 ms':>8} {f'P99 (n={n})':>12} {'requests/s':>11}")
for p in points:
    print(f"{p.batch:>6} {p.latency.p50 * 1e3:8.2f} {p.latency.p99 * 1e3:12.2f} {p.throughput:11,.0f}")
print(f"P99 of {n} samples by nearest rank: the {math.ceil(0.99 * n)}th fastest, {n - math.ceil(0.99 * n)} slower above it")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot([p.throughput for p in points], [p.latency.p50 * 1e3 for p in points], "o-", label="P50")
ax.plot([p.throughput for p in points], [p.latency.p99 * 1e3 for p in points], "s--", label="P99")
for p in points:
    ax.annotate(f"batch {p.batch}", (p.throughput, p.latency.p50 * 1e3), fontsize=8)
ax.set(xlabel="throughput (requests/s)", ylabel="latency (ms)", yscale="log", title="Batching: throughput for latency")
ax.legend(); plt.show()

# %%
by = {p.batch: p for p in points}
assert by[64].throughput > 2 * by[1].throughput       # batching amortises the fixed cost per call
assert by[256].latency.p50 > by[1].latency.p50         # ... and every request waits for its whole batch
print("batch 64 serves more than twice the requests per second of batch 1; at batch 256 the median request waits "
      "longer than at batch 1")

# %% [markdown]
# **15.p99.** Write `p99(latencies)`: the 99th percentile by nearest rank, the latency that 99 % of the requests do
# not exceed (always one of the observed values). The check runs it on fresh lists.

# %%
def p99(latencies):
    ...
    ### BEGIN SOLUTION
    s = sorted(latencies)
    return s[-(-99 * len(s) // 100) - 1]
    ### END SOLUTION


check("15.p99", p99)

# %% [markdown]
# A real server picks the largest batch that keeps P99 under the service's latency target, and batches dynamically:
# it waits a few milliseconds for more requests to arrive, never longer than the target allows. These requests came
# back to back, as fast as the server took them; real users arrive when they like, which section 3 measures.
#
# ### Time to first token
#
# A language model answers token by token. The **time to first token** (TTFT) covers reading the whole prompt (the
# *prefill*) and producing one token; every later token takes one *decode* step. Real servers keep each layer's
# keys and values of the tokens so far (the **KV cache**), so a decode step processes one new token, which makes
# decode cheap per step but bound by memory bandwidth. The tiny GPT has no KV cache: every step re-reads the whole
# sequence (7 tokens for the first output token, up to 12 for the last), yet at this size the fixed cost of a call
# outweighs those few tokens, so the times per token are close; the cell prints how they compare. One warm-up
# generation first, so that the first token is not charged with one-off start-up costs, then 21 timed generations,
# of which the medians are printed:

# %%
# NBVAL_IGNORE_OUTPUT
prompt = test.inputs[:1, : task.n_digits + 1]            # six digits and the separator
I.greedy_generate(model, prompt, task.n_digits)           # warm-up
gens = [I.timed_generate(model, prompt, task.n_digits) for _ in range(21)]
gen = gens[0]
ttft = statistics.median(g.ttft for g in gens)
tpot = statistics.median(g.time_per_output_token for g in gens)
print("prompt", prompt[0].tolist(), "-> answer", gen.tokens[0].tolist())
print(f"medians of {len(gens)} generations: TTFT {ttft * 1e3:.2f} ms, then {tpot * 1e3:.2f} ms per output token: "
      f"a later token took {tpot / ttft:.0%} of the first token's time")
assert gen.tokens[0].tolist() == prompt[0, : task.n_digits].flip(0).tolist()   # the reversed digits


# %% [markdown]
# ## 3. Load: open-loop arrivals and the knee
#
# Section 2 sent requests back to back. Real users do not wait for each other: they arrive at random moments, at
# some average **rate** λ. A load generator that sends each request at its own scheduled time, whether or not the
# earlier ones have been answered, is **open-loop**; arrivals with independent, exponential gaps are a *Poisson*
# process, the standard model of many independent users. With one server that takes E[S] seconds per request, the
# **offered load** is ρ = λ · E[S], the fraction of the time it must be busy. Queueing theory (the M/G/1 queue) says
# that the mean wait grows like ρ / (1 − ρ): slowly at first, then without bound as ρ approaches 1. That bend is the
# **knee**; a service is run well below it.
#
# The whole generator, as it runs. One server takes requests in arrival order, so a request due while the server is
# busy is sent the moment the server is free: a first-in, first-out queue. Every request is timed twice, from when it
# was *due* and from when it was *sent*:

# %%
print(inspect.getsource(S.open_loop))

# %% [markdown]
# The server's work is one forward pass at batch 1. Its service time, timed back to back, sets the rates for four
# offered loads; each point serves 1000 Poisson arrivals, and the *busy* column says what fraction of the run the
# server really worked (a request served after an idle gap can take longer than one served back to back). A run this short is
# shorter than a queue near ρ = 1 needs to settle, so its P99 at the highest load understates the steady state:

# %%
# NBVAL_IGNORE_OUTPUT
x1 = test.inputs[:1]


def serve():
    with torch.inference_mode():
        model(x1)


mean_s = bench.time_fn(serve, warmup=20, repeats=300, device="cpu").median   # robust to a burst of interference
runs = {rho: S.open_loop(serve, S.poisson_arrivals(rho / mean_s, 1000, seed=1)) for rho in (0.5, 0.7, 0.85, 0.95)}
print(f"mean service time {mean_s * 1e3:.3f} ms; n = {runs[0.5].open_loop.n} requests per load")
print(f"{'load':>5} {'busy':>5} {'rate/s':>7} {'P50 ms':>7} {'P99 ms':>7} {'closed-loop P99 ms':>19}")
for rho, r in runs.items():
    busy = r.throughput * statistics.mean(r.from_send)   # the fraction of the run the server really worked
    print(f"{rho:5.0%} {busy:5.0%} {rho / mean_s:7.0f} {r.open_loop.p50 * 1e3:7.2f} {r.open_loop.p99 * 1e3:7.2f} "
          f"{r.closed_loop.p99 * 1e3:19.2f}")

# %%
# NBVAL_IGNORE_OUTPUT
lo, hi = runs[0.5], runs[0.95]
print(f"from 50 % to 95 % load the latency users saw grew {hi.open_loop.p50 / lo.open_loop.p50:.1f}x at the median "
      f"and {hi.open_loop.p99 / lo.open_loop.p99:.1f}x at P99 (n={hi.open_loop.n}); the closed-loop clock's P99 of the "
      f"same requests changed {hi.closed_loop.p99 / lo.closed_loop.p99:.1f}x")
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(list(runs), [r.open_loop.p99 * 1e3 for r in runs.values()], "s-", label="P99, from due (open loop)")
ax.plot(list(runs), [r.open_loop.p50 * 1e3 for r in runs.values()], "o-", label="P50, from due")
ax.plot(list(runs), [r.closed_loop.p99 * 1e3 for r in runs.values()], "x--", label="P99, from send (closed loop)")
ax.set(xlabel="offered load ρ", ylabel="latency (ms)", yscale="log", title="Queueing takes over near ρ = 1")
ax.legend(); plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
wait = {rho: statistics.mean(d - s for d, s in zip(r.from_due, r.from_send)) for rho, r in runs.items()}
assert hi.open_loop.p99 > 2 * hi.closed_loop.p99   # the send-time clock does not see the wait in the queue
print(f"mean wait in the queue: {wait[0.5] * 1e3:.2f} ms at 50 % load, {wait[0.95] * 1e3:.2f} ms at 95 %")

# %% [markdown]
# ## 4. Coordinated omission: the tail a closed-loop client hides
#
# The "from send" column is what a **closed-loop** client records: it sends a request, waits for the reply, and only
# then sends the next, starting its clock at the send. When the server stalls, such a client stops sending, so the
# requests that real users would have sent during the stall are never made, and never measured: the client has
# *coordinated* with the server to *omit* the bad samples. Gil Tene named this **coordinated omission**; `wrk2` and
# other open-loop tools measure from the intended send time instead. The same server as above, offered half of what it can serve (`0.5 / mean_s`), with one stall injected by
# `S.stall_once` (a garbage collection, a checkpoint, a noisy neighbour: `seconds=0.3`) at request 1000 of 2000:

# %%
# NBVAL_IGNORE_OUTPUT
stalled = S.open_loop(S.stall_once(serve, at=1000, seconds=0.3), S.poisson_arrivals(0.5 / mean_s, 2000, seed=2))
slow_due = sum(t > 0.15 for t in stalled.from_due)
slow_send = sum(t > 0.15 for t in stalled.from_send)
for name, st, slow in (("from due (users)", stalled.open_loop, slow_due),
                       ("from send (closed loop)", stalled.closed_loop, slow_send)):
    print(f"{name:<24} P50 {st.p50 * 1e3:6.2f} ms  P99 (n={st.n}) {st.p99 * 1e3:7.2f} ms  "
          f"max {st.max * 1e3:6.1f} ms  requests over 150 ms: {slow}")
assert slow_due >= 10 * slow_send and stalled.open_loop.p99 > 2 * stalled.closed_loop.p99
print(f"the stall delayed {slow_due} requests by over 150 ms; the closed-loop clock counted {slow_send}")

# %% [markdown]
# Both rows come from the *same* requests. A benchmark that reports the second row under-reports the tail by the
# factor printed above, and the error grows with the load and the length of the stall. When a latency claim comes
# from a closed-loop tool, ask how it was measured.
#
# ## 5. Static and continuous batching
#
# A language model's request needs many decode steps, one output token each, and requests want different numbers of
# tokens. **Static batching** takes a batch of waiting requests and runs it until its *longest* request is done:
# finished requests keep their slots (computed as padding), and new arrivals wait for the whole batch.
# **Continuous batching** (Orca's iteration-level scheduling, used by vLLM, TGI, TensorRT-LLM) decides after every
# step: finished requests leave and waiting ones take their slots.
#
# The replay below runs in virtual time: one step of b requests costs what the tiny GPT's forward pass at batch b
# was measured to take in section 2 (linear between the measured batch sizes). The same 2000 Poisson arrivals, with
# output lengths from 1 to 64 tokens (mean about 16), go through both policies with up to 16 requests per step, at two
# loads relative to what continuous batching can serve at full batches:

# %%
print(inspect.getsource(S.simulate_batching))

# %%
# NBVAL_IGNORE_OUTPUT
step_s = {b: by[b].latency.mean for b in (1, 4, 16)}   # a sustained rate: the mean
rng = random.Random(0)
lengths = [min(64, 1 + int(rng.expovariate(1 / 16))) for _ in range(2000)]
capacity = 16 / step_s[16] / statistics.mean(lengths)        # requests/s at full batches of 16
replays = {(load, policy): S.simulate_batching(S.poisson_arrivals(load * capacity, 2000, seed=3), lengths, step_s, 16, policy)
           for load in (0.25, 0.6) for policy in ("static", "continuous")}
print(f"{'load':>5} {'policy':>11} {'TTFT P50 ms':>12} {'latency P50 ms':>15} {'P99 (n=2000)':>13} {'tokens/s':>9} {'busy slots':>11}")
for (load, policy), r in replays.items():
    lat, ttft = I.LatencyStats.of(r.latency), I.LatencyStats.of(r.ttft)
    print(f"{load:5.0%} {policy:>11} {ttft.p50 * 1e3:12.1f} {lat.p50 * 1e3:15.1f} {lat.p99 * 1e3:13.1f} "
          f"{r.tokens_per_s:9.0f} {r.mean_batch:11.1f}")

# %%
# NBVAL_IGNORE_OUTPUT
for load in (0.25, 0.6):
    st, co = replays[load, "static"], replays[load, "continuous"]
    assert statistics.median(co.ttft) < statistics.median(st.ttft)
    behind = st.tokens_per_s < 0.95 * co.tokens_per_s   # the same tokens took static batching longer
    print(f"load {load:.0%}: continuous batching's median time to first token is "
          f"{statistics.median(st.ttft) / statistics.median(co.ttft):.0f}x shorter than static batching's"
          + ("; static batching could not keep up, its queue grew to the end of the run" if behind else ""))

# %% [markdown]
# Static batching loses twice: a newcomer waits for the longest request of the batch in front of it, and the slots of
# finished requests do no useful work, so it saturates at a lower load. Continuous batching keeps the slots busy,
# which is also why it needs a KV cache that can grow and shrink per request (section 7).
#
# ## 6. Prefill and decode on the roofline
#
# Serving a language model has two phases. **Prefill** reads the prompt: all its tokens go through every layer at
# once, so each weight matrix is multiplied by a tall matrix of T tokens. **Decode** makes one token per request per
# step: each weight is read from memory to be used for one row per request in the batch. A matmul of T tokens with a
# d × d weight does 2·T·d² FLOPs and reads d² weights; its arithmetic intensity is about 2T / (bytes per weight)
# FLOPs per byte (notebook 07's roofline). Prefill has T in the thousands: compute-bound. Decode has T = the batch,
# often 1 to 64: memory-bound. On this CPU, one 4096 × 4096 layer at 1 token and at 128 tokens:

# %%
# NBVAL_IGNORE_OUTPUT
d = 4096
layer = torch.nn.Linear(d, d, bias=False)
xs = {"1 token": torch.randn(1, d), "128 tokens": torch.randn(128, d)}
with torch.inference_mode():
    cmp_pd = bench.compare({name: (lambda x=x: layer(x)) for name, x in xs.items()}, repeats=7, device="cpu")
rate = {len(x): 2 * len(x) * d * d / cmp_pd.timings[name].median for name, x in xs.items()}
for t, r in rate.items():
    print(f"{t:>4} tokens: {r / 1e9:6.1f} GFLOP/s, {d * d * 4 * r / (2 * t * d * d) / 1e9:6.1f} GB/s of fp32 weights read")
print(f"128 tokens per weight read did {rate[128] / rate[1]:.0f}x the FLOPs per second of 1 token")
assert rate[128] > 4 * rate[1]

# %% [markdown]
# The same arithmetic for a 7B model on one H100 (datasheet: 989 TFLOP/s dense bf16, 3.35 TB/s), counting only the
# weights: a step takes at least the longer of its compute time and its weight-reading time. **Weight-only**
# quantization (INT8 as in W8A16, INT4 as in GPTQ or AWQ) stores the weights in fewer bytes and converts them to bf16
# inside the kernel, so it divides the bytes and leaves the FLOPs as they were:

# %%
PEAK, BW, PARAMS = 989e12, 3.35e12, 7e9
for phase, tokens in (("decode, batch 1", 1), ("prefill, 2048 tokens", 2048)):
    for fmt, wbytes in (("bf16", 2), ("int8", 1), ("int4", 0.5)):
        compute, read = 2 * PARAMS * tokens / PEAK, PARAMS * wbytes / BW
        print(f"{phase:<21} {fmt:<5} compute {compute * 1e3:7.2f} ms, weights {read * 1e3:5.2f} ms -> "
              f"{max(compute, read) * 1e3:6.2f} ms, {'memory' if read > compute else 'compute'}-bound")

# %% [markdown]
# Decode at batch 1 moves 14 GB of bf16 weights to do 14 GFLOP: halving the bytes halves the step. Prefill does 2048
# times the FLOPs for the same bytes: it was compute-bound already, and INT8 weights leave its time where it was
# (full INT8 compute, weights *and* activations in int8 on INT8 tensor cores, is what speeds prefill up). Batching
# decode requests raises the intensity the same way prefill does, which is why servers batch decode steps.
#
# ## 7. The KV cache and paged allocation
#
# Attention at step t needs the keys and values of all earlier tokens. A server keeps them, per request, in the
# **KV cache**: for every token, a key and a value vector in every layer for every KV head, so
# bytes per token = 2 × layers × KV heads × head dim × bytes per value. The formula, checked against the tensors a
# cache for a 3-layer, 2-head, 8-wide model holding 5 tokens in fp16 would allocate:

# %%
cache = [(torch.empty(2, 5, 8, dtype=torch.float16), torch.empty(2, 5, 8, dtype=torch.float16)) for _ in range(3)]
allocated = sum(k.nbytes + v.nbytes for k, v in cache)
print(f"allocated {allocated} B for 5 tokens; formula {S.kv_cache_bytes_per_token(3, 2, 8, 2):g} B per token")
assert allocated == 5 * S.kv_cache_bytes_per_token(3, 2, 8, 2)

# %% [markdown]
# For Llama-2 7B (32 layers, 32 KV heads of 128, fp16) that is 0.5 MiB per token, 2 GiB for one 4096-token sequence:
# the cache, not the weights, limits how many requests a GPU serves at once. Reserving the maximum length for every
# request wastes most of it, since most requests are far shorter. **Paged** allocation (vLLM's PagedAttention) gives a
# request fixed-size blocks of, say, 16 tokens as it grows, like pages of virtual memory, so it wastes less than one
# block per request. How many requests fit in 60 GB of cache (an 80 GB H100 less the 13.5 GB of weights and working
# memory), for 2000 requests of 64 + exponential(600) tokens, at most 4096:

# %%
per_token = S.kv_cache_bytes_per_token(32, 32, 128, 2)
rng = random.Random(1)
sizes = [min(4096, 64 + int(rng.expovariate(1 / 600))) for _ in range(2000)]
fits = S.kv_capacity(60e9, per_token, sizes, max_len=4096, block=16)
print(f"{per_token / 2**20:.2f} MiB per token; requests that fit: {fits}")
print(f"paged serves {fits['paged'] / fits['contiguous']:.1f}x as many requests at once as reserving 4096 tokens each")

# %% [markdown]
# ## 8. INT8 quantization: speed and accuracy, measured
#
# **Run here.** INT8 inference stores weights as 8-bit integers with a scale, and multiplies int8 by int8 into
# int32, exactly. *Dynamic* quantization computes the activations' scales at run time, so it needs no calibration
# data. In torch 2.13 the eager API for it, `torch.ao.quantization.quantize_dynamic`, still works but is deprecated
# (its warning announces its removal); the successor is the separate `torchao` package (`quantize_(model,
# Int8DynamicActivationInt8WeightConfig())`). Here it is written out, one scale per output channel for the weights
# and one per token for the activations. Note the branch in `forward`: the integer matmul `torch._int_mm` is used only
# where a probe found it exact. Under an AVX2 cap, and on CPUs without VNNI instructions, torch 2.13's CPU kernel
# returned products that were off by tens of thousands (its 16-bit intermediate sums saturate), so integer kernels
# need checking on each CPU class like everything else:

# %%
print(inspect.getsource(I.Int8Linear))

# %%
q_model = I.quantize_int8(model)
with torch.inference_mode():
    logits, q_logits = model(test.inputs), q_model(test.inputs)
acc_int8 = test.answer_accuracy(q_logits, test.targets)
rel_err = ((q_logits - logits).norm() / logits.norm()).item()
print(f"weights and buffers: {I.weight_bytes(model):,} B in fp32, {I.weight_bytes(q_model):,} B with int8 Linears")
print("accuracy within 1 point of fp32:", abs(acc_int8 - acc_fp32) <= 0.01, "| logits within 5 %:", rel_err < 0.05)
assert I.weight_bytes(q_model) < 0.3 * I.weight_bytes(model) and abs(acc_int8 - acc_fp32) <= 0.01 and rel_err < 0.05

# %% [markdown]
# The deprecated eager API, for comparison (its own scheme: one scale for the whole weight, unsigned activations):

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ao_model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
print("torch warns:", str(caught[0].message).splitlines()[0].strip() if caught else "nothing")
with torch.inference_mode():
    acc_ao = test.answer_accuracy(ao_model(test.inputs), test.targets)
print("torch.ao accuracy within 1 point of fp32:", abs(acc_ao - acc_fp32) <= 0.01)
assert abs(acc_ao - acc_fp32) <= 0.01

# %% [markdown]
# Speed is the other half. The tiny GPT's matrices (96 wide) are too small for INT8 to pay; a 512 → 2048 → 512 MLP on
# a batch of 64 shows what the CPU's integer units can do. First, which integer matmul labkit's INT8 uses here:

# %%
# NBVAL_IGNORE_OUTPUT
mlp = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).eval()
xb = torch.randn(64, 512)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    mlp_ao = torch.ao.quantization.quantize_dynamic(mlp, {torch.nn.Linear}, dtype=torch.qint8)
mlp_int8 = I.quantize_int8(mlp)
print("labkit's INT8 multiplies with", "torch._int_mm (exact on this CPU)" if I.int8_matmul_exact()
      else "its float64 fallback (torch._int_mm was not exact on this CPU)")

# %% [markdown]
# One timing of a few repeats can mislead: a busy neighbour or a frequency change moves the ratio by tens of percent.
# Each round times every candidate once, moments apart, so one round's ratio shares its conditions. The cell adds
# rounds until the middle half of the rounds' ratios (the interquartile range) lies on one side of 1 or is narrow, and
# otherwise calls the result inconclusive:

# %%
# NBVAL_IGNORE_OUTPUT
with torch.inference_mode():
    for rounds in (15, 45, 135):
        cmp = bench.compare({"fp32": lambda: mlp(xb), "int8 labkit": lambda: mlp_int8(xb),
                             "int8 torch.ao": lambda: mlp_ao(xb)}, repeats=rounds, device="cpu")
        lo, mid, hi = cmp.speedup_quartiles("int8 labkit")
        if lo > 1 or hi < 1 or hi / lo < 1.2:
            break
print(cmp.table(f"512 -> 2048 -> 512 MLP, batch 64, {rounds} interleaved rounds"))
verdict = "faster than" if lo > 1 else "slower than" if hi < 1 else "not clearly different from (inconclusive)"
print(f"INT8 (labkit) over fp32: {mid:.2f}x, middle half of {rounds} rounds {lo:.2f}-{hi:.2f}x: {verdict} fp32 here.")

# %% [markdown]
# Whether INT8 is faster depends on the hardware: CPUs with VNNI or AMX-INT8 and GPUs with INT8 tensor cores
# (twice their BF16 rate) multiply int8 natively; elsewhere the quantize and rescale steps can cost more than they
# save. The accuracy risk is in the **activations**: a few channels with outliers make one scale per token too
# coarse for the others (LLM.int8() and SmoothQuant exist for that). Keep sensitive layers (often the first and
# the last) in higher precision, and evaluate on held-out data, as here, before deploying.
#
# The same caution holds for mixed-precision training. When accuracy drops, the usual remedies are to keep the
# classifier head and the loss in FP32 (autocast already computes the loss in FP32, and on CUDA softmax and norms,
# notebook 04), to lengthen the learning-rate warm-up, and to make sure dynamic loss scaling is on (notebook 03).

# %% [markdown]
# ## 9. Exercises
#
# **15.kv-bytes.** Llama-2 13B has 40 layers and 40 KV heads of dimension 128. How many **bytes** of KV cache does
# one token take in fp16?

# %%
answer = ...
### BEGIN SOLUTION
answer = S.kv_cache_bytes_per_token(40, 40, 128, 2)
### END SOLUTION
check("15.kv-bytes", answer)

# %% [markdown]
# **15.omission.** Requests arrive at 1000 per second, and the server, otherwise instantaneous, stalls once for
# 100 ms. How many requests do their **users** see delayed by at least 30 ms?

# %%
answer = ...
### BEGIN SOLUTION
answer = 1000 * (0.100 - 0.030)
### END SOLUTION
check("15.omission", answer)

# %% [markdown]
# ## Summary
#
# - A percentile needs its sample count: the P99 of 30 samples is their maximum. Throughput is the batch over the
#   *mean* time per batch.
# - Measure from when a request was due, with open-loop (Poisson) arrivals: queueing grows like ρ / (1 − ρ), and a
#   closed-loop client hides the tail (coordinated omission).
# - Continuous batching refills a finished request's slot at the next step; static batching waits for the longest.
# - Decode is memory-bound (weights read once per step), prefill compute-bound: weight-only INT8/INT4 speeds up decode,
#   not prefill; batching decode raises its intensity.
# - The KV cache (2 × layers × KV heads × head dim × bytes per value, per token) limits concurrency; paging wastes less than a
#   block per request.
# - Dynamic INT8: a quarter of the weight bytes, accuracy checked on held-out data; speed depends on the hardware, and
#   a speed-up needs a verdict that the noise cannot fake.
#
# This is the last notebook. Notebook 13's clinic is where to practise diagnosing broken runs with all of it.
