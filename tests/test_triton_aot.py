"""The Triton kernel compiled ahead of time for GPU targets, on a machine without a GPU.

The interpreter (`tests/test_triton_native.py`) checks what the kernel computes, not what
the GPU compiler makes of it, and Gluon kernels do not run under it at all. Here Triton
compiles the kernel for sm_90 (and sm_100) with the config `choose_config` gives the
backend for that target, through its own ptxas (no driver, no GPU), and each cubin is read with the
cuobjdump Triton ships: registers <= 255, no spills (stack frame and local memory 0, no
LDL/STL), shared memory within the 227 KB a block may have, and the FP8 tensor-core MMA
(`wgmma ... e4m3.e4m3` in the PTX and QGMMA in the SASS on sm_90; `tcgen05.mma
kind::f8f6f4` on sm_100) rather than a fallback.

The compiles run in one child process: triton.jit picks the interpreter when
TRITON_INTERPRET is set (the test runner sets it on CPU machines), and the compiler needs
the real JITFunction, so the child runs without it, with its own Triton cache. The
compiled results depend on the Triton version (the CI venv's is vLLM's pin; the H200 has
Triton 3.6, whose counts docs/triton_kernel.md lists).
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from aot_support import compile_in_child

from dsa_lab.kernels.aot import report_cases

HEADS, HEAD_DIM = 64, 128
SM90_NEXT_N = (1, 2, 3, 4, 5, 8)
SM100_NEXT_N = (1, 3, 4, 8)
# SM90's rule at n=4 (one N=256 dot, 7 stages, resident weights) spills on sm_100 (255 registers and a
# 272-byte stack frame under Triton 3.8); choose_config's SM100 rule reloads the weights there instead.
MAX_REGISTERS = 255
MAX_SHARED_BYTES = 227 * 1024  # the most shared memory one block may opt in to on sm_90 (and sm_100)

CASES = [(90, n) for n in SM90_NEXT_N] + [(100, n) for n in SM100_NEXT_N]


# --- the child: compile and read the cubins ---------------------------------------------------


def compile_case(arch: int, next_n: int) -> dict:
    """Compile the kernel for `sm_<arch>` with the backend's config for `next_n`; what the cubin holds."""
    import triton

    from dsa_lab.kernels import triton_native as tn
    from dsa_lab.kernels.cubin import resource_counts

    config = tn.choose_config(next_n, HEADS, HEAD_DIM, (arch // 10, arch % 10))
    kernel = tn.compile_for(arch, next_n, HEADS, HEAD_DIM, config)
    return {
        "arch": arch,
        "next_n": next_n,
        "config": config.describe(),
        "triton": triton.__version__,
        **resource_counts(kernel),
    }


# --- the tests ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[tuple[int, int], dict]:
    """Every case's report, from one child process (no TRITON_INTERPRET, a fresh Triton cache)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    found = compile_in_child(__file__, CASES, tmp_path_factory.mktemp("triton_cache"))
    return {(r["arch"], r["next_n"]): r for r in found}


def _report(reports: dict, arch: int, next_n: int) -> dict:
    report = reports[(arch, next_n)]
    assert "error" not in report, f"sm_{arch} n={next_n}: compile failed: {report.get('error')}"
    return report


def _check_resources(report: dict) -> None:
    where = f"sm_{report['arch']} n={report['next_n']} {report['config']} (triton {report['triton']})"
    assert report["registers"] <= MAX_REGISTERS, f"{where}: {report['registers']} registers"
    spills = (report["stack_bytes"], report["local_bytes"], report["sass_local_accesses"])
    assert spills == (0, 0, 0), f"{where}: spills (stack bytes, local bytes, LDL/STL) = {spills}"
    assert 0 < report["shared_bytes"] <= MAX_SHARED_BYTES, f"{where}: {report['shared_bytes']} B shared memory"


@pytest.mark.parametrize("next_n", SM90_NEXT_N)
def test_sm90_compile_fits_and_uses_fp8_wgmma(reports, next_n: int) -> None:
    report = _report(reports, 90, next_n)
    _check_resources(report)
    assert report["ptx_wgmma_e4m3"] > 0, f"n={next_n}: no FP8 wgmma in the PTX: {report}"
    assert report["sass_qgmma_e4m3"] > 0, f"n={next_n}: no QGMMA ... E4M3 in the SASS: {report}"


def test_sm100_rule_differs_from_sm90_only_where_sm90_spills() -> None:
    from dsa_lab.kernels import triton_native as tn

    for next_n in range(1, tn.MAX_NEXT_N + 1):
        sm90, sm100 = (
            tn.choose_config(next_n, HEADS, HEAD_DIM, (9, 0)),
            tn.choose_config(next_n, HEADS, HEAD_DIM, (10, 0)),
        )
        if next_n == 4:
            assert sm90.resident_weights and sm100 == tn.KernelConfig(
                dot_rows=256, num_stages=7, resident_weights=False
            )
        else:
            assert sm100 == sm90, next_n


@pytest.mark.parametrize("next_n", SM100_NEXT_N)
def test_sm100_compile_fits_and_uses_fp8_tcgen05(reports, next_n: int) -> None:
    report = _report(reports, 100, next_n)
    assert report["ptx_tcgen05_f8"] > 0, f"n={next_n}: no FP8 tcgen05.mma in the PTX: {report}"
    _check_resources(report)


def test_env_aot_prints_what_the_tests_read(tmp_path, monkeypatch, capsys) -> None:
    """`dsa-lab env --aot`: the same compile and cubin counts, per next_n, as a table or JSON lines."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from dsa_lab.cli import main
    from dsa_lab.kernels import triton_native as tn

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")  # the table unfolded
    assert main(["env", "--aot", "--backend", "triton", "--next-n", "1,4", "--json"]) == 0
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["backend"], r["arch"], r["next_n"]) for r in reports] == [("triton", 90, 1), ("triton", 90, 4)]
    for report in reports:
        assert report["config"] == tn.choose_config(report["next_n"], HEADS, HEAD_DIM, (9, 0)).describe()
        _check_resources(report)
        assert report["sass_qgmma_e4m3"] > 0, report
    assert main(["env", "--aot", "--backend", "triton", "--next-n", "2", "--config", "dot_rows=64"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "sm_90" in out and "rows64/w4/s5/resident/bppauto" in out and "QGMMA" in out
    assert main(["env", "--aot", "--backend", "reference"]) == 2  # compiles nothing ahead of time
    assert "backend 'reference' compiles ahead of time for none" in capsys.readouterr().err
    assert main(["env", "--aot", "--backend", "triton", "--next-n", "1", "--config", "stages=3"]) == 1
    assert "not compiled" in capsys.readouterr().out  # a knob the backend lacks: its case fails, named


if __name__ == "__main__":
    report_cases(("arch", "next_n"), json.loads(sys.argv[1]), compile_case)
