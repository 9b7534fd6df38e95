"""A registry of paged-MQA-logits backends sharing DeepGEMM's calling convention, each described once.

Adding a backend is one module and one decorator (tritonbench's `@register_benchmark` is the
model): everything the layers above need to know about it is declared on its class.

    @register_backend
    class MyBackend(LogitsBackend):
        name = "mine"
        family, label, marker, color = "mine", "Mine", "*", "#8c564b"   # who wrote it; how charts show it
        presets = ("smoke",)                                            # the sweep presets it joins
        def logits(self, q, kv_cache, weights, context_lens, block_table, max_context_len, schedule=None, *,
                   cache_dtype): ...

Declared per backend: whether it can run here (and why not); the next_n it takes natively per
compute capability (`native_sizes`); the shapes it accepts; its numerics per capability (the K
scale format and check tolerance the harness holds it to, `numerics`); whether it is batch
invariant; the facts its provenance records (`environment`, `resume_fields`) and any foreign code
it imports for them, only when a run names it (`foreign_code`); how the
performance model counts its work per architecture (`model_traits`); its tuning knobs
(`config_space`, the `config` axis); whether it is what vLLM runs (`in_vllm`). Callers never
get a silent fallback.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dsa_lab.cache import CACHE_DTYPES, bytes_per_token
from dsa_lab.errors import BackendUnavailable, UnsupportedShape, check_choice, check_range, check_tensor

RULE = "rule"  # the `config` axis's value for a backend's own choice at each shape
K_SCALE_FORMATS = ("float32", "ue8m0")


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str


@dataclass(frozen=True)
class Numerics:
    """A backend's numerics on one platform, with the reason: the format its FP8 cache's per-token K
    scales must have to be read exactly ('float32': any; 'ue8m0': a power of two, read as its exponent
    byte), and the bound of the harness's correctness measure (None: the spec's `check_tolerance`)."""

    k_scales: str = "float32"
    tolerance: float | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        check_choice("k_scales", self.k_scales, K_SCALE_FORMATS)
        if self.tolerance is not None and not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance={self.tolerance!r}: must lie in (0, 1) or be None (the spec's)")

    def check_tolerance(self, spec_tolerance: float) -> tuple[float, str]:
        """The bound a point is checked against, and why: never tighter than the spec's."""
        if self.tolerance is None or self.tolerance <= spec_tolerance:
            return spec_tolerance, "the spec's check_tolerance"
        return self.tolerance, self.reason


DEFAULT_NUMERICS = Numerics()


@dataclass(frozen=True)
class ModelTraits:
    """How a backend's kernel on one architecture spends its work, read from its source: what the
    performance model (`dsa_lab.model.indexer`) counts; native row counts are the backend's `native_sizes`,
    and a backend that `cleans_tail` writes -inf up to the batch's longest context."""

    tile_rows: int  # MMA tiles hold the launch's rows padded to a multiple of max(1, tile_rows // heads)
    logit_bytes: int  # 4: float32, 2: bf16
    epilogue_per_head: float  # CUDA-core instructions per (row, token, head)
    program_blocks: Callable[[int, int, int], int] | None = None  # fixed KV slices: (batch, col_blocks, sms) -> blocks
    flatten_dram_share: float | None = None  # measured share of flatten's re-reads reaching DRAM (None: an L2 rule)
    epilogue_over_valid_rows: bool = False  # the epilogue loops over a tile's valid rows only
    one_kernel: bool = False  # native, atom and flatten all run one kernel (whose padding and re-reads are counted)
    cache_dtypes: tuple[str, ...] = ("fp8",)  # the cache formats its kernel reads there
    assumption: str = ""  # what the model assumes of this kernel that its source does not settle

    def q_block(self, heads: int) -> int:
        return max(1, self.tile_rows // heads)


@dataclass(frozen=True)
class ConfigSpace:
    """A backend's tuning knobs: the fields of its kernel's config dataclass, with their types.

    A value of the `config` axis is 'rule' (the backend's own choice at each shape) or
    'knob=value/knob=value', which sets those knobs of the rule's choice at each shape; the
    kernel's wrapper (`call`, which takes `config=`, `check_values=` and `cache_dtype=`) checks
    the result and names what it refuses.
    """

    config_type: type
    rule: Callable[[int, int, int], Any]  # (next_n, heads, head_dim) -> the backend's own config
    call: Callable[..., torch.Tensor]

    @property
    def knobs(self) -> dict[str, type]:
        return {f.name: type(f.default) for f in dataclasses.fields(self.config_type)}

    def parse(self, backend: str, text: str) -> dict[str, Any]:
        """{knob: value} of a config ({} for 'rule'); UnsupportedShape for a knob this backend lacks,
        ValueError for a value of the wrong type."""
        if text == RULE:
            return {}
        knobs, out = self.knobs, {}
        for item in text.split("/"):
            name, sep, raw = item.partition("=")
            if not sep or name not in knobs:
                raise UnsupportedShape(
                    f"config={text!r}: backend {backend!r} takes 'rule' or knob=value/... with knobs {sorted(knobs)}"
                )
            out[name] = _knob_value(name, raw, knobs[name])
        return out

    def config(self, knobs: Mapping[str, Any], next_n: int, heads: int, head_dim: int) -> Any:
        return dataclasses.replace(self.rule(next_n, heads, head_dim), **knobs)


def _knob_value(name: str, raw: str, kind: type) -> Any:
    if kind is bool:
        check_choice(name, raw, ("true", "false"))
        return raw == "true"
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"config knob {name}={raw!r}: must be an integer") from None
    return raw


