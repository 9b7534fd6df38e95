"""One indexer decode step end to end: metadata -> logits launches -> top-k. Glue only.

Checks are placed by cost. Host checks (shapes, dtypes, the cache dtype against its byte
width) run where a backend call is made (`LogitsCall`). The value scan of a launch (context lens within
its block table, every block id a row reads within the cache, token rows within the
step) copies from the device, so `check_launches` runs it once per step where the
launches are prepared: here in `run_logits`, in the sweep before a point is checked and
timed, in the profiler before the warm-up. A launch's call is made once (`launch_call`: its host checks
then), and timed loops hand it to the backend (`backend.logits(call)`) with no device sync.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsa_lab.batch.cache import PagedCache
from dsa_lab.batch.metadata import DecodeMetadata, KernelLaunch, build_metadata
from dsa_lab.batch.workload import MAX_NEXT_N, DecodeInputs
from dsa_lab.errors import check_range, check_tensor
from dsa_lab.kernels import LogitsBackend, LogitsCall, baseline_backend, get_backend
from dsa_lab.kernels.convention import check_logits_values
from dsa_lab.topk import DEFAULT_TOPK, MAX_TOPK, topk_per_row


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
    if isinstance(backend, LogitsBackend):
        return backend
    if not isinstance(backend, str):
        raise ValueError(f"backend={backend!r}: expected a registered backend name or a LogitsBackend")
    return get_backend(backend)


def _check_inputs(inputs: object) -> DecodeInputs:
    if not isinstance(inputs, DecodeInputs):
        raise ValueError(f"inputs: expected a DecodeInputs (see workload.random_inputs), got {type(inputs).__name__}")
    return inputs


def check_launches(metadata: DecodeMetadata, inputs: DecodeInputs) -> None:
    """The value scan of every launch of a step (see the module docstring): one device->host
    copy per launch, so run it once where launches are prepared, never in a timed loop."""
    _check_inputs(inputs)
    if not isinstance(metadata, DecodeMetadata):
        raise ValueError(f"metadata: expected a DecodeMetadata, got {type(metadata).__name__}")
    if metadata.num_tokens != inputs.batch.num_decode_tokens:
        raise ValueError(
            f"metadata: built for {metadata.num_tokens} query tokens, inputs hold {inputs.batch.num_decode_tokens}"
        )
    for i, launch in enumerate(metadata.launches):
        check_tensor(f"launches[{i}].block_table", launch.block_table, device=inputs.cache.data.device)
        if launch.token_rows.numel() and int(launch.token_rows.max()) >= metadata.num_tokens:
            raise ValueError(
                f"launches[{i}].token_rows: values must be -1 (filler) or < num_tokens={metadata.num_tokens}"
            )
        check_logits_values(inputs.cache.data, launch.context_lens, launch.block_table, metadata.max_context_len)


def pack_launch(launch: KernelLaunch, inputs: DecodeInputs) -> LaunchInputs:
    """Gather each kernel row's query and weights; filler rows get zeros."""
    if not isinstance(launch, KernelLaunch):
        raise ValueError(f"launch: expected a KernelLaunch, got {type(launch).__name__}")
    check_tensor("launch.token_rows", launch.token_rows, device=_check_inputs(inputs).q.device)
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


def launch_call(packed: LaunchInputs, cache: PagedCache, max_context_len: int, schedule: Any = None) -> LogitsCall:
    """The one backend call of a packed launch (`kernels.LogitsCall`), the form decode, the harness and the profiler
    share: made once where the launch is prepared, its host checks run then (no device sync).

    The cache passes its declared dtype, never left to its byte width; the launch's values were
    scanned once by `check_launches`.
    """
    if not isinstance(packed, LaunchInputs):
        raise ValueError(f"packed: expected a LaunchInputs (see decode.pack_launch), got {type(packed).__name__}")
    if not isinstance(cache, PagedCache):  # a bare tensor would leave its dtype to be guessed
        raise ValueError(f"cache: expected a PagedCache (it carries cache_dtype), got {type(cache).__name__}")
    return LogitsCall(
        packed.q,
        cache.data,
        packed.weights,
        packed.context_lens,
        packed.block_table,
        max_context_len,
        schedule,
        cache_dtype=cache.cache_dtype,
    )


def scheduled(backend: LogitsBackend, call: LogitsCall) -> LogitsCall:
    """`call` with `backend`'s schedule for it (`LogitsBackend.schedule`, made on the device: no sync)."""
    return call.scheduled(backend.schedule(call.context_lens, call.kv_cache.shape[1], call.block_table))


def launch_logits(
    backend: LogitsBackend, packed: LaunchInputs, cache: PagedCache, max_context_len: int, schedule: Any = None
) -> torch.Tensor:
    """One backend call on a packed launch (`launch_call`, then `backend.logits`)."""
    return backend.logits(launch_call(packed, cache, max_context_len, schedule))


