"""labkit.clinic: every case's broken run shows its symptom, its reference fix removes it, its typical wrong fix is
graded wrong; the table is consistent; no process outlives a case, hangs and timeouts included.

The runs are shared: one module fixture makes every case's broken, fixed and wrongly fixed run once (with
``run_cases``: the one-process cases in one Python process, the 2-rank ones through torchrun), inside a process watcher.
The runner remembers them, so the graders below (and ``tests/test_exercises.py`` in the same session) reuse them.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from labkit import clinic
from labkit.clinic import CASES, runner
from labkit.clinic._script import gloo_ranks, merge_config
from labkit.dist import _alive, parse_result
from labkit.exercises import all_exercises

KEYS = list(CASES)
ROOT = Path(__file__).resolve().parents[1]
DETAIL = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}


@pytest.fixture(scope="module")
def runs(watch_processes):
    """{(key, "broken" | "fix" | "wrong" | "detail"): CaseRun}, every run made inside one process watcher."""
    out = {}
    with watch_processes() as w:
        # the runs that must fail, two jobs at a time (a launch that waits for a timeout overlaps with another)
        plan = [(k, label, fix) for k in KEYS for label, fix in (("broken", None), ("wrong", CASES[k].wrong_fix))]
        for (k, label, _), run in zip(plan, clinic.run_cases([(k, fix) for k, _, fix in plan], parallel=2)):
            out[(k, label)] = run
        # the runs that must succeed, one job at a time: their short process-group timeouts get no competition
        for k, run in zip(KEYS, clinic.run_cases([(k, CASES[k].fix) for k in KEYS])):
            out[(k, "fix")] = run
        out[("hang", "detail")] = clinic.run_case("hang", env=DETAIL)
        clinic.shutdown()  # the zygote that forks one-process runs: it lives until asked (or until this process ends)
    out["leftovers"] = w.leftovers()
    return out


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------

def test_the_table_is_complete_and_consistent():
    assert len(CASES) >= 16 and [c.number for c in CASES.values()] == list(range(1, len(CASES) + 1))
    for key, case in CASES.items():
        assert case.key == key and case.nproc in (1, 2) and 0 < case.timeout_s <= 300
        mod = importlib.import_module(case.module)
        assert callable(mod.main) and all(callable(getattr(mod, name)) for name in case.show)
        conf = clinic.settings(key)
        assert conf == mod.CONFIG
        for fix in (case.fix, case.wrong_fix):
            assert len(fix) == 1, key
            (name, value), = fix.items()
            assert name in conf and value != conf[name], key
            merge_config(conf, fix)  # the right types
        assert case.fix != case.wrong_fix
        assert len(case.causes) == 4 and case.answer != case.trap and 0 <= case.trap < 4
        assert all(c.text and c.why for c in case.causes)
        assert case.symptom and case.cause_hint and case.cause_method and case.fix_hint and case.fix_method
        assert case.fix_why and case.wrong_fix_why and case.seed


def test_every_case_has_its_exercises_with_every_field():
    ex = all_exercises()
    for key in KEYS:
        for kind in ("cause", "fix"):
            e = ex[f"13.{key}-{kind}"]
            assert e.hint and e.method and e.solution and e.kind == "debug" and e.wrong_why
    assert ex["13.lr-predict"].kind == "predict" and ex["13.lr-predict"].wrong_why
    assert sorted(i for i in ex if i.startswith("13.")) == sorted(
        [f"13.{k}-{s}" for k in KEYS for s in ("cause", "fix")] + ["13.lr-predict"])


def test_source_shows_whole_functions_and_the_settings():
    text = clinic.source("clip")
    assert "CONFIG = {" in text and "def train(cfg" in text and "scaler.unscale_(opt)" in text
    assert clinic.causes("clip").splitlines()[0].startswith("(a) The clip sees scaled gradients.")


def test_settings_are_checked_before_anything_runs():
    with pytest.raises(ValueError, match="unknown setting 'lrr'"):
        clinic.run_case("clip", {"lrr": 0.1})
    with pytest.raises(TypeError, match="takes a float"):
        clinic.run_case("clip", {"max_norm": "1"})
    with pytest.raises(ValueError, match="takes one of"):
        clinic.run_case("clip", {"after_backward": "scaler.step, clip_grad_norm_"})
    with pytest.raises(ValueError, match="unknown case"):
        clinic.run_case("nope")
    with pytest.raises(ValueError, match="parallel must be 1 or 2"):
        clinic.run_cases(["hang"], parallel=3)
    with pytest.raises(ValueError):
        clinic.run_case("hang", env={"RANK": "3"})
    assert merge_config({"a": 1.0, "b": None}, {"a": 2, "b": "x"}) == {"a": 2.0, "b": "x"}


def test_grade_fix_refuses_what_is_not_one_new_setting():
    assert clinic.grade_fix("clip", ["after_backward"])[0] is False
    assert "exactly one setting" in clinic.grade_fix("clip", {"max_norm": 2.0, "lr": 0.1})[1]
    assert "already had" in clinic.grade_fix("clip", {"max_norm": 1.0})[1]
    assert "unknown setting" in clinic.grade_fix("clip", {"nope": 1})[1]
    assert clinic.grade_cause("clip", "A") == (True, CASES["clip"].causes[0].why)
    assert clinic.grade_cause("clip", "(b)")[0] is False and clinic.grade_cause("clip", "e")[0] is False


# --------------------------------------------------------------------------------------------------
# Every case, for real
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", KEYS)
def test_broken_run_shows_its_symptom(runs, key):
    run = runs[(key, "broken")]
    assert run.symptom, (run.finding, run.error[-2000:], run.log[-2000:])


@pytest.mark.parametrize("key", KEYS)
def test_reference_fix_removes_the_symptom(runs, key):
    run = runs[(key, "fix")]
    assert not run.symptom, (run.finding, run.error[-2000:], run.log[-2000:])
    ok, message = clinic.grade_fix(key, CASES[key].fix)  # the same run, remembered
    assert ok and CASES[key].fix_why in message


@pytest.mark.parametrize("key", KEYS)
def test_typical_wrong_fix_is_graded_wrong(runs, key):
    assert runs[(key, "wrong")].symptom
    ok, message = clinic.grade_fix(key, CASES[key].wrong_fix)
    assert not ok and CASES[key].wrong_fix_why in message


def test_the_evidence_says_what_the_notebook_teaches(runs):
    """The facts notebook 13 asserts, independent of this machine's speed or CPU."""
    r = runs[("clip", "broken")].result
    assert min(r["clip_saw"]) > 1000 and r["loss"][-1] > 0.9 * r["loss"][0]
    assert all(z == 1.0 for z in runs[("noscale", "broken")].result["zero_grads"])
    r = runs[("softmax", "broken")].result
    assert r["first_nonfinite"] == "blocks.0.attn.proj" and r["scores_absmax"][0] > 11.09
    r = runs[("scaler-ckpt", "broken")].result
    at = r["config"]["resume_at"]
    assert r["resumed"]["scale"][at] == 65536 > r["reference"]["scale"][at]
    assert runs[("scaler-ckpt", "fix")].result["resumed"] == runs[("scaler-ckpt", "fix")].result["reference"]
    g = runs[("graph", "broken")].result["graph_mb"]
    assert all(b > a for a, b in zip(g, g[1:])) and runs[("graph", "fix")].result["graph_mb"] == [0.0] * len(g)
    assert "DataLoader" in runs[("loader", "broken")].result["table"].splitlines()[3]
    assert runs[("loader", "broken")].result["step_s"] > runs[("loader", "fix")].result["step_s"]
    a, b = runs[("repro", "broken")].result["runs"]
    assert a["init_digest"] == b["init_digest"] and a["order"] != b["order"] and a["final_digest"] != b["final_digest"]
    assert "32 != 8 * 4 * 2" in runs[("ds-batch", "broken")].error
    assert "connect" in runs[("rdzv", "broken")].error
    assert clinic.lr_ratio(runs[("lr", "broken")]) > 1.3 > clinic.lr_ratio(runs[("lr", "fix")])


