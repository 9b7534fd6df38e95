"""DeepGEMM's paged MQA logits (the kernel vLLM runs on Hopper and Blackwell).

Imported from a `deep_gemm` package if one is installed, else from the copy vendored in
vLLM (`vllm.third_party.deep_gemm`). Two API generations are handled:
`fp8_fp4_paged_mqa_logits((q, q_scale), ...)` (DeepGEMM >= 2.x, vLLM 0.33) and the older
`fp8_paged_mqa_logits(q, ..., clean_logits)`. The kernel leaves columns past each row's
context unspecified (up to a 256-aligned bound), hence `cleans_tail = False`.

Dispatch is on the device's real compute capability (major version):
- 9 (SM90): next_n in {1, 2, 4} natively; weights float32; schedule slots = SMs / 2 for
  next_n = 4 (two CTAs share KV through multicast), SMs otherwise.
- 10 (SM100, SM103): DeepGEMM's SM100 form, as vLLM 0.33 calls it (`mqa_logits_mx_inputs`,
  the varlen decode metadata): MX inputs only, so FP8 q goes with unit UE8M0 scales, the
  weights in bf16, and each K token's scale as four equal UE8M0 bytes (its exponent:
  exact for the power-of-two scales vLLM writes there, i.e. a cache quantised with
  `ue8m0=True`, as the harness builds it for this backend on SM100, `bench.numerics`;
  any other scale is truncated to its power of two, which the reference check then
  reports); the varlen form: one row per query token, a row -> request index,
  and a block table with one row per token (DeepGEMM reads a run's table at its first
  token row). The kernel groups each request's rows into 2-row Q blocks (64 heads) that
  reuse the request's KV chunk, so any next_n is native. Logits come back bf16 and are
  widened (bf16 weights, head sum and logits: about 2e-3 from the reference, so the
  harness checks these points to 1e-2, `bench.numerics`). Derived inputs (the UE8M0
  cache, the per-row table, indices, unit scales) are made once per source tensor and
  reused while it is unchanged, so a timing loop pays for the kernel only. This path has not been run by this project (no SM100 here).
- 12 (SM120): any next_n, weights float32 (as vLLM passes them).
"""

from __future__ import annotations

import functools
import importlib
import weakref
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, ClassVar

import torch

from dsa_lab.errors import BackendUnavailable, check_range, check_tensor
from dsa_lab.kernels.convention import LogitsCall
from dsa_lab.kernels.descriptor import Availability, KernelFit, LogitsBackend, ModelTraits, Numerics
from dsa_lab.kernels.registry import register_backend

SUPPORTED_MAJORS = (9, 10, 12)
SM90_MAJOR, SM100_MAJOR = 9, 10
SM90_NATIVE_NEXT_N = (1, 2, 4)  # DeepGEMM's SM90 kernels (vLLM's `native_next_n_supported` holds a copy)
SM90_TRAITS = ModelTraits(tile_rows=1, logit_bytes=4, epilogue_per_head=2.0)  # relu and a weighted FMA a head
SM100_NUMERICS = Numerics(
    "ue8m0",
    1e-2,
    "DeepGEMM on SM100 (vLLM 0.33's varlen call): weights and logits are bf16 and the head sum runs in "
    "bf16, about 2e-3 from the float64-exact reference; it reads each K scale as a UE8M0 byte, so the "
    "cache holds power-of-two scales, as vLLM writes it there",
)
UNIT_UE8M0_X4 = 0x7F7F7F7F  # four ue8m0 bytes of 2^0, packed in an int32
SCALE_BYTES = 4  # an FP8 cache token's float32 scale, or its four UE8M0 bytes on SM100


