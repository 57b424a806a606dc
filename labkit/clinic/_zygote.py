"""A process that has imported torch once and forks a fresh process for each one-process clinic run (Linux).

Starting Python and importing torch costs about two seconds of CPU, more than most clinic cases take to run. The
runner (:mod:`labkit.clinic.runner`) therefore starts this process once, the first time a one-process case runs;
it imports torch and the labkit modules the case scripts use, then waits for requests on its stdin, one JSON line
each: ``{"id": n, "module": ..., "args": [...], "env": {...}, "log": path}``. For each it forks a child, which
starts a session of its own, sends its output to ``log`` and runs the module as ``python -m module args`` would
(``runpy``, as ``__main__``). The zygote answers ``PID <id> <pid>`` at once and ``EXIT <id> <status>`` when the
child has ended, after it has killed whatever the child left in its session (DataLoader workers). Each case thus
still runs in a process of its own, started from a clean state, only without the start-up. The request's id in
every answer lets the runner tell this run's answers from a stale one's.

Signals: SIGUSR1 kills the run in progress (its whole session; the zygote then answers ``EXIT`` and serves the
next request): the runner sends it at a run's timeout and when its caller is interrupted (Ctrl-C). SIGTERM kills
the run in progress and ends the zygote. The child gets SIGKILL if the zygote dies (``PR_SET_PDEATHSIG``).

It ends when its stdin closes (the runner's :func:`labkit.clinic.shutdown`, or the runner's process ending), and
when the process that started it dies (a thread watches for that, and kills the run in progress first). Not in
``labkit.clinic.__all__``: the runner's plumbing. Introduced in notebook 13.
"""

from __future__ import annotations

import ctypes
import json
import os
import runpy
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

__all__ = ["main"]

#: What the case scripts import, loaded once here so that a forked child starts with them. ``torch._dynamo`` is
#: imported by the first optimizer a process builds (about two seconds: more than most cases take to run).
PRELOAD = ("torch", "torch._dynamo", "torch.optim", "torch.nn.functional", "torch.utils.data", "torch.profiler",
           "labkit.data", "labkit.models", "labkit.memory", "labkit.debug", "labkit.profiling", "labkit.dist",
           "labkit.clinic._script", "labkit.clinic._batch")


_CURRENT: list[int] = []  # the pid of the run in progress, if any (not reaped yet: its pid and group stay ours)
_PR_SET_PDEATHSIG = 1


def _kill_current() -> None:
    """SIGKILL the run in progress, its whole session (the child leads its own group)."""
    for pid in list(_CURRENT):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _on_usr1(signum: int, frame: Any) -> None:
    _kill_current()  # the main loop's waitid then returns, and the zygote answers EXIT


def _on_term(signum: int, frame: Any) -> None:
    _kill_current()
    os._exit(0)


def _watch_parent(parent: int) -> None:
    """If the process that started the zygote dies, kill the run in progress (its whole session) and end.

    (``PR_SET_PDEATHSIG`` would fire when the parent's *thread* that started the zygote ends, and the runner may
    start it from a worker thread (``run_cases(parallel=2)``): so this thread watches the parent process instead.)
    """
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            _kill_current()
            os._exit(0)


def _child(request: dict, zygote: int, prctl: Any) -> None:
    """In the forked child: a session of its own, output to the log, then run the module as __main__. Never returns."""
    code = 1
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # the zygote's handlers are not the run's
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # die with the zygote (forked by its main thread)
        if os.getppid() != zygote:
            os._exit(1)  # the zygote died before the prctl
        os.setsid()
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        sys.stdin = open(0, closefd=False)  # the process's own descriptors, for its whole life
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.update(request.get("env", {}))
        tempfile.tempdir = None  # read TMPDIR again (the runner gives each run a folder of its own)
        mp = sys.modules.get("multiprocessing.process")
        if mp is not None:  # multiprocessing's own temporary folder (pymp-*) goes there too
            mp.current_process()._config.pop("tempdir", None)
        sys.argv = [request["module"], *request["args"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main() -> int:
    """Serve fork requests from stdin until it closes. Introduced in notebook 13."""
    # SIGUSR1 and SIGTERM must reach the main thread, to interrupt its wait for the child (a Python handler runs
    # in the main thread, but a signal that the kernel hands to another thread would not wake it up). So they are
    # blocked while every other thread starts (the watcher, and whatever the imports start), which inherit that,
    # and unblocked in the main thread alone.
    ours = {signal.SIGUSR1, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, ours)
    signal.signal(signal.SIGUSR1, _on_usr1)
    signal.signal(signal.SIGTERM, _on_term)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="zygote-watch", daemon=True).start()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    except (OSError, AttributeError):
        prctl = None
    for name in PRELOAD:
        __import__(name)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, ours)
    print("READY", flush=True)
    me = os.getpid()
    for line in sys.stdin:
        request = json.loads(line)
        rid = int(request.get("id", 0))
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, me, prctl)
        _CURRENT.append(pid)
        print(f"PID {rid} {pid}", flush=True)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped: its pid (and group id) stay ours
        _kill_current()  # what it left in its session: DataLoader workers and the like
        _CURRENT.remove(pid)
        _, status = os.waitpid(pid, 0)
        print(f"EXIT {rid} {os.waitstatus_to_exitcode(status)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
