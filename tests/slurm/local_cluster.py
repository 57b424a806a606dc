"""A real single-node Slurm (munged + slurmctld + slurmd) in a private folder, for tests and instructors.

    python tests/slurm/local_cluster.py start /tmp/labkit-slurm    # prints the SLURM_CONF to export
    python tests/slurm/local_cluster.py start --install /tmp/labkit-slurm   # apt-get install first if needed
    python tests/slurm/local_cluster.py stop  /tmp/labkit-slurm

Everything lives under one folder: its own munge key and socket, slurm.conf with free ports, state,
spool, logs, and fake GPUs made with ``mknod DIR/dev/nvidiaN c 195 N`` (character devices, which is
what Slurm's gres plugin needs to set CUDA_VISIBLE_DEVICES). Nothing in /etc is touched and no
systemd is used, so it runs next to a system Slurm. It needs root (slurmd starts jobs as their user,
munged runs as user ``munge``) and the Debian packages ``slurmctld slurmd slurm-client munge``.

``stop`` ends only what ``start`` started: the daemons by pid, then any job process that carries this
cluster's marker variable (``LABKIT_LOCAL_SLURM=<folder>``) in its environment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["MARKER", "ClusterUnavailable", "LocalCluster", "install_packages", "missing_tools"]

MARKER = "LABKIT_LOCAL_SLURM"
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo", "mknod")
APT_PACKAGES = "slurmctld slurmd slurm-client munge"


class ClusterUnavailable(RuntimeError):
    """The local Slurm cannot be started here (a tool is missing, not root, or a daemon failed)."""


def missing_tools() -> list[str]:
    """Return the names of the programs the local cluster needs that are not on PATH (or in sbin)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [t for t in TOOLS if shutil.which(t, path=path) is None]


