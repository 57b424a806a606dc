"""Every public callable of labkit, given wrong arguments, raises TypeError or ValueError saying so.

The callables are those in the ``__all__`` of every module listed in ``labkit.__all__``, of the recipes
(``labkit.recipes.*``) and of the exercise modules (``labkit.exercises.*``). Hypothesis calls each one with
random arguments (strings, ints including 0 and negatives, floats including inf and nan, None, bools,
empty and small lists, dicts, small tensors, arrays, dtypes, devices, a tiny module), positionally, by
keyword and mixed. Among them, hostile values (``_HOSTILE``): huge ints (2**64, +-10**400), a list and a dict
nested 5,000 deep (past the recursion limit: an ``{x!r}`` in an error message raised RecursionError), sparse
COO tensors and meta tensors (a shape, no values). Only ``TypeError`` and ``ValueError`` (and their
subclasses) may escape; anything else (AttributeError, IndexError, KeyError, AssertionError, OverflowError,
RecursionError, ZeroDivisionError, RuntimeError or NotImplementedError from torch deep inside ...) is a bug:
the function should have checked its input at the door. ``HOSTILE_FOUND`` keeps what a sweep of the hostile
values found, one plain call each.

Three short lists say what is not held to that, each entry with its reason:

- ``SKIP``: callables that start processes or servers, end the process, or run long benchmarks;
- ``ENVIRONMENTAL``: errors that come from the machine, not from the arguments;
- ``FIXED_ELSEWHERE``: what the fuzzing found in the other modules, all fixed; each case is kept as a test.

Budget: the whole module runs in well under two minutes on two cores (``EXAMPLES`` per callable, no
shrinking, a per-call time limit).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import math
import pkgutil
import reprlib
import signal
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import labkit
import labkit.exercises
import labkit.recipes

ALLOWED = (TypeError, ValueError)
EXAMPLES = 100  # per callable
CALL_LIMIT_S = 10.0  # per call: a hang or a benchmark hidden behind a default is a failure too


def _modules() -> list[str]:
    names = [f"labkit.{m}" for m in labkit.__all__ if inspect.ismodule(getattr(labkit, m))]
    names += [f"labkit.recipes.{m}" for m in labkit.recipes.__all__]
    names += [f"labkit.exercises.{m.name}" for m in pkgutil.iter_modules(labkit.exercises.__path__)]
    return sorted(set(names))


def _callables() -> dict[str, Callable[..., Any]]:
    """{qualified name: callable} over every module's ``__all__``; a re-export counts once, by its first name."""
    found: dict[str, Callable[..., Any]] = {}
    seen: set[int] = set()
    for mod_name in _modules():
        mod = importlib.import_module(mod_name)
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name, None)
            if obj is None or inspect.ismodule(obj) or not callable(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            found[f"{mod_name}.{name}"] = obj
    return found


CALLABLES = _callables()

# Not fuzzed, with the reason. Their argument checks are tested elsewhere where they have any.
SKIP: dict[str, str] = {
    "labkit.dist.launch": "starts torchrun and rank processes (tests/test_dist.py)",
    "labkit.dist.init_process_group": "joins a process group: a TCP store and process-global torch state",
    "labkit.dist.run_rank_main": "ends the process with os._exit",
    "labkit.recipes.comm_share.main": "a rank's main: starts a process group and trains (CLI: tests/test_comm_share.py)",
    "labkit.recipes.comm_patterns.main": "a rank's main: starts a process group (CLI: tests/test_comm_patterns.py)",
    "labkit.recipes.ddp.main": "a rank's main: starts a process group and trains (CLI: tests/test_cli.py)",
    "labkit.recipes.allreduce.main": "a rank's main: starts a process group (CLI: tests/test_cli.py)",
    "labkit.recipes.zero.main": "a rank's main: starts DeepSpeed (CLI: tests/test_cli.py)",
    "labkit.recipes.handpar.main": "a rank's main: reads sys.argv with cli=True (CLI: tests/test_handpar.py)",
    "labkit.recipes.handpar_grade.main": "a rank's main: reads sys.argv with cli=True (CLI: tests/test_handpar.py)",
    "labkit.bench.main": "the benchmark command line: runs benchmarks (CLI: tests/test_bench.py)",
    "labkit.bench.amp_benchmark": "a benchmark: timing loops over a 1024 matmul and a GPT step by default",
    "labkit.bench.memory_bandwidth": "a benchmark: copies 256 MiB repeatedly by default",
    "labkit.bench.peak_matmul_flops": "a benchmark: timing loops over large matmuls by default",
    "labkit.bench.peak_report": "a benchmark: all of the above",
    "labkit.fp8.time_fp8_matmul": "a benchmark: timing loops over 4096x4096 matmuls by default",
    "labkit.tf32.time_tf32": "a benchmark: timing loops over 4096x4096 matmuls by default",
    "labkit.profiling.launch_overhead": "a benchmark: timing loops",
    "labkit.profiling.compile_timed": "torch.compile: seconds per call and compile worker processes",
    "labkit.student.build_student": "writes a whole student build of the notebooks to a folder",
}

# Errors that come from the machine or the process, not from the arguments:
# (callable, exception type) -> (text the message contains, reason).
ENVIRONMENTAL: dict[tuple[str, type[BaseException]], tuple[str, str]] = {
    ("labkit.dist.find_free_port", OSError): ("", "binding a socket to a host name depends on the network"),
    ("labkit.recipes.allreduce.run_benchmark", RuntimeError): (
        "needs an initialised process group", "it runs inside a torchrun rank; its arguments are checked first"),
    **{(f"labkit.recipes.comm_patterns.{name}", RuntimeError): (
        "process group", "it runs inside a torchrun rank; its arguments are checked first")
       for name in ("ps_allreduce", "ring_allreduce", "sync_batch_norm")},
    ("labkit.profiling.read_chrome_trace", OSError): ("", "the path names no readable file: the file system's answer"),
    ("labkit.train.load_checkpoint", OSError): ("", "the path names no readable file: the file system's answer"),
}

# Bugs in modules this test's author does not own (reported to their owners), allowed only for their own
# callable and exception types: callable -> (exception types, (args, kwargs) that raise one, what is wrong).
_T = "a wrong type reaches code that assumes the right one"
# Found by this fuzzing in other modules, then fixed there: {callable: (what escaped before, (args, kwargs), why)}.
# None is allowed any more; test_cases_found_elsewhere_now_raise_type_or_value_error keeps each case.
FIXED_ELSEWHERE: dict[str, tuple[tuple[type[BaseException], ...], tuple[tuple[Any, ...], dict[str, Any]], str]] = {
    "labkit.activations.check_count": ((RuntimeError,), (("n", 3, torch.ones(2)), {}),
                                       "minimum is not checked: a tensor minimum makes `value < minimum` ambiguous"),
    "labkit.activations.graph_saved_bytes": ((AttributeError,), ((torch.ones(2), np.array([1, 2])), {}),
                                             f"exclude items are not checked to be tensors: {_T}"),
    "labkit.bench.matmul_candidates": ((RuntimeError,), ((4, ("fp32",), "relu"), {}),
                                       "torch.device(device) unchecked (not labkit.device); also seed unchecked"),
    "labkit.bench.theoretical_peak": ((RuntimeError,), (("fp32", "0"), {}),
                                      "torch.device(device) unchecked: 'Invalid device string' RuntimeError"),
    "labkit.bench.train_step_candidates": ((RuntimeError, AssertionError), ((("fp32",), "relu"), {}),
                                           "torch.device(device) unchecked (not labkit.device); 'cuda' on a "
                                           "CPU-only build raises torch's AssertionError"),
    "labkit.catalog.markdown_table": ((AttributeError,), (("fp16",), {}), f"notebooks is not checked: {_T}"),
    "labkit.memory.MasterWeightOptimizer": ((AttributeError,), (("max",), {}), f"params are not checked: {_T}"),
    "labkit.memory.predict_torch_state": ((RuntimeError,), ((torch.nn.Linear(2, 2),), {"with_grads": torch.ones(3)}),
                                          "with_grads is not checked to be a bool (truth value of a tensor)"),
    "labkit.precision.autocast": ((RuntimeError,), (("fp32", "fp32"), {}),
                                  "device_type is not checked: torch's 'Invalid device string' RuntimeError"),
    "labkit.precision.backward": ((AttributeError, RuntimeError), ((torch.tensor(1.0),), {}),
                                  "loss/scaler/weight not checked: a loss without grad_fn, a str scaler, a tensor weight"),
    "labkit.precision.grad_norm": ((AttributeError,), (("ab",), {}), f"params are not checked: {_T}"),
    "labkit.precision.update": ((AttributeError, RuntimeError), ((None,), {}),
                                "optimizer/scaler/params/clip_grad_norm are not checked"),
    "labkit.scaling.deepspeed_fp16_config": ((KeyError,), ((), {"scaler": torch.nn.Linear(2, 2)}),
                                             "scaler is not checked to be a GradScaler (KeyError 'growth_factor')"),
    "labkit.scaling.deepspeed_scale_sequence": (
        (RuntimeError,), (("reverse",), {"initial_scale_power": 5, "loss_scale_window": 5}),
        "overflows is not checked (a str counts char by char, a tensor is ambiguous); its documented "
        "RuntimeError at min_loss_scale (DeepSpeed's own stop) then escapes: the owner decides if that stays"),
    "labkit.scaling.grad_values": ((AttributeError,), (("x",), {}), f"params are not checked: {_T}"),
    "labkit.scaling.simulate_scales": ((RuntimeError,), ((torch.ones(2, 2),), {}),
                                       "found_infs is not checked (truth value of a tensor)"),
    "labkit.slurm.gpus_per_node": ((AttributeError, RuntimeError), (("x",), {}), f"opts is not checked to be a dict: {_T}"),
    "labkit.student.solution_blocks": ((AttributeError,), ((1.5,), {}), f"source is not checked to be a str: {_T}"),
    "labkit.student.strip_solutions": ((AttributeError,), ((None,), {}), f"source is not checked to be a str: {_T}"),
    "labkit.train.autocast_op_dtypes": ((RuntimeError, AssertionError), (("",), {}),
                                        "device is not checked: torch.device() RuntimeError; 'cuda' on a CPU-only "
                                        "build raises torch's AssertionError (labkit.device does the check)"),
    "labkit.train.make_optimizer": ((RuntimeError,), (([torch.ones(2, requires_grad=True)],),
                                                      {"weight_decay": torch.ones(4)}),
                                    "lr/weight_decay/momentum/eps are not checked to be numbers"),
}


# --------------------------------------------------------------------------------------------------
# argument values
# --------------------------------------------------------------------------------------------------

def _tiny_module() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(2, 2)


# Factories, so that every call gets fresh objects (a callee may change a tensor, a module, a list).
_FACTORIES: list[Callable[[], Any]] = [
    lambda: torch.zeros(()), lambda: torch.ones(3), lambda: torch.randn(2, 2, generator=torch.Generator()),
    lambda: torch.tensor([1.0, math.nan, math.inf]), lambda: torch.arange(4), lambda: torch.zeros(0),
    lambda: torch.ones(2, 3, dtype=torch.float16), lambda: torch.tensor(True), lambda: torch.ones(2, 2).requires_grad_(),
    lambda: np.arange(3, dtype=np.float32), lambda: np.zeros(0), lambda: np.array([1, 2], dtype=np.uint16),
    lambda: [], lambda: [1, 2], lambda: [0.5], lambda: ["fp16"], lambda: [[1, 2]], lambda: [torch.ones(2)],
    lambda: (1, 2), lambda: (), lambda: (2, 3, 4),
    lambda: {}, lambda: {"a": 1}, lambda: {"fp32": [1.0, 2.0]}, lambda: {"x": {"y": 1.0}}, lambda: {1: "a"},
    _tiny_module,
]

#: How deep the nested list and dict go: far past the interpreter's recursion limit (1,000), so a ``repr``,
#: ``str``, ``copy.deepcopy`` or ``json.dumps`` of one raises RecursionError unless the callee checks first.
DEEP = 5_000


class _Made:
    """A value made only when the call is made, shown by its name: hypothesis prints a failing call with this
    name, not with a 5,000-deep repr (its printer recurses)."""

    def __init__(self, name: str, make: Callable[[], Any]) -> None:
        self.name, self.make = name, make

    def __repr__(self) -> str:
        return self.name


def _chain(wrap: Callable[[Any], Any], empty: Any) -> Any:
    value = empty
    for _ in range(DEEP - 2):  # built iteratively: no recursion here
        value = wrap(value)
    return value


# The deep part is built once (building and freeing 5,000 levels per call cost ~10 ms, a third more fuzzing
# time); every call gets fresh top levels, which are all a callee could reasonably change.
_DEEP_LIST, _DEEP_DICT = _chain(lambda x: [x], []), _chain(lambda x: {"x": x}, {})


# Hostile values (issue 22, low items): sizes no machine holds, nesting deeper than the recursion limit, and
# tensors that dense code cannot read. One branch of _values among the others, so the number of calls stays
# EXAMPLES per callable: each kind is drawn a few times per callable, not multiplied in.
_HOSTILE = [
    _Made("2**64", lambda: 2**64), _Made("10**400", lambda: 10**400), _Made("-10**400", lambda: -(10**400)),
    _Made(f"[[...]] {DEEP} deep", lambda: [[_DEEP_LIST]]),
    _Made(f"{{'x': {{...}}}} {DEEP} deep", lambda: {"x": {"x": _DEEP_DICT}}),
    _Made("sparse_coo(3,)", lambda: torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (3,))),
    _Made("sparse_coo(2, 2)", lambda: torch.sparse_coo_tensor([[0, 1], [1, 0]], [1.0, 2.0], (2, 2))),
    _Made("meta(3,)", lambda: torch.empty(3, device="meta")),
    _Made("meta(2, 2)", lambda: torch.empty(2, 2, device="meta")),
]


