"""The clinic's one table: every case with its script, symptom, candidate causes, fix, typical wrong fix and grader.

Adding a case means adding a :class:`Case` row here and a script in :mod:`labkit.clinic.cases` (a ``CONFIG`` dict,
a ``CHOICES`` dict for settings that stand for lines of code, the training code, a ``main`` that prints its evidence
with :func:`labkit.clinic._script.finish`). The row's title is the symptom, never the cause; its right option is as
short as the others; its ``job`` lists the settings no fix may change; ``tests/test_clinic.py`` checks all three and
holds at least three non-fixes per case. The row's
``detect`` reads a :class:`~labkit.clinic.runner.CaseRun` and says whether the symptom is there; the exercises of
notebook 13 (``labkit.exercises.nb13``) are generated from the rows, and ``tests/test_clinic.py`` runs every row's
broken run, reference fix and typical wrong fix.

Introduced in notebook 13.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from labkit.i18n import N_
from labkit.i18n import gettext as _

__all__ = ["CASES", "LOADER_WAIT_LIMIT", "LR_RATIO_LIMIT", "TP_REL_LIMIT", "Case", "Cause", "Finding", "lr_ratio"]


@dataclass(frozen=True)
class Finding:
    """What a case's detector concluded from one run: is the symptom there, and a one-line reason.

    ``summary`` holds no measured number that depends on the machine (it is printed by graders, in stored
    notebook outputs), and is in the learner's language (the detector translates it). Introduced in notebook 13.
    """

    present: bool
    summary: str


@dataclass(frozen=True)
class Cause:
    """One candidate cause: its text, and why the evidence supports it (the right one) or rules it out.

    Introduced in notebook 13.
    """

    text: str
    why: str


@dataclass(frozen=True)
class Case:
    """One row of the clinic: a broken run, what it shows, why, and the one-setting fix.

    ``script`` is the case module's name under ``labkit.clinic.cases``; ``show`` the names of its functions the
    notebook prints; ``nproc`` 1 (a plain process) or 2 (gloo ranks under torchrun); ``timeout_s`` the runner's
    limit for one run. ``causes`` are the candidates the learner picks from (``answer`` is the index of the right
    one, ``trap`` the index of the most tempting wrong one); ``fix`` the reference fix and ``wrong_fix`` a typical
    wrong one, each a dict of one setting of the script's ``CONFIG``; ``job`` the settings no fix may change.
    ``detect`` grades a run. ``seed`` names what the case teaches from the source articles. The texts a learner
    reads (the title, symptom, causes, hints, methods, ``fix_why`` and ``wrong_fix_why``) are the English messages,
    marked with ``N_``: whatever shows them translates them (:mod:`labkit.clinic.runner`, :mod:`labkit.check`).

    Introduced in notebook 13.
    """

    key: str
    number: int
    title: str
    script: str
    show: tuple[str, ...]
    nproc: int
    timeout_s: float
    symptom: str
    causes: tuple[Cause, ...]
    answer: int
    trap: int
    cause_hint: str
    cause_method: str
    fix: dict[str, Any]
    fix_why: str
    fix_hint: str
    fix_method: str
    wrong_fix: dict[str, Any]
    wrong_fix_why: str
    detect: Callable[[Any], Finding]
    seed: str
    #: The settings that define the job the run must still do (its steps, data, precision, tuned values): a fix
    #: that changes one of them avoids the failure instead of curing it, and is refused without a run.
    job: tuple[str, ...] = ()

    @property
    def letter(self) -> str:
        """The letter of the right cause ("a", "b", ...)."""
        return "abcdefgh"[self.answer]

    @property
    def module(self) -> str:
        """The script's full module name."""
        return f"labkit.clinic.cases.{self.script}"


# --------------------------------------------------------------------------------------------------
# Detectors: a run (labkit.clinic.runner.CaseRun) in, a Finding out
# --------------------------------------------------------------------------------------------------

#: What a detector says of a run with no result, by what the run did not get to: (stopped at the runner's
#: timeout, failed). One whole sentence each, for the translators.
_NO_RESULT = {
    "it finished": (N_("the run was stopped at the runner's timeout before it finished"),
                    N_("the run failed before it finished")),
    "the runs could compare notes": (N_("the run was stopped at the runner's timeout before the runs could compare "
                                        "notes"),
                                     N_("the run failed before the runs could compare notes")),
    "the ranks met": (N_("the run was stopped at the runner's timeout before the ranks met"),
                      N_("the run failed before the ranks met")),
    "it trained": (N_("the run was stopped at the runner's timeout before it trained"),
                   N_("the run failed before it trained")),
    "the epoch ended": (N_("the run was stopped at the runner's timeout before the epoch ended"),
                        N_("the run failed before the epoch ended")),
    "it exported": (N_("the run was stopped at the runner's timeout before it exported"),
                    N_("the run failed before it exported")),
}


def _no_result(run: Any, what: str) -> Finding | None:
    if run.result is None:
        stopped, failed = _NO_RESULT[what]
        return Finding(True, _(stopped if run.timed_out else failed))
    return None


def _clip(run: Any) -> Finding:
    bad = _no_result(run, "it finished")
    if bad:
        return bad
    loss, saw = run.result["loss"], run.result["clip_saw"]
    stuck = loss[-1] > 0.9 * loss[0]
    scaled = statistics.median(saw) > 1000.0  # the true gradient norm here is about 1; scaled, tens of thousands
    if scaled and stuck:
        return Finding(True, _("clip_grad_norm_ still measures the scaled gradients (tens of thousands, for a true "
                               "norm near 1), and the loss is stuck"))
    if scaled:
        return Finding(True, _("clip_grad_norm_ still measures the scaled gradients (tens of thousands, for a true "
                               "norm near 1)"))
    if stuck:
        return Finding(True, _("the loss is still stuck"))
    return Finding(False, _("clip_grad_norm_ measures the true gradients and the loss falls"))


def _noscale(run: Any) -> Finding:
    bad = _no_result(run, "it finished")
    if bad:
        return bad
    loss = run.result["loss"]
    if run.result.get("config", {}).get("precision") == "fp32":
        return Finding(True, _("fp32 leaves 16-bit training instead of fixing it: the job is to train in 16 bits"))
    if not loss[-1] < 0.9 * loss[0]:
        if run.result["zero_grads"][-1] == 1.0:
            return Finding(True, _("the loss is stuck: every gradient is exactly 0"))
        return Finding(True, _("the loss is stuck"))
    return Finding(False, _("the gradients survive and the loss falls"))


