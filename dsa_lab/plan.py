"""The launch plan of one decode step: strategy -> pieces -> launches -> rows, bytes and FLOPs, computed once.

A `LaunchPlan` is what a point of a sweep (or a modeled GPU) *will* launch, before any
tensor exists: each request's cached length, the query rows per request (next_n), the
strategy, the shape, and the next_n values the chosen backend runs natively. From those
it derives, once, everything the layers above read instead of deriving it again:

- `pieces`: the native row ranges of each launch (`metadata.strategy_pieces`: native is
  one piece of next_n, atom splits next_n into the backend's native sizes, flatten is a
  single-row piece per query token);
- `launch_shapes`: (rows, next_n') of each kernel launch, `kernel_rows` and `launches`;
- `cost`: the bytes a step must move (each request's KV once), the bytes the strategy
  does read (flatten re-reads a request's KV once per query row, atom once per piece),
  and the useful FLOPs (2·H·D per query row and cached token it sees);
- `label` ('4+1', '4[pad 1]', '512x1'), and `same_as_native` (an atom plan of one piece).

`metadata` builds the tensors of these launches (`build_metadata_for`), `roofline` turns
the cost into floors and modeled times, the harness records the columns, and the
analysis and charts read the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dsa_lab.cache import bytes_per_token, check_head_dim
from dsa_lab.errors import check_choice, check_int_sequence, check_range
from dsa_lab.metadata import (
    STRATEGIES,
    AtomPiece,
    DecodeMetadata,
    build_atom_metadata,
    build_flatten_metadata,
    build_native_metadata,
    strategy_pieces,
)
from dsa_lab.workload import MAX_NEXT_N, DecodeBatch

LOGIT_BYTES = 4  # float32 logits
WEIGHT_BYTES = 4  # float32 head weights
Q_BYTES = 1  # fp8 queries
SM90_DEEPGEMM_SIZES = (1, 2, 4)  # the default of `native_sizes`: DeepGEMM's SM90 kernels (say so when you use it)
ANY_NEXT_N = tuple(range(1, MAX_NEXT_N + 1))  # a backend native for every next_n


@dataclass(frozen=True)
class StepCost:
    unique_bytes: int  # KV once + valid logits + q and weights
    strategy_bytes: int  # KV as the strategy reads it + the same logits, q and weights
    flops: int  # 2 * H * D * sum of every query row's context
    kernel_rows: int
    launches: int
    unique_kv_bytes: int  # the KV part of unique_bytes: every request's KV once
    strategy_kv_bytes: int  # the KV part of strategy_bytes: re-reads included


def row_context(seq_len: int, next_n: int, row: int) -> int:
    """Tokens native row `row` of a request sees (vLLM: L - n + 1 + j, 0 for front padding)."""
    return max(0, seq_len - next_n + 1 + row) if row >= 0 else 0


@dataclass(frozen=True)
class LaunchPlan:
    """One decode step's launches and their cost, derived once from the fields below."""

    seq_lens: tuple[int, ...]
    next_n: int
    strategy: str
    heads: int = 64
    head_dim: int = 128
    cache_dtype: str = "fp8"
    native_sizes: tuple[int, ...] = SM90_DEEPGEMM_SIZES  # next_n the backend runs natively
    pieces: tuple[AtomPiece, ...] = field(init=False, compare=False)
    launch_shapes: tuple[tuple[int, int], ...] = field(init=False, compare=False)  # (rows, next_n') per launch
    cost: StepCost = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_choice("strategy", self.strategy, STRATEGIES)
        set_ = object.__setattr__
        set_(self, "next_n", check_range("next_n", self.next_n, 1, MAX_NEXT_N))
        set_(self, "seq_lens", check_int_sequence("seq_lens", self.seq_lens, 0, 1 << 40))
        if not self.seq_lens or any(length < self.next_n for length in self.seq_lens):
            raise ValueError(f"seq_lens: need lengths >= next_n={self.next_n}, got {self.seq_lens[:8]}")
        set_(self, "heads", check_range("heads", self.heads, 1, 1 << 10))
        set_(self, "head_dim", check_head_dim(self.head_dim, self.cache_dtype))
        sizes = check_int_sequence("native_sizes", self.native_sizes, 1, 1 << 10)
        if not sizes:
            raise ValueError("native_sizes: need at least one next_n the backend runs natively")
        set_(self, "native_sizes", tuple(sorted(set(sizes))))
        pieces = strategy_pieces(self.strategy, self.next_n, self.native_sizes)
        batch, tokens = len(self.seq_lens), len(self.seq_lens) * self.next_n
        shapes = ((tokens, 1),) if self.strategy == "flatten" else tuple((batch, p.size) for p in pieces)
        set_(self, "pieces", pieces)
        set_(self, "launch_shapes", shapes)
        set_(self, "cost", self._cost())

    @property
    def batch(self) -> int:
        return len(self.seq_lens)

    @property
    def launches(self) -> int:
        return len(self.launch_shapes)

    @property
    def kernel_rows(self) -> int:
        """Query rows the kernels compute, padding rows included (each reads its KV range)."""
        return sum(rows * width for rows, width in self.launch_shapes)

    @property
    def widths(self) -> tuple[int, ...]:
        """The distinct next_n' the backend must run natively for this plan."""
        return tuple(sorted({width for _, width in self.launch_shapes}))

    @property
    def same_as_native(self) -> bool:
        """An atom plan of one native piece: the very launch `native` makes."""
        return self.strategy == "atom" and self.pieces == (AtomPiece(self.next_n, 0),)

    @property
    def label(self) -> str:
        """'4' (native), '4+1' or '4[pad 1]' (atom), '512x1' (flatten: tokens x one row)."""
        if self.strategy == "flatten":
            return f"{self.batch * self.next_n}x1"
        return "+".join(f"{p.size}" + (f"[pad {-p.offset}]" if p.offset < 0 else "") for p in self.pieces)

    @property
    def signature(self) -> tuple[tuple[int, int, int], ...]:
        """(rows, next_n', first native row) per launch: equal signatures are the same kernel work
        (flatten at next_n = 1 is native; an atom plan of one piece is native)."""
        if self.strategy == "flatten":
            return ((self.batch * self.next_n, 1, self.next_n - 1),)
        return tuple((self.batch, p.size, p.offset) for p in self.pieces)

    def _cost(self) -> StepCost:
        """Bytes and FLOPs of one step; KV is counted in tokens, not whole blocks."""
        n, per_token = self.next_n, bytes_per_token(self.head_dim, self.cache_dtype)
        contexts = sum(row_context(length, n, j) for length in self.seq_lens for j in range(n))
        tokens = n * self.batch
        side_bytes = contexts * LOGIT_BYTES + tokens * self.heads * (self.head_dim * Q_BYTES + WEIGHT_BYTES)
        unique_kv = sum(self.seq_lens) * per_token
        if self.strategy == "flatten":
            read_tokens = contexts
        else:
            read_tokens = sum(
                row_context(length, n, p.offset + p.size - 1) for length in self.seq_lens for p in self.pieces
            )
        return StepCost(
            unique_bytes=unique_kv + side_bytes,
            strategy_bytes=read_tokens * per_token + side_bytes,
            flops=2 * self.heads * self.head_dim * contexts,
            kernel_rows=self.kernel_rows,
            launches=self.launches,
            unique_kv_bytes=unique_kv,
            strategy_kv_bytes=read_tokens * per_token,
        )

    def columns(self) -> dict[str, Any]:
        """The plan as stored with a measured point (one name per fact, shared by every mode)."""
        return {
            "launches": self.launches,
            "kernel_rows": self.kernel_rows,
            "pieces": self.label,
            "native_sizes": ",".join(map(str, self.native_sizes)),
            "unique_bytes": self.cost.unique_bytes,
            "strategy_bytes": self.cost.strategy_bytes,
            "unique_kv_bytes": self.cost.unique_kv_bytes,
            "strategy_kv_bytes": self.cost.strategy_kv_bytes,
            "flops": self.cost.flops,
        }

    def build_metadata(self, batch: DecodeBatch, block_table: torch.Tensor) -> DecodeMetadata:
        """The tensors of these launches for `batch` (whose requests and next_n the plan was made for)."""
        if not isinstance(batch, DecodeBatch):
            raise ValueError(f"batch: expected a DecodeBatch, got {type(batch).__name__}")
        if batch.seq_lens != self.seq_lens or batch.max_decode_len != self.next_n:
            raise ValueError(
                f"batch: {batch.describe()} is not the step this plan was made for "
                f"(B={self.batch}, next_n={self.next_n})"
            )
        if self.strategy == "native":
            return build_native_metadata(batch, block_table)
        if self.strategy == "flatten":
            return build_flatten_metadata(batch, block_table)
        return build_atom_metadata(batch, block_table, self.pieces)
