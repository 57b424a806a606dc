"""Multi-process runs from a notebook: launch torchrun safely, and the rank-side helpers it pairs with.

Notebook side: :func:`launch` runs a module or script under ``torchrun`` as a subprocess in its own
session, on a free ``MASTER_PORT``, streams the ranks' logs into the cell as they arrive, and returns the
JSON result that rank 0 printed with :func:`emit_result`. When a rank fails, or the run passes its
timeout, it kills every process the launch started and raises :class:`LaunchError` carrying the failing
rank's traceback. It never uses ``!cmd`` (which cannot fail a cell) or ``mp.spawn`` of notebook
functions (which cannot be pickled from ``__main__``).

Rank side: :func:`rank_env` reads the rank layout from torchrun's or Slurm's environment,
:func:`init_process_group` joins the group, :func:`emit_result` prints the one result line.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import importlib.util
import json
import math
import os
import queue
import random
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from labkit import _share
from labkit._validate import safe_repr

__all__ = [
    "STOP_FILE_VAR",
    "stop_requested",
    "RESULT_PREFIX",
    "LaunchError",
    "LaunchTimeout",
    "RankEnv",
    "emit_result",
    "find_free_port",
    "init_process_group",
    "launch",
    "joined",
    "parse_result",
    "rank_env",
    "run_rank_main",
]

#: Rank 0 prints exactly one line starting with this prefix, followed by a JSON object.
RESULT_PREFIX = "LABKIT_RESULT "

_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ROOT_CAUSE_RE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+)", re.DOTALL)
_ROOT_EXIT_RE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)
_GRACE_S = 3.0
#: Linux's range for ephemeral (outgoing) ports; launch picks MASTER_PORT below it.
_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_EPHEMERAL_FALLBACK = (32768, 60999)
_PORT_FLOOR = 20000  # below it sit many well-known services (databases, 8888 for Jupyter, ...)
_PORT_TRIES = 200
#: Where DeepSpeed's CPU shm all-reduce op keeps its buffers, and their name (deepspeed/ops/csrc/cpu/comm/
#: shm.cpp): ``deepspeed_allreduce_buffer_{uid}_{MASTER_ADDR}_{MASTER_PORT}_{rank}``, one per rank.
_SHM_DIR = Path("/dev/shm")
_SHM_PREFIX = "deepspeed_allreduce_buffer"
#: What a rank's death by a signal usually means, for the LaunchError headline.
_SIGNAL_HINTS = {
    "SIGKILL": "often the out-of-memory killer: check `dmesg` or the job's memory limit; or a kill -9",
    "SIGSEGV": "a crash in native code (a C++/CUDA extension, or a library bug)",
    "SIGBUS": "often a full /dev/shm (shared memory) or a truncated memory-mapped file",
    "SIGABRT": "a C++ abort, e.g. 'terminate called ...' or a failed assertion in native code",
}


class LaunchError(RuntimeError):
    """A distributed launch failed: a rank exited non-zero, or the run was killed at its timeout.

    Attributes: ``rank`` (the failing rank, or None when unknown), ``returncode`` (torchrun's exit
    status, None after a timeout), ``rank_traceback`` (the failing rank's Python traceback, "" if it
    printed none), ``log`` (everything the launch printed), ``leftover`` (pids still alive after the
    kill; always empty unless something outlived SIGKILL), ``signal_name`` (e.g. "SIGKILL" when the
    failing rank was killed by a signal, else None).

    Introduced in notebook 09.
    """

    def __init__(self, message: str, *, rank: int | None = None, returncode: int | None = None,
                 rank_traceback: str = "", log: str = "", leftover: Sequence[int] = (),
                 signal_name: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.returncode = returncode
        self.rank_traceback = rank_traceback
        self.log = log
        self.leftover = list(leftover)
        self.signal_name = signal_name


class LaunchTimeout(LaunchError):
    """A distributed launch ran past its timeout and was killed, every process of it.

    Introduced in notebook 09.
    """


# ---------------------------------------------------------------------------------------------------
# Notebook side
# ---------------------------------------------------------------------------------------------------

def _ephemeral_range(path: Path | None = None) -> tuple[int, int]:
    """Return the OS's ephemeral port range (Linux: ``ip_local_port_range``), else 32768-60999."""
    try:
        lo, hi = (int(x) for x in (path or _PORT_RANGE_FILE).read_text().split()[:2])
    except (OSError, ValueError):
        return _EPHEMERAL_FALLBACK
    return (lo, hi) if 1 <= lo <= hi <= 65535 else _EPHEMERAL_FALLBACK


def _port_pool(path: Path | None = None) -> range:
    """The ports find_free_port draws from: below the ephemeral range (from 20000 up when there is room).

    The kernel hands out ephemeral ports to outgoing connections at any moment, so a free port in that
    range can be taken between the check and torchrun's bind; ports below it are only taken on purpose.
    When the ephemeral range leaves fewer than 1000 ports below it, the ports above it are used.
    """
    lo, hi = _ephemeral_range(path)
    for pool in (range(_PORT_FLOOR, lo), range(1024, lo), range(hi + 1, 65536)):
        if len(pool) >= 1000:
            return pool
    return range(0)


