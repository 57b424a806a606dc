"""labkit's command lines reject bad values while parsing: exit status 2, one line on stderr, no traceback.

The recipes' parsers are checked in-process (``build_parser().parse_args``, no torchrun); one subprocess per
command line shows what a user sees. Also: ``--torch-adam`` of the ZeRO recipe reaches the DeepSpeed config.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import _cli
from labkit.recipes import allreduce as rar
from labkit.recipes import ddp as rddp
from labkit.recipes import zero as rzero


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    """The parsers check flags against the launch's world size: make it a plain single process."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "LABKIT_DEVICE"):
        monkeypatch.delenv(var, raising=False)


def _rejects(parser, argv, capsys, *, match: str) -> str:
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    assert exc.value.code == 2, argv
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert match in err, err
    return err


# --------------------------------------------------------------------------------------------------
# the shared type= functions
# --------------------------------------------------------------------------------------------------


def test_type_functions_take_good_values_and_say_what_was_expected():
    count = _cli.int_in(1)
    assert count("3") == 3 and count(" 7 ") == 7
    for bad in ("0", "-1", "1.5", "x", "", "inf", "1" * 5000):
        with pytest.raises(_cli.BadValue, match="whole number >= 1"):
            count(bad)
    assert _cli.int_in(0, 64)("64") == 64
    with pytest.raises(ValueError, match="<= 64"):  # BadValue is a ValueError too
        _cli.int_in(0, 64)("65")
    positive = _cli.float_in(0.0, low_open=True)
    assert positive("3e-3") == 3e-3
    for bad in ("0", "-1", "inf", "-inf", "nan", "1e400", "x"):
        with pytest.raises(_cli.BadValue, match="finite number > 0"):
            positive(bad)
    assert _cli.pg_timeout("60") == 60.0
    for bad in ("inf", "1e20", str(_cli.PG_TIMEOUT_MAX_S * 2), "0"):
        with pytest.raises(_cli.BadValue, match="<= 604800"):
            _cli.pg_timeout(bad)
    assert _cli.int_list(1, 8)("1,2, 8") == "1,2, 8"
    for bad in ("", ",", "1,9", "1,x"):
        with pytest.raises(_cli.BadValue):
            _cli.int_list(1, 8)(bad)
    assert _cli.choices_list(["a", "b"])("b,a") == "b,a"
    with pytest.raises(_cli.BadValue, match="from a, b"):
        _cli.choices_list(["a", "b"])("a,c")
    assert _cli.device("cpu") == "cpu"
    for bad in ("xyz", "gpu0"):
        with pytest.raises(_cli.BadValue, match="expected cpu, cuda"):
            _cli.device(bad)


# --------------------------------------------------------------------------------------------------
# labkit.recipes.ddp: parse only
# --------------------------------------------------------------------------------------------------

DDP_BAD = [
    (["--pg-timeout", "inf"], "--pg-timeout"), (["--pg-timeout", "1e20"], "--pg-timeout"),
    (["--pg-timeout", "0"], "--pg-timeout"), (["--lr", "inf"], "--lr"), (["--lr", "nan"], "--lr"),
    (["--lr", "0"], "--lr"), (["--slow-ms", "-5"], "--slow-ms"), (["--slow-ms", "nan"], "--slow-ms"),
    (["--threads", "0"], "--threads"), (["--steps", "0"], "--steps"), (["--batch", "-1"], "--batch"),
    (["--accum", "0"], "--accum"), (["--seed", "-1"], "--seed"), (["--seed", str(2**32)], "--seed"),
    (["--depth", "-1"], "--depth"), (["--hidden", "0"], "--hidden"), (["--data-size", "0"], "--data-size"),
    (["--ckpt-every", "-2"], "--ckpt-every"), (["--log-every", "-1"], "--log-every"),
    (["--crash-rank", "-1", "--crash-step", "0"], "--crash-rank"), (["--device", "xyz"], "--device"),
    (["--precision", "fp8"], "--precision"),
    # flags that contradict each other or the world size (1 here)
    (["--crash-rank", "1"], "go together"), (["--crash-step", "1"], "go together"),
    (["--crash-rank", "1", "--crash-step", "1"], "--crash-rank must be in [0, 1)"),
    (["--crash-rank", "0", "--crash-step", "20"], "--crash-step must be in [0, --steps 20)"),
    (["--slow-ms", "5"], "--slow-rank and --slow-ms"), (["--slow-rank", "0"], "--slow-rank and --slow-ms"),
    (["--slow-rank", "3", "--slow-ms", "5"], "--slow-rank must be in [0, 1)"),
    (["--resume"], "--ckpt-dir"), (["--ckpt-every", "2"], "--ckpt-dir"),
    (["--data-size", "16", "--batch", "32"], "fewer than --batch"),
    # sizes with an upper bound (issue 22, low items): refused while parsing, saying the range
    (["--hidden", str(10**8)], "<= 65536, got 100000000"), (["--data-size", str(10**10)], "<= 16777216"),
    (["--depth", "10001"], "<= 10000"), (["--steps", str(10**8)], "<= 10000000"),
    (["--batch", str(2**30)], "<= 16777216"), (["--accum", str(10**6)], "<= 65536"),
    (["--threads", "100000"], "<= 1024"), (["--hidden", "1" * 5000], "whole number >= 1 and <= 65536"),
    (["--hidden", "65536", "--depth", "2"], "4,000,000,000 train on one 80 GB GPU"),
]