def test_the_hang_times_out_and_detail_names_the_collectives(runs):
    run, detail = runs[("hang", "broken")], runs[("hang", "detail")]
    assert "Timed out" in run.log and not run.timed_out  # the process-group timeout caught it, not the runner
    assert "mismatch between collectives" in detail.error
    own = {re.search(r"Rank (\d) is running collective: [^)]*?OpType=(\w+)", ln).groups()
           for ln in detail.lines("Detected mismatch between collectives")}
    assert own == {("0", "BARRIER"), ("1", "ALLREDUCE")}, own  # each rank names its own collective


def test_no_case_leaves_a_process_behind(runs):
    assert runs["leftovers"] == []


def test_a_hang_stopped_by_the_runner_leaves_nothing(watch_processes):
    with watch_processes() as w:
        run = clinic.run_case("hang", {"pg_timeout_s": 120.0}, timeout=8, fresh=True)
    assert run.timed_out and run.result is None and run.symptom
    assert "still wait" in run.finding.summary
    assert w.leftovers() == []


def test_a_one_process_case_stopped_by_the_runner_takes_its_workers_with_it(watch_processes):
    with watch_processes() as w:  # a run far too long for its timeout, stopped while its 4 DataLoader workers read
        run = clinic.run_case("loader", {"num_workers": 4, "steps": 100_000}, timeout=6, fresh=True)
        after = clinic.run_case("clip", fresh=True)  # the zygote outlived the killed run and still works
        clinic.shutdown()
    assert run.timed_out and run.result is None and run.symptom and after.symptom
    assert len(w.seen) >= 5, "the workers never started: the test did not test what it says"
    assert w.leftovers() == []


