"""The Gluon kernel and its schedule without a GPU: compiled ahead of time for sm_90, and host-side checks.

Gluon kernels do not run under TRITON_INTERPRET, so CI never executes this one. Instead Triton
compiles it for `GPUTarget("cuda", 90, 32)` with the config `choose_gluon_config` gives the
backend for every next_n from 1 to 8, and the work-balanced schedule and tail fill
(`kernels/gluon/schedule.py`, which tests/test_schedule.py also runs in the interpreter), through its
own ptxas (no driver, no GPU), and each cubin is read with the cuobjdump
Triton ships: the warp specialisation happened (setmaxnreg for several partitions), the FP8
wgmma is there (`wgmma ... e4m3.e4m3` in the PTX, QGMMA in the SASS), registers and shared
memory fit, and no spill sits on the hot path. The compiles run in one child process without
TRITON_INTERPRET and with their own Triton cache (as tests/test_triton_aot.py does). The CI venv
has Triton 3.8 (vLLM's pin); the H200 has 3.6, whose counts docs/triton_kernel.md lists; the
Gluon API this kernel uses is the same in both (`gl.warp_specialize` with (function, args)
pairs and worker register counts).

Spills, a finding this test pins: for next_n >= 5 the rule's config (three consumers, N=128
chunks, weights re-read from shared memory) compiles with a stack frame of up to 128 bytes (0-72 B
under Triton 3.6, 8-128 B under 3.8; docs/triton_kernel.md, round 11): ptxas keeps per-request
scalars (kernel arguments, loop bounds) in local memory across the warp_specialize region. A few
of those accesses fall between an MMA and the release of its KV slot (at most 16, at n = 7 under
3.8; 2 at n = 5 under 3.6); on the H200 these configs ran 7-24% faster than the spill-free
two-consumer ones (round 6). So n <= 4 must be spill-free, every n keeps its MMA-to-release spans
within `MAX_MMA_SPAN_LOCAL_ACCESSES` local accesses, and the stack stays small.

The host-side tests (bad input refused by name, BackendUnavailable with the reason) need no
compiler at all.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys

import pytest
import torch
from aot_support import compile_in_child

from dsa_lab.errors import BackendUnavailable, UnsupportedShape
from dsa_lab.kernels import get_backend
from dsa_lab.kernels.aot import report_cases
from dsa_lab.kernels.gluon import config as gc
from dsa_lab.kernels.gluon import launch as gn
from dsa_lab.kernels.gluon import schedule as sc

HEADS, HEAD_DIM = 64, 128
NEXT_N = (1, 2, 3, 4, 5, 6, 7, 8)
SCHEDULE_NEXT_N = (1, 3, 8, 16)
FUSED_NEXT_N = (1, 3)
SPILL_FREE_UP_TO = 4  # next_n <= this: no local memory at all
MAX_STACK_BYTES = 128
MAX_MMA_SPAN_LOCAL_ACCESSES = 32  # next_n > SPILL_FREE_UP_TO only
MAX_REGISTERS = 255


# --- the child: compile and read the cubins ---------------------------------------------------


def local_accesses_in_mma_spans(sass: str) -> int:
    """LDL/STL between an MMA (QGMMA) and the next mbarrier arrive (the KV slot's release)."""
    count, inside = 0, False
    for line in sass.splitlines():
        if re.search(r"\bQGMMA\b", line):
            inside = True
        elif re.search(r"\bSYNCS\.ARRIVE", line):
            inside = False
        elif inside and re.search(r"\b(?:LDL|STL)\b", line):
            count += 1
    return count


def compile_case(kind: str, next_n: int) -> dict:
    import triton

    from dsa_lab.kernels.cubin import cuobjdump, resource_counts

    if kind == "fused":  # issue 27's step: Gluon's kernel and the split select's library, built into a temp dir
        import tempfile

        with tempfile.TemporaryDirectory(prefix="split_select_") as folder:  # gone after: the disk as it was
            os.environ["DSA_LAB_SPLIT_SELECT"] = folder
            described, kernel = get_backend("gluon-fused").compile_ahead(90, next_n, HEADS, HEAD_DIM)
        return {"kind": kind, "next_n": next_n, "config": described, **resource_counts(kernel)}
    if kind != "gluon":  # the schedule or the tail fill, plain Triton
        return {
            "kind": kind,
            "next_n": next_n,
            "triton": triton.__version__,
            **resource_counts(sc.compile_for(90, kind, next_n)),
        }
    config = gc.choose_gluon_config(next_n, HEADS, HEAD_DIM)
    kernel = gn.compile_for(90, next_n, HEADS, HEAD_DIM, config)
    return {
        "kind": kind,
        "next_n": next_n,
        "config": config.describe(),
        "triton": triton.__version__,
        **resource_counts(kernel),
        "mma_span_local_accesses": local_accesses_in_mma_spans(cuobjdump(kernel.asm["cubin"], "-sass")),
        "expected_shared_bytes": gc.shared_bytes(next_n, HEADS, HEAD_DIM, config),
    }


# --- the AOT tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[tuple[str, int], dict]:
    """Every case's report, from one child process (no TRITON_INTERPRET, a fresh Triton cache)."""
    if importlib.util.find_spec("triton") is None or gn.paged_mqa_logits_gluon_kernel is None:
        pytest.skip(f"no Gluon here: {gn.GLUON_IMPORT_ERROR or 'triton is not installed'}")
    cases = [["gluon", n] for n in NEXT_N] + [[kind, n] for kind in ("schedule", "tail") for n in SCHEDULE_NEXT_N]
    cases += [["fused", n] for n in FUSED_NEXT_N]
    found = compile_in_child(__file__, cases, tmp_path_factory.mktemp("triton_cache"))
    return {(r["kind"], r["next_n"]): r for r in found}


def _report(reports: dict, next_n: int, kind: str = "gluon") -> dict:
    report = reports[(kind, next_n)]
    assert "error" not in report, f"{kind} n={next_n}: compile failed: {report.get('error')}"
    return report


@pytest.mark.parametrize("next_n", NEXT_N)
def test_sm90_compile_is_warp_specialised_fp8_wgmma(reports, next_n: int) -> None:
    report = _report(reports, next_n)
    where = f"n={next_n} {report['config']} (triton {report['triton']})"
    assert report["ptx_wgmma_e4m3"] > 0 and report["sass_qgmma_e4m3"] > 0, f"{where}: no FP8 wgmma: {report}"
    # The load warp shrinks its registers, the consumers grow theirs: >= 3 distinct setmaxnreg values.
    assert len(report["setmaxnreg"]) >= 3, f"{where}: no register reallocation between partitions: {report}"
    assert report["tma_loads"] > 0, f"{where}: no TMA loads (UTMALDG) in the SASS: {report}"


@pytest.mark.parametrize("next_n", NEXT_N)
def test_sm90_compile_fits(reports, next_n: int) -> None:
    report = _report(reports, next_n)
    where = f"n={next_n} {report['config']} (triton {report['triton']})"
    assert report["registers"] <= MAX_REGISTERS, f"{where}: {report['registers']} registers"
    assert report["shared_bytes"] <= gc.MAX_SHARED_BYTES, f"{where}: {report['shared_bytes']} B shared memory"
    # Our own estimate (what check_gluon_config refuses by) must not undercount by more than alignment.
    assert report["shared_bytes"] <= report["expected_shared_bytes"] + 2048, f"{where}: estimate too low: {report}"
    span_bound = 0 if next_n <= SPILL_FREE_UP_TO else MAX_MMA_SPAN_LOCAL_ACCESSES
    assert report["mma_span_local_accesses"] <= span_bound, f"{where}: local memory between an MMA and its slot release"
    assert report["stack_bytes"] <= MAX_STACK_BYTES, f"{where}: {report['stack_bytes']} B stack frame"
    if next_n <= SPILL_FREE_UP_TO:
        spills = (report["stack_bytes"], report["local_bytes"], report["sass_local_accesses"])
        assert spills == (0, 0, 0), f"{where}: spills (stack bytes, local bytes, LDL/STL) = {spills}"


@pytest.mark.parametrize("kind", ["schedule", "tail"])
@pytest.mark.parametrize("next_n", SCHEDULE_NEXT_N)
def test_schedule_and_tail_compile_spill_free(reports, kind: str, next_n: int) -> None:
    report = _report(reports, next_n, kind)
    spills = (report["stack_bytes"], report["local_bytes"], report["sass_local_accesses"])
    assert spills == (0, 0, 0), f"{kind} n={next_n}: spills (stack bytes, local bytes, LDL/STL) = {spills}"
    assert report["registers"] <= MAX_REGISTERS and report["shared_bytes"] <= 16 * 1024, report


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="the fused step's select is compiled by nvcc")
@pytest.mark.parametrize("next_n", FUSED_NEXT_N)
def test_the_fused_step_compiles_both_halves_for_sm90(reports, next_n: int) -> None:
    """`gluon-fused` ahead of time: the Gluon kernel it launches (the same cubin as `gluon`'s) and its split select's
    library for sm_90, named in the description."""
    report, logits = _report(reports, next_n, "fused"), _report(reports, next_n)
    assert "libdsa_split_select-" in report["config"] and report["config"].endswith("-sm90.so"), report["config"]
    assert report["config"].startswith(logits["config"])
    assert (report["registers"], report["shared_bytes"]) == (logits["registers"], logits["shared_bytes"])


