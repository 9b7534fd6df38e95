"""DeepGEMM's calling convention, checked, and held in one object: what every backend's `logits` and `step`
take (`LogitsCall`), what every native kernel's public wrapper holds a call to (host checks that never sync
the device; the value scan, once per launch), and the SMs a persistent grid or a schedule is made for.

A call is eight things in DeepGEMM's positional convention (q, the cache, the head weights, the context
lengths, the block table, the logits' width, the backend's schedule and the cache's dtype). Before issue 30
they were eight arguments of every `logits`, forwarded through the decode path, the harness, the profiler and
the example; now `decode.launch_call` builds one `LogitsCall` per launch, checked once when it is made, and
backends read its fields. The public `paged_mqa_logits_*` wrappers keep DeepGEMM's positional convention
(`LogitsCall.args`).

A backend written before (`logits(self, q, kv_cache, weights, context_lens, block_table, max_context_len,
schedule=None, *, cache_dtype)`, or `(self, *args, **kwargs)` reading them) keeps working: `takes_a_call`
hands it the eight arguments of the call, warning once that the form changed, and a caller that passes the
eight arguments gets them made into a call.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from dsa_lab.batch.cache import CACHE_DTYPES, bytes_per_token
from dsa_lab.errors import BackendUnavailable, UnsupportedShape, check_choice, check_range, check_tensor

STEP_KEYWORDS = ("topk", "max_seq_len")  # what a fused backend's `step` takes besides the call


class Declared(Protocol):
    """What a native wrapper's checks ask of its backend (a `descriptor.LogitsBackend`)."""

    name: str

    def check_shape(self, heads: int, head_dim: int, cache_dtype: str) -> None: ...

    def availability(self, device: torch.device) -> Any: ...


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


@dataclass(frozen=True, eq=False)
class LogitsCall:
    """One kernel call in DeepGEMM's convention, checked when made (`check_logits_args`: host checks only, so a
    call may be made inside a timed loop, though the harness makes each once, where its launch is prepared).

    Row `b * n + j` of the result holds `sum_h w[t, h] * relu(q[t, h] . k[s]) * k_scale[s]` for the first
    `context_lens[b, j]` positions s of request b, as wide as `max_context_len` (the logits' width: the batch's
    longest context, or vLLM's max_model_len). Made as `logits` was called before issue 30: DeepGEMM's six
    positional arguments, the schedule, and `cache_dtype=` by keyword.
    """

    q: torch.Tensor  # float8_e4m3fn [B, n, H, D]
    kv_cache: torch.Tensor  # uint8 [num_blocks, block_size, 1, bytes a token], contiguous
    weights: torch.Tensor  # float32 [B * n, H]
    context_lens: torch.Tensor  # int32 [B, n]
    block_table: torch.Tensor  # int32 [B, max_blocks]
    max_context_len: int  # the logits' width
    schedule: Any = None  # the backend's own per-launch metadata (`LogitsBackend.schedule`), made outside timed calls
    cache_dtype: str = field(kw_only=True)  # 'fp8' or 'mxfp4': declared, never inferred from the byte width

    def __post_init__(self) -> None:
        check_logits_args(*self.args, cache_dtype=self.cache_dtype)

    @property
    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """DeepGEMM's positional arguments: (q, kv_cache, weights, context_lens, block_table, max_context_len)."""
        return self.q, self.kv_cache, self.weights, self.context_lens, self.block_table, self.max_context_len

    @property
    def rows(self) -> int:
        """Query rows the call scores (B * n): the logits' rows."""
        return self.weights.shape[0]

    def scheduled(self, schedule: Any) -> LogitsCall:
        """This call with the backend's `schedule` (None: without one, as the reference runs it)."""
        return dataclasses.replace(self, schedule=schedule)

    def check_values(self) -> None:
        """The value scan of this call (`check_logits_values`): a device->host copy, never in a timed loop."""
        check_logits_values(self.kv_cache, self.context_lens, self.block_table, self.max_context_len)


def _takes_call(function: Callable[..., Any]) -> bool:
    """Whether a backend method takes a `LogitsCall`: one positional parameter after self, not named 'q' (DeepGEMM's
    first), and no *args; anything else reads DeepGEMM's positional arguments, as every backend did before."""
    params = list(inspect.signature(function).parameters.values())[1:]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    starred = any(p.kind is p.VAR_POSITIONAL for p in params)
    return len(positional) == 1 and positional[0].name != "q" and not starred


