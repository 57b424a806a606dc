"""labkit.dist: the notebook-side torchrun launcher (results, failures, timeouts, no orphans), rank_env,
and the all-reduce bandwidth formulas of labkit.recipes.allreduce."""

from __future__ import annotations

import glob
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from labkit import dist
from labkit.dist import LaunchError, LaunchTimeout, _alive, launch
from labkit.recipes import allreduce as ar

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------ small scripts the launches run
# They import no torch, so a launch costs only torchrun's own start-up (~2-3 s).

OK_SCRIPT = """
import json, os, sys
rank = int(os.environ["RANK"])
print(f"hello from rank {rank} of {os.environ['WORLD_SIZE']}", flush=True)
if rank == 0:
    print("LABKIT_RESULT " + json.dumps({"world": int(os.environ["WORLD_SIZE"]), "args": sys.argv[1:],
                                          "port": os.environ["MASTER_PORT"],
                                          "omp": os.environ.get("OMP_NUM_THREADS")}), flush=True)
"""

# Every rank starts a grandchild (same process group) and records pids; rank 1 then fails.
CRASH_SCRIPT = """
import os, subprocess, sys, time
rank = int(os.environ["RANK"])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print(f"rank {rank} pid {os.getpid()} child {child.pid}", flush=True)
time.sleep(1.0)
if rank == 1:
    def deep_failure():
        raise ValueError("rank one cannot go on")
    deep_failure()
time.sleep(300)
"""

# What DeepSpeed's shm all-reduce op creates per rank (deepspeed/ops/csrc/cpu/comm/shm.cpp), made here by hand
# so that no test has to compile the op (about 70 s cold): /dev/shm/deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}
MAKE_SHM = """
def make_shm_buffer():
    path = (f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{os.environ['MASTER_ADDR']}_"
            f"{os.environ['MASTER_PORT']}_{os.environ['RANK']}")
    with open(path, "wb") as fh:
        fh.write(b"\\0" * 65536)
    print(f"rank {os.environ['RANK']} made {path}", flush=True)
"""
SHM_GLOB = "/dev/shm/deepspeed_allreduce_buffer_*"
SHM_MADE_RE = re.compile(r"rank \d made (/dev/shm/\S+)")

# Every rank makes a (fake) DeepSpeed shm buffer and hangs; rank 1 even ignores SIGTERM (so only SIGKILL
# ends it) and has a grandchild.
HANG_SCRIPT = """
import os, signal, subprocess, sys, time
""" + MAKE_SHM + """
rank = int(os.environ["RANK"])
make_shm_buffer()
if rank == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print(f"rank {rank} waiting forever", flush=True)
while True:
    time.sleep(1)
"""

# Every rank says who it is, then sleeps until it is killed.
SLEEP_FOREVER_SCRIPT = """
import os, time
print(f"rank {os.environ['RANK']} pid {os.getpid()} sleeping", flush=True)
while True:
    time.sleep(1)
"""


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_launch_returns_rank0_result_and_streams_every_rank(tmp_path, watch_processes):
    script = _write(tmp_path, "ok.py", OK_SCRIPT)
    lines: list[str] = []
    with watch_processes() as w:
        res = launch(script, nproc=2, args=["--flag", 7], timeout=60, stream=lines.append)
    assert res["world"] == 2 and res["args"] == ["--flag", "7"] and res["omp"] == "1"
    assert 1024 <= int(res["port"]) < dist._ephemeral_range()[0]  # MASTER_PORT from below the ephemeral range
    assert any(ln.startswith("[default0]:hello from rank 0 of 2") for ln in lines)
    assert any(ln.startswith("[default1]:hello from rank 1 of 2") for ln in lines)
    assert w.seen, "the watcher saw no process: the test would prove nothing"
    assert w.leftovers() == []


# A rank that raises while a non-daemon thread still runs (as gloo's and the store's threads do after a broken
# process group): without exit_on_error the interpreter would wait 120 s for that thread before the rank ended.
RAISE_WITH_THREAD_SCRIPT = """
import os, threading, time
from labkit.dist import run_rank_main

def main():
    threading.Thread(target=time.sleep, args=(120,)).start()
    if os.environ["RANK"] == "1":
        raise RuntimeError("rank one broke on purpose")
    return 0

run_rank_main(main, exit_on_error=True)
"""


