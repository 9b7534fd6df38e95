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

A plan may be a ragged step (`decode_lens`: the rows each request brings, e.g. from MTP
acceptance; next_n is then the step's longest, the rows vLLM's kernel sees) and may write
wider logits than the longest context (`logits_width`: vLLM passes its `max_model_len`). What
a wider output costs depends on the kernel: one that leaves the tail writes only what each row
owns, one that cleans it writes the whole width (`StepCost.logit_bytes(cleans_tail)`).

`metadata` builds the tensors of these launches (`build_metadata`), `model.roofline` turns
the cost into floors and modeled times, the performance model (`model.indexer`) counts its
launches' work from the pieces, row contexts and KV tokens here, the harness records the
columns, and the analysis and charts read the same numbers: this is the only launch geometry.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dsa_lab.batch.cache import bytes_per_token, check_head_dim
from dsa_lab.batch.metadata import (
    STRATEGIES,
    AtomPiece,
    DecodeMetadata,
    build_atom_metadata,
    build_flatten_metadata,
    build_native_metadata,
    strategy_pieces,
)
from dsa_lab.batch.workload import MAX_NEXT_N, DecodeBatch
from dsa_lab.errors import check_choice, check_int_sequence, check_range

LOGIT_BYTES = 4  # float32 logits
WEIGHT_BYTES = 4  # float32 head weights
Q_BYTES = 1  # fp8 queries
ANY_NEXT_N = tuple(range(1, MAX_NEXT_N + 1))  # a backend native for every next_n (the plan's default)
DEEPSEEK_V32_MAX_MODEL_LEN = 163_840  # vLLM's max_model_len for DeepSeek-V3.2, as issue 19 gives it


@dataclass(frozen=True)
class LogitsWidth:
    """The logits' width, the kernel's `max_context_len`: 'batch' (the longest context of the step,
    what every run before this axis measured) or 'model:N' (vLLM's `max_model_len` N, which vLLM 0.33
    passes to the kernel and sizes its decode logits buffer with)."""

    model_len: int | None = None  # None: 'batch'

    def __post_init__(self) -> None:
        if self.model_len is not None:
            object.__setattr__(self, "model_len", check_range("model_len", self.model_len, 1, 1 << 31))

    @property
    def label(self) -> str:
        return "batch" if self.model_len is None else f"model:{self.model_len}"

    @classmethod
    def parse(cls, value: str) -> LogitsWidth:
        text = str(value).strip().lower()
        if text == "batch":
            return cls()
        if text.startswith("model:"):
            digits = text[len("model:") :].strip()
            if digits.isascii() and digits.isdigit() and 0 < int(digits) <= 1 << 31:
                return cls(int(digits))
        raise ValueError(
            f"logits_width={value!r}: allowed values are 'batch' (the longest context) or 'model:N' "
            f"(vLLM's max_model_len, e.g. model:{DEEPSEEK_V32_MAX_MODEL_LEN} for DeepSeek-V3.2)"
        )

    def columns(self, seq_lens: Sequence[int]) -> int:
        """The width for requests of `seq_lens`: a model length shorter than a context is an error."""
        longest = max(seq_lens)
        if self.model_len is None:
            return longest
        if self.model_len < longest:
            raise ValueError(f"logits_width={self.label!r}: narrower than the longest context {longest}")
        return self.model_len


