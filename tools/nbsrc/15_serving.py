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

# %% [markdown] lang="zh" en="fe7d45345599"
# # 15 · 模型服务：延迟、负载与批处理
#
# **学习目标**
# - 从服务的视角测量推理：附带样本数的延迟百分位数、吞吐量随批大小的变化、首 token 延迟；
# - 用开环（泊松）到达驱动模型，找出排队开始占主导的负载点，并看清闭环客户端的测量如何掩盖尾部
#   （协调遗漏）；
# - 在相同的到达序列上比较静态批处理与连续批处理；
# - 把预填充（prefill）和解码（decode）放到屋顶线模型上，说明为什么仅权重的 INT8/INT4 量化能加速解码，
#   却不能加速预填充；
# - 算出 KV 缓存的显存占用，分别按连续分配和分页分配计算；
# - 把模型量化为 INT8，测量它的准确率和速度，并给出一个不会被噪声左右的结论。
#
# **前置知识：** notebook 04（小型 GPT）、07（性能分析、屋顶线模型）。
#
# **预计用时：** 50 分钟
#
# 这里的所有内容都能在任何 CPU 上运行：服务端只是一个 CPU 线程，模型是那个小型 GPT，所以耗时因机器而异，
# 测试只比较在所有机器上都成立的结论。同样的思路在 GPU 上有所不同时，文中会专门说明。

# %%
# %matplotlib inline
# %load_ext labkit
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

# %% [markdown] lang="zh" en="6e6adb1e4bc0"
# ## 1. 要服务的模型，以及评判它的指标
#
# 不同类型的工作需要不同的资源，评判的指标也各不相同：
#
# | 工作负载 | 特点 | 首先要关注的资源 | 指标 |
# |---|---|---|---|
# | 预训练 | 数据量巨大，持续数周，通信不断 | 大量 GPU 和节点、显存、网络、检查点存储 | tokens/s、扩展效率、故障后的恢复时间 |
# | 微调 | 规模较小，实验很多 | 一块到几块 GPU、显存、数据加载 | 单步耗时、收敛情况、每天能跑的实验数 |
# | 推理（服务） | 流量稳定，用户在等待 | 显存、批处理、并发、CPU 与网络 | 吞吐量、首 token 延迟、P95/P99 延迟 |
# | 向量嵌入与检索 | 预处理和索引构建的负担重 | CPU、内存、存储的吞吐量与容量 | 索引构建时间、查询延迟、每秒查询数 |
# | 科学智能（AI for Science） | 仿真、数据处理与模型交织在一起 | CPU 与 GPU 协同、I/O、节点间通信 | 每个样本的耗时、端到端时间、与真实值的误差 |
#
# **在本机运行。** 评判一个服务要看它的**延迟分布**，而不是平均值：P50（中位数）代表典型的请求，P99 则是让用户
# 抱怨的那百分之一。**吞吐量**是每秒处理的请求数（或 token 数）。把请求合成一批会提高吞吐量，因为一次调用在同
# 样的固定开销下做了更多的工作；同时也会提高延迟，因为批中的每个请求都要等整批完成。这里的每一项测量都在 CPU
# 上进行，即使在 GPU 节点上也是如此（第 8 节的动态 INT8 在 PyTorch 中走的是 CPU 路径），而且只用一个线程，
# 相当于服务端的一个工作线程。首先需要一个值得服务的模型：notebook 04 的小型 GPT，在倒序任务上训练好，
# 再加上一个它从未见过的留出测试集。

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

# %% [markdown] lang="zh" en="fadf0975a45b"
# ## 2. 延迟百分位数与批大小
#
# 现在对它的前向传播计时，批大小从 1 到 256（交错进行，共 200 轮，在同一次运行中完成）。百分位数旁边必须写明样
# 本数：按最近秩法（nearest rank），30 个样本的 P99 就是最慢的那一个，200 个样本的 P99 是第三慢的那一个；
# 而一个服务的 P99 来自成千上万个请求。吞吐量是批大小除以每批的*平均*耗时，即服务端让批次一个接一个、
# 不停顿地运行时所能维持的速率（慢的批次同样计入；真实的服务端还要加上等待批次凑满的时间，这里没有算进去）：

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