def test_run_rank_main_exit_on_error_ends_a_failing_rank_at_once(tmp_path, watch_processes):
    script = _write(tmp_path, "raise_thread.py", RAISE_WITH_THREAD_SCRIPT)
    t0 = time.monotonic()
    with watch_processes() as w, pytest.raises(LaunchError) as info:
        launch(script, nproc=2, timeout=90, stream=False)
    assert not isinstance(info.value, LaunchTimeout)
    assert info.value.rank == 1 and "rank one broke on purpose" in info.value.rank_traceback
    assert time.monotonic() - t0 < 60, "the failing rank waited for its thread"
    assert w.leftovers() == []
    with pytest.raises(TypeError, match="exit_on_error"):
        dist.run_rank_main(lambda: 0, exit_on_error="yes")


def test_launch_without_result_line_returns_none(tmp_path):
    script = _write(tmp_path, "quiet.py", "print('no result here')\n")
    assert launch(script, nproc=1, timeout=60, stream=False) is None


def test_rank_failure_raises_with_that_ranks_traceback_and_leaves_no_process(tmp_path, watch_processes):
    script = _write(tmp_path, "crash.py", CRASH_SCRIPT)
    t0 = time.monotonic()
    with watch_processes() as w, pytest.raises(LaunchError) as info:
        launch(script, nproc=2, timeout=60, stream=False)
    elapsed = time.monotonic() - t0
    err = info.value
    assert not isinstance(err, LaunchTimeout)
    assert err.rank == 1
    assert err.returncode not in (0, None)
    assert "ValueError: rank one cannot go on" in err.rank_traceback
    assert "deep_failure" in err.rank_traceback  # the whole traceback, not just the last line
    assert "rank 1 failed" in str(err) and "rank one cannot go on" in str(err)
    assert "rank 0 pid" in err.log and "rank 1 pid" in err.log
    assert elapsed < 30
    # torchrun, 2 ranks and 2 grandchildren: all recorded, all gone, nothing left in their groups
    assert len(w.seen) >= 5, w.seen
    assert w.leftovers() == [] and err.leftover == []


def test_hanging_launch_is_killed_at_its_timeout(tmp_path, watch_processes):
    script = _write(tmp_path, "hang.py", HANG_SCRIPT)
    lines: list[str] = []
    before_shm = set(glob.glob(SHM_GLOB))
    t0 = time.monotonic()
    with watch_processes() as w, pytest.raises(LaunchTimeout) as info:
        launch(script, nproc=2, timeout=20, stream=lines.append)  # 20 s: torchrun starts slowly on a busy box
    elapsed = time.monotonic() - t0
    assert 20 <= elapsed < 20 + 15  # SIGTERM, a grace period, then SIGKILL for the rank that ignores it
    assert "timeout of 20 s" in str(info.value)
    assert "[default1]:rank 1 waiting forever" in lines, "rank 1 never started: the kill was not tested"
    for r in (0, 1):  # the message shows each rank's last line
        if f"[default{r}]:rank {r} waiting forever" in lines:
            assert f"rank {r}: last line 'rank {r} waiting forever'" in str(info.value)
    assert len(w.seen) >= 4, w.seen  # torchrun, 2 ranks, rank 1's grandchild
    assert w.leftovers() == [] and info.value.leftover == []
    made = SHM_MADE_RE.findall("\n".join(lines))
    assert made, "no rank made its shm buffer: the cleanup was not tested"
    assert [m for m in made if os.path.exists(m)] == []  # launch removed what the killed ranks left
    assert set(glob.glob(SHM_GLOB)) <= before_shm


def test_interrupting_the_cell_still_kills_everything(tmp_path, watch_processes):
    """Ctrl-C in a notebook raises KeyboardInterrupt inside launch(); nothing may survive it."""
    script = _write(tmp_path, "hang.py", HANG_SCRIPT)

    def interrupt_once_rank1_runs(line: str) -> None:
        if "rank 1 waiting forever" in line:
            raise KeyboardInterrupt

    before_shm = set(glob.glob(SHM_GLOB))
    with watch_processes() as w, pytest.raises(KeyboardInterrupt):
        launch(script, nproc=2, timeout=120, stream=interrupt_once_rank1_runs)
    assert len(w.seen) >= 4, w.seen
    assert w.leftovers() == []
    assert set(glob.glob(SHM_GLOB)) <= before_shm


