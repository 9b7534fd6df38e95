"""The PyTorch reference: exact dot products on the quantised codes, then fixed-order float64.

Slow and obviously right; every other backend is checked against it. Memory stays
bounded at 128K tokens because each request is scored a chunk of blocks at a time.

Batch-invariant by construction. A token row's logits must not depend on how rows are
grouped into launches (native, flatten, atom pieces, any B, requests permuted) nor on
the machine (vector ISA, BLAS code path, thread count, CPU or GPU). A float32 matmul
breaks that: BLAS picks its summation order from the matrix shape and the CPU. So no
rounding here happens in an order that anything but the row itself decides:

1. q.k is summed on the raw codes in float64, where it is exact. An e4m3 value has at
   most 4 significant bits, is a multiple of 2^-9 (the smallest subnormal) and is at
   most 448 < 2^9 in magnitude; a product of two has at most 8 significant bits, is a
   multiple of 2^-18 and is below 448^2 < 2^18. Any partial sum of D products is then a
   multiple of 2^-18 below D * 448^2, i.e. an integer below 2^43 (D = 128) in units of
   2^-18: float64's 53-bit significand holds it exactly, so every summation order, with
   or without FMA, gives the same, exact dot (`FP8_EXACT_MAX_HEAD_DIM` = 171196 is where
   this stops; the project allows D <= 1024). This needs an IEEE float64 GEMM, which
   CPU BLAS and cuBLAS DGEMM are (an emulated FP64 mode would need checking).
   MXFP4: an e2m1 value is a multiple of 2^-1 of at most 6; an e4m3 x e2m1 product is
   a multiple of 2^-10 below 2688 < 2^12, and a 32-value group sums to fewer than 2^27
   units: exact. Scaling by the group's ue8m0 power of two 2^e is exact too
   (it is applied to the codes before the matmul). With the token's group exponents in
   [m, M], the whole dot is a multiple of 2^(m-10) below D * 2688 * 2^M, so it is exact
   in float64, in any order, while M - m <= 24 at D = 128 (`mxfp4_exact_spread`): one
   matmul then serves. A token whose exponents lie further apart (up to 254) gets its D/32
   exact group dots added in a fixed pairwise order (`pairwise_sum`) instead; for every
   other token that order gives the same exact value, so which tokens share a chunk
   never matters.
2. Everything after that is elementwise in float64, one correctly rounded IEEE op at a
   time (same bits whether vectorised, threaded, or on a GPU): x the token's float32
   scale (FP8), relu, x w[t, h], a fixed pairwise tree of adds over the H heads, and one
   rounding to float32. Each (row, token) logit is thus a function of that row's q and w
   and that token's codes and scales only. The one thing left to an implementation is the
   sign of a zero (an exact-zero dot, relu(-0.0)); it can only reach a logit that is zero,
   so zero logits are written as +0.0.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from dsa_lab.batch.cache import CACHE_DTYPES, E2M1_VALUES, FP8_MAX, MX_GROUP, PagedCache, split_block
from dsa_lab.kernels.convention import LogitsCall, check_logits_args, check_logits_values
from dsa_lab.kernels.descriptor import LogitsBackend
from dsa_lab.kernels.registry import register_backend

CHUNK_TOKENS = 8192
FP8_QUANTUM_LOG2 = -9  # every e4m3 value is a multiple of 2^-9
FLOAT64_SIGNIFICAND_BITS = 53
# The largest D for which every partial sum of e4m3 x e4m3 products is exact in float64.
FP8_EXACT_MAX_HEAD_DIM = int(2 ** (FLOAT64_SIGNIFICAND_BITS + 2 * FP8_QUANTUM_LOG2) // FP8_MAX**2)


def pairwise_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` by a fixed tree of elementwise adds, so the rounding never depends on shape.

    Each level adds the first half of the slices to the second (an odd last slice waits
    for the next level); the tree depends only on `x.shape[dim]`, and elementwise adds
    round the same on every device and vector width, whatever else shares the tensor.
    """
    while x.shape[dim] > 1:
        size = x.shape[dim]
        half = size // 2
        summed = x.narrow(dim, 0, half) + x.narrow(dim, half, half)
        x = torch.cat([summed, x.narrow(dim, 2 * half, 1)], dim) if size % 2 else summed
    return x.squeeze(dim)


