"""Run several one-process clinic cases, one after the other, in one Python process.

``python -m labkit.clinic._batch --plan '[["labkit.clinic.cases.clip_before_unscale", {...}], ...]'`` calls each
case script's ``main(["--config", ...])`` in turn, between two marker lines (``LABKIT_CASE_BEGIN i`` and
``LABKIT_CASE_END i <exit status>``), so that :func:`labkit.clinic.run_cases` can split the log and the results
per case. A case that raises prints its traceback and ends with status 1; the next one still runs. It saves each
case a Python and torch start-up (about two seconds of CPU on a small machine). Every case script sets what it
depends on (seeds, generators, thread count) itself.

Not in ``labkit.clinic.__all__``: the runner's plumbing. Introduced in notebook 13.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from collections.abc import Sequence

from labkit._validate import safe_repr

__all__ = ["BEGIN", "END", "main"]

BEGIN = "LABKIT_CASE_BEGIN "
END = "LABKIT_CASE_END "


def main(argv: Sequence[str] | None = None) -> int:
    """Run the plan's cases in order; return 0 (each case's own status is on its END line). Introduced in notebook 13."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, help="JSON list of [case module, settings] pairs")
    plan = json.loads(ap.parse_args(argv).plan)
    if not isinstance(plan, list) or not all(isinstance(p, list) and len(p) == 2 for p in plan):
        raise ValueError("--plan must be a JSON list of [module, settings] pairs")
    for i, (module, cfg) in enumerate(plan):
        if not isinstance(module, str) or not module.startswith("labkit.clinic.cases."):
            raise ValueError(f"plan entry {i}: {safe_repr(module)} is not a clinic case module")
        print(f"{BEGIN}{i}", flush=True)
        try:
            rc = importlib.import_module(module).main(["--config", json.dumps(cfg)])
        except Exception:  # the case failed; the log shows how, and the next case runs
            traceback.print_exc(file=sys.stdout)
            rc = 1
        sys.stdout.flush()
        sys.stderr.flush()
        print(f"{END}{i} {int(rc or 0)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