def _as_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> LogitsCall:
    """The call a backend method was handed: a `LogitsCall`, or one made from DeepGEMM's arguments."""
    if len(args) == 1 and not kwargs and isinstance(args[0], LogitsCall):
        return args[0]
    if not args and set(kwargs) == {"call"} and isinstance(kwargs["call"], LogitsCall):
        return kwargs["call"]
    return LogitsCall(*args, **kwargs)


def takes_a_call(function: Callable[..., Any], owner: str = "", method: str = "") -> Callable[..., Any]:
    """A backend's `logits` or `step` (`function`, that `method` of class `owner`) as the harness calls it: with
    one `LogitsCall` (and a fused step's `topk=`, `max_seq_len=`), or with DeepGEMM's eight arguments, made into a
    call. A `function` written for the eight arguments (before issue 30) is handed them, and warned of once."""
    if getattr(function, "takes_a_call", False):
        return function
    takes_call, method = _takes_call(function), method or function.__name__
    if not takes_call and owner:
        warnings.warn(
            f"{owner}.{method} reads DeepGEMM's eight arguments (q, kv_cache, weights, context_lens, "
            "block_table, max_context_len, schedule, cache_dtype=), as a backend did before issue 30; a backend's "
            f"{method} now takes one LogitsCall (call.q, call.kv_cache, ..., call.max_context_len, "
            "call.schedule, call.cache_dtype). It still runs, handed the call's eight arguments "
            "(docs/add_a_kernel.md shows the new form).",
            FutureWarning,
            stacklevel=3,
        )

    @functools.wraps(function)
    def entry(self: Any, *args: Any, **kwargs: Any) -> Any:
        step = {key: kwargs.pop(key) for key in STEP_KEYWORDS if key in kwargs}
        call = _as_call(args, kwargs)
        if takes_call:
            return function(self, call, **step)
        return function(self, *call.args, call.schedule, cache_dtype=call.cache_dtype, **step)

    entry.__name__ = method
    entry.takes_a_call = True  # type: ignore[attr-defined]
    return entry


def check_native_call(
    backend: Declared,
    call: LogitsCall,
    *,
    check_values: bool,
    out: torch.Tensor | None,
    max_next_n: int,
    block_size: int,
) -> None:
    """The host checks of a native kernel's public wrapper, on the call it made of its arguments (the common
    convention, checked then), before its own config check: next_n, heads/dim/dtype, block size, `check_values`
    and `out`, each named.

    No device sync and no availability check, so every bad argument is named on any machine.
    """
    _, next_n, heads, dim = call.q.shape
    check_range("next_n", next_n, 1, max_next_n)
    backend.check_shape(heads, dim, call.cache_dtype)
    if call.kv_cache.shape[1] != block_size:
        raise UnsupportedShape(
            f"block_size={call.kv_cache.shape[1]!r}: backend {backend.name!r} allows {(block_size,)}"
        )
    check_choice("check_values", check_values, (False, True))
    if out is not None:
        shape = (call.rows, call.max_context_len)
        check_tensor("out", out, dtype=torch.float32, shape=shape, device=call.q.device, contiguous=True)


def ready_native_call(backend: Declared, call: LogitsCall, *, check_values: bool) -> LogitsCall:
    """After `check_native_call`: the backend must run on q's device (else BackendUnavailable says
    why), the value scan runs when asked, and the call comes back with q, weights, context_lens and
    block_table in the layout the kernels index (contiguous; the table's rows unit-stride): itself when
    they are (a packed launch's are), else a copy."""
    state = backend.availability(call.q.device)
    if not state.ok:
        raise BackendUnavailable(f"backend {backend.name!r} unavailable on {call.q.device}: {state.reason}")
    if check_values:
        call.check_values()
    table = call.block_table if call.block_table.stride(1) == 1 else call.block_table.contiguous()
    laid = {
        "q": call.q.contiguous(),
        "weights": call.weights.contiguous(),
        "context_lens": call.context_lens.contiguous(),
    }
    laid["block_table"] = table
    if all(tensor is getattr(call, name) for name, tensor in laid.items()):
        return call
    return dataclasses.replace(call, **laid)


@functools.cache
def num_sms(device_index: int) -> int:
    """Streaming multiprocessors of CUDA device `device_index`: how many CTAs a persistent grid launches."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count
