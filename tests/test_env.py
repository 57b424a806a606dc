"""labkit.env: the doctor report works on a CPU-only machine and shows the variables that matter."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from labkit import env


def test_report_fields(monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("JUPYTER_TOKEN", "secret")
    r = env.report()
    assert r["versions"]["torch"] == torch.__version__.split("+")[0] or r["versions"]["torch"] == torch.__version__
    assert r["env"]["NCCL_DEBUG"] == "INFO" and r["env"]["SLURM_JOB_ID"] == "42" and r["env"]["OMP_NUM_THREADS"] == "2"
    assert "JUPYTER_TOKEN" not in r["env"], "secrets must not be printed"
    assert r["threads"]["torch_intraop"] == torch.get_num_threads()
    text = env.format_report(r)
    for needle in ("python", "torch", "device", "autocast", "TF32", "fp8", "NCCL_DEBUG=INFO", "SLURM_JOB_ID=42"):
        assert needle in text
    assert "secret" not in text


def test_format_report_rejects_non_dict():
    with pytest.raises(TypeError):
        env.format_report("report")


def test_seed_everything_makes_generators_repeat():
    env.seed_everything(7)
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    env.seed_everything(7)
    assert a == (random.random(), np.random.rand(), torch.rand(1).item())
    with pytest.raises(ValueError):
        env.seed_everything(-1)
    with pytest.raises(TypeError):
        env.seed_everything(1.5)
