"""DeepGEMM's paged MQA logits (the kernel vLLM runs on Hopper and Blackwell).

Imported from a `deep_gemm` package if one is installed, else from the copy vendored in
vLLM (`vllm.third_party.deep_gemm`). Two API generations are handled:
`fp8_fp4_paged_mqa_logits((q, q_scale), ...)` (DeepGEMM >= 2.x, vLLM 0.33) and the older
`fp8_paged_mqa_logits(q, ..., clean_logits)`. The kernel leaves columns past each row's
context unspecified (up to a 256-aligned bound), hence `cleans_tail = False`.

Per device capability:
- SM90: next_n in {1, 2, 4} natively; weights float32; schedule slots = SMs / 2 for
  next_n = 4 (two CTAs share KV through multicast), SMs otherwise.
- SM100: weights bf16, unit MX scales for FP8 q, and the varlen form (rows of one token
  plus a row -> request index), so any next_n; logits come back bf16 and are widened.
  This path follows vLLM 0.33's wrapper and has not been run by this project.
- SM120: any next_n, weights float32 (as vLLM passes them).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

import torch

from dsa_lab.errors import BackendUnavailable, check_range, check_tensor
from dsa_lab.kernels.registry import Availability, LogitsBackend, check_logits_args, register_backend

SUPPORTED_MAJORS = (9, 10, 12)
SM90_NATIVE_NEXT_N = frozenset({1, 2, 4})
UNIT_UE8M0_X4 = 0x7F7F7F7F  # four ue8m0 bytes of 2^0, packed in an int32


def _row_requests(batch: int, next_n: int, device: torch.device) -> torch.Tensor:
    """int32 request index of each of the batch * next_n varlen rows."""
    return torch.arange(batch, dtype=torch.int32, device=device).repeat_interleave(next_n)


@register_backend
class DeepGemmBackend(LogitsBackend):
    """`deep_gemm.fp8_fp4_paged_mqa_logits` (or the older `fp8_paged_mqa_logits`)."""

    name = "deepgemm"
    cleans_tail = False
    heads: ClassVar[tuple[int, ...]] = (32, 64)
    head_dims: ClassVar[tuple[int, ...]] = (128,)
    cache_dtypes: ClassVar[tuple[str, ...]] = ("fp8",)

    def __init__(self) -> None:
        self._module: ModuleType | None = None
        self._origin = ""
        self._loaded = False

    def module(self) -> ModuleType | None:
        """deep_gemm, imported on first use (never at package import), with PDL on as vLLM sets it."""
        if not self._loaded:
            from dsa_lab.policy import import_deep_gemm  # policy owns the import order vLLM uses

            self._module, self._origin = import_deep_gemm()
            self._loaded = True
            if self._module is not None and hasattr(self._module, "set_pdl"):
                self._module.set_pdl(True)
        return self._module

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
        if device.type != "cuda":
            return Availability(False, f"DeepGEMM needs a CUDA GPU (SM90, SM100 or SM120); got device {device.type}")
        if not torch.cuda.is_available():
            return Availability(False, "torch.cuda.is_available() is False")
        major, minor = torch.cuda.get_device_capability(device)
        if major not in SUPPORTED_MAJORS:
            return Availability(False, f"compute capability {major}.{minor}; DeepGEMM's paged MQA logits needs SM90, SM100 or SM120")
        module = self.module()
        if module is None:
            return Availability(False, f"deep_gemm could not be imported ({self._origin})")
        if not hasattr(module, "get_paged_mqa_logits_metadata") or not (
            hasattr(module, "fp8_fp4_paged_mqa_logits") or hasattr(module, "fp8_paged_mqa_logits")
        ):
            return Availability(False, f"{self._origin} {self.version} has no paged MQA logits API")
        return Availability(True, "")

    def native_next_n(self, device: torch.device) -> frozenset[int] | None:
        device = torch.device(device)
        if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] == 9:
            return SM90_NATIVE_NEXT_N
        return None

    def schedule(self, context_lens: torch.Tensor, block_size: int) -> torch.Tensor:
        """DeepGEMM's SM plan `[slots + 1, 2]` for these 2-D context lengths."""
        check_tensor("context_lens", context_lens, dtype=torch.int32, ndim=2)
        check_range("block_size", block_size, 1, 1024)
        module = self._require_available(context_lens.device)
        major = torch.cuda.get_device_capability(context_lens.device)[0]
        num_sms = int(module.get_num_sms())
        if major == 10:  # varlen form: one row per query token, each naming its request
            batch, next_n = context_lens.shape
            indices = _row_requests(batch, next_n, context_lens.device)
            return module.get_paged_mqa_logits_metadata(context_lens.reshape(-1, 1).contiguous(), block_size, num_sms, indices)
        next_n = context_lens.shape[1]
        slots = num_sms // 2 if (major == 9 and next_n == 4) else num_sms
        return module.get_paged_mqa_logits_metadata(context_lens.contiguous(), block_size, slots)

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
        """Host checks only (GPU-only backend: values are checked once per launch by its caller)."""
        check_logits_args(q, kv_cache, weights, context_lens, block_table, max_context_len, cache_dtype=cache_dtype)
        self.check_shape(q.shape[2], q.shape[3], cache_dtype)
        module = self._require_available(q.device)
        if schedule is None:
            schedule = self.schedule(context_lens, kv_cache.shape[1])
        major = torch.cuda.get_device_capability(q.device)[0]
        block_table = block_table.contiguous()
        if major == 10:
            return self._logits_sm100(module, q, kv_cache, weights, context_lens, block_table, max_context_len, schedule)
        if hasattr(module, "fp8_fp4_paged_mqa_logits"):
            out = module.fp8_fp4_paged_mqa_logits(
                (q, None), kv_cache, weights, context_lens, block_table, schedule, max_context_len
            )
        else:
            out = module.fp8_paged_mqa_logits(
                q, kv_cache, weights, context_lens, block_table, schedule, max_context_len, False
            )
        return out if out.dtype == torch.float32 else out.float()

    def _logits_sm100(self, module, q, kv_cache, weights, context_lens, block_table, max_context_len, schedule):
        """Varlen form: rows of one token, `indices` naming each row's request (vLLM 0.33 on SM100)."""
        batch, next_n, heads, dim = q.shape
        rows = q.reshape(batch * next_n, 1, heads, dim)
        unit_scales = torch.full((batch * next_n, 1, heads), UNIT_UE8M0_X4, dtype=torch.int32, device=q.device)
        indices = _row_requests(batch, next_n, q.device)
        out = module.fp8_fp4_paged_mqa_logits(
            (rows, unit_scales),
            kv_cache,
            weights.to(torch.bfloat16),
            context_lens.reshape(-1, 1).contiguous(),
            block_table,
            schedule,
            max_context_len,
            indices,
        )
        return out.float()

    def _require_available(self, device: torch.device) -> ModuleType:
        """deep_gemm, or BackendUnavailable with the reason (no GPU, wrong capability, no module)."""
        state = self.availability(device)
        module = self.module() if state.ok else None
        if module is None:
            raise BackendUnavailable(f"backend 'deepgemm' unavailable on {device}: {state.reason}")
        return module