class LogitsBackend:
    """Base class: `logits(q, kv_cache, weights, context_lens, block_table, max_context_len,
    schedule=None, *, cache_dtype)`.

    q `[B, n, H, D]` float8_e4m3fn; kv_cache uint8 `[num_blocks, 64, 1, bytes_per_token]`,
    contiguous, holding `cache_dtype` ('fp8' or 'mxfp4', required: a 68-byte token is FP8
    at D = 64 and MXFP4 at D = 128, so the width cannot tell); weights float32 `[B*n, H]`;
    context_lens int32 `[B, n]`; block_table int32 `[B, max_blocks]`. Returns float32
    `[B*n, max_context_len]`. Positions at or beyond a row's context length are -inf where
    `cleans_tail`, unspecified otherwise (callers mask them).

    `logits` of a GPU backend must not synchronise the host: benchmarks time it between
    CUDA events and capture it in CUDA graphs. So it runs `check_logits_args` (host checks
    only) on every call, while the values (context lens, block ids) are scanned by
    `check_logits_values` once per launch where the launch is prepared
    (`decode.check_launches`), outside any timed loop. On the CPU the scan needs no device
    sync, so CPU backends may run it on every call.
    """

    name: ClassVar[str]
    family: ClassVar[str]  # who wrote the kernel: backends of one family compete as one ("the best DeepGEMM option")
    label: ClassVar[str]  # how charts and tables name it
    marker: ClassVar[str] = "v"  # its matplotlib marker in every chart (a strategy owns the colour)
    color: ClassVar[str] = "#7f7f7f"  # its colour where a chart tells backends apart by colour
    baseline: ClassVar[bool] = False  # the correctness baseline every other backend is checked against
    in_vllm: ClassVar[bool] = False  # what vLLM runs: its times stand for vLLM's choice
    presets: ClassVar[tuple[str, ...]] = ()  # the sweep presets (`bench.point.PRESETS`) it joins; PRESET:PART one part
    batch_invariant: ClassVar[bool] = False  # a row's logits never depend on the launch it shares (tolerance 0)
    cleans_tail: ClassVar[bool] = True
    heads: ClassVar[tuple[int, ...]] = (32, 64)
    head_dims: ClassVar[tuple[int, ...]] = (64, 128)
    cache_dtypes: ClassVar[tuple[str, ...]] = ("fp8",)
    native_sizes: ClassVar[Mapping[int, tuple[int, ...]]] = {}  # capability major -> next_n taken natively; else any
    numerics: ClassVar[Mapping[int, Numerics]] = {}  # capability major -> its numerics there; else the defaults
    model_traits: ClassVar[Mapping[str, ModelTraits]] = {}  # architecture ('sm90', 'sm100') -> how it spends work
    config_space: ClassVar[ConfigSpace | None] = None  # its tuning knobs (None: 'rule' only)
    packages: ClassVar[tuple[str, ...]] = ()  # Python packages it runs on, recorded by their installed version
    versions: ClassVar[tuple[str, ...]] = ()  # `environment` facts that are versions (named in chart footers)
    resume_fields: ClassVar[tuple[str, ...]] = ()  # `environment` facts a resumed run must keep

    def availability(self, device: torch.device) -> Availability:
        return Availability(True, "")

    def native_next_n(self, device: torch.device) -> frozenset[int] | None:
        """next_n values taken natively on `device` (None: any from 1 to 16), from `native_sizes`."""
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            return None
        sizes = self.native_sizes_on(torch.cuda.get_device_capability(device)[0])
        return frozenset(sizes) if sizes is not None else None

    def native_sizes_on(self, major: int) -> tuple[int, ...] | None:
        """next_n values taken natively on compute capability `major` (None: any)."""
        return self.native_sizes.get(major)

    def environment(self, requested: bool = True) -> dict[str, Any]:
        """What a run's provenance records of this backend's libraries (`env_info.environment_facts`).
        `requested`: whether the run names this backend; a backend running foreign code (`foreign_code`)
        imports it only then, and records its facts as None otherwise."""
        return {}

    def foreign_code(self) -> str | None:
        """A line for `dsa-lab env` naming the foreign code (a user's build) this backend would import
        here and when it does; None: it runs none."""
        return None

    def library_imports(self) -> bool:
        """Whether the library its kernel comes from imports here (no GPU needed; what vLLM's `has_deep_gemm`
        asks of DeepGEMM)."""
        return True

    def version_note(self, environment: Mapping[str, Any]) -> str | None:
        """A chart footer's mention of this backend's library build, from a run's environment (None: nothing)."""
        return None

    def configured(self, config: str) -> LogitsBackend:
        """This backend running `config` (the `config` axis): itself for 'rule', else a copy whose `logits`
        hands the config to the kernel. UnsupportedShape when it has no such knob."""
        if config == RULE:
            return self
        if self.config_space is None:
            raise UnsupportedShape(f"config={config!r}: backend {self.name!r} has no tuning knobs (only 'rule')")
        space, knobs, parent = self.config_space, self.config_space.parse(self.name, config), type(self)

        def logits(me, q, kv_cache, weights, context_lens, block_table, max_context_len, schedule=None, *, cache_dtype):
            check_tensor("q", q, dtype=torch.float8_e4m3fn, ndim=4)
            chosen = space.config(knobs, q.shape[1], q.shape[2], q.shape[3])
            return space.call(
                q,
                kv_cache,
                weights,
                context_lens,
                block_table,
                max_context_len,
                config=chosen,
                check_values=q.device.type == "cpu",
                cache_dtype=cache_dtype,
                **({} if schedule is None else {"schedule": schedule}),  # made outside the timed call
            )

        return type(f"{parent.__name__}[{config}]", (parent,), {"logits": logits, "config": config})()

    def schedule(self, context_lens: torch.Tensor, block_size: int, block_table: torch.Tensor) -> Any:
        """Per-launch scheduling metadata (DeepGEMM's SM plan, our Gluon kernel's balanced split with
        each CTA's first page ids); made on the device, timed apart from the kernel."""
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
        *,
        cache_dtype: str,
    ) -> torch.Tensor:
        raise NotImplementedError

    def require(self, device: torch.device, next_n: int, heads: int, head_dim: int, cache_dtype: str) -> None:
        """Raise UnsupportedShape (a shape this backend never runs, on any machine) or
        BackendUnavailable before launch, naming the allowed values or the reason."""
        self.check_shape(heads, head_dim, cache_dtype)
        state = self.availability(device)
        if not state.ok:
            raise BackendUnavailable(f"backend {self.name!r} unavailable on {device}: {state.reason}")
        native = self.native_next_n(device)
        if native is not None and next_n not in native:
            raise UnsupportedShape(
                f"next_n={next_n}: backend {self.name!r} on {device} runs natively only "
                f"next_n in {sorted(native)} (use strategy 'flatten' or 'atom')"
            )

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
_LOOKUPS: list[Callable[[str], None]] = []  # ways to find a backend asked for by a name not registered yet