def test_an_interrupted_launch_removes_its_log_folder(tmp_path, monkeypatch):
    """The per-rank logs live in a temporary folder of the launch's: gone after Ctrl-C too, while the interrupt's
    traceback (which IPython keeps as sys.last_traceback) still holds the launch's frame."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    script = _write(tmp_path, "sleep.py", SLEEP_FOREVER_SCRIPT)
    seen: list[str] = []

    def interrupt_once_rank1_runs(line: str) -> None:
        seen.append(line)
        if "rank 1 pid" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as info:
        launch(script, nproc=2, timeout=120, stream=interrupt_once_rank1_runs)
    assert any("rank 1 pid" in ln for ln in seen), seen
    assert info.traceback and list(tmp.iterdir()) == []


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"nproc": "2"}, TypeError),
        ({"nproc": True}, TypeError),
        ({"nproc": 0}, ValueError),
        ({"args": "--steps 3"}, TypeError),
        ({"args": 5}, TypeError),
        ({"args": [None]}, TypeError),
        ({"timeout": 0}, ValueError),
        ({"timeout": -1.0}, ValueError),
        ({"timeout": float("nan")}, ValueError),
        ({"timeout": "10"}, TypeError),
        ({"module_or_script": "no_such_module_xyz.sub"}, ValueError),
        ({"module_or_script": "not a module"}, ValueError),
        ({"module_or_script": "missing_script.py"}, ValueError),
        ({"module_or_script": 42}, TypeError),
        ({"module_or_script": ""}, TypeError),
        ({"threads_per_rank": 0}, ValueError),
        ({"env": {"A": 1}}, TypeError),
        ({"stream": "yes"}, TypeError),
        ({"cwd": "/no/such/dir"}, ValueError),
    ],
)
def test_launch_rejects_bad_input_before_starting_anything(kwargs, exc):
    call = {"module_or_script": "labkit.recipes.ddp", "nproc": 2, "args": [], "timeout": 10.0, **kwargs}
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(exc):
        launch(**call)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_find_free_port_is_bindable_and_below_the_ephemeral_range():
    lo, _ = dist._ephemeral_range()
    with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
        assert lo == int(fh.read().split()[0])
    for _ in range(20):
        port = dist.find_free_port()
        assert 20000 <= port < lo
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert dist.find_free_port("localhost") < lo


@pytest.mark.parametrize("host, exc", [("", TypeError), (None, TypeError), (3.5, TypeError), (8080, TypeError),
                                       ("float64", ValueError), ("no such host.invalid", ValueError),
                                       ("192.0.2.1", ValueError)])  # 192.0.2.1: TEST-NET, not this machine
def test_find_free_port_rejects_bad_hosts(host, exc):
    with pytest.raises(exc, match="host"):
        dist.find_free_port(host)


@pytest.mark.parametrize("text, pool", [
    ("32768\t60999\n", range(20000, 32768)),
    ("49152 65535", range(20000, 49152)),
    ("20500 60999", range(1024, 20500)),  # too little room above 20000: go lower
    ("1024 60999", range(61000, 65536)),  # nothing below: use the ports above the range
    ("1024 65000", range(0)),  # no room anywhere: find_free_port lets the OS pick
    ("garbage", range(20000, 32768)),  # unreadable: the Linux default 32768-60999
])
def test_port_pool_stays_out_of_the_ephemeral_range(tmp_path, text, pool):
    f = tmp_path / "ip_local_port_range"
    f.write_text(text)
    assert dist._port_pool(f) == pool
    assert dist._port_pool(tmp_path / "missing") == range(20000, 32768)


def test_find_free_port_skips_ports_in_use(monkeypatch):
    busy = dist.find_free_port()
    with socket.socket() as held:
        held.bind(("0.0.0.0", busy))  # held on all interfaces, not on 127.0.0.1 itself
        held.listen()
        assert not dist._bindable("127.0.0.1", busy)
        monkeypatch.setattr(dist, "_port_pool", lambda path=None: range(busy, busy + 1))
        assert dist.find_free_port() != busy  # every try hit the busy port: the OS picked another


def test_parse_result_takes_the_last_result_line():
    text = "noise\n[default0]:LABKIT_RESULT {\"a\": 1}\nmore\n[default0]:LABKIT_RESULT {\"a\": 2}\n"
    assert dist.parse_result(text) == {"a": 2}
    assert dist.parse_result("nothing") is None
    with pytest.raises(ValueError):
        dist.parse_result("LABKIT_RESULT {not json")
    with pytest.raises(ValueError):
        dist.parse_result("LABKIT_RESULT [1, 2]")
    with pytest.raises(TypeError):
        dist.parse_result(b"LABKIT_RESULT {}")


def test_emit_result_round_trips(capsys):
    dist.emit_result({"losses": [0.5, 0.25], "world_size": 2})
    assert dist.parse_result(capsys.readouterr().out) == {"losses": [0.5, 0.25], "world_size": 2}
    with pytest.raises(TypeError):
        dist.emit_result([1, 2])


def test_rank_env_reads_torchrun_then_slurm_then_single():
    tr = dist.rank_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
                        "MASTER_PORT": "29400"})
    assert (tr.rank, tr.world_size, tr.local_rank, tr.master_addr, tr.master_port, tr.launcher) == \
        (3, 4, 1, "10.0.0.1", 29400, "torchrun")
    sl = dist.rank_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1",
                        "SLURM_JOB_ID": "123456", "SLURM_NNODES": "1"})
    assert (sl.rank, sl.world_size, sl.local_rank, sl.launcher) == (1, 2, 1, "slurm")
    assert sl.master_addr == "127.0.0.1" and sl.master_port == 20000 + 123456 % 12768 < 32768
    single = dist.rank_env({})
    assert (single.rank, single.world_size, single.launcher, single.master_port) == (0, 1, "single", 0)


@pytest.mark.parametrize(
    "environ",
    [
        {"RANK": "2", "WORLD_SIZE": "2"},
        {"RANK": "x", "WORLD_SIZE": "2"},
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_NNODES": "2"},  # multi-node needs MASTER_ADDR
    ],
)
def test_rank_env_rejects_inconsistent_layouts(environ):
    with pytest.raises(ValueError):
        dist.rank_env(environ)


def test_init_process_group_rejects_bad_backend():
    with pytest.raises(ValueError):
        dist.init_process_group("mpi")
    with pytest.raises(ValueError):
        dist.init_process_group("gloo", timeout_s=0)


# ------------------------------------------------------------------ all-reduce bandwidth formulas

def test_busbw_is_algbw_times_2_n_minus_1_over_n_as_in_nccl_tests():
    # nccl-tests doc/PERFORMANCE.md: allreduce busbw = algbw * 2(n-1)/n
    assert ar.busbw_factor(1) == 0.0
    assert ar.busbw_factor(2) == 1.0
    assert ar.busbw_factor(8) == 1.75
    assert math.isclose(ar.busbw(100.0, 4), 150.0)
    assert math.isclose(ar.algbw(1 << 30, 0.5), 2 * (1 << 30) / 1e9)
    for bad in (0, -1, True, 1.5):
        with pytest.raises((TypeError, ValueError)):
            ar.busbw_factor(bad)
    with pytest.raises(ValueError):
        ar.algbw(1024, 0.0)
    with pytest.raises(ValueError):
        ar.busbw(-1.0, 2)


def test_parse_and_format_sizes():
    assert ar.parse_size("64K") == 65536 and ar.parse_size("4MiB") == 4 << 20 and ar.parse_size(1024) == 1024
    assert ar.parse_size(" 1G ") == 1 << 30
    assert [ar.format_size(n) for n in (512, 65536, 4 << 20, 1 << 30, 1500)] == ["512B", "64K", "4M", "1G",
                                                                                "1500B"]
    for s in ar.DEFAULT_SIZES:
        assert ar.parse_size(ar.format_size(s)) == s
    for bad, exc in (("12Q", ValueError), ("", ValueError), (0, ValueError), (True, TypeError), (1.5, TypeError)):
        with pytest.raises(exc):
            ar.parse_size(bad)


# ------------------------------------------------------------------ notebook 09's exercises

def test_nb08_exercises_grade_the_idea():
    from labkit.check import evaluate

    assert evaluate("09.global-batch", 2048).status == "correct"
    assert "every rank" in evaluate("09.global-batch", 16 * 8 * 4).message
    assert evaluate("09.global-batch", 2047).status == "wrong"
    assert evaluate("09.lr-scaling", 3e-4 * 8).status == "correct"
    assert evaluate("09.lr-scaling", 3e-4).status == "wrong"
    assert evaluate("09.busbw", lambda a, n: a * 2 * (n - 1) / n).status == "correct"
    assert evaluate("09.busbw", lambda a, n: a * 2).status == "wrong"
    assert evaluate("09.busbw", lambda a, n: a * 2 * (n - 1) / n if n > 1 else 1 / 0).status == "wrong"
    assert evaluate("09.busbw", 210.0).status == "wrong"
    assert evaluate("09.slow-rank", 180).status == "correct"
    assert "slowest" in evaluate("09.slow-rank", 140).message
    for ex in ("09.global-batch", "09.lr-scaling", "09.busbw", "09.slow-rank"):
        assert evaluate(ex, ...).status == "not attempted"


def test_set_current_device_is_a_no_op_on_cpu():
    from labkit import device as dev_gate

    assert dev_gate.set_current_device("cpu") is None
    with pytest.raises((TypeError, ValueError)):
        dev_gate.set_current_device(3.5)


def test_failure_without_traceback_shows_the_launch_output(tmp_path):
    script = _write(tmp_path, "quiet.py", """