def test_a_case_runs_the_same_way_as_a_plain_process_as_forked_and_batched(runs, watch_processes):
    """Where there is no fork (not Linux), the runner starts ``python -m <case>``: the same evidence, no leftovers."""
    rc, log, timed_out = runner._run_single(CASES["softmax"].module, ["--config", "{}"], {}, 60.0, None)
    alone = parse_result(log)
    batched = runs[("softmax", "broken")].result
    assert rc == 0 and not timed_out and alone["first_nonfinite"] == batched["first_nonfinite"]
    assert alone["scale"] == batched["scale"] == clinic.run_case("softmax", fresh=True).result["scale"]
    cfg = json.dumps({"num_workers": 4, "steps": 100_000})
    for timeout in (8.0, 16.0, 32.0):  # a loaded machine may need longer to import torch and start the workers
        with watch_processes() as w:  # a plain process stopped at its timeout takes its DataLoader workers with it
            rc, _, timed_out = runner._run_single(CASES["loader"].module, ["--config", cfg], {}, timeout, None)
        assert rc is None and timed_out and w.leftovers() == []
        if len(w.seen) >= 5:
            break
    assert len(w.seen) >= 5, f"the DataLoader workers never started within {timeout:g} s: the kill was not tested"


def test_the_rendezvous_case_uses_a_port_nobody_listens_on(runs):
    port = runs[("rdzv", "broken")].config["master_port"]
    assert port.isdigit() and f"127.0.0.1:{port}" in runs[("rdzv", "broken")].log
    assert json.loads(json.dumps(clinic.settings("rdzv")))["master_port"] == "stale"