# --- host-side checks (no compiler, no GPU) ---------------------------------------------------------


def _args(batch=2, next_n=3, heads=HEADS, dim=HEAD_DIM, blocks=4, block_size=64, width=None):
    q = torch.zeros(batch, next_n, heads, dim).to(torch.float8_e4m3fn)
    cache = torch.zeros(blocks, block_size, 1, width or dim + 4, dtype=torch.uint8)
    weights = torch.zeros(batch * next_n, heads)
    lens = torch.full((batch, next_n), 100, dtype=torch.int32)
    table = torch.zeros(batch, 2, dtype=torch.int32)
    return q, cache, weights, lens, table, 128


def test_registered_and_unavailable_on_cpu_with_the_reason():
    backend = get_backend("gluon")
    assert isinstance(backend, gn.GluonNativeBackend) and not backend.cleans_tail  # DeepGEMM's convention
    assert backend.native_next_n(torch.device("cpu")) is None
    state = backend.availability(torch.device("cpu"))
    assert not state.ok and "SM90" in state.reason and "cpu" in state.reason
    with pytest.raises(BackendUnavailable, match="backend 'gluon' unavailable on cpu: .*SM90"):
        backend.require(torch.device("cpu"), 3, HEADS, HEAD_DIM, "fp8")
    with pytest.raises(BackendUnavailable, match="SM90"):
        backend.logits(*_args(), cache_dtype="fp8")


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda a: (a[0].float(),) + a[1:], ValueError, "q"),
        (lambda a: (a[0], a[1][:, :, :, :100]) + a[2:], ValueError, "kv_cache"),
        (lambda a: a[:1] + (torch.zeros(4, 64, 1, 68, dtype=torch.uint8),) + a[2:], ValueError, "kv_cache"),
        (lambda a: a[:2] + (a[2][:, :10],) + a[3:], ValueError, "weights"),
        (lambda a: a[:3] + (a[3].long(),) + a[4:], ValueError, "context_lens"),
        (lambda a: a[:5] + (0,), ValueError, "max_context_len"),
        (lambda a: _args(next_n=17), ValueError, "next_n"),
        (lambda a: _args(heads=48), UnsupportedShape, "num_heads"),
        (lambda a: _args(block_size=32), UnsupportedShape, "block_size"),
    ],
)
def test_bad_input_refused_by_name_before_availability(change, error, match):
    args = change(_args())
    with pytest.raises(error, match=match):
        gn.paged_mqa_logits_gluon(*args, cache_dtype="fp8")