@pytest.mark.parametrize(("argv", "match"), DDP_BAD, ids=[" ".join(a) for a, _ in DDP_BAD])
def test_ddp_parser_rejects(argv, match, capsys):
    err = _rejects(rddp.build_parser(), argv, capsys, match=match)
    assert err.startswith("python -m labkit.recipes.ddp: error:")


def test_ddp_parser_accepts_good_flags_and_checks_the_world_size(monkeypatch, capsys):
    args = rddp.build_parser().parse_args(
        ["--lr", "1e-2", "--pg-timeout", "2", "--slow-rank", "0", "--slow-ms", "6000", "--threads", "2",
         "--crash-rank", "0", "--crash-step", "3", "--ckpt-dir", "x", "--ckpt-every", "2", "--device", "cpu"])
    assert (args.lr, args.pg_timeout, args.slow_ms, args.threads, args.crash_step) == (1e-2, 2.0, 6000.0, 2, 3)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it: rank 1 exists now
    assert rddp.build_parser().parse_args(["--crash-rank", "1", "--crash-step", "0"]).crash_rank == 1
    _rejects(rddp.build_parser(), ["--crash-rank", "2", "--crash-step", "0"], capsys, match="[0, 2)")
    monkeypatch.setenv("WORLD_SIZE", "x")  # inconsistent launcher variables: one line, before anything starts
    _rejects(rddp.build_parser(), ["--crash-rank", "0", "--crash-step", "0"], capsys, match="not an integer")


def test_ddp_sizes_at_their_limits_are_taken():
    args = rddp.build_parser().parse_args(["--hidden", "65536", "--depth", "1", "--data-size", str(2**24),
                                           "--steps", str(10**7), "--accum", "65536", "--threads", "1024"])
    assert (args.hidden, args.data_size, args.steps) == (65536, 2**24, 10**7)
    assert rddp.build_parser().parse_args(["--hidden", "44000", "--depth", "3"]).hidden == 44000  # 3.9 billion
    assert rddp.build_parser().parse_args(["--model", "gpt", "--hidden", "65536", "--depth", "9"]).depth == 9
    text = rddp.build_parser().format_help()
    assert "at most 65,536" in text and "at most 16,777,216" in text and "4,000,000,000 parameters" in text


def test_ddp_validate_still_guards_the_run():
    args = rddp.build_parser().parse_args([])
    args.crash_rank = 1
    with pytest.raises(ValueError, match="go together"):
        rddp._validate(args, world=2)
    args.crash_step = 1
    rddp._validate(args, world=2)
    args.lr = math.inf
    with pytest.raises(ValueError, match="--lr"):
        rddp._validate(args, world=2)


# --------------------------------------------------------------------------------------------------
# labkit.recipes.allreduce and labkit.recipes.zero: parse only
# --------------------------------------------------------------------------------------------------

ALLREDUCE_BAD = [(["--sizes", "4X"], "cannot parse size"), (["--sizes", ","], "--sizes"),
                 (["--sizes", "1K,999G"], "up to 64G"), (["--sizes", "0"], "at least 1 byte"),
                 (["--iters", "0"], "--iters"), (["--warmup", "-1"], "--warmup"), (["--repeats", "0"], "--repeats"),
                 (["--pg-timeout", "inf"], "--pg-timeout"), (["--dtype", "fp8"], "--dtype"),
                 (["--iters", str(10**9)], "<= 10000"), (["--warmup", "10001"], "<= 10000"),
                 (["--repeats", "101"], "<= 100")]


