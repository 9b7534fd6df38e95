"""Decode metadata: how a step's query tokens become rows of paged-MQA-logits launches.

Three strategies, one result type:
- native: one launch, q `[B, n]` with 2-D context lens (n = max decode len);
- flatten: one launch of `num_decode_tokens` single-row pseudo-requests, each with a
  copy of its request's block-table row (vLLM 0.33's `_prepare_decode_tensors`);
- atom: several native launches over pieces of the n rows (e.g. 8 = 4+4, 3 = padded 4),
  so a kernel that is native only for some n still reads each KV tile once per piece.

Ragged requests (decode_len < n) are right-aligned in native/atom rows, so row j of a
request keeps the context `L - n + 1 + j` that vLLM gives it and every real token sees
exactly its own causal context. (vLLM's `pack_seq_triton` left-aligns them instead;
see docs/ARCHITECTURE.md for when that matters.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsa_lab.batch.workload import MAX_NEXT_N, DecodeBatch
from dsa_lab.errors import check_choice, check_int_sequence, check_range, check_tensor

STRATEGIES = ("native", "flatten", "atom")


@dataclass(frozen=True)
class KernelLaunch:
    """The metadata of one paged-MQA-logits launch."""

    token_rows: torch.Tensor  # int64 [B', n']: query token of each kernel row, -1 = filler
    context_lens: torch.Tensor  # int32 [B', n']
    block_table: torch.Tensor  # int32 [B', max_blocks]

    def __post_init__(self) -> None:
        check_tensor("token_rows", self.token_rows, dtype=torch.int64, ndim=2)
        check_tensor("context_lens", self.context_lens, dtype=torch.int32, shape=tuple(self.token_rows.shape))
        check_tensor("block_table", self.block_table, dtype=torch.int32, shape=(self.token_rows.shape[0], None))

    @property
    def batch_size(self) -> int:
        return self.token_rows.shape[0]

    @property
    def next_n(self) -> int:
        return self.token_rows.shape[1]


@dataclass(frozen=True)
class DecodeMetadata:
    """Every launch of one decode step, and how their rows map back to query tokens."""

    strategy: str
    launches: tuple[KernelLaunch, ...]
    num_tokens: int
    max_context_len: int

    def __post_init__(self) -> None:
        check_choice("strategy", self.strategy, STRATEGIES)
        if (
            not isinstance(self.launches, tuple)
            or not self.launches
            or not all(isinstance(x, KernelLaunch) for x in self.launches)
        ):
            raise ValueError(f"launches: need a non-empty tuple of KernelLaunch, got {self.launches!r:.80}")
        check_range("num_tokens", self.num_tokens, 0, 1 << 31)
        check_range("max_context_len", self.max_context_len, 0, 1 << 31)

    @property
    def kernel_rows(self) -> int:
        """Query rows the kernels compute, fillers included (each reads its KV range)."""
        return sum(launch.token_rows.numel() for launch in self.launches)

    def token_context_lens(self) -> torch.Tensor:
        """Context length of every query token as the kernels see it (0 if no row holds it)."""
        out = torch.zeros(self.num_tokens, dtype=torch.int32, device=self.launches[0].context_lens.device)
        for launch in self.launches:
            rows = launch.token_rows.reshape(-1)
            real = rows >= 0
            out[rows[real]] = launch.context_lens.reshape(-1)[real]
        return out


def _request_tensors(batch: DecodeBatch, block_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    device = block_table.device
    seq = torch.tensor(batch.seq_lens, dtype=torch.int32, device=device)
    dec = torch.tensor(batch.decode_lens, dtype=torch.int32, device=device)
    start = torch.cumsum(dec, 0) - dec
    return seq, dec, start


def _check_table(batch: DecodeBatch, block_table: torch.Tensor) -> None:
    """Host checks: the table's shape holds every request; its ids are checked against a cache at launch."""
    if not isinstance(batch, DecodeBatch):
        raise ValueError(f"batch: expected a DecodeBatch, got {type(batch).__name__}")
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2:
        got = (
            f"{block_table.dtype} {tuple(block_table.shape)}"
            if isinstance(block_table, torch.Tensor)
            else type(block_table).__name__
        )
        raise ValueError(f"block_table: expected int32 [B, max_blocks], got {got}")
    if block_table.shape[0] != batch.batch_size:
        raise ValueError(f"block_table: {block_table.shape[0]} rows for batch_size={batch.batch_size}")
    need = -(-batch.max_seq_len // batch.block_size)
    if block_table.shape[1] < need:
        raise ValueError(
            f"block_table: {block_table.shape[1]} blocks per request cannot hold "
            f"seq_len={batch.max_seq_len} (needs {need} of {batch.block_size} tokens)"
        )


def _native_rows(batch: DecodeBatch, block_table: torch.Tensor, offset: int, width: int) -> KernelLaunch:
    """Native rows [offset, offset + width) of the right-aligned `[B, n]` layout."""
    seq, dec, start = _request_tensors(batch, block_table)
    n = batch.max_decode_len
    j = torch.arange(offset, offset + width, device=block_table.device, dtype=torch.int32)
    context = (seq[:, None] - n + 1 + j[None, :]).clamp(min=0)
    first_real = n - dec  # right alignment: rows before it are fillers
    real = (j[None, :] >= first_real[:, None]) & (j[None, :] < n)
    token = start[:, None] + j[None, :] - first_real[:, None]
    token_rows = torch.where(real, token, torch.full_like(token, -1)).long()
    return KernelLaunch(token_rows, context.to(torch.int32).contiguous(), block_table)


def logits_width(batch: DecodeBatch, max_context_len: int | None = None) -> int:
    """The logits' width, the kernels' `max_context_len`: the batch's longest context (None, as
    dsa_lab always passed) or a wider one, e.g. vLLM's `max_model_len` (vLLM 0.33 sizes the
    decode logits `[tokens, max_model_len]` and passes that to the kernel)."""
    if max_context_len is None:
        return batch.max_seq_len
    return check_range("max_context_len", max_context_len, batch.max_seq_len, 1 << 31)


def build_native_metadata(
    batch: DecodeBatch, block_table: torch.Tensor, max_context_len: int | None = None
) -> DecodeMetadata:
    """One launch with q `[B, max_decode_len]` and context `L - n + 1 + j`, clamped at 0."""
    _check_table(batch, block_table)
    launch = _native_rows(batch, block_table, 0, batch.max_decode_len)
    return DecodeMetadata("native", (launch,), batch.num_decode_tokens, logits_width(batch, max_context_len))


def build_flatten_metadata(
    batch: DecodeBatch, block_table: torch.Tensor, max_context_len: int | None = None
) -> DecodeMetadata:
    """`num_decode_tokens` single-row pseudo-requests, each re-reading its request's blocks.

    Token t of request b sees `L_b - d_b + 1 + i`; surplus (CUDA-graph padding) tokens
    get context 0 and an all-zero block-table row.
    """
    _check_table(batch, block_table)
    seq, dec, _ = _request_tensors(batch, block_table)
    real = batch.num_real_tokens
    total = batch.num_decode_tokens
    owner = torch.repeat_interleave(torch.arange(batch.batch_size, device=block_table.device), dec.long())
    within = torch.arange(real, device=block_table.device) - (torch.cumsum(dec, 0) - dec).long()[owner]
    context = torch.zeros(total, 1, dtype=torch.int32, device=block_table.device)
    context[:real, 0] = (seq[owner] - dec[owner] + 1 + within).clamp(min=0).to(torch.int32)
    table = torch.zeros(total, block_table.shape[1], dtype=torch.int32, device=block_table.device)
    table[:real] = block_table[owner]
    rows = torch.arange(total, device=block_table.device).long()[:, None]
    launch = KernelLaunch(rows, context, table)
    return DecodeMetadata("flatten", (launch,), total, logits_width(batch, max_context_len))


@dataclass(frozen=True)
class AtomPiece:
    """`size` native rows starting at native row `offset`; `offset < 0` means front padding."""

    size: int
    offset: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", check_range("size", self.size, 1, MAX_NEXT_N))
        object.__setattr__(self, "offset", check_range("offset", self.offset, -MAX_NEXT_N, MAX_NEXT_N))


def _check_sizes(native_sizes: Sequence[int]) -> tuple[int, ...]:
    sizes = check_int_sequence("native_sizes", native_sizes, 1, MAX_NEXT_N)
    if not sizes:
        raise ValueError(f"native_sizes={tuple(native_sizes)}: need at least one size in 1..{MAX_NEXT_N}")
    return sizes


def plan_atoms(next_n: int, native_sizes: Sequence[int], allow_padding: bool = True) -> tuple[AtomPiece, ...]:
    """Split next_n rows into natively supported pieces: fewest launches, then least padding.

    e.g. with sizes {1, 2, 4}: 3 -> one padded 4, 5 -> 4+1, 6 -> 4+2, 7 -> 4+padded 4, 8 -> 4+4.
    """
    next_n = check_range("next_n", next_n, 1, MAX_NEXT_N)
    sizes = sorted(set(_check_sizes(native_sizes)))
    check_choice("allow_padding", allow_padding, (False, True))
    if next_n in sizes:
        return (AtomPiece(next_n, 0),)
    best: tuple[int, int, tuple[int, ...]] | None = None
    for combo in _combinations(sizes, next_n, allow_padding):
        key = (len(combo), sum(combo) - next_n, tuple(-s for s in combo))
        if best is None or key < best:
            best = key
    if best is None:
        raise ValueError(f"next_n={next_n} cannot be built from native sizes {tuple(sizes)}")
    pieces, pad = sorted((-s for s in best[2]), reverse=True), best[1]
    out, offset = [], -pad
    for size in pieces:
        out.append(AtomPiece(size, offset))
        offset += size
    return tuple(out)


def _combinations(sizes: list[int], target: int, allow_padding: bool) -> list[tuple[int, ...]]:
    """Multisets of sizes covering target rows (exactly, or with padding in the last piece)."""
    found: list[tuple[int, ...]] = []

    def walk(remaining: int, smallest_index: int, chosen: tuple[int, ...]) -> None:
        if remaining <= 0:
            if remaining == 0 or allow_padding:
                found.append(chosen)
            return
        if len(chosen) >= target:
            return
        for i in range(smallest_index, len(sizes)):
            walk(remaining - sizes[i], i, chosen + (sizes[i],))

    walk(target, 0, ())
    return found


def build_atom_metadata(
    batch: DecodeBatch, block_table: torch.Tensor, pieces: Sequence[AtomPiece], max_context_len: int | None = None
) -> DecodeMetadata:
    """Native launches over the given pieces of the right-aligned `[B, n]` row layout."""
    _check_table(batch, block_table)
    if isinstance(pieces, (str, bytes)) or not all(isinstance(p, AtomPiece) for p in pieces):
        raise ValueError(f"pieces={pieces!r:.80}: need a sequence of AtomPiece (see plan_atoms)")
    n = batch.max_decode_len
    covered = sorted(r for p in pieces for r in range(p.offset, p.offset + p.size) if 0 <= r < n)
    if covered != list(range(n)):
        raise ValueError(f"pieces={tuple(pieces)}: must cover native rows 0..{n - 1} exactly once")
    launches = tuple(_native_rows(batch, block_table, p.offset, p.size) for p in pieces)
    return DecodeMetadata("atom", launches, batch.num_decode_tokens, logits_width(batch, max_context_len))


def strategy_pieces(strategy: str, next_n: int, native_sizes: Sequence[int]) -> tuple[AtomPiece, ...]:
    """The native row ranges each launch of a strategy covers: the one strategy -> pieces mapping.

    native: one piece of next_n rows; atom: `plan_atoms(next_n, native_sizes)`; flatten: one
    piece of 1 row (each query token is its own single-row pseudo-request).
    """
    check_choice("strategy", strategy, STRATEGIES)
    if strategy == "atom":
        return plan_atoms(next_n, _check_sizes(native_sizes))
    return (AtomPiece(1 if strategy == "flatten" else check_range("next_n", next_n, 1, MAX_NEXT_N), 0),)


def build_metadata(
    strategy: str,
    batch: DecodeBatch,
    block_table: torch.Tensor,
    native_sizes: Sequence[int],
    max_context_len: int | None = None,
) -> DecodeMetadata:
    """Dispatch by strategy name; atom pieces come from `strategy_pieces` (`plan_atoms` over `native_sizes`,
    the next_n the backend runs natively: `decode.native_sizes_for`); `max_context_len` is the logits'
    width (`logits_width`)."""
    check_choice("strategy", strategy, STRATEGIES)
    native_sizes = _check_sizes(native_sizes)
    if strategy == "native":
        return build_native_metadata(batch, block_table, max_context_len)
    if strategy == "flatten":
        return build_flatten_metadata(batch, block_table, max_context_len)
    pieces = strategy_pieces("atom", batch.max_decode_len, native_sizes)
    return build_atom_metadata(batch, block_table, pieces, max_context_len)
