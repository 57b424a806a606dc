"""labkit.toolchain: real builds with the real compiler, the real loader error, and the small arithmetic helpers."""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest

from labkit import toolchain as T

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc is not installed (the notebook says so and skips too)")


def test_find_compilers_agrees_with_which():
    found = T.find_compilers()
    assert set(found) == set(T.COMPILERS)
    for name, path in found.items():
        assert path == shutil.which(name)
    with pytest.raises(TypeError):
        T.find_compilers("gcc")


@needs_gcc
def test_builds_agree_bit_for_bit_and_optimisation_pays(tmp_path):
    flags = {"-O0": ["-O0"], "-O3 -march=native": ["-O3", "-march=native"]}
    builds = T.time_builds(flags, tmp_path, n=4096, reps=200, rounds=2)
    assert list(builds) == list(flags) and builds["-O0"].flags == ("-O0",)
    assert builds["-O0"].checksum == builds["-O3 -march=native"].checksum
    assert all(b.seconds > 0 for b in builds.values())
    assert list(tmp_path.iterdir()) == [], "the private build folder is removed"


@needs_gcc
def test_checksum_is_the_kernels_true_result(tmp_path):
    """The C kernel's checksum equals the same polynomial evaluated in float32 by numpy (no FMA, same order)."""
    import numpy as np

    n = 1000
    x = (np.arange(n) % 1000).astype(np.float32) / np.float32(1000)
    half, quarter, one, two = (np.float32(v) for v in (0.5, 0.25, 1.0, 2.0))
    y = ((half * x + quarter) * x - one) * x + two
    want = sum(float(v) for v in y)  # the C code sums in double, in order
    (build,) = T.time_builds({"-O2": ["-O2"]}, tmp_path, n=n, reps=1, rounds=1).values()
    assert float(build.checksum) == want


@needs_gcc
def test_a_failing_build_raises_with_the_compilers_message(tmp_path):
    with pytest.raises(RuntimeError, match="compiling failed"):
        T.time_builds({"bad": ["-fno-such-flag-xyz"]}, tmp_path, n=16, reps=1, rounds=1)
    assert list(tmp_path.iterdir()) == []


def test_time_builds_checks_its_arguments(tmp_path):
    with pytest.raises(TypeError):
        T.time_builds({"-O0": ["-O0"]}, str(tmp_path))
    with pytest.raises(ValueError):
        T.time_builds({"-O0": ["-O0"]}, tmp_path / "missing")
    with pytest.raises(ValueError):
        T.time_builds({"-O0": ["O0"]}, tmp_path)
    with pytest.raises(TypeError):
        T.time_builds({}, tmp_path)
    with pytest.raises(ValueError):
        T.time_builds({"-O0": ["-O0"]}, tmp_path, n=1 << 22, reps=100_000, rounds=20)
    with pytest.raises(ValueError, match="no compiler"):
        T.time_builds({"-O0": ["-O0"]}, tmp_path, cc="no-such-compiler-xyz")


@needs_gcc
def test_vectorization_report_names_the_loop_at_O3_and_nothing_at_O0(tmp_path):
    assert "vectorized" in T.vectorization_report(["-O3"], tmp_path)
    assert T.vectorization_report(["-O0"], tmp_path) == ""
    assert list(tmp_path.iterdir()) == []


@needs_gcc
def test_undefined_symbol_is_the_real_loader_error(tmp_path):
    demo = T.undefined_symbol_demo(tmp_path)
    assert demo.output_v2 == "42.0"
    assert demo.error_v1.endswith("undefined symbol: scale_fast") and "<tmp>" in demo.error_v1
    if shutil.which("nm"):
        assert demo.symbols_v1 == ("scale",) and demo.symbols_v2 == ("scale", "scale_fast")
    if shutil.which("ldd"):
        assert demo.resolved_v1.endswith("v1/libscale.so") and demo.resolved_v2.endswith("v2/libscale.so")
    assert list(tmp_path.iterdir()) == []


@needs_gcc
def test_compiler_version_is_gccs_own_first_line():
    out = subprocess.run([GCC, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    assert T.compiler_version("gcc") == out


def test_ib_timeout_is_4_096_us_times_two_to_the_value():
    assert T.ib_timeout_seconds(20) == pytest.approx(4.294967296)
    assert T.ib_timeout_seconds(22) == pytest.approx(17.179869184)
    for bad in (0, 32, -1):
        with pytest.raises(ValueError):
            T.ib_timeout_seconds(bad)
    with pytest.raises(TypeError):
        T.ib_timeout_seconds(22.0)


def test_amdahl():
    assert T.amdahl(0.6, 4) == pytest.approx(1 / 0.55)
    assert T.amdahl(0.0, 100) == 1.0 and T.amdahl(1.0, 4) == pytest.approx(4)
    assert T.amdahl(0.75, math.inf) == pytest.approx(4) and T.amdahl(1.0, math.inf) == math.inf
    assert T.amdahl(0.5, 0.5) < 1  # a slow-down is a speed-up below 1
    for args in ((1.1, 2), (0.5, 0), (0.5, math.nan), (-0.1, 2)):
        with pytest.raises(ValueError):
            T.amdahl(*args)
    with pytest.raises(TypeError):
        T.amdahl("0.5", 2)


def test_container_runtime_and_library_versions_answer():
    assert T.container_runtime() in {None, "docker", "podman", "apptainer", "kubernetes"}
    import torch

    libs = T.library_versions()
    assert libs["torch"] == torch.__version__
    assert libs["cuda (toolkit torch was built with)"] == torch.version.cuda
    energy = T.read_energy_uj()
    assert energy is None or energy >= 0


def test_kernel_variants_change_only_the_loop_and_gcc_reads_them(tmp_path):
    plain, restricted = T.kernel_source(), T.kernel_source(restrict=True, fixed_n=64)
    assert plain == T.KERNEL_C
    assert "const float *restrict x, float *restrict y" in restricted and "i < 64;" in restricted
    assert restricted.replace("*restrict ", "*").replace("i < 64;", "i < n;", 1) == T.KERNEL_C
    report = T.vectorization_report(["-O3"], tmp_path, source=restricted, loop_only=True)
    assert T.vector_widths(report) and "versioned" not in report      # restrict: no alias check needed
    assert "versioned" in T.vectorization_report(["-O3"], tmp_path, loop_only=True)
    assert T.vector_widths("kernel.c:8:23: optimized: loop vectorized using 32 byte vectors\n"
                           "kernel.c:8:23: optimized: loop vectorized using 16 byte vectors") == [32, 16]
    with pytest.raises(ValueError):
        T.kernel_source(fixed_n=0)
    with pytest.raises(TypeError):
        T.vectorization_report(["-O3"], tmp_path, source="int main(void) { return 0; }")
