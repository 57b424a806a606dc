"""Exercises of notebook 11 (parallelism by hand): the learner's code runs on 2 ranks under torchrun.

The four implement exercises take what the learner defined in a notebook cell (a function, or a pair of
``torch.autograd.Function`` classes). Ranks are other processes: they cannot see the notebook's memory. So the
grader writes a module file from the cell that defined the answer (:func:`rank_module`: the cell's imports,
functions and classes, not its calls), runs it on 2 ranks with ``python -m labkit.recipes.handpar_grade``
through :func:`labkit.dist.launch`, and compares it there with the real thing: torch's
``DistributedDataParallel``, an unsharded ``torch.optim.AdamW``, the single-process model. A definition whose body
is still ``...`` is "not attempted yet" and nothing is launched. Verdicts are remembered per module text, so
running a check again on unchanged code costs nothing (a run that failed is not remembered).

Introduced in notebook 11.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import math
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labkit import handpar as _hp
from labkit._validate import safe_repr
from labkit.exercises import _nb11_mistakes as _mistake
from labkit.exercises._core import NOT_MEASURED, Exercise, FormatSlip
from labkit.exercises._graders import as_number
from labkit.i18n import gettext as _

__all__ = ["EXERCISES", "PREDICT_SETUP", "prefetch", "rank_module"]

#: The header of every module file the graders write: what a rank has without the notebook.
_HEADER = ("# Written by labkit's grader for notebook 11 from your cell's definitions; run on 2 ranks.\n"
           "import torch\nimport torch.distributed as dist\nimport torch.nn.functional as F\nfrom torch import nn\n")
_CACHE: dict[tuple[str, str], tuple[bool, str]] = {}
_TOL = 1e-5  # fp32 tolerance where the order of a sum differs (tensor and pipeline parallel)


def _function_of(obj: Any) -> Any:
    """A function whose code lives where ``obj`` was defined (``obj`` itself, or a method of a class)."""
    if inspect.isfunction(obj):
        return obj
    if inspect.isclass(obj):
        for v in vars(obj).values():
            v = getattr(v, "__func__", v)
            if inspect.isfunction(v):
                return v
    raise TypeError(_("expected a function or a class defined in a cell, got {type}").format(type=type(obj).__name__))


def rank_module(obj: Any) -> str:
    """Return the module text the graders run on the ranks for ``obj`` (a function or class from a cell or file).

    It holds the imports, functions, classes and constant assignments of the cell (or file) that defined
    ``obj``, after a header importing torch, ``torch.distributed as dist``, ``torch.nn.functional as F`` and
    ``nn``; calls such as ``check(...)`` are left out. Introduced in notebook 11.
    """
    fn = _function_of(obj)
    try:
        lines, _lineno = inspect.findsource(fn)
    except OSError as exc:
        raise ValueError(_("cannot read the source of {name}: define it in a notebook cell or a .py file "
                           "({error})").format(name=fn.__qualname__, error=exc)) from None
    tree = ast.parse("".join(lines))
    keep = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    body = [n for n in tree.body
            if isinstance(n, keep) or (isinstance(n, (ast.Assign, ast.AnnAssign)) and isinstance(n.value, ast.Constant))]
    future = [n for n in body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    rest = [n for n in body if n not in future]
    text = "".join(ast.unparse(n) + "\n" for n in future) + _HEADER
    return text + "\n\n".join(ast.unparse(n) for n in rest) + "\n"


def _is_stub(obj: Any) -> bool:
    """True when the definition's body (every method's, for a class) is only a docstring, ``...`` or ``pass``."""
    try:
        src = textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):  # a class defined in a notebook cell (no file): Python cannot find its source
        src = ""
    if not src and inspect.isclass(obj):  # a class defined in __main__: look at its methods one by one
        funcs = [getattr(v, "__func__", v) for v in vars(obj).values()]
        return all(_is_stub(f) for f in funcs if inspect.isfunction(f))
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return False
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]

    def empty(node: Any) -> bool:
        body = list(node.body)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]
        return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                               and s.value.value is Ellipsis) for s in body)

    return bool(defs) and all(empty(d) for d in defs)


def _launch(jobs: list[tuple[str, str]]) -> tuple[list[list[dict[str, Any]]] | None, str]:
    """Run each ``(grade, module text)`` of ``jobs`` on 2 ranks, all in one launch; return (per job, its rank
    results; or None and an error message)."""
    from labkit.dist import LaunchError, LaunchTimeout, launch

    with tempfile.TemporaryDirectory(prefix="labkit-nb11-") as tmp:
        files = []
        for i, (grade, text) in enumerate(jobs):
            path = Path(tmp) / f"nb11_{grade}_{i}.py"
            path.write_text(text)
            files += ["--file", f"{grade}={path}"]
        try:
            res = launch("labkit.recipes.handpar_grade", nproc=2, timeout=120 + 60 * len(jobs), stream=False,
                         args=[*files, "--pg-timeout", "30", "--device", "cpu"])
        except LaunchTimeout:
            return None, _("The ranks did not finish: one of them waited for ever, e.g. a recv without its send, or "
                           "a collective that only one rank calls.")
        except LaunchError as err:
            if "timed out" in (err.log + err.rank_traceback).lower():
                return None, _("A rank waited 30 s for its partner and gave up: a recv whose send never comes (both "
                               "ranks receiving first?), or a collective that only one rank calls. Every send needs "
                               "the matching recv on the other rank, in the same order.")
            last = (err.rank_traceback.strip().splitlines() or [str(err).splitlines()[0]])[-1]
            return None, _("Your code failed on rank {rank}: {error}").format(rank=err.rank, error=last)
    if not res or len(res.get("grades", [])) != len(jobs):
        return None, _("The ranks returned no result.")
    return [g["ranks"] for g in res["grades"]], ""


def _module_text(names: tuple[str, ...], answer: Any) -> str | tuple[bool, str] | None:
    """The module file the ranks run for ``answer``; or, decided without running anything, a ``(False, message)``
    verdict, or None for a stub (not attempted yet)."""
    objs = answer if isinstance(answer, tuple) else (answer,)
    if len(objs) != len(names) or not all(inspect.isfunction(o) or inspect.isclass(o) for o in objs):
        if len(names) == 1:
            return False, _("Pass {name} itself (not its result).").format(name=f"`{names[0]}`")
        return False, _("Pass the pair {first} and {second} itself (not its result).").format(
            first=" and ".join(f"`{n}`" for n in names[:-1]), second=f"`{names[-1]}`")
    if all(_is_stub(o) for o in objs):
        return None
    try:
        text = rank_module(objs[0])
    except (TypeError, ValueError) as exc:
        return False, str(exc)
    tree_names = {n.name for n in ast.parse(text).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    missing = [n for n in names if n not in tree_names]
    if missing:
        return False, FormatSlip(_("The cell must define {names} (with that name): the ranks look it up by "
                                   "name.").format(names=", ".join(missing)))
    return text


def _key(grade: str, text: str) -> tuple[str, str]:
    return grade, hashlib.sha256(text.encode()).hexdigest()


def _grader(grade: str, names: tuple[str, ...], judge: Any) -> Any:
    """A grader: the answer is a function (or a tuple of classes) named ``names``, run on 2 ranks, judged."""

    def run(answer: Any) -> tuple[bool, str] | None:
        text = _module_text(names, answer)
        if not isinstance(text, str):
            return text
        key = _key(grade, text)
        if key not in _CACHE:
            ranks, error = _launch([(grade, text)])
            if ranks is None:
                return False, error  # not remembered: running it again runs it again
            _CACHE[key] = judge(ranks[0])
        return _CACHE[key]

    run.runs_on_ranks = (grade, names, judge)  # type: ignore[attr-defined]  # for prefetch
    return run


def prefetch(answers: Sequence[tuple[str, Any]]) -> int:
    """Grade several answers to this notebook's implement exercises in one torchrun launch and remember the
    verdicts, so that checking those answers afterwards launches nothing: one launch instead of one per answer
    (each costs ~10 s of start-up on 2 cores). ``answers`` holds ``(exercise id, answer)`` pairs.

    Returns how many verdicts it remembered. A stub, an answer decided without running, or one already remembered
    needs no run. If the launch fails (an answer that crashes or hangs a rank takes the whole batch down), nothing
    is remembered and each answer is graded alone when it is checked, with its own message. Used by the tests;
    introduced in notebook 11.
    """
    if isinstance(answers, (str, bytes)) or not isinstance(answers, Sequence):
        raise TypeError(f"answers must be a list of (exercise id, answer) pairs, got {type(answers).__name__}")
    graders = {ex.id: getattr(ex.grade, "runs_on_ranks", None) for ex in EXERCISES}
    jobs: dict[tuple[str, str], tuple[str, Any]] = {}
    for pair in answers:
        if not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], str):
            raise TypeError(f"each answer must be an (exercise id, answer) pair, got {safe_repr(pair)}")
        spec = graders.get(pair[0])
        if spec is None:
            runs = sorted(i for i, g in graders.items() if g is not None)
            raise ValueError(f"exercise id must be one of {runs} (the ones run on ranks), got {pair[0]!r}")
        grade, names, judge = spec
        text = _module_text(names, pair[1])
        if isinstance(text, str) and _key(grade, text) not in _CACHE:
            jobs[_key(grade, text)] = (text, judge)
    if not jobs:
        return 0
    ranks, _error = _launch([(key[0], text) for key, (text, _judge) in jobs.items()])
    if ranks is None:
        return 0
    for (key, (_text, judge)), job_ranks in zip(jobs.items(), ranks):
        _CACHE[key] = judge(job_ranks)
    return len(jobs)


# ---------------------------------------------------------------------------------------------------------
# the judges: rank results -> (ok, message)
# ---------------------------------------------------------------------------------------------------------

def _judge_ddp(ranks: list[dict[str, Any]]) -> tuple[bool, str]:
    r = ranks[0]
    if "returned" in r:
        return False, _("overlap_gradients returned a {type}; return the function that waits (wait).").format(
            type=r["returned"])
    if any(x.get("unwaited") for x in ranks):  # whether or not gloo happened to finish them before the comparison
        n = max(x.get("unwaited", 0) for x in ranks)
        return False, _("{count} all-reduce(s) you started were never waited for: wait() must wait on every work "
                        "object the hooks started. Gloo may finish them in time on a quiet machine; on a GPU, NCCL "
                        "runs them on its own stream, and optimizer.step() would read gradients not yet "
                        "reduced.").format(count=n)
    if all(x["bitwise"] for x in ranks):
        started = min(x["in_backward"] for x in ranks)
        if started == 0:
            return False, _("The gradients equal DDP's, but no all-reduce started while backward was running: that is "
                            "step 1 again. Start each one from a hook (register_post_accumulate_grad_hook) with "
                            "async_op=True, and only wait in wait().")
        if any(x.get("blocking") for x in ranks):
            return False, _("Your code (a hook or wait()) calls a collective without async_op=True: each such call "
                            "blocks backward until that gradient is reduced on every rank, so nothing overlaps (the "
                            "count of all-reduces issued during backward looks right, the timeline does not). Start it "
                            "with async_op=True, keep the work object, and wait for it in wait().")
        if any(x.get("waited_early") for x in ranks):
            return False, _("You wait for an all-reduce before backward has issued the last one (work.wait() inside the "
                            "hook): that blocks backward just like a blocking call. Keep the work objects and wait for "
                            "them all in wait(), after backward.")
        if started < r["n_tensors"]:
            return False, _("Only {started} of the {total} gradients' all-reduces started during backward; the "
                            "others waited until wait(). Register the hook on every parameter.").format(
                started=started, total=r["n_tensors"])
        return True, ""
    ratio = r["ratio"]
    if abs(ratio - 2.0) < 1e-3:
        return False, _("Your gradients are exactly 2× DDP's: you summed them over the 2 ranks instead of averaging. "
                        "Scale each gradient by 1/world size.")
    if abs(ratio - 0.5) < 1e-3:
        return False, _("Your gradients are half of DDP's: you divided by the world size twice.")
    return False, _("Your gradients differ from DDP's (their ratio is {ratio:.3g}, not 1).").format(ratio=ratio)


def _judge_zero1(ranks: list[dict[str, Any]]) -> tuple[bool, str]:
    if all(x["bitwise"] for x in ranks) and len({x["digest"] for x in ranks}) == 1:
        if any(x.get("reduce_scatters") == 0 for x in ranks):
            return False, _("The weights are right, but you never reduce-scattered: all-reducing the whole gradient "
                            "moves twice the bytes a rank needs, since each rank updates only its slice. Use "
                            "dist.reduce_scatter_single.")
        if any(x.get("whole_all_reduces") for x in ranks):
            return False, _("The weights are right, but you all-reduce the whole gradient as well as reduce-scattering "
                            "it: the all-reduce moves twice the bytes a rank needs and makes the reduce-scatter "
                            "pointless. Reduce-scatter only, into this rank's slice.")
        return True, ""
    if any(x["outside_unchanged"] for x in ranks):
        return False, _("Each rank's parameters outside its own slice never change: the updated slices were not "
                        "all-gathered into flat_param.")
    if all(x["summed"] for x in ranks):
        return False, _("Your weights equal AdamW's on the *summed* gradients, not the averaged ones. Adam almost hides "
                        "it (m/√v does not change when the gradients double; only eps does), but DDP and ZeRO average.")
    if len({x["digest"] for x in ranks}) > 1:
        return False, _("The ranks end with different parameters: every rank must receive every updated slice.")
    return False, _("After 3 steps your weights differ from unsharded AdamW's (relative {rel:.2g}).").format(
        rel=ranks[0]["rel"])


def _judge_tp(ranks: list[dict[str, Any]]) -> tuple[bool, str]:
    rel = [x["rel"] for x in ranks]
    bad = sorted({k for r in rel for k, v in r.items() if v is None or v > _TOL})
    if not bad:
        return True, ""
    if "output" in bad:
        return False, _("The output differs from the single-process MLP: g must all-reduce (sum) the row-parallel "
                        "partial outputs in its forward.")
    if bad == ["input"]:
        return False, _("Output and weight gradients are right, but the gradient of the input is only this rank's part: "
                        "f's backward must all-reduce it (each rank's column slice contributes a part).")
    ratios = {k: ranks[0]["ratio"][k] for k in bad}
    if all(v is not None and abs(v - 2.0) < 1e-3 for v in ratios.values()):
        return False, _("Gradients are 2× too large: g's backward must be the identity (its forward already summed), "
                        "only f's backward all-reduces.")
    return False, _("These differ from the single-process MLP: {names}.").format(names=", ".join(bad))


def _gpipe_order(order: str, m: int, stage: int, stages: int) -> str:
    """GPipe's order for one stage: every micro-batch forward, each received just before ("R", except on the first
    stage) and sent on at once ("S", except on the last), then every backward, its gradient received just before
    (except on the last stage) and sent back at once (except on the first). Returns "" where ``order`` is that,
    else what is wrong with it."""
    first, last = stage == 0, stage == stages - 1
    fwd = (("" if first else "R") + "F" + ("" if last else "S")) * m
    bwd = (("" if last else "R") + "B" + ("" if first else "S")) * m
    if order == fwd + bwd:
        return ""
    if order.count("F") != m or order.count("B") != m:
        return _("stage {stage} ran {forwards} forward(s) and {backwards} backward(s) for {m} micro-batches: run "
                 "each micro-batch through the stage separately").format(
            stage=stage, forwards=order.count("F"), backwards=order.count("B"), m=m)
    if order.replace("S", "").replace("R", "") != "F" * m + "B" * m:
        return _("stage {stage} ran {order}: a backward started before every forward was done, so the stages take "
                 "turns instead of working at once. GPipe runs all m forwards, then all m backwards (1F1B interleaves "
                 "them on purpose, with a warm-up; this exercise is GPipe)").format(
            stage=stage, order=" ".join(order.replace("S", "")))
    if order.replace("R", "") != fwd.replace("R", "") + bwd.replace("R", ""):
        return _("stage {stage} sent in this order: {order} (S = a send, R = a receive). Each micro-batch's "
                 "activations (or gradient) must go to the next stage as soon as they exist, or the other stage waits "
                 "for the whole batch and nothing overlaps").format(stage=stage, order=" ".join(order))
    return _("stage {stage} received in this order: {order} (R = a receive, S = a send). Receive each "
             "micro-batch's activations (or gradient) just before the forward (or backward) that needs them: waiting "
             "for all of them first makes this stage idle until the other stage has finished the whole "
             "batch").format(stage=stage, order=" ".join(order))


def _judge_gpipe(ranks: list[dict[str, Any]]) -> tuple[bool, str]:
    if any(x.get("missing_grads") for x in ranks):
        return False, _("Some stage's parameters got no gradient: every stage must run backward for every "
                        "micro-batch.")
    for i, x in enumerate(ranks):
        why = _gpipe_order(x["order"], x.get("m", 4), i, len(ranks)) if "order" in x else ""
        if why:
            return False, _("The numbers may be right, but {why}.").format(why=why)
    last = ranks[-1]
    if last["loss_rel"] is None:
        return False, _("The last stage must return the mean loss (a float).")
    if all(x["grad_rel"] <= _TOL for x in ranks) and last["loss_rel"] <= _TOL:
        return True, ""
    m = last["m"]
    if all(abs(x["ratio"] - m) < 1e-3 * m and abs(x["ratio_max"] - m) < 1e-3 * m for x in ranks):
        return False, _("Gradients are {m}× too large with {m} micro-batches: divide each micro-batch's loss by m, "
                        "so that they add up to the mean over the whole batch.").format(m=m)
    return False, _("Loss or gradients differ from the single-process model (relative {loss_rel:.2g} and "
                    "{grad_rel:.2g}).").format(loss_rel=last["loss_rel"], grad_rel=max(x["grad_rel"] for x in ranks))


# ---------------------------------------------------------------------------------------------------------
# the predict exercise
# ---------------------------------------------------------------------------------------------------------

#: What the predict exercise asks (the notebook prints it).
PREDICT_SETUP = ("MLP 64 -> 256 -> 256 -> 256 -> 1: 8 tensors of 16384, 256, 65536, 256, 65536, 256, 256 and 1 "
                 "elements (fp32, 148,481 in all). Buckets of 0.25 MiB (65,536 elements) for the bucketed version; "
                 "torch DDP with its defaults. All-reduce calls per step?")
_COUNTS = {"naive": 8, "bucketed": 3, "ddp": 1}


def _grade_predict(answer: Any) -> tuple[bool, str]:
    if not (isinstance(answer, tuple) and len(answer) == 2):
        return False, FormatSlip(_("reveal() passes (prediction, result); give the prediction as a dict."))
    pred, result = answer
    if not isinstance(pred, dict) or set(pred) != set(_COUNTS):
        return False, FormatSlip(_("Predict a dict with the keys 'naive', 'bucketed' and 'ddp': all-reduce "
                                   "calls per step."))
    counts = {k: as_number(v) for k, v in pred.items()}
    if any(c is None or not math.isfinite(c) or c < 0 or c != int(c) for c in counts.values()):
        return False, FormatSlip(_("Each value is a whole number of all-reduce calls, such as 5 (not text)."))
    pred = {k: int(c) for k, c in counts.items()}
    if not isinstance(result, dict):
        return False, FormatSlip(_("The measured result should be a dict of calls per step."))
    got = {k: result.get(k) for k in _COUNTS}
    lines = []
    why = {"naive": _("one per tensor, after backward"),
                      "bucketed": _("buckets close at 65,536 elements or more, filled from the last layer back: "
                      "[1+256+256+65536], [256+65536], [256+16384]"),
           "ddp": _("DDP's first bucket holds up to 1 MiB and the whole model is 594 KB: a single bucket")}
    for k in ("naive", "bucketed", "ddp"):
        mark = "=" if pred[k] == got[k] else "≠"
        lines.append(_("{key}: you said {said!r} {mark} measured {measured} ({why})").format(
            key=k, said=pred[k], mark=mark, measured=got[k], why=why[k]))
    ok = all(pred[k] == got[k] for k in _COUNTS)
    return ok, " | ".join(lines)


def _measure_allreduce_calls() -> Any:
    """All-reduce calls per step of each DDP version in the last by-hand run rank 0 reported to labkit.dist.launch
    (the experiment of 11.allreduce-count); NOT_MEASURED before that launch has run in this kernel."""
    from labkit.dist import _last_result

    res = _last_result("labkit.recipes.handpar", lambda nproc, argv, res: nproc == 2 and "ddp" in res)
    if res is None:
        return NOT_MEASURED
    return {k: res["ddp"]["collectives"][k]["all_reduce"]["calls"] for k in ("naive", "overlap", "bucketed", "ddp")}


EXERCISES = [
    Exercise(
        "11.ddp-overlap",
        "Write overlap_gradients(model): hooks that start each gradient's all-reduce as soon as backward produces it; "
        "return wait(), which waits for them all. Gradients must equal torch DDP's bit for bit.",
        _grader("ddp", ("overlap_gradients",), _judge_ddp),
        "Which hook on a parameter fires right after its gradient is complete, and how do you start an all-reduce "
        "without waiting for it?",
        success="Bitwise equal to torch DDP on 2 ranks, with communication started during backward.",
        reference=_hp.overlap_gradients,
        wrong=_mistake.overlap_gradients,
        method="Two halves. During backward, a hook on each parameter fires as soon as its gradient is complete "
               "(torch has a parameter hook for exactly that) and starts the gradient's all-reduce without blocking, "
               "keeping the handle it gets back. After backward, wait() blocks on every handle. And the gradient "
               "must end up as DDP's: the mean over the ranks, not their sum.",
        solution="world = dist.get_world_size(); pending = []\n"
                 "def hook(p): p.grad.mul_(1.0 / world); pending.append(dist.all_reduce(p.grad, async_op=True))\n"
                 "for p in model.parameters(): p.register_post_accumulate_grad_hook(hook)\n"
                 "def wait():\n    for w in pending: w.wait()\n    pending.clear()\nreturn wait",
        kind="implement",
        wrong_why="Summing the gradients (all-reduce without scaling by 1/world) gives world × the gradient DDP uses: "
                  "every rank steps as if the learning rate were world times larger.",
    ),
    Exercise(
        "11.zero1-step",
        "Write zero1_step(flat_param, flat_grad, shard, optimizer): reduce-scatter the averaged gradients, step this "
        "rank's shard, all-gather the updated shards into flat_param. After 3 steps the weights must equal unsharded "
        "AdamW's, bit for bit.",
        _grader("zero1", ("zero1_step",), _judge_zero1),
        "Two collectives around a local step: what does each rank need to *receive* before its optimizer step, and what "
        "must every rank have after it?",
        success="Bitwise equal to AdamW on the whole model, with AdamW states for half the parameters per rank.",
        reference=_hp.zero1_step,
        wrong=_mistake.zero1_step,
        method="Follow one step's data. Each rank needs only its own slice of the averaged gradient: one "
               "collective reduces and slices at once (torch.distributed has *_single versions for flat tensors). "
               "The optimizer reads .grad of the shard it was given. After its step, every rank needs every "
               "updated slice back in flat_param: the opposite collective.",
        solution="world = dist.get_world_size()\ngrad_shard = torch.empty_like(shard)\n"
                 "dist.reduce_scatter_single(grad_shard, flat_grad.mul(1.0 / world))\nshard.grad = grad_shard\n"
                 "optimizer.step()\ndist.all_gather_single(flat_param, shard.detach())",
        kind="implement",
        wrong_why="Without the all-gather each rank only updates its own slice of flat_param: the rest of the model "
                  "stays at its initial values on that rank, and the ranks no longer agree.",
    ),
    Exercise(
        "11.tp-conjugates",
        "Write Megatron's conjugate operators as torch.autograd.Function classes: CopyToTP (f: identity forward, "
        "all-reduce backward) and ReduceFromTP (g: all-reduce forward, identity backward). Pass the pair.",
        _grader("tp", ("CopyToTP", "ReduceFromTP"), _judge_tp),
        "Where does each rank hold only a *part* of a sum: in the output of the row-parallel layer, and in the "
        "gradient of the input that both column slices read?",
        success="Output and every gradient, the input's included, equal the single-process MLP to fp32 tolerance.",
        reference=(_hp.CopyToTP,
                   _hp.ReduceFromTP),
        wrong=(_mistake.CopyToTP,
               _mistake.ReduceFromTP),
        method="Both are torch.autograd.Function classes with static forward(ctx, x) and backward(ctx, grad). For "
               "each class and each direction decide: identity, or a sum over the ranks? Mind that "
               "dist.all_reduce works in place, on a tensor autograd may still need.",
        solution="class CopyToTP(torch.autograd.Function):\n    forward: return x\n"
                 "    backward: grad = grad.clone(); dist.all_reduce(grad); return grad\n"
                 "class ReduceFromTP(torch.autograd.Function):\n    forward: x = x.clone(); dist.all_reduce(x); "
                 "return x\n    backward: return grad",
        kind="implement",
        wrong_why="If f's backward forgets its all-reduce, the weights' gradients are still right but the gradient of "
                  "the input is only this rank's part: every layer before the MLP then learns from half a gradient.",
    ),
    Exercise(
        "11.gpipe",
        "Write gpipe_step(stage, inputs, targets, loss_fn, act_shape): GPipe on 2 ranks, all micro-batch forwards "
        "(send activations on) then all backwards (send gradients back). Loss and gradients must equal one process.",
        _grader("gpipe", ("gpipe_step",), _judge_gpipe),
        "Stage 1 cannot start a micro-batch before stage 0 sends it, and stage 0 cannot run backward before stage 1 "
        "sends the gradient of its output. What does the loss of one micro-batch stand for in the whole batch?",
        success="The same loss and gradients as the whole model on the whole batch, to fp32 rounding.",
        reference=_hp.gpipe_step,
        wrong=_mistake.gpipe_step,
        method="Each rank counts the micro-batches from its own list. Forward loop: rank 0 runs its stage and "
               "sends each activation; rank 1 receives it into a fresh tensor of act_shape (with its stage's device "
               "and dtype), makes it require grad so that a gradient can go back, and computes that micro-batch's "
               "share of the whole batch's loss. Backward loop: rank 1 backpropagates and sends the received "
               "activation's gradient; rank 0 receives it and backpropagates its own output with it.",
        solution="See labkit.handpar.gpipe_step: two loops over the micro-batches; dist.send/dist.recv (or isend) "
                 "between them; the last stage divides each micro-batch loss by m and returns their sum.",
        kind="implement",
        wrong_why="Summing the micro-batch losses (no 1/m) makes every gradient m times the full-batch gradient, so "
                  "the effective learning rate changes with the number of micro-batches.",
    ),
    Exercise(
        "11.allreduce-count",
        "Predict the all-reduce calls per training step of naive DDP, the bucketed version and torch DDP. "
        + PREDICT_SETUP,
        _grade_predict,
        "Naive sends each tensor on its own; buckets group tensors up to a size; DDP's first bucket is 1 MiB.",
        success="Calls counted, not bytes: every variant all-reduces the same 148,481 elements per step.",
        reference=(dict(_COUNTS), {"naive": 8, "overlap": 8, "bucketed": 3, "ddp": 1}),
        wrong=({"naive": 8, "bucketed": 3, "ddp": 8}, {"naive": 8, "overlap": 8, "bucketed": 3, "ddp": 1}),
        method="Fill buckets from the last tensor backwards (the order gradients arrive) and close a bucket once it "
               "holds 65,536 elements or more. For DDP, compare the model's 594 KB with its 1 MiB first bucket.",
        solution="naive 8 (one per tensor), bucketed 3 ([b3 w3 b2 w2], [b1 w1], [b0 w0]), DDP 1 (one bucket).",
        kind="predict",
        wrong_why="torch DDP does not all-reduce tensor by tensor: it copies gradients into buckets (the first up to "
                  "1 MiB, then 25 MiB) and sends each bucket once; a small model is a single call.",
        measure=_measure_allreduce_calls,
    ),
]
