# %% [markdown]
# # 12 · Working on a cluster
#
# **Objectives**
# - know what a cluster session looks like: login node vs compute nodes, partitions, accounts and quotas,
#   the interconnect, and the storage tiers (home, project, parallel file system, node-local scratch);
# - submit, watch and cancel work with Slurm (`sinfo`, `squeue`, `sbatch --wait`, `salloc`/`srun`, `scancel`);
# - start JupyterLab on a compute node with `slurm/jupyter.sbatch`, read its connection file and open the tunnel;
# - scale the notebooks' training to many GPUs with `slurm/ddp.sbatch` and `slurm/deepspeed.sbatch`,
#   small first and then large, and keep a reproducibility record of every run.
#
# **Prerequisites:** notebook 09 (DDP: ranks, all-reduce, global batch); notebook 10 helps for the DeepSpeed part.
#
# **Estimated time:** 60 min
#
# This notebook runs anywhere. Where a Slurm cluster is reachable from this kernel, the cells in section 4
# run real commands against it; on a laptop they say so and show the command instead. Their stored output
# (from the workbook's own single-node test cluster) is not compared by the tests, because job ids and times
# differ on every run. Every other output is exact.

# %% [markdown] lang="zh" en="3c16c2c608f1"
# # 12 · 在集群上工作
#
# **学习目标**
# - 了解一次集群会话是什么样子：登录节点与计算节点，分区、账户与配额，互连网络，以及各个存储层级（home、project、
#   并行文件系统、节点本地临时盘）；
# - 用 Slurm 提交、查看和取消作业（`sinfo`、`squeue`、`sbatch --wait`、`salloc`/`srun`、`scancel`）；
# - 用 `slurm/jupyter.sbatch` 在计算节点上启动 JupyterLab，读取它的连接文件，并建立 ssh 隧道；
# - 用 `slurm/ddp.sbatch` 和 `slurm/deepspeed.sbatch` 把各 notebook 中的训练扩展到多个 GPU，先小规模、再大规模，
#   并为每次运行保留一份可复现性记录。
#
# **前置知识：** notebook 09（DDP：进程编号（rank）、全归约、全局批大小）；DeepSpeed 部分可参考 notebook 10。
#
# **预计用时：** 60 分钟
#
# 本 notebook 在任何地方都能运行。如果本内核能访问到 Slurm 集群，第 4 节的单元格会对它执行真实的命令；在笔记本电脑上，
# 这些单元格会说明这一点，并改为显示命令本身。它们保存的输出（来自本练习册自带的单节点测试集群）不参与测试比对，
# 因为作业编号和时间每次运行都不一样。其余所有输出都是精确的。

# %%
# %matplotlib inline
# %load_ext labkit
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from labkit import env
from labkit.check import check, predict, reveal
from labkit.exercises.nb12 import (
    CONNECTION,
    JOB,
    LATE_SCRIPT,
    PROBLEMS,
    STORAGE_ITEMS,
    STORAGE_TIERS,
    TRANSCRIPT,
)
from labkit.slurm import gpus_per_node, parse_sbatch_header, time_minutes

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "slurm" / "jupyter.sbatch").is_file())
SLURM_DIR = ROOT / "slurm"

# %% [markdown]
# ## 1. What a cluster session looks like
#
# ```
#  your laptop ──ssh──▶ login node ──(Slurm)──▶ compute nodes (CPUs, GPUs, node-local SSD)
#                       edit, build,             the real work: training, notebooks,
#                       submit jobs              benchmarks; reached only through a job
#                          │                         │
#                          └──── shared file systems: home, project, parallel scratch ───┘
# ```
#
# - The **login node** is shared by everyone who is logged in. Use it to edit, install, `git pull` and
#   submit jobs. **Never train or run notebooks there.** One person's training slows everyone down, and
#   sites kill such processes.
# - **Compute nodes** are handed out by the scheduler (Slurm) as *jobs*: you ask for resources (nodes,
#   CPUs, GPUs, memory, time), wait in a queue, and get them for yourself until the time limit.
# - A **batch job** (`sbatch script`) runs unattended. An **interactive job** (`salloc`, `srun --pty bash`)
#   gives you a shell on a compute node. JupyterLab on a compute node is a batch job that serves notebooks:
#   `slurm/jupyter.sbatch`.
#
# Where is this kernel running? Inside a Slurm job, Slurm sets `SLURM_JOB_ID` and friends:

# %% [markdown] lang="zh" en="51cc3a952c32"
# ## 1. 一次集群会话是什么样子
#
# ```
#  your laptop ──ssh──▶ login node ──(Slurm)──▶ compute nodes (CPUs, GPUs, node-local SSD)
#                       edit, build,             the real work: training, notebooks,
#                       submit jobs              benchmarks; reached only through a job
#                          │                         │
#                          └──── shared file systems: home, project, parallel scratch ───┘
# ```
#
# - **登录节点**由所有已登录的用户共享。用它来编辑代码、安装软件、`git pull` 和提交作业。**绝不要在登录节点上训练模型或
#   运行 notebook**。一个人的训练会拖慢所有人，集群管理方也会直接杀掉这类进程。
# - **计算节点**由调度器（Slurm）以*作业*的形式分配：你申请资源（节点、CPU、GPU、内存、时间），在队列中等待，
#   分到之后，在时间上限到达之前这些资源都归你独占。
# - **批处理作业**（`sbatch script`）无人值守地运行。**交互式作业**（`salloc`、`srun --pty bash`）在计算节点上给你
#   一个 shell。计算节点上的 JupyterLab 就是一个提供 notebook 服务的批处理作业：`slurm/jupyter.sbatch`。
#
# 本内核运行在哪里？在 Slurm 作业内部，Slurm 会设置 `SLURM_JOB_ID` 等一系列环境变量：

# %%
# NBVAL_IGNORE_OUTPUT
in_job = "SLURM_JOB_ID" in os.environ
print("inside a Slurm job:", in_job)
if in_job:
    print({k: os.environ.get(k) for k in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_PARTITION",
                                          "SLURM_CPUS_ON_NODE", "SLURM_GPUS_ON_NODE", "SLURM_TMPDIR")})