def _softmax(run: Any) -> Finding:
    bad = _no_result(run, "it finished")
    if bad:
        return bad
    if any(v != v or v in (float("inf"), float("-inf")) for v in run.result["loss"]):
        return Finding(True, _("the loss is still NaN"))
    return Finding(False, _("the loss is finite at every step"))


def _scaler_ckpt(run: Any) -> Finding:
    bad = _no_result(run, "it finished")
    if bad:
        return bad
    r = run.result
    at = r["config"]["resume_at"]
    extra = sum(r["resumed"]["skipped"][at:]) - sum(r["reference"]["skipped"][at:])
    if extra > 0:
        return Finding(True, _("after the resume the run skips steps that the uninterrupted run took"))
    if r["resumed_digest"] != r["reference_digest"]:
        return Finding(True, _("the resumed run ends with other weights than the uninterrupted one"))
    return Finding(False, _("the resumed run goes on exactly as the uninterrupted one: the same weights, bit for bit"))


def _graph(run: Any) -> Finding:
    bad = _no_result(run, "it finished")
    if bad:
        return bad
    if run.result["graph_mb"][-1] > 0:
        return Finding(True, _("val_total still holds the autograd graphs of every validation step, so memory grows "
                               "with every step"))
    return Finding(False, _("val_total holds no graph: memory stays flat"))


#: A step starves when it waits in ``next(loader)`` longer than this fraction of what reading its batch took (medians).
LOADER_WAIT_LIMIT = 0.5


def _loader(run: Any) -> Finding:
    bad = _no_result(run, "it finished")
    if bad:
        return bad
    r = run.result
    if statistics.median(r["wait_s"]) > LOADER_WAIT_LIMIT * statistics.median(r["read_s"]):
        return Finding(True, _("every step still waits in next(loader) for a good part of the time it takes to read a "
                               "whole batch"))
    return Finding(False, _("the steps wait for data less than half of what reading a batch takes: the batches are "
                            "read ahead"))


def _repro(run: Any) -> Finding:
    bad = _no_result(run, "the runs could compare notes")
    if bad:
        return bad
    runs = run.result["runs"]
    if len({r["final_digest"] for r in runs}) > 1:
        if len({tuple(r["order"]) for r in runs}) == 1:
            return Finding(True, _("the two runs still end with different weights"))
        return Finding(True, _("the two runs still end with different weights, after seeing the shards in different "
                               "orders"))
    return Finding(False, _("both runs end with the same weights, bit for bit"))


def _rdzv(run: Any) -> Finding:
    if run.result is None:
        said = run.error + "\n" + run.log  # every rank's error, not only the first one's
        if "connect" in said and "timed out" in said:
            return Finding(True, _("the ranks still cannot reach the rendezvous store: they time out connecting"))
        return _no_result(run, "the ranks met") or Finding(True, "")
    return Finding(False, _("both ranks joined the group and all-reduced"))


def _hang(run: Any) -> Finding:
    if run.result is None:
        if run.timed_out:
            return Finding(True, _("the ranks still wait for each other: the runner stopped the run at its timeout"))
        said = run.error + "\n" + run.log  # every rank's error: the one that failed first may be a consequence
        if "mismatch between collectives" in said:
            return Finding(True, _("the ranks call different collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL caught it)"))
        if "Timed out" in said or "timed out" in said:
            return Finding(True, _("the ranks still wait for each other until the process-group timeout"))
        return _no_result(run, "it finished") or Finding(True, "")
    if run.result["checkpoints"] < 1:
        return Finding(True, _("the run finished without writing a checkpoint: the hang was avoided, not fixed"))
    return Finding(False, _("every rank finished, checkpoints included"))


def _ds_batch(run: Any) -> Finding:
    if run.result is None:
        if "train_batch_size is not equal to" in run.error:
            return Finding(True, _("DeepSpeed still refuses the batch settings: they do not multiply out"))
        return _no_result(run, "it trained") or Finding(True, "")
    return Finding(False, _("DeepSpeed accepted the batch settings and trained"))


#: The 2-rank run may end this much above the 1-GPU run (same number of examples) and count as "the same curve".
LR_RATIO_LIMIT = 1.3


def lr_ratio(run: Any) -> float:
    """The 2-rank run's final loss over the 1-GPU run's, at the same number of examples (a finished "lr" run).

    Introduced in notebook 13.
    """
    result = getattr(run, "result", None)
    if getattr(run, "key", None) != "lr" or not isinstance(result, dict):
        raise TypeError("run must be a finished run of the 'lr' case (labkit.clinic.run_case('lr'))")
    curve, one = result.get("curve"), result.get("one_gpu")
    if not (isinstance(curve, list) and isinstance(one, list) and curve and one and one[-1] > 0):
        raise ValueError("the run's result holds no loss curves to compare")
    return float(curve[-1] / one[-1])


def _lr(run: Any) -> Finding:
    bad = _no_result(run, "it finished")
    if bad:
        return bad
    curve = run.result["curve"]
    if not all(math.isfinite(v) for v in curve):
        return Finding(True, _("the 2-rank run diverged: its loss is not finite"))
    if lr_ratio(run) > LR_RATIO_LIMIT:
        return Finding(True, _("after as many examples as the 1-GPU run, the 2-rank run's loss is still clearly higher"))
    return Finding(False, _("after as many examples, the 2-rank run's loss is as low as the 1-GPU run's"))


def _said(run: Any) -> str:
    return run.error + "\n" + run.log  # every rank's error: the one that failed first may be a consequence