import os, sys
print("rank says goodbye", flush=True)
os._exit(1 if os.environ["RANK"] == "0" else 0)
""")
    with pytest.raises(LaunchError) as info:
        launch(script, nproc=2, timeout=60, stream=False)
    assert "no Python traceback" in str(info.value) and "rank says goodbye" in str(info.value)


# ------------------------------------------------------------------ ranks killed by a signal, shm buffers

KILL_SCRIPT = """
import os, signal, time
""" + MAKE_SHM + """
make_shm_buffer()
time.sleep(1.0)
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(300)
"""


def test_rank_killed_by_sigkill_is_named_and_its_shm_buffers_removed(tmp_path, watch_processes, monkeypatch):
    port = dist.find_free_port()
    monkeypatch.setattr(dist, "find_free_port", lambda host="127.0.0.1": port)  # so decoys can share the port
    uid = os.getuid()
    stale = f"/dev/shm/deepspeed_allreduce_buffer_{uid}_127.0.0.1_{port}_0.decoy"  # not DeepSpeed's name
    old = f"/dev/shm/deepspeed_allreduce_buffer_{uid}_127.0.0.1_{port}_2"  # rank 2: not one of this launch's
    other = f"/dev/shm/deepspeed_allreduce_buffer_{uid}_127.0.0.1_1_0"  # another job's port
    decoys = [stale, old, other]
    before = set(glob.glob(SHM_GLOB))
    lines: list[str] = []
    try:
        for d in decoys:
            open(d, "w").close()
        with watch_processes() as w, pytest.raises(LaunchError) as info:
            launch(_write(tmp_path, "kill.py", KILL_SCRIPT), nproc=2, timeout=60, stream=lines.append)
        err = info.value
        assert str(err).splitlines()[0].startswith("rank 1 killed by SIGKILL")
        assert "out-of-memory" in str(err).splitlines()[0]
        assert err.rank == 1 and err.signal_name == "SIGKILL" and err.returncode not in (0, None)
        assert w.seen and w.leftovers() == [] and err.leftover == []
        made = SHM_MADE_RE.findall("\n".join(lines))
        assert len(made) == 2 and all(f"_127.0.0.1_{port}_" in m for m in made), lines
        assert [m for m in made if os.path.exists(m)] == []
        assert all(os.path.exists(d) for d in decoys)  # only this launch's own buffers are removed
        assert set(glob.glob(SHM_GLOB)) - set(decoys) <= before
    finally:
        for d in decoys:
            if os.path.exists(d):
                os.unlink(d)


def test_only_a_launchs_fresh_buffers_are_its_own(tmp_path):
    port = dist.find_free_port()
    mine = f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_0"
    mine1 = mine[:-1] + "1"
    try:
        for p in (mine, mine1):
            open(p, "w").close()
        os.utime(mine1, (time.time() - 3600, time.time() - 3600))  # left by an earlier job on this port
        start = time.time()
        assert [str(p) for p in dist._launch_shm_buffers("127.0.0.1", port, 2, start)] == [mine]
        assert dist._launch_shm_buffers("127.0.0.1", port, 1, start + 3600) == []  # made before the launch
        assert dist._remove_launch_shm("127.0.0.1", port, 2, start) == [mine]
        assert not os.path.exists(mine) and os.path.exists(mine1)
    finally:
        for p in (mine, mine1):
            if os.path.exists(p):
                os.unlink(p)


def test_the_first_error_file_wins_over_torchruns_whole_second_tie(tmp_path):
    """torchrun orders failures by whole-second timestamps and breaks ties by the lowest rank, so a crash on rank 1
    and the connection error it causes on rank 0 in the same second blame rank 0. The files' mtimes decide."""
    import os

    for rank, mtime in ((0, 1_000.7), (1, 1_000.2)):  # rank 1 wrote its error first, in the same second
        f = tmp_path / "run" / "attempt_0" / str(rank) / "error.json"
        f.parent.mkdir(parents=True)
        f.write_text("{}")
        os.utime(f, (mtime, mtime))
    log = "Root Cause (first observed failure):\n[0]:\n  time      : x\n  host      : h\n  rank      : 0\n  exitcode  : 1"
    assert dist._failing_rank(log, tmp_path, 2) == 1
    assert dist._failing_rank(log, tmp_path / "nothing", 2) == 0  # no error files: torchrun's choice


