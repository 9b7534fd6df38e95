"""Bad input to the paged cache: refused by name, and never a cache that maps two blocks onto one."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_lab.batch.cache import (
    PagedCache,
    build_paged_cache,
    bytes_per_token,
    dequantize_blocks,
    dequantize_mxfp4,
    gather_request_keys,
    permuted_block_table,
    quantize_fp8,
    quantize_mxfp4,
    random_paged_cache,
)

KEYS = [torch.randn(100, 64, generator=torch.Generator().manual_seed(0)), torch.randn(30, 64)]
CACHE = build_paged_cache(KEYS, 64, "fp8", seed=1)


def with_nan(k: torch.Tensor, value: float = float("nan")) -> torch.Tensor:
    k = k.clone()
    k[3, 5] = value
    return k


CASES = {
    "spare_blocks negative": (lambda: build_paged_cache(KEYS, spare_blocks=-1), r"spare_blocks=-1"),
    "spare_blocks float": (lambda: build_paged_cache(KEYS, spare_blocks=1.5), r"spare_blocks=1\.5"),
    "spare_blocks bool": (lambda: build_paged_cache(KEYS, spare_blocks=True), r"spare_blocks=True"),
    "block_size zero": (lambda: build_paged_cache(KEYS, block_size=0), r"block_size=0"),
    "block_size negative": (lambda: build_paged_cache(KEYS, block_size=-64), r"block_size=-64"),
    "block_size float": (lambda: build_paged_cache(KEYS, block_size=64.0), r"block_size=64\.0"),
    "cache_dtype": (lambda: build_paged_cache(KEYS, cache_dtype="fp16"), r"cache_dtype='fp16'"),
    "seed float": (lambda: build_paged_cache(KEYS, seed=0.5), r"seed=0\.5"),
    "ue8m0 string": (lambda: build_paged_cache(KEYS, ue8m0="yes"), r"ue8m0='yes'"),
    "keys empty": (lambda: build_paged_cache([]), r"keys"),
    "keys a tensor": (lambda: build_paged_cache(KEYS[0]), r"keys"),
    "keys 1-D": (lambda: build_paged_cache([torch.randn(64)]), r"keys\[0\]"),
    "keys int": (lambda: build_paged_cache([torch.ones(10, 64, dtype=torch.int32)]), r"keys\[0\]: dtype"),
    "keys head_dims differ": (lambda: build_paged_cache([KEYS[0], torch.randn(5, 128)]), r"keys\[1\]: expected shape"),
    "keys NaN": (lambda: build_paged_cache([with_nan(KEYS[0])]), r"k: 1 non-finite"),
    "keys inf": (lambda: build_paged_cache([with_nan(KEYS[0], float("inf"))]), r"k: 1 non-finite"),
    "keys mxfp4 head_dim 48": (lambda: build_paged_cache([torch.randn(5, 48)], cache_dtype="mxfp4"), r"head_dim=48"),
    "quantize_fp8 NaN": (lambda: quantize_fp8(with_nan(KEYS[0])), r"k: 1 non-finite"),
    "quantize_fp8 3-D": (lambda: quantize_fp8(KEYS[0][None]), r"k: expected 2 dims"),
    "quantize_fp8 bool": (lambda: quantize_fp8(KEYS[0] > 0), r"k: dtype"),
    "quantize_mxfp4 D=40": (lambda: quantize_mxfp4(torch.randn(4, 40)), r"k: head_dim 40"),
    "quantize_mxfp4 inf": (lambda: quantize_mxfp4(with_nan(KEYS[0], float("-inf"))), r"k: 1 non-finite"),
    "dequantize_mxfp4 dtype": (lambda: dequantize_mxfp4(torch.zeros(2, 32), torch.zeros(2, 2, dtype=torch.uint8)), r"packed: dtype"),
    "dequantize_mxfp4 scales": (
        lambda: dequantize_mxfp4(torch.zeros(2, 32, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8)), r"scale_bytes"),
    "bytes_per_token zero": (lambda: bytes_per_token(0, "fp8"), r"head_dim=0"),
    "bytes_per_token float": (lambda: bytes_per_token(128.0, "fp8"), r"head_dim=128\.0"),
    "bytes_per_token mxfp4 48": (lambda: bytes_per_token(48, "mxfp4"), r"head_dim=48"),
    "bytes_per_token dtype": (lambda: bytes_per_token(128, "e5m2"), r"cache_dtype='e5m2'"),
    "PagedCache fp8 width as mxfp4": (  # FP8 at D=64 has MXFP4-at-D=128's width: the declared dtype decides
        lambda: PagedCache(CACHE.data, CACHE.block_table, 64, "mxfp4"), r"data: a mxfp4 cache of head_dim=64"),
    "PagedCache wrong head_dim": (lambda: PagedCache(CACHE.data, CACHE.block_table, 128, "fp8"), r"data: a fp8 cache"),
    "PagedCache data dtype": (lambda: PagedCache(CACHE.data.float(), CACHE.block_table, 64, "fp8"), r"data: dtype"),
    "PagedCache strided data": (
        lambda: PagedCache(torch.cat([CACHE.data, CACHE.data], 2)[:, :, :1], CACHE.block_table, 64, "fp8"), r"data: must be contiguous"),
    "PagedCache table dtype": (lambda: PagedCache(CACHE.data, CACHE.block_table.long(), 64, "fp8"), r"block_table: dtype"),
    "PagedCache no blocks": (lambda: PagedCache(CACHE.data[:0], CACHE.block_table, 64, "fp8"), r"data:"),
    "PagedCache dtype": (lambda: PagedCache(CACHE.data, CACHE.block_table, 64, "fp4"), r"cache_dtype='fp4'"),
    "random seq_len float": (lambda: random_paged_cache((10.5,), 64), r"seq_lens\[0\]=10\.5"),
    "random seq_len negative": (lambda: random_paged_cache((10, -1), 64), r"seq_lens\[1\]=-1"),
    "random seq_lens empty": (lambda: random_paged_cache((), 64), r"seq_lens"),
    "random head_dim zero": (lambda: random_paged_cache((10,), 0), r"head_dim=0"),
    "random block_size zero": (lambda: random_paged_cache((10,), 64, block_size=0), r"block_size=0"),
    "random chunk zero": (lambda: random_paged_cache((10,), 64, chunk_tokens=0), r"chunk_tokens=0"),
    "random device": (lambda: random_paged_cache((10,), 64, device="tpu"), r"device='tpu'"),
    "random seed": (lambda: random_paged_cache((10,), 64, seed="1"), r"seed='1'"),
    "table zero blocks": (lambda: permuted_block_table((0, 2), torch.arange(4)), r"per_request\[0\]=0"),
    "table too few ids": (lambda: permuted_block_table((3, 2), torch.arange(4)), r"per_request"),
    "table float perm": (lambda: permuted_block_table((1,), torch.arange(4.0)), r"perm: dtype"),
    "gather request out of range": (lambda: gather_request_keys(CACHE, 2, 10), r"request=2"),
    "gather length negative": (lambda: gather_request_keys(CACHE, 0, -5), r"length=-5"),
    "gather length float": (lambda: gather_request_keys(CACHE, 0, 5.5), r"length=5\.5"),
    "gather length too long": (lambda: gather_request_keys(CACHE, 0, 129), r"length=129"),
    "gather bad id": (
        lambda: gather_request_keys(PagedCache(CACHE.data, CACHE.block_table + 100, 64, "fp8"), 0, 10), r"block_table\[0\]"),
    "dequantize float ids": (lambda: dequantize_blocks(CACHE, torch.tensor([0.7])), r"block_ids: dtype"),
    "dequantize id -1": (lambda: dequantize_blocks(CACHE, torch.tensor([-1])), r"block_ids: must lie in \[0, \d+\].*\[-1\]"),
    "dequantize id past the end": (lambda: dequantize_blocks(CACHE, torch.tensor([0, CACHE.num_blocks])), r"block_ids"),
    "seed 2**70": (lambda: random_paged_cache((10,), 64, seed=2**70), r"seed=1180591620717411303424: allowed range"),
    "seed -1": (lambda: random_paged_cache((10,), 64, seed=-1), r"seed=-1: allowed range is \[0, "),
    "build seed 2**64": (lambda: build_paged_cache(KEYS, seed=2**64), r"seed=18446744073709551616"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_cache_refuses_bad_input_by_name(case: str) -> None:
    call, name = CASES[case]
    with pytest.raises(ValueError, match=name):
        call()


@settings(max_examples=30, deadline=None)
@given(spare=st.integers(max_value=-1))
def test_negative_spare_blocks_never_build_a_cache(spare: int) -> None:
    """spare_blocks=-1 used to map two requests' blocks onto one physical block."""
    with pytest.raises(ValueError, match=r"spare_blocks="):
        build_paged_cache(KEYS, spare_blocks=spare)