def _make(value: Any) -> Any:
    return value.make() if isinstance(value, _Made) else value


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 12),
    st.sampled_from([0.0, -1.0, 0.5, 1.5, 1e3, 1e-30, math.inf, -math.inf, math.nan]),
    st.sampled_from(["", "x", "fp16", "bf16", "fp32", "tf32", "e4m3fn", "e5m2", "cpu", "cuda", "adam", "adamw",
                     "bf16-master", "13B", "1K", "mlp", "gpt", "reverse", "relu", "max", "saturate", "0:bf16",
                     "01.fp16-max", "train_step"]),
    # plain names only: no "/", "~" or ".", so a path made of one stays inside the test's temporary folder
    st.text(alphabet="abcxyz019_-", max_size=6),
    st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.device("cpu")]),
    st.sampled_from(_FACTORIES).map(lambda make: make()),
    st.sampled_from(_HOSTILE),
)


def _params(fn: Callable[..., Any]) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


@st.composite
def _call_args(draw: st.DrawFn, fn: Callable[..., Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Random (args, kwargs) for ``fn``: mostly its own parameters, positionally, by keyword or mixed."""
    params = _params(fn)
    if params is None:
        return tuple(draw(st.lists(_values, max_size=3))), {}
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    positional = draw(st.integers(0, len(params)))  # how many leading parameters go by position
    for i, p in enumerate(params):
        if p.kind is p.VAR_POSITIONAL:
            if i <= positional:
                args.extend(draw(st.lists(_values, max_size=2)))
            continue
        if p.kind is p.VAR_KEYWORD:
            kwargs.update(draw(st.dictionaries(st.sampled_from(["seed", "lr", "n_heads", "x"]), _values,
                                               max_size=1)))
            continue
        required = p.default is p.empty
        if not draw(st.booleans()) and not (required and draw(st.integers(0, 9)) > 0):
            if p.kind is not p.KEYWORD_ONLY:
                positional = min(positional, i)  # a skipped parameter ends the positional run
            continue
        value = draw(_values)
        if p.kind is p.POSITIONAL_ONLY or (p.kind is p.POSITIONAL_OR_KEYWORD and i < positional):
            args.append(value)
        else:
            kwargs[p.name] = value
    return tuple(args), kwargs


# --------------------------------------------------------------------------------------------------
# calling with a time limit, in a sandbox
# --------------------------------------------------------------------------------------------------

class CallTimeout(Exception):
    """A call ran past CALL_LIMIT_S."""


@contextlib.contextmanager
def _time_limit(seconds: float):
    def on_alarm(signum, frame):  # the signal handler signature
        raise CallTimeout(f"still running after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """Run in a temporary folder, with torch's and labkit's process-wide settings restored afterwards."""
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit import check

    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("fuzz"))
    saved_home = os.environ.get("HOME")
    os.environ["HOME"] = os.getcwd()  # what writes to ~ by default (classresults.export_record) writes here
    saved = (torch.get_num_threads(), torch.get_float32_matmul_precision(), torch.get_default_dtype(),
             torch.backends.cudnn.allow_tf32, torch.random.get_rng_state(), dict(check._RESULTS), dict(os.environ))
    try:
        yield plt
    finally:
        os.chdir(here)
        torch.set_num_threads(saved[0])
        torch.set_float32_matmul_precision(saved[1])
        torch.set_default_dtype(saved[2])
        torch.backends.cudnn.allow_tf32 = saved[3]
        torch.random.set_rng_state(saved[4])
        check._RESULTS.clear()
        check._RESULTS.update(saved[5])
        os.environ.clear()
        os.environ.update(saved[6])
        if saved_home is not None:
            os.environ["HOME"] = saved_home
        plt.close("all")


def _describe(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    def short(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            return f"tensor(shape={tuple(v.shape)}, dtype={v.dtype})"
        try:
            text = reprlib.repr(v)
        except Exception:
            text = f"<{type(v).__name__}>"
        return text if len(text) <= 60 else text[:57] + "..."

    return ", ".join([*map(short, args), *(f"{k}={short(v)}" for k, v in kwargs.items())])


def _call(name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], plt: Any) -> None:
    """Call ``fn``; fail the test unless it returns or raises an allowed error."""
    allowed_here = ALLOWED
    try:
        with _time_limit(CALL_LIMIT_S), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            result = fn(*map(_make, args), **{k: _make(v) for k, v in kwargs.items()})
            if inspect.isgenerator(result) or hasattr(result, "__next__"):
                result.close() if hasattr(result, "close") else None
    except allowed_here:
        pass
    except Exception as exc:  # the bug this test is for: report the call, the exception and where
        if any(n == name and isinstance(exc, t) and text in str(exc) for (n, t), (text, _) in ENVIRONMENTAL.items()):
            return
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else "?"
        pytest.fail(f"{name}({_describe(args, kwargs)}) raised {type(exc).__name__}: {exc}  [at {where}]",
                    pytrace=False)
    finally:
        plt.close("all")


FUZZED = sorted(n for n in CALLABLES if n not in SKIP)


@pytest.mark.parametrize("name", FUZZED)
def test_wrong_arguments_raise_type_or_value_error(name, sandbox):
    fn = CALLABLES[name]

    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(call=_call_args(fn))
    def run(call: tuple[tuple[Any, ...], dict[str, Any]]) -> None:
        _call(name, fn, call[0], call[1], sandbox)

    run()


def test_the_lists_name_real_callables():
    """SKIP, ENVIRONMENTAL and FIXED_ELSEWHERE stay honest: every entry names a public callable."""
    assert len(CALLABLES) > 200
    named = set(SKIP) | {n for n, _ in ENVIRONMENTAL} | set(FIXED_ELSEWHERE)
    assert named <= set(CALLABLES), sorted(named - set(CALLABLES))
    assert len(SKIP) <= 20, "keep the skip list short"


@pytest.mark.parametrize("name", sorted(FIXED_ELSEWHERE))
def test_cases_found_elsewhere_now_raise_type_or_value_error(name):
    """What the fuzzing found in modules other than its author's, and what they now say instead."""
    _, (args, kwargs), reason = FIXED_ELSEWHERE[name]
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(ALLOWED):
        CALLABLES[name](*args, **kwargs)


# Every hostile value in every parameter, the other parameters given plain values (_plain): what such a sweep
# found before the fixes, {callable: ["parameter=value", ...]} ("*=" is the first positional argument). Each
# raised something else than TypeError/ValueError: RecursionError from an error message's repr (or a recursive
# walk), OverflowError from float(10**400) or math.isfinite, NotImplementedError/RuntimeError from a sparse or
# meta tensor deep in torch. Kept as plain regression tests, one call each.
HOSTILE_FOUND: dict[str, list[str]] = {
    "labkit.activations.graph_saved_bytes": ["exclude=sparse_coo(3,)"],
    "labkit.bench.cpu_flops_per_cycle": ["fma_units=[[...]] 5000 deep"],
    "labkit.bench.matmul_candidates": ["n=[[...]] 5000 deep", "seed=[[...]] 5000 deep"],
    "labkit.bench.theoretical_peak": ["fma_units=10**400", "fma_units=[[...]] 5000 deep"],
    "labkit.check.export_results": ["name=[[...]] 5000 deep"],
    "labkit.clinic.run_cases": [
        "requests=[[...]] 5000 deep", "parallel=[[...]] 5000 deep", "parallel=sparse_coo(3,)",
        "parallel=meta(3,)",
    ],
    "labkit.data.make_regression": ["noise=2**64", "noise=10**400", "noise=[[...]] 5000 deep"],
    "labkit.debug.nonfinite_count": ["value=[[...]] 5000 deep", "value=sparse_coo(3,)", "value=meta(3,)"],
    "labkit.device.event_timer": ["flush_bytes=[[...]] 5000 deep"],
    "labkit.dist.emit_result": ["result={'x': {...}} 5000 deep"],
    "labkit.dist.find_free_port": ["host=[[...]] 5000 deep"],
    "labkit.exercises.nb04.reference_island_softmax": ["scores=sparse_coo(3,)", "scores=meta(3,)"],
    "labkit.exercises.nb11.prefetch": ["answers=[[...]] 5000 deep"],
    "labkit.formats.table": ["names={'x': {...}} 5000 deep"],
    "labkit.fp8.DelayedScaling": [
        "history_len=2**64", "history_len=[[...]] 5000 deep", "margin=[[...]] 5000 deep",
        "algo=[[...]] 5000 deep", "init_scale=10**400",
    ],
    "labkit.fp8.TensorTap": ["layers=[[...]] 5000 deep"],
    "labkit.fp8.amax": ["x=sparse_coo(3,)", "x=meta(3,)"],
    "labkit.fp8.compute_scale": [
        "amax=10**400", "margin=2**64", "margin=[[...]] 5000 deep", "previous=10**400",
    ],
    "labkit.fp8.current_scaling": [
        "x=sparse_coo(3,)", "x=meta(3,)", "margin=2**64", "margin=[[...]] 5000 deep",
    ],
    "labkit.fp8.dequantize": ["scale=10**400"],
    "labkit.fp8.quant_stats": ["x=sparse_coo(3,)", "x=meta(3,)", "scale=10**400"],
    "labkit.fp8.quantize": ["x=sparse_coo(3,)", "scale=10**400", "overflow=[[...]] 5000 deep"],
    "labkit.fp8.roundtrip": ["x=sparse_coo(3,)", "scale=10**400", "overflow=[[...]] 5000 deep"],
    "labkit.fp8.scaled_mm": ["a=sparse_coo(2, 2)", "a=meta(2, 2)", "scale_a=10**400"],
    "labkit.fp8.scaled_mm_reference": ["a=sparse_coo(2, 2)", "a=meta(2, 2)", "scale_a=10**400"],
    "labkit.handpar.BucketedGradients": ["bucket_mb=[[...]] 5000 deep"],
    "labkit.handpar.clip_sharded_grad_norm_": ["max_norm=10**400", "max_norm=[[...]] 5000 deep"],
    "labkit.inference.batch_sweep": ["inputs=sparse_coo(3,)"],
    "labkit.kernels.adamw_step": ["step=10**400", "lr=10**400", "betas=[[...]] 5000 deep"],
    "labkit.kernels.adamw_torch": [
        "p=meta(2, 2)", "step=10**400", "lr=10**400", "betas=[[...]] 5000 deep", "impl=[[...]] 5000 deep",
    ],
    "labkit.kernels.adamw_unfused": [
        "p=meta(2, 2)", "m=meta(2, 2)", "step=10**400", "lr=10**400", "betas=[[...]] 5000 deep",
    ],
    "labkit.kernels.close": ["got=sparse_coo(2, 2)", "got=meta(2, 2)"],
    "labkit.lifecycle.checkpoint_overhead": ["checkpoint_s=10**400"],
    "labkit.lifecycle.fingerprint": ["*=sparse_coo(3,)", "*=meta(3,)"],
    "labkit.lifecycle.young_interval": ["checkpoint_s=10**400"],
    "labkit.memory.fmt_bytes": ["n=10**400"],
    "labkit.memory.setup_training": ["lr=[[...]] 5000 deep"],
    "labkit.memory.smallest_fitting_stage": [
        "gpu_bytes=[[...]] 5000 deep", "reserve_bytes=[[...]] 5000 deep",
    ],
    "labkit.memory.tensor_bytes": ["tensors=sparse_coo(2, 2)"],
    "labkit.models.MLP": ["init_scale=2**64", "init_scale=10**400"],
    "labkit.models.softmax": ["scores=sparse_coo(3,)", "scores=meta(3,)"],
    "labkit.plots.format_ranges": ["names={'x': {...}} 5000 deep"],
    "labkit.plots.grad_histogram": [
        "values=10**400", "values=meta(3,)", "names={'x': {...}} 5000 deep", "scale=10**400",
        "scale=[[...]] 5000 deep", "bins=[[...]] 5000 deep",
    ],
    "labkit.plots.relative_spacing": ["names={'x': {...}} 5000 deep", "lo=10**400", "lo=[[...]] 5000 deep"],
    "labkit.plots.scale_history": ["scales=10**400", "scales=meta(3,)"],
    "labkit.profiling.gelu_chain_cost": ["numel=10**400", "numel=[[...]] 5000 deep", "dtype=10**400"],
    "labkit.profiling.make_gpt_step": ["batch=[[...]] 5000 deep"],
    "labkit.profiling.mfu": ["model_flops=10**400"],
    "labkit.recipes.allreduce.algbw": ["nbytes=10**400"],
    "labkit.recipes.allreduce.busbw": ["algbw_gbps=10**400", "world_size=10**400"],
    "labkit.recipes.allreduce.busbw_factor": ["world_size=10**400"],
    "labkit.recipes.allreduce.format_size": ["nbytes=[[...]] 5000 deep"],
    "labkit.recipes.ddp.checksum": ["tensors=sparse_coo(2, 2)", "tensors=meta(3,)"],
    "labkit.recipes.ddp.tensor_sum": ["tensors=meta(3,)"],
    "labkit.recipes.zero.shm_buffers": ["rank=[[...]] 5000 deep"],
    "labkit.roofline.OpCost": ["flops=10**400"],
    "labkit.roofline.attainable": ["intensity=10**400"],
    "labkit.roofline.bound": ["intensity=10**400"],
    "labkit.roofline.elementwise_chain_cost": [
        "numel=10**400", "numel=[[...]] 5000 deep", "dtype=10**400", "flops_per_element=10**400",
    ],
    "labkit.roofline.elementwise_cost": [
        "numel=10**400", "numel=[[...]] 5000 deep", "flops_per_element=[[...]] 5000 deep",
    ],
    "labkit.roofline.layernorm_cost": ["rows=10**400", "rows=[[...]] 5000 deep"],
    "labkit.roofline.matmul_cost": ["m=10**400", "m=[[...]] 5000 deep"],
    "labkit.roofline.ridge_point": ["peak_flops=10**400"],
    "labkit.roofline.softmax_cost": ["rows=10**400", "rows=[[...]] 5000 deep"],
    "labkit.scaling.DynamicLossScaler": ["init_scale=10**400"],
    "labkit.scaling.choose_scale_power": [
        "values=10**400", "values=sparse_coo(3,)", "values=meta(3,)", "to=[[...]] 5000 deep",
    ],
    "labkit.scaling.deepspeed_fp16_config": ["min_loss_scale=10**400"],
    "labkit.scaling.deepspeed_scale_sequence": ["initial_scale_power=2**64"],
    "labkit.scaling.overflow_fraction": [
        "values=10**400", "values=sparse_coo(3,)", "values=meta(3,)", "scale=10**400",
    ],
    "labkit.scaling.safe_scale_powers": [
        "values=10**400", "values=sparse_coo(3,)", "values=meta(3,)", "to=[[...]] 5000 deep",
    ],
    "labkit.scaling.underflow_fraction": [
        "values=10**400", "values=sparse_coo(3,)", "values=meta(3,)", "scale=10**400",
        "to=[[...]] 5000 deep",
    ],
    "labkit.sizing.plan_3d": ["gpu_bytes=10**400"],
    "labkit.sizing.search_plans": ["gpu_bytes=10**400"],
    "labkit.student.solution_blocks": ["cell_type=[[...]] 5000 deep"],
    "labkit.student.strip_solutions": ["cell_type=[[...]] 5000 deep"],
    "labkit.tf32.input_rounding_error": ["a=meta(2, 2)"],
    "labkit.tf32.matmul_error": ["a=meta(2, 2)", "dtype=[[...]] 5000 deep"],
    "labkit.tf32.round_mantissa": ["x=sparse_coo(3,)", "man_bits=[[...]] 5000 deep"],
    "labkit.tf32.tf32_matmul": ["a=sparse_coo(2, 2)"],
    "labkit.toolchain.amdahl": ["speedup=10**400"],
    "labkit.toolchain.compiler_version": ["cc=[[...]] 5000 deep"],
    "labkit.train.CheckpointError": ["reason=[[...]] 5000 deep"],
    "labkit.train.autocast_op_dtypes": ["dtype=[[...]] 5000 deep"],
    "labkit.train.default_loss": ["batch=sparse_coo(2, 2)", "batch=meta(2, 2)"],
    "labkit.train.make_optimizer": ["lr=10**400", "lr=[[...]] 5000 deep"],
    "labkit.train.save_checkpoint": ["step=[[...]] 5000 deep", "policy=[[...]] 5000 deep"],
    "labkit.train.train": ["steps=[[...]] 5000 deep"],
    "labkit.widgets.BitExplorer": ["value=10**400"],
    "labkit.widgets.bit_explorer": ["value=10**400"],
    "labkit.workspace.updated_name": ["n=[[...]] 5000 deep"],
    "labkit.zero.config": [
        "stage=[[...]] 5000 deep", "dtype=[[...]] 5000 deep", "offload=[[...]] 5000 deep", "lr=10**400",
        "lr=[[...]] 5000 deep", "overlap_comm=[[...]] 5000 deep",
    ],
    "labkit.zero.explain": ["cfg={'x': {...}} 5000 deep"],
    "labkit.zero.partition_layout": ["stage=[[...]] 5000 deep", "stage=sparse_coo(3,)", "stage=meta(3,)"],
}


_HOSTILE_BY_NAME = {h.name: h for h in _HOSTILE}


def _plain(p: inspect.Parameter) -> Any:
    """A plain value for a required parameter, by its annotation (only so that the call reaches the body)."""
    ann = str(p.annotation)
    if "Tensor" in ann:
        return torch.ones(2, 2)
    if "Module" in ann:
        return _tiny_module()
    if "str" in ann and "int" not in ann:
        return "fp16"
    for words, value in ((("float",), 1.0), (("Sequence", "list", "Iterable"), [1, 2]), (("dict",), {"a": 1})):
        if any(w in ann for w in words):
            return value
    return 2


def _one_hostile(fn: Callable[..., Any], param: str, value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) for ``fn`` with ``value`` as ``param`` and plain values for the other required ones."""
    if param == "*":
        return (value,), {}
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for p in _params(fn) or []:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or (p.name != param and p.default is not p.empty):
            continue
        v = value if p.name == param else _plain(p)
        if p.kind is p.POSITIONAL_ONLY:
            args.append(v)
        else:
            kwargs[p.name] = v
    return tuple(args), kwargs


_FOUND_CASES = [(name, *entry.split("=", 1)) for name, entries in HOSTILE_FOUND.items() for entry in entries]


@pytest.mark.parametrize(("name", "param", "hostile"), _FOUND_CASES,
                         ids=[f"{n.removeprefix('labkit.')}-{p}-{i}" for i, (n, p, _) in enumerate(_FOUND_CASES)])
def test_hostile_values_found_by_the_sweep_raise_type_or_value_error(name, param, hostile, sandbox):
    fn = CALLABLES[name]
    args, kwargs = _one_hostile(fn, param, _HOSTILE_BY_NAME[hostile])
    _call(name, fn, args, kwargs, sandbox)


def _cuda_absent() -> bool:
    return not torch.cuda.is_available()


# The cases the fuzzing started from (issue 22), and others it found, as plain regression tests.
REPORTED = [
    ("labkit.plots.format_ranges", (), {"ax": ""}, TypeError, "matplotlib Axes"),
    ("labkit.plots.value_grid", ("e4m3fn",), {"ax": 1.0}, TypeError, "matplotlib Axes"),
    ("labkit.plots.relative_spacing", (), {"lo": torch.tensor(1.0)}, TypeError, "lo must be a finite number"),
    ("labkit.plots.memory_bars", ({"a": {"params": 1}},), {"unit": 0}, ValueError, "unit must be > 0"),
    ("labkit.plots.loss_curves", ({"a": [1.0, 2.0]},), {"styles": "--"}, TypeError, "styles must be a dict"),
    ("labkit.exercises.nb03.exercise_gradients", (), {"n": 0}, ValueError, "n must be >= 2"),
    ("labkit.exercises.nb03.exercise_gradients", (), {"seed": torch.float32}, TypeError, "seed must be an int"),
    ("labkit.exercises.nb05.exercise_tensor", (4, None), {}, TypeError, "seed must be an int"),
    ("labkit.exercises.nb04.reference_island_softmax", (-1.0,), {}, TypeError, "scores must be a Tensor"),
    ("labkit.models.CausalSelfAttention", (8, 0, 4), {}, ValueError, "n_heads must be a positive int"),
    ("labkit.models.TinyGPT", (), {"seed": np.zeros(0)}, TypeError, "seed must be None or an int"),
    ("labkit.models.lm_loss", (torch.ones(2, 3), "ab"), {}, TypeError, "must be tensors"),
    ("labkit.models.softmax", (torch.zeros(0),), {}, ValueError, "non-empty dimension"),
    ("labkit.formats.table", (torch.ones(3),), {}, TypeError, "names must be a list"),
    ("labkit.env.format_report", ({"x": 1},), {}, ValueError, "expected the dict from report()"),
    ("labkit.tf32.matmul_error", (torch.ones(()), torch.ones(())), {}, ValueError, "expected matrices"),
    ("labkit.tf32.tf32_matmul", (torch.ones(2, 2), torch.ones(())), {}, ValueError, "expected matrices"),
    ("labkit.roofline.table", ("x9",), {}, TypeError, "RooflinePoint"),
    ("labkit.roofline.OpCost", ("op", torch.ones(3), 1.0), {}, TypeError, "flops must be a number"),
    ("labkit.profiling.op_table", ("prof",), {}, TypeError, "torch.profiler.profile"),
    ("labkit.profiling.ops_to_cover", ([0.5, 0.5],), {"fraction": torch.ones(3)}, TypeError, "fraction must be"),
    ("labkit.profiling.busy_fraction", ("train_step",), {}, TypeError, "events must be a list"),
    ("labkit.profiling.interleaved_times", (True,), {}, TypeError, "fns must be a non-empty dict"),
    ("labkit.profiling.make_gpt_step", (), {"batch": torch.ones(3)}, ValueError, "batch must be a positive int"),
    ("labkit.data.Batches", (torch.tensor(1.0),), {"batch_size": 2}, ValueError, "at least 1-D"),
    ("labkit.widgets.memory_calculator", (), {"nodes": torch.device("cpu")}, TypeError, "nodes must be a number"),
    ("labkit.widgets.memory_calculator", (), {"gpus_per_node": 100}, ValueError, "between 1 and 64"),
    ("labkit.recipes.ddp.tensor_sum", ("abc",), {}, TypeError, "sequence of tensors"),
    ("labkit.recipes.allreduce.run_benchmark", ([1024],), {"warmup": None}, ValueError, "warmup must be"),
    # found by the hostile values: a name that is a list nested past the recursion limit; a non-scalar loss
    ("labkit.activations.check_count", (_DEEP_LIST, "x", 1), {}, TypeError, "name must be a str"),
    ("labkit.precision.backward", (torch.ones(2, 2).requires_grad_(),), {}, ValueError, "loss must hold one number"),
    ("labkit.memory.zero_table", (10**6, 2**31), {}, ValueError, "world_size must be between 1 and 1,048,576"),
    ("labkit.widgets.memory_calculator_report", (10**9,), {"gpus_per_node": 2**40}, ValueError,
     "gpus_per_node must be between 1 and 1,024"),
    ("labkit.models.MLP", (4, 4, 1), {"depth": 2**40}, ValueError, "depth must be an int between 0 and 10,000"),
    ("labkit.models.MLP", (4, 10**6, 1), {}, ValueError, "labkit builds at most 20,000,000,000"),
    ("labkit.roofline.matmul_cost", (10**400, 2, 2), {}, ValueError, "tensor sizes are int64"),
]
if _cuda_absent():  # on a CPU-only build a GPU is "not here": ValueError, not torch's AssertionError
    REPORTED += [(f"labkit.device.{fn}", ("cuda",), {}, ValueError, "torch sees no CUDA GPU")
                 for fn in ("tier", "capabilities", "autocast_dtype", "synchronize", "memory_allocated",
                            "max_memory_allocated", "memory_reserved", "memory_summary", "cuda_properties",
                            "empty_cache", "reset_peak_memory_stats", "event_timer", "get_rng_state",
                            "set_current_device")]


@pytest.mark.parametrize(("name", "args", "kwargs", "exc", "match"), REPORTED,
                         ids=[f"{r[0].removeprefix('labkit.')}-{i}" for i, r in enumerate(REPORTED)])
def test_reported_cases_raise_a_clear_error(name, args, kwargs, exc, match, sandbox):
    with pytest.raises(exc, match=match.replace("(", r"\(").replace(")", r"\)")):
        CALLABLES[name](*args, **kwargs)


def test_device_questions_still_answer_for_an_absent_gpu():
    """The gate's questions keep answering (not raising) where they did: computes() and is_cuda()."""
    from labkit import device as dev_gate

    assert dev_gate.is_cuda("cuda") and dev_gate.dist_backend("cuda") == "nccl"
    if _cuda_absent():
        assert dev_gate.computes(torch.bfloat16, "cuda") is False
        with pytest.raises(ValueError, match="no CUDA GPU"):
            dev_gate.fast(torch.bfloat16, "cuda")