class BackendClash(ValueError):
    """A backend registered under a name another backend already has."""

    def __init__(self, name: str, holder: type[LogitsBackend]) -> None:
        super().__init__(f"backend {name!r} registered twice (first by {holder.__module__}.{holder.__qualname__})")
        self.name, self.holder = name, holder


def register_backend(cls: type[LogitsBackend]) -> type[LogitsBackend]:
    if cls.name in _BACKENDS:
        raise BackendClash(cls.name, type(_BACKENDS[cls.name]))
    for field in ("family", "label"):
        if not isinstance(getattr(cls, field, None), str):
            raise ValueError(f"backend {cls.name!r}: declares no {field} (a string)")
    _BACKENDS[cls.name] = cls()
    return cls


def forget_backends(names: tuple[str, ...]) -> None:
    """Unregister what a backend module that failed to load left behind (`kernels.external`)."""
    for name in names:
        _BACKENDS.pop(name, None)


def add_lookup(find: Callable[[str], None]) -> None:
    """A way to register a backend asked for by a name not registered yet (`kernels.external`: an
    installed entry point of that name); it registers it, raises naming what is wrong, or does nothing."""
    _LOOKUPS.append(find)


def ask_backend(name: str) -> str:
    """`name`, once every lookup had its chance to register it (a backend of `--backend`, `get_backend`)."""
    if isinstance(name, str) and name not in _BACKENDS:
        for find in _LOOKUPS:
            find(name)
    return name