@pytest.mark.parametrize(("argv", "match"), ALLREDUCE_BAD, ids=[" ".join(a) for a, _ in ALLREDUCE_BAD])
def test_allreduce_parser_rejects(argv, match, capsys):
    _rejects(rar.build_parser(), argv, capsys, match=match)


def test_allreduce_parser_keeps_the_sizes_text():
    assert rar.build_parser().parse_args(["--sizes", "4K, 1M"]).sizes == "4K, 1M"
    assert rar.build_parser().parse_args([]).sizes == ",".join(rar.format_size(n) for n in rar.DEFAULT_SIZES)


ZERO_BAD = [(["--runs", "5:bf16"], "bad run"), (["--runs", ""], "no runs"), (["--runs", "0:bf16:cpu"], "offload"),
            (["--steps", "0"], "--steps"), (["--micro-batch", "0"], "--micro-batch"),
            (["--grad-accum", "-1"], "--grad-accum"), (["--lr", "inf"], "--lr"), (["--clip", "-1"], "--clip"),
            (["--clip", "nan"], "--clip"), (["--d-model", "90"], "divisible by n_heads"),
            (["--n-layers", "0"], "--n-layers"), (["--bucket", "1"], "--bucket"),
            (["--initial-scale-power", "65"], "--initial-scale-power"),
            (["--loss-scale-window", "0"], "--loss-scale-window"), (["--hysteresis", "0"], "--hysteresis"),
            (["--seed", "-3"], "--seed"), (["--shm-comm", "maybe"], "--shm-comm"),
            (["--steps", str(10**8)], "<= 10000000"), (["--micro-batch", str(2**17)], "<= 65536"),
            (["--grad-accum", str(2**17)], "<= 65536"), (["--d-model", str(10**6)], "<= 65536"),
            (["--n-layers", str(10**6)], "<= 10000"), (["--bucket", str(2**40)], "<= 2147483648"),
            (["--d-model", "65536", "--n-layers", "10000"], "parameters")]


@pytest.mark.parametrize(("argv", "match"), ZERO_BAD, ids=[" ".join(a) for a, _ in ZERO_BAD])
def test_zero_parser_rejects(argv, match, capsys):
    _rejects(rzero.build_parser(), argv, capsys, match=match)


@pytest.mark.parametrize(("argv", "accelerator", "expect"), [
    ([], "cpu", True),                    # today's behaviour on the CPU accelerator: no C++ compile
    ([], "cuda", False),                  # notebook 10's advice for GPUs: DeepSpeed's compiled Adam
    (["--torch-adam"], "cuda", True),
    (["--no-torch-adam"], "cpu", False),
    (["--no-torch-adam", "--torch-adam"], "cpu", True),  # the last one wins, as argparse does
])
def test_torch_adam_flag_reaches_the_deepspeed_config(argv, accelerator, expect):
    args = rzero.build_parser().parse_args([*argv, "--runs", "2:bf16"])
    cfg = rzero._ds_config(2, "bf16", "none", args, world=2, accelerator=accelerator)
    assert cfg["optimizer"]["params"].get("torch_adam", False) is expect
    assert cfg["train_batch_size"] == args.micro_batch * args.grad_accum * 2
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["bf16"] == {"enabled": True}


def test_torch_adam_flag_is_documented():
    text = rzero.build_parser().format_help()
    assert "--torch-adam" in text and "--no-torch-adam" in text


# --------------------------------------------------------------------------------------------------
# every command line, as a user runs it
# --------------------------------------------------------------------------------------------------

SUBPROCESS = [
    (["labkit.recipes.ddp", "--lr", "inf"], "--lr"),
    (["labkit.recipes.ddp", "--pg-timeout", "1e20"], "--pg-timeout"),
    (["labkit.recipes.allreduce", "--sizes", "64Q"], "--sizes"),
    (["labkit.recipes.zero", "--lr", "inf"], "--lr"),
    (["labkit.recipes.ddp", "--hidden", str(10**8)], "--hidden: expected a whole number >= 1 and <= 65536"),
    (["labkit.recipes.ddp", "--data-size", str(10**10)], "--data-size: expected a whole number >= 1 and <= 16777216"),
]  # labkit.bench: tests/test_bench.py