# %% [markdown] lang="zh" en="86a84f3e1b36"
# **15.p99.** 编写 `p99(latencies)`：按最近秩法计算第 99 百分位数，即 99 % 的请求都不超过的那个延迟值（它总是
# 某个观测到的值）。检查会在新生成的列表上运行它。

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

# %% [markdown] lang="zh" en="8d7e81bd7d7d"
# 真实的服务端会选择能让 P99 保持在服务延迟目标以内的最大批大小，并且动态组批：它会等几毫秒，让更多请求到达，
# 但等待时间绝不超过目标所允许的范围。上面这些请求是一个接一个到来的，服务端处理多快，它们就来多快；
# 而真实用户什么时候来都有可能，这正是第 3 节要测量的。
#
# ### 首 token 延迟
#
# 语言模型逐个 token 地生成回答。**首 token 延迟**（TTFT）包括读入整个提示（即*预填充*）和生成一个 token；
# 之后的每个 token 各需要一步*解码*。真实的服务端会保存每一层中已有 token 的键和值（即 **KV 缓存**），
# 这样一步解码只需处理一个新 token，因此每步解码的开销很小，但受限于显存带宽。这个小型 GPT 没有 KV 缓存：
# 每一步都要重新读入整个序列（生成第一个输出 token 时是 7 个 token，到最后一个时最多 12 个），但在这种规模下，
# 一次调用的固定开销超过了这几个 token 的计算量，因此每个 token 的耗时相差不大；单元格会打印出两者的对比。
# 先做一次预热生成，以免一次性的启动开销算到第一个 token 头上，然后计时 21 次生成，打印它们的中位数：

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

# %% [markdown] lang="zh" en="b993e471fdc8"
# ## 3. 负载：开环到达与拐点
#
# 第 2 节的请求是一个接一个发出的。真实用户并不互相等待：他们在随机的时刻到达，平均**速率**为 λ。负载生成器如
# 果在每个请求预定的时刻发出它，不管之前的请求是否已得到响应，就称为**开环**；到达间隔相互独立且服从指数分布的
# 到达过程是*泊松*过程，它是大量独立用户的标准模型。若只有一个服务端，每个请求平均耗时 E[S] 秒，则**提供负载**
# （offered load）为 ρ = λ · E[S]，即服务端必须处于忙碌状态的时间比例。排队论（M/G/1 队列）告诉我们，
# 平均等待时间按 ρ / (1 − ρ) 增长：起初增长缓慢，当 ρ 趋近 1 时则无限增大。这个弯折处就是**拐点**；
# 服务应当在远低于拐点的负载下运行。
#
# 下面是生成器的完整代码，也就是实际运行的版本。只有一个服务端，按到达顺序处理请求，所以预定时刻落在服务端忙碌
# 期间的请求，会在服务端空闲下来的那一刻发出：这就是一个先进先出队列。每个请求都计时两次，一次从它的*预定*时刻
# 算起，一次从它*实际发出*的时刻算起：

# %%
print(inspect.getsource(S.open_loop))

# %% [markdown]
# The server's work is one forward pass at batch 1. Its service time, timed back to back, sets the rates for four
# offered loads; each point serves 1000 Poisson arrivals, and the *busy* column says what fraction of the run the
# server really worked (a request served after an idle gap can take longer than one served back to back). A run this short is
# shorter than a queue near ρ = 1 needs to settle, so its P99 at the highest load understates the steady state:

# %% [markdown] lang="zh" en="5a13bd53e8fa"
# 服务端的工作是一次批大小为 1 的前向传播。先连续不间断地测出它的服务时间，据此确定四种提供负载对应的到达速
# 率；每个点服务 1000 个泊松到达的请求，*busy* 列表示服务端在整个运行过程中真正工作的时间比例（在一段空闲之后
# 处理的请求，耗时可能比连续处理时更长）。这么短的运行不足以让接近 ρ = 1 的队列稳定下来，所以最高负载下的 P99
# 低估了稳态值：

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
# The "closed-loop P99" column (the dashed "from send" line) is what a **closed-loop** client records: it sends a request, waits for the reply, and only
# then sends the next, starting its clock at the send. When the server stalls, such a client stops sending, so the
# requests that real users would have sent during the stall are never made, and never measured: the client has
# *coordinated* with the server to *omit* the bad samples. Gil Tene named this **coordinated omission**; `wrk2` and
# other open-loop tools measure from the intended send time instead. The same server as above, offered half of what it can serve (`0.5 / mean_s`), with one stall injected by
# `S.stall_once` (a garbage collection, a checkpoint, a noisy neighbour: `seconds=0.3`) at request 1000 of 2000:

