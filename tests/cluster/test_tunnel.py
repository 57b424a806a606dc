"""The tunnel, exactly as printed: jupyter.sbatch on a compute node, the laptop's ``ssh -N -L`` through the login host.

A test user submits slurm/jupyter.sbatch on the login host. From the "laptop" (the root namespace, which can reach
the login host's sshd and nothing behind it), the test runs the very ``ssh -N -L ...`` line the job printed, with a
test-only key in a laptop home of its own (a private mount namespace puts it at ~ for ssh), and talks to
JupyterLab through it: 200 with the token, 403 without.
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
import shlex
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from nscluster import MARKER, NsCluster


def free_local_port() -> int:
    """A port free on the laptop's loopback now (the job is told to use it, so the printed -L can bind it)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if 20000 <= port <= 29999 or port >= 32768:
            return port
    raise AssertionError("no free local port")


def http(url: str, timeout: float = 10) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url), timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_for(what: str, fn, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture()
def laptop(cluster: NsCluster, tmp_path: Path) -> Path:
    """The laptop user's home: a test-only key, an ssh config naming the login host, its pinned host key."""
    home = cluster.base / f"laptop-{tmp_path.name}"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    home.chmod(0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "labkit-test-laptop", "-f",
                    str(ssh / "id_ed25519")], check=True, timeout=30)
    # What a user writes once: the login host's address, their key, and its host key pinned (no prompt).
    (ssh / "config").write_text(f"""\
Host login
    HostName {cluster.login_public_addr}
    Port 22
    IdentityFile ~/.ssh/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile ~/.ssh/known_hosts
    StrictHostKeyChecking yes
    BatchMode yes
    ExitOnForwardFailure yes
""")
    (ssh / "known_hosts").write_text(f"{cluster.login_public_addr} {cluster.host_public_key()}\n")
    return home


def test_jupyter_sbatch_tunnel_exactly_as_printed(cluster: NsCluster, student_env, workbook: Path, laptop: Path,
                                                  record_property):
    alice = cluster.add_user("tina", ssh_pubkey=(laptop / ".ssh" / "id_ed25519.pub").read_text())
    port = free_local_port()
    env = student_env(alice)
    env.update(LABKIT_JUPYTER_PORT_MIN=str(port), LABKIT_JUPYTER_PORT_MAX=str(port))
    t0 = time.monotonic()
    job = cluster.slurm("sbatch", "--parsable", f"--output={alice.home}/jupyter-%j.out",
                        str(workbook / "slurm" / "jupyter.sbatch"), user=alice.name, env=env,
                        cwd=str(alice.home)).stdout.strip()
    out = alice.home / f"jupyter-{job}.out"
    conn = alice.home / ".labkit" / "jupyter" / f"jupyter-{job}.json"
    tunnel: subprocess.Popen | None = None
    try:
        def printed():
            if cluster.jobcomp(job):
                raise AssertionError(f"job {job} ended early:\n{out.read_text() if out.exists() else ''}")
            text = out.read_text() if out.exists() else ""
            m = re.search(r"^ +(ssh -N -L \S+ \S+)$", text, re.MULTILINE)
            return m.group(1) if m and conn.exists() else None

        command = wait_for("the job to print its tunnel command", printed, 120)
        ready_s = time.monotonic() - t0
        info = json.loads(conn.read_text())
        record_property("jupyter_ready_s", round(ready_s, 2))
        print(f"\njupyter.sbatch as {alice.name}: submit -> tunnel line in {ready_s:.1f} s; printed: {command}")
        assert command == f"ssh -N -L {port}:{info['node']}:{port} {alice.name}@login", command
        assert info["node"] in ("node1", "node2") and info["bind"] == info["node"]

        # The laptop cannot reach the compute node itself: the tunnel is the only way in.
        with socket.socket() as s, pytest.raises(OSError) as exc:
            s.settimeout(5)
            s.connect((cluster.addr[info["node"]], port))
        assert exc.value.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH), exc.value

        # Run the printed line on the laptop: ssh reads ~/.ssh from the laptop home, mounted at /root privately.
        laptop_env = {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8", MARKER: cluster.env[MARKER]}
        tunnel = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", 'mount --bind "$0" /root && exec "$@"',
             str(laptop), *shlex.split(command)], env=laptop_env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

        def through_tunnel():
            if tunnel.poll() is not None:
                raise AssertionError(f"ssh exited with {tunnel.returncode}: {tunnel.stdout.read().decode()}\n"
                                     f"{(cluster.base / 'log' / 'sshd.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                return http(f"http://127.0.0.1:{port}/api/status?token={info['token']}") == 200
            return False

        wait_for("HTTP 200 through the tunnel", through_tunnel, 30, interval=0.2)
        assert http(f"http://127.0.0.1:{port}/api/status") == 403
        assert http(f"http://127.0.0.1:{port}/api/contents?token={'0' * len(info['token'])}") == 403
        assert http(info["url"]) == 200  # the connection file's URL, as the browser opens it (localhost)
        sshd_log = (cluster.base / "log" / "sshd.log").read_text()
        assert f"Accepted publickey for {alice.name} from {cluster.laptop_addr}" in sshd_log, sshd_log[-2000:]
    finally:
        if tunnel is not None:
            tunnel.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                tunnel.wait(10)
            if tunnel.poll() is None:
                tunnel.kill()
                tunnel.wait(10)
        cluster.slurm("scancel", job, check=False)
    rec = cluster.wait_job_end(job, 60)
    assert rec["JobState"] == "CANCELLED", rec
    wait_for("the job's processes to end", lambda: not cluster.job_processes(job), 20)
    assert not conn.exists(), "the connection file must go with the job"
    with pytest.raises(OSError):  # the forward died with the tunnel
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
