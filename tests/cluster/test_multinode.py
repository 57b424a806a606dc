"""ddp.sbatch and deepspeed.sbatch across two compute nodes (network namespaces): one torchrun per node, started
by srun, meeting at a c10d rendezvous on the first node; and a rank killed on one node ends the job on both."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from nscluster import NODES, NsCluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def root_env(cluster: NsCluster) -> dict[str, str]:
    """Jobs as root from this checkout, with this interpreter's environment (as tests/slurm does)."""
    env = cluster.env
    env["LABKIT_ROOT"] = str(REPO)
    if sys.prefix != sys.base_prefix:
        env["LABKIT_ENV"], env["LABKIT_VENV"] = "venv", sys.prefix
    else:
        env["LABKIT_ENV"] = "none"
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    for var in ("MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE", "ZERO_CONFIG", "LABKIT_STOP_FILE"):
        env.pop(var, None)
    env["OMP_NUM_THREADS"] = "1"
    env["DS_ACCELERATOR"] = "cpu"
    return env


def submit(cluster: NsCluster, env: dict[str, str], out: Path, *args: str) -> str:
    out.mkdir(exist_ok=True)
    res = cluster.slurm("sbatch", "--parsable", f"--output={out}/%j.out", *args, env=env, cwd=str(out))
    return res.stdout.strip().split(";")[0]


def results(log: str) -> list[dict]:
    return [json.loads(m.group(1)) for m in re.finditer(r"^LABKIT_RESULT (\{.*\})\s*$", log, re.MULTILINE)]


def assert_nodes_clean(cluster: NsCluster, job: str) -> None:
    """No process of the job on either node; only slurmd is left in each compute namespace."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and cluster.job_processes():
        time.sleep(0.1)
    assert not cluster.job_processes(), f"processes left on the nodes after job {job}: {cluster.job_processes()}"
    for n in NODES:
        assert cluster.ns_pids(n) == [cluster.daemon_pids()[f"slurmd-{n}"]], (n, cluster.ns_pids(n))


def launched_on(cluster: NsCluster, job: str) -> set[str]:
    """The nodes whose slurmd launched a task of the job's first step (srun's one torchrun per node)."""
    nodes = set()
    for n in NODES:
        log = (cluster.base / "log" / f"slurmd-{n}.log").read_text()
        if re.search(rf"launch task StepId={job}\.0 ", log):
            nodes.add(n)
    return nodes


def test_ddp_two_nodes_two_ranks_each(cluster: NsCluster, root_env, tmp_path: Path, record_property):
    t0 = time.monotonic()
    job = submit(cluster, root_env, tmp_path / "out", "-N2", "--ntasks-per-node=2", str(REPO / "slurm" / "ddp.sbatch"),
                 "--steps", "6", "--batch", "16")
    rec = cluster.wait_job_end(job, 240)
    seconds = time.monotonic() - t0
    record_property("ddp_2x2_s", round(seconds, 1))
    log = (tmp_path / "out" / f"{job}.out").read_text()
    assert rec["JobState"] == "COMPLETED" and rec["ExitCode"] == "0:0", log[-4000:]
    assert rec["NodeList"] == "node[1-2]", rec
    assert "2 node(s) [node[1-2]] x 2 rank(s) = 4 ranks" in log, log[:2000]
    assert re.search(r"rendezvous node1:\d+", log), log[:2000]
    assert launched_on(cluster, job) == set(NODES), "srun must start one torchrun on each node"
    (result,) = results(log)
    assert result["world_size"] == 4 and result["backend"] == "gloo", result
    for key in ("grad_checksums", "param_checksums"):
        assert len(result[key]) == 4 and len(set(result[key])) == 1, f"ranks disagree on {key}: {result[key]}"
    assert result["losses"][-1] < result["losses"][0], result["losses"]
    print(f"\nddp.sbatch, 2 nodes x 2 ranks: {seconds:.1f} s, checksums {result['param_checksums'][0]}")
    assert_nodes_clean(cluster, job)


def test_ddp_rank_killed_on_one_node_fails_the_job_on_both(cluster: NsCluster, root_env, tmp_path: Path):
    out = tmp_path / "out"
    job = submit(cluster, root_env, out, "-N2", "--ntasks-per-node=2", str(REPO / "slurm" / "ddp.sbatch"),
                 "--steps", "5000", "--batch", "16", "--log-every", "1", "--slow-rank", "0", "--slow-ms", "50")
    log_path = out / f"{job}.out"
    deadline = time.monotonic() + 180
    while not (log_path.exists() and re.search(r"^step 3/", log_path.read_text(), re.MULTILINE)):
        assert time.monotonic() < deadline and not cluster.jobcomp(job), \
            log_path.read_text()[-3000:] if log_path.exists() else "no output"
        time.sleep(0.2)
    # a rank on node2 (not the node that hosts the rendezvous): a worker process, not its torchrun agent
    victims = []
    for pid, cmd in cluster.job_processes(job).items():
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if cmd.startswith("node2:") and b"LOCAL_RANK=1" in env and "labkit.recipes.ddp" in cmd \
                and "torchrun" not in cmd and "torch.distributed.run" not in cmd:
            victims.append(pid)
    assert len(victims) == 1, cluster.job_processes(job)
    rank = next(v.split(b"=", 1)[1].decode() for v in Path(f"/proc/{victims[0]}/environ").read_bytes().split(b"\0")
                if v.startswith(b"RANK="))
    t_kill = time.monotonic()
    os.kill(victims[0], signal.SIGKILL)
    rec = cluster.wait_job_end(job, 120)
    seconds = time.monotonic() - t_kill
    log = log_path.read_text()
    print(f"\nSIGKILL of rank {rank} on node2 -> job {rec['JobState']} {rec['ExitCode']} in {seconds:.1f} s")
    assert rec["JobState"] == "FAILED" and rec["ExitCode"] != "0:0", (rec, log[-3000:])
    assert seconds < 60, f"the job took {seconds:.0f} s to fail after the kill"
    assert re.search(r"training step finished with status [1-9]", log), log[-3000:]
    assert f"rank      : {rank} (local_rank: 1)" in log and "SIGKILL" in log, log[-3000:]
    assert not results(log)
    assert_nodes_clean(cluster, job)


def test_deepspeed_two_nodes(cluster: NsCluster, root_env, tmp_path: Path, record_property):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install .[deepspeed])")
    env = dict(root_env, ZERO_CONFIG="zero2-bf16")
    t0 = time.monotonic()
    job = submit(cluster, env, tmp_path / "out", "-N2", "--ntasks-per-node=1",
                 str(REPO / "slurm" / "deepspeed.sbatch"), "--steps", "3")
    rec = cluster.wait_job_end(job, 300)
    seconds = time.monotonic() - t0
    record_property("deepspeed_2x1_s", round(seconds, 1))
    log = (tmp_path / "out" / f"{job}.out").read_text()
    assert rec["JobState"] == "COMPLETED", log[-4000:]
    assert "2 node(s) [node[1-2]] x 1 rank(s) = 2 ranks" in log, log[:2000]
    assert launched_on(cluster, job) == set(NODES)
    (result,) = results(log)
    (run,) = result["runs"]
    assert result["world_size"] == 2 and run["stage"] == 2 and run["dtype"] == "bf16", result
    assert len(run["checksums"]) == 2 and len(set(run["checksums"])) == 1, run["checksums"]
    print(f"\ndeepspeed.sbatch zero2-bf16, 2 nodes x 1 rank: {seconds:.1f} s")
    assert_nodes_clean(cluster, job)
