"""Exercises of notebook 12 (working on a cluster).

The graders read answers with the parsers of :mod:`labkit.slurm` (``parse_sbatch_header``,
``parse_tunnel`` ...), the same ones the notebook uses to read the workbook's own slurm/ scripts.

Introduced in notebook 12.
"""

from __future__ import annotations

from labkit.exercises._core import Exercise
from labkit.slurm import gpus_per_node, parse_sbatch_header, parse_tunnel, time_minutes

__all__ = [
    "CONNECTION",
    "EXERCISES",
    "JOB",
    "LAUNCH",
    "PROBLEMS",
    "TRANSCRIPT",
]


# ---- 12.sbatch-header ------------------------------------------------------------------------------
#: The job the learner writes a header for.
JOB = {"job-name": "gpt-ddp", "partition": "gpu", "account": "proj123", "nodes": 2, "gpus-per-node": 4,
       "ntasks-per-node": 4, "cpus-per-task": 8, "minutes": 90}


def _grade_header(answer: object) -> tuple[bool, str]:
    if not isinstance(answer, str):
        return False, "Give the header as one string of #SBATCH lines."
    try:
        o = parse_sbatch_header(answer)
    except ValueError as exc:
        return False, f"sbatch could not read it: {exc}."
    if not o:
        return False, "No #SBATCH line found before the first command (each line starts with '#SBATCH')."
    problems = []
    for key in ("job-name", "partition", "account"):
        if o.get(key) != JOB[key]:
            problems.append(f"--{key} should be {JOB[key]} (got {o.get(key)!r})")
    if o.get("nodes") != str(JOB["nodes"]):
        problems.append(f"--nodes should be {JOB['nodes']}")
    try:
        gpn = gpus_per_node(o)
    except ValueError:
        gpn = None
    if gpn != JOB["gpus-per-node"]:
        extra = " (--gpus counts GPUs for the whole job, not per node)" if "gpus" in o else ""
        problems.append(f"ask for {JOB['gpus-per-node']} GPUs on each node with --gpus-per-node or --gres{extra}")
    if o.get("ntasks-per-node") != str(JOB["ntasks-per-node"]):
        problems.append("one task per GPU: --ntasks-per-node=4")
    if o.get("cpus-per-task") != str(JOB["cpus-per-task"]):
        problems.append("--cpus-per-task should be 8")
    try:
        minutes = time_minutes(o.get("time", ""))
    except ValueError:
        minutes = None
    if minutes != JOB["minutes"]:
        problems.append("--time should be 1 hour 30 minutes (1:30:00 or 90)")
    return (not problems), "; ".join(problems)


# ---- 12.global-batch -------------------------------------------------------------------------------
#: The launch whose global batch the learner computes.
LAUNCH = ("sbatch -N 3 --ntasks-per-node=4 --gpus-per-node=4 slurm/ddp.sbatch "
          "--model gpt --batch 32 --accum 2")
_GLOBAL = 3 * 4 * 32 * 2


def _grade_global(answer: object) -> tuple[bool, str]:
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return False, "Give the number of examples per optimizer step."
    if answer == _GLOBAL:
        return True, ""
    hints = {4 * 32 * 2: "that is one node: ddp.sbatch starts one torchrun per node, so count all 3 nodes",
             3 * 4 * 32: "each rank accumulates --accum micro-batches before every optimizer step",
             3 * 32 * 2: "each node runs one rank per GPU, 4 per node",
             32 * 2: "--batch is per rank, not for the whole job"}
    return False, hints.get(int(answer), "") if float(answer).is_integer() else ""


# ---- 12.tunnel -------------------------------------------------------------------------------------
#: What a connection file written by slurm/jupyter.sbatch says (the token left out).
CONNECTION = {"node": "cn0412", "port": 21983, "user": "carol", "login": "hpc-login.uni.example"}


def _grade_tunnel(answer: object) -> tuple[bool, str]:
    if not isinstance(answer, str):
        return False, "Give the ssh command as a string."
    try:
        t = parse_tunnel(answer)
    except ValueError as exc:
        return False, f"{exc}."
    c = CONNECTION
    if t["port"] != c["port"]:
        return False, f"the far end of -L must be JupyterLab's port, {c['port']}"
    if t["host"] in ("localhost", "127.0.0.1"):
        return False, ("'localhost' in -L is resolved on the far side of the tunnel, and JupyterLab listens on "
                       "the node's name, not on localhost there")
    if t["host"] != c["node"]:
        return False, f"the -L target must be the compute node, {c['node']}"
    if t["dest_user"] not in (None, c["user"]):
        return False, f"log in as yourself, {c['user']}"
    if t["dest_host"] == c["login"] and t["jump"] is None:
        note = "" if t["no_shell"] else " (add -N: no remote shell, just the tunnel)"
        return True, f"open http://localhost:{t['local_port']}/lab?token=... in your browser{note}."
    if t["dest_host"] == c["node"] and t["jump"] and t["jump"].rpartition("@")[2] == c["login"]:
        return True, "the jump-host variant: it works where you may ssh to a node that runs your job."
    if t["dest_host"] == c["node"]:
        return False, f"a compute node is not reachable from outside: go through {c['login']} (or -J {c['login']})"
    return False, f"the ssh destination is the login node, {c['user']}@{c['login']}"


