"""Notebook 12's exercises, and labkit.slurm's header parser checked against the real sbatch.

The parsers' own unit tests are in tests/test_slurm_parsers.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from local_cluster import LocalCluster

from labkit.check import evaluate
from labkit.exercises import nb12
from labkit.slurm import gpus_per_node, parse_sbatch_header, time_minutes


def _status(ex: str, answer) -> str:
    return evaluate(ex, answer).status


def test_header_exercise():
    good = """#SBATCH --job-name=gpt-ddp
#SBATCH -p gpu -A proj123
#SBATCH --nodes=2 --gpus-per-node=4 --ntasks-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=1:30:00
"""
    assert _status("12.sbatch-header", good) == "correct"
    assert _status("12.sbatch-header", good.replace("--gpus-per-node=4", "--gres=gpu:4")) == "correct"
    assert _status("12.sbatch-header", good.replace("1:30:00", "90")) == "correct"
    v = evaluate("12.sbatch-header", good.replace("--gpus-per-node=4", "--gpus=4"))
    assert v.status == "wrong" and "whole job" in v.message
    assert _status("12.sbatch-header", "echo hi\n" + good) == "wrong"  # after a command: ignored
    assert _status("12.sbatch-header", good.replace("1:30:00", "1:30")) == "wrong"  # 1 min 30 s
    assert _status("12.sbatch-header", ...) == "not attempted"
    # the fix line added without deleting --ntasks=4: --ntasks wins, 4 ranks for 8 GPUs
    v = evaluate("12.sbatch-header", good + "#SBATCH --ntasks=4\n")
    assert v.status == "wrong" and "--ntasks=4" in v.message and "whole job" in v.message
    assert _status("12.sbatch-header", good + "#SBATCH --ntasks=8\n") == "correct"  # consistent: 2 x 4
    per_task = good.replace("--gpus-per-node=4", "--gpus-per-task=1")
    assert _status("12.sbatch-header", per_task) == "correct", "one GPU per task, 4 tasks per node"
    v = evaluate("12.sbatch-header", good.replace("--gpus-per-node=4", "--gpus=8"))
    assert "--gpus=8 asks for 8 GPUs" in v.message, "the message quotes the learner's own value"
    assert "--ntasks-per-node=4" not in evaluate("12.sbatch-header", good.replace("--ntasks-per-node=4", "")).message


def test_storage_exercise():
    good = {"code": "home", "train-data": "scratch", "small-files": "node-local", "ipython": "node-local",
            "final-checkpoint": "project"}
    assert _status("12.storage", good) == "correct"
    assert _status("12.storage", {k: v.upper() for k, v in good.items()}) == "correct"
    v = evaluate("12.storage", {**good, "ipython": "home", "train-data": "home"})
    assert v.status == "wrong" and "SQLite" in v.message and "parallel file system" in v.message
    assert "purged" in evaluate("12.storage", {**good, "final-checkpoint": "scratch"}).message
    assert "not ['ssd']" in evaluate("12.storage", {**good, "code": "ssd"}).message
    assert _status("12.storage", {"code": "home"}) == "wrong"


def test_late_sbatch_prediction_is_what_the_parser_reads():
    o = parse_sbatch_header(nb12.LATE_SCRIPT)
    result = (time_minutes(o["time"]), gpus_per_node(o))
    assert result == (30.0, None)
    assert _status("12.late-sbatch", ((30, None), result)) == "correct"
    assert _status("12.late-sbatch", ((30, 0), result)) == "correct"
    v = evaluate("12.late-sbatch", ((240, 4), result))
    assert v.status == "wrong" and "first command" in v.message
    assert _status("12.late-sbatch", ((30, 4), result)) == "wrong"
    from labkit.check import _judge
    from labkit.exercises import get_exercise
    from labkit.exercises._core import FormatSlip

    _, detail, _ = _judge(get_exercise("12.late-sbatch"), (("thirty", 4), result))
    assert isinstance(detail, FormatSlip), "a prediction that is not numbers is a slip of form, not a wrong try"


def test_srun_header_exercise_runs_the_function():
    def per_node(nodes, gpus_per_node, hours):
        return (f"#SBATCH -N {nodes} --ntasks-per-node={gpus_per_node}\n#SBATCH --gres=gpu:{gpus_per_node}\n"
                f"#SBATCH -t {hours * 60}\n")

    assert _status("12.srun-header", per_node) == "correct"

    def per_task(nodes, gpus_per_node, hours):
        return (f"#SBATCH --nodes={nodes} --ntasks-per-node={gpus_per_node} --gpus-per-task=1\n"
                f"#SBATCH --time={hours}:00:00\n")

    assert _status("12.srun-header", per_task) == "correct"

    def total_tasks(nodes, gpus_per_node, hours):
        return (f"#SBATCH --nodes={nodes} --ntasks={nodes * gpus_per_node} --gpus-per-node={gpus_per_node}\n"
                f"#SBATCH --time={hours}:00:00\n")

    assert "unevenly" in evaluate("12.srun-header", total_tasks).message

    def both(nodes, gpus_per_node, hours):  # the fix line added, the broken --ntasks line kept: --ntasks wins
        return per_node(nodes, gpus_per_node, hours) + f"#SBATCH --ntasks={gpus_per_node}\n"

    v = evaluate("12.srun-header", both)
    assert v.status == "wrong" and "whole job" in v.message

    def wrong_time(nodes, gpus_per_node, hours):
        return per_node(nodes, gpus_per_node, hours).replace(f"-t {hours * 60}", f"-t {hours}")

    assert "--time" in evaluate("12.srun-header", wrong_time).message


def test_tunnel_exercise():
    ok = ["ssh -N -L 21983:cn0412:21983 carol@hpc-login.uni.example",
          "ssh -N -L 9000:cn0412:21983 hpc-login.uni.example",
          "ssh -N -J carol@hpc-login.uni.example -L 21983:cn0412:21983 carol@cn0412"]
    for cmd in ok:
        assert _status("12.tunnel", cmd) == "correct", cmd
    wrong = {"ssh -N -L 21983:localhost:21983 carol@hpc-login.uni.example": "localhost",
             "ssh -N -L 21983:cn0412:8888 carol@hpc-login.uni.example": "21983",
             "ssh -N -L 21983:cn0412:21983 carol@cn0412": "not reachable",
             "ssh -N -L 21983:cn0412:21983 bob@hpc-login.uni.example": "yourself",
             "ssh -N carol@hpc-login.uni.example": "-L"}
    for cmd, why in wrong.items():
        v = evaluate("12.tunnel", cmd)
        assert v.status == "wrong" and why in v.message, (cmd, v.message)


def test_problems_exercise():
    assert _status("12.whats-wrong", {"login-node", "missing-gpus", "fixed-port"}) == "correct"
    v = evaluate("12.whats-wrong", {"login-node", "fixed-port", "hostname-bind"})
    assert v.status == "wrong" and "1 real problem" in v.message and "hostname-bind" in v.message
    assert "unknown" in evaluate("12.whats-wrong", {"nope"}).message
    # the transcript really contains what the labels claim
    t = nb12.TRANSCRIPT
    assert "login1 ~]$ python train.py" in t and "--port=8888" in t
    assert gpus_per_node(parse_sbatch_header(t.split("cat lab.sbatch\n")[1])) is None


def test_header_parser_agrees_with_sbatch(slurm_cluster: LocalCluster, tmp_path: Path):
    """Submit a held job with a header and compare what slurmctld recorded with the parser's reading."""
    script = tmp_path / "job.sbatch"
    script.write_text("""#!/bin/bash
# comment lines do not end the header
#SBATCH -J parsed-name   # a trailing comment
#SBATCH -N 1 --ntasks-per-node=2
#SBATCH --cpus-per-task 3
#SBATCH -t 1-02:30
#SBATCH --gres=gpu:2
true
#SBATCH --job-name=too-late
""")
    o = parse_sbatch_header(script.read_text())
    job = slurm_cluster.run("sbatch", "--parsable", "--hold", "-o", "/dev/null", str(script)).stdout.strip()
    try:
        info = slurm_cluster.run("scontrol", "show", "job", "-o", job).stdout
    finally:
        slurm_cluster.run("scancel", job, check=False)
    field = dict(re.findall(r"([\w/:]+)=(\S*)", info))
    assert field["JobName"] == o["job-name"] == "parsed-name"
    assert field["NumNodes"].split("-")[0] == o["nodes"]
    assert field["NumTasks"] == str(int(o["nodes"]) * int(o["ntasks-per-node"]))
    assert field["CPUs/Task"] == o["cpus-per-task"]
    d, hms = field["TimeLimit"].split("-")
    h, m, s = map(int, hms.split(":"))
    assert int(d) * 1440 + h * 60 + m + s / 60 == time_minutes(o["time"])
    assert re.search(r"gpu:2", field.get("TresPerNode", "") + field.get("Gres", "")), info