# %% [markdown]
# ## 2. Slurm in five words: partitions, accounts, QOS, jobs, steps
#
# | concept | what it is | how you meet it |
# |---|---|---|
# | **partition** | a queue of similar nodes (`cpu`, `gpu`, `debug`, `long`) with its own limits | `sinfo`; `sbatch -p gpu` |
# | **account** | whose allocation pays (a project); usage is charged in core-hours or GPU-hours | `sbatch -A proj123`; `sshare` |
# | **QOS / limits** | caps per user or account: GPUs at once, jobs queued, maximum wall time | a job stuck in `PD` with reason `QOSMaxGRESPerUser` |
# | **quota** | storage limits per file system (bytes *and* number of files) | a "Disk quota exceeded" in the middle of a run |
# | **job** | one allocation: nodes × (tasks, CPUs per task, GPUs) for up to `--time` | `sbatch`, `salloc`; `squeue` |
# | **step** | a launch inside a job: `srun` starts tasks on the allocated nodes | `srun torchrun ...` in `ddp.sbatch` |
# | **task** | one process that srun starts; with DDP, usually one per GPU or one launcher per node | `--ntasks-per-node` |
#
# A job asks for resources with `#SBATCH` lines at the top of its script.
#
# **Predict, then run.** How much time (in minutes) and how many GPUs per node does sbatch give this script? Record
# a pair such as `(60, 2)`, with `None` for no GPU.

# %% [markdown] lang="zh" en="481d7f31afbc"
# ## 2. 用五个词说清 Slurm：分区、账户、QOS、作业、作业步
#
# | 概念 | 是什么 | 在哪里会碰到 |
# |---|---|---|
# | **分区**（partition） | 一组同类节点组成的队列（`cpu`、`gpu`、`debug`、`long`），有各自的限制 | `sinfo`；`sbatch -p gpu` |
# | **账户**（account） | 由谁的机时额度付费（一个项目）；用量按核时或 GPU 卡时计费 | `sbatch -A proj123`；`sshare` |
# | **QOS / 限制** | 按用户或账户设定的上限：同时使用的 GPU 数、排队的作业数、最长运行时间 | 作业卡在 `PD` 状态，原因为 `QOSMaxGRESPerUser` |
# | **配额**（quota） | 每个文件系统上的存储限制（字节数*和*文件数） | 运行到一半时报出“Disk quota exceeded” |
# | **作业**（job） | 一次资源分配：节点数 ×（任务数、每个任务的 CPU 数、GPU 数），最长持续 `--time` | `sbatch`、`salloc`；`squeue` |
# | **作业步**（step） | 作业内部的一次启动：`srun` 在已分配的节点上启动任务 | `ddp.sbatch` 中的 `srun torchrun ...` |
# | **任务**（task） | srun 启动的一个进程；用 DDP 时，通常每个 GPU 一个，或者每个节点一个启动器 | `--ntasks-per-node` |
#
# 作业在脚本开头用 `#SBATCH` 行申请资源。
#
# **先预测，再运行。** sbatch 会给这个脚本多少时间（以分钟计）、每个节点多少个 GPU？记录一个形如 `(60, 2)` 的
# 二元组，没有 GPU 时写 `None`。

# %%
print(LATE_SCRIPT)
prediction = ...
### BEGIN SOLUTION
prediction = (30, None)
### END SOLUTION
predict("12.late-sbatch", prediction)

# %% [markdown]
# `labkit.slurm.parse_sbatch_header` reads the header as sbatch does (it is tested against the real sbatch):

# %% [markdown] lang="zh" en="947d2d49a6de"
# `labkit.slurm.parse_sbatch_header` 按 sbatch 的方式读取脚本头部（它经过与真实 sbatch 的对照测试）：

# %% tags=["workspace-clear"]
late = parse_sbatch_header(LATE_SCRIPT)
print(late)
reveal("12.late-sbatch", (time_minutes(late["time"]), gpus_per_node(late)))

# %% [markdown]
# sbatch reads `#SBATCH` lines **only until the first command**; an `#SBATCH` line after that is an ordinary comment.
# Options on the command line override the script's lines.

# %% [markdown] lang="zh" en="6b64c14d3b91"
# sbatch **只读取第一条命令之前的** `#SBATCH` 行；第一条命令之后的 `#SBATCH` 行只是普通注释。
# 命令行上的选项会覆盖脚本中的这些行。

# %%
assert late == {"job-name": "train", "time": "00:30:00"}

# %% [markdown]
# Here is what the workbook's three scripts ask for:

# %% [markdown] lang="zh" en="caeda3ae7994"
# 下面是本练习册的三个脚本各自申请的资源：

# %%
for name in ("jupyter.sbatch", "ddp.sbatch", "deepspeed.sbatch"):
    opts = parse_sbatch_header((SLURM_DIR / name).read_text())
    print(f"{name:17s}", "  ".join(f"--{k}={v}" for k, v in opts.items()))
    assert "account" not in opts and "partition" not in opts  # site specific: give them on the command line
    assert re.fullmatch(r"B:(TERM|USR1)@\d+", opts["signal"])  # a warning signal to the script before the limit

# %% [markdown]
# `--signal=B:TERM@120` asks Slurm to send SIGTERM to the batch script two minutes before the time limit.
# That is how `jupyter.sbatch` gets time to stop JupyterLab cleanly, without leaving processes behind. The
# training scripts ask for `USR1` instead: `ddp.sbatch` then asks its ranks to write a checkpoint at the end of the
# current step and exit cleanly, and requeues the job (with `LABKIT_REQUEUE=1`) or prints how to resume; `scancel`
# (TERM) still stops a run at once.
#
# ## 3. The hardware underneath: interconnect and storage tiers
#
# **Interconnect.** GPUs in one node talk over NVLink/NVSwitch, hundreds of GB/s. Nodes talk over the
# cluster network: InfiniBand, RoCE or Slingshot at 100-400 Gb/s per port, or plain Ethernet on smaller
# sites. DDP all-reduces every gradient every step. Notebook 09's ring all-reduce moves 2(n-1)/n times the
# gradient bytes over the slowest link, so the network sets a floor on the step time. Here it is for 1 GB
# of gradients, at the *nominal* line rates (real throughput is lower):

