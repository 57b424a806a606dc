"""The clinic's case scripts: one small training script per case, each run as its own process (or 2 ranks).

Every script has ``CONFIG`` (its settings, as they were when the run went wrong), a function with the training
code the learner reads, and ``main`` (read ``--config``, run, print the evidence). They import torch inside
their functions, so that importing one to read its ``CONFIG`` stays cheap. See :mod:`labkit.clinic`.

Introduced in notebook 13.
"""

__all__: list[str] = []