# ---- 12.whats-wrong --------------------------------------------------------------------------------
#: A learner's session; the exercise asks what is wrong with it.
TRANSCRIPT = """\
[alice@login1 ~]$ python train.py --epochs 3          # "just a quick test"
[alice@login1 ~]$ cat lab.sbatch
#!/bin/bash
#SBATCH --job-name=lab
#SBATCH --partition=gpu
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=8
#SBATCH --time=02:00:00
source "$HOME/venvs/labkit/bin/activate"
python -c 'import torch; assert torch.cuda.is_available(), "no GPU"'
jupyter lab --no-browser --ip="$(hostname)" --port=8888
[alice@login1 ~]$ sbatch lab.sbatch"""

#: The choices: label -> what it claims.
PROBLEMS = {
    "login-node": "work runs on the login node",
    "missing-gpus": "the job asks for no GPU, so it gets none, even on the gpu partition",
    "fixed-port": "a fixed port collides when two jobs share a node",
    "hostname-bind": "JupyterLab should listen on 0.0.0.0 instead of the node's hostname",
    "time-too-long": "two hours is more than a JupyterLab job may ask for",
    "venv-in-home": "a virtual environment must not live in $HOME",
}
_WRONG = {"login-node", "missing-gpus", "fixed-port"}


def _grade_problems(answer: object) -> tuple[bool, str]:
    if isinstance(answer, str):
        answer = {answer}
    if not isinstance(answer, (set, frozenset, list, tuple)):
        return False, "Give a set of labels from PROBLEMS."
    got = {str(a) for a in answer}
    unknown = got - set(PROBLEMS)
    if unknown:
        return False, f"unknown labels {sorted(unknown)}; choose from {sorted(PROBLEMS)}"
    missed, extra = _WRONG - got, got - _WRONG
    msg = []
    if missed:
        msg.append(f"{len(missed)} real problem(s) missed")
    if extra:
        msg.append(f"not a problem: {', '.join(sorted(extra))}")
    return (not missed and not extra), "; ".join(msg)


_REFERENCE_HEADER = """#!/bin/bash
#SBATCH --job-name=gpt-ddp
#SBATCH --partition=gpu
#SBATCH --account=proj123
#SBATCH --nodes=2
#SBATCH --gpus-per-node=4
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=01:30:00
"""
# A typical mistake: --gpus=4 asks for 4 GPUs for the whole job, not 4 on each node.
_WRONG_HEADER = _REFERENCE_HEADER.replace("--gpus-per-node=4", "--gpus=4")

EXERCISES = [
    Exercise("12.sbatch-header",
             "Write the #SBATCH header for the job described in JOB.",
             _grade_header,
             "One option per '#SBATCH' line, before the first command: --job-name, --partition, --account, "
             "--nodes, --gpus-per-node (or --gres=gpu:N), --ntasks-per-node, --cpus-per-task, --time.",
             success="sbatch would read exactly that; labkit checked it with the same rules.",
             reference=_REFERENCE_HEADER, wrong=_WRONG_HEADER),
    Exercise("12.global-batch",
             f"The global batch (examples per optimizer step) of: {LAUNCH}",
             _grade_global,
             "ranks = nodes × ranks per node; global batch = --batch × ranks × --accum.",
             success=f"3 nodes × 4 ranks × 32 × 2 = {_GLOBAL}.",
             reference=_GLOBAL, wrong=4 * 32 * 2),
    Exercise("12.tunnel",
             "Write the ssh command, run on your laptop, that makes JupyterLab of CONNECTION reachable.",
             _grade_tunnel,
             "ssh -N -L <local port>:<compute node>:<jupyter port> <you>@<login node>",
             reference="ssh -N -L 21983:cn0412:21983 carol@hpc-login.uni.example",
             wrong="ssh -N -L 21983:localhost:21983 carol@hpc-login.uni.example"),
    Exercise("12.whats-wrong",
             "Which PROBLEMS labels describe real mistakes in TRANSCRIPT?",
             _grade_problems,
             "Look at where each command runs, what the job asks Slurm for, and what happens when a second "
             "person's job lands on the same node.",
             reference={"login-node", "missing-gpus", "fixed-port"},
             wrong={"login-node", "missing-gpus", "hostname-bind"}),
]
