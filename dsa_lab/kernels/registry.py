"""A registry of paged-MQA-logits backends sharing DeepGEMM's calling convention.

Adding a backend is one module and one decorator:

    @register_backend
    class MyBackend(LogitsBackend):
        name = "mine"
        def logits(self, q, kv_cache, weights, context_lens, block_table, max_context_len, schedule=None): ...

Each backend says whether it can run here (and why not), which next_n it takes
natively, and which shapes it accepts; callers never get a silent fallback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dsa_lab.errors import BackendUnavailable, UnsupportedShape


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str


class LogitsBackend:
    """Base class: `logits(q, kv_cache, weights, context_lens, block_table, max_context_len)`.

    q `[B, n, H, D]` float8_e4m3fn; kv_cache uint8 `[num_blocks, 64, 1, bytes_per_token]`;
    weights float32 `[B*n, H]`; context_lens int32 `[B, n]`; block_table int32 `[B, max_blocks]`.
    Returns float32 `[B*n, max_context_len]`. Positions at or beyond a row's context length
    are -inf where `cleans_tail`, unspecified otherwise (callers mask them).

    `logits` of a GPU backend must not synchronise the host: benchmarks time it between
    CUDA events and capture it in CUDA graphs. It checks shapes and dtypes only; callers
    check values (context lens, block ids) once with `check_logits_args(check_values=True)`.
    """

    name: ClassVar[str]
    baseline: ClassVar[bool] = False
    cleans_tail: ClassVar[bool] = True
    heads: ClassVar[tuple[int, ...]] = (32, 64)
    head_dims: ClassVar[tuple[int, ...]] = (64, 128)
    cache_dtypes: ClassVar[tuple[str, ...]] = ("fp8",)

    def availability(self, device: torch.device) -> Availability:
        return Availability(True, "")

    def native_next_n(self, device: torch.device) -> frozenset[int] | None:
        """next_n values taken natively (None: any from 1 to 16)."""
        return None

    def schedule(self, context_lens: torch.Tensor, block_size: int) -> Any:
        """Per-launch scheduling metadata (DeepGEMM's SM plan); timed apart from the kernel."""
        return None

    def logits(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        weights: torch.Tensor,
        context_lens: torch.Tensor,
        block_table: torch.Tensor,
        max_context_len: int,
        schedule: Any = None,
    ) -> torch.Tensor:
        raise NotImplementedError

    def require(self, device: torch.device, next_n: int, heads: int, head_dim: int, cache_dtype: str) -> None:
        """Raise BackendUnavailable / UnsupportedShape before launch, naming the allowed values."""
        state = self.availability(device)
        if not state.ok:
            raise BackendUnavailable(f"backend {self.name!r} unavailable on {device}: {state.reason}")
        native = self.native_next_n(device)
        if native is not None and next_n not in native:
            raise UnsupportedShape(
                f"next_n={next_n}: backend {self.name!r} on {device} runs natively only "
                f"next_n in {sorted(native)} (use strategy 'flatten' or 'atom')"
            )
        self.check_shape(heads, head_dim, cache_dtype)

    def check_shape(self, heads: int, head_dim: int, cache_dtype: str) -> None:
        """Raise UnsupportedShape for the first field outside this backend's allowed values."""
        for field, value, allowed in (
            ("num_heads", heads, self.heads),
            ("head_dim", head_dim, self.head_dims),
            ("cache_dtype", cache_dtype, self.cache_dtypes),
        ):
            if value not in allowed:
                raise UnsupportedShape(f"{field}={value!r}: backend {self.name!r} allows {allowed}")


_BACKENDS: dict[str, LogitsBackend] = {}


def register_backend(cls: type[LogitsBackend]) -> type[LogitsBackend]:
    if cls.name in _BACKENDS:
        raise ValueError(f"backend {cls.name!r} registered twice")
    _BACKENDS[cls.name] = cls()
    return cls


def get_backend(name: str) -> LogitsBackend:
    if name not in _BACKENDS:
        raise ValueError(f"backend={name!r}: allowed values are {tuple(_BACKENDS)}")
    return _BACKENDS[name]


def backend_names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def baseline_backend() -> LogitsBackend:
    return next(b for b in _BACKENDS.values() if b.baseline)


def check_logits_args(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    check_values: bool = True,
) -> str:
    """Validate a call in DeepGEMM's convention; return the cache dtype ('fp8' or 'mxfp4').

    `check_values` also scans context lens and block ids (a host sync: do it once,
    outside timed loops).
    """
    from dsa_lab.cache import CACHE_DTYPES, bytes_per_token
    from dsa_lab.errors import check_tensor

    check_tensor("q", q, dtype=torch.float8_e4m3fn, ndim=4)
    batch, next_n, heads, dim = q.shape
    check_tensor("kv_cache", kv_cache, dtype=torch.uint8, ndim=4, device=q.device)
    per_token = kv_cache.shape[-1]
    kinds = {bytes_per_token(dim, kind): kind for kind in CACHE_DTYPES}
    if kv_cache.shape[2] != 1 or per_token not in kinds:
        raise ValueError(
            f"kv_cache: expected [num_blocks, block_size, 1, B] with B in {sorted(kinds)} "
            f"for head_dim={dim}, got {tuple(kv_cache.shape)}"
        )
    check_tensor("weights", weights, dtype=torch.float32, shape=(batch * next_n, heads), device=q.device)
    check_tensor("context_lens", context_lens, dtype=torch.int32, shape=(batch, next_n), device=q.device)
    check_tensor("block_table", block_table, dtype=torch.int32, ndim=2, device=q.device)
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table: {block_table.shape[0]} rows for batch {batch}")
    if isinstance(max_context_len, bool) or not isinstance(max_context_len, int) or max_context_len < 1:
        raise ValueError(f"max_context_len={max_context_len!r}: must be a positive int")
    if check_values and context_lens.numel():
        block_size = kv_cache.shape[1]
        low, high = int(context_lens.min()), int(context_lens.max())
        capacity = min(block_table.shape[1] * block_size, max_context_len)
        if low < 0 or high > capacity:
            raise ValueError(
                f"context_lens: values must lie in [0, {capacity}] (block table holds "
                f"{block_table.shape[1]}x{block_size} tokens, max_context_len={max_context_len}); "
                f"got [{low}, {high}]"
            )
        used = block_table[:, : -(-high // block_size)] if high else block_table[:, :0]
        if used.numel() and (int(used.min()) < 0 or int(used.max()) >= kv_cache.shape[0]):
            raise ValueError(
                f"block_table: block ids must lie in [0, {kv_cache.shape[0] - 1}], "
                f"got [{int(used.min())}, {int(used.max())}]"
            )
    return kinds[per_token]
