"""The PyTorch reference: dequantise each block, score in float32 (or float64), chunked.

Slow and obviously right; every other backend is checked against it. Memory stays
bounded at 128K tokens because each request is scored a chunk of blocks at a time.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from dsa_lab.cache import CACHE_DTYPES, PagedCache, dequantize_blocks
from dsa_lab.kernels.registry import LogitsBackend, check_logits_args, register_backend

CHUNK_TOKENS = 8192


def paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    accum_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """logits[t, s] = sum_h w[t,h] * relu(q[t,h] . k[s]) for s < context_lens[t], else -inf.

    (k[s] already carries its per-token scale, as the fused cache stores it.)
    """
    cache_dtype = check_logits_args(q, kv_cache, weights, context_lens, block_table, max_context_len)
    batch, next_n, heads, dim = q.shape
    block_size = kv_cache.shape[1]
    cache = PagedCache(kv_cache, block_table, dim, cache_dtype)
    out = torch.full((batch * next_n, max_context_len), float("-inf"), dtype=torch.float32, device=q.device)
    w = weights.to(accum_dtype).view(batch, next_n, heads)
    lens = context_lens.cpu()
    chunk_blocks = max(1, CHUNK_TOKENS // block_size)
    for b in range(batch):
        longest = int(lens[b].max())
        if longest == 0:
            continue
        qb = q[b].to(accum_dtype)  # [n, H, D]
        for first in range(0, -(-longest // block_size), chunk_blocks):
            last = min(first + chunk_blocks, -(-longest // block_size))
            k = dequantize_blocks(cache, block_table[b, first:last]).to(accum_dtype)
            scores = torch.relu(torch.einsum("nhd,sd->nhs", qb, k))
            logits = torch.einsum("nhs,nh->ns", scores, w[b])  # [n, S]
            lo = first * block_size
            pos = torch.arange(lo, lo + logits.shape[1], device=q.device)
            valid = pos[None, :] < context_lens[b][:, None]
            logits = torch.where(valid, logits, torch.full_like(logits, float("-inf")))
            hi = min(lo + logits.shape[1], max_context_len)
            out[b * next_n : (b + 1) * next_n, lo:hi] = logits[:, : hi - lo].float()
    return out


@register_backend
class ReferenceBackend(LogitsBackend):
    """PyTorch on any device; the baseline every other backend is compared with."""

    name = "reference"
    baseline = True
    cache_dtypes: ClassVar[tuple[str, ...]] = CACHE_DTYPES

    def logits(self, q, kv_cache, weights, context_lens, block_table, max_context_len, schedule: Any = None):
        return paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_context_len)
