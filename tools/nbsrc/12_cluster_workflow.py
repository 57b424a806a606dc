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

# %%
# %matplotlib inline
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

# %%
print(LATE_SCRIPT)
prediction = ...
### BEGIN SOLUTION
prediction = (30, None)
### END SOLUTION
predict("12.late-sbatch", prediction)

# %% [markdown]
# `labkit.slurm.parse_sbatch_header` reads the header as sbatch does (it is tested against the real sbatch):

# %% tags=["workspace-clear"]
late = parse_sbatch_header(LATE_SCRIPT)
print(late)
reveal("12.late-sbatch", (time_minutes(late["time"]), gpus_per_node(late)))

# %% [markdown]
# sbatch reads `#SBATCH` lines **only until the first command**; an `#SBATCH` line after that is an ordinary comment.
# Options on the command line override the script's lines.

# %%
assert late == {"job-name": "train", "time": "00:30:00"}

# %% [markdown]
# Here is what the workbook's three scripts ask for:

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

# %%
settings = re.findall(r'^# (.*)\n(LABKIT_\w+)="\$\{\2:-(.*)\}"', (SLURM_DIR / "env.sh").read_text(), re.M)
for comment, name, default in settings:
    print(f"{name:17s} {default or '(empty)':7s} {comment}")
assert {name for _, name, _ in settings} >= {"LABKIT_ENV", "LABKIT_VENV", "LABKIT_CONDA_ENV", "LABKIT_MODULES"}
assert "JUPYTER_TOKEN" in jupyter_text and "token=" not in jupyter_text.split("jupyter lab ")[1].split("&")[0]

# %% [markdown]
# A connection file looks like this (an example with the same fields, written here with the same care:
# created with mode 0600 *before* anything secret goes in):

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
# 4. **Check the time**: steps/s from the small run × steps needed < `--time`, with checkpoints more often
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
# - **Memory** (06, 09): predict model states (16-20 bytes/parameter with Adam) and activations before you
#   run; if it does not fit, accumulation and checkpointing first, then ZeRO, then offload.
# - **Speed** (07): profile before you optimise; fuse or compile the hot elementwise chains; know your MFU.
# - **Scale** (08-10): global batch = per-rank batch × ranks × accumulation; checksums equal across ranks;
#   timeouts set; checkpoints written atomically and resume tested; small first, then large.
#
# ## 8. A reproducibility record
#
# Every result should carry what made it: code version, data, environment, seed, hardware. Most of it
# comes from `labkit.env.report()` (the same report as `python -m labkit doctor`):

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