def _mxfp4_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 lookup tables, built once per call: byte -> its two e2m1 values `[256, 2]`
    (low nibble first; bit 3 of a nibble is the sign), and byte -> 2^(byte - 127) `[256]`
    from Python floats (exact: a vectorised exp2 need not be exact on every CPU)."""
    values = [sign * v for sign in (1.0, -1.0) for v in E2M1_VALUES]
    pairs = [(values[b & 0xF], values[b >> 4]) for b in range(256)]
    powers = [2.0 ** (b - 127) for b in range(256)]
    return (
        torch.tensor(pairs, dtype=torch.float64, device=device),
        torch.tensor(powers, dtype=torch.float64, device=device),
    )


def _mxfp4_keys(
    packed: torch.Tensor, scale_bytes: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """float64 `[S, D/32, 32]`, exact: e2m1 values x 2^(byte - 127) (e2m1 has 2 significant bits)."""
    pairs, powers = tables
    groups = scale_bytes.shape[-1]
    values = pairs[packed.reshape(-1, packed.shape[-1]).long()].view(-1, groups, MX_GROUP)
    return values * powers[scale_bytes.reshape(-1, groups, 1).long()]


def mxfp4_exact_spread(head_dim: int) -> int:
    """Largest M - m (group exponents of one token) for which its whole MXFP4 dot is exact in
    float64: the dot is a multiple of 2^(m-10) below head_dim * 448 * 6 * 2^M (module docstring)."""
    units = 2**FLOAT64_SIGNIFICAND_BITS // (head_dim * int(FP8_MAX) * int(max(E2M1_VALUES)))
    return units.bit_length() - 1 + FP8_QUANTUM_LOG2 - 1  # the quantum 2^-10 = 2^-9 (e4m3) x 2^-1 (e2m1)


def _mxfp4_dots(
    q_rows: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """float64 `[R, S]`: one matmul, exact for tokens whose exponent spread is at most
    `mxfp4_exact_spread`; the rest are recomputed as exact 32-value group dots summed in a
    fixed order (a host sync per chunk, to find them)."""
    keys = _mxfp4_keys(values, scales, tables)  # [S, G, 32]
    max_spread = mxfp4_exact_spread(q_rows.shape[-1])
    dots = q_rows @ keys.flatten(1).T
    exponents = scales.reshape(keys.shape[0], -1).int()
    wide = ((exponents.amax(1) - exponents.amin(1)) > max_spread).nonzero().squeeze(1)
    if wide.numel():
        q_groups = q_rows.view(q_rows.shape[0], -1, MX_GROUP).transpose(0, 1)  # [G, R, 32]
        partial = torch.bmm(q_groups, keys[wide].permute(1, 2, 0))  # [G, R, wide], each exact
        dots[:, wide] = pairwise_sum(partial, 0)
    return dots


def _scaled_dots(
    cache_dtype: str, q_rows: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, tables: Any = None
) -> torch.Tensor:
    """float64 `[R, S]`: q_rows `[R, D]` (float64 codes) . each token's K, scales applied.

    FP8: the exact dot of codes times the token's scale (one rounding). MXFP4: see
    `_mxfp4_dots` (`tables` from `_mxfp4_tables`). `values`, `scales` are the chunk's
    blocks' regions (`split_block`).
    """
    if cache_dtype == "fp8":
        codes = values.reshape(-1, q_rows.shape[-1]).double()  # [S, D]
        return (q_rows @ codes.T).mul_(scales.reshape(1, -1).double())
    return _mxfp4_dots(q_rows, values, scales, tables)


def paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    *,
    cache_dtype: str,
) -> torch.Tensor:
    """logits[t, s] = sum_h w[t,h] * relu(q[t,h] . k[s]) for s < context_lens[t], else -inf.

    k[s] is the dequantised key (codes times their scales). Bit-identical for a row
    however rows are batched, on any CPU or GPU (see the module docstring).
    """
    check_logits_args(q, kv_cache, weights, context_lens, block_table, max_context_len, cache_dtype=cache_dtype)
    check_logits_values(kv_cache, context_lens, block_table, max_context_len)  # it reads lens on the host anyway
    batch, next_n, heads, dim = q.shape
    if dim > FP8_EXACT_MAX_HEAD_DIM:
        raise ValueError(f"q: head_dim {dim} > {FP8_EXACT_MAX_HEAD_DIM}, where float64 dots stop being exact")
    block_size = kv_cache.shape[1]
    values, scales = split_block(PagedCache(kv_cache, block_table, dim, cache_dtype))
    out = torch.full((batch * next_n, max_context_len), float("-inf"), dtype=torch.float32, device=q.device)
    # Head-major rows [H * n, D]: each level of the head tree then adds two contiguous halves.
    q_rows = q.float().double().permute(0, 2, 1, 3).reshape(batch, heads * next_n, dim)
    w = weights.double().view(batch, next_n, heads).permute(0, 2, 1).unsqueeze(-1)  # [B, H, n, 1]
    tables = _mxfp4_tables(q.device) if cache_dtype == "mxfp4" else None
    lens = context_lens.cpu()
    chunk_blocks = max(1, CHUNK_TOKENS // block_size)
    for b in range(batch):
        longest = int(lens[b].max())
        if longest == 0:
            continue
        for first in range(0, -(-longest // block_size), chunk_blocks):
            last = min(first + chunk_blocks, -(-longest // block_size))
            ids = block_table[b, first:last].long()
            dots = _scaled_dots(cache_dtype, q_rows[b], values[ids], scales[ids], tables).view(heads, next_n, -1)
            logits = pairwise_sum(dots.clamp_(min=0.0).mul_(w[b]), 0).float()  # [n, S]: one rounding
            logits.masked_fill_(logits == 0, 0.0)  # +0.0, whatever sign the zero terms had
            lo = first * block_size
            pos = torch.arange(lo, lo + logits.shape[1], device=q.device)
            logits.masked_fill_(pos[None, :] >= context_lens[b][:, None], float("-inf"))
            hi = min(lo + logits.shape[1], max_context_len)
            out[b * next_n : (b + 1) * next_n, lo:hi] = logits[:, : hi - lo]
    return out


@register_backend
class ReferenceBackend(LogitsBackend):
    """PyTorch on any device; the baseline every other backend is compared with."""

    name = "reference"
    family = "reference"
    label = "reference (PyTorch)"
    marker = "^"
    color = "#7f7f7f"
    baseline = True
    batch_invariant = True  # exact q.k sums, every other rounding elementwise in a fixed order (module docstring)
    presets = ("ci",)
    cache_dtypes: ClassVar[tuple[str, ...]] = CACHE_DTYPES

    def logits(self, call: LogitsCall) -> torch.Tensor:
        return paged_mqa_logits(*call.args, cache_dtype=call.cache_dtype)
