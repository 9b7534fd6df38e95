"""Bad input to every registered backend's `logits` (DeepGEMM's convention plus `cache_dtype`): refused by name.

No kernel is launched: every refusal happens in the host checks (and, for CPU tensors,
the value scan) before it, so this runs without the Triton interpreter. DeepGEMM, its PR #340
build and the Gluon kernel cannot run on a CPU: their host checks still name bad arguments,
and good ones get BackendUnavailable with the reason (`tests/test_backend_contract.py`).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_lab.errors import BackendUnavailable, UnsupportedShape
from dsa_lab.kernels import backend_names, get_backend
from dsa_lab.kernels import triton_native as tn
from dsa_lab.kernels.convention import check_logits_args
from dsa_lab.kernels.reference import paged_mqa_logits

BACKENDS = backend_names()  # every registered backend gets the battery, whether it can run here or not
CPU_SCANNED = ("reference", "triton")  # backends whose CPU calls scan context lens and block ids


def args(
    batch: int = 2, next_n: int = 2, heads: int = 32, dim: int = 128, width: int | None = None, blocks: int = 4
) -> dict:
    return dict(
        q=torch.zeros(batch, next_n, heads, dim).to(torch.float8_e4m3fn),
        kv_cache=torch.zeros(blocks, 64, 1, dim + 4 if width is None else width, dtype=torch.uint8),
        weights=torch.zeros(batch * next_n, heads),
        context_lens=torch.full((batch, next_n), 100, dtype=torch.int32),
        block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)[:batch],
        max_context_len=128,
        cache_dtype="fp8",
    )


GOOD = args()
TABLE_OUT = torch.tensor([[0, 10**6], [2, 3]], dtype=torch.int32)

HOST_CASES = {  # checked by every backend on every call (no device sync)
    "q float32": (dict(q=GOOD["q"].float()), r"q: dtype"),
    "q 3-D": (dict(q=GOOD["q"][0]), r"q: expected 4 dims"),
    "q a list": (dict(q=[[0.0]]), r"q: expected a torch.Tensor"),
    "kv_cache float": (dict(kv_cache=GOOD["kv_cache"].float()), r"kv_cache: dtype"),
    "kv_cache 3-D": (dict(kv_cache=GOOD["kv_cache"][0]), r"kv_cache: expected 4 dims"),
    "kv_cache no blocks": (dict(kv_cache=GOOD["kv_cache"][:0]), r"kv_cache: cache_dtype='fp8'"),
    "kv_cache strided": (dict(kv_cache=torch.zeros(4, 64, 2, 132, dtype=torch.uint8)[:, :, :1]), r"kv_cache: must be contiguous"),
    # An FP8 cache of head_dim 64 has MXFP4-at-128's width (68 B): it used to be read as MXFP4.
    "fp8 D=64 cache under a D=128 q": (dict(kv_cache=torch.zeros(4, 64, 1, 68, dtype=torch.uint8)),
                                       r"kv_cache: cache_dtype='fp8' at head_dim=128 .*\(68 bytes a token is fp8 at head_dim 64 or mxfp4"),
    "fp8 cache declared mxfp4": (dict(cache_dtype="mxfp4"), r"kv_cache: cache_dtype='mxfp4' at head_dim=128"),
    "cache_dtype unknown": (dict(cache_dtype="int4"), r"cache_dtype='int4'"),
    "cache_dtype None": (dict(cache_dtype=None), r"cache_dtype=None"),
    "weights shape": (dict(weights=GOOD["weights"][:, :8]), r"weights: expected shape"),
    "weights float64": (dict(weights=GOOD["weights"].double()), r"weights: dtype"),
    "context_lens int64": (dict(context_lens=GOOD["context_lens"].long()), r"context_lens: dtype"),
    "context_lens shape": (dict(context_lens=GOOD["context_lens"][:, :1]), r"context_lens: expected shape"),
    "block_table int64": (dict(block_table=GOOD["block_table"].long()), r"block_table: dtype"),
    "block_table rows": (dict(block_table=GOOD["block_table"][:1]), r"block_table: expected shape"),
    "max_context_len zero": (dict(max_context_len=0), r"max_context_len=0"),
    "max_context_len float": (dict(max_context_len=128.0), r"max_context_len=128\.0"),
    "max_context_len bool": (dict(max_context_len=True), r"max_context_len=True"),
}  # fmt: skip

VALUE_CASES = {  # scanned on the CPU on every call; on a GPU once per launch (decode.check_launches)
    "context past the table": (dict(context_lens=torch.full((2, 2), 129, dtype=torch.int32)), r"context_lens: values must lie in \[0, 128\]"),
    "context negative": (dict(context_lens=torch.tensor([[-1, 5], [5, 5]], dtype=torch.int32)), r"context_lens: values must lie"),
    "context past max_context_len": (dict(max_context_len=64), r"context_lens: values must lie in \[0, 64\]"),
    "block id 10**6": (dict(block_table=TABLE_OUT), r"block_table: ids .* \[0, 3\]"),
    "block id -1": (dict(block_table=torch.tensor([[0, -1], [2, 3]], dtype=torch.int32)), r"block_table: ids"),
    "block id = num_blocks": (dict(block_table=torch.tensor([[0, 4], [2, 3]], dtype=torch.int32)), r"block_table: ids"),
}  # fmt: skip


def call(backend: str, change: dict) -> torch.Tensor:
    return get_backend(backend).logits(**{**GOOD, **change})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(HOST_CASES))
def test_every_backend_refuses_bad_arguments_by_name(backend: str, case: str) -> None:
    change, name = HOST_CASES[case]
    with pytest.raises(ValueError, match=name):
        call(backend, change)


@pytest.mark.parametrize("backend", CPU_SCANNED)
@pytest.mark.parametrize("case", list(VALUE_CASES))
def test_cpu_backends_refuse_bad_values_by_name(backend: str, case: str) -> None:
    """Triton's logits with block id 10**6 used to read outside the cache (SIGSEGV on the CPU)."""
    change, name = VALUE_CASES[case]
    with pytest.raises(ValueError, match=name):
        call(backend, change)


