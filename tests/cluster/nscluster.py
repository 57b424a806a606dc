"""A Slurm cluster of network namespaces on one machine: a login host and two compute nodes (tests only).

    python tests/cluster/nscluster.py up        # prints the run id, the folder and how to use it
    python tests/cluster/nscluster.py down ID   # or: down --stale (every run whose owner has died)

The hosts are Linux network namespaces, each with its own address, hostname (a UTS namespace per
process) and ``/etc/hosts`` (``/etc/netns/<ns>/hosts``, which ``ip netns exec`` mounts over /etc/hosts)::

    "laptop" = the root namespace  10.X.Y.1/30 ──veth── 10.X.Y.2/30 (pub0)  login   slurmctld, sshd :22
                                                        10.X.Z.10/24 (br0)  │ bridge
                                           node1  10.X.Z.11/24 (eth0) ──veth┤       slurmd -N node1
                                           node2  10.X.Z.12/24 (eth0) ──veth┘       slurmd -N node2

* The laptop reaches the login host only, as on a real site: the cluster network lives inside the login
  namespace (its bridge), and the root namespace holds an ``unreachable`` route for it, so a stray connect
  fails at once and no packet for it ever leaves the machine. Nothing listens outside these namespaces.
* One munged (root namespace, its own key and socket) serves every host; slurmctld runs on the login
  host, two slurmd with distinct NodeNames on the compute nodes; Slurm's client commands run on the login
  host (``cluster.slurm(...)``), optionally as a test user. Two fake GPUs per node (``mknod`` character
  devices, see tests/slurm/local_cluster.py). Completed jobs are recorded in ``jobcomp.txt``.
* Unique names: namespaces ``lkc<id>-login`` etc., the root-side veth ``lkc<id>pub``, users ``lk<id><name>``,
  and the folder ``/tmp/labkit-nscluster-<id>``, whose ``owner.json`` names the process that made it.
  ``cleanup_stale()`` tears down every run whose owner is gone (a crashed earlier run) before a new one.
* ``down()`` ends everything: jobs (scancel), every process in the namespaces, the processes in the root
  namespace that carry this run's marker variable (munged, an ssh client...), the links, the namespaces,
  ``/etc/netns/<ns>``, the route, the test users, the folder, and ``/run/sshd`` if this run made it and no other
  run is up. It is idempotent and never raises for a part that is already gone; what it could not remove it
  returns.

Needs root, iproute2, util-linux (unshare, runuser), munge, slurmctld, slurmd, slurm-client, openssh-server.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import pwd
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["APT_PACKAGES", "MARKER", "ClusterError", "NsCluster", "ClusterUser", "cleanup_stale", "missing_tools"]

MARKER = "LABKIT_NSCLUSTER"
PREFIX = "lkc"
STATE_ROOT = Path("/tmp")
HOSTS = ("login", "node1", "node2")
NODES = ("node1", "node2")
APT_PACKAGES = "iproute2 munge slurmctld slurmd slurm-client openssh-server"
TOOLS = ("ip", "unshare", "runuser", "useradd", "userdel", "mknod", "munged", "slurmctld", "slurmd", "sbatch",
         "srun", "squeue", "scontrol", "scancel", "sinfo", "sshd", "ssh", "ssh-keygen")
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_NS_RE = re.compile(rf"^{PREFIX}([0-9a-f]{{4}})-({'|'.join(HOSTS)})$")


class ClusterError(RuntimeError):
    """The namespace cluster could not be started (a tool is missing, not root, or a daemon failed)."""


def missing_tools() -> list[str]:
    """The programs the cluster needs that are not on PATH (or in sbin)."""
    path = os.environ.get("PATH", "") + ":" + SBIN_PATH
    return [t for t in TOOLS if shutil.which(t, path=path) is None]


def _tool(name: str) -> str:
    """The absolute path of a system tool (callers may run with a user's PATH, which lacks sbin)."""
    return shutil.which(name, path=SBIN_PATH) or name


def _sh(*argv: str, check: bool = True, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=timeout, **kw)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): pid + this is unique."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _kill_and_wait(pids: list[int], timeout: float = 10.0) -> list[int]:
    """SIGTERM ``pids``, SIGKILL what is left after ``timeout``; return the pids still alive after that."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            for pid in pids:  # reap our own children, else they stay zombies and look alive
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
            pids = [p for p in pids if _alive(p) and not _is_zombie(p)]
            if not pids:
                return []
            time.sleep(0.05)
    return pids


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


@dataclass(frozen=True)
class ClusterUser:
    """A Unix account made for one run (removed by ``down()``)."""

    name: str
    uid: int
    gid: int
    home: Path


class NsCluster:
    """A login host and two compute nodes in network namespaces, with Slurm and sshd. See the module doc."""

    def __init__(self, run_id: str | None = None, base: Path | None = None) -> None:
        self.run_id = run_id or secrets.token_hex(2)
        if not re.fullmatch(r"[0-9a-f]{4}", self.run_id):
            raise ValueError(f"run id must be 4 hex digits, got {self.run_id!r}")
        self.base = Path(base) if base else STATE_ROOT / f"labkit-nscluster-{self.run_id}"
        self.conf = self.base / "slurm.conf"
        self.munge_socket = self.base / "munge" / "munge.socket"
        self.ns = {h: f"{PREFIX}{self.run_id}-{h}" for h in HOSTS}
        self.pub_if = f"{PREFIX}{self.run_id}pub"
        self._state_file = self.base / "state.json"
        self.state: dict = json.loads(self._state_file.read_text()) if self._state_file.exists() else {}

    # ---- addresses -------------------------------------------------------------------------------------
    @property
    def addr(self) -> dict[str, str]:
        """Each host's address on the cluster network (login, node1, node2)."""
        net = ipaddress.ip_network(self.state["cluster_net"])
        return {"login": str(net[10]), "node1": str(net[11]), "node2": str(net[12])}

    @property
    def laptop_addr(self) -> str:
        """The root namespace's end of the laptop <-> login link."""
        return str(ipaddress.ip_network(self.state["public_net"])[1])

    @property
    def login_public_addr(self) -> str:
        """The login host's address as the laptop sees it (sshd and the hub listen there)."""
        return str(ipaddress.ip_network(self.state["public_net"])[2])

    def _pick_networks(self) -> tuple[str, str]:
        """A /30 for the laptop link that overlaps nothing routed in the root namespace, and a /24 for the cluster."""
        used = []
        for line in _sh("ip", "-4", "route", "show", "table", "all").stdout.splitlines():
            words = line.split()
            for w in words[:2]:
                with contextlib.suppress(ValueError):
                    if w != "default":
                        used.append(ipaddress.ip_network(w, strict=False))
        for line in _sh("ip", "-4", "-o", "addr", "show").stdout.splitlines():
            m = re.search(r"inet (\S+)", line)
            if m:
                used.append(ipaddress.ip_interface(m.group(1)).network)
        rng = random.Random(secrets.randbits(32))
        for _ in range(500):
            second, third = rng.randrange(200, 255), rng.randrange(0, 255, 2)
            public = ipaddress.ip_network(f"10.{second}.{third}.0/30")
            cluster = ipaddress.ip_network(f"10.{second}.{third + 1}.0/24")
            if not any(public.overlaps(u) or cluster.overlaps(u) for u in used):
                return str(public), str(cluster)
        raise ClusterError("no free 10.x.y.0/23 for the test networks")

    # ---- running things --------------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """The environment for daemons and client commands: this cluster's SLURM_CONF and marker."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))
               and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
        env.update(SLURM_CONF=str(self.conf), PATH=env.get("PATH", "/usr/bin:/bin") + ":" + SBIN_PATH)
        env[MARKER] = str(self.base)
        return env

    def ns_argv(self, host: str, argv: list[str], user: str | None = None) -> list[str]:
        """argv that runs ``argv`` on ``host``: its network namespace, /etc/hosts and hostname, as ``user``."""
        if host not in self.ns:
            raise ValueError(f"host must be one of {HOSTS}, got {host!r}")
        inner = [_tool("runuser"), "-u", user, "--", *argv] if user else list(argv)
        return [_tool("ip"), "netns", "exec", self.ns[host], _tool("unshare"), "--uts", "--",
                "/bin/sh", "-c", 'hostname "$0" && exec "$@"', host, *inner]

    def run(self, host: str, *argv: str, user: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run a command on ``host`` (as ``user``) and return the completed process (text)."""
        return subprocess.run(self.ns_argv(host, list(argv), user), env=env or self.env, capture_output=True,
                              text=True, timeout=timeout, check=check, **kw)

    def popen(self, host: str, argv: list[str], log: Path, user: str | None = None,
              env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
        """Start a long-running command on ``host``; its output goes to ``log``. The pid is the command's own
        (ip netns exec, unshare and sh all exec), so killing it kills the daemon."""
        with open(log, "ab") as out:
            return subprocess.Popen(self.ns_argv(host, argv, user), env=env or self.env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, **kw)

    def slurm(self, *argv: str, user: str | None = None, **kw) -> subprocess.CompletedProcess:
        """A Slurm client command on the login host (where users type them)."""
        return self.run("login", *argv, user=user, **kw)

    def ns_pids(self, host: str) -> list[int]:
        """Every process in ``host``'s network namespace."""
        res = _sh("ip", "netns", "pids", self.ns[host], check=False)
        return [int(p) for p in res.stdout.split()] if res.returncode == 0 else []

    def daemon_pids(self) -> dict[str, int]:
        return dict(self.state.get("pids", {}))

    # ---- up --------------------------------------------------------------------------------------------
    def _save(self) -> None:
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self._state_file)

    def up(self, timeout: float = 60) -> NsCluster:
        """Build the network, start munged, slurmctld, two slurmd and sshd; wait until ``srun -N2`` works."""
        missing = missing_tools()
        if missing:
            raise ClusterError(f"missing {', '.join(missing)}; apt-get install -y {APT_PACKAGES}")
        if os.geteuid() != 0:
            raise ClusterError("the namespace cluster needs root (network namespaces, slurmd, test users)")
        t0 = time.monotonic()
        self.base.mkdir(mode=0o755, parents=True, exist_ok=False)
        self.base.chmod(0o755)  # test users' homes live below it
        me = os.getpid()
        (self.base / "owner.json").write_text(json.dumps({"pid": me, "start": _start_time(me)}))
        for d in ("log", "run", "state", "spool", "ssh", "home", "dev"):
            (self.base / d).mkdir(mode=0o755)
        (self.base / "ssh").chmod(0o700)
        public, cluster = self._pick_networks()
        self.state = {"public_net": public, "cluster_net": cluster, "pids": {}, "users": [], "links": []}
        self._save()
        try:
            self._network()
            self._write_slurm_files()
            self._start_munged()
            self._start_slurm(timeout)
            self._start_sshd()
        except BaseException:
            self.down()
            raise
        self.up_seconds = time.monotonic() - t0
        return self

    def _network(self) -> None:
        login = self.ns["login"]
        with contextlib.suppress(FileExistsError):
            Path("/etc/netns").mkdir(mode=0o755)
        # IPv4 only, as most clusters' /etc/hosts. (::ffff:10.x lines would quiet a c10d warning about reverse
        # lookups, but then servers that bind a hostname, JupyterLab among them, try that v6 address and fail.)
        hosts = ["127.0.0.1 localhost", *(f"{a} {h}" for h, a in self.addr.items())]
        for ns in self.ns.values():
            _sh("ip", "netns", "add", ns)
            self.state.setdefault("netns", []).append(ns)
            self._save()
            etc = Path("/etc/netns") / ns
            etc.mkdir(mode=0o755, exist_ok=True)
            (etc / "hosts").write_text("\n".join(hosts) + "\n")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1")
            _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1")
        prefix = ipaddress.ip_network(self.state["cluster_net"]).prefixlen
        _sh("ip", "-n", login, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", login, "addr", "add", f"{self.addr['login']}/{prefix}", "dev", "br0")
        _sh("ip", "-n", login, "link", "set", "br0", "up")
        for n in NODES:
            _sh("ip", "-n", login, "link", "add", f"v-{n}", "type", "veth", "peer", "name", "eth0", "netns",
                self.ns[n])
            _sh("ip", "-n", login, "link", "set", f"v-{n}", "master", "br0", "up")
            _sh("ip", "-n", self.ns[n], "addr", "add", f"{self.addr[n]}/{prefix}", "dev", "eth0")
            _sh("ip", "-n", self.ns[n], "link", "set", "eth0", "up")
        # The laptop's link to the login host, and nothing else: the cluster network is unreachable from here.
        _sh("ip", "link", "add", self.pub_if, "type", "veth", "peer", "name", "pub0", "netns", login)
        self.state["links"].append(self.pub_if)
        self._save()
        _sh("sysctl", "-q", "-w", f"net.ipv6.conf.{self.pub_if}.disable_ipv6=1", check=False)
        _sh("ip", "addr", "add", f"{self.laptop_addr}/30", "dev", self.pub_if)
        _sh("ip", "link", "set", self.pub_if, "up")
        _sh("ip", "-n", login, "addr", "add", f"{self.login_public_addr}/30", "dev", "pub0")
        _sh("ip", "-n", login, "link", "set", "pub0", "up")
        _sh("ip", "route", "add", "unreachable", self.state["cluster_net"])
        self.state["route"] = self.state["cluster_net"]
        self._save()

    def _write_slurm_files(self) -> None:
        b = self.base
        nodes = []
        gres = []
        for n in NODES:
            dev = b / "dev" / n
            dev.mkdir()
            for i in range(2):  # character devices: what Slurm's gres plugin needs to set CUDA_VISIBLE_DEVICES
                _sh("mknod", str(dev / f"nvidia{i}"), "c", "195", str(i))
            gres.append(f"NodeName={n} Name=gpu File={dev}/nvidia[0-1]")
            nodes.append(f"NodeName={n} NodeAddr={self.addr[n]} NodeHostname={n} CPUs=2 Boards=1 SocketsPerBoard=1 "
                         f"CoresPerSocket=2 ThreadsPerCore=1 RealMemory=4000 Gres=gpu:2 State=UNKNOWN")
        self.conf.write_text(f"""\
# Written by tests/cluster/nscluster.py: a test cluster of network namespaces, not a template for a site.
ClusterName=labkit{self.run_id}
SlurmctldHost=login({self.addr['login']})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
PlugStackConfig={b}/plugstack.conf
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={b}/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MailProg=/bin/true
KillWait=10
MinJobAge=120
GresTypes=gpu
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool/%n
SlurmctldPidFile={b}/run/slurmctld.pid
SlurmdPidFile={b}/run/slurmd-%n.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
{chr(10).join(nodes)}
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=08:00:00 State=UP
PartitionName=gpu Nodes=node[1-2] MaxTime=08:00:00 State=UP
""")
        (b / "gres.conf").write_text("\n".join(gres) + "\n")
        # slurmd 22.05 always starts a cgroup plugin; its autodetect fails inside `ip netns exec` (which
        # remounts /sys). Naming v1 skips the autodetect; proctrack/linuxproc + task/none use no cgroup.
        (b / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        (b / "plugstack.conf").write_text("")  # not /etc/slurm/plugstack.conf
        for n in NODES:
            (b / "spool" / n).mkdir()

    def _record(self, name: str, proc: subprocess.Popen) -> None:
        self.state["pids"][name] = proc.pid
        self._save()

    def _wait(self, what: str, fn, timeout: float, watch: list[str]) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in watch:
                pid = self.state["pids"].get(name)
                if pid and (not _alive(pid) or _is_zombie(pid)):
                    raise ClusterError(f"{name} exited while waiting for {what}\n{self.logs()}")
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                if fn():
                    return
            time.sleep(0.1)
        raise ClusterError(f"timed out after {timeout} s waiting for {what}\n{self.logs()}")

    def _start_munged(self) -> None:
        mdir = self.base / "munge"
        mdir.mkdir(mode=0o755)
        key = mdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        pw = pwd.getpwnam("munge")
        for p in (mdir, key):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        key.chmod(0o400)
        exe = shutil.which("munged", path=SBIN_PATH)
        with open(self.base / "log" / "munged.out", "ab") as out:
            proc = subprocess.Popen(
                [exe, "-F", f"--socket={self.munge_socket}", f"--key-file={key}", f"--pid-file={mdir}/munged.pid",
                 f"--log-file={mdir}/munged.log", f"--seed-file={mdir}/munged.seed"],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        self._record("munged", proc)
        self._wait("munged", self.munge_socket.exists, 15, ["munged"])

    def _start_slurm(self, timeout: float) -> None:
        log = self.base / "log"
        self._record("slurmctld", self.popen("login", ["slurmctld", "-D", "-i", "-f", str(self.conf)],
                                             log / "slurmctld.out"))
        for n in NODES:
            self._record(f"slurmd-{n}", self.popen(n, ["slurmd", "-D", "-f", str(self.conf), "-N", n],
                                                   log / f"slurmd-{n}.out"))
        watch = ["munged", "slurmctld", "slurmd-node1", "slurmd-node2"]
        self._wait("both nodes idle", lambda: self.slurm("sinfo", "-h", "-p", "debug", "-t", "idle", "-o", "%D",
                                                         timeout=10).stdout.strip() == "2", timeout, watch)
        self._wait("`srun -N2 hostname`", lambda: sorted(self.slurm(
            "timeout", "20", "srun", "-N2", "-t", "1", "hostname", timeout=30).stdout.split()) == list(NODES),
            timeout, watch)

    def _start_sshd(self) -> None:
        ssh = self.base / "ssh"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"labkit-nscluster-{self.run_id}-host",
            "-f", str(ssh / "host_ed25519"))
        (self.base / "authorized_keys").mkdir(mode=0o755)  # sshd reads them as the user: not under ssh/ (0700)
        (self.base / "sshd_config").write_text(f"""\
# Written by tests/cluster/nscluster.py: the login host's sshd, keys only, listening on its laptop-facing address.
ListenAddress {self.login_public_addr}:22
HostKey {ssh}/host_ed25519
PidFile {self.base}/run/sshd.pid
AuthorizedKeysFile {self.base}/authorized_keys/%u
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UsePAM no
StrictModes no
AllowTcpForwarding local
GatewayPorts no
X11Forwarding no
PermitTunnel no
PrintMotd no
""")
        if not Path("/run/sshd").exists():  # sshd's privilege-separation directory
            Path("/run/sshd").mkdir(mode=0o755)
            self.state["made_run_sshd"] = True
            self._save()
        sshd = shutil.which("sshd", path=SBIN_PATH)
        _sh(sshd, "-t", "-f", str(self.base / "sshd_config"))
        self._record("sshd", self.popen("login", [sshd, "-D", "-e", "-f", str(self.base / "sshd_config")],
                                        self.base / "log" / "sshd.log"))
        self._wait("sshd", lambda: _port_open_in(self, "login", self.login_public_addr, 22), 15, ["sshd"])

    def host_public_key(self) -> str:
        """The login host's ssh host key, "ssh-ed25519 AAAA..." (for a known_hosts line)."""
        return " ".join((self.base / "ssh" / "host_ed25519.pub").read_text().split()[:2])

    # ---- users -----------------------------------------------------------------------------------------
    def add_user(self, short: str, ssh_pubkey: str | None = None) -> ClusterUser:
        """A Unix account ``lk<id><short>`` with a 0700 home under the run folder (no password, not locked)."""
        if not re.fullmatch(r"[a-z]{1,12}", short):
            raise ValueError(f"short user name must be 1-12 lowercase letters, got {short!r}")
        name = f"lk{self.run_id}{short}"
        home = self.base / "home" / name
        self.state["users"].append(name)
        self._save()
        # -p '*': no password works, yet the account is not "locked" ('!'), which sshd would refuse.
        _sh("useradd", "-m", "-d", str(home), "-s", "/bin/bash", "-p", "*", "-c",
            f"labkit-nscluster {self.run_id}", "-K", "UMASK=077", name, timeout=60)
        home.chmod(0o700)
        pw = pwd.getpwnam(name)
        if ssh_pubkey:
            f = self.base / "authorized_keys" / name
            f.write_text(ssh_pubkey.strip() + "\n")
            f.chmod(0o644)
        return ClusterUser(name, pw.pw_uid, pw.pw_gid, home)

    # ---- jobs --------------------------------------------------------------------------------------------
    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict ({} once the record has left slurmctld)."""
        res = self.slurm("scontrol", "show", "job", "-o", str(job_id), check=False, timeout=20)
        if res.returncode != 0:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", res.stdout))

    def jobcomp(self, job_id: str) -> dict[str, str]:
        """The job's completion record (jobcomp/filetxt), {} while it has none."""
        path = self.base / "jobcomp.txt"
        if not path.exists():
            return {}
        for line in path.read_text().splitlines():
            rec = dict(re.findall(r"(\w+)=(\S*)", line))
            if rec.get("JobId") == str(job_id):
                return rec
        return {}

    def wait_job_end(self, job_id: str, timeout: float = 120) -> dict[str, str]:
        """Wait until the job has a completion record; return it (JobState, ExitCode, NodeList...)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rec = self.jobcomp(job_id)
            if rec:
                return rec
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} did not end within {timeout} s: {self.job(job_id)}")

    def job_processes(self, job_id: str | None = None) -> dict[int, str]:
        """Processes on the compute nodes other than slurmd (of one job, if given): {pid: command line}."""
        daemons = set(self.state.get("pids", {}).values())
        found = {}
        for n in NODES:
            for pid in self.ns_pids(n):
                if pid in daemons:
                    continue
                try:
                    if job_id is not None:
                        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                        if f"SLURM_JOB_ID={job_id}".encode() not in env:
                            continue
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                found[pid] = f"{n}: {cmd}"
        return found

    # ---- logs ---------------------------------------------------------------------------------------------
    def logs(self, tail: int = 20) -> str:
        out = []
        for f in sorted((self.base / "log").glob("*")) + [self.base / "munge" / "munged.log"]:
            if f.is_file():
                lines = f.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {f.name}\n" + "\n".join(lines))
        return "\n".join(out)

    # ---- down ---------------------------------------------------------------------------------------------
    def marked_pids(self) -> list[int]:
        """Processes anywhere whose environment carries this run's marker (munged, clients, an ssh tunnel...)."""
        needle = f"{MARKER}={self.base}".encode()
        pids = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                if needle in (d / "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                continue
        return pids

    def down(self, keep_files: bool = False) -> list[str]:
        """Tear everything down (see the module doc); return what could not be removed ([] when all is gone)."""
        problems: list[str] = []
        existing = set(_sh("ip", "netns", "list", check=False).stdout.split())
        live = {h: ns for h, ns in self.ns.items() if ns in existing}
        ctld = self.state.get("pids", {}).get("slurmctld")
        if ctld and _alive(ctld) and self.munge_socket.exists():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                jobs = self.slurm("squeue", "-h", "-o", "%i", timeout=10, check=False).stdout.split()
                if jobs:
                    self.slurm("scancel", *jobs, timeout=10, check=False)
                    deadline = time.monotonic() + 15
                    while time.monotonic() < deadline and self.slurm(
                            "squeue", "-h", "-o", "%i", timeout=10, check=False).stdout.split():
                        time.sleep(0.2)
        # every process in the namespaces: jobs, servers, the hub, sshd, slurmd, slurmctld
        pids = [p for ns in live.values() for p in _sh("ip", "netns", "pids", ns, check=False).stdout.split()]
        left = _kill_and_wait([int(p) for p in pids])
        problems += [f"process {p} survived in a namespace" for p in left]
        # what we started in the root namespace: munged (by pid, if it is still the one we started), marked ones
        munged = self.state.get("pids", {}).get("munged")
        root_pids = self.marked_pids()
        if munged and _alive(munged) and str(self.base).encode() in _cmdline(munged):
            root_pids.append(munged)
        left = _kill_and_wait(sorted(set(root_pids)))
        problems += [f"process {p} with this run's marker survived" for p in left]
        for link in [self.pub_if]:
            _sh("ip", "link", "del", link, check=False)
        route = self.state.get("route")
        if route:
            _sh("ip", "route", "del", "unreachable", route, check=False)
        for ns in live.values():
            for n in NODES:  # delete the veths first: `netns del` alone frees them asynchronously
                _sh("ip", "-n", ns, "link", "del", f"v-{n}", check=False)
            res = _sh("ip", "netns", "del", ns, check=False)
            if res.returncode != 0:
                problems.append(f"ip netns del {ns}: {res.stderr.strip()}")
        for ns in self.ns.values():
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        with contextlib.suppress(OSError):
            Path("/etc/netns").rmdir()  # only if empty: another run may be using it
        others = [ns for ns in _sh("ip", "netns", "list", check=False).stdout.split() if _NS_RE.match(ns)]
        if self.state.get("made_run_sshd") and not others:  # another run's sshd would need it
            with contextlib.suppress(OSError):
                Path("/run/sshd").rmdir()
        for name in self._users():
            res = _sh("userdel", name, check=False, timeout=60)
            if res.returncode not in (0, 6):  # 6: no such user
                problems.append(f"userdel {name}: {res.stderr.strip()}")
        if _sh("ip", "link", "show", self.pub_if, check=False).returncode == 0:
            problems.append(f"link {self.pub_if} is still there")
        if not keep_files and self.base.is_dir():
            shutil.rmtree(self.base, ignore_errors=True)
        return problems

    def _users(self) -> list[str]:
        """This run's users: from the state file, and any account whose comment names this run."""
        names = set(self.state.get("users", []))
        for pw in pwd.getpwall():
            if pw.pw_gecos == f"labkit-nscluster {self.run_id}":
                names.add(pw.pw_name)
        return sorted(names)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _port_open_in(cluster: NsCluster, host: str, addr: str, port: int) -> bool:
    """Whether something listens on addr:port inside ``host``'s namespace (a connect from there)."""
    code = (f"import socket; s = socket.socket(); s.settimeout(2); "
            f"raise SystemExit(s.connect_ex(({addr!r}, {port})))")
    res = subprocess.run(["ip", "netns", "exec", cluster.ns[host], "/usr/bin/python3", "-c", code],
                         capture_output=True, timeout=10, check=False)
    return res.returncode == 0


def _owner_alive(base: Path) -> bool:
    try:
        owner = json.loads((base / "owner.json").read_text())
    except (OSError, ValueError):
        return False
    pid = owner.get("pid")
    return bool(pid) and _alive(pid) and _start_time(pid) == owner.get("start")


def cleanup_stale() -> list[str]:
    """Tear down every earlier run whose owner process is gone (namespaces, folders, users); return their ids."""
    ids = set()
    for ns in _sh("ip", "netns", "list", check=False).stdout.split():
        m = _NS_RE.match(ns)
        if m:
            ids.add(m.group(1))
    for d in STATE_ROOT.glob("labkit-nscluster-*"):
        m = re.fullmatch(r"labkit-nscluster-([0-9a-f]{4})", d.name)
        if m and d.is_dir():
            ids.add(m.group(1))
    for pw in pwd.getpwall():
        m = re.fullmatch(r"labkit-nscluster ([0-9a-f]{4})", pw.pw_gecos)
        if m:
            ids.add(m.group(1))
    cleaned = []
    for run_id in sorted(ids):
        base = STATE_ROOT / f"labkit-nscluster-{run_id}"
        if _owner_alive(base):
            continue
        NsCluster(run_id).down()
        cleaned.append(run_id)
    return cleaned


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="action", required=True)
    sub.add_parser("up", help="start a cluster and leave it running (its owner is this command's parent shell)")
    down = sub.add_parser("down", help="tear a cluster down")
    down.add_argument("run_id", nargs="?")
    down.add_argument("--stale", action="store_true", help="every run whose owner is gone")
    args = ap.parse_args(argv)
    if args.action == "up":
        cluster = NsCluster()
        try:
            cluster.up()
        except ClusterError as exc:
            print(f"the namespace cluster did not start: {exc}", file=sys.stderr)
            return 1
        ppid = os.getppid()  # the shell that ran us owns the cluster; `down --stale` cleans up after it exits
        (cluster.base / "owner.json").write_text(json.dumps({"pid": ppid, "start": _start_time(ppid)}))
        print(f"cluster {cluster.run_id} is up in {cluster.up_seconds:.1f} s; folder {cluster.base}")
        print(f"  Slurm commands on the login host: ip netns exec {cluster.ns['login']} env "
              f"SLURM_CONF={cluster.conf} sinfo")
        print(f"  stop it: {sys.executable} {__file__} down {cluster.run_id}")
        return 0
    if args.stale:
        print("cleaned:", " ".join(cleanup_stale()) or "nothing")
        return 0
    if not args.run_id:
        ap.error("down needs a run id or --stale")
    problems = NsCluster(args.run_id).down()
    print("\n".join(problems) or f"cluster {args.run_id} is gone")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