@settings(max_examples=30, deadline=None)
@given(spare=st.integers(0, 5), lens=st.lists(st.integers(0, 200), min_size=1, max_size=4))
def test_every_valid_cache_gives_each_request_its_own_blocks(spare: int, lens: list[int]) -> None:
    cache = build_paged_cache([torch.randn(n, 64) for n in lens], spare_blocks=spare)
    used = torch.cat([cache.block_table[b, : max(1, -(-n // 64))] for b, n in enumerate(lens)])
    assert len(set(used.tolist())) == used.numel() and int(used.max()) < cache.num_blocks


@settings(max_examples=30, deadline=None)
@given(block_size=st.one_of(st.integers(max_value=0), st.floats(), st.booleans()))
def test_non_positive_or_non_int_block_size_is_refused(block_size: object) -> None:
    with pytest.raises(ValueError, match=r"block_size="):
        build_paged_cache(KEYS, block_size=block_size)


@settings(max_examples=40, deadline=None)
@given(
    block=st.integers(min_value=-(1 << 62), max_value=-1) | st.integers(min_value=CACHE.num_blocks, max_value=1 << 40)
)
def test_dequantize_blocks_never_wraps_an_id_around(block: int) -> None:
    """A negative id used to return a block from the end of the cache (Python indexing)."""
    with pytest.raises(ValueError, match=r"block_ids: must lie in"):
        dequantize_blocks(CACHE, torch.tensor([block], dtype=torch.int64))