# %% [markdown] lang="zh" en="27e24f31e33a"
# `--signal=B:TERM@120` 让 Slurm 在时间上限到达前两分钟向批处理脚本发送 SIGTERM。`jupyter.sbatch` 正是靠这段时间
# 干净地停止 JupyterLab，不留下残余进程。
# 训练用的批处理脚本申请的则是 `USR1`：收到它后，`ddp.sbatch` 让各个 rank 在当前这一步
# 结束时写入检查点并正常退出，然后把作业重新排队（设置了 `LABKIT_REQUEUE=1` 时），或者打印恢复训练的方法；
# `scancel`（TERM）仍然会立即停止运行。
#
# ## 3. 底层硬件：互连网络与存储层级
#
# **互连网络。** 同一节点内的 GPU 通过 NVLink/NVSwitch 通信，带宽达数百 GB/s。节点之间通过集群网络通信：
# InfiniBand、RoCE 或 Slingshot，每个端口 100-400 Gb/s；规模较小的集群则用普通以太网。DDP 每一步都要对每个梯度
# 做全归约。notebook 09 的环形全归约要在最慢的链路上传输梯度字节数的 2(n-1)/n 倍，所以网络给每步时间设了一个下限。
# 下面是 1 GB 梯度在*标称*线速下的下限（实际吞吐量会更低）：

# %%
GRAD_BYTES = 1e9  # e.g. 250 M parameters of fp32 gradients
links = {"25 GbE": 25, "100 Gb/s (EDR IB)": 100, "200 Gb/s (HDR IB)": 200, "400 Gb/s (NDR IB)": 400}
for n in (2, 16):
    for name, gbit in links.items():
        t = 2 * (n - 1) / n * GRAD_BYTES / (gbit / 8 * 1e9)
        print(f"{n:2d} ranks, {name:18s}: all-reduce >= {t * 1e3:6.0f} ms per step")
print("per rank, a ring all-reduce moves 2(n-1)/n of the bytes: never more than twice, however many ranks")

# %% [markdown]
# **Storage tiers.** Every cluster has roughly these, with different names:
#
# | tier | typical path | size, speed | backed up | use it for |
# |---|---|---|---|---|
# | home | `$HOME` | small (tens of GB), NFS, slow for many small files | usually | code, configs, small results |
# | project | `/project/<account>` | TBs per group, NFS or parallel FS | sometimes | shared environments, data sets, checkpoints to keep |
# | parallel FS (scratch) | `/scratch/$USER` (Lustre, GPFS, BeeGFS) | PBs, fast for **large** files | **no, and purged** after N days | training data, checkpoints during a run |
# | node-local | `$SLURM_TMPDIR`, `$TMPDIR`, `/tmp` (SSD or RAM) | hundreds of GB, fastest | no; **deleted when the job ends** | unpacked data, caches, SQLite files, compile caches |
#
# Two consequences show up in the workbook's scripts. Many small files (a Python environment, an
# unpacked data set) are slow on a parallel file system: pack them or copy them to node-local storage at
# the start of a job. SQLite locking does not work reliably on NFS, and IPython keeps its history in
# SQLite, so `jupyter.sbatch` puts `IPYTHONDIR` and `JUPYTER_RUNTIME_DIR` on node-local storage:

# %% [markdown] lang="zh" en="b254d3579aa4"
# **存储层级。** 每个集群大致都有下面这几层，只是名字各不相同：
#
# | 层级 | 典型路径 | 容量与速度 | 是否备份 | 用途 |
# |---|---|---|---|---|
# | home | `$HOME` | 小（几十 GB），NFS，读写大量小文件时很慢 | 通常备份 | 代码、配置、小型结果 |
# | project | `/project/<account>` | 每个课题组若干 TB，NFS 或并行文件系统 | 有时备份 | 共享的环境、数据集、需要长期保留的检查点 |
# | 并行文件系统（scratch） | `/scratch/$USER`（Lustre、GPFS、BeeGFS） | PB 级，读写**大**文件很快 | **不备份，且会被清理**（超过 N 天） | 训练数据、运行期间的检查点 |
# | 节点本地（node-local） | `$SLURM_TMPDIR`、`$TMPDIR`、`/tmp`（SSD 或内存） | 数百 GB，最快 | 不备份；**作业结束即删除** | 解压后的数据、缓存、SQLite 文件、编译缓存 |
#
# 由此带来的两个后果，在本练习册的脚本中都能看到。大量小文件（一个 Python 环境、一个解压后的数据集）在并行文件系统上
# 很慢：应当把它们打包，或者在作业开始时复制到节点本地存储上。SQLite 的文件锁在 NFS 上并不可靠，而 IPython 把历史
# 记录存在 SQLite 里，所以 `jupyter.sbatch` 把 `IPYTHONDIR` 和 `JUPYTER_RUNTIME_DIR` 放在节点本地存储上：

# %%
jupyter_text = (SLURM_DIR / "jupyter.sbatch").read_text()
for line in jupyter_text.splitlines():
    if re.match(r"\s*(local_base=|export (JUPYTER_RUNTIME_DIR|IPYTHONDIR)=)", line):
        print(line.strip())
assert "SLURM_TMPDIR" in jupyter_text and "export IPYTHONDIR=" in jupyter_text

# %% [markdown]
# ## 4. Slurm, for real (when a cluster is reachable)
#
# The commands you will type most: `sinfo` (what exists and what is free), `squeue --me` (your jobs),
# `sbatch` (submit a script), `salloc`/`srun` (interactive work and job steps), `scancel` (stop), and
# `sacct -j ID` (what a finished job used, where the site keeps accounting).
#
# The next cell asks whether this kernel can reach a Slurm controller. Each later cell then either runs
# its command or shows it. If your site needs an account or partition for every job, set `SBATCH_ACCOUNT`
# and `SBATCH_PARTITION` (and `SALLOC_...`) in the environment before starting JupyterLab: sbatch reads
# them like `-A` and `-p`.

# %% [markdown] lang="zh" en="8493f0af3691"
# ## 4. 真正动手用 Slurm（当集群可访问时）
#
# 最常用的命令：`sinfo`（有哪些资源、哪些空闲），`squeue --me`（你的作业），`sbatch`（提交脚本），`salloc`/`srun`
# （交互式工作和作业步），`scancel`（停止），以及 `sacct -j ID`（已结束的作业用了多少资源，前提是集群开启了作业记账）。
#
# 下一个单元格检查本内核能否连上 Slurm 控制器。之后的每个单元格要么执行自己的命令，要么只把命令显示出来。如果你所在的
# 集群要求每个作业都指定账户或分区，请在启动 JupyterLab 之前，在环境变量中设置 `SBATCH_ACCOUNT` 和 `SBATCH_PARTITION`
# （以及 `SALLOC_...`）：sbatch 读取它们的效果与 `-A` 和 `-p` 相同。

