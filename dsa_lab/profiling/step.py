"""One decode step cut into named phases, checked against the reference before anyone profiles it.

The phases ("metadata", "pack", "logits", "scatter", "topk") are torch.profiler
`record_function` ranges and, for Nsight Compute, NVTX push/pop ranges, so both tools
can attribute every kernel to the part of the step that launched it. The step is built
from `dsa_lab.decode`'s own blocks; only the loop over launches is spelled out here so
that pack and logits get separate ranges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch.profiler import record_function

from dsa_lab.cache import PagedCache, bytes_per_token, permuted_block_table, quantize_fp8
from dsa_lab.decode import (
    DecodeResult,
    check_launches,
    launch_logits,
    native_sizes_for,
    pack_launch,
    resolve_backend,
    run_decode,
    scatter_logits,
)
from dsa_lab.errors import as_device, as_int, check_range
from dsa_lab.kernels import LogitsBackend
from dsa_lab.metadata import build_metadata
from dsa_lab.roofline import StepShape, step_cost
from dsa_lab.topk import DEFAULT_TOPK, topk_per_row
from dsa_lab.workload import DecodeBatch, DecodeInputs

PHASES = ("metadata", "pack", "logits", "scatter", "topk")
DEFAULT_TOLERANCE = 1e-3


class ProfileRefused(ValueError):
    """A configuration whose results disagree with the reference: profiling it would mislead."""


@contextmanager
def phase(name: str, nvtx: bool = False) -> Iterator[None]:
    """A torch.profiler range, and an NVTX push/pop range of the same name when `nvtx`."""
    with record_function(name):
        if nvtx:
            torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            if nvtx:
                torch.cuda.nvtx.range_pop()


def phased_decode(
    inputs: DecodeInputs,
    strategy: str,
    backend: str | LogitsBackend,
    topk: int = DEFAULT_TOPK,
    *,
    nvtx: bool = False,
    logits_window: Callable[[], AbstractContextManager[object]] = nullcontext,
    check: bool = True,
) -> DecodeResult:
    """`decode.run_decode` with every phase in its own range.

    The backend's scheduling metadata (DeepGEMM's SM plan) belongs to "metadata", as in
    vLLM's metadata builder. `logits_window` wraps each backend call only (the ncu target
    opens a profiling window there). `check` runs the value scans (launches, finite
    logits), each a device->host copy vLLM's step does not make: the warm-up runs them,
    and the profiled steps on the same inputs pass `check=False` so the tables show the step alone.
    """
    kernel = resolve_backend(backend)
    device, batch = inputs.q.device, inputs.batch
    with phase("metadata", nvtx):
        metadata = build_metadata(strategy, batch, inputs.cache.block_table, native_sizes_for(kernel, device))
        for launch in metadata.launches:
            kernel.require(device, launch.next_n, batch.num_heads, batch.head_dim, batch.cache_dtype)
        if check:
            check_launches(metadata, inputs)
        schedules = [kernel.schedule(launch.context_lens, batch.block_size) for launch in metadata.launches]
    outputs = []
    for launch, schedule in zip(metadata.launches, schedules):
        with phase("pack", nvtx):
            packed = pack_launch(launch, inputs)
        with phase("logits", nvtx), logits_window():
            outputs.append(launch_logits(kernel, packed, inputs.cache, metadata.max_context_len, schedule))
    with phase("scatter", nvtx):
        logits, context = scatter_logits(metadata, outputs, device)
    with phase("topk", nvtx):
        indices = topk_per_row(logits, context, topk, check_values=check)
    return DecodeResult(metadata, logits, context, indices)


def reference_logits(inputs: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference backend's per-token logits and context lengths for `inputs`."""
    result = run_decode(inputs, "native", "reference", topk=1)
    return result.logits, result.context_lens


def relative_error(result: DecodeResult, reference: tuple[torch.Tensor, torch.Tensor]) -> float:
    """max |logits - reference| / max |reference| over every token's valid positions (inf on NaN)."""
    ref_logits, ref_context = reference
    if not torch.equal(result.context_lens.cpu(), ref_context.cpu()):
        return float("inf")
    width = ref_logits.shape[1]
    valid = torch.arange(width, device=ref_logits.device)[None, :] < ref_context[:, None]
    if not bool(valid.any()):
        return 0.0
    got, want = result.logits[valid], ref_logits[valid]
    if not bool(torch.isfinite(got).all()):
        return float("inf")
    scale = float(want.abs().max().clamp(min=torch.finfo(torch.float32).tiny))
    return float((got - want).abs().max()) / scale


def check_correctness(
    result: DecodeResult,
    reference: tuple[torch.Tensor, torch.Tensor],
    label: str,
    tolerance: float = DEFAULT_TOLERANCE,
) -> float:
    """The relative error of `result`; raise ProfileRefused when it exceeds `tolerance`."""
    err = relative_error(result, reference)
    if not err <= tolerance:
        raise ProfileRefused(
            f"{label}: relative error {err:.3g} against the reference backend exceeds "
            f"{tolerance:g} on valid positions; refusing to profile an incorrect configuration"
        )
    return err


