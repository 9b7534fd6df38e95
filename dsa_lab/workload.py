"""Decode batches: the shapes of one indexer decode step, and seeded generators.

A `DecodeBatch` says *what* a step looks like (per-request cached lengths and query
rows); `random_inputs` turns it into tensors. Lengths follow vLLM: `seq_lens[b]`
counts every KV token of request b, its own `decode_lens[b]` new tokens included, so
query row i of that request sees `seq_lens[b] - decode_lens[b] + 1 + i` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dsa_lab.cache import CACHE_DTYPES, PagedCache, build_paged_cache
from dsa_lab.errors import check_choice, check_range

SUPPORTED_HEADS = (32, 64)
SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_BLOCK_SIZES = (64,)
MAX_NEXT_N = 16  # query rows per request (1 + speculative tokens) a batch may have


@dataclass(frozen=True)
class DecodeBatch:
    """One decode step of B requests, each with its own cached length and query rows.

    `num_decode_tokens` may exceed `sum(decode_lens)`: the surplus are CUDA-graph
    padding tokens that belong to no request (vLLM pads the token count of a
    captured graph). Requests with `seq_len == 0` are padding requests.
    """

    seq_lens: tuple[int, ...]
    decode_lens: tuple[int, ...]
    next_n: int
    num_heads: int = 64
    head_dim: int = 128
    block_size: int = 64
    cache_dtype: str = "fp8"
    num_decode_tokens: int = field(default=-1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "seq_lens", tuple(int(x) for x in self.seq_lens))
        object.__setattr__(self, "decode_lens", tuple(int(x) for x in self.decode_lens))
        if len(self.seq_lens) == 0:
            raise ValueError("seq_lens: need at least one request, got an empty tuple")
        if len(self.seq_lens) != len(self.decode_lens):
            raise ValueError(
                f"decode_lens: length {len(self.decode_lens)} must equal "
                f"len(seq_lens)={len(self.seq_lens)}"
            )
        check_range("next_n", self.next_n, 1, MAX_NEXT_N)
        check_choice("num_heads", self.num_heads, SUPPORTED_HEADS)
        check_choice("head_dim", self.head_dim, SUPPORTED_HEAD_DIMS)
        check_choice("block_size", self.block_size, SUPPORTED_BLOCK_SIZES)
        check_choice("cache_dtype", self.cache_dtype, CACHE_DTYPES)
        for b, (length, n) in enumerate(zip(self.seq_lens, self.decode_lens)):
            if length < 0:
                raise ValueError(f"seq_lens[{b}]={length}: must be >= 0")
            if not 0 <= n <= self.next_n:
                raise ValueError(f"decode_lens[{b}]={n}: allowed 0..next_n={self.next_n}")
            if length and n > length:
                raise ValueError(f"decode_lens[{b}]={n} exceeds seq_lens[{b}]={length}")
        if sum(self.decode_lens) == 0:
            raise ValueError("decode_lens: at least one request must decode a token")
        if self.num_decode_tokens == -1:
            object.__setattr__(self, "num_decode_tokens", sum(self.decode_lens))
        if self.num_decode_tokens < sum(self.decode_lens):
            raise ValueError(
                f"num_decode_tokens={self.num_decode_tokens}: must be >= "
                f"sum(decode_lens)={sum(self.decode_lens)}"
            )

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)

    @property
    def num_real_tokens(self) -> int:
        return sum(self.decode_lens)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens)

    @property
    def max_decode_len(self) -> int:
        return max(self.decode_lens)

    @property
    def is_uniform(self) -> bool:
        """All requests decode the same number of rows and no token padding exists."""
        return len(set(self.decode_lens)) == 1 and self.num_decode_tokens == self.num_real_tokens

    @property
    def max_blocks_per_request(self) -> int:
        return max(1, -(-self.max_seq_len // self.block_size))

    def token_context_lens(self) -> list[int]:
        """Tokens each real query token may see, in request-major token order."""
        out = []
        for length, n in zip(self.seq_lens, self.decode_lens):
            out.extend(length - n + 1 + i for i in range(n))
        return out

    def token_requests(self) -> list[int]:
        """The request each real query token belongs to."""
        return [b for b, n in enumerate(self.decode_lens) for _ in range(n)]

    def describe(self) -> str:
        lens = sorted(set(self.seq_lens))
        shown = f"{lens[0]}..{lens[-1]}" if len(lens) > 1 else str(lens[0])
        return (
            f"B={self.batch_size} L={shown} next_n={self.next_n} "
            f"tokens={self.num_decode_tokens} H={self.num_heads} D={self.head_dim} "
            f"{self.cache_dtype}"
        )


def uniform_batch(batch_size: int, seq_len: int, next_n: int, **shape: object) -> DecodeBatch:
    """Every request has the same cached length and decodes next_n rows (plain MTP)."""
    check_range("batch_size", batch_size, 1, 1 << 20)
    check_range("seq_len", seq_len, next_n, 1 << 24)
    return DecodeBatch((seq_len,) * batch_size, (next_n,) * batch_size, next_n, **shape)


def mixed_length_batch(
    batch_size: int, min_len: int, max_len: int, next_n: int, seed: int, **shape: object
) -> DecodeBatch:
    """Cached lengths drawn log-uniformly in [min_len, max_len]: serving traffic, short and long."""
    check_range("min_len", min_len, next_n, max_len)
    gen = torch.Generator().manual_seed(seed)
    logs = torch.empty(batch_size).uniform_(
        float(torch.tensor(min_len).log()), float(torch.tensor(max_len).log()), generator=gen
    )
    lens = tuple(int(x) for x in logs.exp().round().clamp(min_len, max_len))
    return DecodeBatch(lens, (next_n,) * batch_size, next_n, **shape)


def ragged_decode_batch(
    batch_size: int, min_len: int, max_len: int, next_n: int, seed: int, **shape: object
) -> DecodeBatch:
    """Decode lengths vary per request (1..next_n), as when short prefills join a decode step."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(max(min_len, next_n), max_len + 1, (batch_size,), generator=gen)
    decode = torch.randint(1, next_n + 1, (batch_size,), generator=gen)
    return DecodeBatch(tuple(lens.tolist()), tuple(decode.tolist()), next_n, **shape)