def test_cache_dtype_is_a_required_keyword() -> None:
    without = {k: v for k, v in GOOD.items() if k != "cache_dtype"}
    for backend in BACKENDS:
        with pytest.raises(TypeError, match="cache_dtype"):
            get_backend(backend).logits(*without.values())
    with pytest.raises(TypeError, match="cache_dtype"):
        check_logits_args(*without.values())


def test_an_id_in_a_slot_no_row_reads_is_fine() -> None:
    """The positive control: only blocks under a row's context are scanned (vLLM leaves the rest)."""
    short = {**GOOD, "context_lens": torch.full((2, 2), 60, dtype=torch.int32), "block_table": TABLE_OUT}
    out = paged_mqa_logits(**short)
    assert out.shape == (4, 128) and torch.isfinite(out[:, :60]).all()


TRITON_CASES = {
    "mxfp4": (dict(kv_cache=torch.zeros(4, 64, 1, 68, dtype=torch.uint8), cache_dtype="mxfp4"), UnsupportedShape, r"cache_dtype='mxfp4'"),
    "next_n 17": (dict(q=torch.zeros(1, 17, 32, 128).to(torch.float8_e4m3fn), weights=torch.zeros(17, 32),
                       context_lens=torch.full((1, 17), 5, dtype=torch.int32), block_table=GOOD["block_table"][:1]),
                  ValueError, r"next_n=17"),
    "block_size 32": (dict(kv_cache=torch.zeros(4, 32, 1, 132, dtype=torch.uint8), context_lens=torch.full((2, 2), 60, dtype=torch.int32),
                           max_context_len=64), UnsupportedShape, r"block_size=32"),
    "heads 48": (dict(q=torch.zeros(2, 2, 48, 128).to(torch.float8_e4m3fn), weights=torch.zeros(4, 48)), UnsupportedShape, r"num_heads=48"),
    "config": (dict(config="fast"), ValueError, r"config: expected a KernelConfig"),
    "check_values": (dict(check_values="no"), ValueError, r"check_values='no'"),
    "out shape": (dict(out=torch.empty(4, 64)), ValueError, r"out: expected shape"),
    "out dtype": (dict(out=torch.empty(4, 128, dtype=torch.float64)), ValueError, r"out: dtype"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TRITON_CASES))
def test_triton_function_refuses_bad_input_by_name(case: str) -> None:
    change, error, name = TRITON_CASES[case]
    with pytest.raises(error, match=name):
        tn.paged_mqa_logits_triton(**{**GOOD, **change})


def test_deepgemm_on_cpu_says_why_it_cannot_run() -> None:
    backend = get_backend("deepgemm")
    with pytest.raises(BackendUnavailable, match=r"deepgemm.*unavailable on cpu: backend .deepgemm. needs a CUDA GPU"):
        backend.logits(**GOOD)
    with pytest.raises(BackendUnavailable, match=r"needs a CUDA GPU"):
        backend.schedule(GOOD["context_lens"], 64, GOOD["block_table"])
    with pytest.raises(BackendUnavailable, match=r"needs a CUDA GPU"):
        backend.require(torch.device("cpu"), 1, 64, 128, "fp8")
    with pytest.raises(UnsupportedShape, match=r"head_dim=64: backend 'deepgemm' allows \(128,\)"):
        backend.logits(**args(dim=64))
    with pytest.raises(ValueError, match=r"block_size=0"):
        backend.schedule(GOOD["context_lens"], 0, GOOD["block_table"])


@pytest.mark.parametrize("name", ["nope", None, 3, ["reference"]])
def test_unknown_backend_is_named(name: object) -> None:
    with pytest.raises(ValueError, match=r"backend="):
        get_backend(name)