def get_backend(name: str) -> LogitsBackend:
    check_choice("backend", ask_backend(name), tuple(_BACKENDS))
    return _BACKENDS[name]


def backend_names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def baseline_backend() -> LogitsBackend:
    """The correctness baseline (the reference): what every other backend is checked against."""
    return next(b for b in _BACKENDS.values() if b.baseline)


def vllm_backend() -> LogitsBackend:
    """The backend vLLM runs (DeepGEMM): its times stand for vLLM's choice in every comparison."""
    return next(b for b in _BACKENDS.values() if b.in_vllm)


def family_of(name: str) -> tuple[str, ...]:
    """Every registered backend of `name`'s family (e.g. the released DeepGEMM and a build of a PR of it)."""
    family = get_backend(name).family
    return tuple(n for n, b in _BACKENDS.items() if b.family == family)


def preset_backends(preset: str) -> tuple[str, ...]:
    """The backends that join a sweep preset, in registration order."""
    return tuple(n for n, b in _BACKENDS.items() if preset in b.presets)


def modeled_backends() -> tuple[str, ...]:
    """The backends the performance model counts the work of (those that declare `model_traits`)."""
    return tuple(n for n, b in _BACKENDS.items() if b.model_traits)


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


def check_native_call(
    backend: LogitsBackend,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    *,
    cache_dtype: str,
    check_values: bool,
    out: torch.Tensor | None,
    max_next_n: int,
    block_size: int,
) -> None:
    """The host checks of a native kernel's public wrapper, before its own config check: the common
    convention, then next_n, heads/dim/dtype, block size, `check_values` and `out`, each named.

    No device sync and no availability check, so every bad argument is named on any machine.
    """
    check_logits_args(q, kv_cache, weights, context_lens, block_table, max_context_len, cache_dtype=cache_dtype)
    _, next_n, heads, dim = q.shape
    check_range("next_n", next_n, 1, max_next_n)
    backend.check_shape(heads, dim, cache_dtype)
    if kv_cache.shape[1] != block_size:
        raise UnsupportedShape(f"block_size={kv_cache.shape[1]!r}: backend {backend.name!r} allows {(block_size,)}")
    check_choice("check_values", check_values, (False, True))
    if out is not None:
        shape = (q.shape[0] * next_n, max_context_len)
        check_tensor("out", out, dtype=torch.float32, shape=shape, device=q.device, contiguous=True)


def ready_native_call(
    backend: LogitsBackend,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    *,
    check_values: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """After `check_native_call`: the backend must run on q's device (else BackendUnavailable says
    why), the value scan runs when asked, and q, weights, context_lens, block_table come back in
    the layout the kernels index (contiguous; the table's rows unit-stride)."""
    state = backend.availability(q.device)
    if not state.ok:
        raise BackendUnavailable(f"backend {backend.name!r} unavailable on {q.device}: {state.reason}")
    if check_values:
        check_logits_values(kv_cache, context_lens, block_table, max_context_len)
    if block_table.stride(1) != 1:
        block_table = block_table.contiguous()
    return q.contiguous(), weights.contiguous(), context_lens.contiguous(), block_table


@functools.cache
def num_sms(device_index: int) -> int:
    """Streaming multiprocessors of CUDA device `device_index`: how many CTAs a persistent grid launches."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count