@dataclass(frozen=True)
class StepCost:
    unique_bytes: int  # KV once + valid logits + q and weights
    strategy_bytes: int  # KV as the strategy reads it + the same logits, q and weights
    flops: int  # 2 * H * D * sum of every query row's context
    kernel_rows: int
    launches: int
    unique_kv_bytes: int  # the KV part of unique_bytes: every request's KV once
    strategy_kv_bytes: int  # the KV part of strategy_bytes: re-reads included
    logits_width: int  # columns of every output row (the kernels' max_context_len)
    owned_logit_bytes: int  # float32 logits inside every kernel row's context (filler rows too)
    full_logit_bytes: int  # kernel_rows x logits_width float32 logits
    q_and_weight_bytes: int  # the step's fp8 queries and float32 head weights

    def logit_bytes(self, cleans_tail: bool) -> int:
        """Logits the kernels write: the whole width where the kernel cleans the tail (writes -inf past
        each context), else only what each row owns (vLLM: 'columns past each row's context length are
        not cleaned')."""
        check_choice("cleans_tail", cleans_tail, (False, True))
        return self.full_logit_bytes if cleans_tail else self.owned_logit_bytes

    def moved_bytes(self, cleans_tail: bool) -> int:
        """Bytes the strategy's launches move for a kernel that does or does not clean the tail: KV as
        read (re-reads included), q and weights, and the logits written. For a plan without filler
        rows and a kernel that leaves the tail, this is `strategy_bytes`."""
        return self.strategy_kv_bytes + self.q_and_weight_bytes + self.logit_bytes(cleans_tail)


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
    native_sizes: tuple[int, ...] = ANY_NEXT_N  # next_n the backend runs natively (its `native_sizes`)
    decode_lens: tuple[int, ...] | None = None  # rows each request brings; None (or all next_n): next_n each
    logits_width: int | None = None  # the kernels' max_context_len; None: the longest context
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
        if self.decode_lens is not None:
            lens = check_int_sequence("decode_lens", self.decode_lens, 1, self.next_n)
            if len(lens) != len(self.seq_lens) or max(lens) != self.next_n:
                raise ValueError(
                    f"decode_lens={lens[:8]}: need one per request ({len(self.seq_lens)}), the longest equal to "
                    f"next_n={self.next_n} (the rows the kernel sees)"
                )
            set_(self, "decode_lens", None if min(lens) == self.next_n else lens)  # uniform: the plain plan
        set_(self, "logits_width", LogitsWidth(self.logits_width).columns(self.seq_lens))
        pieces = strategy_pieces(self.strategy, self.next_n, self.native_sizes)
        batch, tokens = len(self.seq_lens), self.tokens
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
    def rows_per_request(self) -> tuple[int, ...]:
        """The rows each request brings to the step (`decode_lens`, or next_n for all)."""
        return self.decode_lens if self.decode_lens is not None else (self.next_n,) * self.batch

    @property
    def tokens(self) -> int:
        """Query tokens of the step."""
        return sum(self.rows_per_request)

    @property
    def max_context_len(self) -> int:
        """The width of every output row, as the kernels get it."""
        return self.logits_width

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
            return f"{self.tokens}x1"
        return "+".join(f"{p.size}" + (f"[pad {-p.offset}]" if p.offset < 0 else "") for p in self.pieces)

    @property
    def signature(self) -> tuple[tuple[int, int, int], ...]:
        """(rows, next_n', first native row) per launch: equal signatures are the same kernel work
        (flatten at next_n = 1 is native; an atom plan of one piece is native)."""
        if self.strategy == "flatten":
            return ((self.tokens, 1, self.next_n - 1),)
        return tuple((self.batch, p.size, p.offset) for p in self.pieces)

    def row_contexts(self, rows: Iterable[int] | None = None) -> list[int]:
        """The context of native rows `rows` (default: all next_n) of every request, request-major."""
        rows = list(range(self.next_n) if rows is None else rows)
        return [row_context(length, self.next_n, j) for length in self.seq_lens for j in rows]

    def piece_rows(self, piece: AtomPiece) -> range:
        """The real native rows a launch of `piece` computes (its padding rows, offset < 0, left out)."""
        return range(max(piece.offset, 0), piece.offset + piece.size)

    def piece_kv_tokens(self, piece: AtomPiece) -> int:
        """KV tokens a native launch of `piece` reads: each request's, up to its last row's context."""
        return sum(row_context(length, self.next_n, piece.offset + piece.size - 1) for length in self.seq_lens)

    def _cost(self) -> StepCost:
        """Bytes and FLOPs of one step; KV is counted in tokens, not whole blocks. Real rows are
        right-aligned (a request of d rows holds native rows n - d .. n - 1, as `metadata` lays them)."""
        n, per_token = self.next_n, bytes_per_token(self.head_dim, self.cache_dtype)
        real = tuple(zip(self.seq_lens, self.rows_per_request))
        contexts = sum(row_context(length, n, j) for length, d in real for j in range(n - d, n))
        q_and_weights = self.tokens * self.heads * (self.head_dim * Q_BYTES + WEIGHT_BYTES)
        side_bytes = contexts * LOGIT_BYTES + q_and_weights
        unique_kv = sum(self.seq_lens) * per_token
        if self.strategy == "flatten":
            read_tokens = owned = contexts
        else:
            # every native row of each piece writes its context, fillers too: `metadata._native_rows`
            # gives row j (front padding included) `L - n + 1 + j`, clamped at 0
            owned = sum(
                max(0, length - n + 1 + j)
                for length in self.seq_lens
                for p in self.pieces
                for j in range(p.offset, p.offset + p.size)
            )
            read_tokens = sum(self.piece_kv_tokens(p) for p in self.pieces)
        return StepCost(
            unique_bytes=unique_kv + side_bytes,
            strategy_bytes=read_tokens * per_token + side_bytes,
            flops=2 * self.heads * self.head_dim * contexts,
            kernel_rows=self.kernel_rows,
            launches=self.launches,
            unique_kv_bytes=unique_kv,
            strategy_kv_bytes=read_tokens * per_token,
            logits_width=self.logits_width,
            owned_logit_bytes=owned * LOGIT_BYTES,
            full_logit_bytes=self.kernel_rows * self.logits_width * LOGIT_BYTES,
            q_and_weight_bytes=q_and_weights,
        )

    def columns(self) -> dict[str, Any]:
        """The plan as stored with a measured point (one name per fact, shared by every mode)."""
        return {
            "launches": self.launches,
            "kernel_rows": self.kernel_rows,
            "query_tokens": self.tokens,
            "max_decode_len": self.next_n,
            "logits_columns": self.logits_width,
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
        if (
            batch.seq_lens != self.seq_lens
            or batch.decode_lens != self.rows_per_request
            or batch.num_decode_tokens != self.tokens
        ):
            raise ValueError(
                f"batch: {batch.describe()} is not the step this plan was made for "
                f"(B={self.batch}, next_n={self.next_n}, {self.tokens} tokens)"
            )
        width = self.logits_width
        if self.strategy == "native":
            return build_native_metadata(batch, block_table, width)
        if self.strategy == "flatten":
            return build_flatten_metadata(batch, block_table, width)
        return build_atom_metadata(batch, block_table, self.pieces, width)