@functools.cache
def import_deep_gemm() -> tuple[ModuleType | None, str]:
    """`deep_gemm`, else vLLM's vendored `vllm.third_party.deep_gemm` (as vLLM's `has_deep_gemm()`
    tries them): the module and its name, or None and every error.

    Only imports (seconds: it imports vLLM); never touches the GPU.
    """
    errors = []
    for name in ("deep_gemm", "vllm.third_party.deep_gemm"):
        try:
            return importlib.import_module(name), name
        except Exception as err:  # ImportError, or an extension that fails to load
            errors.append(f"{name}: {type(err).__name__}: {err}")
    return None, "; ".join(errors)


def _row_requests(batch: int, next_n: int, device: torch.device) -> torch.Tensor:
    """int32 request index of each of the batch * next_n varlen rows."""
    return torch.arange(batch, dtype=torch.int32, device=device).repeat_interleave(next_n)


def ue8m0_kv_cache(kv_cache: torch.Tensor) -> torch.Tensor:
    """The FP8 cache as DeepGEMM's SM100 kernel reads it: values unchanged, each token's
    float32 scale replaced by four copies of its exponent byte (UE8M0).

    Exact when the scales are powers of two (`quantize_fp8(k, ue8m0=True)`, as vLLM
    quantises the indexer cache on SM100); otherwise each scale loses its mantissa.
    """
    check_tensor("kv_cache", kv_cache, dtype=torch.uint8, ndim=4, contiguous=True)
    blocks, block_size, _, width = kv_cache.shape
    value_bytes = block_size * (width - SCALE_BYTES)
    out = kv_cache.clone()
    scale_bits = kv_cache.view(blocks, -1)[:, value_bytes:].view(torch.int32)
    out.view(blocks, -1)[:, value_bytes:].view(torch.int32).copy_(((scale_bits >> 23) & 0xFF) * 0x01010101)
    return out


