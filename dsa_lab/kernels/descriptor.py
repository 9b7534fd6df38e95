"""What a paged-MQA-logits backend declares about itself: the descriptor every layer above reads.

Adding a backend is one module and one decorator (tritonbench's `@register_benchmark` is the
model, `registry.register_backend`): everything the layers above need to know about it is
declared on its class.

    @register_backend
    class MyBackend(LogitsBackend):
        name = "mine"
        family, label, marker, color = "mine", "Mine", "*", "#8c564b"   # who wrote it; how charts show it
        presets = ("smoke",)                                            # the sweep presets it joins
        def logits(self, call: LogitsCall) -> torch.Tensor: ...          # one call in DeepGEMM's convention

Declared per backend: whether it can run here (and why not); the next_n it takes natively per
compute capability (`native_sizes`); the shapes it accepts; its numerics per capability (the K
scale format and check tolerance the harness holds it to, `numerics`); whether it is batch
invariant; the facts its provenance records (`environment`, `resume_fields`) and any foreign code
it imports for them, only when a run names it (`foreign_code`); how the
performance model counts its work per architecture (`model_traits`) and the efficiencies it
reaches there, fitted on a measured sweep (`model_fits`); its tuning knobs
(`config_space`, the `config` axis); the GPU targets its kernel compiles for on any machine
(`aot_archs`, `compile_ahead`); whether it is what vLLM runs (`in_vllm`). Callers never get a
silent fallback.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dsa_lab.errors import BackendUnavailable, UnsupportedShape, check_choice
from dsa_lab.kernels.convention import LogitsCall, takes_a_call

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
class KernelFit:
    """Efficiencies of one backend's strategy, fitted on a measured H200 sweep
    (`model.calibration.fit_efficiencies`): what the performance model scales each ceiling by."""

    bw: float  # fraction of HBM bandwidth
    compute: float  # fraction of the FP8 and FP32 rates
    launch_us: float  # fixed cost of a launch
    overlap: float  # p of the p-norm that combines the three terms
    serial: float = 1.0  # a kernel of fixed KV slices: the share of one SM's rates its largest program reaches

    def __post_init__(self) -> None:
        for name in ("bw", "compute", "serial"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: a share of a ceiling, in (0, 1]")
        if self.launch_us < 0 or self.overlap < 1:
            raise ValueError(
                f"launch_us={self.launch_us!r}, overlap={self.overlap!r}: need launch_us >= 0, overlap >= 1"
            )


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
    call: Callable[..., torch.Tensor]  # the kernel's public wrapper, in DeepGEMM's positional convention

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

    def launch(self, call: LogitsCall, knobs: Mapping[str, Any]) -> torch.Tensor:
        """The kernel's wrapper on `call`: at the rule's config with `knobs` set, or ({}) at the wrapper's own
        choice for the shape and GPU. No device sync on a GPU (the call is timed and graph-captured; its launch was
        value-checked where it was prepared); on the CPU the scan is a host read, and an id outside the cache would
        make the kernel read outside its memory."""
        _, next_n, heads, head_dim = call.q.shape
        return self.call(
            *call.args,
            config=self.config(knobs, next_n, heads, head_dim) if knobs else None,
            check_values=call.q.device.type == "cpu",
            cache_dtype=call.cache_dtype,
            **({} if call.schedule is None else {"schedule": call.schedule}),  # made outside the timed call
        )


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
    """Base class: `logits(call)`, one `convention.LogitsCall` in DeepGEMM's convention.

    call.q `[B, n, H, D]` float8_e4m3fn; call.kv_cache uint8 `[num_blocks, 64, 1, bytes_per_token]`,
    contiguous, holding call.cache_dtype ('fp8' or 'mxfp4', required: a 68-byte token is FP8
    at D = 64 and MXFP4 at D = 128, so the width cannot tell); call.weights float32 `[B*n, H]`;
    call.context_lens int32 `[B, n]`; call.block_table int32 `[B, max_blocks]`; call.schedule what
    this backend's `schedule` made for the launch (or None). Returns float32 `[B*n, call.max_context_len]`.
    Positions at or beyond a row's context length are -inf where `cleans_tail`, unspecified otherwise
    (callers mask them).

    `logits` of a GPU backend must not synchronise the host: benchmarks time it between
    CUDA events and capture it in CUDA graphs. A call's host checks (`check_logits_args`) ran when
    it was made, while the values (context lens, block ids) are scanned by
    `check_logits_values` once per launch where the launch is prepared
    (`decode.check_launches`), outside any timed loop. On the CPU the scan needs no device
    sync, so CPU backends may run it on every call.

    A subclass's `logits` and `step` are taken as `convention.takes_a_call` makes them: one written for
    DeepGEMM's eight arguments (before issue 30) is handed them, with a warning, and a caller may still pass
    the eight arguments.
    """

    name: ClassVar[str]
    family: ClassVar[str]  # who wrote the kernel: backends of one family compete as one ("the best DeepGEMM option")
    label: ClassVar[str]  # how charts and tables name it
    marker: ClassVar[str] = "v"  # its matplotlib marker in every chart (a strategy owns the colour)
    color: ClassVar[str] = "#7f7f7f"  # its colour where a chart tells backends apart by colour
    baseline: ClassVar[bool] = False  # the correctness baseline every other backend is checked against
    in_vllm: ClassVar[bool] = False  # what vLLM runs: its times stand for vLLM's choice
    presets: ClassVar[
        tuple[str, ...]
    ] = ()  # the sweep presets (`bench.presets.PRESETS`) it joins; PRESET:PART one part
    batch_invariant: ClassVar[bool] = False  # a row's logits never depend on the launch it shares (tolerance 0)
    cleans_tail: ClassVar[bool] = True
    heads: ClassVar[tuple[int, ...]] = (32, 64)
    head_dims: ClassVar[tuple[int, ...]] = (64, 128)
    cache_dtypes: ClassVar[tuple[str, ...]] = ("fp8",)
    native_sizes: ClassVar[Mapping[int, tuple[int, ...]]] = {}  # capability major -> next_n taken natively; else any
    numerics: ClassVar[Mapping[int, Numerics]] = {}  # capability major -> its numerics there; else the defaults
    model_traits: ClassVar[Mapping[str, ModelTraits]] = {}  # architecture ('sm90', 'sm100') -> how it spends work
    model_fits: ClassVar[Mapping[str, KernelFit]] = {}  # strategy -> its efficiencies, fitted on the H200 sweep
    config_space: ClassVar[ConfigSpace | None] = None  # its tuning knobs (None: 'rule' only)
    aot_archs: ClassVar[tuple[int, ...]] = ()  # the sm_<arch> targets `compile_ahead` builds its kernel for
    packages: ClassVar[tuple[str, ...]] = ()  # Python packages it runs on, recorded by their installed version
    versions: ClassVar[tuple[str, ...]] = ()  # `environment` facts that are versions (named in chart footers)
    resume_fields: ClassVar[tuple[str, ...]] = ()  # `environment` facts a resumed run must keep
    fuses_topk: ClassVar[bool] = False  # its unit is the whole step: logits and top-k in one kernel (`step`)
    config: ClassVar[str] = RULE  # the `config` axis's value it runs (`configured`)
    knobs: ClassVar[Mapping[str, Any]] = {}  # that config's knobs ({}: the rule's choice)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for method in ("logits", "step"):
            if method in cls.__dict__:
                setattr(cls, method, takes_a_call(cls.__dict__[method], cls.__qualname__, method))

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
        hands the config's knobs to the kernel. UnsupportedShape when it has no such knob."""
        if config == RULE:
            return self
        if self.config_space is None:
            raise UnsupportedShape(f"config={config!r}: backend {self.name!r} has no tuning knobs (only 'rule')")
        knobs, parent = self.config_space.parse(self.name, config), type(self)
        return type(f"{parent.__name__}[{config}]", (parent,), {"config": config, "knobs": knobs})()

    def compile_ahead(self, arch: int, next_n: int, heads: int, head_dim: int, config: str = RULE) -> tuple[str, Any]:
        """Its kernel compiled for `sm_<arch>` (one of `aot_archs`) with no GPU, at `config` (a value of the
        `config` axis): the config's description and Triton's CompiledKernel (`kernels.aot` reads it).
        UnsupportedShape for a backend that compiles nothing ahead of time."""
        raise UnsupportedShape(f"backend {self.name!r} compiles nothing ahead of time (aot_archs is empty)")

    def schedule(self, context_lens: torch.Tensor, block_size: int, block_table: torch.Tensor) -> Any:
        """Per-launch scheduling metadata (DeepGEMM's SM plan, our Gluon kernel's balanced split with
        each CTA's first page ids); made on the device, timed apart from the kernel."""
        return None

    @takes_a_call
    def logits(self, call: LogitsCall) -> torch.Tensor:
        """The logits of `call` (the class docstring says what). A backend with a config space runs its kernel's
        public wrapper at its config (`ConfigSpace.launch`); any other backend overrides this."""
        if self.config_space is None:
            raise NotImplementedError(f"backend {self.name!r} defines no logits (nor a config_space to launch)")
        return self.config_space.launch(call, self.knobs)

    @takes_a_call
    def step(self, call: LogitsCall, *, topk: int, max_seq_len: int) -> torch.Tensor:
        """A fused backend's whole step (`fuses_topk`) on `call`: int32 `[B*n, topk]`, each row's best `topk`
        positions among its first context_lens, -1 past a short row, in any order (what vLLM's `SparseIndexerTopk`
        writes), the step's longest context `max_seq_len`; its logits need not reach memory. Like `logits`, it must
        not synchronise the host."""
        raise NotImplementedError(f"backend {self.name!r} does not fuse the top-k (fuses_topk is False)")

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
