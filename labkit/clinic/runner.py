"""Run a clinic case as its own process (or 2 gloo ranks), with the learner's fix, and read back its evidence.

:func:`run_case` starts the case's script with the settings changed by ``fix`` and returns a :class:`CaseRun`:
the script's log as it printed it, its result (the evidence it measured), the error when it failed, and the
case's verdict (``run.finding``). Two-rank cases go through :func:`labkit.dist.launch` (torchrun, a free port,
a timeout, every process killed at the end). One-process cases need no rendezvous: each runs in a process of its
own, in a session of its own, with the same guarantees (a timeout, the log kept, and every process of that
session, DataLoader workers included, killed at the end). On Linux that process is forked from a helper that has
imported torch once (:mod:`labkit.clinic._zygote`, stopped by :func:`shutdown` and when this process ends), which
saves two seconds of start-up per run; elsewhere it is ``python -m labkit.clinic.cases.<name>``. Runs are
remembered by (case, settings, environment) for the life of the process, so that a cell run twice, or a grader, does
not pay twice; ``fresh=True`` runs again. Where ``$LABKIT_CLINIC_SHARE`` names a folder of this user's that nobody
else can write (the test suite sets it, so that its unit tests, nbval and the browser share one set of runs), runs
are also shared between processes through it, as JSON files keyed by everything that can change a run (the case,
its settings and environment, the timeout, the Python, the CPU caps); a learner's notebook never sets it.

However a run ends (done, failed, stopped at its timeout, or interrupted with Ctrl-C, which is raised again
afterwards), every process of it is dead when the call returns, and the folder its processes used as ``TMPDIR``
(one per run) is removed; an interrupted run is not remembered. If this process dies, its runs die with it (on
Linux): torchrun and the ranks through ``PR_SET_PDEATHSIG`` (see :func:`labkit.dist.launch`), a plain process the
same way, the zygote through a thread that watches this process.

:func:`grade_cause` and :func:`grade_fix` are what notebook 13's exercises call: the second runs the case with the
learner's one-setting fix and asks the case's detector whether the symptom is gone.

Introduced in notebook 13.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from labkit import _share
from labkit._validate import safe_repr
from labkit.clinic import _batch
from labkit.clinic._script import merge_config
from labkit.clinic.table import CASES, Case, Finding
from labkit.dist import (
    _RANK_VARS,
    LaunchError,
    LaunchTimeout,
    _die_with_parent_argv,
    _launch,
    _LineReader,
    parse_result,
)
from labkit.exercises._core import FormatSlip
from labkit.i18n import gettext as _

__all__ = ["SHARE_ENV", "CaseRun", "causes", "checklist", "choices", "clear_cache", "grade_cause", "grade_fix", "run_case",
           "run_cases", "settings", "shutdown", "source"]

#: The environment variable naming a folder through which processes share their runs (the test suite's; unset, the
#: runs are remembered in this process only).
SHARE_ENV = "LABKIT_CLINIC_SHARE"
#: What else, in the environment, changes a run: the CPU caps. (Not
#: tests/lab_env.py's blocked packages: a case runs labkit's recipes, which the notebooks' own launches already run
#: with only what `make lab` installs; the clinic's runs are then made once for nbval, the browser and the tests.)
_SHARE_CONTEXT = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")

_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_GRACE_S = 2.0


@dataclass(frozen=True)
class CaseRun:
    """One run of a case: its settings, how it ended, what it printed and measured, and the case's verdict.

    ``result`` is the evidence the script printed (``None`` when it failed or was stopped), ``log`` everything it
    printed (ranks' lines prefixed ``[defaultN]:``), ``error`` the failing rank's error (headline and traceback;
    "" when the run succeeded), ``timed_out`` whether the runner stopped it at ``timeout_s``, ``seconds`` the
    wall time. Introduced in notebook 13.
    """

    key: str
    config: dict[str, Any]
    env: dict[str, str]
    nproc: int
    result: dict[str, Any] | None
    log: str
    error: str
    returncode: int | None
    timed_out: bool
    seconds: float

    @property
    def case(self) -> Case:
        """The case's row in :data:`labkit.clinic.CASES`."""
        return CASES[self.key]

    @property
    def finding(self) -> Finding:
        """The case's detector's verdict on this run."""
        return self.case.detect(self)

    @property
    def symptom(self) -> bool:
        """Whether the run shows the case's symptom."""
        return self.finding.present

    def lines(self, pattern: str = "", last: int = 0) -> list[str]:
        """The log's lines that contain ``pattern`` (all when ""), the last ``last`` of them (all when 0).

        The result line (``LABKIT_RESULT {...}``) is left out. Introduced in notebook 13.
        """
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
        if isinstance(last, bool) or not isinstance(last, int) or last < 0:
            raise ValueError(f"last must be an int >= 0, got {safe_repr(last)}")
        out = [ln for ln in self.log.splitlines() if pattern in ln and "LABKIT_RESULT " not in ln]
        return out[-last:] if last else out

    def error_line(self) -> str:
        """The last line of the error (the exception and its message), or "" when the run succeeded."""
        lines = [ln for ln in self.error.splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""


_CACHE: dict[tuple[str, str, tuple[tuple[str, str], ...]], CaseRun] = {}


def clear_cache() -> None:
    """Forget every remembered run, so that the next :func:`run_case` runs again (runs shared through
    ``$LABKIT_CLINIC_SHARE`` stay there for other processes; this one no longer reads them). Introduced in notebook
    13."""
    _CACHE.clear()
    _SHARE_OFF.append(True)


_SHARE_OFF: list[bool] = []  # clear_cache() was called: this process makes its own runs from now on


def _share_dir() -> str | None:
    """The sharing folder, if ``$LABKIT_CLINIC_SHARE`` names a folder owned by this user that nobody else can write."""
    return None if _SHARE_OFF else _share.folder(SHARE_ENV)


def _share_file(folder: str, key: str, cfg: dict[str, Any], extra: dict[str, str], limit: float) -> str:
    return _share.path_for(folder, [key, json.dumps(cfg, sort_keys=True), sorted(extra.items()), float(limit),
                                    sys.executable, [os.environ.get(k) for k in _SHARE_CONTEXT]])


def _share_locked(paths: list[str], cancel: threading.Event | None = None):
    """Hold the lock of every path's run, waiting while another process makes those runs; stop waiting, as
    interrupted, once ``cancel`` is set."""
    return _share.locked(paths, lambda: _cancelled(cancel))


def _share_load(path: str) -> CaseRun | None:
    """A run another process made (None if there is none, or it cannot be read as one)."""
    doc = _share.load(path)
    try:
        return CaseRun(**doc) if isinstance(doc, dict) else None
    except TypeError:
        return None


def _share_store(path: str, run: CaseRun) -> None:
    """Write a run for the other processes (atomically, 0600); a failure only costs them a run."""
    _share.store(path, dataclasses.asdict(run))


def _case(key: Any) -> Case:
    if not isinstance(key, str):
        raise TypeError(f"key must be a case name such as 'clip', got {type(key).__name__}")
    if key not in CASES:
        raise ValueError(f"unknown case {safe_repr(key)}; the cases are: {', '.join(CASES)}")
    return CASES[key]


def settings(key: str) -> dict[str, Any]:
    """Return the case script's ``CONFIG``: its settings as they were in the broken run. Introduced in notebook 13."""
    case = _case(key)
    return dict(importlib.import_module(case.module).CONFIG)


def choices(key: str) -> dict[str, tuple[str, ...]]:
    """Return the case script's ``CHOICES``: the values a text setting may take (empty where it has none).

    Introduced in notebook 13.
    """
    case = _case(key)
    return {k: tuple(v) for k, v in getattr(importlib.import_module(case.module), "CHOICES", {}).items()}


def source(key: str) -> str:
    """Return the case's settings and the source of the script functions the notebook shows (whole functions).

    Introduced in notebook 13.
    """
    case = _case(key)
    mod = importlib.import_module(case.module)
    head = f"# {case.module}: CONFIG = {mod.CONFIG!r}\n"
    for name, allowed in getattr(mod, "CHOICES", {}).items():
        head += f"#   {name} may be one of: {'; '.join(repr(a) for a in allowed)}\n"
    head += "\n"
    return head + "\n\n".join(inspect.getsource(getattr(mod, name)).rstrip() for name in case.show)


def causes(key: str) -> str:
    """Return the case's candidate causes as a lettered list, one per line (in the learner's language).
    Introduced in notebook 13."""
    case = _case(key)
    return "\n".join(f"({'abcdefgh'[i]}) {_(c.text)}" for i, c in enumerate(case.causes))


def _check_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise TypeError("env must be a dict of str to str, e.g. {'TORCH_DISTRIBUTED_DEBUG': 'DETAIL'}")
    bad = [k for k in env if not _ENV_NAME.match(k) or k in _RANK_VARS]
    if bad:
        raise ValueError(f"env names must be upper-case variable names other than the launcher's own ({bad[0]!r})")
    return dict(env)


@contextlib.contextmanager
def _stale_port() -> Iterator[int]:
    """A port on 127.0.0.1 that is bound but not listening, held for the block: a connection to it is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def _traceback(log: str) -> str:
    """The last Python traceback in a plain process's log (from 'Traceback' to the end), else the last lines."""
    i = log.rfind("Traceback (most recent call last):")
    if i >= 0:
        return log[i:].strip()
    return "\n".join(log.strip().splitlines()[-5:])


def _leader_exited(pid: int) -> bool:
    """Whether the process has exited, without reaping it (its pid, and so its group id, stay reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


@contextlib.contextmanager
def _scratch() -> Iterator[str]:
    """A folder of one run's own, removed with everything in it however the run ends (after its processes are dead).

    The run's processes get its ``tmp`` subfolder as ``TMPDIR``, so what a killed process leaves behind there (a case's
    ``tempfile.TemporaryDirectory``, multiprocessing's ``pymp-*`` folder of DataLoader workers) goes with it, and
    nothing of any other run or program is touched.
    """
    path = tempfile.mkdtemp(prefix="labkit-run-")
    try:
        os.mkdir(os.path.join(path, "tmp"))
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _cancelled(cancel: threading.Event | None) -> None:
    """Raise KeyboardInterrupt if ``cancel`` is set (``run_cases`` sets it for its worker threads on an interrupt)."""
    if cancel is not None and cancel.is_set():
        raise KeyboardInterrupt


def _run_single(module: str, args: list[str], env: dict[str, str], timeout: float,
                echo: Callable[[str], None] | None,
                cancel: threading.Event | None = None) -> tuple[int | None, str, bool]:
    """Run ``python -m module args`` in its own session; return (exit status or None, log, timed out).

    Whatever happens (success, failure, timeout, KeyboardInterrupt, ``cancel`` set), every process of the session is
    killed and the run's scratch folder removed before this returns. The leader is reaped only after its group has
    been killed, so the group id cannot have been reused by then. On Linux the process gets SIGKILL if this one dies
    (this thread, which started it, waits for its end).
    """
    _cancelled(cancel)
    with _scratch() as scratch:
        child_env = dict(os.environ)
        for k in _RANK_VARS:
            child_env.pop(k, None)
        child_env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env,
                          "TMPDIR": os.path.join(scratch, "tmp")})
        proc = subprocess.Popen([*_die_with_parent_argv(signal.SIGKILL), sys.executable, "-m", module, *args],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", bufsize=1, start_new_session=True, env=child_env)
        reader = _LineReader(proc.stdout, echo, "labkit-clinic-reader")
        deadline = time.monotonic() + timeout
        timed_out, exited_at = False, None
        try:
            while True:
                reader.poll()
                _cancelled(cancel)
                if reader.eof:
                    break  # every process that held the log pipe has closed it
                now = time.monotonic()
                if exited_at is None and _leader_exited(proc.pid):
                    exited_at = now
                if exited_at is not None and now - exited_at > _GRACE_S:
                    break  # the script is done; a straggler (a worker) still holds the pipe: killed below
                if now > deadline:
                    timed_out = True
                    break
        finally:
            with contextlib.suppress(ProcessLookupError):  # the whole session had already ended
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log = reader.finish()
            if proc.stdout is not None:
                proc.stdout.close()
    return (None if timed_out else proc.returncode), log, timed_out


class _Zygote:
    """The runner's side of :mod:`labkit.clinic._zygote`: start it, send it a run, follow the run's log, stop it.

    Each request carries an id that the zygote's answers repeat (``PID <id> <pid>``, ``EXIT <id> <status>``), so an
    answer can never be taken for another run's. When the caller is interrupted during a run, the runner asks the
    zygote to kill that run (SIGUSR1) and waits for its EXIT: the zygote then serves the next run. If it does not
    answer within seconds, the zygote is ended (SIGTERM: it kills its run first), and the next run starts a new one.
    """

    def __init__(self) -> None:
        child_env = dict(os.environ)
        for k in _RANK_VARS:
            child_env.pop(k, None)
        child_env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
        # No PR_SET_PDEATHSIG here: it fires when the *thread* that started the zygote ends, and that may be a
        # worker thread of run_cases. The zygote watches this process instead (labkit.clinic._zygote).
        self.proc = subprocess.Popen([sys.executable, "-m", "labkit.clinic._zygote"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
                                     start_new_session=True, env=child_env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._ended = False  # the zygote's stdout has closed
        self._seq = 0
        threading.Thread(target=self._pump, name="labkit-clinic-zygote", daemon=True).start()
        try:
            ready = self._next(120.0)
        except BaseException:  # interrupted while it imports torch
            self.kill()
            raise
        if ready != "READY":
            self.kill()
            raise RuntimeError("the clinic's zygote process did not start")

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def _next(self, timeout: float) -> str | None:
        """The zygote's next line; "" when none came within ``timeout``, None once it has ended."""
        if self._ended:
            return None
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return ""
        if line is None:
            self._ended = True
        return line

    def _answer(self, kind: str, rid: int, timeout: float) -> str | None:
        """Wait for the answer ``<kind> <rid> <value>`` and return the value; None if it ended or did not answer."""
        deadline = time.monotonic() + timeout
        want = f"{kind} {rid} "
        while True:
            line = self._next(max(0.0, min(0.1, deadline - time.monotonic())))
            if line is None:
                return None
            if line.startswith(want):
                return line[len(want):]
            if time.monotonic() >= deadline:
                return None

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(OSError):
            self.proc.send_signal(sig)  # (Popen does not signal a process it has reaped)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, module: str, args: list[str], env: dict[str, str], timeout: float,
            echo: Callable[[str], None] | None,
            cancel: threading.Event | None = None) -> tuple[int | None, str, bool]:
        """Run one module in a fresh fork; return (exit status or None, log, timed out), as _run_single does.

        An exception here (KeyboardInterrupt from Ctrl-C or from the echo, ``cancel`` set, a broken zygote) stops
        the run, its whole session, before it propagates.
        """
        self._seq += 1
        rid = self._seq
        with _scratch() as scratch:
            path = os.path.join(scratch, "log")
            request = {"id": rid, "module": module, "args": args, "log": path,
                       "env": {**env, "TMPDIR": os.path.join(scratch, "tmp")}}
            lines: list[str] = []
            status: int | None = None
            timed_out = started = ended = False
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
                if self._answer("PID", rid, 30.0) is None:
                    raise RuntimeError("the clinic's zygote did not start the run"
                                       + (" (it has ended)" if self._ended else " within 30 s"))
                started = True
                deadline = time.monotonic() + timeout
                with open(path, "a+", errors="replace") as log:
                    log.seek(0)
                    pending = ""
                    while True:
                        reply = self._next(0.1)
                        pending += log.read()
                        *done, pending = pending.split("\n")
                        for line in done:
                            lines.append(line)
                            if echo is not None:
                                echo(line)
                        if reply is None:
                            raise RuntimeError("the clinic's zygote ended during a run")
                        if reply.startswith(f"EXIT {rid} "):
                            status, ended = int(reply.split()[2]), True
                            break
                        _cancelled(cancel)
                        if not timed_out and time.monotonic() > deadline:
                            timed_out = True  # the zygote kills the run's whole session, then answers EXIT
                            self._signal(signal.SIGUSR1)
                    pending += log.read()
                    for line in [ln for ln in pending.split("\n") if ln]:
                        lines.append(line)
                        if echo is not None:
                            echo(line)
            finally:
                if not ended:  # an exception before the zygote said EXIT: the run may still go on
                    self._abort(rid, started)
        return (None if timed_out else status), "\n".join(lines), timed_out

    def _abort(self, rid: int, started: bool) -> None:
        """Kill run ``rid`` and wait until the zygote has reaped it; end the zygote if that does not work out."""
        try:
            if not self.alive():
                raise RuntimeError("the zygote has ended")
            if not started and self._answer("PID", rid, 10.0) is None:
                raise RuntimeError("the zygote did not start the run")
            self._signal(signal.SIGUSR1)
            if self._answer("EXIT", rid, 10.0) is None:
                raise RuntimeError("the zygote did not end the run")
        except BaseException:  # no answer, or a second Ctrl-C: end the zygote, which kills its run first
            self.kill()

    def kill(self) -> None:
        """End the zygote now: SIGTERM (it SIGKILLs its run's session, then exits), SIGKILL after 5 s."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # its own session (each run has another)
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """End the zygote when it is idle (its stdin closes); :meth:`kill` it if it has not ended within 5 s."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()


_ZYGOTE: _Zygote | None = None
_ZYGOTE_LOCK = threading.Lock()


def shutdown() -> None:
    """Stop the clinic's helper process (the zygote that forks one-process runs), if it runs. Runs again on demand.

    Introduced in notebook 13.
    """
    global _ZYGOTE
    with _ZYGOTE_LOCK:
        if _ZYGOTE is not None:
            _ZYGOTE.stop()
            _ZYGOTE = None


atexit.register(shutdown)


def _run_process(module: str, args: list[str], env: dict[str, str], timeout: float,
                 echo: Callable[[str], None] | None,
                 cancel: threading.Event | None = None) -> tuple[int | None, str, bool]:
    """Run a one-process case module: forked from the zygote on Linux, else (or if it cannot start) a new Python."""
    global _ZYGOTE
    if sys.platform != "linux":
        return _run_single(module, args, env, timeout, echo, cancel)
    with _ZYGOTE_LOCK:
        _cancelled(cancel)
        if _ZYGOTE is None or not _ZYGOTE.alive():
            try:
                _ZYGOTE = _Zygote()
            except (OSError, RuntimeError):
                _ZYGOTE = None
                return _run_single(module, args, env, timeout, echo, cancel)
        return _ZYGOTE.run(module, args, env, timeout, echo, cancel)


def run_case(key: str, fix: dict[str, Any] | None = None, *, env: dict[str, str] | None = None,
             stream: bool = False, timeout: float | None = None, fresh: bool = False) -> CaseRun:
    """Run case ``key`` with the settings in ``fix`` changed (``None``: the broken run) and return its :class:`CaseRun`.

    ``env`` adds environment variables (e.g. ``{"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}``); ``stream=True`` prints
    the log as it comes; ``timeout`` (seconds) defaults to the case's ``timeout_s``. A run that fails is not an
    exception here: its error is in the returned run. Bad arguments (an unknown case or setting, a value of the
    wrong type) raise ``TypeError``/``ValueError`` before anything starts. An interrupt (Ctrl-C) stops the run, every
    process of it, and is raised again; the interrupted run is not remembered.

    Introduced in notebook 13.
    """
    return _run_case(key, fix, env=env, stream=stream, timeout=timeout, fresh=fresh)


def _run_case(key: str, fix: dict[str, Any] | None = None, *, env: dict[str, str] | None = None,
              stream: bool = False, timeout: float | None = None, fresh: bool = False,
              cancel: threading.Event | None = None) -> CaseRun:
    """:func:`run_case`, stopped as by an interrupt (KeyboardInterrupt) once ``cancel`` is set."""
    case = _case(key)
    cfg = merge_config(settings(key), fix, choices(key))
    extra = _check_env(env)
    if not isinstance(stream, bool) or not isinstance(fresh, bool):
        raise TypeError("stream and fresh must be True or False")
    limit = case.timeout_s if timeout is None else timeout
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit <= 3600:
        raise ValueError(f"timeout must be a number of seconds in (0, 3600], got {safe_repr(timeout)}")
    cache_key = (key, json.dumps(cfg, sort_keys=True), tuple(sorted(extra.items())))
    if not fresh and cache_key in _CACHE:
        return _CACHE[cache_key]
    share = None if fresh else _share_dir()
    if share is None:
        run = _make_run(case, cfg, extra, float(limit), stream, cancel)
    else:  # made once for every process that shares: the others wait for it, then read it
        shared = _share_file(share, key, cfg, extra, float(limit))
        with _share_locked([shared], cancel):
            made = _share_load(shared)
            run = made if made is not None else _make_run(case, cfg, extra, float(limit), stream, cancel)
            if made is None:
                _share_store(shared, run)
            elif stream and made.log:
                print(made.log)  # what the run printed, as a run made here would have streamed it
    _CACHE[cache_key] = run
    return run


def _make_run(case: Case, cfg: dict[str, Any], extra: dict[str, str], limit: float, stream: bool,
              cancel: threading.Event | None) -> CaseRun:
    """Run a case once, with the settings ``cfg`` and the environment ``extra``; every process gone on return."""
    key = case.key
    # a freshly started process gets its own random hash seed, as `python` does, even where the caller pinned one
    # (case 8's two runs depend on it; forked one-process runs share the zygote's, and none depends on it)
    run_env = {"PYTHONHASHSEED": "random", **extra}
    echo = print if stream else None
    with contextlib.ExitStack() as stack:
        if cfg.get("master_port") == "stale":
            cfg = {**cfg, "master_port": str(stack.enter_context(_stale_port()))}
        args = ["--config", json.dumps(cfg)]
        t0 = time.perf_counter()
        if case.nproc == 1:
            rc, log, timed_out = _run_process(case.module, args, run_env, float(limit), echo, cancel)
            error = "" if rc == 0 else ("stopped at the runner's timeout" if timed_out else _traceback(log))
        else:
            lines: list[str] = []

            def collect(line: str) -> None:
                lines.append(line)
                if echo is not None:
                    echo(line)

            scratch = stack.enter_context(_scratch())  # the ranks' TMPDIR: removed even after a kill
            try:
                _launch(case.module, nproc=case.nproc, args=args, timeout=float(limit), stream=collect,
                        env={**run_env, "TMPDIR": os.path.join(scratch, "tmp")}, cancel=cancel)
                rc, error, timed_out = 0, "", False
            except LaunchTimeout as exc:
                rc, error, timed_out = None, str(exc), True
            except LaunchError as exc:
                rc, error, timed_out = exc.returncode, str(exc), False
            log = "\n".join(lines)
        seconds = time.perf_counter() - t0
    result = parse_result(log) if rc == 0 else None
    return CaseRun(key, cfg, extra, case.nproc, result, log, error, rc, timed_out, seconds)


def _run_batch(todo: list[tuple[Case, dict[str, Any], Any]], stream: bool,
               cancel: threading.Event | None = None) -> None:
    """Run one-process cases one after the other in one Python process; remember each case's run (none if interrupted)."""
    arg = json.dumps([[case.module, cfg] for case, cfg, _ck in todo])
    t0 = time.perf_counter()
    rc, log, timed_out = _run_process("labkit.clinic._batch", ["--plan", arg], {},
                                      sum(case.timeout_s for case, _cfg, _ck in todo), print if stream else None, cancel)
    seconds = time.perf_counter() - t0
    parts: dict[int, list[str]] = {}
    status: dict[int, int] = {}
    current = None
    for line in log.splitlines():
        if line.startswith(_batch.BEGIN):
            current = int(line[len(_batch.BEGIN):])
            parts[current] = []
        elif line.startswith(_batch.END):
            i, code = line[len(_batch.END):].split()
            status[int(i)] = int(code)
            current = None
        elif current is not None:
            parts[current].append(line)
    for i, (case, cfg, ck) in enumerate(todo):
        text = "\n".join(parts.get(i, []))
        code = status.get(i)
        error = "" if code == 0 else (_traceback(text) if code is not None else
                                      "the batch process ended before this case finished"
                                      + (" (stopped at the runner's timeout)" if timed_out else ""))
        _CACHE[ck] = CaseRun(case.key, cfg, {}, 1, parse_result(text) if code == 0 else None, text, error, code,
                             timed_out and code is None, seconds / len(todo))


def run_cases(requests: list[Any], *, parallel: int = 1, stream: bool = False) -> list[CaseRun]:
    """Run several cases and return their runs, in the order asked; the runs are remembered as :func:`run_case`'s.

    ``requests`` holds case keys (the broken run) or ``(key, fix)`` pairs. The one-process cases run one after the
    other in a single Python process (each is its script's ``main``, as in a process of its own; they share one
    start-up of Python and torch). Each 2-rank case is its own torchrun launch. ``parallel`` (1 or 2) is how many of
    these jobs (the one-process batch counting as one) run at a time: with 2, a launch that mostly waits (for a
    timeout, a rendezvous) overlaps with another one's work. Every job has finished, and left no process behind,
    when this returns. Runs already made are not made again. An interrupt (Ctrl-C) stops every job in progress,
    whole process trees, and is raised again; the jobs it stopped are not remembered.

    Introduced in notebook 13.
    """
    if isinstance(requests, (str, bytes)) or not isinstance(requests, (list, tuple)):
        raise TypeError("requests must be a list of case keys or (key, fix) pairs")
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel not in (1, 2):
        raise ValueError(f"parallel must be 1 or 2 (jobs at a time on a small machine), got {safe_repr(parallel)}")
    if not isinstance(stream, bool):
        raise TypeError("stream must be True or False")
    plan: list[tuple[Case, dict[str, Any], Any]] = []
    for req in requests:
        if isinstance(req, str):
            key, fix = req, None
        elif isinstance(req, (tuple, list)) and len(req) == 2:
            key, fix = req
        else:
            raise TypeError(f"each request is a case key or a (key, fix) pair, got {safe_repr(req)}")
        case = _case(key)
        cfg = merge_config(settings(key), fix, choices(key))
        plan.append((case, cfg, (key, json.dumps(cfg, sort_keys=True), ())))
    share = _share_dir()
    todo, seen = [], set()
    for case, cfg, ck in plan:
        if share and ck not in _CACHE:
            made = _share_load(_share_file(share, case.key, cfg, {}, float(case.timeout_s)))
            if made is not None:
                _CACHE[ck] = made
        if ck not in _CACHE and ck not in seen:
            seen.add(ck)
            todo.append((case, cfg, ck))
    jobs: list[Callable[[], Any]] = []
    cancel = threading.Event()  # set when the caller is interrupted: the jobs in the worker threads stop too
    single = [t for t in todo if t[0].nproc == 1]
    if single:
        def batch() -> None:
            if share is None:
                _run_batch(single, stream, cancel)
                return
            # shared (the 2-rank jobs share theirs in _run_case): made once, the other processes wait and read
            files = {ck: _share_file(share, case.key, cfg, {}, float(case.timeout_s)) for case, cfg, ck in single}
            with _share_locked(list(files.values()), cancel):
                left = []
                for case, cfg, ck in single:
                    made = _share_load(files[ck])
                    if made is not None:
                        _CACHE[ck] = made
                        if stream and made.log:
                            print(made.log)
                    else:
                        left.append((case, cfg, ck))
                if left:
                    _run_batch(left, stream, cancel)
                    for _case, _cfg, ck in left:
                        _share_store(files[ck], _CACHE[ck])

        jobs.append(batch)
    for case, cfg, _ck in todo:
        if case.nproc > 1:
            jobs.append(lambda key=case.key, cfg=cfg: _run_case(key, _changes(key, cfg), stream=stream, cancel=cancel))
    if parallel == 1 or len(jobs) < 2:
        for job in jobs:
            job()
    else:
        with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="labkit-clinic") as pool:
            futures = [pool.submit(job) for job in jobs]
            try:
                for future in futures:
                    future.result()
            except BaseException:  # Ctrl-C reaches this (the main) thread only; a job's error stops the rest too
                cancel.set()
                raise
    return [_CACHE[ck] for _case, _cfg, ck in plan]