@settings(max_examples=40, deadline=None)
@given(
    bad=st.one_of(st.integers(4, 2**31 - 1), st.integers(-(2**31), -1)), row=st.integers(0, 1), slot=st.integers(0, 1)
)
def test_any_block_id_outside_the_cache_is_refused_before_a_kernel_reads_it(bad: int, row: int, slot: int) -> None:
    table = GOOD["block_table"].clone()
    table[row, slot] = bad
    for backend in CPU_SCANNED:
        with pytest.raises(ValueError, match=r"block_table: ids"):
            call(backend, {"block_table": table})


@settings(max_examples=40, deadline=None)
@given(width=st.integers(1, 600), dim=st.sampled_from([64, 128]), dtype=st.sampled_from(["fp8", "mxfp4"]))
def test_a_cache_width_that_contradicts_the_declared_dtype_is_refused(width: int, dim: int, dtype: str) -> None:
    expected = dim + 4 if dtype == "fp8" else dim // 2 + dim // 32
    change = dict(
        q=torch.zeros(2, 2, 32, dim).to(torch.float8_e4m3fn),
        kv_cache=torch.zeros(4, 64, 1, width, dtype=torch.uint8),
        cache_dtype=dtype,
    )
    if width == expected:
        check_logits_args(**{**GOOD, **change})
    else:
        with pytest.raises(ValueError, match=rf"kv_cache: cache_dtype='{dtype}' at head_dim={dim}"):
            check_logits_args(**{**GOOD, **change})


# ---------------------------------------------------------------- the Triton kernel's ahead-of-time helpers

AOT = {  # compile_for refuses every bad argument itself, before Triton sees it (no compile happens here)
    "arch 0": (lambda: tn.compile_for(0, 1, 64, 128, tn.KernelConfig()), r"arch=0: allowed values are \(89, 90, 100"),
    "arch '90'": (lambda: tn.compile_for("90", 1, 64, 128, tn.KernelConfig()), r"arch='90': allowed values"),
    "arch 75": (lambda: tn.compile_for(75, 1, 64, 128, tn.KernelConfig()), r"arch=75: allowed values"),
    "arch 80 (no e4m3 dot)": (lambda: tn.compile_for(80, 1, 64, 128, tn.KernelConfig()), r"arch=80"),
    "arch 90.0": (lambda: tn.compile_for(90.0, 1, 64, 128, tn.KernelConfig()), r"arch=90\.0"),
    "arch True": (lambda: tn.compile_for(True, 1, 64, 128, tn.KernelConfig()), r"arch=True"),
    "next_n 17": (lambda: tn.compile_for(90, 17, 64, 128, tn.KernelConfig()), r"next_n=17: allowed range is \[1, 16\]"),
    "heads 48": (lambda: tn.compile_for(90, 1, 48, 128, tn.KernelConfig()), r"heads=48"),
    "head_dim 100": (lambda: tn.compile_for(90, 1, 64, 100, tn.KernelConfig()), r"head_dim=100"),
    "config a string": (lambda: tn.compile_for(90, 1, 64, 128, "fast"), r"config='fast'"),
    "dot_rows 96": (lambda: tn.KernelConfig(dot_rows=96), r"dot_rows=96: must be a power of two"),
    "dot_rows 0": (lambda: tn.KernelConfig(dot_rows=0), r"dot_rows=0"),
    "num_warps 3": (lambda: tn.KernelConfig(num_warps=3), r"num_warps=3: allowed values"),
    "num_stages 0": (lambda: tn.KernelConfig(num_stages=0), r"num_stages=0"),
    "resident_weights 'yes'": (lambda: tn.KernelConfig(resident_weights="yes"), r"resident_weights='yes'"),
    "blocks_per_program -1": (lambda: tn.KernelConfig(blocks_per_program=-1), r"blocks_per_program=-1"),
    "chunk_plan next_n 0": (lambda: tn.chunk_plan(0, 64, 256), r"next_n=0"),
    "chunk_plan heads 0": (lambda: tn.chunk_plan(3, 0, 256), r"heads=0"),
    "chunk_plan dot_rows 0": (lambda: tn.chunk_plan(3, 64, 0), r"dot_rows=0"),
    "blocks_per_program no SMs": (lambda: tn.blocks_per_program(8, 8, 0), r"num_sms=0"),
    "blocks_per_program batch 0": (lambda: tn.blocks_per_program(0, 8, 132), r"batch=0"),
}


@pytest.mark.parametrize("case", list(AOT))
def test_triton_aot_helpers_refuse_bad_input_by_name(case: str) -> None:
    """compile_for with arch 0, '90' or 75 used to raise Triton's own errors; no helper checked the arch."""
    call, name = AOT[case]
    with pytest.raises(ValueError, match=name):
        call()


@settings(max_examples=40, deadline=None)
@given(arch=st.integers(-1000, 1000).filter(lambda a: a not in tn.AOT_ARCHS))
def test_any_arch_outside_the_allowed_list_is_refused(arch: int) -> None:
    with pytest.raises(ValueError, match=rf"arch={arch}: allowed values are"):
        tn.compile_for(arch, 1, 64, 128, tn.KernelConfig())
