"""Multi-process recipes: modules meant to run under ``torchrun`` or ``srun``, one JSON result line each.

- :mod:`labkit.recipes.ddp` — DistributedDataParallel training (AMP, gradient accumulation with
  ``no_sync``, checkpoints, resume, fault injection)::

      torchrun --nproc_per_node 2 -m labkit.recipes.ddp --model mlp --steps 20 --batch 32

- :mod:`labkit.recipes.allreduce` — an all-reduce benchmark reporting algbw and busbw as nccl-tests
  defines them::

      torchrun --nproc_per_node 2 -m labkit.recipes.allreduce --sizes 4K,64K,1M,16M

- :mod:`labkit.recipes.zero` — DeepSpeed ZeRO stages 0-3 (bf16/fp16/fp32, optimizer offload) on the tiny
  GPT, with exact per-rank model-state bytes (introduced in notebook 10)::

      torchrun --nproc_per_node 2 -m labkit.recipes.zero --runs 0:bf16,1:bf16,2:bf16,3:bf16

- :mod:`labkit.recipes.handpar` — DDP, ZeRO-1, tensor and pipeline parallelism by hand next to torch DDP,
  AdamW, DeepSpeed, FSDP2 and ``torch.distributed.pipelining``; :mod:`labkit.recipes.handpar_grade` runs
  notebook 11's exercises the same way (introduced in notebook 11)::

      torchrun --nproc_per_node 2 -m labkit.recipes.handpar --parts ddp,zero1,tp,pp,fsdp
      torchrun --nproc_per_node 2 -m labkit.recipes.handpar_grade --file tp=my_tp.py

- :mod:`labkit.recipes.comm_share` — communication's share of a DDP step with and without ``no_sync()``, and
  when DDP's bucket all-reduces start, timed by a comm hook on CPU ranks (introduced in notebook 09)::

      torchrun --nproc_per_node 2 -m labkit.recipes.comm_share

- :mod:`labkit.recipes.comm_patterns` — a parameter server and a ring all-reduce written with send/recv, their
  bytes counted against the formulas, and BatchNorm across ranks (introduced in notebook 14)::

      torchrun --nproc_per_node 4 -m labkit.recipes.comm_patterns --device cpu

All print one ``LABKIT_RESULT {json}`` line on rank 0, which :func:`labkit.dist.launch` returns.
Importing this package has no side effects; the recipes do their work only when run as ``__main__``.

Introduced in notebook 09.
"""

from __future__ import annotations

__all__ = ["allreduce", "comm_patterns", "comm_share", "ddp", "handpar", "handpar_grade", "zero"]