# %%
def run(*cmd: str, env_: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Show a command, run it, print its output; never raise on a non-zero exit."""
    print("$", shlex.join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env_)
    print((r.stdout + r.stderr).rstrip())
    return r

def wait_state(job: str, state: str, timeout: float = 30) -> None:
    """Wait until squeue shows the job in ``state`` (e.g. "R"), or "" for: gone from the queue."""
    deadline = time.monotonic() + timeout
    while subprocess.run(["squeue", "-h", "-j", job, "-o", "%t"], capture_output=True, text=True).stdout.strip() != state:
        assert time.monotonic() < deadline, f"job {job} did not reach state {state!r} in {timeout} s"
        time.sleep(0.2)

def slurm_reachable() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=15).returncode == 0
    except subprocess.TimeoutExpired:
        return False

# %%
# NBVAL_IGNORE_OUTPUT
SLURM = slurm_reachable()
print("Slurm reachable from this kernel:", SLURM)
if SLURM:
    run("sinfo")
    run("sinfo", "-N", "-o", "%N %c %m %G %T")  # per node: CPUs, memory (MB), GPUs (gres), state
else:
    print("No Slurm here (no sinfo, or no controller answers). On a cluster you would run:\n"
          "  sinfo                              partitions, their nodes and states\n"
          "  sinfo -N -o '%N %c %m %G %T'       per node: CPUs, memory, GPUs, state")

# %% [markdown]
# Jobs started from *inside* a job (JupyterLab on a compute node is one) inherit its `SLURM_*` variables,
# and a new job's `srun` may then take the *old* job's `SLURM_CPUS_PER_TASK`. Submit with a clean
# environment:

# %% [markdown] lang="zh" en="09104639fc08"
# 从作业*内部*启动的作业（计算节点上的 JupyterLab 就属于这种情况）会继承外层作业的 `SLURM_*` 变量，新作业的 `srun`
# 于是可能用上*旧*作业的 `SLURM_CPUS_PER_TASK`。提交时请使用干净的环境：

# %%
clean_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_"))
             or k in ("SLURM_CONF", "SBATCH_ACCOUNT", "SBATCH_PARTITION", "SALLOC_ACCOUNT", "SALLOC_PARTITION")}
work = Path(tempfile.mkdtemp(prefix="labkit-nb12-"))
hello = work / "hello.sbatch"
hello.write_text("""#!/bin/bash
#SBATCH --job-name=labkit-hello
#SBATCH --ntasks=2
#SBATCH --time=00:02:00
echo "batch script on $(hostname): job $SLURM_JOB_ID with $SLURM_NTASKS tasks"
srun bash -c 'echo "task $SLURM_PROCID of $SLURM_NTASKS on $(hostname)"'
""")
print(parse_sbatch_header(hello.read_text()))

# %% [markdown]
# `sbatch --wait` submits the job, waits until it ends, and returns its exit status, which makes it
# usable in scripts and tests. Without `--wait`, sbatch prints the job id and returns at once.

# %% [markdown] lang="zh" en="2777684253cb"
# `sbatch --wait` 提交作业，等到它结束，再返回它的退出状态，因此可以用在脚本和测试中。不加 `--wait` 时，sbatch
# 打印作业编号后立即返回。

# %%
# NBVAL_IGNORE_OUTPUT
if SLURM:
    r = run("sbatch", "--wait", f"--output={work}/hello-%j.out", str(hello), env_=clean_env)
    assert r.returncode == 0, "sbatch failed: does your site need SBATCH_ACCOUNT / SBATCH_PARTITION?"
    (out,) = work.glob("hello-*.out")
    print(out.read_text())
    assert "task 1 of 2" in out.read_text()
else:
    print(f"No Slurm here. On a cluster: sbatch --wait --output=hello-%j.out {hello.name}")

# %% [markdown]
# `salloc` asks for an allocation and runs a command in it (by default a shell, which makes it
# interactive). `srun` inside it starts a **step**: one process per task on the allocated nodes.

# %% [markdown] lang="zh" en="4111b3a37691"
# `salloc` 申请一次资源分配，并在其中运行一条命令（默认是一个 shell，因此是交互式的）。在其中运行的 `srun`
# 会启动一个**作业步**：在已分配的节点上，每个任务启动一个进程。

# %%
# NBVAL_IGNORE_OUTPUT
if SLURM:
    r = run("salloc", "-n", "2", "--time=00:02:00", "srun", "bash", "-c", "echo task $SLURM_PROCID on $(hostname)",
            env_=clean_env)
    assert r.returncode == 0 and "task 1 on" in r.stdout
else:
    print("No Slurm here. On a cluster: salloc -n 2 --time=00:30:00   (then, in the shell it opens: srun hostname)")

# %% [markdown]
# `squeue` shows waiting (`PD`) and running (`R`) jobs, with the reason a job waits. `scancel` sends the
# job's processes SIGTERM, then SIGKILL after the site's grace period.

# %% [markdown] lang="zh" en="03ed21656cc0"
# `squeue` 显示等待中（`PD`）和运行中（`R`）的作业，以及作业等待的原因。`scancel` 先向作业的进程发送 SIGTERM，
# 超过集群设定的宽限期后再发送 SIGKILL。

# %%
# NBVAL_IGNORE_OUTPUT
if SLURM:
    job = run("sbatch", "--parsable", "--output=/dev/null", "--time=00:05:00", "--wrap", "sleep 300",
              env_=clean_env).stdout.strip().split(";")[0]
    wait_state(job, "R")
    run("squeue", "-j", job, "-o", "%.8i %.12j %.2t %.10M %R")
    run("scancel", job)
    wait_state(job, "")
    run("squeue", "-j", job)
    print(f"job {job} is gone from the queue")
else:
    print("No Slurm here. On a cluster: squeue --me;  scancel <jobid>;  sacct -j <jobid>")

# %%
shutil.rmtree(work, ignore_errors=True)

# %% [markdown]
# ## 5. JupyterLab on a compute node: `slurm/jupyter.sbatch`
#
# ```bash
# sbatch slurm/jupyter.sbatch                          # from the workbook's root
# sbatch -p gpu -A proj123 --gpus=1 slurm/jupyter.sbatch
# ```
#
# Once the job runs, the script:
#
# 1. picks a **random free port**. A fixed port such as 8888 collides when two people's jobs share a node,
#    and JupyterLab's `--port-retries` handles a race;
# 2. generates a **token** and passes it in the environment, never on the command line, where `ps` shows
#    it to everyone on the node;
# 3. binds to the **node's hostname**, not `0.0.0.0`: one interface, but any host that routes to it can connect,
#    so the token is what keeps others out;
# 4. writes a **connection file** `~/.labkit/jupyter/jupyter-<jobid>.json` with mode **0600**, and prints
#    the tunnel command, but not the token, into the job output (often readable by others);
# 5. on the walltime signal and on `scancel`, stops JupyterLab and its kernels, removes the file, and
#    leaves no process behind.
#
# Its environment comes from one place, `slurm/env.sh`. Every setting there is `${VAR:-default}`, so you
# set them when you submit instead of editing files:

# %% [markdown] lang="zh" en="e73a0b75ca20"
# ## 5. 在计算节点上运行 JupyterLab：`slurm/jupyter.sbatch`
#
# ```bash
# sbatch slurm/jupyter.sbatch                          # 在练习册的根目录下运行
# sbatch -p gpu -A proj123 --gpus=1 slurm/jupyter.sbatch
# ```
#
# 作业开始运行后，这个脚本会：
#
# 1. 选一个**随机的空闲端口**。固定端口（如 8888）在两个人的作业共用同一节点时会冲突；万一出现抢占端口的竞争，
#    JupyterLab 的 `--port-retries` 会处理；
# 2. 生成一个**令牌**（token），通过环境变量传递，绝不放在命令行上，因为 `ps` 会把命令行展示给节点上的所有人；
# 3. 绑定到**节点的主机名**，而不是 `0.0.0.0`：只监听一个网络接口，但任何能路由到该接口的主机都能连上，
#    所以真正把别人挡在门外的是令牌；
# 4. 写入一个**连接文件** `~/.labkit/jupyter/jupyter-<jobid>.json`，权限为 **0600**，并把隧道命令（但不含令牌）
#    打印到作业输出中（作业输出往往别人也能读到）；
# 5. 在收到时限信号或 `scancel` 时，停止 JupyterLab 及其内核，删除连接文件，不留下任何进程。
#
# 它的环境只来自一个地方：`slurm/env.sh`。那里的每个设置都写成 `${VAR:-default}` 的形式，所以你可以在提交时设置它们，
# 而不必修改文件：

# %%
settings = re.findall(r'^# (.*)\n(LABKIT_\w+)="\$\{\2:-(.*)\}"', (SLURM_DIR / "env.sh").read_text(), re.M)
for comment, name, default in settings:
    print(f"{name:17s} {default or '(empty)':7s} {comment}")
assert {name for _, name, _ in settings} >= {"LABKIT_ENV", "LABKIT_VENV", "LABKIT_CONDA_ENV", "LABKIT_MODULES"}
assert "JUPYTER_TOKEN" in jupyter_text and "token=" not in jupyter_text.split("jupyter lab ")[1].split("&")[0]

# %% [markdown]
# A connection file looks like this (an example with the same fields, written here with the same care:
# created with mode 0600 *before* anything secret goes in):

# %% [markdown] lang="zh" en="ceb7124a4217"
# 连接文件的样子如下（这是一个字段相同的示例，在这里同样小心地写入：在写入任何机密内容*之前*，就以 0600 权限创建文件）：

# %%
def write_connection(path: Path, info: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f, indent=1)

def read_connection(path: Path) -> dict:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise PermissionError(f"{path} is readable by others (mode {oct(mode)}): the token may have leaked")
    return json.loads(path.read_text())

# %%
c = {"node": "gpu017", "port": 24817, "user": "alice", "login": "login.hpc.example"}  # the exercises use another job
example = {"job_id": "123456", "node": c["node"], "port": c["port"], "token": "<48 hex digits>",
           "url": f"http://localhost:{c['port']}/lab?token=<48 hex digits>", "user": c["user"], "login": c["login"]}
conn = Path(tempfile.mkdtemp()) / "jupyter-123456.json"
write_connection(conn, example)
info = read_connection(conn)
print(f"mode {oct(stat.S_IMODE(conn.stat().st_mode))}\n" + json.dumps(info, indent=1))
shutil.rmtree(conn.parent)

# %% [markdown]
# To reach it, run on **your laptop** an ssh tunnel through the login node to the compute node:
#
# ```bash
# ssh -N -L 24817:gpu017:24817 alice@login.hpc.example
# ```
#
# and open `http://localhost:24817/lab?token=...`. `-L local_port:host:port` means "connections to
# local_port on my laptop go through the ssh connection, and **the far end** connects to host:port". The
# far end is the login node, which can reach `gpu017`. `-N` runs no remote shell, just the tunnel.
# A round-robin login alias (`login` is sometimes `login1`, sometimes `login2`) does not matter: every login
# node connects to the same `gpu017:24817`. If ssh says "channel open failed", the login node could not connect
# there: the job has ended, a firewall sits between login and compute nodes, or `gpu017` resolves on the login
# node to an interface JupyterLab is not bound to. Where sites allow ssh to a node with your job, the job output
# also prints a variant that jumps through the login node: `ssh -N -J alice@login.hpc.example -L
# 24817:gpu017:24817 alice@gpu017`.
#
# Your own connection files, if this machine has any:

# %% [markdown] lang="zh" en="b1e9ca132f73"
# 要访问它，请在**你的笔记本电脑上**运行一条 ssh 隧道，经由登录节点通往计算节点：
#
# ```bash
# ssh -N -L 24817:gpu017:24817 alice@login.hpc.example
# ```
#
# 然后打开 `http://localhost:24817/lab?token=...`。`-L local_port:host:port` 的意思是：“连到我笔记本电脑上 local_port
# 的连接经由这条 ssh 连接转发，由**远端**去连接 host:port”。这里的远端是登录节点，它能访问 `gpu017`。`-N` 表示
# 不运行远程 shell，只建立隧道。登录节点采用轮询别名（`login` 有时指向 `login1`，有时指向 `login2`）也没有关系：
# 每个登录节点连接的都是同一个 `gpu017:24817`。如果 ssh 报出“channel open failed”，说明登录节点连不上那里：
# 可能是作业已经结束，可能是登录节点与计算节点之间隔着防火墙，也可能是 `gpu017` 在登录节点上解析到的网络接口
# 并不是 JupyterLab 绑定的那个。如果集群允许 ssh 登录到运行着你的作业的节点，作业输出还会打印一个经由登录节点跳转的版本：
# `ssh -N -J alice@login.hpc.example -L 24817:gpu017:24817 alice@gpu017`。
#
# 本机上如果有你自己的连接文件，会列在下面：

# %%
# NBVAL_IGNORE_OUTPUT
mine = sorted((Path.home() / ".labkit" / "jupyter").glob("jupyter-*.json"))
for path in mine:
    i = read_connection(path)
    print(f"job {i['job_id']} on {i['node']}:{i['port']}  tunnel: {i.get('tunnel', '-')}")
print(f"{len(mine)} connection file(s) in ~/.labkit/jupyter")

# %% [markdown]
# **VS Code** is an alternative to the browser: Remote-SSH to the login node, then connect the notebook to
# the *existing Jupyter server* at the `url` of the connection file, with the tunnel running. Sites with
# **Open OnDemand** offer the same thing as a web form. `slurm/README.md` covers both, and the usual
# errors ("channel open failed", a local port already in use, a job pending on resources).
#
# The workbook's tests submit `jupyter.sbatch` to a real single-node Slurm. They check that the connection
# file appears with mode 0600, that the server answers with the token and refuses without it, that a
# second job on the same node gets another port, and that `scancel` leaves no process behind.

# %% [markdown] lang="zh" en="d7812b6a0124"
# 除了浏览器，也可以用 **VS Code**：通过 Remote-SSH 连接登录节点，然后在隧道运行的情况下，把 notebook 连接到连接文件中
# `url` 所指的*现有 Jupyter 服务器*。提供 **Open OnDemand** 的集群以网页表单的形式提供同样的功能。`slurm/README.md`
# 介绍了这两种方式，以及常见的错误（“channel open failed”、本地端口已被占用、作业因等待资源而一直排队）。
#
# 本练习册的测试会把 `jupyter.sbatch` 提交到一个真实的单节点 Slurm 上。测试检查：连接文件出现且权限为 0600；
# 服务器带令牌时应答、不带令牌时拒绝；同一节点上的第二个作业拿到另一个端口；`scancel` 之后不留下任何进程。

# %% [markdown]
# ## 6. Training jobs: `ddp.sbatch` and `deepspeed.sbatch`
#
# ```bash
# sbatch slurm/ddp.sbatch --steps 50                      # 1 node, 2 CPU ranks (gloo): a smoke test
# sbatch -p gpu -N 2 --ntasks-per-node=4 --gpus-per-node=4 --cpus-per-task=8 \
#        slurm/ddp.sbatch --model gpt --precision bf16   # 2 nodes x 4 GPUs (NCCL)
# ZERO_CONFIG=zero2-bf16 sbatch slurm/deepspeed.sbatch
# ```
#
# They run the same `labkit.recipes` modules as notebooks 09 and 10. The batch script runs on the job's
# first node, and there it
#
# - takes `MASTER_ADDR` from the first host in `$SLURM_JOB_NODELIST` and picks a free `MASTER_PORT`;
# - starts **one torchrun per node** (`srun --ntasks-per-node=1`). Each torchrun starts one rank per GPU
#   Slurm gave the node (`SLURM_GPUS_ON_NODE`), or one per task when no GPU is usable, and then the
#   recipe's device gate picks gloo;
# - passes everything after the script name to the recipe.
#
# The ranks and the global batch follow from the Slurm options and the recipe's flags:

# %% [markdown] lang="zh" en="72cd19dddcb5"
# ## 6. 训练作业：`ddp.sbatch` 与 `deepspeed.sbatch`
#
# ```bash
# sbatch slurm/ddp.sbatch --steps 50                      # 1 个节点、2 个 CPU rank（gloo）：冒烟测试
# sbatch -p gpu -N 2 --ntasks-per-node=4 --gpus-per-node=4 --cpus-per-task=8 \
#        slurm/ddp.sbatch --model gpt --precision bf16   # 2 个节点 × 4 块 GPU（NCCL）
# ZERO_CONFIG=zero2-bf16 sbatch slurm/deepspeed.sbatch
# ```
#
# 它们运行的是与 notebook 09 和 10 相同的 `labkit.recipes` 模块。批处理脚本在作业的第一个节点上运行，它在那里：
#
# - 从 `$SLURM_JOB_NODELIST` 的第一个主机得到 `MASTER_ADDR`，并选一个空闲的 `MASTER_PORT`；
# - **每个节点启动一个 torchrun**（`srun --ntasks-per-node=1`）。每个 torchrun 为 Slurm 分给该节点的每个 GPU
#   启动一个 rank（`SLURM_GPUS_ON_NODE`）；没有可用的 GPU 时，则每个任务启动一个 rank，这时训练脚本的设备检查
#   会选用 gloo；
# - 把 sbatch 脚本名之后的所有参数原样传给训练脚本。
#
# rank 数和全局批大小由 Slurm 选项和训练脚本的参数共同决定：

# %%
def launch_geometry(nodes: int, ranks_per_node: int, batch: int, accum: int = 1) -> dict:
    world = nodes * ranks_per_node
    return {"world_size": world, "global_batch": batch * world * accum}

g = launch_geometry(nodes=2, ranks_per_node=4, batch=16, accum=1)
print(g)
assert g == {"world_size": 8, "global_batch": 128}

# %% [markdown]
# ## 7. Small first, then large
#
# A 64-GPU job that crashes after 40 minutes in the queue, on a typo, costs a day. Before every large run:
#
# 1. **Run it small, here or in `debug`**: the same script with 1 node, 2 ranks and `--steps 5`. It should
#    exit 0 with equal checksums on all ranks (`sbatch --wait` returns the exit status).
# 2. **Check the geometry**: world size, global batch and learning rate as you meant them (section 6).
# 3. **Check the memory**: the model state per rank from notebooks 06 and 10, plus activations, with margin.
# 4. **Check the time**: steps needed ÷ the steps/s of the small run < `--time`, with checkpoints more often
#    than the time you can afford to lose, and resume tested (notebook 09).
# 5. **Check storage**: data on the parallel FS or copied to node-local storage; outputs where the quota
#    allows; nothing heavy in `$HOME`.
# 6. **Then scale in steps** (1 → 2 → 8 nodes), comparing throughput to the ideal, and stop where the
#    efficiency drops.
#
# ### The beginner's checklist
#
# The whole workbook, as questions to ask of any training job:
#
# - **Environment** (00): does `python -m labkit doctor` on the *compute node* show the GPU, CUDA, NCCL and the
#   dtypes you expect?
# - **Precision** (01-05): bf16 where the hardware has it, else fp16 *with* a GradScaler; fp32 master weights;
#   clip after `unscale_`; softmax/normalisation in fp32; watch the loss scale and the skipped steps.
# - **NaNs** (03): find the first module that produced one before changing the learning rate.
# - **Memory** (06, 10): predict model states (16-20 bytes/parameter with Adam) and activations before you
#   run; if it does not fit, accumulation and checkpointing first, then ZeRO, then offload.
# - **Speed** (07, 08): profile before you optimise; fuse or compile the hot elementwise chains; know your MFU.
# - **Scale** (09-11): global batch = per-rank batch × ranks × accumulation; checksums equal across ranks;
#   timeouts set; checkpoints written atomically and resume tested; small first, then large.
#
# ## 8. A reproducibility record
#
# Every result should carry what made it: code version, data, environment, seed, hardware. Most of it
# comes from `labkit.env.report()` (the same report as `python -m labkit doctor`):

# %% [markdown] lang="zh" en="8d8611ae4f50"
# ## 7. 先小后大
#
# 一个 64 GPU 的作业在队列里等了 40 分钟，开跑后却因为一个拼写错误而崩溃，这会浪费一整天。每次大规模运行之前：
#
# 1. **先小规模运行，在这里或在 `debug` 分区**：同一个脚本，1 个节点、2 个 rank、`--steps 5`。它应当以 0 退出，
#    且所有 rank 上的校验和相同（`sbatch --wait` 会返回退出状态）。
# 2. **检查启动配置**：进程总数、全局批大小和学习率是否符合你的本意（第 6 节）。
# 3. **检查显存**：按 notebook 06 和 10 估算每个 rank 的模型状态，加上激活值，并留出余量。
# 4. **检查时间**：所需步数 ÷ 小规模运行测得的 steps/s < `--time`；检查点的间隔要短于你能承受损失的时间，
#    并且恢复训练要测试过（notebook 09）。
# 5. **检查存储**：数据放在并行文件系统上，或者复制到节点本地存储；输出放在配额允许的地方；`$HOME` 里不放任何大的东西。
# 6. **然后逐步扩大规模**（1 → 2 → 8 个节点），把吞吐量与理想值相比较，在效率开始下降的地方停下来。
#
# ### 新手检查清单
#
# 整本练习册，浓缩成对任何训练作业都该问的几个问题：
#
# - **环境**（00）：在*计算节点*上运行 `python -m labkit doctor`，显示的 GPU、CUDA、NCCL 和数据类型是否符合预期？
# - **精度**（01-05）：硬件支持时用 bf16，否则用 fp16 并*配合* GradScaler；主权重用 fp32；在 `unscale_` 之后再裁剪；
#   softmax/归一化用 fp32；留意损失缩放因子和被跳过的步数。
# - **NaN**（03）：在改学习率之前，先找到第一个产生 NaN 的模块。
# - **显存**（06、10）：运行之前先预测模型状态（用 Adam 时每个参数 16-20 字节）和激活值；放不下时，先用梯度累积和
#   激活重计算，再用 ZeRO，最后才用卸载（offload）。
# - **速度**（07、08）：先做性能分析，再做优化；把热点上的逐元素运算链融合起来或交给编译器；清楚自己的 MFU。
# - **规模**（09-11）：全局批大小 = 每个 rank 的批大小 × rank 数 × 累积步数；各 rank 的校验和一致；设置好超时；
#   检查点以原子方式写入，并测试过恢复训练；先小后大。
#
# ## 8. 可复现性记录
#
# 每个结果都应当附带产生它的一切：代码版本、数据、环境、随机种子、硬件。其中大部分来自 `labkit.env.report()`
# （与 `python -m labkit doctor` 是同一份报告）：

# %%
def reproducibility_record(seed: int, data: str) -> dict:
    r = env.report()
    git = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return {"code": git.stdout.strip() or None, "data": data, "seed": seed,
            "env": {"python": r["python"], **{k: v for k, v in r["versions"].items() if v}},
            "hardware": {k: r["device"][k] for k in ("device", "device_name", "gpu_count", "tier")},
            "slurm": {k: v for k, v in r["env"].items() if k.startswith("SLURM_JOB")}}

# %%
# NBVAL_IGNORE_OUTPUT
record = reproducibility_record(seed=0, data="labkit.data synthetic regression, seed 0")
print(json.dumps(record, indent=1))

# %%
assert set(record) == {"code", "data", "seed", "env", "hardware", "slurm"}
assert record["env"]["torch"] and record["hardware"]["tier"] in {"cpu", "mps", "cuda", "cuda-fp8"}
print("record complete: code, data, seed, env, hardware, slurm")

# %% [markdown]
# Write the record next to the results (`json.dump(record, open(run_dir / "record.json", "w"))`). The
# recipes' `LABKIT_RESULT` line, together with this record, lets you compare two runs months apart.
#
# ## 9. Exercises
#
# **1.** Write the `#SBATCH` header for this job. It is checked by parsing it the way sbatch does.

# %% [markdown] lang="zh" en="a53c13b0f6ea"
# 把这份记录写在结果旁边（`json.dump(record, open(run_dir / "record.json", "w"))`）。训练脚本输出的 `LABKIT_RESULT` 行
# 加上这份记录，能让你比较相隔数月的两次运行。
#
# ## 9. 练习
#
# **1.** 为这个作业写出 `#SBATCH` 头部。检查时会按 sbatch 的方式解析它。

# %%
print(JOB)

# %%
answer = ...  # a str: the #SBATCH lines, one option per line
### BEGIN SOLUTION
answer = """#!/bin/bash
#SBATCH --job-name=gpt-ddp
#SBATCH --partition=gpu
#SBATCH --account=proj123
#SBATCH --nodes=2
#SBATCH --gpus-per-node=4
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=01:30:00
"""
### END SOLUTION
check("12.sbatch-header", answer)

# %% [markdown]
# **2.** Where does each of these belong? Answer with one of `STORAGE_TIERS` per item (section 3).

# %% [markdown] lang="zh" en="3e6a6ac8af4f"
# **2.** 下面每一项应该放在哪里？对每一项，用 `STORAGE_TIERS` 中的一项来回答（第 3 节）。

# %%
for k, what in STORAGE_ITEMS.items():
    print(f"{k:17s} {what}")
print("tiers:", STORAGE_TIERS)

# %%
answer = {k: ... for k in STORAGE_ITEMS}   # e.g. answer["code"] = "home"
### BEGIN SOLUTION
answer = {"code": "home", "train-data": "scratch", "small-files": "node-local", "ipython": "node-local",
          "final-checkpoint": "project"}
### END SOLUTION
check("12.storage", answer)

# %% [markdown]
# **3.** Your job's connection file says the following. Write the command you run **on your laptop** to
# reach this JupyterLab.

# %% [markdown] lang="zh" en="57540e4675ab"
# **3.** 你的作业的连接文件内容如下。写出**在你的笔记本电脑上**要运行的命令，用来访问这个 JupyterLab。

# %%
print(CONNECTION)

# %%
answer = ...  # a str: the ssh command
### BEGIN SOLUTION
answer = "ssh -N -L 21983:cn0412:21983 carol@hpc-login.uni.example"
### END SOLUTION
check("12.tunnel", answer)

# %% [markdown]
# **4.** What is wrong with this session? Answer with the set of labels from `PROBLEMS` that describe real
# mistakes.

# %% [markdown] lang="zh" en="4145b3687f2f"
# **4.** 这次会话有哪些问题？用 `PROBLEMS` 中描述真实错误的那些标签组成一个集合来回答。

# %%
print(TRANSCRIPT)
print()
for label, claim in PROBLEMS.items():
    print(f"{label:14s} {claim}")

# %%
answer = {...}
### BEGIN SOLUTION
answer = {"login-node", "missing-gpus", "fixed-port"}
### END SOLUTION
check("12.whats-wrong", answer)

# %% [markdown]
# **5. Debug: half the GPUs idle.** This helper writes the header for a run where `srun` starts one rank per task
# (`srun python -m labkit.recipes.ddp`, one rank per GPU). On one node it is right; on two it is not:

# %% [markdown] lang="zh" en="a68d33dbba83"
# **5. 调试：一半的 GPU 闲着。** 这个辅助函数为一次运行写作业头部，这次运行由 `srun` 为每个任务启动一个 rank
# （`srun python -m labkit.recipes.ddp`，每个 GPU 一个 rank）。在一个节点上它是对的；在两个节点上就不对了：

# %%
def srun_header(nodes, gpus_per_node, hours):
    return f"""#!/bin/bash
#SBATCH --nodes={nodes}
#SBATCH --ntasks={gpus_per_node}
#SBATCH --gpus-per-node={gpus_per_node}
#SBATCH --cpus-per-task=8
#SBATCH --time={hours}:00:00
"""

o = parse_sbatch_header(srun_header(2, 4, 3))
print(o)
print(f"{int(o['ntasks'])} ranks in all on {o['nodes']} nodes with {gpus_per_node(o)} GPUs each")

# %% [markdown]
# Write a fixed `srun_header(nodes, gpus_per_node, hours)`: one task (rank) per GPU on every node. The check parses
# the headers it writes for several shapes, with sbatch's rules.

# %% [markdown] lang="zh" en="20e72e7c1363"
# 写一个修正后的 `srun_header(nodes, gpus_per_node, hours)`：在每个节点上为每个 GPU 安排一个任务（rank）。检查时会用
# sbatch 的规则，解析它为几种不同规模写出的头部。

# %%
def srun_header(nodes, gpus_per_node, hours):
    ...
    ### BEGIN SOLUTION
    return f"""#!/bin/bash
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={gpus_per_node}
#SBATCH --gpus-per-node={gpus_per_node}
#SBATCH --cpus-per-task=8
#SBATCH --time={hours}:00:00
"""
    ### END SOLUTION


check("12.srun-header", srun_header)

# %% [markdown]
# ## Summary
#
# - Login nodes are for editing and submitting. Everything heavy, notebooks included, runs in a job on a
#   compute node.
# - A job asks for nodes, tasks, CPUs, GPUs and time in `#SBATCH` lines, which are read only until the
#   first command. Partitions, accounts and QOS decide where it runs, who pays, and how long it waits.
# - Storage has tiers: small files and SQLite on node-local storage, large data on the parallel FS,
#   little in `$HOME`.
# - `slurm/jupyter.sbatch` gives you JupyterLab on a compute node, with a random port, a token kept in a
#   0600 file, an ssh tunnel, and a clean shutdown. `ddp.sbatch` and `deepspeed.sbatch` run the notebooks'
#   recipes on 1..N nodes.
# - Run small first, check geometry, memory, time and storage, then scale in steps, and keep a
#   reproducibility record for every run.

# %% [markdown] lang="zh" en="1194ffb37288"
# ## 小结
#
# - 登录节点用来编辑和提交。所有的重活，包括 notebook，都在计算节点上的作业里运行。
# - 作业用 `#SBATCH` 行申请节点、任务、CPU、GPU 和时间，这些行只在第一条命令之前才会被读取。分区、账户和 QOS
#   决定作业在哪里运行、由谁付费、要等多久。
# - 存储分层级：小文件和 SQLite 放在节点本地存储上，大型数据放在并行文件系统上，`$HOME` 里少放东西。
# - `slurm/jupyter.sbatch` 让你在计算节点上用上 JupyterLab：随机端口、保存在 0600 文件中的令牌、ssh 隧道，以及干净的
#   关闭流程。`ddp.sbatch` 和 `deepspeed.sbatch` 在 1..N 个节点上运行各 notebook 的训练脚本。
# - 先小规模运行，检查启动配置、显存、时间和存储，再逐步扩大规模，并为每次运行保留一份可复现性记录。