def native_sizes_for(backend: LogitsBackend, device: torch.device) -> tuple[int, ...]:
    """The next_n values `backend` runs natively on `device`, as it declares them (`native_next_n`);
    a backend native for any next_n gets 1..MAX_NEXT_N, so its atom plan is one native piece."""
    native = backend.native_next_n(device)
    return tuple(sorted(native)) if native is not None else tuple(range(1, MAX_NEXT_N + 1))


def scatter_logits(
    metadata: DecodeMetadata, outputs: Sequence[torch.Tensor], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token logits `[T, max_len]` (masked to -inf beyond context) and context lens `[T]`.

    Needs one output per launch, each `[rows, >= max_context_len]` on `device`: a missing
    output would leave its tokens' rows -inf, an empty selection that looks legitimate.
    """
    if len(outputs) != len(metadata.launches):
        raise ValueError(f"outputs: {len(outputs)} tensors for {len(metadata.launches)} launches; need one per launch")
    for i, (launch, out) in enumerate(zip(metadata.launches, outputs)):
        check_tensor(f"outputs[{i}]", out, dtype=(torch.float32, torch.bfloat16, torch.float16), ndim=2, device=device)
        if out.shape[0] != launch.token_rows.numel() or out.shape[1] < metadata.max_context_len:
            raise ValueError(
                f"outputs[{i}]: expected [{launch.token_rows.numel()}, >= {metadata.max_context_len}], got {tuple(out.shape)}"
            )
    width = metadata.max_context_len
    logits = torch.full((metadata.num_tokens, width), float("-inf"), dtype=torch.float32, device=device)
    for launch, out in zip(metadata.launches, outputs):
        rows = launch.token_rows.reshape(-1)
        real = rows >= 0
        logits[rows[real]] = out[real, :width].float()
    context = metadata.token_context_lens()
    pos = torch.arange(width, device=device)
    logits.masked_fill_(pos[None, :] >= context[:, None], float("-inf"))
    return logits, context


def gather_selections(metadata: DecodeMetadata, selections: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-token top-k `[T, k]` from one selection per launch (`[rows, k]`, a launch's kernel rows, as
    `topk.topk_in_context` picks them on its output): filler rows dropped, tokens no row holds -1."""
    if len(selections) != len(metadata.launches):
        raise ValueError(
            f"selections: {len(selections)} tensors for {len(metadata.launches)} launches; need one per launch"
        )
    first = selections[0]
    check_tensor("selections[0]", first, dtype=torch.int32, ndim=2)
    out = torch.full((metadata.num_tokens, first.shape[1]), -1, dtype=torch.int32, device=first.device)
    for i, (launch, picked) in enumerate(zip(metadata.launches, selections)):
        check_tensor(
            f"selections[{i}]",
            picked,
            dtype=torch.int32,
            shape=(launch.token_rows.numel(), first.shape[1]),
            device=first.device,
        )
        rows = launch.token_rows.reshape(-1)
        real = rows >= 0
        out[rows[real]] = picked[real]
    return out


def run_logits(
    inputs: DecodeInputs, metadata: DecodeMetadata, backend: LogitsBackend, schedules: Sequence[Any] | None = None
) -> list[torch.Tensor]:
    """Launch the backend once per launch of the metadata (values checked first; each launch with its schedule of
    `schedules`, else the backend's own); return the raw outputs."""
    check_launches(metadata, inputs)
    if schedules is not None and len(schedules) != len(metadata.launches):
        raise ValueError(f"schedules: {len(schedules)} for {len(metadata.launches)} launches; need one per launch")
    outputs = []
    for i, launch in enumerate(metadata.launches):
        call = launch_call(pack_launch(launch, inputs), inputs.cache, metadata.max_context_len)
        call = call.scheduled(schedules[i]) if schedules is not None else scheduled(backend, call)
        outputs.append(backend.logits(call))
    return outputs


def run_decode(
    inputs: DecodeInputs,
    strategy: str,
    backend: str | LogitsBackend | None = None,
    topk: int = DEFAULT_TOPK,
    max_context_len: int | None = None,
) -> DecodeResult:
    """Build the strategy's metadata, run every launch, scatter rows back and pick the top-k (`backend`: a
    name, a backend, or None for the correctness baseline, the reference); the logits are `max_context_len`
    wide (`metadata.logits_width`: the longest context unless wider)."""
    _check_inputs(inputs)
    check_range("topk", topk, 1, MAX_TOPK)
    kernel = baseline_backend() if backend is None else resolve_backend(backend)
    device = inputs.q.device
    batch = inputs.batch
    metadata = build_metadata(
        strategy, batch, inputs.cache.block_table, native_sizes_for(kernel, device), max_context_len
    )
    for launch in metadata.launches:
        kernel.require(device, launch.next_n, batch.num_heads, batch.head_dim, batch.cache_dtype)
    outputs = run_logits(inputs, metadata, kernel)
    logits, context = scatter_logits(metadata, outputs, device)
    return DecodeResult(metadata, logits, context, topk_per_row(logits, context, topk))
