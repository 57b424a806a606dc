"""The CPU cap that `make test-capped` relies on really takes effect, so the capped nbval run tests a lesser CPU.

`make test` runs every notebook a second time with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``. That
only proves something if torch and DeepSpeed then really answer "no AVX512-BF16/FP16, no AMX". These tests ask
them, in fresh subprocesses (the caps are read once, when torch loads), and fail if a cap stops working. Under
the capped run itself, ``LABKIT_EXPECT_CPU_CLASS`` is set and the current process is checked too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from labkit import device as dev_gate

PROBE = r"""
import json, torch
from labkit import device as dev_gate
out = {
    "aten": str(torch.backends.cpu.get_cpu_capability()),
    "mkldnn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    "mkldnn_fp16": bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()),
    "class": dev_gate.cpu_class(),
    "fast_bf16": dev_gate.fast(torch.bfloat16, "cpu"), "fast_fp16": dev_gate.fast(torch.float16, "cpu"),
    "computes_bf16": dev_gate.computes(torch.bfloat16, "cpu"), "computes_fp16": dev_gate.computes(torch.float16, "cpu"),
    "ds_fp16": dev_gate.deepspeed_accepts(torch.float16), "ds_bf16": dev_gate.deepspeed_accepts(torch.bfloat16),
    "autocast": str(dev_gate.autocast_dtype("cpu")),
}
print("PROBE" + json.dumps(out))
"""

CAPS = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    # the CPU class of the machine that first failed: AVX-512 (with VNNI) but no AVX512-BF16/FP16, no AMX
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"},
    # AMD EPYC (Zen 4) and Cooper Lake: AVX512-BF16 but neither AVX512-FP16 nor AMX; DeepSpeed refuses fp16 there
    "avx512-bf16": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
}


def _probe(extra_env: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in {"ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "LABKIT_EXPECT_CPU_CLASS"}}
    env.update(extra_env)
    env.setdefault("DS_ACCELERATOR", "cpu")
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE"))
    return json.loads(line[len("PROBE"):])


def _hardware_has_avx512() -> bool:
    return "avx512f" in dev_gate.cpu_isa_flags()


@pytest.mark.slow
def test_avx2_cap_takes_effect():
    got = _probe(CAPS["avx2"])
    assert got["aten"] in {"AVX2", "DEFAULT"}, got
    assert not got["mkldnn_bf16"] and not got["mkldnn_fp16"], got        # oneDNN: no bf16/fp16 ISA
    assert not got["fast_bf16"] and not got["fast_fp16"] and got["class"] in {"avx2", "baseline"}, got
    assert not got["ds_fp16"], got                                        # DeepSpeed refuses fp16, as on a laptop
    assert got["computes_bf16"] and got["computes_fp16"], got             # ...while autocast still computes both
    assert got["autocast"] == "torch.bfloat16", got


@pytest.mark.slow
def test_avx512_without_bf16_cap_takes_effect():
    got = _probe(CAPS["avx512"])
    assert not got["fast_bf16"] and not got["fast_fp16"] and not got["mkldnn_fp16"], got
    assert not got["ds_fp16"] and got["computes_fp16"], got
    if _hardware_has_avx512():  # the cap can only lower the class, never raise it
        assert got["aten"] == "AVX512" and got["class"] == "avx512", got
    else:
        assert got["class"] in {"avx2", "baseline"}, got


@pytest.mark.slow
def test_avx512_bf16_cap_takes_effect():
    """bf16 native, fp16 not: oneDNN, DeepSpeed and the gate all say so; torch's autocast still computes fp16."""
    got = _probe(CAPS["avx512-bf16"])
    assert not got["fast_fp16"] and not got["mkldnn_fp16"] and not got["ds_fp16"] and got["computes_fp16"], got
    assert got["class"] != "amx", got
    hardware = _class_from_flags()
    if hardware in {"amx", "avx512-bf16"}:  # the cap can only lower the class, never raise it
        assert got["class"] == "avx512-bf16" and got["aten"] == "AVX512", got
        assert got["fast_bf16"] and got["mkldnn_bf16"] and got["ds_bf16"], got
    else:
        assert ORDER.index(got["class"]) <= ORDER.index(hardware) and not got["fast_bf16"], got


def _class_from_flags() -> str:
    """The class the hardware flags alone predict for an uncapped torch (independent of labkit.device)."""
    flags = set(open("/proc/cpuinfo").read().split()) if os.path.exists("/proc/cpuinfo") else set()
    if "avx512f" in flags:
        if "amx_bf16" in flags:
            return "amx"
        return "avx512-bf16" if "avx512_bf16" in flags else "avx512"
    return "avx2" if "avx2" in flags else "baseline"


@pytest.mark.slow
def test_uncapped_class_follows_the_hardware_flags():
    got = _probe({})
    assert got["class"] == _class_from_flags(), got
    native_bf16 = got["class"] in {"amx", "avx512-bf16"}
    assert got["fast_bf16"] == native_bf16 and (got["mkldnn_bf16"] or not native_bf16), got
    assert got["fast_fp16"] == got["mkldnn_fp16"] == bool(got["ds_fp16"]), got  # one oneDNN answer, asked thrice


ORDER = dev_gate.CPU_CLASSES


def test_this_run_is_the_class_it_claims():
    """Under `make test-capped` the notebooks must really run as the expected (lesser) class.

    In a native run (LABKIT_EXPECT_CPU_CLASS unset, no caps) the class must be the one the flags predict.
    """
    want = os.environ.get("LABKIT_EXPECT_CPU_CLASS")
    have = dev_gate.cpu_class()
    if not want:
        capped = any(os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"))
        assert ORDER.index(have) <= ORDER.index(_class_from_flags()) if capped else have == _class_from_flags()
        return
    assert want in ORDER, f"LABKIT_EXPECT_CPU_CLASS must be one of {ORDER}, got {want!r}"
    # a machine below the requested class runs as itself; never above it
    assert ORDER.index(have) <= ORDER.index(want), f"capped run expected class {want}, torch reports {have}"
    if ORDER.index(want) < ORDER.index("avx512-bf16"):
        assert not dev_gate.fast(torch.bfloat16, "cpu")
    if ORDER.index(want) < ORDER.index("amx"):  # no class below AMX has native fp16, so DeepSpeed refuses it
        assert not dev_gate.fast(torch.float16, "cpu") and not dev_gate.deepspeed_accepts(torch.float16)