def _changes(key: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The settings of ``cfg`` that differ from the case's defaults (what run_case takes as a fix)."""
    defaults = settings(key)
    return {k: v for k, v in cfg.items() if defaults[k] != v or type(defaults[k]) is not type(v)}


def _letter(answer: Any) -> str | None:
    if not isinstance(answer, str):
        return None
    a = answer.strip().strip("()").strip().lower()
    return a if len(a) == 1 and a.isalpha() else None


def grade_cause(key: str, answer: Any) -> tuple[bool, str]:
    """Grade a cause given as the letter of one of :func:`causes` ("c"); the message explains the choice. An
    answer that is not one of the letters gets a :class:`~labkit.exercises._core.FormatSlip` (not a wrong try).

    Introduced in notebook 13.
    """
    case = _case(key)
    letter = _letter(answer)
    n = len(case.causes)
    if letter is None or ord(letter) - ord("a") >= n:
        return False, FormatSlip(_("Answer with the letter of one cause, one of {letters}.").format(
            letters=", ".join(repr(c) for c in "abcdefgh"[:n])))
    i = ord(letter) - ord("a")
    if i == case.answer:
        return True, _(case.causes[i].why)
    return False, _("({letter}) does not fit the evidence: {why}").format(letter=letter, why=_(case.causes[i].why))


def grade_fix(key: str, fix: Any) -> tuple[bool, str]:
    """Run case ``key`` with the learner's one-setting ``fix`` and grade it: is the symptom gone?

    The fix is a dict of exactly one setting of the script's ``CONFIG`` with a new value; anything else (not a dict,
    several settings, a setting the script lacks, a value of the wrong type) gets a
    :class:`~labkit.exercises._core.FormatSlip` and runs nothing. Introduced in notebook 13.
    """
    case = _case(key)
    if not isinstance(fix, dict):
        return False, FormatSlip(_("Give the fix as a dict of one setting of the script's CONFIG, e.g. {'lr': 0.1}."))
    if len(fix) != 1:
        return False, FormatSlip(_("Change exactly one setting: the clinic's fixes are one line, or one value."))
    defaults = settings(key)
    (name, value), = fix.items()
    try:
        merge_config(defaults, fix, choices(key))
    except (TypeError, ValueError) as exc:  # a setting the script does not have, or a value of the wrong type
        return False, FormatSlip(str(exc))
    if value == defaults[name] and type(value) is type(defaults[name]):
        return False, _("{name} = {value!r} is what the broken run already had.").format(name=name, value=value)
    if name in case.job:
        msg = _("{name} is part of the job this run must still do (the job's settings, {settings}, keep their "
                "values): changing it avoids the failure instead of curing it.").format(
            name=name, settings=", ".join(case.job))
        return False, msg + (" " + _(case.wrong_fix_why) if fix == case.wrong_fix else "")
    run = run_case(key, fix)
    found = run.finding
    msg = _("With {fix!r}: {summary}.").format(fix=fix, summary=found.summary)  # the summary is translated
    if found.present:
        if fix == case.wrong_fix:
            msg += " " + _(case.wrong_fix_why)
        return False, msg
    if fix == case.fix:
        why = _(case.fix_why)
    else:
        why = _("(The reference fix is {fix!r}: {why})").format(fix=case.fix, why=_(case.fix_why))
    return True, msg + " " + why


def _first_sentence(text: str) -> str:
    """The first sentence of ``text``, with its full stop: up to the first ". " (or Chinese "。")."""
    en, zh = text.split(". ")[0], text.split("\u3002")[0]
    return zh + "\u3002" if len(zh) < len(en) else en.rstrip(".") + "."


def checklist() -> str:
    """Return the clinic's closing table, to keep: for every case whose cause *and* fix you have checked correct in
    this kernel, its symptom, the first thing to look at, the cause and the fix; the other cases are listed as still
    to solve (so the table never tells an answer you have not found). Introduced in notebook 13.
    """
    from labkit.check import (
        results,  # here, not at the top: labkit.check imports the exercises, which import this
    )

    done = results()
    lines, todo = [], []
    for case in CASES.values():
        if done.get(f"13.{case.key}-cause") == "correct" and done.get(f"13.{case.key}-fix") == "correct":
            lines += [_("Case {number} · {title}").format(number=case.number, title=_(case.title)),
                      "  " + _("look at: {hint}").format(hint=_(case.cause_hint)),
                      "  " + _("cause:   {cause}").format(cause=_(case.causes[case.answer].text)),
                      "  " + _("fix:     {fix!r} ({why})").format(fix=case.fix,
                                                                 why=_first_sentence(_(case.fix_why))), ""]
        else:
            todo.append(str(case.number))
    if len(todo) == 1:
        lines.append(_("Still to solve (cause and fix): case {numbers}.").format(numbers=todo[0]))
    elif todo:
        lines.append(_("Still to solve (cause and fix): cases {numbers}.").format(numbers=", ".join(todo)))
    return "\n".join(lines).rstrip()