@pytest.mark.parametrize(("cmd", "match"), SUBPROCESS, ids=[" ".join(c) for c, _ in SUBPROCESS])
def test_command_line_bad_value_is_one_line_and_exit_2(cmd, match):
    out = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert match in out.stderr and out.stderr.startswith(f"python -m {cmd[0]}")
    assert "LABKIT_RESULT" not in out.stdout and out.stdout == ""


def test_an_oversized_ddp_flag_is_refused_before_torch_is_imported():
    """The recipe's entry point parses first: an absurd size costs no torch import (seconds per rank)."""
    code = ("import sys\nfrom labkit.recipes import ddp\ntry:\n    ddp.build_parser().parse_args(sys.argv[1:])\n"
            "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)")
    for argv in (["--hidden", str(10**8)], ["--data-size", str(10**10)]):
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
        assert out.stdout.split() == ["2", "False"], (out.stdout, out.stderr)


# Every entry point a learner, an instructor or `make` runs: a bad flag, a bad value, a bad environment. Each answers
# with one line on stderr and exit status 2 (issue 39's acceptance). (argv, extra environment, words in the line)
_TOOLS = Path(__file__).resolve().parents[1] / "tools"
EVERY_CLI = [
    (["-m", "labkit", "--bogus"], {}, "required: cmd"),  # argparse names the missing command first
    *[(["-m", "labkit", *sub, "--bogus"], {}, "unrecognized arguments: --bogus")
      for sub in (["doctor"], ["student-build"], ["workspace"], ["progress"])],
    (["-m", "labkit"], {}, "required: cmd"),
    (["-m", "labkit", "class-report"], {}, "required: sources"),
    (["-m", "labkit", "progress", "--to", "x"], {}, "--to goes with --export"),
    (["-m", "labkit", "doctor"], {"LABKIT_DEVICE": "bogus"}, "LABKIT_DEVICE='bogus'"),
    (["-m", "labkit.bench", "--bogus"], {}, "required: suite"),
    (["-m", "labkit.bench", "peak", "--bogus"], {}, "unrecognized arguments: --bogus"),
    (["-m", "labkit.bench", "amp"], {"LABKIT_DEVICE": "bogus"}, "LABKIT_DEVICE='bogus'"),
    (["-m", "labkit.bench", "peak"], {"LABKIT_DEVICE": "bogus"}, "LABKIT_DEVICE='bogus'"),
    *[(["-m", f"labkit.recipes.{r}", "--bogus"], {}, "--bogus")
      for r in ("ddp", "zero", "allreduce", "handpar")],
    (["-m", "labkit.recipes.handpar_grade", "--file", "x.py", "--bogus"], {}, "--bogus"),
    *[(["-m", f"labkit.recipes.{r}"], {"RANK": "5", "WORLD_SIZE": "2"}, "inconsistent rank layout")
      for r in ("ddp", "zero", "allreduce")],
    *[(["-m", f"labkit.recipes.{r}"], {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "99999"}, "MASTER_PORT=99999")
      for r in ("ddp", "zero", "allreduce")],
    *[([str(_TOOLS / f"{t}.py"), "--bogus"], {}, "unrecognized arguments: --bogus")
      for t in ("cpu_class", "cuda_install", "gpu_check", "install_torch", "nbbuild", "nblint", "pacing", "readme")],
]


def test_every_command_line_answers_bad_input_in_one_line_with_exit_2(tmp_path):
    """All of EVERY_CLI, four at a time (each starts a Python): one stderr line naming the problem, status 2, no
    traceback, nothing on stdout."""
    from concurrent.futures import ThreadPoolExecutor

    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT",
                                                              "SLURM_PROCID", "SLURM_NTASKS", "LABKIT_DEVICE")}
    base["LABKIT_PROGRESS"] = str(tmp_path / "progress.json")

    def run(case):
        argv, env, _ = case
        return subprocess.run([sys.executable, *argv], env={**base, **env}, cwd=tmp_path, capture_output=True,
                              text=True, timeout=180, check=False)

    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(run, EVERY_CLI))
    bad = [f"{' '.join(a)} {e}: rc={o.returncode} {o.stderr[-300:]!r}" for (a, e, words), o in zip(EVERY_CLI, outs)
           if o.returncode != 2 or o.stderr.count("\n") != 1 or words not in o.stderr or "Traceback" in o.stderr]
    assert bad == [], "\n".join(bad)
