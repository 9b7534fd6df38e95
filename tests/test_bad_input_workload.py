"""Bad input to the workload layer: every call is refused by a ValueError naming the argument."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_lab.batch.workload import (
    DecodeBatch,
    DecodeInputs,
    mixed_length_batch,
    ragged_decode_batch,
    random_inputs,
    uniform_batch,
    with_padding,
)

SMALL = dict(num_heads=32, head_dim=64)
GOOD = uniform_batch(2, 70, 2, **SMALL)


def batch(**change) -> DecodeBatch:
    return DecodeBatch(**{"seq_lens": (70, 70), "decode_lens": (2, 2), "next_n": 2, **SMALL, **change})


def inputs(**change) -> DecodeInputs:
    good = random_inputs(GOOD, seed=0)
    return DecodeInputs(**{**{f.name: getattr(good, f.name) for f in dataclasses.fields(good)}, **change})


def nan_q() -> torch.Tensor:
    q = random_inputs(GOOD, seed=0).q.clone()
    q.view(torch.uint8)[0, 0, 0] = 0x7F  # an e4m3 NaN
    return q


CASES = {
    "seq_len float": (lambda: batch(seq_lens=(10.7, 70)), r"seq_lens\[0\]=10\.7"),
    "seq_len whole float": (lambda: batch(seq_lens=(70.0, 70)), r"seq_lens\[0\]=70\.0"),
    "seq_len bool": (lambda: batch(seq_lens=(True, 70)), r"seq_lens\[0\]=True"),
    "seq_len str": (lambda: batch(seq_lens=("70", 70)), r"seq_lens\[0\]='70'"),
    "seq_len None": (lambda: batch(seq_lens=(None, 70)), r"seq_lens\[0\]=None"),
    "seq_len negative": (lambda: batch(seq_lens=(-1, 70)), r"seq_lens\[0\]=-1"),
    "seq_lens scalar": (lambda: batch(seq_lens=70), r"seq_lens=70"),
    "seq_lens string": (lambda: batch(seq_lens="70"), r"seq_lens='70'"),
    "seq_lens empty": (lambda: batch(seq_lens=(), decode_lens=()), r"seq_lens"),
    "decode_len float": (lambda: batch(decode_lens=(1.5, 2)), r"decode_lens\[0\]=1\.5"),
    "decode_len bool": (lambda: batch(decode_lens=(True, 2)), r"decode_lens\[0\]=True"),
    "decode_len above next_n": (lambda: batch(decode_lens=(3, 2)), r"decode_lens\[0\]"),
    "decode_len above seq_len": (lambda: batch(seq_lens=(1, 70)), r"decode_lens\[0\]"),
    "decode_lens length": (lambda: batch(decode_lens=(2,)), r"decode_lens"),
    "no token decodes": (lambda: batch(decode_lens=(0, 0)), r"decode_lens"),
    "next_n zero": (lambda: batch(next_n=0, decode_lens=(0, 0)), r"next_n=0"),
    "next_n 17": (lambda: batch(next_n=17), r"next_n=17"),
    "next_n float": (lambda: batch(next_n=2.0), r"next_n=2\.0"),
    "next_n bool": (lambda: batch(next_n=True, decode_lens=(1, 1)), r"next_n=True"),
    "num_heads float": (lambda: batch(num_heads=32.0), r"num_heads=32\.0"),
    "num_heads 48": (lambda: batch(num_heads=48), r"num_heads=48"),
    "head_dim bool": (lambda: batch(head_dim=True), r"head_dim=True"),
    "head_dim 96": (lambda: batch(head_dim=96), r"head_dim=96"),
    "block_size zero": (lambda: batch(block_size=0), r"block_size=0"),
    "block_size negative": (lambda: batch(block_size=-64), r"block_size=-64"),
    "cache_dtype": (lambda: batch(cache_dtype="int8"), r"cache_dtype='int8'"),
    "cache_dtype None": (lambda: batch(cache_dtype=None), r"cache_dtype=None"),
    "num_decode_tokens float": (lambda: batch(num_decode_tokens=4.5), r"num_decode_tokens=4\.5"),
    "num_decode_tokens short": (lambda: batch(num_decode_tokens=3), r"num_decode_tokens=3"),
    "uniform batch_size zero": (lambda: uniform_batch(0, 70, 2), r"batch_size=0"),
    "uniform seq_len float": (lambda: uniform_batch(2, 70.5, 2), r"seq_len=70\.5"),
    "uniform seq_len below next_n": (lambda: uniform_batch(2, 1, 2), r"seq_len=1"),
    "uniform next_n float": (lambda: uniform_batch(2, 70, 2.5), r"next_n=2\.5"),
    "mixed batch_size zero": (lambda: mixed_length_batch(0, 10, 100, 1, seed=0), r"batch_size=0"),
    "mixed batch_size negative": (lambda: mixed_length_batch(-3, 10, 100, 1, seed=0), r"batch_size=-3"),
    "mixed min above max": (lambda: mixed_length_batch(2, 200, 100, 1, seed=0), r"min_len=200"),
    "mixed max float": (lambda: mixed_length_batch(2, 10, 100.5, 1, seed=0), r"max_len=100\.5"),
    "mixed seed float": (lambda: mixed_length_batch(2, 10, 100, 1, seed=0.5), r"seed=0\.5"),
    "ragged max below min": (lambda: ragged_decode_batch(2, 100, 50, 2, seed=0), r"min_len=100"),
    "ragged next_n zero": (lambda: ragged_decode_batch(2, 10, 50, 0, seed=0), r"next_n=0"),
    "padding negative": (lambda: with_padding(GOOD, -1), r"padding_requests=-1"),
    "padding tokens float": (lambda: with_padding(GOOD, 1, 0.5), r"padding_tokens=0\.5"),
    "padding not a batch": (lambda: with_padding((70, 70), 1), r"batch"),
    "random_inputs not a batch": (lambda: random_inputs("batch"), r"batch"),
    "random_inputs seed float": (lambda: random_inputs(GOOD, seed=1.5), r"seed=1\.5"),
    "random_inputs seed 2**70": (lambda: random_inputs(GOOD, seed=2**70), r"seed=1180591620717411303424: allowed range"),
    "random_inputs seed negative": (lambda: random_inputs(GOOD, seed=-1), r"seed=-1: allowed range is \[0, "),
    "mixed seed 2**64": (lambda: mixed_length_batch(2, 10, 100, 1, seed=2**64), r"seed=18446744073709551616"),
    "ragged seed negative": (lambda: ragged_decode_batch(2, 10, 50, 2, seed=-5), r"seed=-5"),
    "random_inputs device name": (lambda: random_inputs(GOOD, device="gpu"), r"device='gpu'"),
    "random_inputs device tpu": (lambda: random_inputs(GOOD, device="xla"), r"device='xla'"),
    "inputs q dtype": (lambda: inputs(q=random_inputs(GOOD).q.float()), r"q: dtype"),
    "inputs q shape": (lambda: inputs(q=random_inputs(GOOD).q[:, :16]), r"q: expected shape"),
    "inputs q NaN": (lambda: inputs(q=nan_q()), r"q: 1 non-finite"),
    "inputs weights NaN": (lambda: inputs(weights=torch.full((4, 32), float("nan"))), r"weights: 128 non-finite"),
    "inputs weights inf": (lambda: inputs(weights=torch.full((4, 32), float("inf"))), r"weights: 128 non-finite"),
    "inputs weights dtype": (lambda: inputs(weights=torch.zeros(4, 32, dtype=torch.float64)), r"weights: dtype"),
    "inputs cache of another batch": (
        lambda: inputs(cache=random_inputs(uniform_batch(3, 70, 2, **SMALL)).cache), r"cache: built as"),
    "inputs cache of another dtype": (
        lambda: inputs(cache=random_inputs(uniform_batch(2, 70, 2, num_heads=32, head_dim=64, cache_dtype="mxfp4")).cache),
        r"cache: built as"),
    "inputs cache not a cache": (lambda: inputs(cache="cache"), r"cache: expected a PagedCache"),
    "inputs batch not a batch": (lambda: inputs(batch=(70, 70)), r"batch: expected a DecodeBatch"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_workload_refuses_bad_input_by_name(case: str) -> None:
    call, name = CASES[case]
    with pytest.raises(ValueError, match=name):
        call()


def test_numpy_ints_are_accepted_and_stored_as_python_ints() -> None:
    """The positive control: integer-valued NumPy scalars (from a data frame, say) are ints."""
    made = DecodeBatch((np.int64(70), 70), (np.int32(2), 2), np.int64(2), np.int64(32), 64)
    assert made == batch() and all(type(x) is int for x in (*made.seq_lens, made.next_n, made.num_heads))


def test_cuda_device_without_a_gpu_is_named() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    with pytest.raises(ValueError, match=r"device='cuda': no CUDA device"):
        random_inputs(GOOD, device="cuda")


@settings(max_examples=60, deadline=None)
@given(
    index=st.integers(0, 2),
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.integers(max_value=-1),
        st.text(max_size=3),
        st.none(),
    ),
)
def test_any_non_int_or_negative_seq_len_is_refused_by_index(index: int, value: object) -> None:
    seq_lens = [70, 70, 70]
    seq_lens[index] = value
    with pytest.raises(ValueError, match=rf"seq_lens\[{index}\]="):
        DecodeBatch(tuple(seq_lens), (1, 1, 1), 1)


@settings(max_examples=40, deadline=None)
@given(next_n=st.one_of(st.integers(max_value=0), st.integers(min_value=17), st.floats(), st.booleans()))
def test_any_next_n_outside_1_to_16_is_refused(next_n: object) -> None:
    with pytest.raises(ValueError, match=r"next_n="):
        DecodeBatch((70,), (1,), next_n)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(min_value=1 << 63, max_value=1 << 80) | st.integers(max_value=-1))
def test_a_seed_outside_0_to_2_63_is_refused_by_name_not_overflowed(seed: int) -> None:
    """A seed of 2**70 used to end in torch's "Overflow when unpacking long long", naming nothing."""
    with pytest.raises(ValueError, match=r"seed=-?\d+: allowed range is \[0, 9223372036854775807\]"):
        mixed_length_batch(2, 10, 100, 1, seed=seed)


def test_the_top_seed_is_accepted_everywhere() -> None:
    top = (1 << 63) - 1
    assert len(mixed_length_batch(2, 10, 100, 1, seed=top).seq_lens) == 2
    assert random_inputs(GOOD, seed=top).cache.num_blocks > 0  # its cache's seed (seed + 1) wraps to 0