def with_padding(batch: DecodeBatch, padding_requests: int, padding_tokens: int = 0) -> DecodeBatch:
    """Append CUDA-graph padding: requests with seq_len 0 / decode_len 0, and spare tokens."""
    check_range("padding_requests", padding_requests, 0, 1 << 16)
    check_range("padding_tokens", padding_tokens, 0, 1 << 16)
    return DecodeBatch(
        batch.seq_lens + (0,) * padding_requests,
        batch.decode_lens + (0,) * padding_requests,
        batch.next_n,
        batch.num_heads,
        batch.head_dim,
        batch.block_size,
        batch.cache_dtype,
        batch.num_decode_tokens + padding_tokens,
    )


@dataclass(frozen=True)
class DecodeInputs:
    """Tensors of one decode step: FP8 queries and weights per token, and the paged cache."""

    batch: DecodeBatch
    q: torch.Tensor  # float8_e4m3fn [num_decode_tokens, H, D], request-major
    weights: torch.Tensor  # float32 [num_decode_tokens, H]
    cache: PagedCache


def random_inputs(batch: DecodeBatch, seed: int = 0, device: str | torch.device = "cpu") -> DecodeInputs:
    """Fresh random queries, weights and keys (never zeros) for `batch`, on `device`."""
    gen = torch.Generator().manual_seed(seed)
    tokens, heads, dim = batch.num_decode_tokens, batch.num_heads, batch.head_dim
    q = torch.randn(tokens, heads, dim, generator=gen).clamp(-448, 448).to(torch.float8_e4m3fn)
    weights = torch.randn(tokens, heads, generator=gen) * heads**-0.5
    keys = [torch.randn(length, dim, generator=gen) for length in batch.seq_lens]
    cache = build_paged_cache(
        [k.to(device) for k in keys], batch.block_size, batch.cache_dtype, seed=seed + 1
    )
    return DecodeInputs(batch, q.to(device), weights.to(device), cache)
