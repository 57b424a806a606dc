# %% [markdown]
# # 13 · Troubleshooting clinic: broken training runs to diagnose and fix
#
# **Objectives**
# - work through a failed run the way the seed articles recommend: read the symptom as it appears (a log, a loss
#   curve, a memory trace, a profiler table, an error), find the evidence that separates the candidate causes,
#   then change one thing and check that the symptom is gone;
# - diagnose sixteen failures that cost real training time, from mixed precision (a loss that will not move, NaN,
#   a resume that skips steps) through memory and data loading to several processes (runs that differ, ranks that
#   never meet or never finish, a DeepSpeed config refused, slower learning on more ranks) and the cluster's own
#   (an epoch that never ends, a DDP error, weights that drift without an error, a job that fails at its start,
#   a saved model that cannot be loaded);
# - use the tools that make the evidence: `labkit.debug.first_nonfinite`, `torch.profiler`,
#   `TORCH_DISTRIBUTED_DEBUG=DETAIL`, process-group timeouts, DeepSpeed's own messages, checksums of weights.
#
# **Prerequisites:** notebooks 03 and 04 (loss scaling, AMP), 06 (memory), 07 (profiling), 09 (DDP) and 10
# (DeepSpeed).
#
# **Estimated time:** 150 min
#
# Every case is a small training script in `labkit.clinic.cases` that goes wrong for a real reason, run as its own
# process (or as 2 gloo ranks under `torchrun`, through `labkit.dist.launch`). Nothing is mocked: the symptoms
# below are what the scripts printed when this notebook ran. The scripts run on the CPU, so that each takes
# seconds; on a GPU node the same mistakes fail the same way, with other numbers (where a GPU differs, the explanation of a solved case says so).

# %% [markdown] lang="zh" en="82ac4f716905"
# # 13 · 故障排查门诊：诊断并修复出错的训练任务
#
# **学习目标**
# - 按 seed 文章推荐的方式处理一次失败的运行：先读症状的原貌（日志、损失曲线、内存记录、性能分析器的表格、报错），
#   再找出能区分各个候选原因的证据，然后只改一处，并确认症状已经消失；
# - 诊断十六个真实耗费过训练时间的故障：从混合精度（损失纹丝不动、NaN、恢复训练后跳步），到内存与数据加载，
#   再到多进程（两次运行结果不同、各 rank 始终会合不了或始终结束不了、DeepSpeed 配置被拒、rank 越多学得越慢），
#   直至集群自身的故障（永远结束不了的 epoch、DDP 报错、没有任何报错却悄悄漂移的权重、一启动就失败的作业、
#   保存后无法加载的模型）；
# - 用好产生证据的工具：`labkit.debug.first_nonfinite`、`torch.profiler`、
#   `TORCH_DISTRIBUTED_DEBUG=DETAIL`、进程组超时、DeepSpeed 自己的报错信息、权重的校验和。
#
# **前置知识：** notebook 03 和 04（损失缩放、AMP）、06（显存）、07（性能分析）、09（DDP）和 10（DeepSpeed）。
#
# **预计用时：** 150 分钟
#
# 每个病例都是 `labkit.clinic.cases` 中的一个小训练脚本，出错的原因都是真实的。每个脚本作为独立进程运行
# （或者通过 `labkit.dist.launch` 在 `torchrun` 下以 2 个 gloo rank 运行）。这里没有任何东西是模拟出来的：
# 下文的症状就是本 notebook 运行时这些脚本实际打印出来的内容。脚本在 CPU 上运行，每个只需几秒；
# 在 GPU 节点上，同样的错误会以同样的方式失败，只是数字不同（GPU 上有差异的地方，已解病例的讲解中会说明）。

# %%
# %matplotlib inline
# %load_ext labkit
import math
import re

import matplotlib.pyplot as plt

from labkit import clinic, plots
from labkit.check import check, predict, reveal
from labkit.exercises.nb13 import lr_outcome

# %% [markdown]
# ## How a visit works
#
# Each case has the same four steps:
#
# 1. **The script.** Read the code that ran, and its settings (`CONFIG`), printed from the script itself.
# 2. **The symptom.** Read what the run printed, as you would in a job's log.
# 3. **The cause.** Pick it from four candidates (`clinic.causes(case)`): each wrong one is ruled out by something in
#    the evidence, and the checker says what.
# 4. **The fix.** Change *one* setting of the script's `CONFIG`: `fix = {"setting": value}`. Some settings are lines
#    of the script (the order of two calls, an expression): the values they may take are listed under `CONFIG`. The
#    checker runs the case again with `clinic.run_case(case, fix=fix)` and asks the case's detector whether the
#    symptom is gone, and whether the run still does its job: a "fix" that changes the number of steps, the data,
#    its tuned values, or gives up the precision the run was moved to, avoids the failure instead of curing it, and is
#    refused.
#
# The seed articles' rule applies throughout: measure first, change one variable at a time, and check the result
# against a measurement, not a feeling. All sixteen broken runs are made now, in about a minute: the one-process
# cases one after the other in a single Python process (each is still its own script; they share only the start-up
# of Python and torch), each 2-rank case under `torchrun`, two of these jobs at a time.