def test_a_rank_that_raised_then_aborted_is_still_the_one_that_failed(tmp_path):
    """torchrun reports a signal when a rank aborts in C++ teardown after its exception; its error file says more."""
    import os

    for rank, mtime in ((0, 2_000.9), (1, 2_000.1)):
        f = tmp_path / "run" / "attempt_0" / str(rank) / "error.json"
        f.parent.mkdir(parents=True)
        f.write_text("{}")
        os.utime(f, (mtime, mtime))
    log = "Root Cause (first observed failure):\n[0]:\n  time      : x\n  host      : h\n  rank      : 0\n  exitcode  : -6"
    assert dist._failing_rank(log, tmp_path, 2) == 1
    (tmp_path / "run" / "attempt_0" / "0" / "error.json").unlink()  # killed before writing one: torchrun decides
    assert dist._failing_rank(log, tmp_path, 2) == 0


# ------------------------------------------------------------------ a notebook kernel that dies mid-launch

# What a notebook does: launch() from its main thread, streaming the ranks' lines.
LAUNCHING_PARENT = """
import sys
from labkit.dist import launch

launch(sys.argv[1], nproc=2, timeout=600, stream=lambda line: print(line, flush=True))
"""


_running = _alive  # the processes of a list still running (a zombie nobody reaps counts as gone)