def _bindable(addr: str, port: int) -> bool:
    """True if nothing holds ``port`` on ``addr``, nor on all interfaces (IPv4, and IPv6 where there is one)."""
    tries = [(socket.AF_INET, addr), (socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        tries.append((socket.AF_INET6, "::"))
    for family, where in tries:
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this machine
            continue
        with s:
            try:
                s.bind((where, port))  # no SO_REUSEADDR: a port with lingering connections is skipped too
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL and family == socket.AF_INET6:
                    continue
                if exc.errno == errno.EADDRNOTAVAIL and where == addr:
                    raise ValueError(f"host {safe_repr(addr)} is not an address of this machine") from None
                return False
    return True


def find_free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` (and on all interfaces) right now, below the ephemeral range.

    Ports are drawn at random from below the start of the OS's ephemeral range
    (``/proc/sys/net/ipv4/ip_local_port_range``, 32768 if unreadable; from 20000 up), where the kernel
    does not hand out ports to outgoing connections, and each is checked by binding it. ``host`` is an
    IPv4 address or a host name of this machine. Only when no port there is free after 200 tries (or
    the range leaves no room) does the OS pick one. A race with another process that picks the same port
    stays possible (torchrun then fails to bind, and the launch fails clearly).

    Introduced in notebook 09.
    """
    if not isinstance(host, str) or not host:
        raise TypeError(f"host must be a non-empty str such as '127.0.0.1', got {safe_repr(host)}")
    try:
        addr = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (socket.gaierror, UnicodeError):
        raise ValueError(f"host {safe_repr(host)} is neither an IPv4 address nor a host name this machine resolves "
                         "(use '127.0.0.1' for a single node)") from None
    pool = _port_pool()
    rng = random.SystemRandom()
    for _ in range(min(_PORT_TRIES, len(pool))):
        port = rng.choice(pool)
        if _bindable(addr, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # last resort: let the OS pick one
        try:
            s.bind((addr, 0))
        except OSError as exc:
            raise ValueError(f"cannot bind a port on host {safe_repr(host)} ({addr}): {exc}") from None
        return int(s.getsockname()[1])


def parse_result(text: str) -> dict[str, Any] | None:
    """Return the JSON object on the last ``LABKIT_RESULT`` line of ``text``, or None if there is none.

    Introduced in notebook 09.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    found = None
    for line in text.splitlines():
        i = line.find(RESULT_PREFIX)
        if i >= 0:
            found = line[i + len(RESULT_PREFIX):]
    if found is None:
        return None
    try:
        obj = json.loads(found)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the result line is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"the result line must hold a JSON object, got {type(obj).__name__}")
    return obj


def _target_argv(module_or_script: str | os.PathLike, cwd: Path) -> list[str]:
    """Turn a module name or script path into torchrun's trailing arguments; validate it."""
    if isinstance(module_or_script, os.PathLike):
        module_or_script = os.fspath(module_or_script)
    if not isinstance(module_or_script, str) or not module_or_script:
        raise TypeError("module_or_script must be a module name such as 'labkit.recipes.ddp' or a path "
                        f"to a .py script, got {safe_repr(module_or_script)}")
    if module_or_script.endswith(".py") or os.sep in module_or_script:
        path = Path(module_or_script)
        if not path.is_absolute():
            path = cwd / path
        if not path.is_file():
            raise ValueError(f"script {safe_repr(module_or_script)} does not exist (looked at {path})")
        return [str(path)]
    if not _MODULE_RE.match(module_or_script):
        raise ValueError(f"{safe_repr(module_or_script)} is neither a dotted module name nor a .py script path")
    try:
        spec = importlib.util.find_spec(module_or_script)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ValueError(f"module {safe_repr(module_or_script)} cannot be found by this Python ({sys.executable})")
    return ["-m", module_or_script]


def _validate(nproc: Any, args: Any, timeout: Any) -> tuple[int, list[str], float]:
    if isinstance(nproc, bool) or not isinstance(nproc, int):
        raise TypeError(f"nproc must be an int, got {type(nproc).__name__}")
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    if isinstance(args, (str, bytes)):
        raise TypeError("args must be a list of strings such as ['--steps', '8'], not a single string")
    try:
        args = list(args)
    except TypeError:
        raise TypeError(f"args must be a list of strings, got {type(args).__name__}") from None
    bad = [a for a in args if not isinstance(a, (str, int, float)) or isinstance(a, bool)]
    if bad:
        raise TypeError(f"args must hold strings (or numbers), got {bad[0]!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout}")
    return nproc, [str(a) for a in args], float(timeout)


def _descendants(pid: int) -> list[Any]:
    """Return psutil handles of every live descendant of ``pid`` (empty if it is gone)."""
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _alive(procs: list[Any]) -> list[Any]:
    """The processes of ``procs`` that still run (psutil checks pid *and* start time, so no pid reuse)."""
    import psutil

    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _kill_all(proc: subprocess.Popen, known: dict[int, Any]) -> list[int]:
    """SIGTERM, then SIGKILL, torchrun and every process it started, with their process groups.

    torchrun starts each rank in a session of its own, so signalling torchrun's group is not enough:
    every recorded descendant's group is signalled too (a rank's own children share its group).
    Returns the pids still alive afterwards (empty unless something outlived SIGKILL).
    """
    import psutil

    for p in _descendants(proc.pid):
        known.setdefault(p.pid, p)
    everyone = list(known.values())
    mine = os.getpgrp()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        targets = _alive(everyone)
        if not targets and proc.poll() is not None:
            break
        groups = {proc.pid} if proc.poll() is None else set()  # torchrun leads its own session/group
        for p in targets:
            try:
                groups.add(os.getpgid(p.pid))
            except OSError:
                pass
        groups.discard(mine)  # never signal our own (the notebook kernel's) group
        for g in groups:
            try:
                os.killpg(g, sig)
            except OSError:
                pass
        for p in targets:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        if proc.poll() is None:
            try:
                proc.send_signal(sig)
            except OSError:
                pass
        deadline = time.monotonic() + (_GRACE_S if sig == signal.SIGTERM else 10.0)
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        psutil.wait_procs(targets, timeout=max(0.0, deadline - time.monotonic()))
    left = [p.pid for p in _alive(everyone)]
    return left + ([proc.pid] if proc.poll() is None else [])


def _rank_files(log_dir: Path, rank: int, name: str) -> list[Path]:
    return sorted(log_dir.glob(f"*/attempt_*/{rank}/{name}"))


def _read(paths: list[Path]) -> str:
    return "".join(p.read_text(errors="replace") for p in paths if p.is_file())


_RANK_PREFIX_RE = re.compile(r"^\[rank\d+\]:[ ]?", re.MULTILINE)


def _last_traceback(text: str) -> str:
    text = _RANK_PREFIX_RE.sub("", text)  # torch prefixes a rank's uncaught traceback with "[rankN]: "
    i = text.rfind("Traceback (most recent call last)")
    return text[i:].strip() if i >= 0 else ""


def _rank_traceback(log_dir: Path, rank: int) -> str:
    """The rank's traceback: from its torchelastic error file (``@record``), else its stderr."""
    for f in _rank_files(log_dir, rank, "error.json"):
        try:
            tb = json.loads(f.read_text())["message"]["extraInfo"]["py_callstack"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(tb, str) and tb.strip():
            return tb.strip()
    return _last_traceback(_read(_rank_files(log_dir, rank, "stderr.log")))


_EXC_LINE_RE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Timeout)\w*(?::|$)")


def _exception_line(tb: str) -> str:
    """The ``SomeError: message`` line of a traceback (the last one, as Python prints chained errors)."""
    for line in reversed(tb.splitlines()):
        if _EXC_LINE_RE.match(line):
            return line.strip()
    return tb.strip().splitlines()[-1] if tb.strip() else ""


def _first_error_file_rank(log_dir: Path, nproc: int) -> int | None:
    """The rank whose error file (written by ``@record`` as the exception left it) was written first.

    torchrun orders failures by a timestamp in whole seconds and breaks ties by the lowest rank, so when a rank
    crashes and a peer fails on the broken connection within the same second, torchrun blames the peer if its
    rank is lower. The files' modification times have sub-second precision.
    """
    first: tuple[int, int] | None = None
    for r in range(nproc):
        for f in _rank_files(log_dir, r, "error.json"):
            try:
                t = f.stat().st_mtime_ns
            except OSError:
                continue
            if first is None or t < first[0]:
                first = (t, r)
    return None if first is None else first[1]


def _failing_rank(torchrun_log: str, log_dir: Path, nproc: int) -> int | None:
    killed = _root_cause_signal(torchrun_log)
    if killed is not None and not _rank_files(log_dir, killed[0], "error.json"):
        return killed[0]  # killed before it could write an error file (SIGKILL): torchrun's word is all there is
    # Otherwise the first error file decides (a rank that raised may still die of a signal afterwards, when C++
    # teardown aborts: torchrun then reports the signal, not the exception that came first)
    first = _first_error_file_rank(log_dir, nproc)
    if first is not None:
        return first
    m = _ROOT_CAUSE_RE.search(torchrun_log)
    if m:
        return int(m.group(1))
    for r in range(nproc):
        if _rank_traceback(log_dir, r):
            return r
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _root_cause_signal(torchrun_log: str) -> tuple[int, str] | None:
    """(rank, signal name) when torchrun's root-cause block says that rank died of a signal (exitcode < 0)."""
    m = _ROOT_EXIT_RE.search(torchrun_log)
    if m is None or int(m.group(2)) >= 0:
        return None
    return int(m.group(1)), _signal_name(-int(m.group(2)))


def _launch_shm_buffers(addr: str, port: int, nproc: int, since: float) -> list[Path]:
    """DeepSpeed shm all-reduce buffers that provably belong to one launch.

    A buffer belongs to it when its name is DeepSpeed's for this user, ``addr`` and ``port`` with a rank
    below ``nproc`` (one launch holds its port, so no other job on the node can use the same name at the same
    time), and it is a regular file of this user last written after the launch began (``since``, wall
    clock), so a stale file from an earlier job that used the same port is not this launch's either.
    """
    uid = os.getuid()
    found = []
    for rank in range(nproc):
        path = _SHM_DIR / f"{_SHM_PREFIX}_{uid}_{addr}_{port}_{rank}"
        try:
            st = path.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == uid and st.st_mtime >= since - 1.0:
            found.append(path)
    return found


def _remove_launch_shm(addr: str, port: int, nproc: int, since: float) -> list[str]:
    """Unlink the launch's leftover DeepSpeed shm buffers (ranks that died before removing theirs)."""
    removed = []
    for path in _launch_shm_buffers(addr, port, nproc, since):
        try:
            path.unlink()
        except OSError:  # gone already, or not ours to remove after all: never mask the launch's own error
            continue
        removed.append(str(path))
    return removed


def _print_line(line: str) -> None:
    """Print one streamed log line; the (long) result line is shortened, since launch returns it."""
    i = line.find(RESULT_PREFIX)
    if i >= 0 and len(line) - i > 100:
        line = line[: i + 100] + f"… ({len(line) - i} characters, returned by launch)"
    print(line, flush=True)


def _quiet_failure_detail(logs: Path, rank: int | None, lines: list[str]) -> str:
    """What to show when a rank failed without a Python traceback: its own last lines, then torchrun's."""
    parts = ["no Python traceback."]
    if rank is not None:
        for name in ("stdout.log", "stderr.log"):
            tail = _read(_rank_files(logs, rank, name)).strip().splitlines()[-10:]
            if tail:
                parts.append(f"rank {rank} {name[:-4]}, last lines:\n" + "\n".join(tail))
    parts.append("torchrun, last lines:\n" + "\n".join(lines[-12:]))
    return "\n".join(parts)


#: The variables that place a process in a torchrun job: a launch's children must not inherit an outer launch's.
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "TORCHELASTIC_RUN_ID", "GROUP_RANK")

#: The environment variable through which a process started by :func:`_die_with_parent_argv` tells its own
#: children its pid (torchrun's ranks check that torchrun, not a later stand-in, is still their parent).
_PARENT_PID_VAR = "LABKIT_PARENT_PID"
#: Seconds torchrun gets, after the process that launched it died, to stop its ranks and end before it is killed.
_TORCHRUN_GRACE_S = 20.0
#: A tiny interpreter that asks Linux to signal it when its parent dies, then becomes the real command (execv
#: keeps the pid, and PR_SET_PDEATHSIG survives execv). Arguments: signal number, the parent's pid (or "-": read
#: it from $LABKIT_PARENT_PID), a grace in seconds, the command. If the parent is already gone, it does not start
#: the command. With a grace above 0 it first forks a *reaper*, a child of the command that dies with it
#: (PR_SET_PDEATHSIG again): once the parent is gone, the reaper gives the command ``grace`` seconds to end on the
#: signal it got, then SIGKILLs it. A command that handles the signal (torchrun, stopping its ranks) and then hangs
#: in its own shutdown on a loaded machine is not left behind.
_DIE_WITH_PARENT = f"""\
import ctypes, os, select, sys, time
sig, parent, grace, argv = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4:]
parent = int(os.environ.get("{_PARENT_PID_VAR}", "0") if parent == "-" else parent)
libc = ctypes.CDLL(None, use_errno=True)
try:
    libc.prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if parent and os.getppid() != parent:  # it died before the prctl: nobody is left to stop this command
    os.kill(os.getpid(), sig)
    os._exit(1)
me = os.getpid()
if grace > 0 and parent and os.fork() == 0:  # the reaper
    try:
        libc.prctl(1, 9, 0, 0, 0)  # SIGKILL when the command ends
        if os.getppid() != me:
            os._exit(0)
        try:
            fd = os.pidfd_open(parent)
            select.select([fd], [], [])  # readable once the parent has ended
        except (OSError, AttributeError):
            while os.getppid() == me and os.path.exists(f"/proc/{{parent}}"):
                time.sleep(0.5)
        time.sleep(grace)
        if os.getppid() == me:
            os.kill(me, 9)
    finally:
        os._exit(0)
os.environ["{_PARENT_PID_VAR}"] = str(me)
os.execv(argv[0], argv)
"""


def _die_with_parent_argv(sig: int, parent: int | None = None, grace: float = 0.0) -> list[str]:
    """The command prefix that makes a child receive ``sig`` when its parent dies (Linux; elsewhere ``[]``).

    ``parent`` is the pid the child must have as its parent (default: this process); ``-1`` means the one that
    started it, when that one ran through this prefix too (torchrun for its ranks). With ``grace`` > 0 a child that
    is still alive ``grace`` seconds after its parent died is killed (SIGKILL). Linux sends the signal when the
    *thread* that forked the child ends (``PR_SET_PDEATHSIG``), so start such children from a thread that
    outlives them: :func:`launch` does, since it returns only once every process it started is dead.
    """
    if sys.platform != "linux":
        return []
    who = "-" if parent == -1 else str(os.getpid() if parent is None else parent)
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(int(sig)), who, repr(float(grace))]


class _LineReader:
    """A child's output pipe, read on a daemon thread: each line kept in ``lines`` and echoed as it arrives.

    Call :meth:`poll` in the supervising loop and :meth:`finish` once the child's processes are gone (after a
    kill, too): it collects what was still queued. Shared by :func:`launch` and the clinic's runner.
    """

    def __init__(self, stream: Any, echo: Callable[[str], None] | None, name: str) -> None:
        self.lines: list[str] = []
        self.eof = False
        self._echo = echo
        self._q: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), name=name, daemon=True)
        self._thread.start()

    def _pump(self, stream: Any) -> None:
        for line in stream:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def _keep(self, item: str | None) -> None:
        if item is None:
            self.eof = True  # every process that held the pipe has closed it
        elif item:
            self.lines.append(item)
            if self._echo is not None:
                self._echo(item)

    def poll(self, timeout: float = 0.1) -> None:
        """Wait up to ``timeout`` seconds for the next line (or the end of the output) and keep it."""
        try:
            self._keep(self._q.get(timeout=timeout))
        except queue.Empty:
            pass

    def finish(self) -> str:
        """Stop reading (the pipe's writers are gone), keep what is still queued, and return the whole log."""
        self._thread.join(timeout=5)
        while True:
            try:
                self._keep(self._q.get_nowait())
            except queue.Empty:
                return "\n".join(self.lines)


def launch(module_or_script: str | os.PathLike, nproc: int = 2, args: Sequence[str] = (),
           timeout: float = 120.0, *, stream: bool | Callable[[str], None] = True,
           env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
           threads_per_rank: int = 1, log_dir: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """Run a module or script on ``nproc`` local ranks under torchrun and return rank 0's JSON result.

    ``module_or_script`` is a dotted module (run with ``-m``, e.g. ``"labkit.recipes.ddp"``) or a path
    to a ``.py`` file; ``args`` are passed to it. torchrun runs as a subprocess in a new session on a
    free ``MASTER_PORT`` of 127.0.0.1, with per-rank logs written to files and echoed, prefixed
    ``[defaultR]:``, as they arrive (``stream=True`` prints them, a callable receives each line,
    ``False`` keeps quiet). Each rank gets ``OMP_NUM_THREADS=threads_per_rank`` unless ``env`` says
    otherwise. Returns the object rank 0 printed with :func:`emit_result`, or None if it printed none.

    Raises :class:`LaunchError` (with ``.rank`` and ``.rank_traceback``) when a rank fails, and
    :class:`LaunchTimeout` after ``timeout`` seconds; both only after every process of the launch is
    dead. A rank that died of a signal is named in the headline ("rank 1 killed by SIGKILL"). Once its
    processes are gone, the launch removes the DeepSpeed shared-memory buffers
    (``/dev/shm/deepspeed_allreduce_buffer_*``) that its ranks left, and only those. Bad arguments
    raise ``TypeError``/``ValueError`` before anything starts. ``MASTER_PORT`` comes from
    :func:`find_free_port` (below the ephemeral port range).

    An interrupt (Ctrl-C: ``KeyboardInterrupt``) kills every process of the launch too, and is raised again.
    If the calling process itself dies (a notebook kernel killed or crashed), on Linux torchrun gets SIGTERM
    and stops its ranks, and a rank whose torchrun is gone gets SIGKILL (``PR_SET_PDEATHSIG``), so nothing
    waits for a process-group timeout.

    Introduced in notebook 09.
    """
    result = _launch_or_replay(module_or_script, nproc, args, timeout, stream, env, cwd, threads_per_rank, log_dir)
    if isinstance(module_or_script, str) and result is not None:
        import copy

        # a copy: editing the dict the cell got back changes nothing the measurements read
        _RECENT.append((module_or_script, nproc, tuple(str(a) for a in args), copy.deepcopy(result)))
        del _RECENT[:-_RECENT_KEPT]
    return result


#: The last results rank 0 reported, (module, nproc, args, result), newest last: what a predict exercise's
#: measurement reads (labkit.exercises.nb09-nb11), so that reveal grades what the ranks reported, not a value handed
#: to it.
_RECENT: list[tuple[str, int, tuple[str, ...], Any]] = []
_RECENT_KEPT = 16


def _last_result(module: str, match: Callable[[int, tuple[str, ...], Any], bool] | None = None) -> Any:
    """The newest result of a launch of ``module`` in this process for which ``match(nproc, args, result)`` holds
    (any, without ``match``); None if there is none. For the predict exercises' measurements."""
    for mod, nproc, argv, result in reversed(_RECENT):
        if mod == module and (match is None or match(nproc, argv, result)):
            return result
    return None


def _has_option(argv: Sequence[str], option: str, value: str) -> bool:
    """Whether ``argv`` holds ``option value`` (two consecutive items) or ``option=value``."""
    return f"{option}={value}" in argv or any(a == option and b == value for a, b in zip(argv, argv[1:]))


def _launch_or_replay(module_or_script: Any, nproc: Any, args: Any, timeout: Any, stream: Any, env: Any, cwd: Any,
                      threads_per_rank: Any, log_dir: Any) -> dict[str, Any] | None:
    shared = _shared_launch_file(module_or_script, nproc, args, timeout, env, cwd, threads_per_rank, log_dir)
    if shared is None:
        return _launch(module_or_script, nproc, args, timeout, stream=stream, env=env, cwd=cwd,
                       threads_per_rank=threads_per_rank, log_dir=log_dir)
    echo = _print_line if stream is True else stream if callable(stream) else None
    with _share.locked([shared]):
        made = _share.load(shared)
        if isinstance(made, dict) and isinstance(made.get("lines"), list) and "result" in made:
            for line in made["lines"]:
                if echo is not None:
                    echo(str(line))
            return made["result"]
        lines: list[str] = []

        def tee(line: str) -> None:
            lines.append(line)
            if echo is not None:
                echo(line)

        result = _launch(module_or_script, nproc, args, timeout, stream=tee, env=env, cwd=cwd,
                         threads_per_rank=threads_per_rank, log_dir=log_dir)
        _share.store(shared, {"result": result, "lines": lines})  # a failed launch raised: only successes are shared
        return result


#: The test suite's sharing folder for launches (tests/conftest.py gives it to the notebooks' kernels only: nbval's
#: and the browser's). Unset, as for every learner, each launch runs. See labkit._share.
SHARE_ENV = "LABKIT_LAUNCH_SHARE"
#: What else, in the environment, changes a launch: the CPU caps, tests/lab_env.py's blocked packages, the
#: accelerator DeepSpeed is told to use and the GPUs a process may see.
_SHARE_CONTEXT = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "LABKIT_LAB_ENV_BLOCKED", "DS_ACCELERATOR",
                  "CUDA_VISIBLE_DEVICES")
_PATH_FLAG = re.compile(r"^--?[\w-]*(dir|file|path|out|ckpt|checkpoint|resume)[\w-]*$")


def _shared_launch_file(module_or_script: Any, nproc: Any, args: Any, timeout: Any, env: Any, cwd: Any,
                        threads_per_rank: Any, log_dir: Any) -> str | None:
    """Where :func:`launch` finds or leaves this launch's result when ``$LABKIT_LAUNCH_SHARE`` names a private folder
    (the test suite's), or None: no folder, a script rather than a module, a log folder asked for, or arguments
    that name files (a run that writes or reads files must really run). Bad arguments are left to ``_launch``."""
    share = _share.folder(SHARE_ENV)
    if share is None or log_dir is not None or not isinstance(module_or_script, str):
        return None
    if not _MODULE_RE.match(module_or_script) or module_or_script.endswith(".py"):
        return None
    try:
        nproc, argv, timeout = _validate(nproc, args, timeout)
    except (TypeError, ValueError):
        return None
    if any(os.sep in a or _PATH_FLAG.match(a) for a in argv) or (env is not None and not isinstance(env, dict)):
        return None
    context = [module_or_script, nproc, argv, timeout, sorted((env or {}).items()), threads_per_rank,
               None if cwd is None else os.fspath(cwd), sys.executable, [os.environ.get(k) for k in _SHARE_CONTEXT]]
    return _share.path_for(share, context)


def _launch(module_or_script: str | os.PathLike, nproc: int = 2, args: Sequence[str] = (),
            timeout: float = 120.0, *, stream: bool | Callable[[str], None] = True,
            env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
            threads_per_rank: int = 1, log_dir: str | os.PathLike | None = None,
            cancel: threading.Event | None = None) -> dict[str, Any] | None:
    """:func:`launch`, and ``cancel``: once it is set, the launch is stopped as by an interrupt, from any thread
    (the clinic's ``run_cases`` sets it for the launches in its worker threads when the caller is interrupted)."""
    work = Path(os.fspath(cwd)) if cwd is not None else Path.cwd()
    if not work.is_dir():
        raise ValueError(f"cwd {work} is not a directory")
    nproc, args, timeout = _validate(nproc, args, timeout)
    target = _target_argv(module_or_script, work)
    if isinstance(threads_per_rank, bool) or not isinstance(threads_per_rank, int) or threads_per_rank < 1:
        raise ValueError(f"threads_per_rank must be an int >= 1, got {safe_repr(threads_per_rank)}")
    if env is not None and (not isinstance(env, dict)
                            or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise TypeError("env must be a dict of str to str")
    if not (isinstance(stream, bool) or callable(stream)):
        raise TypeError("stream must be True, False or a callable taking one line")
    echo: Callable[[str], None] | None
    if stream is True:
        echo = _print_line
    elif stream is False:
        echo = None
    else:
        echo = stream

    tmp = tempfile.TemporaryDirectory(prefix="labkit-launch-") if log_dir is None else None
    try:
        return _supervise(work, nproc, target, args, timeout, echo, env, threads_per_rank,
                          Path(tmp.name) if tmp is not None else Path(os.fspath(log_dir)), cancel)
    finally:  # every way out: a result, a failure, a timeout, an interrupt
        if tmp is not None:
            tmp.cleanup()


def _supervise(work: Path, nproc: int, target: list[str], args: list[str], timeout: float,
               echo: Callable[[str], None] | None, env: dict[str, str] | None, threads_per_rank: int,
               logs: Path, cancel: threading.Event | None) -> dict[str, Any] | None:
    """Start torchrun, follow it to its end (or kill it), and turn how it ended into a result or an error."""
    logs.mkdir(parents=True, exist_ok=True)
    port = find_free_port()
    # On Linux both torchrun and each rank start through a tiny wrapper that sets PR_SET_PDEATHSIG: torchrun
    # gets SIGTERM when this process dies (it then stops its ranks, whole process groups), and a rank gets
    # SIGKILL when torchrun dies. torchrun runs the ranks' command as given (--no-python); it is what it
    # would run itself: `python -u <script or -m module> args`.
    rank_wrap = _die_with_parent_argv(signal.SIGKILL, -1)
    ranks = ["--no-python", *rank_wrap, sys.executable, "-u"] if rank_wrap else []
    cmd = [*_die_with_parent_argv(signal.SIGTERM, grace=_TORCHRUN_GRACE_S),
           sys.executable, "-m", "torch.distributed.run",
           "--nnodes", "1", "--node-rank", "0",
           "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port),
           "--log-dir", str(logs), "--redirects", "3", "--tee", "3",
           *ranks, *target, *args]
    child_env = dict(os.environ)
    child_env.update({"OMP_NUM_THREADS": str(threads_per_rank), "PYTHONUNBUFFERED": "1"})
    for k in _RANK_VARS:
        child_env.pop(k, None)  # a launch from inside a rank must not inherit that rank's layout
    child_env.update(env or {})

    started = time.time()  # wall clock: compared with the mtime of shm buffers the ranks create
    # Popen from this thread, which returns only once every process of the launch is dead: PR_SET_PDEATHSIG
    # fires when the thread that started torchrun ends, and that is never before torchrun has.
    proc = subprocess.Popen(cmd, cwd=str(work), env=child_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1, start_new_session=True)
    reader = _LineReader(proc.stdout, echo, "labkit-launch-reader")
    known: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    timed_out = False
    last_scan = 0.0
    try:
        while True:
            reader.poll()
            if cancel is not None and cancel.is_set():
                raise KeyboardInterrupt
            now = time.monotonic()
            if now - last_scan > 0.5:  # remember every process the launch starts, to kill them later
                for p in _descendants(proc.pid):
                    known.setdefault(p.pid, p)
                last_scan = now
            if reader.eof and proc.poll() is not None:
                break
            if now > deadline:
                timed_out = True
                break
    finally:
        # Runs on success, failure, timeout and KeyboardInterrupt alike.
        leftover = _kill_all(proc, known)
        _remove_launch_shm("127.0.0.1", port, nproc, started)  # a killed rank cannot remove its own
        log = reader.finish()
        if proc.stdout is not None:
            proc.stdout.close()
    if timed_out:
        tails = []
        for r in range(nproc):
            last = _read(_rank_files(logs, r, "stdout.log")).strip().splitlines()[-1:]
            tails.append(f"  rank {r}: last line {last[0]!r}" if last else f"  rank {r}: no output")
        raise LaunchTimeout(f"the launch ran past its timeout of {timeout:g} s and was killed "
                            "(all processes). Last output per rank:\n" + "\n".join(tails),
                            log=log, leftover=leftover)
    rc = proc.returncode
    if rc != 0:
        rank = _failing_rank(log, logs, nproc)
        killed = _root_cause_signal(log)
        sig = None
        if killed is not None and killed[0] == rank and not _rank_files(logs, rank, "error.json"):
            sig = killed[1]  # (a rank that raised first and aborted in teardown afterwards "failed")
        elif rc < 0 and rank is None:  # torchrun itself died of a signal
            sig = _signal_name(-rc)
        tb = _rank_traceback(logs, rank) if rank is not None else ""
        where = f"rank {rank}" if rank is not None else "a rank"
        last = _exception_line(tb)
        if sig is not None:
            who = where if rank is not None or rc >= 0 else "torchrun"
            hint = _SIGNAL_HINTS.get(sig, "")
            head = f"{who} killed by {sig}" + (f" ({hint})" if hint else "") + (f": {last}" if last else "")
        else:
            head = f"{where} failed: {last or f'torchrun exit status {rc}'}"
        detail = tb or _quiet_failure_detail(logs, rank, reader.lines)
        raise LaunchError(f"{head}\n\n{detail}".rstrip(), rank=rank, returncode=rc,
                          rank_traceback=tb, log=log, leftover=leftover, signal_name=sig)
    return parse_result(_read(_rank_files(logs, 0, "stdout.log")))


# ---------------------------------------------------------------------------------------------------
# Rank side
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankEnv:
    """Where this process sits in the job: global rank, world size, local rank, and who launched it.

    ``launcher`` is "torchrun", "slurm" or "single". Introduced in notebook 09.
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str


def _int_env(env: dict[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise ValueError(f"environment variable {key}={env[key]!r} is not an integer") from None


def rank_env(environ: dict[str, str] | None = None) -> RankEnv:
    """Read the rank layout from torchrun's variables, else Slurm's (``srun``), else a single process.

    Under ``srun`` (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID), MASTER_ADDR defaults to 127.0.0.1 on one
    node (a multi-node job must export it, e.g. the first host of ``scontrol show hostnames``) and
    MASTER_PORT to 20000 + SLURM_JOB_ID % 12768, the same on every task (20000-32767: below the usual ephemeral
    port range, 32768-60999, where the kernel picks ports for outgoing connections).

    Introduced in notebook 09.
    """
    env = dict(os.environ if environ is None else environ)
    if ("RANK" in env) != ("WORLD_SIZE" in env):
        have, missing = ("RANK", "WORLD_SIZE") if "RANK" in env else ("WORLD_SIZE", "RANK")
        raise ValueError(f"{have} is set but {missing} is not: torchrun sets both (unset {have} to run one process)")
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _int_env(env, "RANK"), _int_env(env, "WORLD_SIZE")
        local = _int_env(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
        launcher = "torchrun"
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = _int_env(env, "SLURM_PROCID"), _int_env(env, "SLURM_NTASKS")
        local = _int_env(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        launcher = "slurm"
    else:
        rank, world, local, launcher = 0, 1, 0, "single"
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ValueError(f"inconsistent rank layout: rank={rank}, world_size={world}, local_rank={local}")
    addr = env.get("MASTER_ADDR", "")
    if not addr:
        nnodes = int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1")) or 1)
        if launcher == "slurm" and nnodes > 1:
            raise ValueError("a multi-node srun needs MASTER_ADDR exported (the first host of "
                             "`scontrol show hostnames $SLURM_JOB_NODELIST`)")
        addr = "127.0.0.1"
    if env.get("MASTER_PORT"):
        port = _int_env(env, "MASTER_PORT")
        if not 1 <= port <= 65535:
            raise ValueError(f"environment variable MASTER_PORT={port} is not a TCP port (1-65535)")
    elif launcher == "slurm":
        port = 20000 + _int_env(env, "SLURM_JOB_ID") % 12768 if "SLURM_JOB_ID" in env else 29500
    else:
        port = 0  # single process: init_process_group picks a free port
    return RankEnv(rank, world, local, addr, port, launcher)


def init_process_group(backend: str, timeout_s: float = 60.0, device: Any = None) -> RankEnv:
    """Join the default process group with ``backend`` ("gloo" or "nccl") from :func:`rank_env`.

    Works under torchrun, under ``srun`` and as a plain single process (world size 1). ``device``
    (a CUDA torch.device) is bound to the group for NCCL. Returns the :class:`RankEnv`.

    Introduced in notebook 09.
    """
    import torch.distributed as dist

    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {safe_repr(backend)}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 7 * 86400:
        raise ValueError(f"timeout_s must be a number of seconds in (0, 604800] (a week), got {safe_repr(timeout_s)}")
    renv = rank_env()
    port = renv.master_port or find_free_port(renv.master_addr)
    os.environ.update({"MASTER_ADDR": renv.master_addr, "MASTER_PORT": str(port),
                       "RANK": str(renv.rank), "WORLD_SIZE": str(renv.world_size),
                       "LOCAL_RANK": str(renv.local_rank)})
    kwargs: dict[str, Any] = {}
    if backend == "nccl" and device is not None:
        kwargs["device_id"] = device
    dist.init_process_group(backend, init_method="env://", rank=renv.rank, world_size=renv.world_size,
                            timeout=_dt.timedelta(seconds=timeout_s), **kwargs)
    return RankEnv(renv.rank, renv.world_size, renv.local_rank, renv.master_addr, port, renv.launcher)


@contextlib.contextmanager
def joined(device: Any = None, timeout_s: float = 60.0) -> Iterator[tuple[Any, RankEnv]]:
    """A recipe's process group: pick this rank's device (``device`` as :func:`labkit.device.pick_device` takes
    it; on a GPU node ``cuda:LOCAL_RANK``), join the group with that device's backend (NCCL or gloo), yield
    ``(device, RankEnv)`` and destroy the group however the block ends. Introduced in notebook 09.
    """
    import torch
    import torch.distributed as dist

    from labkit import device as dev_gate

    dev = dev_gate.pick_device(device)
    if dev_gate.is_cuda(dev):
        dev = torch.device("cuda", rank_env().local_rank)
    dev_gate.set_current_device(dev)
    renv = init_process_group(dev_gate.dist_backend(dev), timeout_s=timeout_s,
                              device=dev if dev_gate.is_cuda(dev) else None)
    try:
        yield dev, renv
    finally:
        dist.destroy_process_group()


def emit_result(result: dict[str, Any]) -> None:
    """Print ``result`` as the one ``LABKIT_RESULT {json}`` line that :func:`launch` returns (rank 0 only).

    Introduced in notebook 09.
    """
    if not isinstance(result, dict):
        raise TypeError(f"result must be a dict, got {type(result).__name__}")
    try:
        line = json.dumps(result, allow_nan=True)
    except RecursionError:  # json walks nested dicts and lists recursively
        raise ValueError("result nests too deeply to be written as one JSON line") from None
    print(RESULT_PREFIX + line, flush=True)


def run_rank_main(main: Callable[[], int], *, exit_on_error: bool = False) -> NoReturn:
    """Run a recipe's ``main`` on one rank, flush its output, and end the process without C++ teardown.

    With gloo (and DeepSpeed), a rank that has already printed its result and destroyed its process
    group can still abort while the interpreter tears down C++ statics ("terminate called without an
    active exception", SIGABRT), intermittently, which turns a good run into a failed launch. Skipping
    that teardown with ``os._exit`` after flushing is safe here: results, checkpoints and logs are all
    written before ``main`` returns. A Python exception still propagates (and torchrun's ``record``
    writes its error file) because it happens inside ``main``.

    ``exit_on_error=True`` also ends a rank that raised at once (exit status 1), after ``record`` has written
    the error file and the traceback is printed: a rank whose process group broke can otherwise spend seconds in
    C++ teardown (gloo and store threads). Notebook 13's clinic cases, which fail on purpose, use it.
    Introduced in notebook 09.
    """
    from torch.distributed.elastic.multiprocessing.errors import record

    if not isinstance(exit_on_error, bool):
        raise TypeError(f"exit_on_error must be True or False, got {safe_repr(exit_on_error)}")
    try:
        rc = record(main)()
    except BaseException:
        if not exit_on_error:
            raise
        sys.excepthook(*sys.exc_info())
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(rc or 0))


#: The environment variable that names the stop file (``slurm/*.sbatch`` create it on the walltime warning).
STOP_FILE_VAR = "LABKIT_STOP_FILE"


def stop_requested(device: Any = None) -> bool:
    """Whether any rank sees the file named by ``$LABKIT_STOP_FILE`` (False when it is unset).

    One MAX all-reduce, so that every rank gives the same answer and all of them stop after the same step; call
    it on every rank at the end of a step. Introduced in notebook 12.
    """
    import torch
    import torch.distributed as tdist

    path = os.environ.get(STOP_FILE_VAR) or None
    if path is None:
        return False
    flag = torch.tensor([1.0 if os.path.exists(path) else 0.0], device=device)
    tdist.all_reduce(flag, op=tdist.ReduceOp.MAX)
    return bool(flag.item() > 0)

