"""DeepGEMM's calling convention, checked: what every backend's `logits` and every native kernel's public
wrapper hold a call to (host checks that never sync the device; the value scan, once per launch), and the
SMs a persistent grid or a schedule is made for."""

from __future__ import annotations

import functools

import torch

from dsa_lab.cache import CACHE_DTYPES, bytes_per_token
from dsa_lab.errors import BackendUnavailable, UnsupportedShape, check_choice, check_range, check_tensor
from dsa_lab.kernels.descriptor import LogitsBackend


def _width_hint(width: int) -> str:
    """What a token width could hold (mxfp4 takes 17 D / 32 bytes), so a contradiction says what fits."""
    fits = [f"fp8 at head_dim {width - 4}"] if width > 4 else []
    if width * 32 % 17 == 0 and (width * 32 // 17) % 32 == 0:
        fits.append(f"mxfp4 at head_dim {width * 32 // 17}")
    return f" ({width} bytes a token is {' or '.join(fits)})" if fits else ""


def check_logits_args(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    *,
    cache_dtype: str,
) -> None:
    """Host checks of one call in DeepGEMM's convention: types, shapes, dtypes, devices, the
    cache's contiguity and its byte width against the declared `cache_dtype` (at q's head_dim).

    Never reads tensor values, so it is safe inside timed loops and graph capture; see
    `check_logits_values` for context lens and block ids.
    """
    check_choice("cache_dtype", cache_dtype, CACHE_DTYPES)
    check_tensor("q", q, dtype=torch.float8_e4m3fn, ndim=4)
    batch, next_n, heads, dim = q.shape
    if min(q.shape) < 1:
        raise ValueError(f"q: shape {tuple(q.shape)}: batch, next_n, heads and head_dim must each be >= 1")
    check_tensor("kv_cache", kv_cache, dtype=torch.uint8, ndim=4, device=q.device)
    width = bytes_per_token(dim, cache_dtype)
    blocks, block_size, one, got = kv_cache.shape
    if one != 1 or got != width or blocks < 1 or block_size < 1:
        raise ValueError(
            f"kv_cache: cache_dtype={cache_dtype!r} at head_dim={dim} (q's last dim) is "
            f"[num_blocks >= 1, block_size, 1, {width}] uint8, got {tuple(kv_cache.shape)}{_width_hint(got)}"
        )
    check_tensor("kv_cache", kv_cache, contiguous=True)
    check_tensor("weights", weights, dtype=torch.float32, shape=(batch * next_n, heads), device=q.device)
    check_tensor("context_lens", context_lens, dtype=torch.int32, shape=(batch, next_n), device=q.device)
    check_tensor("block_table", block_table, dtype=torch.int32, shape=(batch, None), device=q.device)
    check_range("max_context_len", max_context_len, 1, 1 << 31)


def check_logits_values(
    kv_cache: torch.Tensor, context_lens: torch.Tensor, block_table: torch.Tensor, max_context_len: int
) -> None:
    """Context lens in [0, min(table capacity, max_context_len)], and the id of every block a
    row reads in [0, num_blocks): an id outside would make a kernel read outside the cache.

    Reads values: one device->host copy of four numbers. Run it once per launch where the
    launch is prepared, never in a timed loop; arguments must have passed `check_logits_args`.
    """
    if context_lens.numel() == 0:
        return
    block_size, width = kv_cache.shape[1], block_table.shape[1]
    capacity = min(width * block_size, max_context_len)
    lens = context_lens.to(torch.int64)
    need = (lens.amax(dim=1).clamp(min=0) + block_size - 1) // block_size  # blocks each request reads
    used = torch.arange(width, device=block_table.device)[None, :] < need[:, None]
    ids = block_table.to(torch.int64)
    low_id = torch.where(used, ids, torch.full_like(ids, 1 << 40)).amin() if width else lens.new_tensor(1 << 40)
    high_id = torch.where(used, ids, torch.full_like(ids, -1)).amax() if width else lens.new_tensor(-1)
    low, high, low_id, high_id = torch.stack([lens.amin(), lens.amax(), low_id, high_id]).tolist()
    if low < 0 or high > capacity:
        raise ValueError(
            f"context_lens: values must lie in [0, {capacity}] (block table holds {width}x{block_size} "
            f"tokens, max_context_len={max_context_len}); got [{low}, {high}]"
        )
    if low_id <= high_id and (low_id < 0 or high_id >= kv_cache.shape[0]):  # low > high: no block is read
        raise ValueError(
            f"block_table: ids of the blocks rows read must lie in [0, {kv_cache.shape[0] - 1}] "
            f"(the cache's blocks), got [{low_id}, {high_id}]"
        )


def check_native_call(
    backend: LogitsBackend,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    *,
    cache_dtype: str,
    check_values: bool,
    out: torch.Tensor | None,
    max_next_n: int,
    block_size: int,
) -> None:
    """The host checks of a native kernel's public wrapper, before its own config check: the common
    convention, then next_n, heads/dim/dtype, block size, `check_values` and `out`, each named.

    No device sync and no availability check, so every bad argument is named on any machine.
    """
    check_logits_args(q, kv_cache, weights, context_lens, block_table, max_context_len, cache_dtype=cache_dtype)
    _, next_n, heads, dim = q.shape
    check_range("next_n", next_n, 1, max_next_n)
    backend.check_shape(heads, dim, cache_dtype)
    if kv_cache.shape[1] != block_size:
        raise UnsupportedShape(f"block_size={kv_cache.shape[1]!r}: backend {backend.name!r} allows {(block_size,)}")
    check_choice("check_values", check_values, (False, True))
    if out is not None:
        shape = (q.shape[0] * next_n, max_context_len)
        check_tensor("out", out, dtype=torch.float32, shape=shape, device=q.device, contiguous=True)


def ready_native_call(
    backend: LogitsBackend,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    *,
    check_values: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """After `check_native_call`: the backend must run on q's device (else BackendUnavailable says
    why), the value scan runs when asked, and q, weights, context_lens, block_table come back in
    the layout the kernels index (contiguous; the table's rows unit-stride)."""
    state = backend.availability(q.device)
    if not state.ok:
        raise BackendUnavailable(f"backend {backend.name!r} unavailable on {q.device}: {state.reason}")
    if check_values:
        check_logits_values(kv_cache, context_lens, block_table, max_context_len)
    if block_table.stride(1) != 1:
        block_table = block_table.contiguous()
    return q.contiguous(), weights.contiguous(), context_lens.contiguous(), block_table


@functools.cache
def num_sms(device_index: int) -> int:
    """Streaming multiprocessors of CUDA device `device_index`: how many CTAs a persistent grid launches."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count