def _check_batch(batch: object) -> None:
    if not isinstance(batch, DecodeBatch):
        raise ValueError(f"batch: expected a DecodeBatch, got {type(batch).__name__}")


def random_queries(batch: DecodeBatch, seed: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh FP8 queries `[T, H, D]` and float32 weights `[T, H]` drawn on `device` (never zeros)."""
    _check_batch(batch)
    seed, device = as_int("seed", seed), as_device("device", device)
    gen = torch.Generator(device=device).manual_seed(seed)
    tokens, heads, dim = batch.num_decode_tokens, batch.num_heads, batch.head_dim
    q = torch.randn(tokens, heads, dim, generator=gen, device=device).clamp(-448, 448).to(torch.float8_e4m3fn)
    weights = torch.randn(tokens, heads, generator=gen, device=device) * heads**-0.5
    return q, weights


def random_fp8_cache(
    batch: DecodeBatch, seed: int, device: torch.device | str, chunk_blocks: int = 8192
) -> PagedCache:
    """A fused-FP8 paged cache of random keys, drawn and quantised on `device` in bulk.

    `workload.random_inputs` draws keys on the host and writes blocks one by one, which
    takes minutes at B=128, L=64K; profiles need the same layout (cache.py's: e4m3
    values then float32 scales per block, physical ids a random permutation) in seconds.
    Every block holds quantised random keys, so tails past a context are finite too.
    """
    _check_batch(batch)
    if batch.cache_dtype != "fp8":
        raise ValueError(f"cache_dtype={batch.cache_dtype!r}: random_fp8_cache builds 'fp8' only")
    check_range("chunk_blocks", chunk_blocks, 1, 1 << 20)
    seed, device = as_int("seed", seed), as_device("device", device)
    size, dim = batch.block_size, batch.head_dim
    per_request = [max(1, -(-length // size)) for length in batch.seq_lens]
    num_blocks = sum(per_request) + 1  # one spare block nobody owns
    gen = torch.Generator(device=device).manual_seed(seed)
    data = torch.empty(num_blocks, size * (dim + 4), dtype=torch.uint8, device=device)
    for lo in range(0, num_blocks, chunk_blocks):
        hi = min(lo + chunk_blocks, num_blocks)
        values, scales = quantize_fp8(torch.randn((hi - lo) * size, dim, generator=gen, device=device))
        data[lo:hi, : size * dim] = values.view(torch.uint8).reshape(hi - lo, size * dim)
        data[lo:hi, size * dim :] = scales.view(torch.uint8).reshape(hi - lo, size * 4)
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed + 1)).to(torch.int32)
    table = permuted_block_table(per_request, perm)
    return PagedCache(data.view(num_blocks, size, 1, dim + 4), table.to(device), dim, "fp8")


def profile_inputs(
    batch: DecodeBatch, seed: int = 0, device: torch.device | str = "cpu", cache: PagedCache | None = None
) -> DecodeInputs:
    """Inputs for a profile: fresh queries for `batch`, on a given cache or a new random one.

    Passing the cache of another batch with the same requests (e.g. another next_n) skips
    rebuilding gigabytes of KV between configurations.
    """
    _check_batch(batch)
    if cache is None:
        cache = random_fp8_cache(batch, seed, device)
    elif not isinstance(cache, PagedCache):
        raise ValueError(f"cache: expected a PagedCache or None, got {type(cache).__name__}")
    elif cache.block_table.shape[0] != batch.batch_size or cache.head_dim != batch.head_dim:
        raise ValueError(
            f"cache: built for {cache.block_table.shape[0]} requests of head_dim {cache.head_dim}, "
            f"batch has {batch.batch_size} of head_dim {batch.head_dim}"
        )
    q, weights = random_queries(batch, seed + 2, cache.data.device)
    return DecodeInputs(batch, q, weights, cache)


def useful_costs(batch: DecodeBatch, strategy: str, native_sizes: tuple[int, ...]) -> dict[str, float | None]:
    """What a step must do, for normalising measurements; `modeled_kv_bytes` is what the strategy reads.

    unique KV bytes: every request's KV once (sum(L) * bytes per token); useful FLOPs:
    2 * H * D * the sum of every token's context. `modeled_kv_bytes` comes from
    `roofline.step_cost` (re-reads included) and exists for uniform batches only.
    """
    per_token = bytes_per_token(batch.head_dim, batch.cache_dtype)
    modeled = None
    if batch.is_uniform and min(batch.seq_lens) >= batch.next_n:
        shape = StepShape(batch.seq_lens, batch.next_n, strategy, batch.num_heads, batch.head_dim, batch.cache_dtype, native_sizes)
        modeled = float(step_cost(shape).strategy_kv_bytes)
    return {
        "unique_kv_bytes": float(sum(batch.seq_lens) * per_token),
        "modeled_kv_bytes": modeled,
        "useful_flops": float(2 * batch.num_heads * batch.head_dim * sum(batch.token_context_lens())),
    }
