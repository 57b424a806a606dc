"""Exercises of notebook 12 (working on a cluster).

The graders read answers with the parsers of :mod:`labkit.slurm` (``parse_sbatch_header``,
``parse_tunnel`` ...), the same ones the notebook uses to read the workbook's own slurm/ scripts.

Introduced in notebook 12.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labkit.exercises._core import Described, Exercise, FormatSlip
from labkit.exercises._graders import NOT_A_PAIR, as_number, pair
from labkit.i18n import N_
from labkit.i18n import gettext as _
from labkit.slurm import gpus_per_node, parse_sbatch_header, parse_tunnel, time_minutes

__all__ = [
    "CONNECTION",
    "EXERCISES",
    "JOB",
    "LATE_SCRIPT",
    "PROBLEMS",
    "STORAGE_ITEMS",
    "STORAGE_TIERS",
    "TRANSCRIPT",
]


# ---- 12.sbatch-header ------------------------------------------------------------------------------
#: The job the learner writes a header for.
JOB = {"job-name": "gpt-ddp", "partition": "gpu", "account": "proj123", "nodes": 2, "gpus-per-node": 4,
       "ntasks-per-node": 4, "cpus-per-task": 8, "minutes": 90}


_HEADER_WHY_TEXT = N_("--gpus={gpus} asks for {gpus} GPUs for the whole job, which Slurm may split over the 2 nodes "
                      "any way it likes (3 + 1, say); the job needs its GPUs on each node, which --gpus cannot ask "
                      "for.")


def _header_why(o: dict[str, str]) -> str:
    """The typical mistake's message, with the learner's own --gpus value."""
    return _(_HEADER_WHY_TEXT).format(gpus=o.get("gpus", ""))


_HEADER_WHY = _HEADER_WHY_TEXT.format(gpus="4")  # the typical mistake below: --gpus=4 (translated where shown)


def _grade_header(answer: object) -> tuple[bool, str]:
    if not isinstance(answer, str):
        return False, FormatSlip(_("Give the header as one string of #SBATCH lines."))
    try:
        o = parse_sbatch_header(answer)
    except ValueError as exc:
        return False, _("sbatch could not read it: {error}.").format(error=exc)
    if not o:
        return False, _("No #SBATCH line found before the first command (each line starts with '#SBATCH').")
    problems = []
    for key in ("job-name", "partition", "account"):
        if o.get(key) != JOB[key]:
            problems.append(_("--{key} should be {want} (got {got!r})").format(key=key, want=JOB[key], got=o.get(key)))
    if o.get("nodes") != str(JOB["nodes"]):
        problems.append(_("--nodes should be {want}").format(want=JOB["nodes"]))
    try:
        gpn = gpus_per_node(o)
    except ValueError:
        gpn = None
    if gpn is None and o.get("gpus-per-task") == "1" and o.get("ntasks-per-node", "").isdigit():
        gpn = int(o["ntasks-per-node"])  # one GPU per task, so as many per node as tasks (srun_header accepts it too)
    if gpn != JOB["gpus-per-node"]:
        if "gpus" in o:
            problems.append(_("the GPUs: the job needs its GPUs on each node, and your header does not ask for that "
                              "(--gpus counts GPUs for the whole job, not per node)"))
        else:
            problems.append(_("the GPUs: the job needs its GPUs on each node, and your header does not ask for that"))
    ranks = JOB["nodes"] * JOB["ntasks-per-node"]
    if "ntasks" in o and o["ntasks"] != str(ranks):
        problems.append(_("--ntasks={ntasks} counts tasks for the whole job and wins over a per-node count: srun "
                          "would start {ntasks} ranks for {gpus} GPUs").format(ntasks=o["ntasks"], gpus=ranks))
    elif o.get("ntasks-per-node") != str(JOB["ntasks-per-node"]):
        problems.append(_("the tasks: the job wants one task (rank) per GPU on each node, and your header does not "
                          "ask for that per node"))
    if o.get("cpus-per-task") != str(JOB["cpus-per-task"]):
        problems.append(_("--cpus-per-task should be {want}, as JOB says").format(want=JOB["cpus-per-task"]))
    try:
        minutes = time_minutes(o.get("time", ""))
    except ValueError:
        minutes = None
    if minutes != JOB["minutes"]:
        if minutes is None:
            problems.append(_("--time: sbatch cannot read it, and JOB says {want} minutes").format(want=JOB["minutes"]))
        else:
            problems.append(_("--time: sbatch reads it as {minutes:g} minutes, and JOB says {want} minutes").format(
                minutes=minutes, want=JOB["minutes"]))
    if len(problems) == 1 and "gpus" in o and gpn is None:
        return False, _header_why(o)
    return (not problems), "; ".join(problems)


# ---- 12.storage ------------------------------------------------------------------------------------
#: The storage tiers of section 3, and what the learner places on them.
STORAGE_TIERS: tuple[str, ...] = ("home", "project", "scratch", "node-local")
STORAGE_ITEMS: Mapping[str, str] = Described({
    "code": N_("your code, job scripts and configs"),
    "train-data": N_("a 2 TB training data set, read again and again during a week-long run"),
    "small-files": N_("a data set of 2 million small files, unpacked for one job"),
    "ipython": N_("IPython's history (an SQLite file) and JupyterLab's runtime files during a notebook job"),
    "final-checkpoint": N_("the final checkpoint of a project, to keep and to share with your group"),
})
_TIER_OF = {"code": "home", "train-data": "scratch", "small-files": "node-local", "ipython": "node-local",
            "final-checkpoint": "project"}
_TIER_WHY = {
    "code": N_("code and configs are small and precious: home, which is usually backed up"),
               "train-data": N_("large files read at speed belong on the parallel file system (scratch), not in a small NFS "
               "home"),
    "small-files": N_("millions of small files are slow on a parallel FS: unpack them on node-local storage"),
                      "ipython": N_("SQLite locking is unreliable on NFS and parallel file systems: node-local storage, as "
                      "jupyter.sbatch does"),
    "final-checkpoint": N_("results to keep belong on project storage: scratch is purged, node-local dies with the "
                           "job"),
}
_STORAGE_WHY = N_("Scratch is not backed up and is purged after some days: a checkpoint you want to keep and share "
                  "goes to project storage (copy it there at the end of the run). Scratch is for the checkpoints "
                  "written during a run.")


def _grade_storage(answer: object) -> tuple[bool, str]:
    if not isinstance(answer, dict) or set(answer) != set(STORAGE_ITEMS):
        return False, FormatSlip(_("Give a dict with exactly the keys {keys}, each one of {tiers}.").format(
            keys=sorted(STORAGE_ITEMS), tiers=list(STORAGE_TIERS)))
    got = {k: str(v).strip().lower() for k, v in answer.items()}
    unknown = sorted(set(got.values()) - set(STORAGE_TIERS))
    if unknown:
        return False, _("Tiers are named {tiers}, not {unknown}.").format(tiers=list(STORAGE_TIERS), unknown=unknown)
    wrong = [k for k in STORAGE_ITEMS if got[k] != _TIER_OF[k]]
    if not wrong:
        return True, ""
    if wrong == ["final-checkpoint"] and got["final-checkpoint"] == "scratch":
        return False, _(_STORAGE_WHY)
    return False, "; ".join(f"{k}: {_(_TIER_WHY[k])}" for k in wrong)


# ---- 12.late-sbatch: predict, then run --------------------------------------------------------------
#: A job script whose second #SBATCH block comes after a command.
LATE_SCRIPT = """#!/bin/bash
#SBATCH --job-name=train
#SBATCH --time=00:30:00
module load cuda
#SBATCH --time=04:00:00
#SBATCH --gpus-per-node=4
srun python -m labkit.recipes.ddp --model gpt
"""
_LATE_WHY = N_("sbatch reads #SBATCH lines only until the first command: `module load cuda` ends the header, and the "
               "two lines after it are ordinary comments. The job keeps 30 minutes and asks for no GPU at all.")


def _grade_late(answer: object) -> tuple[bool, str]:
    got = pair(answer)
    if got is None:
        return False, NOT_A_PAIR
    pred, result = got
    if not (isinstance(pred, (tuple, list)) and len(pred) == 2):
        return False, FormatSlip(_("Predict a pair (minutes of --time, GPUs per node), e.g. (60, 2); None or "
                                   "0 for no GPU."))
    minutes = as_number(pred[0])
    gpus = 0 if pred[1] is None else as_number(pred[1])
    if minutes is None or gpus is None:
        return False, FormatSlip(_("Both parts of the prediction are numbers (None or 0 for no GPU)."))
    want_minutes, want_gpus = result[0], result[1] or 0
    if minutes == want_minutes and gpus == want_gpus:
        return True, _("The header ends at the first command: the later #SBATCH lines are comments. Put every "
                       "#SBATCH line at the top, or pass the options on the sbatch command line.")
    if minutes == 240:
        return False, _(_LATE_WHY)
    if want_gpus:
        read = _("sbatch reads ({minutes:g} min, {gpus} GPUs per node).").format(minutes=want_minutes, gpus=want_gpus)
    else:
        read = _("sbatch reads ({minutes:g} min, no GPUs per node).").format(minutes=want_minutes)
    return False, f"{read} {_(_LATE_WHY)}"


# ---- 12.srun-header: debug --------------------------------------------------------------------------
_SRUN_WHY = N_("--ntasks counts the tasks of the whole job, not per node: with 2 nodes of 4 GPUs it starts 4 ranks in "
               "all, spread over the nodes (2 + 2, or 3 + 1), so half of the 8 GPUs sit idle and the world size is 4, "
               "not 8.")


def _reference_srun_header(nodes: int, gpus_per_node: int, hours: int) -> str:
    return (f"#!/bin/bash\n#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node={gpus_per_node}\n"
            f"#SBATCH --gpus-per-node={gpus_per_node}\n#SBATCH --cpus-per-task=8\n#SBATCH --time={hours}:00:00\n")


def _broken_srun_header(nodes: int, gpus_per_node: int, hours: int) -> str:
    """The snippet of the exercise: --ntasks (for the whole job) where --ntasks-per-node is meant."""
    return (f"#!/bin/bash\n#SBATCH --nodes={nodes}\n#SBATCH --ntasks={gpus_per_node}\n"
            f"#SBATCH --gpus-per-node={gpus_per_node}\n#SBATCH --cpus-per-task=8\n#SBATCH --time={hours}:00:00\n")


def _grade_srun(fn: Any) -> tuple[bool, str] | None:
    if not callable(fn):
        return False, FormatSlip(_("Define srun_header(nodes, gpus_per_node, hours) and pass the function itself."))
    for nodes, gpn, hours in ((2, 4, 3), (1, 8, 1), (4, 2, 12), (3, 4, 2)):
        text = fn(nodes, gpn, hours)
        if text is None or text is Ellipsis:
            return None  # still a stub: "not attempted yet"
        if not isinstance(text, str):
            return False, FormatSlip(_("Return the header as one string of #SBATCH lines."))
        try:
            o = parse_sbatch_header(text)
            gpus = gpus_per_node(o)
            minutes = time_minutes(o.get("time", ""))
        except ValueError as exc:
            return False, _("srun_header({nodes}, {gpus}, {hours}): sbatch could not read it: {error}.").format(
                nodes=nodes, gpus=gpn, hours=hours, error=exc)
        if o.get("nodes") != str(nodes):
            return False, _("srun_header({nodes}, {gpus}, {hours}) must ask for --nodes={nodes}.").format(
                nodes=nodes, gpus=gpn, hours=hours)
        if "ntasks" in o and int(o["ntasks"]) != nodes * gpn:
            if int(o["ntasks"]) == gpn and nodes > 1 and "ntasks-per-node" not in o:
                return False, _(_SRUN_WHY)
            return False, _("srun_header({nodes}, {gpus}, {hours}): --ntasks={ntasks} counts tasks for the whole job "
                            "and wins over a per-node count: srun would start {ntasks} ranks for {total} "
                            "GPUs.").format(nodes=nodes, gpus=gpn, hours=hours, ntasks=o["ntasks"], total=nodes * gpn)
        if "ntasks-per-node" in o:
            per_node = int(o["ntasks-per-node"])
        elif "ntasks" in o:
            return False, _("--ntasks alone counts tasks for the whole job, not per node: Slurm may place them "
                            "unevenly over the nodes.")
        else:
            return False, _("Your header asks for no tasks: srun starts one rank per task, and the job wants one per "
                            "GPU on every node.")
        if gpus is None and o.get("gpus-per-task") == "1":
            gpus = per_node
        if gpus != gpn:
            return False, _("srun_header({nodes}, {gpus}, {hours}) must ask for {gpus} GPUs on each node.").format(
                nodes=nodes, gpus=gpn, hours=hours)
        if per_node != gpn:
            return False, _("srun_header({nodes}, {gpus}, {hours}) asks for {per_node} tasks on each node of {gpus} "
                            "GPUs: one rank per GPU.").format(nodes=nodes, gpus=gpn, hours=hours, per_node=per_node)
        if minutes != 60 * hours:
            return False, _("srun_header({nodes}, {gpus}, {hours}): sbatch reads your --time as {minutes:g} minutes, "
                            "not {hours} hours.").format(nodes=nodes, gpus=gpn, hours=hours, minutes=minutes)
    return True, _("One task per GPU on every node: srun starts exactly nodes × GPUs ranks.")


# ---- 12.tunnel -------------------------------------------------------------------------------------
#: What a connection file written by slurm/jupyter.sbatch says (the token left out).
CONNECTION = {"node": "cn0412", "port": 21983, "user": "carol", "login": "hpc-login.uni.example"}


_TUNNEL_WHY = N_("'localhost' in -L is resolved on the far side of the tunnel, the login node, and JupyterLab does not "
                 "run there: it runs on the compute node and listens on that node's name.")


def _grade_tunnel(answer: object) -> tuple[bool, str]:
    if not isinstance(answer, str):
        return False, FormatSlip(_("Give the ssh command as a string."))
    try:
        t = parse_tunnel(answer)
    except ValueError as exc:
        return False, f"{exc}."
    c = CONNECTION
    if t["port"] != c["port"]:
        return False, _("the far end of -L must be JupyterLab's port, {port}").format(port=c["port"])
    if t["host"] in ("localhost", "127.0.0.1"):
        return False, _(_TUNNEL_WHY)
    if t["host"] != c["node"]:
        return False, _("the -L target must be the compute node, {node}").format(node=c["node"])
    if t["dest_user"] not in (None, c["user"]):
        return False, _("log in as yourself, {user}").format(user=c["user"])
    if t["dest_host"] == c["login"] and t["jump"] is None:
        if t["no_shell"]:
            return True, _("open http://localhost:{port}/lab?token=... in your browser.").format(port=t["local_port"])
        return True, _("open http://localhost:{port}/lab?token=... in your browser (add -N: no remote shell, just the "
                       "tunnel).").format(port=t["local_port"])
    if t["dest_host"] == c["node"] and t["jump"] and t["jump"].rpartition("@")[2] == c["login"]:
        return True, _("the jump-host variant: it works where you may ssh to a node that runs your job.")
    if t["dest_host"] == c["node"]:
        return False, _("a compute node is not reachable from outside: go through {login} (or -J {login})").format(
            login=c["login"])
    return False, _("the ssh destination is the login node, {user}@{login}").format(user=c["user"], login=c["login"])


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
PROBLEMS: Mapping[str, str] = Described({
    "login-node": N_("work runs on the login node"),
    "missing-gpus": N_("the job asks for no GPU, so it gets none, even on the gpu partition"),
    "fixed-port": N_("a fixed port collides when two jobs share a node"),
    "hostname-bind": N_("JupyterLab should listen on 0.0.0.0 instead of the node's hostname"),
    "time-too-long": N_("two hours is more than a JupyterLab job may ask for"),
    "venv-in-home": N_("a virtual environment must not live in $HOME"),
})
_WRONG = {"login-node", "missing-gpus", "fixed-port"}


_PROBLEMS_WHY = N_("Binding JupyterLab to the node's hostname is right, not a problem: 0.0.0.0 would listen on every "
                   "interface, and the token is what keeps others out either way. One real problem is still missing: "
                   "think of what happens when a second person's job lands on the same node.")


def _grade_problems(answer: object) -> tuple[bool, str]:
    if isinstance(answer, str):
        answer = {answer}
    if not isinstance(answer, (set, frozenset, list, tuple)):
        return False, FormatSlip(_("Give a set of labels from PROBLEMS."))
    got = {str(a) for a in answer}
    unknown = got - set(PROBLEMS)
    if unknown:
        return False, FormatSlip(_("unknown labels {unknown}; choose from {labels}").format(
            unknown=sorted(unknown), labels=sorted(PROBLEMS)))
    missed, extra = _WRONG - got, got - _WRONG
    if missed == {"fixed-port"} and extra == {"hostname-bind"}:
        return False, _(_PROBLEMS_WHY)
    msg = []
    if missed:
        msg.append(_("{count} real problem(s) missed").format(count=len(missed)))
    if extra:
        msg.append(_("not a problem: {labels}").format(labels=", ".join(sorted(extra))))
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

def _measure_late_sbatch() -> tuple[int | None, int | None]:
    """(minutes of --time, GPUs per node) that sbatch's rules give LATE_SCRIPT (the experiment of 12.late-sbatch)."""
    late = parse_sbatch_header(LATE_SCRIPT)
    return time_minutes(late["time"]), gpus_per_node(late)