def _uneven(run: Any) -> Finding:
    if run.result is None:
        if run.timed_out or "Timed out" in _said(run) or "timed out" in _said(run):
            return Finding(True, _("one rank still waits in a collective that the other, out of batches, never calls"))
        return _no_result(run, "the epoch ended") or Finding(True, "")
    cfg = run.result["config"]
    cut = cfg["examples"] * 5 // 9
    want = [-(-cut // cfg["batch"]), -(-(cfg["examples"] - cut) // cfg["batch"])]
    if run.result["steps"] != want:
        return Finding(True, _("the epoch ended without training on every batch of both shards"))
    return Finding(False, _("both ranks trained on every batch of their shard and the epoch ended"))


def _unused(run: Any) -> Finding:
    if run.result is None:
        if "Expected to have finished reduction" in _said(run):
            return Finding(True, _("DDP still waits for a gradient of every parameter, and one head never gets one"))
        return _no_result(run, "it trained") or Finding(True, "")
    return Finding(False, _("DDP trained every step"))


#: The input layer of the tensor-parallel case may differ from the 1-process run's by this much (relative).
TP_REL_LIMIT = 1e-5


def _tp(run: Any) -> Finding:
    bad = _no_result(run, "it finished")
    if bad:
        return bad
    if max(run.result["input_layer_rel_diff"]) > TP_REL_LIMIT:
        return Finding(True, _("the layer in front of the tensor-parallel block still ends with other weights than in "
                               "the 1-process run, though the loss fell as it should"))
    return Finding(False, _("every rank's input layer ends with the 1-process run's weights"))


def _ifname(run: Any) -> Finding:
    if run.result is None:
        if "Unable to find address" in _said(run):
            return Finding(True, _("gloo still finds no network interface of that name on this machine"))
        return _no_result(run, "the ranks met") or Finding(True, "")
    return Finding(False, _("the ranks met over the interface they share and all-reduced"))


def _zero3(run: Any) -> Finding:
    bad = _no_result(run, "it exported")
    if bad:
        return bad
    r = run.result
    if "load_error" in r:
        return Finding(True, _("the exported file still holds empty tensors, which the plain model cannot load"))
    if abs(r["loaded_loss"] - r["trained_loss"]) > 1e-5 * max(1.0, abs(r["trained_loss"])):
        return Finding(True, _("the model loaded from the file is not the trained one: its loss differs"))
    return Finding(False, _("the exported weights load into a plain model and give the trained model's loss"))


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------

_ROWS = (
    Case(
        key="clip", number=1, title=N_("The loss does not move"), script="clip_before_unscale",
        show=("train",), nproc=1, timeout_s=60,
        symptom=N_("fp16 with a GradScaler and clipping at 1.0: the loss does not move; the clip saw norms of tens of "
                   "thousands"),
        causes=(
            Cause(N_('The clip sees scaled gradients.'),
                  N_('clip_grad_norm_ runs on the scaled gradients, before scaler.unscale_: it sees the norm times the'
                     ' loss scale, clips that to 1.0, and the true gradients end up tens of thousands of times too '
                     'small. The clip saw 65536 x the true norm; after scaler.step unscales, the update is tiny.')),
            Cause(N_("The learning rate is too small for SGD."),
                  N_("The learning rate is the recipe's. Look at the norm the clip saw: tens of thousands for a model "
                     "whose loss is below 1. Those are scaled gradients, and the clip shrinks them.")),
            Cause(N_("fp16 gradients underflow to zero."),
                  N_("Then the clip would have seen a small or zero norm, not tens of thousands, and the scaler "
                     "would have nothing to do with it.")),
            Cause(N_("max_norm = 1.0 is too tight."),
                  N_("The true gradient norm is below 1: clipping the true gradients at 1.0 would change nothing. "
                     "What is wrong is what the clip measures.")),
        ),
        answer=0, trap=3,
        cause_hint=N_("Compare the norm the clip saw with the loss scale printed on the same line."),
        cause_method=N_("After scaler.scale(loss).backward(), every .grad is multiplied by the scale. Which line of the "
                        "loop divides it back, and does it run before or after clip_grad_norm_?"),
        fix={"after_backward": "scaler.unscale_, clip_grad_norm_, scaler.step"},
        fix_why=N_("scaler.unscale_(opt) before clip_grad_norm_ makes the clip measure the true gradients; scaler.step "
                   "then knows they are unscaled and does not divide again. Anything that reads gradients (clipping, a "
                   "norm you log, a check for NaN) belongs after unscale_."),
        fix_hint=N_("One line has to run before clip_grad_norm_."),
        fix_method=N_("after_backward lists the lines that run after backward, in order; CHOICES lists the orders."),
        wrong_fix={"max_norm": 10.0},
        wrong_fix_why=N_("A looser max_norm still clips the scaled norm (tens of thousands) down to 10: the true "
                         "gradients still shrink by thousands. The clip must see unscaled gradients."),
        job=('steps', 'lr'),
        detect=_clip,
        seed="000 §4.1 and §5.3: the AMP recipe's order, clipping after unscale_ (scale, backward, unscale_, clip, "
             "step, update)",
    ),
    Case(
        key="noscale", number=2, title=N_("A loss frozen from the first step"), script="fp16_no_scaler",
        show=("train",), nproc=1, timeout_s=60,
        symptom=N_("fp16 autocast, no scaler: the loss is the same at every step and every gradient is exactly 0"),
        causes=(
            Cause(N_("The learning rate is too low."),
                  N_("A low learning rate still moves the weights a little. Here every gradient is exactly 0, so no "
                     "learning rate can move them.")),
            Cause(N_("The zero-initialised last layer blocks every gradient."),
                  N_("A zero last layer only blocks the gradient to the layers below it. Its own gradient, the output "
                     "gradient times the hidden activations, is not zero, yet it is 0 here too.")),
            Cause(N_("The data loader returns the same batch every step."),
                  N_("Training on one batch over and over still gives non-zero gradients and a falling loss; these "
                     "gradients are exactly 0.")),
            Cause(N_('The gradients underflow to zero in fp16.'),
                  N_("The gradients are below fp16's smallest subnormal (about 6e-8) and flush to zero: the loss is a "
                     'few times 1e-9, averaged over 128 x 256 outputs, and nothing scales it up before backward. '
                     'Exactly 0 everywhere, from the first step: the gradient of the output, 2(pred - y)/N, is at most'
                     ' about 2e-8, less than half the smallest subnormal, and rounds to 0 when it is cast to fp16.')),
        ),
        answer=3, trap=0,
        cause_hint=N_("'Exactly 0' is a strong word. Which formats have a smallest representable magnitude, and what is "
                      "fp16's?"),
        cause_method=N_("Estimate the gradient of the output: a loss of about 1e-9 is a mean over 128 x 256 values; "
                        "dL/dpred = 2(pred - y)/N. Compare it with 2^-24."),
        fix={"scaler_enabled": True},
        fix_why=N_("A GradScaler multiplies the loss by 65536 before backward, which lifts every gradient into fp16's "
                   "range, and divides the fp32 gradients back before the step. (bf16, with fp32's range, also works.) "
                   "'Exactly 0' was the tell: rounding makes values wrong, underflow makes them vanish."),
        fix_hint=N_("The gradients need to be bigger while they are fp16, and the right size when the optimizer uses them."),
        fix_method=N_("That is what notebook 03's loss scaling does; the script builds its GradScaler from CONFIG."),
        wrong_fix={"lr": 5.0},
        wrong_fix_why=N_("Ten times zero is zero: every gradient is still exactly 0, so the weights never move. Scale "
                         "the loss before backward (a GradScaler), or train in bf16."),
        job=('steps',),
        detect=_noscale,
        seed="000 §3.1 and §3.3, 002 §2.1: fp16's narrow range, underflow of small gradients, loss scaling",
    ),
    Case(
        key="softmax", number=3, title=N_("NaN from the first step of a fine-tune"), script="softmax_overflow",
        show=("train",), nproc=1, timeout_s=60,
        symptom=N_("fp16 fine-tuning of a tiny GPT: the loss is NaN from the first step and the loss scale halves every "
                   "step"),
        causes=(
            Cause(N_("The GradScaler's initial scale (65536) overflows the gradients."),
                  N_("The loss is already NaN in the forward pass, before any scaling or backward; the scale only "
                     "halves because every step is then skipped.")),
            Cause(N_('exp overflows fp16 in the attention.'),
                  N_("The hand-written softmax in blocks.0.attn's forward: exp of attention logits of about 26 "
                     'overflows fp16 (whose largest value, 65504, is e^11.09), and inf / inf is NaN. '
                     'blocks.0.attn.proj is the first module with a NaN output and its input was already NaN: the code'
                     " before it in blocks.0.attn's forward (scores, softmax, @ v) made it, and the logits there "
                     'exceed 11.09.')),
            Cause(N_("The token embedding produces inf."),
                  N_("first_nonfinite would then name the embedding, which runs first. It names blocks.0.attn.proj, "
                     "whose inputs were already non-finite: the bad values come from blocks.0.attn's own code.")),
            Cause(N_("The learning rate makes the weights diverge."),
                  N_("The loss is NaN at step 0, before the first update.")),
        ),
        answer=1, trap=0,
        cause_hint=N_("Start from the first_nonfinite line: which module, and were its inputs finite?"),
        cause_method=N_("Inputs already non-finite means the code *between* modules made the NaN: the parent's forward "
                        "(CausalSelfAttention). Compare the largest attention logit with log(65504)."),
        fix={"softmax": "fp32"},
        fix_why=N_("An fp32 island for the softmax (autocast off, upcast, subtract the max, cast back) cannot overflow: "
                   "the seed article's fix. 'stable' (subtract the row maximum first) works too. On a GPU, CUDA autocast "
                   "runs exp in fp32 and would hide this bug, but a model cast to fp16 (model.half()), a fused fp16 "
                   "kernel or an fp16 inference engine does not: the seed article's custom attention blew up on GPUs."),
        fix_hint=N_("The softmax needs either more range or smaller arguments to exp."),
        fix_method=N_("The script's CONFIG names the softmax implementation; labkit.models.SOFTMAX_IMPLS lists the "
                      "choices (notebook 04)."),
        wrong_fix={"init_scale": 1024.0},
        wrong_fix_why=N_("The NaN is made in the forward pass, by exp(26) in fp16; the loss scale only acts in the "
                         "backward pass. A smaller starting scale only changes the value the backoff starts from."),
        job=('steps', 'lr'),
        detect=_softmax,
        seed="000 §5.3 (the custom attention whose fp16 softmax blew up; softmax in fp32), 002 §6.1 (NaN loss, "
             "reduce ops in fp32, locating the layer)",
    ),
    Case(
        key="scaler-ckpt", number=4, title=N_("A resumed job that skips steps"), script="scaler_checkpoint",
        show=("save", "resume"), nproc=1, timeout_s=60,
        symptom=N_("a resumed fp16 run skips steps right after the resume that the uninterrupted run took, and ends "
                   "elsewhere"),
        causes=(
            Cause(N_("The GradScaler's state was left out of the checkpoint."),
                  N_("So the new job starts again at 65536, overflows, "
                     'and skips steps until it has backed off to where the old run was. The log says it: the resumed job reports '
                     'loss scale 65536, while the run had reached 2048; the skipped steps are the scaler backing off '
                     'again.')),
            Cause(N_("The batches after the resume differ from the uninterrupted run's."),
                  N_("The batch of a step is a pure function of the step number (labkit.data.Batches), and a "
                     "different batch would not skip a step either.")),
            Cause(N_("The optimizer state (AdamW's moments) was not saved."),
                  N_("It was: the checkpoint holds opt.state_dict(). And missing moments would not make steps be "
                     "skipped.")),
            Cause(N_("The RNG state was not saved."),
                  N_("Nothing random happens after the model is built: no dropout, and the batches come from the step "
                     "number.")),
        ),
        answer=0, trap=2,
        cause_hint=N_("Read the line the script prints when it resumes."),
        cause_method=N_("Skipped steps are the scaler's doing: it skips when the scaled gradients overflow. What was "
                        "the scale before the stop, and after the resume?"),
        fix={"checkpoint_keys": "model, optimizer, step, scaler"},
        fix_why=N_("scaler.state_dict() (scale and growth tracker) in the checkpoint, loaded on resume: the resumed run "
                   "is then the uninterrupted run, bit for bit. A checkpoint is everything the next step depends on: "
                   "weights, optimizer state, the step, the scaler, and the RNG and data position when they matter."),
        fix_hint=N_("What does the job that resumes not know?"),
        fix_method=N_("Look at what save() writes and resume() reads; one object of the training loop is missing."),
        wrong_fix={"checkpoint_keys": "model, optimizer, step, rng"},
        wrong_fix_why=N_("Nothing after the resume draws random numbers; the skipped steps come from the loss scale "
                         "starting again at 65536."),
        job=('steps', 'resume_at', 'lr'),
        detect=_scaler_ckpt,
        seed="000 §3.3 (GradScaler's dynamic scale), 004 §7 (checkpoints and resume), notebook 04's checkpoints",
    ),
    Case(
        key="graph", number=5, title=N_("Memory that grows every step"), script="loss_graph",
        show=("train",), nproc=1, timeout_s=60,
        symptom=N_("memory grows by a few MiB with every step, and never comes back"),
        causes=(
            Cause(N_("AdamW's moments grow every step."),
                  N_("Optimizer state is allocated once, at the first step, and keeps its size.")),
            Cause(N_("The allocator keeps freed memory for reuse."),
                  N_("Memory kept for reuse is reused, so it would level off. And the script measures, exactly, the "
                     "bytes that the graph behind val_total holds: they grow with every step.")),
            Cause(N_("The training batches get larger."),
                  N_("The training batch is fixed at 128 examples.")),
            Cause(N_('The validation sum keeps each graph.'),
                  N_("val_total += val_loss keeps every step's validation graph, with its activations, alive: val_loss"
                     ' was computed with autograd on, and the sum chains the graphs together. The bytes held by the '
                     'graph behind val_total grow by the activations of one validation batch per step.')),
        ),
        answer=3, trap=1,
        cause_hint=N_("Which object lives from the first step to the last?"),
        cause_method=N_("A tensor computed with autograd on keeps its graph as long as it lives; what does "
                        "val_total + val_loss hold on to?"),
        fix={"val_accumulate": "val_total += val_loss.item()"},
        fix_why=N_("val_loss.item() is a Python float: it holds no graph. (Evaluating under torch.no_grad() builds no "
                   "graph at all, and is the better habit for validation.)"),
        fix_hint=N_("Log a number, not a tensor."),
        fix_method=N_("val_accumulate is the line that adds to the running total; CHOICES lists the ways to write it."),
        wrong_fix={"gc_every_step": True},
        wrong_fix_why=N_("gc.collect() frees only unreachable objects; every graph is still reachable from val_total. "
                         "Keep a Python number (.item()), or evaluate under torch.no_grad()."),
        job=('steps', 'val_batch'),
        detect=_graph,
        seed="000 §5.1 (memory that does not drop; measure before guessing), 004 §9.2 (memory)",
    ),
    Case(
        key="loader", number=6, title=N_("Steps slower than the model needs"), script="loader_starvation",
        show=("make_loader",), nproc=1, timeout_s=60,
        symptom=N_("the profiler's top row is the DataLoader's __next__: every step waits as long as reading a batch takes"),
        causes=(
            Cause(N_("The model is too slow: compute dominates."),
                  N_("'compute: forward, backward, step' takes a minority of the time; the DataLoader's __next__ is the "
                     "top row.")),
            Cause(N_("The host-to-device copy needs pinned memory."),
                  N_("There is no device copy here at all; the time goes into __next__, reading records.")),
            Cause(N_('One process reads every batch itself.'),
                  N_('The training process reads and collates every batch itself, record after record, while the model'
                     ' waits (num_workers=0: no background workers, no prefetching). '
                     '_SingleProcessDataLoaderIter.__next__ holds most of the self CPU time: the reads happen in the '
                     'training process, between steps.')),
            Cause(N_("The batch size is too small."),
                  N_("A larger batch takes proportionally longer to read: the share of time spent waiting stays.")),
        ),
        answer=2, trap=1,
        cause_hint=N_("Read the profiler table's first column and its Self CPU % column."),
        cause_method=N_("'_SingleProcessDataLoaderIter' says where the reads happen. Who else could read while the "
                        "model computes?"),
        fix={"num_workers": 4},
        fix_why=N_("Four worker processes read records in parallel and keep prefetch_factor batches ready per worker, "
                   "so the next batch is waiting when the step asks for it."),
        fix_hint=N_("Reads that wait on storage can overlap with compute, and with each other."),
        fix_method=N_("DataLoader's worker processes read batches in the background; enough of them must keep up with "
                      "a step."),
        wrong_fix={"pin_memory": True},
        wrong_fix_why=N_("Pinned memory speeds up host-to-GPU copies (and does nothing without an accelerator, as the "
                         "warning in the log says); the wait is in reading the records. Read them in worker "
                         "processes (num_workers) that prefetch."),
        job=('steps', 'warmup', 'batch_size'),
        detect=_loader,
        seed="004 §9.1 (low utilisation: data loading, prefetching), 000 §5.4 (DataLoader num_workers and "
             "prefetching instead of extra barriers), 000 §2.4 (profile first)",
    ),
    Case(
        key="repro", number=7, title=N_("Two runs that should match differ"), script="runs_differ",
        show=("train",), nproc=2, timeout_s=90,
        symptom=N_("the same script, the same seed, the same initial weights: different final weights"),
        causes=(
            Cause(N_("The seed is not set."),
                  N_("It is, and both runs start from the same weights: their initial checksums are equal.")),
            Cause(N_("The shard order depends on Python's per-process hash seed."),
                  N_("list(set(shards)): the order of a set of strings depends on Python's hash seed, which is random "
                     'in every process (PYTHONHASHSEED), so each run sees the shards in another order. The logs show '
                     'the same seed and initial weights, and different first shards.')),
            Cause(N_("Non-deterministic kernels make the sums differ."),
                  N_("Then the shards would come in the same order in both runs, and they do not. "
                     "(torch.use_deterministic_algorithms changes nothing here.)")),
            Cause(N_("The two processes ran on different CPU cores, whose arithmetic differs."),
                  N_("The cores of one CPU compute identically: with the same inputs in the same order the results are "
                     "the same bits.")),
        ),
        answer=1, trap=2,
        cause_hint=N_("Find the first line where the two runs' logs differ."),
        cause_method=N_("The seed and the initial weights agree; the next thing each run logs is the order of its data. "
                        "Where does that order come from?"),
        fix={"shard_list": "sorted(set(shards))"},
        fix_why=N_("sorted(set(...)) gives the same order in every process; reproducibility needs the seed, the code, "
                   "the data *and its order*, and the environment recorded (004 §9.4)."),
        fix_hint=N_("The data order must not depend on the process."),
        fix_method=N_("shard_list is the expression that builds the list of shards; CHOICES lists the alternatives."),
        wrong_fix={"deterministic": True},
        wrong_fix_why=N_("Deterministic kernels make the same inputs give the same bits; here the inputs differ: each "
                         "process sees the shards in another order. Sort them."),
        job=('seed', 'lr'),
        detect=_repro,
        seed="004 §7 and §9.4 (reproducible runs: record seeds, data versions, code and environment)",
    ),
    Case(
        key="rdzv", number=8, title=N_("Ranks that never start training"), script="rendezvous",
        show=("join",), nproc=2, timeout_s=90,
        symptom=N_("DistNetworkError: the client socket timed out while trying to connect to (127.0.0.1, port)"),
        causes=(
            Cause(N_("Another job holds the port."),
                  N_("A port in use fails the process that *binds* it, at once ('address already in use'). Here the "
                     "ranks are clients that cannot connect: nothing listens at the port they asked for.")),
            Cause(N_("The gloo backend is not available here."),
                  N_("The error comes from connecting to the store (TCPStore), before gloo is involved.")),
            Cause(N_("Loopback traffic is blocked."),
                  N_("torchrun's own store on 127.0.0.1 works (the launcher started); the ranks asked for another "
                     "port.")),
            Cause(N_("The script overrides torchrun's port."),
                  N_("The script overwrites torchrun's MASTER_ADDR/MASTER_PORT with a stale port, so the ranks look "
                     "for the rendezvous store where none listens, and time out. Each rank's first line shows both: "
                     'the address torchrun set, and the one the rank joins.')),
        ),
        answer=3, trap=0,
        cause_hint=N_("Compare the two addresses on each rank's first line."),
        cause_method=N_("torchrun runs the rendezvous store and tells the ranks where it is with MASTER_ADDR and "
                        "MASTER_PORT; who changes them afterwards?"),
        fix={"tutorial_sets": ""},
        fix_why=N_("Let the launcher's MASTER_ADDR/MASTER_PORT stand (under Slurm: export them once, from the job's "
                   "first node, for every task)."),
        fix_hint=N_("Who should say where the rendezvous is: the launcher or the script?"),
        fix_method=N_("tutorial_sets names the os.environ lines kept from the tutorial."),
        wrong_fix={"master_addr": "localhost"},
        wrong_fix_why=N_("localhost is the same machine as 127.0.0.1; the port is still the stale one. Let the "
                         "launcher's MASTER_ADDR/MASTER_PORT stand."),
        job=(),
        detect=_rdzv,
        seed="002 §8.2 (multi-node configuration), 004 §6.4 and §8 (one node first, then more; jobs on a "
             "cluster), notebook 12's rendezvous variables",
    ),
    Case(
        key="hang", number=9, title=N_("A job that stops at its first checkpoint"), script="partial_collective",
        show=("train",), nproc=2, timeout_s=90,
        symptom=N_("after the first checkpoint both ranks wait, then fail: 'Timed out waiting 5000ms for recv'"),
        causes=(
            Cause(N_('Only rank 0 calls dist.barrier().'),
                  N_('dist.barrier() is called by rank 0 only. Collectives must be called by every rank, in the same '
                     "order: rank 0's barrier waits for rank 1, and rank 1's next all_reduce waits for rank 0. With "
                     'TORCH_DISTRIBUTED_DEBUG=DETAIL, the ranks compare each collective before running it: rank 1 is '
                     'in ALLREDUCE while rank 0 is in BARRIER.')),
            Cause(N_("Writing the checkpoint takes longer than the timeout."),
                  N_("Rank 0 wrote it and said so before it waited; it then waits at a barrier that rank 1 never "
                     "calls.")),
            Cause(N_("The network between the ranks is too slow."),
                  N_("The ranks all-reduced every step before the checkpoint without trouble; they stop exactly at the "
                     "checkpoint, and DETAIL shows them in different collectives.")),
            Cause(N_("The process-group timeout (5 s) is too short."),
                  N_("A longer timeout only makes the ranks wait longer: rank 1 never calls the barrier.")),
        ),
        answer=0, trap=3,
        cause_hint=N_("Rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL and read the first error."),
        cause_method=N_("Each rank's traceback ends in a different collective. Which line is inside `if rank == 0:`?"),
        fix={"barrier_ranks": "0, 1"},
        fix_why=N_("Rank 0 writes, then every rank calls barrier(): the same collectives, in the same order, on all "
                   "ranks."),
        fix_hint=N_("A collective is a meeting: who has to come?"),
        fix_method=N_("barrier_ranks lists the ranks that reach dist.barrier()."),
        wrong_fix={"pg_timeout_s": 10.0},
        wrong_fix_why=N_("The ranks still wait for each other in different collectives: a longer timeout only makes the "
                         "hang longer (10 s instead of 5 here; with the default 30 minutes a job burns half an hour of "
                         "its allocation). Call the barrier on every rank."),
        job=('steps', 'ckpt_every'),
        detect=_hang,
        seed="000 §5.4 (NCCL timeouts; barrier misuse), 002 §6.3 (barrier as a debugging sync point)",
    ),
    Case(
        key="ds-batch", number=10, title=N_("DeepSpeed refuses to start"),
        script="deepspeed_batch", show=("ds_config",), nproc=2, timeout_s=120,
        symptom=N_("AssertionError from DeepSpeed: train_batch_size is not equal to micro_batch_per_gpu * "
                   "gradient_acc_step * world_size"),
        causes=(
            Cause(N_("DeepSpeed does not support 2 ranks on the CPU."),
                  N_("It does: notebook 10 trains ZeRO stages 0-3 on 2 CPU ranks. This is a config check.")),
            Cause(N_('train_batch_size leaves out the number of ranks.'),
                  N_('train_batch_size was set for one GPU: it must equal micro-batch x accumulation steps x world '
                     "size = 8 x 4 x 2 = 64. DeepSpeed's own message says it: 32 != 8 * 4 * 2.")),
            Cause(N_("The micro-batch does not fit in memory."),
                  N_("The run stops in DeepSpeedConfig, before any batch exists.")),
            Cause(N_("gradient_accumulation_steps must be 1 with ZeRO."),
                  N_("ZeRO stages accumulate gradients fine; the assertion names the product.")),
        ),
        answer=1, trap=0,
        cause_hint=N_("DeepSpeed's message is a product you can check: read its last line."),
        cause_method=N_("Which of the three factors changed when the run moved from one GPU to two?"),
        fix={"train_batch_size": 64},
        fix_why=N_("64 = 8 x 4 x 2. (Halving the accumulation to 2, or the micro-batch to 4, keeps the global batch of "
                   "32 instead; DeepSpeed can also derive one of the three from the other two.) DeepSpeed's message is "
                   "the product written out: read the last line of a traceback first. Moving a config between machines "
                   "changes the world size, and with it the batch arithmetic."),
        fix_hint=N_("The three numbers must multiply out with the world size."),
        fix_method=N_("Change one of the three batch settings so that train = micro x accumulation x 2."),
        wrong_fix={"gradient_accumulation_steps": 8},
        wrong_fix_why=N_("8 x 8 x 2 = 128, still not 32: doubling a factor makes the product larger, and DeepSpeed "
                         "checks the product against train_batch_size."),
        job=('steps',),
        detect=_ds_batch,
        seed="000 §4.4 and §6 (DeepSpeed config: train_batch_size, gradient_accumulation_steps), 004 §6.1 (global "
             "batch)",
    ),
    Case(
        key="lr", number=11, title=N_("Two ranks learn slower than one"), script="lr_scaling",
        show=("train",), nproc=2, timeout_s=90,
        symptom=N_("on 2 ranks the loss curve lags the 1-GPU curve at the same number of examples"),
        causes=(
            Cause(N_("DDP averages the gradients wrongly."),
                  N_("DDP's average of two halves is the gradient of the whole batch (notebook 09): each step is "
                     "right; there are just half as many.")),
            Cause(N_("Each rank sees only half the data."),
                  N_("Together the ranks see the global batch of 64 per step, and 960 examples over the run, as the "
                     "1-GPU run does.")),
            Cause(N_('The lr did not grow with the batch.'),
                  N_('The global batch doubled but the learning rate did not: half as many steps of the same size move'
                     ' the weights half as far. The linear scaling rule gives lr x (64 / 32) = 0.2. Same examples, '
                     'half the steps, the same step size: the curve lags by about a factor of two in examples.')),
            Cause(N_("gloo is slower than NCCL."),
                  N_("Speed is not compared here: the loss is compared at the same number of examples.")),
        ),
        answer=2, trap=1,
        cause_hint=N_("Count the optimizer steps each run takes for the same 960 examples."),
        cause_method=N_("Each step averages over its global batch, so the gradient keeps its size; what must grow so "
                        "that half as many steps go as far? Notebook 09's rule."),
        fix={"lr": 0.2},
        fix_why=N_("The linear scaling rule: the global batch doubled (32 to 64), so the learning rate doubles. "
                   "(Keeping the global batch at 32, 16 per rank, is the other way.) The linear rule is a starting point "
                   "for SGD, usually with a warm-up for large batches; Adam-type optimizers often need less than linear. "
                   "Whatever the rule, compare curves at the same number of examples, not steps."),
        fix_hint=N_("Notebook 09's rule, applied to this recipe."),
        fix_method=N_("Multiply the tuned learning rate by global batch now / global batch tuned."),
        wrong_fix={"lr": 0.05},
        wrong_fix_why=N_("Dividing by the number of ranks goes the wrong way: every step now averages over 64 examples, "
                         "a less noisy gradient, and half as many steps must cover the same ground."),
        job=('batch_per_rank', 'examples'),
        detect=_lr,
        seed="004 §6.1 (global batch size and convergence with more devices), notebook 09's linear scaling rule",
    ),
    Case(
        key="uneven", number=12, title=N_("The last step of an epoch never ends"), script="uneven_batches",
        show=("train",), nproc=2, timeout_s=90,
        symptom=N_("2 ranks with DDP: rank 1 ends its epoch, rank 0 never finishes its last step and times out"),
        causes=(
            Cause(N_("The process-group timeout is too short."),
                  N_("A longer timeout only waits longer: rank 0's last backward waits for an all-reduce that rank 1, "
                     "out of batches, never calls.")),
            Cause(N_("One rank has one more batch."),
                  N_("The shard files hold 160 and 128 records: 5 batches against 4. In its fifth backward, rank 0's "
                     "DDP all-reduces the gradients with a rank that has left the loop, and waits until the timeout. "
                     "The log says it: rank 1 'epoch done after 4 steps'.")),
            Cause(N_("DDP does not work over gloo on a CPU."),
                  N_("Four steps trained on both ranks with DDP over gloo; the run stops at the fifth.")),
            Cause(N_("The learning rate makes the loss diverge."),
                  N_("The losses printed are finite and small: the run stops, it does not blow up.")),
        ),
        answer=1, trap=0,
        cause_hint=N_("Count the steps each rank printed."),
        cause_method=N_("DDP all-reduces the gradients in every backward pass. With whom does a rank's extra backward "
                        "meet?"),
        fix={"loop": "with model.join(): for xb, yb in shard"},
        fix_why=N_("model.join() (torch.distributed.algorithms.Join) lets a rank that has run out of batches shadow the "
                   "others' all-reduces until every rank is done, so uneven inputs finish. By default the extra steps' "
                   "gradients are still divided by the starting world size, and other collectives in the loop (a loss "
                   "all-reduce, SyncBatchNorm) must be Join-aware too. (A sampler that gives every rank the same number "
                   "of batches is the other cure.)"),
        fix_hint=N_("DDP has a context manager for ranks with different numbers of batches."),
        fix_method=N_("loop is how the training loop is written; the values it may take are listed under CONFIG."),
        wrong_fix={"drop_last": True},
        wrong_fix_why=N_("Both shards divide into whole batches (160 = 5 x 32, 128 = 4 x 32): there is no partial batch "
                         "to drop. The ranks differ in the number of batches, not in their size."),
        job=("examples", "batch"),
        detect=_uneven,
        seed="000 §5.4: multi-GPU jobs that stall (uneven data across ranks, DistributedSampler)",
    ),
    Case(
        key="unused", number=13, title=N_("DDP stops at its second step"), script="unused_params",
        show=("build", "train"), nproc=2, timeout_s=90,
        symptom=N_("2 ranks with DDP: step 0 prints a loss, step 1 raises 'Expected to have finished reduction in the "
                   "prior iteration'"),
        causes=(
            Cause(N_("gloo lost the connection between the ranks."),
                  N_("Both ranks raise the same error from DDP's own bookkeeping, at the start of step 1: nothing "
                     "says a connection was lost.")),
            Cause(N_("The batch differs between the two ranks."),
                  N_("Each rank is meant to see its own half of the batch: that is data parallelism.")),
            Cause(N_("The optimizer step runs before the all-reduce."),
                  N_("DDP all-reduces during backward, before opt.step() is even called; and step 0 went through.")),
            Cause(N_("A head of the model gets no gradient."),
                  N_("This run trains the main task only, so aux_head takes no part in the loss. DDP, by default, "
                     "expects a gradient for every parameter in every backward: the bucket holding aux_head never "
                     "becomes ready, so its all-reduce is never launched (step 0's gradients were not even averaged), "
                     "and the next forward finds the previous reduction unfinished.")),
        ),
        answer=3, trap=0,
        cause_hint=N_("Read the whole error message, to its end: it names the kind of parameter."),
        cause_method=N_("Which parameters of the model take part in computing this run's loss?"),
        fix={"find_unused_parameters": True},
        fix_why=N_("find_unused_parameters=True makes DDP walk the autograd graph after each forward and mark the "
                   "parameters it will not see, at some cost per step. static_graph=True (the same parameters unused "
                   "at every step) also works; leaving the unused head out of the model, or out of DDP, costs nothing."),
        fix_hint=N_("DDP has an argument for models whose forward does not use every parameter."),
        fix_method=N_("The DDP constructor's arguments are in the script's CONFIG."),
        wrong_fix={"pg_timeout_s": 60.0},
        wrong_fix_why=N_("Nothing is waiting for a slow partner: DDP refuses, at once and on both ranks, to start a "
                         "forward whose previous reduction never finished."),
        job=("steps", "lr"),
        detect=_unused,
        seed="000 §5.4: multi-GPU jobs that die (DDP errors), notebook 09's DDP",
    ),
    Case(
        key="tp-grad", number=14, title=N_("A tensor-parallel run whose loss looks right"), script="tp_backward",
        show=("make_f", "train"), nproc=2, timeout_s=90,
        symptom=N_("2-rank tensor parallelism: the loss falls as in the 1-process run, but the input layer's weights "
                   "end elsewhere"),
        causes=(
            Cause(N_("f sends back an unsummed gradient."),
                  N_("Each rank's column-parallel layer sees only its half of the hidden units, so each holds only its "
                     "part of d(loss)/d(input). Megatron's f is the identity going forward and an all-reduce going "
                     "back; here it is the identity both ways, so each rank's copy of the input layer learns from its "
                     "own partial sum, and the copies that should stay identical drift apart, from the reference and "
                     "from each other.")),
            Cause(N_("The ranks start from different weights."),
                  N_("Step 0's loss is the reference's to every printed digit, on both ranks: the weights start equal.")),
            Cause(N_("gloo's sums are not exact in fp32."),
                  N_("Rounding differs in the last bits (about 1e-7 relative); the input layer is off by far more.")),
            Cause(N_("The ranks see different batches."),
                  N_("Both ranks print the same loss at every step (rank 1's last line is printed too): in tensor "
                     "parallelism they see the same batch.")),
        ),
        answer=0, trap=2,
        cause_hint=N_("Which layers end as in the reference, and which do not? Where does the gradient of the input "
                      "layer come from?"),
        cause_method=N_("The column-parallel layer multiplies the input by this rank's rows of fc1: d(loss)/d(input) "
                        "from one rank is a partial sum. What must happen to partial sums?"),
        fix={"f_backward": "all_reduce"},
        fix_why=N_("f's backward all-reduce sums the ranks' parts of the input's gradient: the input layer then gets the "
                   "whole gradient, and every rank matches the 1-process run to rounding. A wrong gradient is silent: "
                   "compare with a 1-process run on a small model before scaling out."),
        fix_hint=N_("Megatron's f and g are conjugates (notebook 11): one all-reduce forward, one backward."),
        fix_method=N_("f_backward is what f does with the gradient going back; its values are listed under CONFIG."),
        wrong_fix={"average_replicated_grads": True},
        wrong_fix_why=N_("Averaging two partial gradients gives half of the whole one: the parts must be summed, in f's "
                         "backward, not averaged after it."),
        job=("steps", "lr"),
        detect=_tp,
        seed="004 §6.2: model parallelism (tensor parallelism, notebook 11's f and g)",
    ),
    Case(
        key="ifname", number=15, title=N_("A job that fails before its first step"), script="socket_ifname",
        show=("job_env",), nproc=2, timeout_s=60,
        symptom=N_("2 ranks: both fail in init_process_group with 'Unable to find address for: ib0'"),
        causes=(
            Cause(N_("The rendezvous port is taken."),
                  N_("A taken port says 'address already in use'; this error is about finding an address for a name.")),
            Cause(N_("A firewall blocks traffic between the ranks."),
                  N_("A firewall makes a connection time out; this fails at once, before any connection.")),
            Cause(N_("No interface here has that name."),
                  N_("gloo binds its sockets to the interface GLOO_SOCKET_IFNAME names. ib0 is the IP interface of "
                     "another cluster's InfiniBand; this machine has no ib0, so there is no address to bind to. The "
                     "ranks share only loopback here; on a cluster, `ip addr` lists the interfaces a node has.")),
            Cause(N_("NCCL is not installed."),
                  N_("This job runs gloo, which ships with every build of torch; NCCL plays no part in it.")),
        ),
        answer=2, trap=3,
        cause_hint=N_("'Unable to find address for: ib0': what is ib0, and does this machine have one?"),
        cause_method=N_("Compare the names the job script exports with the interfaces this machine has "
                        "(`ip -brief addr`)."),
        fix={"GLOO_SOCKET_IFNAME": "lo"},
        fix_why=N_("GLOO_SOCKET_IFNAME=lo names the interface the two ranks share here. On a cluster, name the "
                   "interface of the network the nodes share, as `ip addr` lists it. NCCL_SOCKET_IFNAME does the same "
                   "for NCCL's bootstrap and socket transport; it matches by prefix (=eth0 for an exact name, ^docker to "
                   "exclude), and it does not choose the InfiniBand card (NCCL_IB_HCA does)."),
        fix_hint=N_("Name an interface this machine has, that both ranks can reach."),
        fix_method=N_("The job's exports are in CONFIG; the values they may take are listed there."),
        wrong_fix={"NCCL_SOCKET_IFNAME": "lo"},
        wrong_fix_why=N_("This job runs gloo, which reads GLOO_SOCKET_IFNAME; NCCL_SOCKET_IFNAME is NCCL's and gloo "
                         "ignores it."),
        job=(),
        detect=_ifname,
        seed="000 §2.3 and 002 §8.2: the network a job's collectives use (NCCL over InfiniBand, socket interfaces)",
    ),
    Case(
        key="zero3-save", number=16, title=N_("A trained model that nobody can load"), script="zero3_export",
        show=("export",), nproc=2, timeout_s=180,
        symptom=N_("2 ranks, DeepSpeed ZeRO-3: training goes well; loading the exported file into the same model class "
                   "fails with size mismatches"),
        causes=(
            Cause(N_("torch.save is not safe with DeepSpeed."),
                  N_("torch.save wrote exactly what it was given: the file holds every key. The tensors themselves are "
                     "empty.")),
            Cause(N_("The user's model has another architecture."),
                  N_("It is the same class with the same sizes; the error reports the file's tensors as having shape "
                     "(0,), which no architecture has.")),
            Cause(N_("ZeRO-3 leaves each rank a shard only."),
                  N_("ZeRO-3 partitions every parameter over the ranks; between forward passes a rank's module holds "
                     "empty placeholders of shape (0,), and its state_dict() returns them. The weights exist only as "
                     "shards until they are gathered.")),
            Cause(N_("The optimizer state was not saved with it."),
                  N_("Evaluating a model needs its weights only; the optimizer state matters to resume training.")),
        ),
        answer=2, trap=1,
        cause_hint=N_("Read the shapes of the tensors in the exported file."),
        cause_method=N_("Which ZeRO stage shards the parameters themselves, and what does a rank hold between steps?"),
        fix={"export": "GatheredParameters(...): engine.module.state_dict()"},
        fix_why=N_("deepspeed.zero.GatheredParameters, entered on every rank, assembles the full parameters for the "
                   "duration of the with-block: state_dict() then holds real tensors. For a large model, save the "
                   "sharded checkpoint (engine.save_checkpoint) and merge it offline with DeepSpeed's zero_to_fp32, or "
                   "set stage3_gather_16bit_weights_on_model_save and call engine.save_16bit_model."),
        fix_hint=N_("The weights have to be assembled from the ranks before they are written."),
        fix_method=N_("export says how the script collects the weights; the values it may take are listed under CONFIG."),
        wrong_fix={"steps": 6},
        wrong_fix_why=N_("Training longer changes nothing in how the weights are collected: they are still shards."),
        job=("steps", "lr"),
        detect=_zero3,
        seed="000 §6: the reference configuration's ZeRO (stage 3 shards the parameters too; notebook 10)",
    ),
)

#: Every case, by key, in the notebook's order.
CASES: dict[str, Case] = {c.key: c for c in _ROWS}
