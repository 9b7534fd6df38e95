"""The paged indexer K cache in the byte layouts the kernels read.

FP8 (DeepSeek V3.2): each block of `block_size` tokens holds `block_size x D` e4m3
bytes followed by `block_size` float32 scales, i.e. D + 4 bytes a token, viewed
`[num_blocks, block_size, 1, D + 4]` uint8. The view's last dim is *not* a token's
bytes: a token's values and its scale sit in two regions of the block.

MXFP4 (DeepSeek V4): each block holds `block_size x D/2` bytes of packed e2m1 pairs
(low nibble = even element) followed by `block_size x D/32` ue8m0 scale bytes (one
per 32 values): D/2 + D/32 bytes a token (68 at D = 128).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsa_lab.errors import (
    as_device,
    check_choice,
    check_finite,
    check_int_sequence,
    check_range,
    check_seed,
    check_tensor,
)

CACHE_DTYPES = ("fp8", "mxfp4")
FP8_MAX = 448.0
FP8_MIN_AMAX = 1e-4
MX_GROUP = 32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MAX_HEAD_DIM = 1024
BLOCK_SIZE = 64  # tokens a KV block holds: vLLM's indexer cache for DeepSeek-V3.2, what every kernel here pages by
MAX_BLOCK_SIZE = 1024
KEY_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_head_dim(head_dim: object, cache_dtype: str) -> int:
    """A positive int head_dim the layout can hold (a multiple of 32 for MXFP4's scale groups)."""
    check_choice("cache_dtype", cache_dtype, CACHE_DTYPES)
    dim = check_range("head_dim", head_dim, 1, MAX_HEAD_DIM)
    if cache_dtype == "mxfp4" and dim % MX_GROUP:
        raise ValueError(f"head_dim={dim}: mxfp4 needs a multiple of {MX_GROUP} (one scale per {MX_GROUP} values)")
    return dim


def bytes_per_token(head_dim: int, cache_dtype: str) -> int:
    """Bytes one cached token occupies (values + its share of the scales)."""
    head_dim = check_head_dim(head_dim, cache_dtype)
    if cache_dtype == "fp8":
        return head_dim + 4
    return head_dim // 2 + head_dim // MX_GROUP


@dataclass(frozen=True)
class PagedCache:
    """A paged K cache plus the block table that maps each request's logical blocks."""

    data: torch.Tensor  # uint8 [num_blocks, block_size, 1, bytes_per_token]
    block_table: torch.Tensor  # int32 [B, max_blocks]; unused slots hold valid ids too
    head_dim: int
    cache_dtype: str

    def __post_init__(self) -> None:
        """Host checks only: the declared dtype must match the byte width (it is never inferred from it)."""
        width = bytes_per_token(self.head_dim, self.cache_dtype)
        check_tensor("data", self.data, dtype=torch.uint8, ndim=4, contiguous=True)
        blocks, size, one, got = self.data.shape
        if one != 1 or got != width or blocks < 1 or size < 1:
            raise ValueError(
                f"data: a {self.cache_dtype} cache of head_dim={self.head_dim} is [num_blocks >= 1, block_size >= 1, 1, "
                f"{width}] uint8, got shape {tuple(self.data.shape)}"
            )
        check_tensor("block_table", self.block_table, dtype=torch.int32, ndim=2, device=self.data.device)

    @property
    def block_size(self) -> int:
        return self.data.shape[1]

    @property
    def num_blocks(self) -> int:
        return self.data.shape[0]


def quantize_fp8(k: torch.Tensor, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token e4m3 quantisation: scale = max(amax, 1e-4) / 448, optionally rounded up to 2^n.

    Non-finite keys are refused: a NaN or inf would give its token a NaN scale.
    """
    check_tensor("k", k, dtype=KEY_DTYPES, ndim=2)
    check_choice("ue8m0", ue8m0, (False, True))
    if k.shape[1] < 1:
        raise ValueError(f"k: shape {tuple(k.shape)}: head_dim (its last dim) must be >= 1")
    check_finite("k", k)
    kf = k.float()
    scale = kf.abs().amax(dim=-1).clamp(min=FP8_MIN_AMAX) / FP8_MAX
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    values = (kf / scale[:, None]).to(torch.float8_e4m3fn)
    return values, scale


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e2m1 value (ties to the even code) and return 4-bit codes."""
    grid = torch.tensor(E2M1_VALUES, device=x.device)
    mag = x.abs().clamp(max=6.0)
    dist = (mag[..., None] - grid).abs()
    # argmin returns the first minimum; for ties prefer the even code (mantissa 0).
    codes = torch.argmin(dist * 2 + (torch.arange(8, device=x.device) % 2) * 1e-6, dim=-1)
    sign = ((x < 0) & (codes > 0)).to(torch.uint8) << 3
    return codes.to(torch.uint8) | sign


def quantize_mxfp4(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4: per 32 values a ue8m0 scale 2^ceil(log2(amax/6)); values as packed e2m1 pairs (finite keys only)."""
    check_tensor("k", k, dtype=KEY_DTYPES, ndim=2)
    check_finite("k", k)
    tokens, dim = k.shape
    if dim % MX_GROUP or dim < 1:
        raise ValueError(f"k: head_dim {dim} must be a positive multiple of {MX_GROUP} for mxfp4")
    groups = k.float().reshape(tokens, dim // MX_GROUP, MX_GROUP)
    amax = groups.abs().amax(dim=-1).clamp(min=2.0**-126)
    exponent = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    codes = _e2m1_codes(groups / torch.exp2(exponent)[..., None]).reshape(tokens, dim)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, (exponent + 127).to(torch.uint8)


def dequantize_mxfp4(packed: torch.Tensor, scale_bytes: torch.Tensor) -> torch.Tensor:
    """Inverse of `quantize_mxfp4`: float32 [tokens, D]."""
    check_tensor("packed", packed, dtype=torch.uint8, ndim=2)
    check_tensor(
        "scale_bytes", scale_bytes, dtype=torch.uint8, shape=(packed.shape[0], 2 * packed.shape[1] // MX_GROUP)
    )
    grid = torch.tensor(E2M1_VALUES, device=packed.device)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], 2 * packed.shape[-1])
    values = grid[(codes & 7).long()] * torch.where(codes >= 8, -1.0, 1.0)
    scale = torch.exp2(scale_bytes.float() - 127).repeat_interleave(MX_GROUP, dim=-1)
    return values * scale


def _token_regions(cache_dtype: str, head_dim: int, block_size: int) -> tuple[int, int]:
    """Byte sizes (values region, scales region) of one block."""
    if cache_dtype == "fp8":
        return block_size * head_dim, block_size * 4
    return block_size * head_dim // 2, block_size * head_dim // MX_GROUP


def permuted_block_table(per_request: Sequence[int], perm: torch.Tensor) -> torch.Tensor:
    """int32 `[B, max(per_request)]` on perm's device: request b owns the next per_request[b]
    physical ids of `perm`; its unused slots repeat its first id (valid, never read)."""
    counts = check_int_sequence("per_request", per_request, 1, 1 << 31)
    check_tensor("perm", perm, dtype=(torch.int32, torch.int64), ndim=1)
    if not counts or sum(counts) > perm.numel():
        raise ValueError(
            f"per_request: needs 1..{perm.numel()} blocks in all (len(perm)), got {sum(counts)} over {len(counts)} requests"
        )
    per_request = counts
    table = torch.empty(len(per_request), max(per_request), dtype=torch.int32, device=perm.device)
    first = 0
    for b, count in enumerate(per_request):
        table[b, :count] = perm[first : first + count]
        table[b, count:] = perm[first]
        first += count
    return table


def build_paged_cache(
    keys: list[torch.Tensor],
    block_size: int = BLOCK_SIZE,
    cache_dtype: str = "fp8",
    ue8m0: bool = False,
    spare_blocks: int = 1,
    seed: int = 0,
) -> PagedCache:
    """Quantise each request's K `[L_b, D]` into a randomly permuted paged cache.

    Physical block ids are a random permutation so that no kernel can pass by reading
    blocks contiguously; `spare_blocks` extra blocks hold random bytes nobody owns (never
    fewer than 0: a negative count would map two requests' blocks onto one).
    """
    check_choice("cache_dtype", cache_dtype, CACHE_DTYPES)
    block_size = check_range("block_size", block_size, 1, MAX_BLOCK_SIZE)
    spare_blocks = check_range("spare_blocks", spare_blocks, 0, 1 << 20)
    seed = check_seed("seed", seed)
    check_choice("ue8m0", ue8m0, (False, True))
    if isinstance(keys, torch.Tensor) or not isinstance(keys, (list, tuple)) or not keys:
        raise ValueError(
            f"keys: need a non-empty list of K tensors [L_b, D], one per request, got {type(keys).__name__}"
        )
    check_tensor("keys[0]", keys[0], dtype=KEY_DTYPES, ndim=2)
    head_dim = check_head_dim(keys[0].shape[-1], cache_dtype)
    device = keys[0].device
    for b, k in enumerate(keys):
        check_tensor(f"keys[{b}]", k, dtype=KEY_DTYPES, shape=(None, head_dim), device=device)
    per_request = [max(1, -(-k.shape[0] // block_size)) for k in keys]
    num_blocks = sum(per_request) + spare_blocks
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks, generator=gen)
    value_bytes, scale_bytes = _token_regions(cache_dtype, head_dim, block_size)
    flat = torch.randint(0, 256, (num_blocks, value_bytes + scale_bytes), generator=gen, dtype=torch.uint8)
    if cache_dtype == "fp8":  # stale scales must still be finite floats
        flat[:, value_bytes:].view(torch.float32)[:] = torch.rand(num_blocks, block_size, generator=gen)
    flat = flat.to(device)
    table = permuted_block_table(per_request, perm)
    for b, k in enumerate(keys):
        _write_request(flat, table[b, : per_request[b]].to(device), k, cache_dtype, block_size, value_bytes, ue8m0)
    data = flat.view(num_blocks, block_size, 1, -1)
    return PagedCache(data, table.to(device), head_dim, cache_dtype)


def _write_request(
    flat: torch.Tensor,
    ids: torch.Tensor,
    k: torch.Tensor,
    cache_dtype: str,
    block_size: int,
    value_bytes: int,
    ue8m0: bool,
) -> None:
    tokens, dim = k.shape
    if tokens == 0:
        return
    if cache_dtype == "fp8":
        values, scale = quantize_fp8(k, ue8m0)
        value_rows, scale_rows = values.view(torch.uint8), scale.view(torch.uint8).reshape(tokens, 4)
    else:
        value_rows, scale_rows = quantize_mxfp4(k)
    width_v, width_s = value_rows.shape[1], scale_rows.shape[1]
    for i, block in enumerate(ids.tolist()):
        lo, hi = i * block_size, min((i + 1) * block_size, tokens)
        n = hi - lo
        flat[block, : n * width_v] = value_rows[lo:hi].reshape(-1)
        flat[block, value_bytes : value_bytes + n * width_s] = scale_rows[lo:hi].reshape(-1)


def split_block(cache: PagedCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Views (no copy) of the (values, scales) regions: fp8 -> (e4m3 [nb, bs, D], f32 [nb, bs])."""
    nb, bs = cache.num_blocks, cache.block_size
    flat = cache.data.view(nb, -1)
    value_bytes, _ = _token_regions(cache.cache_dtype, cache.head_dim, bs)
    values, scales = flat[:, :value_bytes], flat[:, value_bytes:]
    if cache.cache_dtype == "fp8":
        return (
            values.view(torch.float8_e4m3fn).view(nb, bs, cache.head_dim),
            scales.view(torch.float32).view(nb, bs),
        )
    return values.view(nb, bs, cache.head_dim // 2), scales.view(nb, bs, cache.head_dim // MX_GROUP)


def dequantize_blocks(cache: PagedCache, block_ids: torch.Tensor) -> torch.Tensor:
    """K in float32 `[len(block_ids) * block_size, D]` for the given physical blocks.

    Ids are integers (float ids would be truncated) within [0, num_blocks): a negative id
    would wrap around to a block from the end. The range check reads the ids (a device to
    host copy on a GPU): this is a helper for checks and notebooks, never a timed path.
    """
    check_tensor("block_ids", block_ids, dtype=(torch.int32, torch.int64), ndim=1, device=cache.data.device)
    if block_ids.numel() and (int(block_ids.min()) < 0 or int(block_ids.max()) >= cache.num_blocks):
        outside = block_ids[(block_ids < 0) | (block_ids >= cache.num_blocks)]
        raise ValueError(
            f"block_ids: must lie in [0, {cache.num_blocks - 1}] (this cache's blocks), got {outside[:8].tolist()}"
        )
    values, scales = split_block(cache)
    v, s = values[block_ids.long()], scales[block_ids.long()]
    if cache.cache_dtype == "fp8":
        return (v.float() * s[..., None]).reshape(-1, cache.head_dim)
    return dequantize_mxfp4(v.reshape(-1, v.shape[-1]), s.reshape(-1, s.shape[-1]))


def gather_request_keys(cache: PagedCache, request: int, length: int) -> torch.Tensor:
    """The dequantised K of one request's first `length` tokens (float32 `[length, D]`)."""
    request = check_range("request", request, 0, cache.block_table.shape[0] - 1)
    length = check_range("length", length, 0, 1 << 40)
    blocks = -(-length // cache.block_size)
    if blocks > cache.block_table.shape[1]:
        raise ValueError(f"length={length} needs {blocks} blocks; the block table holds {cache.block_table.shape[1]}")
    ids = cache.block_table[request, :blocks]
    if blocks and (int(ids.min()) < 0 or int(ids.max()) >= cache.num_blocks):
        raise ValueError(
            f"block_table[{request}]: block ids must lie in [0, {cache.num_blocks - 1}], got {ids.tolist()}"
        )
    return dequantize_blocks(cache, ids)[:length]


def random_paged_cache(
    seq_lens: Sequence[int],
    head_dim: int,
    block_size: int = BLOCK_SIZE,
    cache_dtype: str = "fp8",
    seed: int = 0,
    device: str | torch.device = "cpu",
    chunk_tokens: int = 1 << 20,
    ue8m0: bool = False,
) -> PagedCache:
    """A paged cache of fresh standard-normal K, quantised, drawn and written on `device`.

    The fast path for benchmark caches of gigabytes: keys come from a generator on the
    device and are scattered into the randomly permuted blocks a chunk of tokens at a
    time, with no Python loop per block. Layout and block-table conventions are those of
    `build_paged_cache` (spare block, unused table slots holding valid ids). `ue8m0`
    rounds each FP8 token's scale up to a power of two (`quantize_fp8`), as vLLM writes
    the indexer cache where DeepGEMM reads the scale as a UE8M0 byte (SM100); the same
    seed draws the same keys either way. MXFP4's scales are powers of two by format.
    """
    check_choice("ue8m0", ue8m0, (False, True))
    head_dim = check_head_dim(head_dim, cache_dtype)
    seq_lens = check_int_sequence("seq_lens", seq_lens, 0, 1 << 31)
    if not seq_lens:
        raise ValueError("seq_lens: need one length >= 0 per request, got none")
    block_size = check_range("block_size", block_size, 1, MAX_BLOCK_SIZE)
    chunk_tokens = check_range("chunk_tokens", chunk_tokens, 1, 1 << 30)
    seed = check_seed("seed", seed)
    device = as_device("device", device)
    gen = torch.Generator(device=device).manual_seed(seed)
    per_request = [max(1, -(-length // block_size)) for length in seq_lens]
    num_blocks = sum(per_request) + 1
    value_bytes, scale_bytes = _token_regions(cache_dtype, head_dim, block_size)
    perm = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32)
    flat = torch.randint(
        0, 256, (num_blocks, value_bytes + scale_bytes), generator=gen, device=device, dtype=torch.uint8
    )
    if cache_dtype == "fp8":  # stale scales must still be finite floats
        flat[:, value_bytes:].view(torch.float32)[:] = torch.rand(num_blocks, block_size, generator=gen, device=device)
    table = permuted_block_table(per_request, perm)
    values = flat[:, :value_bytes].view(num_blocks, block_size, -1)
    scales = flat[:, value_bytes:]
    scales = scales.view(torch.float32) if cache_dtype == "fp8" else scales.view(num_blocks, block_size, -1)
    lens = torch.tensor(seq_lens, dtype=torch.int64, device=device)
    starts = torch.cumsum(lens, 0) - lens
    total = int(lens.sum())
    step = chunk_tokens if cache_dtype == "fp8" else max(1, chunk_tokens // 16)  # e2m1 rounding is wide
    for lo in range(0, total, step):
        token = torch.arange(lo, min(lo + step, total), device=device)
        request = torch.searchsorted(starts, token, right=True) - 1
        within = token - starts[request]
        block = table[request, within // block_size].long()
        slot = within % block_size
        keys = torch.randn(token.numel(), head_dim, generator=gen, device=device)
        if cache_dtype == "fp8":
            v, s = quantize_fp8(keys, ue8m0)
            values[block, slot] = v.view(torch.uint8)
            scales[block, slot] = s
        else:
            v, s = quantize_mxfp4(keys)
            values[block, slot] = v
            scales[block, slot] = s
    return PagedCache(flat.view(num_blocks, block_size, 1, -1), table, head_dim, cache_dtype)