# %% [markdown] lang="zh" en="d4537e74a583"
# ## 4. 协调遗漏：闭环客户端掩盖的尾部
#
# “closed-loop P99” 一列（图中虚线 “from send”）就是**闭环**客户端记录下的结果：它发出一个请求，等到响应之后才
# 发出下一个，并从发送时刻开始计时。当服务端停顿时，这样的客户端也随之停止发送，于是真实用户在停顿期间本会发出
# 的那些请求从未发出，也就从未被测量：客户端与服务端*协调*一致，*遗漏*了糟糕的样本。Gil Tene 把这种现象命名为
# **协调遗漏**（coordinated omission）；`wrk2` 等开环工具则从预定的发送时刻开始计时。下面还是上面那个服务端，
# 提供的负载为它处理能力的一半（`0.5 / mean_s`），并用 `S.stall_once` 在 2000 个请求中的第 1000 个处注入一次停
# 顿（模拟一次垃圾回收、一次检查点保存或同机其他任务的干扰：`seconds=0.3`）：

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
# ratio of the two P99s printed above, and the error grows with the load and the length of the stall. When a latency claim comes
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

# %% [markdown] lang="zh" en="e92f358874ea"
# 这两行数据来自*同一批*请求。一个报告第二行数据的基准测试，会按上面打印出的两个 P99 之比低估尾延迟，而且负载越高、
# 停顿越长，误差就越大。当某个延迟数据来自闭环工具时，要问清楚它是怎么测出来的。
#
# ## 5. 静态批处理与连续批处理
#
# 语言模型的一个请求需要许多步解码，每步输出一个 token，而不同请求需要的 token 数各不相同。**静态批处理**取出
# 一批正在等待的请求，一直运行到其中*最长*的请求完成为止：已完成的请求仍然占着槽位（按填充计算），新到达的请求
# 则要等整批结束。**连续批处理**（Orca 的迭代级调度，vLLM、TGI、TensorRT-LLM 都在使用）在每一步之后都重新决
# 定：已完成的请求离开，等待中的请求补上它们的槽位。
#
# 下面的回放在虚拟时间中运行：b 个请求的一步，耗时等于第 2 节测得的小型 GPT 在批大小 b 下一次前向传播的时间
# （在测过的批大小之间线性插值）。同样的 2000 个泊松到达请求，输出长度为 1 到 64 个 token（平均约 16 个），
# 分别用两种策略处理，每步最多 16 个请求；负载取两档，都以连续批处理在满批时能处理的速率为基准：

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

# %% [markdown] lang="zh" en="7ac16351c59c"
# 静态批处理吃了两次亏：新来的请求要等前面那一批中最长的请求完成，而已完成请求的槽位不做任何有用的工作，
# 所以它在更低的负载下就达到了上限。连续批处理让槽位始终保持忙碌，这也是它需要一个能按请求增长和收缩的 KV
# 缓存的原因（第 7 节）。
#
# ## 6. 屋顶线模型上的预填充与解码
#
# 语言模型的服务分为两个阶段。**预填充**（prefill）读入提示：提示的所有 token 一起通过每一层，因此每个权重矩阵
# 都与一个由 T 个 token 组成的高矩阵相乘。**解码**（decode）每一步为每个请求生成一个 token：每个权重从内存中读
# 出后，只用于批中每个请求的一行。T 个 token 与一个 d × d 的权重做矩阵乘法，需要 2·T·d² FLOPs，读取 d²
# 个权重；其算术强度约为 2T / (每个权重的字节数) FLOPs/字节（notebook 07 的屋顶线模型）。预填充的 T 以千计：
# 计算密集型。解码的 T 就是批大小，通常为 1 到 64：访存密集型。在这块 CPU 上，分别用 1 个 token 和 128 个
# token 测一个 4096 × 4096 的层：

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

