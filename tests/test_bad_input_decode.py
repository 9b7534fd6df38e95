"""Bad input to the decode glue: refused by name before any kernel runs; no launch is dropped."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_lab.batch.cache import PagedCache
from dsa_lab.batch.metadata import build_metadata
from dsa_lab.batch.workload import random_inputs, uniform_batch
from dsa_lab.decode import check_launches, launch_logits, pack_launch, run_decode, run_logits, scatter_logits
from dsa_lab.errors import UnsupportedShape
from dsa_lab.kernels import get_backend

INPUTS = random_inputs(uniform_batch(2, 100, 3, num_heads=32, head_dim=64), seed=0)
ATOM = build_metadata(
    "atom", INPUTS.batch, INPUTS.cache.block_table, (1, 2, 4)
)  # 3 = one padded 4 with sizes (1, 2, 4)
SPLIT = build_metadata("atom", INPUTS.batch, INPUTS.cache.block_table, (1, 2))  # 2 + 1: two launches
REFERENCE = get_backend("reference")
OUTPUTS = run_logits(INPUTS, SPLIT, REFERENCE)


def with_table(table: torch.Tensor):
    cache = PagedCache(INPUTS.cache.data, table, INPUTS.cache.head_dim, INPUTS.cache.cache_dtype)
    return dataclasses.replace(INPUTS, cache=cache)


OUT_OF_RANGE = INPUTS.cache.block_table.clone()
OUT_OF_RANGE[1, 0] = 10**6
OTHER = build_metadata(
    "native", uniform_batch(3, 100, 3, num_heads=32, head_dim=64), torch.zeros(3, 2, dtype=torch.int32), (1, 2, 4)
)

CASES = {
    "scatter drops a launch": (lambda: scatter_logits(SPLIT, OUTPUTS[:1], torch.device("cpu")), r"outputs: 1 tensors for 2 launches"),
    "scatter extra output": (lambda: scatter_logits(SPLIT, [*OUTPUTS, OUTPUTS[0]], torch.device("cpu")), r"outputs: 3 tensors"),
    "scatter swapped outputs": (lambda: scatter_logits(SPLIT, OUTPUTS[::-1], torch.device("cpu")), r"outputs\[0\]: expected \[4,"),
    "scatter narrow output": (lambda: scatter_logits(SPLIT, [o[:, :50] for o in OUTPUTS], torch.device("cpu")), r"outputs\[0\]"),
    "scatter int output": (lambda: scatter_logits(SPLIT, [o.int() for o in OUTPUTS], torch.device("cpu")), r"outputs\[0\]: dtype"),
    "run_decode inputs": (lambda: run_decode("inputs", "native"), r"inputs: expected a DecodeInputs"),
    "run_decode strategy": (lambda: run_decode(INPUTS, "sideways"), r"strategy='sideways'"),
    "run_decode backend name": (lambda: run_decode(INPUTS, "native", "nope"), r"backend='nope'"),
    "run_decode backend object": (lambda: run_decode(INPUTS, "native", 42), r"backend=42"),
    "run_decode topk zero": (lambda: run_decode(INPUTS, "native", topk=0), r"topk=0"),
    "run_decode topk float": (lambda: run_decode(INPUTS, "native", topk=8.5), r"topk=8\.5"),
    "run_decode block id 10**6": (lambda: run_decode(with_table(OUT_OF_RANGE), "native"), r"block_table: ids"),
    "run_logits schedules": (lambda: run_logits(INPUTS, SPLIT, REFERENCE, schedules=[None]), r"schedules: 1 for 2 launches"),
    "check metadata of another batch": (lambda: check_launches(OTHER, INPUTS), r"metadata: built for 9 query tokens"),
    "check metadata type": (lambda: check_launches("native", INPUTS), r"metadata: expected a DecodeMetadata"),
    "pack launch type": (lambda: pack_launch(SPLIT, INPUTS), r"launch: expected a KernelLaunch"),
    "pack inputs type": (lambda: pack_launch(SPLIT.launches[0], None), r"inputs: expected a DecodeInputs"),
    "launch_logits raw tensor as cache": (
        lambda: launch_logits(REFERENCE, pack_launch(ATOM.launches[0], INPUTS), INPUTS.cache.data, 100), r"cache: expected a PagedCache"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_decode_refuses_bad_input_by_name(case: str) -> None:
    call, name = CASES[case]
    with pytest.raises(ValueError, match=name):
        call()


def test_triton_never_sees_an_out_of_range_block_id() -> None:
    """It used to read outside the cache (SIGSEGV under the interpreter with id 10**6)."""
    state = get_backend("triton").availability(torch.device("cpu"))
    if not state.ok:
        pytest.skip(state.reason)
    for strategy in ("native", "flatten", "atom"):
        with pytest.raises(ValueError, match=r"block_table: ids"):
            run_decode(with_table(OUT_OF_RANGE), strategy, "triton")


def test_mxfp4_through_triton_is_unsupported_not_misread() -> None:
    mx = random_inputs(uniform_batch(1, 70, 1, num_heads=32, head_dim=64, cache_dtype="mxfp4"), seed=1)
    with pytest.raises(UnsupportedShape, match=r"cache_dtype='mxfp4'"):
        run_decode(mx, "native", "triton")


@settings(max_examples=25, deadline=None)
@given(
    row=st.integers(0, 1),
    slot=st.integers(0, 1),
    bad=st.one_of(st.integers(-(2**31), -1), st.integers(5, 2**31 - 1)),
    strategy=st.sampled_from(["native", "flatten", "atom"]),
)
def test_a_corrupt_block_id_is_refused_before_any_launch(row: int, slot: int, bad: int, strategy: str) -> None:
    table = INPUTS.cache.block_table.clone()
    table[row, slot] = bad
    with pytest.raises(ValueError, match=r"block_table: ids"):
        run_decode(with_table(table), strategy, topk=8)