def _read_until(proc: subprocess.Popen, done, timeout: float) -> list[str]:
    """Lines of ``proc``'s stdout until ``done(lines)`` holds (or the timeout: then the lines so far)."""
    import queue
    import threading

    q: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [q.put(ln) for ln in proc.stdout] + [q.put(None)], daemon=True).start()
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while not done(lines) and time.monotonic() < deadline:
        try:
            line = q.get(timeout=0.2)
        except queue.Empty:
            continue
        if line is None:
            break
        lines.append(line.rstrip("\n"))
    return lines


def start_parent_and_kill_it(code: str, argv: list[str], ready, sig: int, tmp_path, wait: float = 45.0):
    """Run ``code`` in a parent Python process, kill it with ``sig`` once ``ready(lines)``; follow its descendants
    for up to ``wait`` seconds (cleaned up afterwards). Returns ``(gone, family, lines)``: for each descendant's pid,
    the seconds after the parent's death at which it was seen gone (None: still running at the end)."""
    parent_py = tmp_path / "parent.py"
    parent_py.write_text(textwrap.dedent(code))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])))
    parent = subprocess.Popen([sys.executable, str(parent_py), *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env, cwd=str(tmp_path))
    family: list[psutil.Process] = []
    try:
        lines = _read_until(parent, ready, 120.0)
        assert ready(lines), "the parent's children never got going:\n" + "\n".join(lines[-20:])
        family = psutil.Process(parent.pid).children(recursive=True)
        parent.send_signal(sig)
        parent.wait(timeout=30)
        died = time.monotonic()
        gone: dict[int, float | None] = {p.pid: None for p in family}
        while time.monotonic() < died + wait:
            running = _running(family)
            for p in family:
                if gone[p.pid] is None and p not in running:
                    gone[p.pid] = time.monotonic() - died
            if not running:
                break
            time.sleep(0.1)
        return gone, family, lines
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for p in _running(family):  # only what this test started (psutil handles: no pid reuse)
            try:
                p.kill()
            except psutil.Error:
                pass


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_dead_notebook_takes_torchrun_and_its_ranks_with_it(tmp_path, sig):
    """The kernel killed (SIGKILL, or SIGTERM without a handler) mid-launch: the ranks die at once, not at the
    process-group timeout (which a learner may set to 1e9), and torchrun within its own shutdown limit (it stops
    its ranks, waiting up to 30 s for them; on a loaded machine its exit can take longer than theirs)."""
    script = _write(tmp_path, "sleep.py", SLEEP_FOREVER_SCRIPT)

    def ranks_run(lines: list[str]) -> bool:
        return all(any(f"rank {r} pid" in ln for ln in lines) for r in (0, 1))

    gone, family, lines = start_parent_and_kill_it(LAUNCHING_PARENT, [script], ranks_run, sig, tmp_path)
    rank_pids = {int(m) for m in re.findall(r"rank \d pid (\d+)", "\n".join(lines))}
    assert rank_pids <= {p.pid for p in family} and len(family) >= 3, (family, lines)  # torchrun and 2 ranks
    print("seconds from the parent's death to each descendant's:", gone)
    late_ranks = {pid: gone[pid] for pid in rank_pids if gone[pid] is None or gone[pid] > 10}
    assert not late_ranks, f"ranks still running more than 10 s after the parent died: {late_ranks}"
    left = {pid: t for pid, t in gone.items() if t is None}
    assert not left, f"still running 45 s after the parent died: {left}"


# ------------------------------------------------------------------ the same for slurm/deepspeed.sbatch (plain torchrun)

def _sbatch_function(script: Path, name: str) -> str:
    """The text of shell function ``name`` in ``script`` (from ``name() {`` to the ``}`` that closes it)."""
    m = re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", script.read_text(), re.MULTILINE | re.DOTALL)
    assert m, f"{script.name} defines no {name}()"
    return m.group(0)


def test_deepspeed_sbatch_removes_its_own_shm_buffers_and_nothing_else(tmp_path):
    """deepspeed.sbatch's exit trap, run on a folder standing in for /dev/shm: it removes the buffers of this job's
    ranks (DeepSpeed's name for this user, address and port, a rank below nproc, made since the step started) and
    keeps every other job's, as labkit.dist.launch does."""
    sbatch = ROOT / "slurm" / "deepspeed.sbatch"
    text = sbatch.read_text()
    func = _sbatch_function(sbatch, "labkit_remove_job_shm")
    # the trap that calls it on every way out, and the rendezvous that makes the ranks' MASTER_ADDR/PORT ours
    assert re.search(r"""trap 'labkit_remove_job_shm /dev/shm "\$\{MASTER_ADDR\}" "\$\{MASTER_PORT\}" "\$\{nproc\}" """
                     r""""\$\{step_started\}"' EXIT""", text)
    assert "--rdzv_backend=static --node_rank=0" in text

    shm = tmp_path / "shm"
    shm.mkdir()
    uid, addr, port, since = os.getuid(), "node1", 30123, int(time.time())
    name = "deepspeed_allreduce_buffer_{}_{}_{}_{}".format
    mine = [shm / name(uid, addr, port, r) for r in (0, 1)]
    others = [shm / name(uid, addr, port, 2),  # a rank this job does not have
              shm / name(uid, addr, port + 1, 0),  # another job's port
              shm / name(uid, "node2", port, 0),  # another address
              shm / name(uid + 1, addr, port, 0),  # another user's name
              shm / (name(uid, addr, port, 0) + ".decoy"),
              shm / "unrelated"]
    for p in mine + others:
        p.write_bytes(b"\0" * 4096)
    stale = shm / name(uid, addr, port + 2, 0)  # an earlier job's, on the port this second job uses
    stale.write_bytes(b"\0")
    os.utime(stale, (since - 3600, since - 3600))
    fresh = shm / name(uid, addr, port + 2, 1)
    fresh.write_bytes(b"\0")
    target = tmp_path / "precious"
    target.write_bytes(b"keep")
    link = shm / name(uid, addr, port + 3, 0)  # a link, even with the right name, is not a buffer
    link.symlink_to(target)

    script = ("labkit_log() { printf '%s\\n' \"$*\"; }\n" + func +
              'labkit_remove_job_shm "$1" node1 30123 2 "$2"\n'
              'labkit_remove_job_shm "$1" node1 30125 2 "$2"\n'
              'labkit_remove_job_shm "$1" node1 30126 1 "$2"\n'
              'labkit_remove_job_shm "$1/missing" node1 30123 2 "$2"\n')  # nothing there: no error either
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", script, "sbatch", str(shm), str(since)],
                         capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 0, res.stderr
    assert [p for p in mine + [fresh] if p.exists()] == []
    assert "removed" in res.stdout and str(mine[0]) in res.stdout
    assert all(p.exists() for p in others + [stale]) and link.is_symlink() and target.read_bytes() == b"keep"


# ------------------------------------------------------------------ launches shared between the tests' kernels

SHARED_RANK_MODULE = """
import os
from labkit.dist import emit_result
print("rank", os.environ["RANK"], "pid", os.getpid(), flush=True)
if os.environ["RANK"] == "0":
    emit_result({"pid": os.getpid()})
"""


def test_a_launch_is_shared_only_through_a_private_folder_and_never_one_that_names_files(tmp_path, monkeypatch):
    """With $LABKIT_LAUNCH_SHARE (the tests give it to nbval's and the browser's kernels), the second identical
    launch of a module replays the first one's lines and result without starting anything: the same rank pid comes
    back. Arguments that name files, or a folder that others can write, make every launch run."""
    pkg = tmp_path / "mods"
    pkg.mkdir()
    (pkg / "lk_shared_rank.py").write_text(SHARED_RANK_MODULE)
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(pkg), os.environ.get("PYTHONPATH")])))
    share = tmp_path / "share"
    share.mkdir(mode=0o700)
    monkeypatch.setenv(dist.SHARE_ENV, str(share))

    first: list[str] = []
    second: list[str] = []
    a = launch("lk_shared_rank", nproc=1, stream=first.append, timeout=120)
    b = launch("lk_shared_rank", nproc=1, stream=second.append, timeout=120)
    assert a == b and second == first and any(f"pid {a['pid']}" in line for line in first), (a, b, first)
    assert len(list(share.glob("*.json"))) == 1
    c = launch("lk_shared_rank", nproc=1, stream=False, timeout=120, args=["--out-dir", "runs"])
    assert c["pid"] != a["pid"], "a launch whose arguments name a folder must run"
    share.chmod(0o777)
    d = launch("lk_shared_rank", nproc=1, stream=False, timeout=120)
    assert d["pid"] != a["pid"], "a folder that others can write must not be read"
    share.chmod(0o700)
    monkeypatch.delenv(dist.SHARE_ENV)
    assert dist._shared_launch_file("lk_shared_rank", 1, [], 120, None, None, 1, None) is None


def test_a_command_that_ignores_its_parents_death_signal_is_killed_after_the_grace():
    """torchrun's prefix: if the launcher dies and torchrun does not end on SIGTERM (a shutdown that hangs), the
    reaper kills it after the grace; the reaper dies with it, and a command that ends on time is not waited for."""
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)"
    parent_code = (
        "import signal, subprocess, sys, time\n"
        "from labkit.dist import _die_with_parent_argv\n"
        f"p = subprocess.Popen([*_die_with_parent_argv(signal.SIGTERM, grace=2.0), sys.executable, '-c', {stubborn!r}],"
        " stdout=subprocess.PIPE, text=True)\n"
        "assert p.stdout.readline().strip() == 'up'\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        reaper = child.children()
        assert len(reaper) == 1
        parent.kill()
        parent.wait(timeout=30)
        t0 = time.monotonic()
        gone, alive = psutil.wait_procs([child, *reaper], timeout=30)
        assert not alive, alive
        assert 1.5 < time.monotonic() - t0 < 25   # SIGTERM was ignored: it lived through the grace, not much longer
    finally:
        if parent.poll() is None:
            parent.kill()