EXERCISES = [
    Exercise("12.sbatch-header",
             "Write the #SBATCH header for the job described in JOB.",
             _grade_header,
             "One #SBATCH option per line, before the first command; take each value from JOB.",
             method="--job-name, --partition, --account, --nodes, GPUs per node (--gpus-per-node or --gres=gpu:N, "
                    "not --gpus, which counts the whole job), --ntasks-per-node (one rank per GPU), "
                    "--cpus-per-task, --time as H:MM:SS.",
             solution=_REFERENCE_HEADER,
             kind="design", wrong_why=_HEADER_WHY,
             success="sbatch would read exactly that; labkit checked it with the same rules.",
             reference=_REFERENCE_HEADER, wrong=_WRONG_HEADER),
    Exercise("12.storage",
             "For each item of STORAGE_ITEMS, choose the storage tier it belongs on (one of STORAGE_TIERS).",
             _grade_storage,
             "Ask of each item: how big is it, how many files, how long must it live, and does it need locking?",
             method="home: small, backed up. project: shared and kept. scratch: large files at speed, purged. "
                    "node-local: fastest, many small files and SQLite, deleted when the job ends.",
             solution="code: home; train-data: scratch; small-files: node-local; ipython: node-local; "
                      "final-checkpoint: project",
             kind="design", wrong_why=_STORAGE_WHY,
             reference=dict(_TIER_OF), wrong={**_TIER_OF, "final-checkpoint": "scratch"}),
    Exercise("12.tunnel",
             "Write the ssh command, run on your laptop, that makes JupyterLab of CONNECTION reachable.",
             _grade_tunnel,
             "The tunnel starts on your laptop, enters at the login node, and must end where JupyterLab listens.",
             method="In ssh -L <local port>:<host>:<port>, host:port is resolved by the far end of the tunnel, the "
                    "machine you log in to. From there, which machine name and which port reach JupyterLab? (-N "
                    "opens no remote shell, just the tunnel.)",
             solution="ssh -N -L 21983:cn0412:21983 carol@hpc-login.uni.example",
             kind="design", wrong_why=_TUNNEL_WHY,
             reference="ssh -N -L 21983:cn0412:21983 carol@hpc-login.uni.example",
             wrong="ssh -N -L 21983:localhost:21983 carol@hpc-login.uni.example"),
    Exercise("12.whats-wrong",
             "Which PROBLEMS labels describe real mistakes in TRANSCRIPT?",
             _grade_problems,
             "Look at where each command runs, what the job asks Slurm for, and what happens when a second "
             "person's job lands on the same node.",
             method="Check each claim against sections 1-5: where may training run, does a job on the gpu partition "
                    "get GPUs without asking, how does jupyter.sbatch choose its port and its interface, what are "
                    "the time and storage rules?",
             solution="{'login-node', 'missing-gpus', 'fixed-port'}: training on the login node, no --gpus-per-node/"
                      "--gres, and port 8888. Binding to the hostname, 2 hours and a venv in $HOME are fine.",
             kind="recall", wrong_why=_PROBLEMS_WHY,
             reference={"login-node", "missing-gpus", "fixed-port"},
             wrong={"login-node", "missing-gpus", "hostname-bind"}),
    Exercise("12.late-sbatch",
             "Predict, then run: which --time (in minutes) and how many GPUs per node does sbatch give LATE_SCRIPT?",
             _grade_late,
             "Read the script the way sbatch does: from the top, and ask where it stops reading options.",
             method="sbatch reads #SBATCH lines until the first line that is a command; after it, #SBATCH is an "
                    "ordinary comment. Which lines come before `module load cuda`?",
             solution="prediction = (30, None): the header ends at `module load cuda`; the 4 hours and the GPUs are "
                      "comments.",
             kind="predict", wrong_why=_LATE_WHY,
             reference=((30, None), (30.0, None)), wrong=((240, 4), (30.0, None)),
             measure=_measure_late_sbatch),
    Exercise("12.srun-header",
             "Debug: srun_header(nodes, gpus_per_node, hours) leaves half the GPUs idle on 2 nodes. Write a fixed "
             "srun_header for `srun python -m labkit.recipes.ddp` (one task = one rank per GPU).",
             _grade_srun,
             "Count the tasks this header starts on each node, and compare with the GPUs per node.",
             method="For each #SBATCH option of the header, ask whether Slurm counts it per job or per node. srun "
                    "starts one rank per task: how many tasks must each node get, and which option says that?",
             solution="#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node={gpus_per_node}\n"
                      "#SBATCH --gpus-per-node={gpus_per_node}\n#SBATCH --cpus-per-task=8\n#SBATCH --time={hours}:00:00",
             kind="debug", wrong_why=_SRUN_WHY,
             reference=_reference_srun_header, wrong=_broken_srun_header),
]
