"""The troubleshooting clinic: broken training runs to diagnose and fix, each failing for real.

Every case is a small training script (:mod:`labkit.clinic.cases`) that goes wrong on a CPU within seconds, for
a real reason: gradients clipped before unscaling, fp16 without a loss scaler, a softmax that overflows, a scaler
missing from a checkpoint, a GradScaler under bf16, a loss kept with its graph, a starved data loader, runs that
differ, a rendezvous that never happens, a collective called by one rank only, a DeepSpeed batch config that
does not multiply out, a learning rate not scaled with the ranks. :data:`CASES` is the one table of cases,
symptoms, causes, fixes and graders (:mod:`labkit.clinic.table`); :func:`run_case` runs one, with a fix, as a
subprocess (1 process, or 2 gloo ranks through :func:`labkit.dist.launch`) and returns its evidence::

    from labkit import clinic
    print(clinic.source("clip"))                       # the script's settings and its training loop
    run = clinic.run_case("clip")                      # the broken run
    print(run.lines(last=3), run.finding.summary)
    print(clinic.causes("clip"))                       # the candidate causes, lettered
    fixed = clinic.run_case("clip", fix={"after_backward": "scaler.unscale_, clip_grad_norm_, scaler.step"})
    assert not fixed.symptom

Introduced in notebook 13.
"""

from __future__ import annotations

from labkit.clinic.runner import (
    CaseRun,
    causes,
    checklist,
    choices,
    clear_cache,
    grade_cause,
    grade_fix,
    run_case,
    run_cases,
    settings,
    shutdown,
    source,
)
from labkit.clinic.table import CASES, Case, Cause, Finding, lr_ratio

__all__ = ["CASES", "Case", "CaseRun", "Cause", "Finding", "causes", "checklist", "choices", "clear_cache", "grade_cause", "grade_fix",
           "lr_ratio", "run_case", "run_cases", "settings", "shutdown", "source"]