# %% [markdown] lang="zh" en="e8d587efcf37"
# ## 一次就诊的流程
#
# 每个病例都分同样的四步：
#
# 1. **脚本。** 阅读实际运行的代码及其设置（`CONFIG`），它们直接从脚本本身打印出来。
# 2. **症状。** 阅读运行打印的内容，就像在作业日志里读到的那样。
# 3. **病因。** 从四个候选原因（`clinic.causes(case)`）中选出一个：每个错误选项都能被证据中的某一处排除，
#    检查器会告诉你是哪一处。
# 4. **修复。** 只改脚本 `CONFIG` 中的*一个*设置：`fix = {"setting": value}`。有些设置对应脚本中的代码行
#    （两个调用的先后顺序、一个表达式）：它们可取的值列在 `CONFIG` 下方。检查器用
#    `clinic.run_case(case, fix=fix)` 重新运行该病例，并让该病例的检测器判断：症状是否已经消失，
#    运行是否仍然完成了它的本职工作。如果一个“修复”改变了步数、数据、已调好的参数值，
#    或者放弃了这次运行改用的精度，那它只是绕开了故障，并没有治好它，会被拒绝。
#
# seed 文章的原则贯穿始终：先测量，每次只改一个变量，并用测量结果而不是感觉来检验效果。
# 十六个出错的运行现在一次全部生成，大约需要一分钟：单进程的病例在同一个 Python 进程中依次运行
# （每个仍是独立的脚本，只共用 Python 和 torch 的启动过程），每个 2-rank 病例在 `torchrun` 下运行，
# 同时跑两个这样的作业。

# %%
for c in clinic.CASES.values():
    print(f"{c.number:2d}  {c.key:<12} {'2 ranks' if c.nproc == 2 else '1 process':<10} {c.title}")
broken = {r.key: r for r in clinic.run_cases(list(clinic.CASES), parallel=2)}
print("symptom present in every broken run:", all(r.symptom for r in broken.values()))
assert all(r.symptom for r in broken.values())

# %% [markdown]
# ## Part A · Numbers: mixed precision that goes wrong
#
# ### Case 1 · The loss does not move
#
# fp16 autocast with a `GradScaler`, plain SGD, gradients clipped to a norm of 1.0. The loop:

# %% [markdown] lang="zh" en="40c40d6362f6"
# ## A 部分 · 数值：出问题的混合精度
#
# ### 病例 1 · 损失纹丝不动
#
# fp16 autocast 配合 `GradScaler`，普通 SGD，梯度裁剪到范数 1.0。训练循环如下：

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("clip"), end="\n\n")
run = broken["clip"]
print("\n".join(run.lines(last=3)))
plots.loss_curves({"loss on the whole data set": run.result["loss"]}, title="Case 1: the loss does not move")
plt.show()
assert run.symptom and min(run.result["clip_saw"]) > 1000 and run.result["loss"][-1] > 0.9 * run.result["loss"][0]
print("\n" + clinic.causes("clip"))

# %%
cause = ...  # a letter from the list above
fix = ...    # a dict of one CONFIG setting, e.g. {"lr": 0.1}
### BEGIN SOLUTION
cause = "a"
fix = {"after_backward": "scaler.unscale_, clip_grad_norm_, scaler.step"}
### END SOLUTION
check("13.clip-cause", cause)
check("13.clip-fix", fix)

# %% [markdown]
# ### Case 2 · A loss frozen from the first step
#
# A small MLP predicts a 256-sample signal whose values are about 1e-4 (the data are in the wrong unit), under fp16
# autocast, with SGD. The last layer starts at zero, as output layers often do.

