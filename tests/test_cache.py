"""The paged K cache: quantisation error bounds, block-table permutation and the byte layout."""

from __future__ import annotations

import pytest
import torch

from dsa_lab.batch.cache import (
    E2M1_VALUES,
    MX_GROUP,
    build_paged_cache,
    bytes_per_token,
    dequantize_mxfp4,
    gather_request_keys,
    quantize_fp8,
    quantize_mxfp4,
)

E4M3_HALF_ULP = 2.0**-4  # 3 mantissa bits: relative rounding error of a normal value
E4M3_SUBNORMAL_HALF_STEP = 2.0**-10  # subnormal spacing 2^-9, in units of the scale


def random_keys(tokens: int, dim: int, seed: int) -> torch.Tensor:
    """Rows of very different magnitudes, so the per-token scales differ."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, dim, generator=gen) * torch.logspace(-3, 2, tokens)[:, None]


@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_round_trip_error_is_bounded_by_the_scale(ue8m0: bool) -> None:
    k = random_keys(200, 128, seed=1)
    values, scale = quantize_fp8(k, ue8m0=ue8m0)
    assert values.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    restored = values.float() * scale[:, None]
    bound = k.abs() * E4M3_HALF_ULP + scale[:, None] * E4M3_SUBNORMAL_HALF_STEP
    assert torch.isfinite(restored).all()
    assert ((restored - k).abs() <= bound * (1 + 1e-6)).all()
    # the largest element of each token uses the top of the e4m3 range (exactly 448 without ue8m0)
    assert (scale >= k.abs().amax(-1) / 448 * (1 - 1e-6)).all()
    if not ue8m0:
        assert torch.equal(values.float().abs().amax(-1), torch.full((200,), 448.0))


def test_ue8m0_scales_are_powers_of_two_and_never_smaller() -> None:
    k = random_keys(300, 128, seed=2)
    _, plain = quantize_fp8(k)
    _, rounded = quantize_fp8(k, ue8m0=True)
    exponent = torch.log2(rounded)
    assert torch.equal(exponent, exponent.round())
    assert (rounded >= plain).all() and (rounded < 2 * plain).all()


def test_fp8_scale_floor_for_tiny_tokens() -> None:
    k = torch.full((2, 64), 1e-7)
    _, scale = quantize_fp8(k)
    assert torch.allclose(scale, torch.full((2,), 1e-4 / 448))


def test_mxfp4_round_trip_error_and_exact_grid_values() -> None:
    k = random_keys(100, 128, seed=3)
    packed, scale_bytes = quantize_mxfp4(k)
    assert packed.shape == (100, 64) and scale_bytes.shape == (100, 128 // MX_GROUP)
    restored = dequantize_mxfp4(packed, scale_bytes)
    scale = torch.exp2(scale_bytes.float() - 127).repeat_interleave(MX_GROUP, dim=-1)
    # e2m1 spacing is at most 2 (between 4 and 6), and amax / scale <= 6: error <= 1 * scale
    assert ((restored - k).abs() <= scale).all()
    # values already on the scaled e2m1 grid survive exactly
    gen = torch.Generator().manual_seed(4)
    grid = torch.tensor(E2M1_VALUES)
    signs = torch.where(torch.rand(10, 128, generator=gen) < 0.5, -1.0, 1.0)
    exact = grid[torch.randint(0, 8, (10, 128), generator=gen)] * signs
    exact[:, ::MX_GROUP] = 6.0  # every group's amax is 6: scale 2^0
    exact = exact * 2.0 ** torch.randint(-5, 5, (10, 1), generator=gen)
    assert torch.equal(dequantize_mxfp4(*quantize_mxfp4(exact)), exact)


def test_bytes_per_token() -> None:
    assert bytes_per_token(128, "mxfp4") == 68
    assert bytes_per_token(128, "fp8") == 132
    keys = [random_keys(70, 128, seed=5)]
    assert build_paged_cache(keys, cache_dtype="mxfp4").data.shape[-1] == 68
    assert build_paged_cache(keys, cache_dtype="fp8").data.shape[-1] == 132


@pytest.mark.parametrize("seed", range(4))
def test_block_tables_are_random_permutations(seed: int) -> None:
    lengths = [300, 200, 640, 65, 129]
    cache = build_paged_cache([random_keys(n, 64, seed + i) for i, n in enumerate(lengths)], seed=seed)
    used = [cache.block_table[b, : -(-n // 64)].tolist() for b, n in enumerate(lengths)]
    flat = [block for ids in used for block in ids]
    assert len(set(flat)) == len(flat) and all(0 <= x < cache.num_blocks for x in flat)
    for ids in used:
        if len(ids) >= 3:
            assert ids != list(range(ids[0], ids[0] + len(ids))), f"blocks {ids} contiguous by accident"
    # unused slots of a row still hold a valid block id
    assert int(cache.block_table.min()) >= 0 and int(cache.block_table.max()) < cache.num_blocks


@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_layout_token_bytes_then_scales(ue8m0: bool) -> None:
    dim, block = 128, 64
    keys = [random_keys(150, dim, seed=6), random_keys(70, dim, seed=7)]
    cache = build_paged_cache(keys, ue8m0=ue8m0, seed=3)
    flat = cache.data.reshape(-1)
    stride = block * (dim + 4)
    for b, k in enumerate(keys):
        values, scale = quantize_fp8(k, ue8m0=ue8m0)
        for token in (0, 1, 63, 64, len(k) - 1):
            blk, pos = int(cache.block_table[b, token // block]), token % block
            got = flat[blk * stride + pos * dim : blk * stride + (pos + 1) * dim]
            assert torch.equal(got, values[token].view(torch.uint8))
            at = blk * stride + block * dim + 4 * pos
            assert flat[at : at + 4].view(torch.float32).item() == scale[token].item()


def test_mxfp4_layout_token_bytes_then_scales() -> None:
    dim, block = 128, 64
    k = random_keys(130, dim, seed=8)
    cache = build_paged_cache([k], cache_dtype="mxfp4", seed=1)
    flat = cache.data.reshape(-1)
    stride = block * 68
    packed, scale_bytes = quantize_mxfp4(k)
    for token in (0, 64, 129):
        blk, pos = int(cache.block_table[0, token // block]), token % block
        assert torch.equal(flat[blk * stride + pos * 64 : blk * stride + (pos + 1) * 64], packed[token])
        at = blk * stride + block * 64 + 4 * pos
        assert torch.equal(flat[at : at + 4], scale_bytes[token])


@pytest.mark.parametrize("cache_dtype", ["fp8", "mxfp4"])
def test_gather_request_keys_returns_dequantised_keys(cache_dtype: str) -> None:
    keys = [random_keys(n, 128, seed=n) for n in (100, 64, 1)]
    cache = build_paged_cache(keys, cache_dtype=cache_dtype, seed=2)
    for b, k in enumerate(keys):
        if cache_dtype == "fp8":
            values, scale = quantize_fp8(k)
            expected = values.float() * scale[:, None]
        else:
            expected = dequantize_mxfp4(*quantize_mxfp4(k))
        assert torch.equal(gather_request_keys(cache, b, len(k)), expected)
        assert torch.equal(gather_request_keys(cache, b, len(k) // 2), expected[: len(k) // 2])


def test_bad_cache_input_names_the_field() -> None:
    keys = [random_keys(10, 128, seed=0)]
    with pytest.raises(ValueError, match="cache_dtype"):
        build_paged_cache(keys, cache_dtype="int8")
    with pytest.raises(ValueError, match="keys"):
        build_paged_cache([])
    with pytest.raises(ValueError, match="head_dim"):
        quantize_mxfp4(torch.randn(4, 48))
    with pytest.raises(ValueError, match="length"):
        gather_request_keys(build_paged_cache(keys), 0, 65)
