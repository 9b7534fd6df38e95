"""Decode batches: the shapes of one indexer decode step, and seeded generators.

A `DecodeBatch` says *what* a step looks like (per-request cached lengths and query
rows); `random_inputs` turns it into tensors. Lengths follow vLLM: `seq_lens[b]`
counts every KV token of request b, its own `decode_lens[b]` new tokens included, so
query row i of that request sees `seq_lens[b] - decode_lens[b] + 1 + i` tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from dsa_lab.batch.cache import BLOCK_SIZE, CACHE_DTYPES, PagedCache, build_paged_cache
from dsa_lab.errors import (
    MAX_SEED,
    as_device,
    as_int,
    check_choice,
    check_finite,
    check_int_sequence,
    check_range,
    check_seed,
    check_tensor,
)

SUPPORTED_HEADS = (32, 64)
SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_BLOCK_SIZES = (BLOCK_SIZE,)
MAX_NEXT_N = 16  # query rows per request (1 + speculative tokens) a batch may have
MAX_SEQ_LEN = 1 << 24
MAX_REQUESTS = 1 << 20


@dataclass(frozen=True)
class DecodeBatch:
    """One decode step of B requests, each with its own cached length and query rows.

    `num_decode_tokens` may exceed `sum(decode_lens)`: the surplus are CUDA-graph
    padding tokens that belong to no request (vLLM pads the token count of a
    captured graph). Requests with `seq_len == 0` are padding requests.

    Every count must be an int: 10.7 (or 10.0) is refused rather than truncated, and a
    bool is not an int. NumPy integers are accepted and stored as Python ints.
    """

    seq_lens: tuple[int, ...]
    decode_lens: tuple[int, ...]
    next_n: int
    num_heads: int = 64
    head_dim: int = 128
    block_size: int = BLOCK_SIZE
    cache_dtype: str = "fp8"
    num_decode_tokens: int = field(default=-1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "seq_lens", check_int_sequence("seq_lens", self.seq_lens, 0, MAX_SEQ_LEN))
        object.__setattr__(self, "decode_lens", check_int_sequence("decode_lens", self.decode_lens, 0, MAX_NEXT_N))
        if len(self.seq_lens) == 0:
            raise ValueError("seq_lens: need at least one request, got an empty tuple")
        if len(self.seq_lens) != len(self.decode_lens):
            raise ValueError(
                f"decode_lens: length {len(self.decode_lens)} must equal len(seq_lens)={len(self.seq_lens)}"
            )
        object.__setattr__(self, "next_n", check_range("next_n", self.next_n, 1, MAX_NEXT_N))
        for name, allowed in (
            ("num_heads", SUPPORTED_HEADS),
            ("head_dim", SUPPORTED_HEAD_DIMS),
            ("block_size", SUPPORTED_BLOCK_SIZES),
        ):
            check_choice(name, getattr(self, name), allowed)
            object.__setattr__(self, name, as_int(name, getattr(self, name)))
        check_choice("cache_dtype", self.cache_dtype, CACHE_DTYPES)
        for b, (length, n) in enumerate(zip(self.seq_lens, self.decode_lens)):
            if not 0 <= n <= self.next_n:
                raise ValueError(f"decode_lens[{b}]={n}: allowed 0..next_n={self.next_n}")
            if length and n > length:
                raise ValueError(f"decode_lens[{b}]={n} exceeds seq_lens[{b}]={length}")
        if sum(self.decode_lens) == 0:
            raise ValueError("decode_lens: at least one request must decode a token")
        if self.num_decode_tokens == -1:
            object.__setattr__(self, "num_decode_tokens", sum(self.decode_lens))
        object.__setattr__(self, "num_decode_tokens", as_int("num_decode_tokens", self.num_decode_tokens))
        if self.num_decode_tokens < sum(self.decode_lens):
            raise ValueError(
                f"num_decode_tokens={self.num_decode_tokens}: must be >= sum(decode_lens)={sum(self.decode_lens)}"
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
    next_n = check_range("next_n", next_n, 1, MAX_NEXT_N)
    batch_size = check_range("batch_size", batch_size, 1, MAX_REQUESTS)
    seq_len = check_range("seq_len", seq_len, next_n, MAX_SEQ_LEN)
    return DecodeBatch((seq_len,) * batch_size, (next_n,) * batch_size, next_n, **shape)


def mixed_length_batch(
    batch_size: int, min_len: int, max_len: int, next_n: int, seed: int, **shape: object
) -> DecodeBatch:
    """Cached lengths drawn log-uniformly in [min_len, max_len]: serving traffic, short and long."""
    batch_size, next_n, max_len, min_len, seed = _generator_args(batch_size, min_len, max_len, next_n, seed)
    gen = torch.Generator().manual_seed(seed)
    logs = torch.empty(batch_size).uniform_(
        float(torch.tensor(min_len).log()), float(torch.tensor(max_len).log()), generator=gen
    )
    lens = tuple(int(x) for x in logs.exp().round().clamp(min_len, max_len))
    return DecodeBatch(lens, (next_n,) * batch_size, next_n, **shape)


def lognormal_length_batch(
    batch_size: int, median: int, sigma: float, next_n: int, seed: int, **shape: object
) -> DecodeBatch:
    """Cached lengths `median * exp(sigma * z)`, z standard normal (seeded), rounded and clipped to
    [max(LOGNORMAL_CLIP[0], next_n), LOGNORMAL_CLIP[1]]: a heavy tail of long requests over a body
    of short ones, as serving batches have."""
    next_n = check_range("next_n", next_n, 1, MAX_NEXT_N)
    batch_size = check_range("batch_size", batch_size, 1, MAX_REQUESTS)
    median = check_range("median", median, *LOGNORMAL_CLIP)
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not 0 < sigma <= MAX_LOGNORMAL_SIGMA:
        raise ValueError(f"sigma={sigma!r}: must be a number in (0, {MAX_LOGNORMAL_SIGMA:g}]")
    gen = torch.Generator().manual_seed(check_seed("seed", seed))
    z = torch.empty(batch_size, dtype=torch.float64).normal_(generator=gen)
    lens = (median * torch.exp(float(sigma) * z)).round().clamp(max(LOGNORMAL_CLIP[0], next_n), LOGNORMAL_CLIP[1])
    return DecodeBatch(tuple(int(x) for x in lens), (next_n,) * batch_size, next_n, **shape)


def ragged_decode_batch(
    batch_size: int, min_len: int, max_len: int, next_n: int, seed: int, **shape: object
) -> DecodeBatch:
    """Decode lengths vary per request (1..next_n), as when short prefills join a decode step.

    Cached lengths are drawn in [max(min_len, next_n), max_len]: a min_len below next_n is raised to it.
    """
    batch_size, next_n, max_len, min_len, seed = _generator_args(batch_size, min_len, max_len, next_n, seed, min_low=1)
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(max(min_len, next_n), max_len + 1, (batch_size,), generator=gen)
    decode = torch.randint(1, next_n + 1, (batch_size,), generator=gen)
    return DecodeBatch(tuple(lens.tolist()), tuple(decode.tolist()), next_n, **shape)


def _generator_args(
    batch_size: object, min_len: object, max_len: object, next_n: object, seed: object, min_low: int | None = None
) -> tuple[int, ...]:
    """The checked ints of a seeded generator: 1 <= batch_size, min_low (default next_n) <= min_len <= max_len,
    next_n <= max_len."""
    next_n = check_range("next_n", next_n, 1, MAX_NEXT_N)
    batch_size = check_range("batch_size", batch_size, 1, MAX_REQUESTS)
    max_len = check_range("max_len", max_len, next_n, MAX_SEQ_LEN)
    min_len = check_range("min_len", min_len, next_n if min_low is None else min_low, max_len)
    return batch_size, next_n, max_len, min_len, check_seed("seed", seed)


def _check_batch(batch: object) -> DecodeBatch:
    if not isinstance(batch, DecodeBatch):
        raise ValueError(f"batch: expected a DecodeBatch, got {type(batch).__name__}")
    return batch


def with_padding(batch: DecodeBatch, padding_requests: int, padding_tokens: int = 0) -> DecodeBatch:
    """Append CUDA-graph padding: requests with seq_len 0 / decode_len 0, and spare tokens."""
    _check_batch(batch)
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


CONTEXT_DISTRIBUTIONS = ("fixed", "mixed", "lognormal")
REQUEST_ORDERS = ("shuffled", "sorted")  # 'shuffled' (the default) adds nothing to a label
LOGNORMAL_CLIP = (64, 163_840)  # one KV block .. DeepSeek-V3.2's max_model_len: a log-normal's draws are clipped here
MAX_LOGNORMAL_SIGMA = 4.0


@dataclass(frozen=True)
class ContextSpec:
    """Cached length(s) per request of a sweep point, and the order of the requests.

    - a length ('65536', '64K'): every request holds it;
    - 'mixed:MIN-MAX': log-uniform in [MIN, MAX] (seeded), short and long requests alike;
    - 'lognormal:MEDIAN:SIGMA': heavy-tailed (seeded): most requests near MEDIAN, a few many
      times longer, clipped to `LOGNORMAL_CLIP`. A serving batch mixes many short contexts with
      a few long ones that hold most of the KV bytes; a log-normal has that shape, one knob for
      the body (MEDIAN) and one for the tail (SIGMA: the 99th percentile is MEDIAN x e^(2.33 SIGMA)).
    - a suffix ':sorted' puts the requests in order of length, shortest first: the long ones sit
      together at the end of the batch, the worst case for a kernel that hands requests (or KV
      slices) to CTAs in order. Without it the requests keep the order they were drawn in, which
      for independent draws is a shuffled order (the default, 'shuffled', which no label spells).

    Labels are canonical ('8K' -> '8192', 'mixed:1K-64K' -> 'mixed:1024-65536', 'lognormal:8K:1.50'
    -> 'lognormal:8192:1.5'), so a point is named, stored and compared by one string whatever spelling
    a user typed. `low` and `high` bound every length the spec can draw; `mixed` says lengths differ.
    """

    low: int
    high: int
    distribution: str = "fixed"  # one of CONTEXT_DISTRIBUTIONS
    median: int = 0  # lognormal only
    sigma: float = 0.0  # lognormal only
    order: str = "shuffled"  # one of REQUEST_ORDERS

    def __post_init__(self) -> None:
        check_choice("distribution", self.distribution, CONTEXT_DISTRIBUTIONS)
        check_choice("order", self.order, REQUEST_ORDERS)
        lognormal = self.distribution == "lognormal"
        if lognormal != bool(self.median or self.sigma):
            raise ValueError(f"median={self.median}, sigma={self.sigma}: set for a lognormal spec only")
        object.__setattr__(self, "sigma", float(self.sigma))  # one label for 2 and 2.0
        if (self.distribution == "fixed") != (self.low == self.high):
            need = "low == high" if self.distribution == "fixed" else "low < high"
            raise ValueError(f"low={self.low}, high={self.high}: a {self.distribution} spec needs {need}")
        if self.order != "shuffled" and self.distribution == "fixed":
            raise ValueError(f"order={self.order!r}: one length for every request has no order to change")

    @property
    def mixed(self) -> bool:
        """Lengths differ per request (mixed or lognormal)."""
        return self.distribution != "fixed"

    @property
    def label(self) -> str:
        if self.distribution == "mixed":
            text = f"mixed:{self.low}-{self.high}"
        elif self.distribution == "lognormal":
            text = f"lognormal:{self.median}:{self.sigma!r}"
        else:
            text = str(self.low)
        return text if self.order == "shuffled" else f"{text}:{self.order}"

    @property
    def short(self) -> str:
        """For people: '64K', 'mixed 1K-64K', 'lognormal 8K σ1.5' (`label` is the canonical name runs store)."""
        if self.distribution == "mixed":
            text = f"mixed {format_tokens(self.low)}-{format_tokens(self.high)}"
        elif self.distribution == "lognormal":
            text = f"lognormal {format_tokens(self.median)} σ{self.sigma:g}"
        else:
            text = format_tokens(self.low)
        return text if self.order == "shuffled" else f"{text}, {self.order}"

    @classmethod
    def parse(cls, value: str | int) -> ContextSpec:
        """The spec `value` names (a frozen value, so one parse per distinct text: a dry run asks 70k times)."""
        return _parse_context(value) if isinstance(value, (str, int)) else cls._parse(value)

    @classmethod
    def _parse(cls, value: str | int) -> ContextSpec:
        text = str(value).strip().lower()
        order = "shuffled"
        for name in REQUEST_ORDERS:
            if text.endswith(f":{name}"):
                text, order = text[: -len(name) - 1], name
        try:
            if text.startswith("mixed:"):
                low, high = (parse_tokens(part) for part in text[len("mixed:") :].split("-"))
                if not 1 <= low < high <= MAX_SEQ_LEN:
                    raise ValueError
                return cls(low, high, "mixed", order=order)
            if text.startswith("lognormal:"):
                median_text, sigma_text = text[len("lognormal:") :].split(":")
                median, sigma = parse_tokens(median_text), float(sigma_text)
                if not (LOGNORMAL_CLIP[0] <= median <= LOGNORMAL_CLIP[1] and 0 < sigma <= MAX_LOGNORMAL_SIGMA):
                    raise ValueError
                return cls(*LOGNORMAL_CLIP, "lognormal", median, sigma, order)
            length = parse_tokens(text)
            if not 1 <= length <= MAX_SEQ_LEN:
                raise ValueError
            return cls(length, length, order=order)
        except ValueError:
            raise ValueError(
                f"context={value!r}: allowed values are a length (e.g. 8192 or 8K), 'mixed:MIN-MAX' with "
                f"1 <= MIN < MAX (e.g. mixed:1K-64K) or 'lognormal:MEDIAN:SIGMA' with MEDIAN in "
                f"[{LOGNORMAL_CLIP[0]}, {LOGNORMAL_CLIP[1]}] and 0 < SIGMA <= {MAX_LOGNORMAL_SIGMA:g} (e.g. "
                f"lognormal:8K:1.5); a mixed or lognormal one may end in ':sorted' (shortest request first)"
            ) from None

    def seq_lens(self, batch: int, seed: int) -> tuple[int, ...]:
        """Per-request cached lengths for `batch` requests (drawn with `seed` unless fixed), in `order`."""
        batch = check_range("batch", batch, 1, MAX_REQUESTS)
        if self.distribution == "fixed":
            return (self.low,) * batch
        if self.distribution == "mixed":
            lens = mixed_length_batch(batch, self.low, self.high, 1, seed).seq_lens
        else:
            lens = lognormal_length_batch(batch, self.median, self.sigma, 1, seed).seq_lens
        return order_lengths(lens, self.order)


@functools.lru_cache(maxsize=4096, typed=True)
def _parse_context(value: str | int) -> ContextSpec:
    return ContextSpec._parse(value)


def order_lengths(seq_lens: Sequence[int], order: str) -> tuple[int, ...]:
    """The requests in `order`: 'shuffled' keeps the drawn order (independent draws: already a random
    order), 'sorted' puts them shortest first."""
    check_choice("order", order, REQUEST_ORDERS)
    lens = check_int_sequence("seq_lens", seq_lens, 0, MAX_SEQ_LEN)
    return tuple(sorted(lens)) if order == "sorted" else lens


def format_tokens(tokens: int) -> str:
    """8192 -> '8K' (a K is 1024 tokens), 1000 -> '1000': the inverse of `parse_tokens`."""
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def parse_tokens(text: str) -> int:
    """'8192' -> 8192, '8K' -> 8192 (a K is 1024 tokens); anything else raises ValueError."""
    text = text.strip().lower()
    scale = 1024 if text.endswith("k") else 1
    digits = text[:-1] if scale > 1 else text
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"{text!r} is not a token count")
    return int(digits) * scale


@dataclass(frozen=True)
class DecodeInputs:
    """Tensors of one decode step: FP8 queries and weights per token, and the paged cache."""

    batch: DecodeBatch
    q: torch.Tensor  # float8_e4m3fn [num_decode_tokens, H, D], request-major
    weights: torch.Tensor  # float32 [num_decode_tokens, H]
    cache: PagedCache

    def __post_init__(self) -> None:
        """Shapes, dtypes and devices agree with the batch and the cache; q and weights are finite
        (a NaN would outrank every score). Inputs are built once per workload, never in a timed loop."""
        batch = _check_batch(self.batch)
        shape = (batch.num_decode_tokens, batch.num_heads, batch.head_dim)
        check_tensor("q", self.q, dtype=torch.float8_e4m3fn, shape=shape)
        check_tensor("weights", self.weights, dtype=torch.float32, shape=shape[:2], device=self.q.device)
        check_finite("q", self.q)
        check_finite("weights", self.weights)
        if not isinstance(self.cache, PagedCache):
            raise ValueError(f"cache: expected a PagedCache, got {type(self.cache).__name__}")
        check_tensor("cache.data", self.cache.data, device=self.q.device)
        built = (self.cache.cache_dtype, self.cache.head_dim, self.cache.block_size, self.cache.block_table.shape[0])
        wanted = (batch.cache_dtype, batch.head_dim, batch.block_size, batch.batch_size)
        if built != wanted:
            raise ValueError(
                f"cache: built as (cache_dtype, head_dim, block_size, requests) = {built}, the batch needs {wanted}"
            )


def random_inputs(batch: DecodeBatch, seed: int = 0, device: str | torch.device = "cpu") -> DecodeInputs:
    """Fresh random queries, weights and keys (never zeros) for `batch`, on `device`."""
    _check_batch(batch)
    seed = check_seed("seed", seed)
    device = as_device("device", device)
    gen = torch.Generator().manual_seed(seed)
    tokens, heads, dim = batch.num_decode_tokens, batch.num_heads, batch.head_dim
    q = torch.randn(tokens, heads, dim, generator=gen).clamp(-448, 448).to(torch.float8_e4m3fn)
    weights = torch.randn(tokens, heads, generator=gen) * heads**-0.5
    keys = [torch.randn(length, dim, generator=gen) for length in batch.seq_lens]
    cache_seed = (seed + 1) & MAX_SEED  # the top seed's neighbour wraps to 0
    cache = build_paged_cache([k.to(device) for k in keys], batch.block_size, batch.cache_dtype, seed=cache_seed)
    return DecodeInputs(batch, q.to(device), weights.to(device), cache)