def install_packages() -> None:
    """apt-get install the Debian packages the cluster needs (root only; runs apt-get update first)."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("installing packages needs root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *APT_PACKAGES.split()],
                   check=True, env=env, stdout=subprocess.DEVNULL)


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _is_loopback(host: str) -> bool:
    try:
        return all(info[4][0].startswith("127.") for info in socket.getaddrinfo(host, None, socket.AF_INET))
    except socket.gaierror:
        return False


class LocalCluster:
    """A single-node Slurm cluster living in ``base``: start(), stop(), and helpers to run its commands."""

    def __init__(self, base: str | os.PathLike, cpus: int = 8, gpus: int = 4, partition: str = "debug"):
        if cpus < 1 or gpus < 0:
            raise ValueError(f"need cpus >= 1 and gpus >= 0, got cpus={cpus}, gpus={gpus}")
        self.base = Path(base).resolve()
        self.cpus, self.gpus, self.partition = cpus, gpus, partition
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.base / "slurm.conf"
        self.munge_socket = self.base / "munge" / "munge.socket"
        self._pidfile = self.base / "pids.json"

    # ---- environment for clients -----------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """The environment to run Slurm commands (and submit jobs) against this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        env[MARKER] = str(self.base)
        env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
        for var in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_NODELIST", "SLURM_JOB_NODELIST"):
            env.pop(var, None)  # never look like we are inside someone's job
        return env

    def run(self, *args: str, timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; return the completed process (text)."""
        return subprocess.run(list(args), env=kw.pop("env", self.env), capture_output=True, text=True,
                              timeout=timeout, check=check, **kw)

    # ---- start -------------------------------------------------------------------------------------
    def _write_config(self) -> None:
        ctld_port, slurmd_port = _free_ports(2)
        dev = self.base / "dev"
        gres_node = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        comm = "CommunicationParameters=NoInAddrAny\n" if _is_loopback(self.node) else ""
        self.conf.write_text(f"""\
# Written by tests/slurm/local_cluster.py: a private single-node cluster, not a template for a site.
ClusterName=labkit
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={self.base}/state
SlurmdSpoolDir={self.base}/spool
SlurmctldPidFile={self.base}/run/slurmctld.pid
SlurmdPidFile={self.base}/run/slurmd.pid
SlurmctldLogFile={self.base}/log/slurmctld.log
SlurmdLogFile={self.base}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
ReturnToService=2
MailProg=/bin/true
KillWait=30
# sbatch --wait polls every 2 s only while that is under MinJobAge/2; the default (300) grows it to 32 s.
MinJobAge=4
{comm}GresTypes=gpu
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus}{gres_node} State=UNKNOWN
PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        gres = f"Name=gpu File={dev}/nvidia[0-{self.gpus - 1}]\n" if self.gpus else ""
        (self.base / "gres.conf").write_text(gres)

    def _make_fake_gpus(self) -> None:
        dev = self.base / "dev"
        dev.mkdir()
        for i in range(self.gpus):
            subprocess.run(["mknod", str(dev / f"nvidia{i}"), "c", "195", str(i)], check=True)

    def _start_munged(self) -> subprocess.Popen:
        import pwd

        mdir = self.base / "munge"
        mdir.mkdir(mode=0o755)
        key = mdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        pw = pwd.getpwnam("munge")
        for p in (mdir, key):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        key.chmod(0o400)
        mdir.chmod(0o755)  # munged wants the socket's folder executable by all, writable by none else
        return self._spawn(
            ["munged", "-F", f"--socket={self.munge_socket}", f"--key-file={key}",
             f"--pid-file={mdir}/munged.pid", f"--log-file={mdir}/munged.log", f"--seed-file={mdir}/munged.seed"],
            "munged", user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])

    def _spawn(self, argv: list[str], name: str, **kw) -> subprocess.Popen:
        path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
        exe = shutil.which(argv[0], path=path)
        if exe is None:
            raise ClusterUnavailable(f"{argv[0]} not found; install: apt-get install -y {APT_PACKAGES}")
        with open(self.base / "log" / f"{name}.out", "ab") as out:  # the child keeps its own copy
            return subprocess.Popen([exe, *argv[1:]], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, **kw)

    def _wait_for(self, what: str, fn, timeout: float, procs: dict[str, subprocess.Popen]) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in procs.items():
                if p.poll() is not None:
                    raise ClusterUnavailable(f"{name} exited with {p.returncode} while waiting for {what}; "
                                             f"see {self.base}/log\n{self.logs()}")
            try:
                if fn():
                    return
            except (subprocess.SubprocessError, OSError):
                pass
            time.sleep(0.1)
        raise ClusterUnavailable(f"timed out after {timeout} s waiting for {what}; see {self.base}/log\n{self.logs()}")

    def start(self, timeout: float = 60) -> LocalCluster:
        """Create the folder's files, start munged, slurmctld and slurmd, and wait until `srun true` works."""
        missing = missing_tools()
        if missing:
            raise ClusterUnavailable(f"missing {', '.join(missing)}; install: apt-get install -y {APT_PACKAGES}")
        if os.geteuid() != 0:
            raise ClusterUnavailable("the local Slurm needs root (slurmd runs jobs as their user)")
        self.base.mkdir(parents=True, exist_ok=True)
        if self._pidfile.exists():
            raise ClusterUnavailable(f"{self.base} already holds a cluster; stop it first")
        self.base.chmod(0o755)
        for d in ("state", "spool", "log", "run"):
            (self.base / d).mkdir(exist_ok=True)
        t0 = time.monotonic()
        self._make_fake_gpus()
        self._write_config()
        procs: dict[str, subprocess.Popen] = {}
        try:
            procs["munged"] = self._start_munged()
            self._pidfile.write_text(json.dumps({k: p.pid for k, p in procs.items()}))
            self._wait_for("munged", self.munge_socket.exists, 15, procs)
            procs["slurmctld"] = self._spawn(["slurmctld", "-D", "-i"], "slurmctld")
            procs["slurmd"] = self._spawn(["slurmd", "-D"], "slurmd")
            self._pidfile.write_text(json.dumps({k: p.pid for k, p in procs.items()}))
            self._wait_for("the node to be idle",
                           lambda: self.run("sinfo", "-h", "-o", "%T", timeout=10).stdout.strip() == "idle",
                           timeout, procs)
            self._wait_for("`srun true`", lambda: self.run("srun", "-t", "1", "true", timeout=20).returncode == 0,
                           timeout, procs)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    # ---- stop --------------------------------------------------------------------------------------
    def marked_pids(self) -> list[int]:
        """Pids of processes whose environment carries this cluster's marker (daemons, steps, job processes)."""
        needle = f"{MARKER}={self.base}".encode() + b"\0"
        pids = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                if needle in (d / "environ").read_bytes() + b"\0":
                    pids.append(int(d.name))
            except OSError:
                continue
        return pids

    def stop(self, timeout: float = 20) -> None:
        """Cancel every job, stop the daemons, and kill whatever else carries this cluster's marker."""
        if self.conf.exists() and self.munge_socket.exists():
            try:
                jobs = self.run("squeue", "-h", "-o", "%i", timeout=10, check=False).stdout.split()
                if jobs:
                    self.run("scancel", *jobs, timeout=10, check=False)
                    deadline = time.monotonic() + timeout
                    while time.monotonic() < deadline and self.run(
                            "squeue", "-h", "-o", "%i", timeout=10, check=False).stdout.split():
                        time.sleep(0.2)
            except (subprocess.SubprocessError, OSError):
                pass
        pids = json.loads(self._pidfile.read_text()) if self._pidfile.exists() else {}
        for name in ("slurmd", "slurmctld", "munged"):
            pid = pids.get(name)
            if pid and _alive(pid):
                os.kill(pid, signal.SIGTERM)
                _reap(pid, timeout=10)
        for pid in self.marked_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._pidfile.unlink(missing_ok=True)

    def logs(self, tail: int = 15) -> str:
        """The last lines of each daemon log, for error messages."""
        out = []
        for f in sorted((self.base / "log").glob("*")) + [self.base / "munge" / "munged.log"]:
            if f.is_file():
                lines = f.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {f.name}\n" + "\n".join(lines))
        return "\n".join(out)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return
        except ChildProcessError:  # not our child (started by another `start` call): poll instead
            if not _alive(pid):
                return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["start", "stop"])
    ap.add_argument("folder", help="where the cluster's files live, e.g. /tmp/labkit-slurm")
    ap.add_argument("--cpus", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=4, help="fake GPUs (character devices) to advertise")
    ap.add_argument("--install", action="store_true",
                    help=f"apt-get install {APT_PACKAGES} first if a tool is missing")
    args = ap.parse_args(argv)
    cluster = LocalCluster(args.folder, cpus=args.cpus, gpus=args.gpus)
    if args.action == "start":
        try:
            if args.install and missing_tools():
                install_packages()
            cluster.start()
        except (ClusterUnavailable, subprocess.CalledProcessError) as exc:
            print(f"local Slurm failed to start: {exc}", file=sys.stderr)
            return 1
        print(f"local Slurm is up in {cluster.start_seconds:.1f} s (srun true works). Use it with:")
        print(f"export SLURM_CONF={cluster.conf}")
    else:
        cluster.stop()
        print(f"local Slurm in {cluster.base} stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