def test_cache_dtype_is_required_and_checked():
    with pytest.raises(TypeError):
        gn.paged_mqa_logits_gluon(*_args())  # cache_dtype is keyword-only and required
    with pytest.raises(ValueError, match="cache_dtype"):
        gn.paged_mqa_logits_gluon(*_args(), cache_dtype="fp16")
    with pytest.raises((ValueError, UnsupportedShape), match="cache_dtype|kv_cache"):
        gn.paged_mqa_logits_gluon(*_args(), cache_dtype="mxfp4")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"consumers": 5}, "consumers"),
        ({"consumers": 3, "stages": 8}, "stages=8: must be a multiple of consumers=3"),
        ({"stages": -4}, "stages"),
        ({"plan": "zigzag"}, "plan"),
        ({"mma_columns": 96}, "mma_columns"),
        ({"loader_registers": 30}, "loader_registers"),
        ({"query_slots": 3}, "query_slots"),
    ],
)
def test_bad_config_refused_by_name_when_made(fields, match):
    with pytest.raises(ValueError, match=match):
        gc.GluonConfig(**fields)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ("c3", "config: expected a GluonConfig"),
        (gc.GluonConfig(consumers=2, stages=32), "shared memory"),
        (gc.GluonConfig(consumers=2, stages=12, query_slots=2), "shared memory"),  # n = 8: two Q buffers too many
    ],
)
def test_bad_config_refused_by_name(config, match):
    args = _args(next_n=8)
    with pytest.raises(ValueError, match=match):
        gn.paged_mqa_logits_gluon(*args, config=config, cache_dtype="fp8")