# %% [markdown] lang="zh" en="25dbb9e63b8c"
# 对一块 H100 上的 7B 模型做同样的计算（数据手册：稠密 bf16 989 TFLOP/s，3.35 TB/s），只计权重：一步的耗时至少
# 是其计算时间与读取权重时间中较长的那个。**仅权重**（weight-only）量化（INT8 如 W8A16，INT4 如 GPTQ 或 AWQ）
# 用更少的字节存储权重，并在内核中把它们转换为 bf16，所以它减少的是字节数，FLOPs 保持不变：

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
# cache for a 3-layer model with 2 heads of dimension 8 holding 5 tokens in fp16 would allocate:

# %% [markdown] lang="zh" en="01b9b066acd0"
# 批大小为 1 的解码要搬运 14 GB 的 bf16 权重，却只做 14 GFLOP 的计算：字节数减半，单步耗时也减半。预填充在同样
# 的字节数下做了 2048 倍的 FLOPs：它本来就是计算密集型，INT8 权重不会改变它的耗时（能加速预填充的是完整的 INT8
# 计算，即权重*和*激活值都用 int8，在 INT8 张量核心上计算）。把多个解码请求合成一批，会像预填充那样提高算术强
# 度，这就是服务端要对解码步做批处理的原因。
#
# ## 7. KV 缓存与分页分配
#
# 第 t 步的注意力需要之前所有 token 的键和值。服务端为每个请求把它们保存在 **KV 缓存**中：每个 token 在每一
# 层、每个 KV 头上都有一个键向量和一个值向量，因此每 token 字节数 = 2 × 层数 × KV 头数 × 头维度 × 每个值的字
# 节数。下面用张量来验证这个公式：一个 3 层、2 个头、每个头 8 维的模型，用 fp16 缓存 5 个 token 时，
# 实际要分配这些张量：

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

# %% [markdown] lang="zh" en="bcff6632bedf"
# 对 Llama-2 7B（32 层，32 个 KV 头，每个头 128 维，fp16）来说，每个 token 要 0.5 MiB，一条 4096 token
# 的序列就要 2 GiB：限制一块 GPU 能同时服务多少请求的是缓存，而不是权重。为每个请求预留最大长度会浪费其中的
# 大部分，因为大多数请求要短得多。**分页**分配（vLLM 的 PagedAttention）在请求增长时分给它固定大小的块，
# 比如每块 16 个 token，就像虚拟内存的页一样，因此每个请求浪费的空间不到一个块。对于 2000 个长度为
# 64 + exponential(600) 个 token（最多 4096）的请求，60 GB 的缓存（一块 80 GB 的 H100 减去 13.5 GB 的权重和
# 工作内存）能同时容纳多少个请求：

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

# %% [markdown] lang="zh" en="8713cf56d6f6"
# ## 8. INT8 量化：实测速度与准确率
#
# **在本机运行。** INT8 推理把权重存为带缩放因子的 8 位整数，并把 int8 与 int8 相乘、累加到 int32 中，
# 结果是精确的。*动态*量化在运行时计算激活值的缩放因子，因此不需要校准数据。在 torch 2.13 中，它的 eager API
# `torch.ao.quantization.quantize_dynamic` 仍然可用，但已被弃用（它的警告宣布了它将被移除）；继任者是独立的
# `torchao` 包（`quantize_(model, Int8DynamicActivationInt8WeightConfig())`）。这里把它完整地写了出来：
# 权重每个输出通道一个缩放因子，激活值每个 token 一个缩放因子。注意 `forward` 中的分支：只有在探测确认整数矩
# 阵乘法 `torch._int_mm` 结果精确的地方才使用它。在指令集被限制为 AVX2 时，以及在没有 VNNI 指令的 CPU 上，
# torch 2.13 的 CPU 内核返回的乘积偏差达到几万（它的 16 位中间和会饱和），所以整数内核也和其他一切一样，
# 需要在每一类 CPU 上检查：

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

# %% [markdown] lang="zh" en="5f5d46e149bd"
# 作为对比，下面是已弃用的 eager API（它有自己的方案：整个权重只用一个缩放因子，激活值为无符号数）：

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

# %% [markdown] lang="zh" en="8df339579222"
# 速度是另一半。小型 GPT 的矩阵（宽 96）太小，INT8 得不偿失；用一个 512 → 2048 → 512 的 MLP、批大小 64，才能看出
# CPU 的整数单元能做到什么。首先看看 labkit 的 INT8 在这里用的是哪种整数矩阵乘法：

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