def test_reading_a_cases_settings_imports_neither_torch_nor_deepspeed():
    """The notebook and the graders read every case's CONFIG: that must stay cheap (no torch, no DeepSpeed)."""
    code = ("import sys\nfrom labkit import clinic\nfor k in clinic.CASES: clinic.settings(k); clinic.source(k)\n"
            "print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_shutdown_stops_the_zygote_and_a_later_run_starts_it_again(watch_processes):
    with watch_processes() as w:
        clinic.shutdown()
        assert clinic.run_case("noscale", fresh=True).symptom
        zygotes = [p for p in w.seen if "labkit.clinic._zygote" in " ".join(_cmdline(p[0]))]
        clinic.shutdown()
    assert zygotes and w.leftovers() == []


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


# --------------------------------------------------------------------------------------------------
# Ctrl-C, a dead notebook, temporary folders (none of these uses the module fixture: each makes its own short runs)
# --------------------------------------------------------------------------------------------------

LONG_LOADER = {"num_workers": 2, "steps": 100_000}  # far longer than any test waits: it is stopped on purpose


_running = _alive  # the processes of a list still running (a zombie nobody reaps counts as gone)


def _gone_within(procs: list[psutil.Process], seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while _running(procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [f"{p.pid} {' '.join(_cmdline(p.pid))[:100]}" for p in _running(procs)]


def _own_tempdir(monkeypatch, tmp_path: Path) -> Path:
    """Give this process, and every process it starts, an empty temporary folder; start the zygote afresh in it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    clinic.shutdown()  # a zygote started earlier would hand its runs its own TMPDIR
    return tmp


def _left_in(tmp: Path) -> list[str]:
    """What the runs left in ``tmp``: all but the inductor's cache (torchinductor_<user>), which the zygote's
    ``import torch`` makes once and every torch process of the user shares."""
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))


def _press_ctrl_c_when(ready, record: list[psutil.Process], stop: threading.Event) -> threading.Thread:
    """A thread that sends SIGINT to this process (what Ctrl-C in a notebook does) once ``ready()`` returns the
    processes of the run, which it records; ``thread.pressed_at`` is when (monotonic). It never fires after ``stop``
    is set."""
    def press() -> None:
        while not stop.wait(0.05):
            procs = ready()
            if procs:
                record.extend(procs)
                thread.pressed_at = time.monotonic()
                os.kill(os.getpid(), signal.SIGINT)
                return

    thread = threading.Thread(target=press, daemon=True)
    thread.start()
    return thread


_SEEN: list[str] = []  # what the last look at this process's descendants found (for a failure's message)


def _zygote_run_with_workers() -> list[psutil.Process]:
    """The loader run and its 2 DataLoader workers, once all three exist: forked from the zygote, or, where the
    zygote could not start, a process of its own (the runner's fallback); either way a descendant of this process
    that is not torchrun and has 2 or more children."""
    try:
        family = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    z = runner._ZYGOTE
    _SEEN[:] = [f"zygote {'none' if z is None else z.proc.pid}"] + [
        f"{q.pid}<{_ppid(q)} {' '.join(_cmdline(q.pid))[:80]}" for q in family]
    for q in family:
        if "torch.distributed.run" in " ".join(_cmdline(q.pid)):
            continue
        try:
            kids = q.children(recursive=True)
        except psutil.Error:
            continue
        if z is not None and q.pid == z.proc.pid:  # the zygote: its run is one of its children
            continue
        if len(kids) >= 2:
            return [q, *kids]
    return []


def _ppid(q: psutil.Process) -> int | str:
    try:
        return q.ppid()
    except psutil.Error:
        return "?"


def _interrupted(fn) -> bool:
    """Whether ``fn()`` raised KeyboardInterrupt (anything else propagates)."""
    try:
        fn()
    except KeyboardInterrupt:
        return True
    return False


def test_ctrl_c_during_a_one_process_case_stops_it_and_the_clinic_still_works(watch_processes, monkeypatch,
                                                                              tmp_path):
    tmp = _own_tempdir(monkeypatch, tmp_path)
    run_procs: list[psutil.Process] = []
    stop = threading.Event()
    try:
        with watch_processes() as w:
            _press_ctrl_c_when(_zygote_run_with_workers, run_procs, stop)
            interrupted = _interrupted(lambda: clinic.run_case("loader", LONG_LOADER, timeout=120, fresh=True))
            stop.set()
            assert interrupted and len(run_procs) >= 3, f"the run and its workers were never seen: {_SEEN}"
            assert _gone_within(run_procs, 5.0) == [], "the interrupted run goes on"
            key = ("loader", json.dumps(merge_config(clinic.settings("loader"), LONG_LOADER), sort_keys=True), ())
            assert key not in runner._CACHE  # nothing remembered of the interrupted run
            after = clinic.run_case("clip", fresh=True)  # the same zygote serves the next run, with its own answers
            clinic.shutdown()
        assert after.returncode == 0 and after.result is not None and after.symptom, after.log[-2000:]
        assert w.leftovers() == []
        assert _left_in(tmp) == []
    finally:
        stop.set()
        for p in _running(run_procs):
            p.kill()
        clinic.shutdown()


def test_ctrl_c_during_run_cases_stops_every_job_in_every_thread(watch_processes, monkeypatch, tmp_path):
    """Notebook 13 starts with ``run_cases(..., parallel=2)``: the interrupt reaches the main thread only, while the
    one-process batch and a torchrun launch run in worker threads. Both stop at once; neither is remembered."""
    tmp = _own_tempdir(monkeypatch, tmp_path)
    hang = {"pg_timeout_s": 300.0}
    # the loader run must outlast the torchrun ranks' start, however loaded the machine (its own limit is 60 s)
    monkeypatch.setitem(runner.CASES, "loader", dataclasses.replace(runner.CASES["loader"], timeout_s=300))
    run_procs: list[psutil.Process] = []
    stop = threading.Event()

    def both_jobs_run() -> list[psutil.Process]:
        zygote_run = _zygote_run_with_workers()
        torchrun = [p for p in psutil.Process().children(recursive=True)
                    if "torch.distributed.run" in " ".join(_cmdline(p.pid))]
        try:
            ranks = torchrun[0].children(recursive=True) if torchrun else []
        except psutil.Error:
            ranks = []
        return zygote_run + torchrun + ranks if zygote_run and len(ranks) >= 2 else []

    try:
        with watch_processes() as w:
            presser = _press_ctrl_c_when(both_jobs_run, run_procs, stop)
            interrupted = _interrupted(lambda: clinic.run_cases([("loader", LONG_LOADER), ("hang", hang)], parallel=2))
            stop.set()
            assert interrupted and len(run_procs) >= 6, f"the jobs were never seen running together: {_SEEN}"
            waited = time.monotonic() - presser.pressed_at
            assert waited < 20, f"run_cases raised {waited:.0f} s after Ctrl-C: it let its jobs run on"
            assert _gone_within(run_procs, 5.0) == []
            for key, fix in (("loader", LONG_LOADER), ("hang", hang)):
                cfg = json.dumps(merge_config(clinic.settings(key), fix), sort_keys=True)
                assert not [k for k in runner._CACHE if k[:2] == (key, cfg)], key
            clinic.shutdown()
        assert w.leftovers() == []
        assert _left_in(tmp) == []
    finally:
        stop.set()
        for p in _running(run_procs):
            p.kill()
        clinic.shutdown()


def test_runs_stopped_at_their_timeout_leave_no_temporary_folder(watch_processes, monkeypatch, tmp_path):
    """A run's processes killed at its timeout cannot remove their own temporary folders (a case's checkpoint folder,
    multiprocessing's pymp-* of DataLoader workers): the runner removes the run's TMPDIR, and only that."""
    tmp = _own_tempdir(monkeypatch, tmp_path)
    other = tmp / "someone-elses"  # made by another program: stays
    other.mkdir()
    with watch_processes() as w:
        one = clinic.run_case("loader", LONG_LOADER, timeout=8, fresh=True)
        two = clinic.run_case("hang", {"pg_timeout_s": 120.0}, timeout=8, fresh=True)  # each rank made a folder
        clinic.shutdown()
    assert one.timed_out and two.timed_out
    assert w.leftovers() == []
    assert _left_in(tmp) == ["someone-elses"]


# A notebook that runs a one-process case, as the runner does on Linux (zygote) or elsewhere (a plain process).
RUNNING_PARENT = """
import json, sys
from labkit.clinic import CASES, runner

run = runner._run_single if sys.argv[1] == "plain" else runner._run_process
run(CASES["loader"].module, ["--config", json.dumps(json.loads(sys.argv[2]))], {}, 600.0, None)
"""


@pytest.mark.parametrize("route, count", [("plain", 3), ("zygote", 4)])
def test_a_dead_notebook_takes_its_one_process_run_with_it(tmp_path, route, count):
    """The kernel SIGKILLed mid-run: the run's process and its DataLoader workers (and the zygote) end too."""
    script = tmp_path / "parent.py"
    script.write_text(RUNNING_PARENT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])))
    parent = subprocess.Popen([sys.executable, str(script), route, json.dumps(LONG_LOADER)], env=env,
                              cwd=str(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    family: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while len(family) < count and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.1)
            family = _running(psutil.Process(parent.pid).children(recursive=True))
        assert len(family) >= count, f"the run and its workers never started ({family})"
        parent.kill()
        parent.wait()
        # the workers notice within 5 s that their parent is gone (DataLoader's watchdog); the rest at once
        assert _gone_within(family, 15.0) == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for p in _running(family):
            p.kill()


def test_runs_are_shared_between_processes_only_through_a_private_folder(tmp_path):
    """With LABKIT_CLINIC_SHARE naming a private folder, a second process gets the first one's run (the same
    measured seconds) instead of running again; another timeout is another run; a folder others can write is ignored."""
    share = tmp_path / "share"
    share.mkdir(mode=0o700)
    code = ("import json, sys\nfrom labkit import clinic\n"
            "r = clinic.run_case('noscale', timeout=float(sys.argv[1]))\n"
            "print(json.dumps([r.seconds, r.symptom])); clinic.shutdown()")

    def run(timeout: float, folder: Path) -> list:
        env = {**os.environ, "LABKIT_CLINIC_SHARE": str(folder)}
        out = subprocess.run([sys.executable, "-c", code, str(timeout)], env=env, capture_output=True, text=True,
                             timeout=300, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    first = run(60.0, share)
    assert first[1] and len(list(share.glob("*.json"))) == 1
    assert run(60.0, share) == first, "the second process read the first one's run"
    assert run(59.0, share)[0] != first[0] and len(list(share.glob("*.json"))) == 2, "another timeout, another run"
    share.chmod(0o777)
    try:
        assert run(60.0, share)[0] != first[0], "a folder others could write is not read"
    finally:
        share.chmod(0o700)


# Fixes that are not fixes: each case's tests hold at least three, and every one must be refused with a reason.
# The first group is refused before anything runs (it changes the job itself); the second is run and judged.
NON_FIXES = {
    "clip": [{"lr": 500.0}, {"steps": 0}, {"max_norm": 1e9},
             {"after_backward": "clip_grad_norm_, scaler.unscale_, scaler.step"}],
    "noscale": [{"steps": 1}, {"lr": 50.0}, {"precision": "fp32"}],
    "softmax": [{"steps": 0}, {"lr": 0.0}, {"init_scale": 1.0}],
    "scaler-ckpt": [{"resume_at": 0}, {"steps": 15}, {"checkpoint_keys": "model, optimizer, step, rng"}],
    "graph": [{"val_batch": 1}, {"steps": 1}, {"gc_every_step": True}],
    "loader": [{"batch_size": 1}, {"steps": 4}, {"pin_memory": True}],
    "repro": [{"lr": 0.0}, {"seed": 1}, {"deterministic": True}, {"shard_list": "tuple(set(shards))"}],
    "rdzv": [{"master_addr": "localhost"}, {"pg_timeout_s": 1.0}, {"tutorial_sets": "MASTER_PORT"}],
    "hang": [{"ckpt_every": 100}, {"steps": 2}, {"pg_timeout_s": 10.0}, {"barrier_ranks": "1"}],
    "ds-batch": [{"steps": 0}, {"train_batch_size": 48}, {"train_micro_batch_size_per_gpu": 16},
                 {"gradient_accumulation_steps": 8}],
    "lr": [{"lr": 10.0}, {"lr": 1000.0}, {"examples": 1920}],
    "uneven": [{"examples": 256}, {"batch": 36}, {"drop_last": True}, {"loop": "for xb, yb in shard[:4]"}],
    "unused": [{"steps": 1}, {"lr": 0.0}, {"pg_timeout_s": 60.0}],
    "tp-grad": [{"steps": 1}, {"lr": 0.0}, {"average_replicated_grads": True},
                {"f_backward": "all_reduce, then / world_size"}],
    "ifname": [{"NCCL_SOCKET_IFNAME": "lo"}, {"GLOO_SOCKET_IFNAME": "eth9"}, {"pg_timeout_s": 30.0}],
    "zero3-save": [{"steps": 6}, {"lr": 0.0}, {"steps": 0}],
}


def test_every_case_has_three_non_fixes_and_they_are_refused_with_a_reason(runs, watch_processes):
    assert set(NON_FIXES) == set(CASES) and all(len(v) >= 3 for v in NON_FIXES.values())
    to_run = [(k, f) for k, fixes in NON_FIXES.items() for f in fixes
              if next(iter(f)) not in CASES[k].job and f != CASES[k].wrong_fix]
    with watch_processes() as w:
        clinic.run_cases(to_run, parallel=2)   # remembered: grade_fix below reads these runs
        clinic.shutdown()
    assert not w.leftovers()
    for key, fixes in NON_FIXES.items():
        for fix in fixes:
            ok, message = clinic.grade_fix(key, fix)
            assert not ok and len(str(message)) > 30, (key, fix, message)
            if next(iter(fix)) in CASES[key].job:
                assert "part of the job" in str(message)


def test_options_and_headings_do_not_give_the_cause_away():
    letters = [c.letter for c in CASES.values()]
    # no favourite position: every letter is right in at least one case, none in more than a third of them
    assert set(letters) == set("abcd") and max(letters.count(x) for x in "abcd") <= len(CASES) / 3
    longest = sum(len(c.causes[c.answer].text) == max(len(x.text) for x in c.causes) for c in CASES.values())
    assert longest <= len(CASES) / 4, "the right cause is the longest option too often"
    stop = {"the", "a", "an", "of", "in", "to", "is", "its", "and", "with", "that", "from", "every", "each", "it"}
    for c in CASES.values():
        title = {w.strip(".,:()'`").lower() for w in c.title.split()} - stop
        cause = {w.strip(".,:()'`").lower() for w in c.causes[c.answer].text.split()} - stop
        assert not title & cause, (c.key, title & cause)


#: The only settings a fix may flip from False to True (or back): real arguments of a library, named as the library
#: names them. A made-up boolean ("unscale_first", "save_scaler") would name its own fix.
REAL_FLAGS = {"find_unused_parameters": "DistributedDataParallel(find_unused_parameters=...)",
              "scaler_enabled": "torch.amp.GradScaler(enabled=...)"}


def test_no_fix_flips_a_made_up_boolean_and_text_settings_list_their_choices():
    for key, case in CASES.items():
        (name, value), = case.fix.items()
        if isinstance(value, bool):
            assert name in REAL_FLAGS, f"{key}: the fix flips {name!r}, a boolean that names its own fix"
        choices = clinic.choices(key)
        for setting, allowed in choices.items():
            assert clinic.settings(key)[setting] in allowed and len(allowed) >= 2, (key, setting)
        if name in choices:
            assert value in choices[name], key


def test_gloo_ranks_refuses_a_timeout_that_is_not_positive():
    for bad in (0, -1.0, "30", None):
        with pytest.raises(ValueError, match="timeout_s"):
            with gloo_ranks(bad):  # type: ignore[arg-type]
                pass