def test_bad_schedule_and_clean_tail_refused_by_name():
    args = _args()
    with pytest.raises(ValueError, match="schedule: expected a BalancedSchedule"):
        gn.paged_mqa_logits_gluon(*args, cache_dtype="fp8", schedule=(1, 2))
    with pytest.raises(ValueError, match="clean_tail"):
        gn.paged_mqa_logits_gluon(*args, cache_dtype="fp8", clean_tail="yes")


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: gc.gluon_chunk_plan(16, 3, "pair"), "heads"),
        (lambda: gc.gluon_chunk_plan(17, 64, "pair"), "next_n"),
        (lambda: gc.gluon_chunk_plan(3, 64, "pair", 96), "mma_columns"),
        (lambda: gc.shared_bytes(3, 64, 128, "c3"), "config"),
        (lambda: gc.shared_bytes(3, 64, 96, gc.GluonConfig()), "head_dim"),
        (lambda: gn.compile_for(75, 3, 64, 128, gc.GluonConfig()), "arch"),
        (lambda: gn.compile_for("90", 3, 64, 128, gc.GluonConfig()), "arch"),
        (lambda: sc.compile_for(0, "schedule", 3), "arch"),
        (lambda: sc.compile_for(90, "gather", 3), "kernel"),
    ],
)
def test_helpers_check_their_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_bad_out_refused_by_name():
    args = _args()
    with pytest.raises(ValueError, match="out"):
        gn.paged_mqa_logits_gluon(*args, out=torch.zeros(3, 3), cache_dtype="fp8")


@pytest.mark.parametrize("mode", gc.PLAN_MODES)
@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("mma_columns", [64, 128, 256])
def test_chunk_plans_are_power_of_two_mmas_covering_every_row(mode, heads, mma_columns):
    for next_n in range(1, gc.MAX_NEXT_N + 1):
        plan = gc.gluon_chunk_plan(next_n, heads, mode, mma_columns)
        rows = [r for first, size in plan for r in range(first, first + size)]
        assert all(size & (size - 1) == 0 for _, size in plan), plan
        assert all(size * heads <= max(mma_columns, heads) for _, size in plan), plan
        assert rows == list(range(len(rows))), f"chunks must tile rows in order: {plan}"
        if mode == "pad":
            assert len(rows) >= next_n and len(rows) - next_n < max(1, mma_columns // heads), plan
        else:
            assert len(rows) == next_n, plan
    assert gc.gluon_chunk_plan(3, 64, "pair", 256) == ((0, 2), (2, 1))  # N=128 + N=64 (PR #340's scheme)
    assert gc.gluon_chunk_plan(3, 64, "pad", 256) == ((0, 4),)  # one N=256 MMA, row 3 dropped


def test_groups_and_slots_respect_the_column_budget():
    # n = 7, N <= 128 a chunk: (0,2) (2,2) (4,2) (6,1); at most 256 columns a group
    groups = gc.chunk_groups(7, 64, "pair", 128, 256)
    assert groups == (((0, 2, 0, 0), (2, 2, 1, 1)), ((4, 2, 0, 2), (6, 1, -1, 3)))
    assert gc.slot_columns(7, 64, "pair", 128, 256) == (128, 128)
    for next_n in range(1, gc.MAX_NEXT_N + 1):
        groups = gc.chunk_groups(next_n, 64, "pair", 128, 256)
        chunks = [chunk for group in groups for chunk in group]
        assert [c[3] for c in chunks] == list(range(len(chunks)))
        assert [(c[0], c[1]) for c in chunks] == list(gc.gluon_chunk_plan(next_n, 64, "pair", 128))
        assert all(sum(c[1] * 64 for c in group) <= 256 for group in groups)


@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("dim", [64, 128])
def test_rule_fits_shared_memory_and_descriptors_are_valid(heads, dim):
    for next_n in range(1, gc.MAX_NEXT_N + 1):
        config = gc.choose_gluon_config(next_n, heads, dim)
        assert gc.shared_bytes(next_n, heads, dim, config) <= gc.MAX_SHARED_BYTES, (next_n, config)
        for name, (dtype, box) in gn.descriptor_blocks(next_n, heads, dim, config).items():
            element = 1 if dtype == "fp8e4nv" else 4
            assert all(1 <= side <= 256 for side in box), (name, box)  # TMA box limits
            assert box[-1] * element >= 16, (name, box)
    # The fused FP8 page (64 x D values, then 64 f32 scales) is whole rows of D bytes, which the
    # K descriptor's 2-D view relies on, and the scales start at f32 column 16 * D of the page.
    assert (64 * (dim + 4)) % dim == 0 and 64 * dim % 4 == 0


if __name__ == "__main__":
    report_cases(("kind", "next_n"), json.loads(sys.argv[1]), compile_case)
