"""One indexer decode step end to end: metadata -> logits launches -> top-k. Glue only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsa_lab.kernels import LogitsBackend, get_backend
from dsa_lab.kernels.deepgemm import SM90_NATIVE_NEXT_N
from dsa_lab.kernels.registry import check_logits_args
from dsa_lab.metadata import DecodeMetadata, KernelLaunch, build_metadata
from dsa_lab.topk import DEFAULT_TOPK, topk_per_row
from dsa_lab.workload import DecodeInputs

SM90_DEEPGEMM_NATIVE = tuple(sorted(SM90_NATIVE_NEXT_N))  # (1, 2, 4)


@dataclass(frozen=True)
class LaunchInputs:
    """Everything one kernel launch takes, in DeepGEMM's calling convention."""

    q: torch.Tensor  # [B', n', H, D] fp8
    weights: torch.Tensor  # [B'*n', H] f32
    context_lens: torch.Tensor  # [B', n'] int32
    block_table: torch.Tensor  # [B', max_blocks] int32


@dataclass(frozen=True)
class DecodeResult:
    metadata: DecodeMetadata
    logits: torch.Tensor  # f32 [num_tokens, max_context_len], -inf beyond each token's context
    context_lens: torch.Tensor  # int32 [num_tokens]
    indices: torch.Tensor  # int32 [num_tokens, k]


def resolve_backend(backend: str | LogitsBackend) -> LogitsBackend:
    """A registered backend by name, or the backend object itself."""
    return get_backend(backend) if isinstance(backend, str) else backend


def pack_launch(launch: KernelLaunch, inputs: DecodeInputs) -> LaunchInputs:
    """Gather each kernel row's query and weights; filler rows get zeros."""
    rows = launch.token_rows.reshape(-1)
    real = (rows >= 0)[:, None]
    safe = rows.clamp(min=0)
    q = inputs.q[safe].view(torch.uint8)
    q = torch.where(real[..., None], q, torch.zeros_like(q)).view(torch.float8_e4m3fn)
    weights = torch.where(real, inputs.weights[safe], torch.zeros_like(inputs.weights[safe]))
    bsz, n = launch.token_rows.shape
    return LaunchInputs(
        q.reshape(bsz, n, *inputs.q.shape[1:]).contiguous(),
        weights.contiguous(),
        launch.context_lens,
        launch.block_table,
    )


def launch_logits(
    backend: LogitsBackend, packed: LaunchInputs, cache_data: torch.Tensor, max_context_len: int, schedule: Any = None
) -> torch.Tensor:
    """One backend call on a packed launch, unchecked: the form decode, benchmarks and profiles share."""
    return backend.logits(
        packed.q, cache_data, packed.weights, packed.context_lens, packed.block_table, max_context_len, schedule
    )


def native_sizes_for(backend: LogitsBackend, device: torch.device) -> Sequence[int]:
    """Atom pieces a backend runs natively; a backend native for any n uses SM90 DeepGEMM's set."""
    native = backend.native_next_n(device)
    return tuple(sorted(native)) if native is not None else SM90_DEEPGEMM_NATIVE


def scatter_logits(
    metadata: DecodeMetadata, outputs: Sequence[torch.Tensor], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token logits `[T, max_len]` (masked to -inf beyond context) and context lens `[T]`."""
    width = metadata.max_context_len
    logits = torch.full((metadata.num_tokens, width), float("-inf"), dtype=torch.float32, device=device)
    for launch, out in zip(metadata.launches, outputs):
        rows = launch.token_rows.reshape(-1)
        real = rows >= 0
        logits[rows[real]] = out[real].float()
    context = metadata.token_context_lens()
    pos = torch.arange(width, device=device)
    logits.masked_fill_(pos[None, :] >= context[:, None], float("-inf"))
    return logits, context


def run_logits(
    inputs: DecodeInputs, metadata: DecodeMetadata, backend: LogitsBackend, schedules: Sequence[Any] | None = None
) -> list[torch.Tensor]:
    """Launch the backend once per launch of the metadata; return the raw outputs."""
    outputs = []
    for i, launch in enumerate(metadata.launches):
        packed = pack_launch(launch, inputs)
        check_logits_args(
            packed.q, inputs.cache.data, packed.weights, packed.context_lens, packed.block_table, metadata.max_context_len
        )
        schedule = schedules[i] if schedules is not None else backend.schedule(packed.context_lens, inputs.batch.block_size)
        outputs.append(launch_logits(backend, packed, inputs.cache.data, metadata.max_context_len, schedule))
    return outputs


def run_decode(
    inputs: DecodeInputs, strategy: str, backend: str | LogitsBackend = "reference", topk: int = DEFAULT_TOPK
) -> DecodeResult:
    """Build the strategy's metadata, run every launch, scatter rows back and pick the top-k."""
    kernel = resolve_backend(backend)
    device = inputs.q.device
    batch = inputs.batch
    metadata = build_metadata(strategy, batch, inputs.cache.block_table, native_sizes_for(kernel, device))
    for launch in metadata.launches:
        kernel.require(device, launch.next_n, batch.num_heads, batch.head_dim, batch.cache_dtype)
    outputs = run_logits(inputs, metadata, kernel)
    logits, context = scatter_logits(metadata, outputs, device)
    return DecodeResult(metadata, logits, context, topk_per_row(logits, context, topk))