# %% [markdown] lang="zh" en="231dd499951f"
# ### 病例 2 · 从第一步起就停滞不动的损失
#
# 一个小型 MLP 要预测一段 256 个样本的信号，信号值约为 1e-4（数据用错了单位），在 fp16 autocast 下用 SGD
# 训练。最后一层初始化为零，输出层常常这样初始化。

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("noscale"), end="\n\n")
run = broken["noscale"]
print("\n".join(run.lines()[:3] + ["..."] + run.lines(last=1)))
assert run.symptom and all(z == 1.0 for z in run.result["zero_grads"]) and len(set(run.result["loss"])) == 1
print("\n" + clinic.causes("noscale"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "d"
fix = {"scaler_enabled": True}
### END SOLUTION
check("13.noscale-cause", cause)
check("13.noscale-fix", fix)

# %% [markdown]
# ### Case 3 · NaN from the first step of a fine-tune
#
# Fine-tuning notebook 04's tiny GPT from a checkpoint of a long run. The loss is NaN from the first step. Where does
# the first NaN appear? `labkit.debug.first_nonfinite` (notebook 03) hooks every module and reports the first one
# whose output is not finite, and whether its inputs still were.

# %% [markdown] lang="zh" en="0471ddc5209f"
# ### 病例 3 · 微调从第一步起就是 NaN
#
# 从一次长时间运行的检查点出发，微调 notebook 04 的小型 GPT。损失从第一步起就是 NaN。第一个 NaN
# 出现在哪里？`labkit.debug.first_nonfinite`（notebook 03）给每个模块挂上钩子，报告第一个输出不是有限值的模块，
# 以及它的输入当时是否仍是有限值。

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("softmax"), end="\n\n")
run = broken["softmax"]
print("\n".join(run.lines("step")[-2:] + run.lines("first_nonfinite") + run.lines("largest |attention")))
assert run.symptom and run.result["first_nonfinite"] == "blocks.0.attn.proj"
assert run.result["scores_absmax"][0] > math.log(65504)  # exp overflows fp16 above log(65504) = 11.09
print("\n" + clinic.causes("softmax"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "b"
fix = {"softmax": "fp32"}
### END SOLUTION
check("13.softmax-cause", cause)
check("13.softmax-fix", fix)

# %% [markdown]
# ### Case 4 · A resumed job that skips steps
#
# An fp16 run on unnormalised targets is stopped at step 15, checkpointed, and resumed by a new job. For
# comparison the script first trains the same 30 steps without a break. The checkpoint code:

# %% [markdown] lang="zh" en="2274affbd323"
# ### 病例 4 · 恢复后跳步的作业
#
# 一个在未归一化目标上训练的 fp16 运行在第 15 步停下、保存检查点，再由一个新作业恢复。作为对照，
# 脚本先不间断地训练同样的 30 步。检查点代码如下：

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("scaler-ckpt"), end="\n\n")
run = broken["scaler-ckpt"]
r, at = run.result, run.result["config"]["resume_at"]
print("\n".join(run.lines(last=3)))
plots.scale_history(r["resumed"]["scale"], r["resumed"]["skipped"], title="Case 4: the loss scale of the resumed run")
plt.show()
assert run.symptom and r["resumed"]["scale"][at] == 65536 > r["reference"]["scale"][at]
print("\n" + clinic.causes("scaler-ckpt"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "a"
fix = {"checkpoint_keys": "model, optimizer, step, scaler"}
### END SOLUTION
check("13.scaler-ckpt-cause", cause)
check("13.scaler-ckpt-fix", fix)

# %% [markdown]
# ## Part B · Memory and speed
#
# ### Case 5 · Memory that grows every step
#
# A training loop that also measures a validation loss after every step, for the log. The process's memory (RSS,
# what `top`, `htop` or Slurm's accounting show) grows by a few MiB with every step. The script also measures,
# exactly, the bytes that autograd graphs still reachable from the loop's variables hold
# (`labkit.memory.graph_saved_bytes`, notebook 06).

# %% [markdown] lang="zh" en="c4c5c9248cf7"
# ## B 部分 · 内存与速度
#
# ### 病例 5 · 每一步都在增长的内存
#
# 一个训练循环，每步之后还会计算一次验证损失，用于写日志。进程的内存（RSS，即 `top`、`htop`
# 或 Slurm 的记账信息所显示的值）每一步都增长几 MiB。脚本还精确测量了从循环变量仍能访问到的
# autograd 计算图所占用的字节数（`labkit.memory.graph_saved_bytes`，notebook 06）。

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("graph"), end="\n\n")
run = broken["graph"]
print("\n".join(run.lines()[:2] + ["..."] + run.lines(last=1)))
fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(run.result["rss_mb"], "o-", label="process RSS (MiB)")
ax.plot(run.result["graph_mb"], "s-", label="held by the graph of val_total (MiB)")
ax.set(xlabel="step", title="Case 5: memory that grows step after step")
ax.legend()
plt.show()
assert run.symptom and all(b > a for a, b in zip(run.result["graph_mb"], run.result["graph_mb"][1:]))
print("\n" + clinic.causes("graph"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "d"
fix = {"val_accumulate": "val_total += val_loss.item()"}
### END SOLUTION
check("13.graph-cause", cause)
check("13.graph-fix", fix)

# %% [markdown]
# RSS is what the job's memory limit sees, but it is a rough measure (the allocator keeps freed memory); the exact
# count of what a tensor keeps alive is what tells the cause. On a GPU, `torch.cuda.memory_allocated()` gives the
# exact figure; a real model's activations are far larger, and the same leak ends in an out-of-memory error.
#
# ### Case 6 · Steps slower than the model needs
#
# Each record is read from slow shared storage (about 1 ms, nearly all of it waiting on the file system). The
# profiler (notebook 07) shows where each step goes. The data loader:

# %% [markdown] lang="zh" en="46187227bba9"
# 作业的内存上限看的是 RSS，但它只是一个粗略的度量（分配器会留着已释放的内存）；
# 真正能说明原因的，是精确统计一个张量让多少内存无法释放。在 GPU 上，`torch.cuda.memory_allocated()`
# 给出的就是精确数字；真实模型的激活值要大得多，同样的泄漏最终会以显存不足（out of memory）错误告终。
#
# ### 病例 6 · 每步耗时超出模型本身所需
#
# 每条记录都从缓慢的共享存储中读取（约 1 ms，几乎全花在等待文件系统上）。性能分析器（notebook 07）
# 会显示每一步的时间花在了哪里。数据加载器如下：

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("loader"), end="\n\n")
run = broken["loader"]
print(run.result["table"])
print(run.lines(last=1)[0])
assert run.symptom and "DataLoader" in run.result["table"].splitlines()[3]  # the top row of the table
print("\n" + clinic.causes("loader"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
fix = {"num_workers": 4}
### END SOLUTION
check("13.loader-cause", cause)
check("13.loader-fix", fix)

# %% [markdown]
# The checker's test is relative: a step may wait in `next(loader)` at most half of what reading its batch took
# (each record reports its read time, wherever it was read), so it holds on a fast disk and a slow one, and on a
# busy machine. How much faster is a step once the batches are read ahead? The reference fix, measured on this
# machine (the ratio of the median step times of the two runs, each profiled after its warm-up steps):

# %% [markdown] lang="zh" en="a5c3aefbe528"
# 检查器的判据是相对的：一步在 `next(loader)` 中等待的时间，最多只能是读取它那个批次所用时间的一半
# （每条记录都会报告自己的读取时间，无论它在哪里被读取），因此无论磁盘快慢、机器是否繁忙，判据都成立。
# 批次提前读好之后，一步能快多少？下面是参考修复在本机上的测量结果（两次运行的中位步时之比，
# 每次运行都在预热步之后才做性能分析）：

# %%
# NBVAL_IGNORE_OUTPUT
fixed = clinic.run_case("loader", fix=clinic.CASES["loader"].fix)
speedup = run.result["step_s"] / fixed.result["step_s"]
print(f"waiting for data: {run.result['wait_share']:.0%} of the time before, {fixed.result['wait_share']:.0%} after;"
      f" median step {run.result['step_s'] * 1e3:.1f} -> {fixed.result['step_s'] * 1e3:.1f} ms: {speedup:.1f}x")
assert not fixed.symptom and speedup > 1.0

# %% [markdown]
# DataLoader warns when `num_workers` exceeds the cores it can use (it does where fewer than 4 are available): the
# warning assumes that workers compete for cores; these wait on storage, so more of them than cores is fine. On a GPU node, `pin_memory=True` with
# `.to(device, non_blocking=True)` is the next step: it overlaps the host-to-GPU copy, which this CPU run does not
# have.
#
# ## Part C · Several processes
#
# From here on, every case runs 2 processes under `torchrun` through `labkit.dist.launch`, as notebook 09 does:
# a free port, the ranks' logs prefixed `[default0]:`/`[default1]:`, a timeout, and every process killed at the
# end, also when the run hangs. Their broken runs were made at the top; the checks run the fixes now.
#
# ### Case 7 · Two runs that should match differ
#
# The same script started twice, at once, with the same seed: each process trains on its own and they meet only at
# the end, to compare notes.

# %% [markdown] lang="zh" en="24b780acec07"
# 当 `num_workers` 超过 DataLoader 可用的 CPU 核心数时，它会发出警告（可用核心少于 4 个时就会这样）：
# 这个警告假定各个 worker 在争抢核心；而这里的 worker 是在等存储，所以 worker 比核心多也没问题。
# 在 GPU 节点上，下一步是 `pin_memory=True` 配合 `.to(device, non_blocking=True)`：它让主机到 GPU 的拷贝
# 与计算重叠，而这次 CPU 运行没有这一环节。
#
# ## C 部分 · 多进程
#
# 从这里开始，每个病例都通过 `labkit.dist.launch` 在 `torchrun` 下运行 2 个进程，与 notebook 09 的做法相同：
# 使用一个空闲端口，各 rank 的日志带有 `[default0]:`/`[default1]:` 前缀，设有超时，并在结束时杀掉所有进程，
# 运行挂起时也一样。这些病例出错的运行已在开头生成；现在的检查运行的是修复后的版本。
#
# ### 病例 7 · 本应一致的两次运行结果不同
#
# 同一个脚本同时启动两次，使用同一个随机种子：每个进程各自训练，只在最后碰头，核对一下结果。

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("repro"), end="\n\n")
run = broken["repro"]
print("\n".join(line.split(":", 1)[1] for line in run.lines("]:run ")))
runs = run.result["runs"]
assert run.symptom and runs[0]["init_digest"] == runs[1]["init_digest"] and runs[0]["order"] != runs[1]["order"]
print("\n" + clinic.causes("repro"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "b"
fix = {"shard_list": "sorted(set(shards))"}
### END SOLUTION
check("13.repro-cause", cause)
check("13.repro-fix", fix)

# %% [markdown]
# To find where two runs part, log checksums at each stage (data order, initial weights, first step) and compare
# the first line that differs. Then record what makes a run repeatable: code version, data version and order,
# seeds, environment, launch parameters (004 §9.4).
#
# ### Case 8 · Ranks that never start training
#
# A 2-rank job whose ranks never start training. The script came from a single-node tutorial:

# %% [markdown] lang="zh" en="ffaa3b1463b7"
# 要找出两次运行从哪里开始分岔，就在每个阶段（数据顺序、初始权重、第一步）记录校验和，
# 然后比较第一行不同的输出。接着记录让一次运行能够重复的一切：代码版本、数据版本与数据顺序、随机种子、
# 环境、启动参数（004 §9.4）。
#
# ### 病例 8 · 始终开始不了训练的 rank
#
# 一个 2-rank 作业，它的各个 rank 始终没有开始训练。脚本来自一个单节点教程：

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("rdzv"), end="\n\n")
run = broken["rdzv"]
print("\n".join(run.lines("joining via")))
print(run.error_line())
assert run.symptom and "timed out" in run.error and "connect" in run.error
print("\n" + clinic.causes("rdzv"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "d"
fix = {"tutorial_sets": ""}
### END SOLUTION
check("13.rdzv-cause", cause)
check("13.rdzv-fix", fix)

# %% [markdown]
# How to read a rendezvous error: *client socket timed out while trying to connect to (host, port)* means nothing
# answered there (a wrong address or port, a store that never started, a firewall between nodes); *address already
# in use* comes from the process that tried to *open* the store, at once, and means the port is taken. Either way,
# print `MASTER_ADDR:MASTER_PORT` on every rank first.
#
# ### Case 9 · A job that stops at its first checkpoint
#
# A data-parallel loop that averages gradients with `all_reduce` (DDP does the same, in buckets) and checkpoints every
# 3 steps. The process group has a 5 s timeout, so that a hang becomes an error here instead of 30 minutes of
# waiting.

# %% [markdown] lang="zh" en="4fc20c4c700d"
# 如何读懂 rendezvous（会合）错误：*client socket timed out while trying to connect to (host, port)*
# 表示那里没有任何应答（地址或端口错误、store 从未启动、节点之间有防火墙）；*address already in use*
# 则来自试图*打开* store 的那个进程，而且是立即报出，表示端口已被占用。无论哪种情况，
# 都先在每个 rank 上打印 `MASTER_ADDR:MASTER_PORT`。
#
# ### 病例 9 · 在第一个检查点处停住的作业
#
# 一个数据并行循环，用 `all_reduce` 对梯度求平均（DDP 做的也是这件事，只是按桶进行），每 3 步保存一次检查点。
# 进程组的超时设为 5 s，这样挂起在这里会变成一个报错，而不是 30 分钟的等待。

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("hang"), end="\n\n")
run = broken["hang"]
print(*run.lines("step 2"), "", *(line[:150] for line in run.lines("]: RuntimeError")), sep="\n")
detail = clinic.run_case("hang", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
own = sorted({re.search(r"Rank \d is running collective: [^)]*?OpType=\w+", line).group()
              for line in detail.lines("Detected mismatch between collectives")})
print("\nwith TORCH_DISTRIBUTED_DEBUG=DETAIL, each rank says which collective it is in:", *own, sep="\n")
assert run.symptom and "Timed out" in run.log and "BARRIER" in own[0] and "ALLREDUCE" in own[1]
print("\n" + clinic.causes("hang"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "a"
fix = {"barrier_ranks": "0, 1"}
### END SOLUTION
check("13.hang-cause", cause)
check("13.hang-fix", fix)

# %% [markdown]
# Each rank's last error line is printed above. The rank that waited longest reports the timeout; the other may
# report that its partner went away ("Connection closed by peer") once the first one exited: in a job with many
# ranks, look for the *first* error in time, the rest are consequences.
#
# `DETAIL` makes every collective check, before it runs, that all ranks are calling the same one with the same
# shapes: slow, so only while debugging. Read each rank's own line, "Rank N is running collective: ..."; the second
# half of each message, what the partner runs, comes out garbled when the partners sit in different collectives
# (that is a sign too). With the default timeouts (30 minutes for gloo, 10 for NCCL) the same bug is a job that
# sits idle that long before it fails; with NCCL, `TORCH_NCCL_DUMP_ON_TIMEOUT=1` writes each rank's recent
# collectives (notebook 09). No process of either run is left over: `labkit.dist.launch` kills the whole launch
# when it fails. (The script averages the gradients itself because, with the torch 2.13 CPU build this notebook
# was written with, constructing DDP under `DETAIL` crashed with a segmentation fault.)
#
# **On NCCL the same bug can be worse than an error.** NCCL matches collectives by their order on each
# communicator, not by kind: a barrier (itself a tiny all-reduce) paired with a gradient all-reduce of another size
# can hang, or exchange the wrong bytes and corrupt the result without any error, where gloo fails. Two tools make it
# visible: the *flight recorder* (`TORCH_FR_BUFFER_SIZE`, formerly `TORCH_NCCL_TRACE_BUFFER_SIZE`, above 0, dumped per rank with
# `TORCH_NCCL_DUMP_ON_TIMEOUT=1`) keeps each rank's last collectives with their sizes, and
# `TORCH_NCCL_ASYNC_ERROR_HANDLING` (torchrun exports 1, the library's own default is 3: both tear the process down
# on an error or a timeout) turns a stuck collective into a process that exits, so that the job fails instead of
# idling.
#
# ### Case 10 · DeepSpeed refuses to start
#
# A DeepSpeed config tuned on one GPU, started on 2 ranks (DeepSpeed's CPU accelerator here, gloo).

# %% [markdown] lang="zh" en="5d122ef6dc6d"
# 上面打印了每个 rank 的最后一行错误。等待最久的 rank 报告超时；另一个 rank 可能会在前者退出之后，
# 报告它的对端已经离开（“Connection closed by peer”）：在 rank 很多的作业里，要找时间上*最早*的那个错误，
# 其余的都是它的后果。
#
# `DETAIL` 会让每个集合通信在运行之前检查：所有 rank 调用的是否是同一个集合通信，形状是否相同。
# 这很慢，所以只在调试时使用。请阅读每个 rank 自己的那一行，即“Rank N is running collective: ...”；
# 每条消息的后半部分（对端在运行什么）在双方处于不同的集合通信中时会显示成乱码（这本身也是一个信号）。
# 在默认超时下（gloo 30 分钟，NCCL 10 分钟），同样的 bug 就是一个要空等这么久才失败的作业；
# 使用 NCCL 时，`TORCH_NCCL_DUMP_ON_TIMEOUT=1` 会写出每个 rank 最近的集合通信（notebook 09）。
# 两次运行都没有遗留任何进程：`labkit.dist.launch` 在失败时会杀掉整个启动的所有进程。
# （脚本之所以自己对梯度求平均，是因为编写本 notebook 时所用的 torch 2.13 CPU 版本中，
# 在 `DETAIL` 下构造 DDP 会因段错误而崩溃。）
#
# **在 NCCL 上，同样的 bug 可能比报错更糟。** NCCL 按每个通信器（communicator）上的调用顺序匹配集合通信，
# 而不看类型：一个屏障（barrier，它本身就是一次很小的全归约）与另一种大小的梯度全归约配成一对，
# 可能会挂起，也可能交换了错误的字节、在没有任何报错的情况下破坏结果，而 gloo 在这种情况下会直接报错。
# 有两个工具能让它现形：*flight recorder*（飞行记录器：把 `TORCH_FR_BUFFER_SIZE`，旧名
# `TORCH_NCCL_TRACE_BUFFER_SIZE`，设为大于 0，并用 `TORCH_NCCL_DUMP_ON_TIMEOUT=1` 按 rank 转储）
# 会保存每个 rank 最近的集合通信及其大小；`TORCH_NCCL_ASYNC_ERROR_HANDLING`（torchrun 导出的值为 1，
# 库本身的默认值为 3：两者都会在出错或超时时终止进程）会把卡住的集合通信变成一个会退出的进程，
# 于是作业会失败，而不是空转。
#
# ### 病例 10 · DeepSpeed 拒绝启动
#
# 一份在单 GPU 上调好的 DeepSpeed 配置，在 2 个 rank 上启动（这里用的是 DeepSpeed 的 CPU 加速器和 gloo）。

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("ds-batch"), end="\n\n")
run = broken["ds-batch"]
print(run.error_line())
assert run.symptom and "32 != 8 * 4 * 2" in run.error
print("\n" + clinic.causes("ds-batch"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "b"
fix = {"train_batch_size": 64}
### END SOLUTION
check("13.ds-batch-cause", cause)
check("13.ds-batch-fix", fix)

# %% [markdown]
# ### Case 11 · Two ranks learn slower than one
#
# A recipe tuned on one GPU (batch 32, SGD, lr 0.1, 960 examples) moved to 2 ranks that keep batch 32 each. Rank 0
# first replays the 1-GPU run from the notes, to compare the curves at the same number of examples.

# %% [markdown] lang="zh" en="259f5b96e062"
# ### 病例 11 · 两个 rank 比一个学得还慢
#
# 一份在单 GPU 上调好的训练配方（批大小 32、SGD、lr 0.1、960 个样本）被迁移到 2 个 rank 上，
# 每个 rank 仍保持批大小 32。rank 0 先按记录重放一遍单 GPU 运行，以便在相同样本数下比较两条曲线。

# %%
print(clinic.source("lr"))
print("\n" + clinic.causes("lr"))

# %% [markdown]
# **Predict first.** After the same 960 examples, will the 2-rank run's loss be `"higher"`, `"the same"` or
# `"lower"` than the 1-GPU run's?

# %% [markdown] lang="zh" en="d6ca9279a497"
# **先预测。** 看过同样的 960 个样本之后，2-rank 运行的损失会比单 GPU 运行的 `"higher"`（更高）、
# `"the same"`（相同）还是 `"lower"`（更低）？

# %%
prediction = ...
### BEGIN SOLUTION
prediction = "higher"
### END SOLUTION
predict("13.lr-predict", prediction)

# %%
# NBVAL_IGNORE_OUTPUT
run = broken["lr"]
one, two = run.result["one_gpu"], run.result["curve"]
ax = plots.loss_curves({"1 GPU, batch 32": ([32 * (i + 1) for i in range(len(one))], one),
                        "2 ranks, batch 64": ([64 * (i + 1) for i in range(len(two))], two)}, title="Case 11")
ax.set_xlabel("examples seen")
plt.show()
reveal("13.lr-predict", lr_outcome(run))
assert run.symptom and clinic.lr_ratio(run) > 1.3

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
fix = {"lr": 0.2}
### END SOLUTION
check("13.lr-cause", cause)
check("13.lr-fix", fix)

# %% [markdown]
# ## Part D · At scale: the cluster's own failures
#
# Five failures that belong to multi-rank jobs on a cluster, each run for real on 2 gloo ranks. On a GPU cluster
# they look the same, with NCCL in gloo's place (the error texts differ, the causes do not).
#
# ### Case 12 · The last step of an epoch never ends
#
# Data parallelism with DDP, where each rank reads its own shard file of the data set: a common layout when the data
# is stored as files rather than as one indexed set. The process group has a 5 s timeout.

# %% [markdown] lang="zh" en="a32f4c631da2"
# ## D 部分 · 大规模：集群自身的故障
#
# 五个属于集群上多 rank 作业的故障，每个都真实地运行在 2 个 gloo rank 上。在 GPU 集群上它们看起来一样，
# 只是 gloo 换成了 NCCL（报错文本不同，原因相同）。
#
# ### 病例 12 · 一个 epoch 的最后一步永远结束不了
#
# 用 DDP 做数据并行，每个 rank 读取数据集中属于自己的分片文件：当数据以文件形式存储、
# 而不是存成一个可索引的数据集时，这是一种常见的布局。进程组的超时为 5 s。

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("uneven"), end="\n\n")
run = broken["uneven"]
print(*run.lines("step 4/"), *run.lines("epoch done"), run.error_line().split("] ")[-1], sep="\n")
assert run.symptom and any("epoch done after 4 steps" in ln for ln in run.lines("rank 1"))
print("\n" + clinic.causes("uneven"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "b"
fix = {"loop": "with model.join(): for xb, yb in shard"}
### END SOLUTION
check("13.uneven-cause", cause)
check("13.uneven-fix", fix)

# %% [markdown]
# ### Case 13 · DDP stops at its second step
#
# A model with a shared trunk and two heads, one per task, trained with DDP on one of its tasks.

# %% [markdown] lang="zh" en="d3fedae4aeb6"
# ### 病例 13 · DDP 在第二步停住
#
# 一个模型有共享的主干和两个头（每个任务一个），用 DDP 在其中一个任务上训练。

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("unused"), end="\n\n")
run = broken["unused"]
print(*run.lines("step 0 loss"), *(ln.strip()[:160] for ln in run.lines("Expected to have finished")[:1]),
      *(ln for ln in run.lines("Parameter indices") if ln.startswith("[default")), sep="\n")
assert run.symptom and run.lines("Parameter indices")   # DDP names the parameters that got no gradient
print("\n" + clinic.causes("unused"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "d"
fix = {"find_unused_parameters": True}
### END SOLUTION
check("13.unused-cause", cause)
check("13.unused-fix", fix)

# %% [markdown]
# ### Case 14 · A tensor-parallel run whose loss looks right
#
# A model with a tensor-parallel MLP block in the middle (notebook 11's Megatron split) between layers that every rank
# keeps whole. Rank 0 also trains the same model in one process, from the same weights on the same batches: a
# reference every multi-rank layout should be checked against before it is scaled out.

# %% [markdown] lang="zh" en="e2770b4d9ac5"
# ### 病例 14 · 损失看起来没问题的张量并行运行
#
# 一个模型中间有一个张量并行的 MLP 块（notebook 11 的 Megatron 切分方式），前后是每个 rank 都完整保留的层。
# rank 0 还会在单个进程中训练同一个模型，使用相同的权重和相同的批次：这是一个参照，
# 任何多 rank 布局在扩展规模之前都应当先与它对照检查。

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("tp-grad"), end="\n\n")
run = broken["tp-grad"]
print(*run.lines("rank 0 step"), *run.lines("rank 1 step 4"), *run.lines("differ from"), sep="\n")
r = run.result
assert run.symptom and r["loss"][-1] < r["loss"][0] and abs(r["loss"][0] - r["ref_loss"][0]) < 1e-6
print("\n" + clinic.causes("tp-grad"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "a"
fix = {"f_backward": "all_reduce"}
### END SOLUTION
check("13.tp-grad-cause", cause)
check("13.tp-grad-fix", fix)

# %% [markdown]
# ### Case 15 · A job that fails before its first step
#
# A job script copied from another cluster, started on this machine. It exports the settings its collectives used
# there.

# %% [markdown] lang="zh" en="1435e7125e16"
# ### 病例 15 · 第一步之前就失败的作业
#
# 一个从另一个集群复制过来的作业脚本，在本机上启动。它导出了集合通信在原集群上使用的设置。

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("ifname"), end="\n\n")
run = broken["ifname"]
print(*run.lines("SOCKET_IFNAME"), run.error_line().split("] ")[-1], sep="\n")
assert run.symptom and "Unable to find address for: ib0" in run.error
print("\n" + clinic.causes("ifname"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
fix = {"GLOO_SOCKET_IFNAME": "lo"}
### END SOLUTION
check("13.ifname-cause", cause)
check("13.ifname-fix", fix)

# %% [markdown]
# On a GPU cluster the same mistake reads differently. NCCL ignores `GLOO_SOCKET_IFNAME`; a wrong `NCCL_SOCKET_IFNAME`
# fails with "no socket interface found", often only at the first collective. Worse, a job can run on the wrong
# network without any error: with `NCCL_DEBUG=INFO`, the line `Using network IB` (InfiniBand, or RoCE) or `Using
# network Socket` (TCP) says which one NCCL uses between nodes (inside a node, traffic takes NVLink, PCIe or shared
# memory, not the network). A job that should use InfiniBand and says `Socket` runs, slowly. Read that line on the
# first run of every new cluster.
#
# ### Case 16 · A trained model that nobody can load
#
# DeepSpeed ZeRO-3 on 2 ranks (its CPU accelerator here) trains a small model for a few steps. At the end, the
# script exports the weights for a user who has plain PyTorch and the model's class, and that user loads the file.

# %% [markdown] lang="zh" en="1bfc353b79b1"
# 在 GPU 集群上，同样的错误表现不同。NCCL 会忽略 `GLOO_SOCKET_IFNAME`；错误的 `NCCL_SOCKET_IFNAME`
# 会以“no socket interface found”失败，而且往往要到第一次集合通信时才报出。更糟的是，
# 作业可能跑在错误的网络上却没有任何报错：设置 `NCCL_DEBUG=INFO` 后，`Using network IB`（InfiniBand，
# 或 RoCE）或 `Using network Socket`（TCP）这一行会说明 NCCL 在节点之间用的是哪种网络（节点内部的流量
# 走 NVLink、PCIe 或共享内存，不走网络）。一个本应使用 InfiniBand 却显示 `Socket` 的作业照样能跑，只是很慢。
# 在每个新集群上第一次运行时，都要读一下这一行。
#
# ### 病例 16 · 训练好却没人能加载的模型
#
# DeepSpeed ZeRO-3 在 2 个 rank 上（这里用它的 CPU 加速器）把一个小模型训练若干步。最后，
# 脚本为一位只有原生 PyTorch 和模型类定义的用户导出权重，这位用户随后加载该文件。

# %%
# NBVAL_IGNORE_OUTPUT
print(clinic.source("zero3-save"), end="\n\n")
run = broken["zero3-save"]
print(*run.lines("rank 0 step"), *run.lines("exported"), *(ln[:150] for ln in run.lines("load_state_dict")), sep="\n")
assert run.symptom and all(shape == [0] for shape in run.result["shapes"].values())
print("\n" + clinic.causes("zero3-save"))

# %%
cause = ...
fix = ...
### BEGIN SOLUTION
cause = "c"
fix = {"export": "GatheredParameters(...): engine.module.state_dict()"}
### END SOLUTION
check("13.zero3-save-cause", cause)
check("13.zero3-save-fix", fix)

# %% [markdown]
# ## Summary: a checklist
#
# The table to keep, for the cases you have solved (cause and fix both ✓): the symptom, the first thing to look at,
# the cause and the fix. A case you have not solved yet is only listed, so the table never answers for you.

# %% [markdown] lang="zh" en="ec123972d76f"
# ## 小结：检查清单
#
# 这张表值得留着：对你已解决的病例（病因和修复都 ✓），它列出症状、首先要看的地方、病因和修复。
# 尚未解决的病例只会被列为待解决，因此这张表永远不会替你作答。

# %% tags=["workspace-clear"]
print(clinic.checklist())

# %% [markdown]
# - One change at a time, and a measurement that says whether it worked: the clinic's checker does exactly that.
# - Adding a case to the clinic is a row in `labkit.clinic.table.CASES` and a script in `labkit.clinic.cases`.

# %% [markdown] lang="zh" en="0603ab6a7515"
# - 每次只改一处，并用测量结果判断它是否奏效：门诊的检查器做的正是这件事。
# - 给门诊添加一个病例，只需在 `labkit.clinic.table.CASES` 中加一行，并在 `labkit.clinic.cases` 中加一个脚本。