class _Derived:
    """Tensors made from a source tensor, reused while the source lives and is unmodified
    (same object, same version counter): what lets repeated calls skip the conversion."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, int], tuple[weakref.ref, int, torch.Tensor]] = {}

    def get(self, kind: str, source: torch.Tensor, make: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        key = (kind, id(source))
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is source and entry[1] == source._version:
            return entry[2]
        self._entries = {k: e for k, e in self._entries.items() if e[0]() is not None}  # drop the dead
        derived = make(source)
        self._entries[key] = (weakref.ref(source), source._version, derived)
        return derived


@register_backend
class DeepGemmBackend(LogitsBackend):
    """`deep_gemm.fp8_fp4_paged_mqa_logits` (or the older `fp8_paged_mqa_logits`).

    Another build of DeepGEMM is a subclass that says where its module comes from (`_import`),
    which majors it runs on, its native next_n (`native_sizes`) and its SM90 schedule slots.
    """

    name = "deepgemm"
    family = "deepgemm"
    label = "DeepGEMM"
    marker = "o"
    color = "#8c564b"
    in_vllm = True  # what vLLM 0.33 calls on SM90 and SM100
    presets = ("smoke", "h200-full", "sm100", "step")
    cleans_tail = False
    supported_majors: ClassVar[tuple[int, ...]] = SUPPORTED_MAJORS
    native_sizes: ClassVar[Mapping[int, tuple[int, ...]]] = {SM90_MAJOR: SM90_NATIVE_NEXT_N}
    numerics: ClassVar[Mapping[int, Numerics]] = {SM100_MAJOR: SM100_NUMERICS}
    # SM90: pieces of native rows, float32 logits. SM100: any rows, cut into Q blocks of 128 / heads tokens
    # that re-read the request's KV chunk from L2; bf16 logits, one packed relu-convert and HFMA2 per two heads.
    model_traits: ClassVar[Mapping[str, ModelTraits]] = {
        "sm90": SM90_TRAITS,
        "sm100": ModelTraits(
            128,
            2,
            1.0,
            epilogue_over_valid_rows=True,
            one_kernel=True,
            cache_dtypes=("fp8", "mxfp4"),
            assumption="DeepGEMM's SM100 kernel sums relu x weight over heads in bf16 pairs (one CUDA-core "
            "instruction a head); an FP32 epilogue (two a head) would double fp32_epilogue",
        ),
    }
    # Fitted on the shipped H200 study sweep by `model.calibration.fit_efficiencies` (tests/test_model.py names the
    # run, fits again and holds these to it); applied on SM100 too, where no measurement exists here.
    model_fits: ClassVar[Mapping[str, KernelFit]] = {
        "native": KernelFit(0.8, 0.55, 7.0, 4.0),
        "flatten": KernelFit(0.95, 0.3, 6.0, 8.0),
        "atom": KernelFit(0.9, 0.525, 5.5, 8.0),
    }
    versions: ClassVar[tuple[str, ...]] = ("deep_gemm",)
    resume_fields: ClassVar[tuple[str, ...]] = ("deep_gemm",)
    heads: ClassVar[tuple[int, ...]] = (32, 64)
    head_dims: ClassVar[tuple[int, ...]] = (128,)
    cache_dtypes: ClassVar[tuple[str, ...]] = ("fp8",)

    def __init__(self) -> None:
        self._module: ModuleType | None = None
        self._origin = ""
        self._loaded = False
        self._derived = _Derived()
        self._constants: dict[tuple[str, int, int, int, str], torch.Tensor] = {}

    def module(self) -> ModuleType | None:
        """deep_gemm, imported on first use (never at package import), with PDL on as vLLM sets it."""
        if not self._loaded:
            self._module, self._origin = self._import()
            self._loaded = True
            if self._module is not None and hasattr(self._module, "set_pdl"):
                self._module.set_pdl(True)
        return self._module

    def _import(self) -> tuple[ModuleType | None, str]:
        """deep_gemm as vLLM finds it: the module and its name, or None and every error."""
        return import_deep_gemm()

    def _sm90_slots(self, next_n: int, num_sms: int) -> int:
        """Schedule slots on SM90: next_n = 4 runs two CTAs a cluster sharing KV by multicast."""
        return num_sms // 2 if next_n == 4 else num_sms

    @property
    def origin(self) -> str:
        """Which import provided deep_gemm (or why none did)."""
        self.module()
        return self._origin

    @property
    def version(self) -> str | None:
        module = self.module()
        return getattr(module, "__version__", "unknown") if module is not None else None

    def availability(self, device: torch.device) -> Availability:
        device = torch.device(device)
        needs = ", ".join(f"SM{m}0" for m in self.supported_majors)
        if device.type != "cuda":
            return Availability(False, f"backend {self.name!r} needs a CUDA GPU ({needs}); got device {device.type}")
        if not torch.cuda.is_available():
            return Availability(False, "torch.cuda.is_available() is False")
        major, minor = torch.cuda.get_device_capability(device)
        if major not in self.supported_majors:
            return Availability(False, f"compute capability {major}.{minor}; backend {self.name!r} needs {needs}")
        module = self.module()
        if module is None:
            return Availability(False, f"deep_gemm could not be imported ({self._origin})")
        if not hasattr(module, "get_paged_mqa_logits_metadata") or not (
            hasattr(module, "fp8_fp4_paged_mqa_logits") or hasattr(module, "fp8_paged_mqa_logits")
        ):
            return Availability(False, f"{self._origin} {self.version} has no paged MQA logits API")
        return Availability(True, "")

    def library_imports(self) -> bool:
        return self._import()[0] is not None

    def environment(self, requested: bool = True) -> dict[str, Any]:
        del requested  # the vendored deep_gemm is ours to import: recorded for every run
        module, origin = import_deep_gemm()
        found = module is not None
        return {
            "deep_gemm": getattr(module, "__version__", "unknown") if found else None,
            "deep_gemm_origin": origin if found else None,
        }

    def schedule(self, context_lens: torch.Tensor, block_size: int, block_table: torch.Tensor) -> torch.Tensor:
        """DeepGEMM's SM plan `[slots + 1, 2]` for these 2-D context lengths (the block table plays no part)."""
        del block_table
        check_tensor("context_lens", context_lens, dtype=torch.int32, ndim=2)
        check_range("block_size", block_size, 1, 1024)
        module = self._require_available(context_lens.device)
        major = torch.cuda.get_device_capability(context_lens.device)[0]
        num_sms = int(module.get_num_sms())
        if major == SM100_MAJOR:  # varlen form: one row per query token, each naming its request
            batch, next_n = context_lens.shape
            indices = self._row_constant("indices", batch, next_n, 0, context_lens.device)
            return module.get_paged_mqa_logits_metadata(
                context_lens.reshape(-1, 1).contiguous(), block_size, num_sms, indices
            )
        next_n = context_lens.shape[1]
        slots = self._sm90_slots(next_n, num_sms) if major == 9 else num_sms
        return module.get_paged_mqa_logits_metadata(context_lens.contiguous(), block_size, slots)

    def logits(self, call: LogitsCall) -> torch.Tensor:
        """Host checks only (GPU-only backend: values are checked once per launch by its caller)."""
        q, kv_cache, weights, context_lens, block_table, max_context_len = call.args
        self.check_shape(q.shape[2], q.shape[3], call.cache_dtype)
        module = self._require_available(q.device)
        schedule = (
            self.schedule(context_lens, kv_cache.shape[1], block_table) if call.schedule is None else call.schedule
        )
        major = torch.cuda.get_device_capability(q.device)[0]
        block_table = block_table.contiguous()
        if major == SM100_MAJOR:
            return self._logits_sm100(
                module, q, kv_cache, weights, context_lens, block_table, max_context_len, schedule
            )
        if hasattr(module, "fp8_fp4_paged_mqa_logits"):
            out = module.fp8_fp4_paged_mqa_logits(
                (q, None), kv_cache, weights, context_lens, block_table, schedule, max_context_len
            )
        else:
            out = module.fp8_paged_mqa_logits(
                q, kv_cache, weights, context_lens, block_table, schedule, max_context_len, False
            )
        return out if out.dtype == torch.float32 else out.float()

    def _row_constant(self, kind: str, batch: int, next_n: int, heads: int, device: torch.device) -> torch.Tensor:
        """The varlen row -> request index, or unit UE8M0 q scales, for this launch shape (made once)."""
        key = (kind, batch, next_n, heads, str(device))
        if key not in self._constants:
            if kind == "indices":
                value = _row_requests(batch, next_n, device)
            else:
                value = torch.full((batch * next_n, 1, heads), UNIT_UE8M0_X4, dtype=torch.int32, device=device)
            self._constants[key] = value
        return self._constants[key]

    def _logits_sm100(self, module, q, kv_cache, weights, context_lens, block_table, max_context_len, schedule):
        """Varlen form, as vLLM 0.33 calls DeepGEMM on SM100 (see the module docstring)."""
        batch, next_n, heads, dim = q.shape
        rows = q.reshape(batch * next_n, 1, heads, dim)
        row_table = self._derived.get(
            f"row_table/{next_n}", block_table, lambda table: table.repeat_interleave(next_n, dim=0)
        )
        out = module.fp8_fp4_paged_mqa_logits(
            (rows, self._row_constant("unit_scales", batch, next_n, heads, q.device)),
            self._derived.get("ue8m0_cache", kv_cache, ue8m0_kv_cache),
            weights.to(torch.bfloat16),
            context_lens.reshape(-1, 1).contiguous(),
            row_table,
            schedule,
            max_context_len,
            self._row_constant("indices", batch, next_n, 0, q.device),
        )
        return out.float()

    def _require_available(self, device: torch.device) -> ModuleType:
        """deep_gemm, or BackendUnavailable with the reason (no GPU, wrong capability, no module)."""
        state = self.availability(device)
        module = self.module() if state.ok else None
        if module is None:
            raise BackendUnavailable(f"backend {self.name!r} unavailable on {device}: {state.reason}")
        return module
