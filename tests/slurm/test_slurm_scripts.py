"""The slurm/ scripts, submitted with sbatch to a real local Slurm (see conftest.py and local_cluster.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, node_is_loopback
from local_cluster import MARKER, LocalCluster
from needs import IN_CI

SLURM = ROOT / "slurm"
SCRIPTS = sorted(SLURM.glob("*.sbatch")) + [SLURM / "env.sh"]
# The promise: connection file + HTTP 200 within 10 s of the job starting (JupyterLab itself needs 3-5 s
# on an idle 2-core machine). LABKIT_JUPYTER_READY_LIMIT_S relaxes it on a machine shared with other work.
READY_LIMIT_S = float(os.environ.get("LABKIT_JUPYTER_READY_LIMIT_S", "10"))


# ---- helpers ---------------------------------------------------------------------------------------
def submit(cluster: LocalCluster, env: dict[str, str], script: Path, out: Path, *args: str) -> str:
    out.mkdir(exist_ok=True)
    res = cluster.run("sbatch", "--parsable", f"--output={out}/%j.out", *args, str(script), env=env)
    return res.stdout.strip().split(";")[0]


def job_state(cluster: LocalCluster, job: str) -> str:
    """RUNNING, PENDING, ... or "" once the job has left the queue."""
    return cluster.run("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip()


def wait_for(what: str, fn, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def job_pids(cluster: LocalCluster, job: str) -> dict[int, str]:
    """Every process of this cluster's job ``job``, found by the variables in its environment."""
    marker = f"{MARKER}={cluster.base}".encode()
    jobvar = f"SLURM_JOB_ID={job}".encode()
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            environ = (d / "environ").read_bytes().split(b"\0")
            if marker in environ and jobvar in environ:
                found[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def http_status(url: str, headers: dict[str, str] | None = None, data: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (urllib.error.URLError, ConnectionError):
        return 0, b""


def base_url(info: dict) -> str:
    """The server's URL by address, as a tunnel delivers it (Host: an IP, not the node's name).

    JupyterLab bound to a name that resolves to loopback refuses other Host headers (DNS-rebinding
    protection), which is right: through `ssh -L` the browser sends Host: localhost.
    """
    addr = socket.getaddrinfo(info["bind"], None, socket.AF_INET)[0][4][0]
    assert addr.startswith("127."), f"tests talk to loopback only, not {addr}"
    return f"http://{addr}:{info['port']}"


def jupyter_env(cluster: LocalCluster, job_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    env = dict(job_env)
    env["LABKIT_LOCAL_DIR"] = str(tmp_path / "node-local")
    (tmp_path / "node-local").mkdir()
    if not node_is_loopback(cluster.node):  # the tests listen on loopback only
        env["LABKIT_JUPYTER_BIND"] = "127.0.0.1"
    return env


def start_jupyter(cluster: LocalCluster, env: dict[str, str], tmp_path: Path) -> tuple[str, dict, float]:
    """Submit jupyter.sbatch; return (job id, connection info, seconds from RUNNING to HTTP 200)."""
    job = submit(cluster, env, SLURM / "jupyter.sbatch", tmp_path / "out")
    wait_for(f"job {job} to run", lambda: job_state(cluster, job) == "RUNNING", 30, interval=0.02)
    t_run = time.monotonic()
    conn = Path(env["HOME"]) / ".labkit" / "jupyter" / f"jupyter-{job}.json"

    def ready():
        if job_state(cluster, job) != "RUNNING":
            raise AssertionError(f"job {job} ended early:\n{(tmp_path / 'out' / f'{job}.out').read_text()}")
        if not conn.exists():
            return None
        info = json.loads(conn.read_text())
        code, _ = http_status(f"{base_url(info)}/api/status?token={info['token']}")
        return info if code == 200 else None

    try:
        info = wait_for(f"job {job}'s connection file and HTTP 200", ready, 60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{(tmp_path / 'out' / f'{job}.out').read_text()[-3000:]}") from None
    elapsed = time.monotonic() - t_run
    mode = stat.S_IMODE(conn.stat().st_mode)
    assert mode == 0o600, f"connection file mode is {oct(mode)}, must be 0o600"
    assert stat.S_IMODE(conn.parent.stat().st_mode) == 0o700
    return job, info, elapsed


def assert_gone(cluster: LocalCluster, job: str, conn: Path, timeout: float = 30) -> None:
    wait_for(f"job {job} to leave the queue", lambda: job_state(cluster, job) == "", timeout, interval=0.1)
    try:
        wait_for(f"job {job}'s processes to end", lambda: not job_pids(cluster, job), 10, interval=0.1)
    except AssertionError:
        raise AssertionError(f"processes of job {job} survived: {job_pids(cluster, job)}") from None
    assert not conn.exists(), "the connection file must be removed when the job ends"


# ---- static checks ---------------------------------------------------------------------------------
def test_scripts_are_shellcheck_clean():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        if IN_CI:
            pytest.fail("CI=true and shellcheck is missing (apt-get install -y shellcheck)")
        pytest.skip("shellcheck is not installed (apt-get install -y shellcheck)")
    assert len(SCRIPTS) >= 4, SCRIPTS
    res = subprocess.run([shellcheck, "-x", "-S", "style", *map(str, SCRIPTS)], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_settings_are_overridable_and_personal_paths_absent():
    for script in SCRIPTS:
        text = script.read_text()
        assert not re.search(r"/home/\w|/Users/\w|#SBATCH\s+(-A|--account|-p\b|--partition)", text), script
        for m in re.finditer(r"^(LABKIT_\w+)=\"(.*)\"\s*$", text, re.MULTILINE):  # top-level settings
            assert m.group(2).startswith(f"${{{m.group(1)}:-"), f"{script.name}: {m.group(0).strip()}"
    settings = re.findall(r"^(LABKIT_\w+)=\"\$\{\1:-", (SLURM / "env.sh").read_text(), re.MULTILINE)
    assert {"LABKIT_ENV", "LABKIT_VENV", "LABKIT_CONDA_ENV", "LABKIT_MODULES"} <= set(settings), settings


@pytest.mark.parametrize("script", ["jupyter.sbatch", "ddp.sbatch", "deepspeed.sbatch"])
def test_scripts_refuse_to_run_outside_a_job(script: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    res = subprocess.run(["bash", str(SLURM / script)], env=env, capture_output=True, text=True, timeout=30,
                         check=False)
    assert res.returncode == 2
    assert "sbatch" in res.stderr


# ---- the local cluster itself ----------------------------------------------------------------------
def test_local_cluster_schedules_fake_gpus(slurm_cluster: LocalCluster):
    res = slurm_cluster.run("srun", "-n", "1", "--gpus=2", "bash", "-c",
                            "echo $CUDA_VISIBLE_DEVICES $SLURM_GPUS_ON_NODE", timeout=60)
    assert res.stdout.split() == ["0,1", "2"]
    res = slurm_cluster.run("sbatch", "--wait", "-o", "/dev/null", "--wrap", "exit 3", check=False, timeout=60)
    assert res.returncode == 3, "sbatch --wait must return the job's exit code"


# ---- jupyter.sbatch --------------------------------------------------------------------------------
def test_jupyter_two_jobs_token_and_scancel(slurm_cluster: LocalCluster, job_env, tmp_path: Path,
                                            record_property):
    env = jupyter_env(slurm_cluster, job_env, tmp_path)
    job1, info1, t1 = start_jupyter(slurm_cluster, env, tmp_path)
    record_property("jupyter_ready_s", round(t1, 2))
    print(f"\njupyter.sbatch: job start -> connection file + HTTP 200 in {t1:.2f} s")
    assert t1 <= READY_LIMIT_S, f"JupyterLab answered {t1:.1f} s after the job started (limit {READY_LIMIT_S} s)"
    assert info1["node"] == slurm_cluster.node and info1["job_id"] == job1
    assert node_is_loopback(info1["bind"])
    base = base_url(info1)

    # the token opens it; no token or a wrong one does not
    code, body = http_status(f"{base}/api/status?token={info1['token']}")
    assert code == 200 and b"started" in body
    assert http_status(f"{base}/api/status")[0] == 403
    assert http_status(f"{base}/api/status?token={'0' * len(info1['token'])}")[0] == 403
    assert http_status(f"{base}/api/kernels")[0] == 403
    assert http_status(f"{base}/api/contents")[0] == 403

    # runtime files on node-local storage; the token never printed into the job output
    local = list((Path(env["LABKIT_LOCAL_DIR"])).glob(f"labkit-jupyter-{job1}.*"))
    assert len(local) == 1 and list((local[0] / "runtime").glob("jpserver-*.json"))
    log = (tmp_path / "out" / f"{job1}.out").read_text()
    user = info1["user"]
    assert f"ssh -N -L {info1['port']}:{info1['node']}:{info1['port']} {user}@" in log
    assert f"ssh -N -J {user}@" in log
    assert info1["token"] not in log, "the token must stay in the 0600 file, not in the job output"

    # a kernel, so that scancel has a grandchild in its own session to clean up
    code, _ = http_status(f"{base}/api/kernels", headers={"Authorization": f"token {info1['token']}"},
                          data=b"{}")
    assert code == 201
    wait_for("the kernel process", lambda: any("ipykernel" in c for c in job_pids(slurm_cluster, job1).values()),
             30, interval=0.1)

    # a second job on the same node, told to use job 1's port or the next one: it must skip the taken
    # port (the collision), and both answer
    env2 = dict(env, LABKIT_JUPYTER_PORT_MIN=str(info1["port"]), LABKIT_JUPYTER_PORT_MAX=str(info1["port"] + 1))
    job2, info2, t2 = start_jupyter(slurm_cluster, env2, tmp_path)
    print(f"jupyter.sbatch (second job): {t2:.2f} s")
    assert info2["node"] == info1["node"] and info2["port"] == info1["port"] + 1
    assert info2["token"] != info1["token"]
    for info in (info1, info2):
        assert http_status(f"{base_url(info)}/api/status?token={info['token']}")[0] == 200
    assert http_status(f"{base_url(info2)}/api/status?token={info1['token']}")[0] == 403

    # scancel: the job leaves the queue, no process of it survives, the connection file is gone
    before = job_pids(slurm_cluster, job1)
    assert len(before) >= 3, before  # batch shell, jupyter-lab, kernel
    slurm_cluster.run("scancel", job1)
    assert_gone(slurm_cluster, job1, Path(env["HOME"]) / ".labkit/jupyter" / f"jupyter-{job1}.json")
    assert not local[0].exists(), "the node-local runtime dir must be removed"
    assert http_status(f"{base_url(info2)}/api/status?token={info2['token']}")[0] == 200
    slurm_cluster.run("scancel", job2)
    assert_gone(slurm_cluster, job2, Path(env["HOME"]) / ".labkit/jupyter" / f"jupyter-{job2}.json")


def test_jupyter_walltime_signal_shuts_down_cleanly(slurm_cluster: LocalCluster, job_env, tmp_path: Path):
    env = jupyter_env(slurm_cluster, job_env, tmp_path)
    job, info, _ = start_jupyter(slurm_cluster, env, tmp_path)
    # --signal=B:TERM@120 delivers SIGTERM to the batch shell only; `scancel --batch` does exactly that.
    slurm_cluster.run("scancel", "--batch", "--signal=TERM", job)
    assert_gone(slurm_cluster, job, Path(env["HOME"]) / ".labkit/jupyter" / f"jupyter-{job}.json")
    log = (tmp_path / "out" / f"{job}.out").read_text()
    assert "stopping JupyterLab (signal TERM" in log
    assert re.search(r"JupyterLab job \d+ finished \(signal TERM", log), log[-2000:]
    assert "killed leftover process" not in log, "JupyterLab should stop by itself on SIGTERM"
    assert http_status(f"{base_url(info)}/api/status?token={info['token']}")[0] == 0


# ---- ddp.sbatch --------------------------------------------------------------------------------------
def _results(log: str) -> list[dict]:
    return [json.loads(m.group(1)) for m in re.finditer(r"^LABKIT_RESULT (\{.*\})\s*$", log, re.MULTILINE)]


def test_ddp_sbatch_two_ranks_gloo(slurm_cluster: LocalCluster, job_env, tmp_path: Path):
    pytest.importorskip("labkit.recipes.ddp", reason="labkit.recipes.ddp is not there yet")
    out = tmp_path / "out"
    out.mkdir()
    # 2 fake GPUs: Slurm sets CUDA_VISIBLE_DEVICES, but no GPU is usable, so the script falls back to gloo
    res = slurm_cluster.run("sbatch", "--wait", "--parsable", f"--output={out}/%j.out", "--gpus-per-node=2",
                            str(SLURM / "ddp.sbatch"), "--steps", "4", "--batch", "16",
                            env=job_env, check=False, timeout=300)
    job = res.stdout.strip().split(";")[0]
    log = (out / f"{job}.out").read_text()
    assert res.returncode == 0, log[-4000:]
    assert "2 ranks; one rank per task: Slurm gave 2 GPU(s) but none is usable here, so gloo on CPU" in log
    (result,) = _results(log)
    assert result["world_size"] == 2
    assert result["backend"] == "gloo" and result["device"] == "cpu"
    for key in ("grad_checksums", "param_checksums"):
        assert len(result[key]) == 2 and len(set(result[key])) == 1, f"ranks disagree on {key}: {result[key]}"
    assert not job_pids(slurm_cluster, job)


def test_ddp_sbatch_failure_is_reported_and_leaves_nothing(slurm_cluster: LocalCluster, job_env, tmp_path: Path):
    pytest.importorskip("labkit.recipes.ddp", reason="labkit.recipes.ddp is not there yet")
    out = tmp_path / "out"
    out.mkdir()
    res = slurm_cluster.run("sbatch", "--wait", "--parsable", f"--output={out}/%j.out",
                            str(SLURM / "ddp.sbatch"), "--steps", "4", "--crash-rank", "1", "--crash-step", "1",
                            env=job_env, check=False, timeout=300)
    job = res.stdout.strip().split(";")[0]
    log = (out / f"{job}.out").read_text()
    assert res.returncode != 0, log[-3000:]
    assert "training step finished with status" in log
    assert not _results(log)
    assert not job_pids(slurm_cluster, job)


def test_ddp_sbatch_walltime_warning_checkpoints_and_the_resubmission_resumes_bitwise(
        slurm_cluster: LocalCluster, job_env, tmp_path: Path):
    """The walltime warning (USR1 to the batch shell, as --signal=B:USR1@120 sends it; `scancel --batch` delivers the
    same signal without waiting for a real walltime) makes every rank checkpoint after the current step and exit 0;
    resubmitting with --resume then ends bit-identical to a run that was never interrupted."""
    out = tmp_path / "out"
    out.mkdir()
    common = ["--steps", "12", "--batch", "16", "--log-every", "1", "--slow-rank", "0", "--slow-ms", "150"]

    def run(ckpt: Path, *extra: str) -> tuple[int, str]:
        res = slurm_cluster.run("sbatch", "--wait", "--parsable", f"--output={out}/%j.out", str(SLURM / "ddp.sbatch"),
                                *common, "--ckpt-dir", str(ckpt), *extra, env=job_env, check=False, timeout=300)
        job = res.stdout.strip().split(";")[0]
        return res.returncode, (out / f"{job}.out").read_text()

    rc, log = run(tmp_path / "ref")
    assert rc == 0, log[-3000:]
    (reference,) = _results(log)

    ckpt = tmp_path / "stopped"
    res = slurm_cluster.run("sbatch", "--parsable", f"--output={out}/%j.out", str(SLURM / "ddp.sbatch"), *common,
                            "--ckpt-dir", str(ckpt), env=job_env)
    job = res.stdout.strip().split(";")[0]
    log_path = out / f"{job}.out"
    wait_for("step 3 in the log", lambda: log_path.exists() and "step 3/12" in log_path.read_text(), 120)
    slurm_cluster.run("scancel", "--batch", "--signal=USR1", job)
    wait_for("the job to end", lambda: job_state(slurm_cluster, job) == "", 120)
    log = log_path.read_text()
    (stopped,) = _results(log)
    assert "walltime warning (USR1)" in log and "stopped early with a checkpoint. To resume:" in log, log[-3000:]
    assert 3 <= stopped["stopped_at"] < 12 and stopped["checkpoint_steps"][-1] == stopped["stopped_at"]
    assert "training step finished with status 0" in log
    assert not job_pids(slurm_cluster, job)

    rc, log = run(ckpt, "--resume")
    assert rc == 0, log[-3000:]
    (resumed,) = _results(log)
    assert resumed["resumed_from"] == stopped["stopped_at"] and resumed["stopped_at"] is None
    assert resumed["param_checksums"] == reference["param_checksums"]  # bit-identical to the uninterrupted run
    assert resumed["losses"] == reference["losses"]


# ---- deepspeed.sbatch ------------------------------------------------------------------------------------
def test_deepspeed_sbatch_zero2_bf16(slurm_cluster: LocalCluster, job_env, tmp_path: Path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install .[deepspeed])")
    pytest.importorskip("labkit.recipes.zero", reason="labkit.recipes.zero is not there yet")
    out = tmp_path / "out"
    out.mkdir()
    env = dict(job_env, ZERO_CONFIG="zero2-bf16")
    res = slurm_cluster.run("sbatch", "--wait", "--parsable", f"--output={out}/%j.out",
                            str(SLURM / "deepspeed.sbatch"), "--steps", "3",
                            env=env, check=False, timeout=400)
    job = res.stdout.strip().split(";")[0]
    log = (out / f"{job}.out").read_text()
    assert res.returncode == 0, log[-4000:]
    assert "config zero2-bf16 (--runs 2:bf16)" in log
    (result,) = _results(log)
    (run,) = result["runs"]
    assert run["stage"] == 2 and run["dtype"] == "bf16", run
    assert len(run["checksums"]) == 2 and len(set(run["checksums"])) == 1, run["checksums"]
    assert not job_pids(slurm_cluster, job)


def test_deepspeed_sbatch_rejects_unknown_config(slurm_cluster: LocalCluster, job_env, tmp_path: Path):
    env = dict(job_env, ZERO_CONFIG="zero5-fp8")
    res = slurm_cluster.run("sbatch", "--wait", "--parsable", f"--output={tmp_path}/%j.out",
                            str(SLURM / "deepspeed.sbatch"), env=env, check=False, timeout=120)
    job = res.stdout.strip().split(";")[0]
    assert res.returncode == 1
    assert "ZERO_CONFIG must look like zero<0-3>" in (tmp_path / f"{job}.out").read_text()


# ---- notebook 12 against the real Slurm --------------------------------------------------------------
def test_notebook_10_live_cells_run_against_slurm(slurm_cluster: LocalCluster, job_env):
    """Notebook 12 with a reachable Slurm: its live cells run sinfo/sbatch/salloc/scancel for real.

    (Without Slurm, strict nbval of the stored notebook is the general notebook test's job; the cells
    that differ between the two cases are exactly the NBVAL_IGNORE_OUTPUT ones.)
    """
    import nbformat
    from nbclient import NotebookClient

    nb = ROOT / "notebooks" / "12_cluster_workflow.ipynb"
    book = nbformat.read(nb, as_version=4)
    NotebookClient(book, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(nb.parent)}}).execute(env=job_env)
    text = "\n".join(o.get("text", "") for c in book.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "Slurm reachable from this kernel: True" in text
    assert "task 1 of 2 on" in text and "task 1 on" in text and "is gone from the queue" in text
    assert "✗" not in text


# ---- slurm/env.sh on its own (no cluster needed) -----------------------------------------------------
def _activate(**settings: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "LABKIT_ROOT": str(ROOT), **settings}
    script = 'source slurm/env.sh && labkit_locate_root && labkit_activate && echo "PY=$(command -v python)"'
    return subprocess.run(["/bin/bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_env_sh_venv_and_none():
    if sys.prefix != sys.base_prefix:
        r = _activate(LABKIT_ENV="venv", LABKIT_VENV=sys.prefix)
        assert r.returncode == 0 and f"PY={sys.prefix}/bin/python" in r.stdout, r.stderr
    r = _activate(LABKIT_ENV="none", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert r.returncode == 0 and "environment: none" in r.stdout, r.stderr


@pytest.mark.parametrize("settings,message", [
    ({"LABKIT_ENV": "pip"}, "LABKIT_ENV must be auto, venv, conda, module or none"),
    ({"LABKIT_ENV": "venv", "LABKIT_VENV": "/nonexistent"}, "no virtual environment at LABKIT_VENV=/nonexistent"),
    ({"LABKIT_ENV": "conda", "PATH": "/usr/bin:/bin"}, "no conda on PATH"),
    ({"LABKIT_MODULES": "cuda/12.4", "PATH": "/usr/bin:/bin"}, "no 'module' command"),
    ({"LABKIT_ENV": "none", "PATH": "/nonexistent"}, "no python"),
    ({"LABKIT_ROOT": "/nonexistent"}, "has no slurm/ folder"),
])
def test_env_sh_explains_what_is_wrong(settings, message):
    r = _activate(**settings)
    assert r.returncode == 1 and message in r.stderr, (r.stdout, r.stderr)


def test_env_sh_says_when_labkit_is_not_installed(tmp_path: Path):
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if system_python is None:
        pytest.skip("no system python3 to stand in for an environment without labkit")
    (tmp_path / "python").symlink_to(system_python)
    r = _activate(LABKIT_ENV="none", PATH=f"{tmp_path}:/usr/bin:/bin")
    assert r.returncode == 1 and "cannot import labkit" in r.stderr and "pip install -e" in r.stderr, r.stderr