# %% [markdown] lang="zh" en="4aef786851be"
# 只做一次、每次重复几遍的计时可能会误导人：一个繁忙的邻居进程或一次频率变化，就能让比值变动百分之几十。
# 每一轮把每个候选各计时一次，彼此间隔很短，因此同一轮的比值处在相同的条件下。该单元格会不断增加轮数，
# 直到各轮比值的中间一半（四分位距）落在 1 的同一侧或者足够窄为止，否则就判定结果无定论：

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

# %% [markdown] lang="zh" en="f2a6c51bf73d"
# INT8 是否更快取决于硬件：支持 VNNI 或 AMX-INT8 的 CPU，以及带 INT8 张量核心（速率是其 BF16 的两倍）的
# GPU，都能原生地做 int8 乘法；在其他硬件上，量化和重新缩放这两步的开销可能超过它省下的时间。准确率的风险在
# **激活值**上：少数几个带离群值的通道，会让每个 token 一个的缩放因子对其他通道来说过于粗糙（LLM.int8() 和
# SmoothQuant 正是为此而提出的）。把敏感的层（通常是第一层和最后一层）保留在更高的精度，并在部署之前像这里一
# 样用留出数据做评估。
#
# 同样的谨慎也适用于混合精度训练。当准确率下降时，常用的补救办法有：把分类头和损失保留在 FP32（autocast 已经以
# FP32 计算损失，在 CUDA 上还包括 softmax 和归一化，见 notebook 04），延长学习率预热，并确认动态损失缩放已经开
# 启（notebook 03）。

# %% [markdown]
# ## 9. Exercises
#
# **15.kv-bytes.** Llama-2 13B has 40 layers and 40 KV heads of dimension 128. How many **bytes** of KV cache does
# one token take in fp16?

# %% [markdown] lang="zh" en="ede678097f74"
# ## 9. 练习
#
# **15.kv-bytes.** Llama-2 13B 有 40 层、40 个 KV 头，每个头的维度为 128。用 fp16 存储时，每个 token 的 KV
# 缓存占多少**字节**？

# %%
answer = ...
### BEGIN SOLUTION
answer = S.kv_cache_bytes_per_token(40, 40, 128, 2)
### END SOLUTION
check("15.kv-bytes", answer)

# %% [markdown]
# **15.omission.** Requests arrive at 1000 per second, and the server, otherwise instantaneous, stalls once for
# 100 ms. How many requests do their **users** see delayed by at least 30 ms?

# %% [markdown] lang="zh" en="b1198f920be1"
# **15.omission.** 请求以每秒 1000 个的速率到达；服务端除了会停顿一次、持续 100 ms 之外，处理请求不花任何时间。
# 有多少个请求的**用户**会感受到至少 30 ms 的延迟？

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
# Notebooks 16 (attention as one Triton kernel) and 17 (FP8, MX and NVFP4 scaling) go further. Notebook 13's clinic is where to practise diagnosing broken runs with all of it.

# %% [markdown] lang="zh" en="6c54ab518174"
# ## 小结
#
# - 百分位数必须写明样本数：30 个样本的 P99 就是其中的最大值。吞吐量是批大小除以每批的*平均*耗时。
# - 用开环（泊松）到达，并从请求的预定时刻开始测量：排队按 ρ / (1 − ρ) 增长，而闭环客户端会掩盖尾部
#   （协调遗漏）。
# - 连续批处理在下一步就把已完成请求的槽位补上；静态批处理则要等最长的请求完成。
# - 解码是访存密集型（每一步都要读一遍权重），预填充是计算密集型：仅权重的 INT8/INT4 量化能加速解码，不能加速
#   预填充；对解码做批处理能提高它的算术强度。
# - KV 缓存（每个 token 占 2 × 层数 × KV 头数 × 头维度 × 每个值的字节数）限制了并发量；分页分配让每个请求浪费
#   的空间不到一个块。
# - 动态 INT8：权重字节数减为四分之一，准确率要在留出数据上检验；速度取决于硬件，而加速的结论必须经得
#   起噪声的检验。
#
# notebook 16（把注意力写成一个 Triton 内核）和 notebook 17（FP8、MX 与 NVFP4 的缩放）会更进一步。想综合运用这
# 些知识、练习诊断出错的训练任务，请去 notebook 13 的故障排查门诊。
