"""When does vLLM flatten the indexer decode batch? One pure function per vLLM behaviour.

Each policy maps a `PolicyQuery` (platform, next_n, cache dtype, adaptive verification,
model architecture) to a `Decision`: which path the DSA indexer's decode takes.

- native: the paged-MQA-logits kernel sees q `[B, next_n]` with 2-D context lens;
- flatten: `B * next_n` single-row pseudo-requests, each re-reading its request's KV;
- varlen (vLLM 0.33, SM100 with DeepGEMM): per-token rows plus a row -> request index,
  DeepGEMM's varlen kernel; neither of the two above;
- rejected: the configuration fails at startup, with vLLM's reason (an MXFP4 cache
  where no kernel reads it, adaptive verification where the indexer backend cannot
  take device-side query lengths).

For vLLM 0.33 the answer also depends on which indexer metadata builder the model wires
(`indexer_builder`): every model uses the dense `DeepseekV32IndexerMetadataBuilder`,
except DeepSeek-V4 / V4.1 with the MXFP4 cache on ROCm, which get aiter's
`RocmMxfp4IndexerMetadataBuilder`: it always flattens, then launches full uniform steps
as next_n-row sequences (native for every next_n >= 2, unless adaptive verification).

The policies read like the code they model; `tests/test_conformance_vllm_policy.py` checks
`vllm_0_33_0` against vLLM 0.33.0's own functions and builders on the whole grid.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pandas as pd

from dsa_lab.batch.workload import MAX_NEXT_N as MAX_DECODE_ROWS  # query rows a batch of the harness may have
from dsa_lab.errors import check_choice, check_range
from dsa_lab.kernels import vllm_backend
from dsa_lab.policy.query import (
    CAPABILITY_FAMILIES,
    DEEPSEEK_V4_ARCHS,
    DEEPSEEK_V32,
    FAMILIES,
    MAX_NEXT_N,
    Decision,
    Platform,
    PolicyQuery,
)

# vLLM's copy of DeepGEMM's SM90 native set (`vllm.utils.deep_gemm.native_next_n_supported` hard-codes it):
# what vLLM runs declares the set, and tests/test_conformance_vllm_policy.py holds vLLM's function to it.
VLLM_SM90_NATIVE = vllm_backend().native_sizes_on(next(m for m, f in CAPABILITY_FAMILIES.items() if f == "sm90"))
# The indexer backend each model's builder comes with (named in reasons).
INDEXER_BACKENDS = {
    DEEPSEEK_V32: "DeepseekV32IndexerBackend",
    "DeepseekV4ForCausalLM": "DeepseekV4IndexerBackend",
    "DeepseekV41ForCausalLM": "DeepseekV41IndexerBackend",
}


def _takes(kind: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A policy function whose first argument must be a `kind` (a `Platform` or a `PolicyQuery`): anything else is a
    ValueError naming the function and what it takes, not an AttributeError from inside it."""

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def checked(first: Any, *args: Any) -> Any:
            if not isinstance(first, kind):
                raise ValueError(
                    f"{function.__name__}: takes a {kind.__name__}, got {type(first).__name__} {first!r:.80}"
                )
            return function(first, *args)

        return checked

    return wrap


def _native(reason: str) -> Decision:
    return Decision(False, True, reason, "native")


def _flatten(reason: str) -> Decision:
    return Decision(True, False, reason, "flatten")


def _rejected(reason: str) -> Decision:
    return Decision(False, False, reason, "rejected")


def _fp4_off_sm100(q: PolicyQuery) -> Decision | None:
    """Before ROCm's MXFP4 path, an FP4 indexer cache off SM100 failed at startup."""
    if q.fp4_cache and q.platform.family != "sm100":
        return _rejected("FP4 indexer cache needs SM100: rejected at startup")
    return None


@_takes(PolicyQuery)
def before_pr45322(q: PolicyQuery) -> Decision:
    """vLLM before PR #45322 (i.e. before 0.24): the FP4 cache or any non-SM100 GPU
    flattens next_n outside {1, 2}; SM100 with FP8 runs any next_n natively.
    DeepGEMM presence is not modelled (the PR's behaviour matrix does not split on it).
    """
    if (rejected := _fp4_off_sm100(q)) is not None:
        return rejected
    if q.next_n in (1, 2):
        return _native("next_n in {1, 2}: native everywhere")
    if q.fp4_cache:
        return _flatten("FP4 cache on SM100: next_n > 2 flattened (pre-#45322)")
    if q.platform.family != "sm100":
        return _flatten(f"{q.platform.family}: kernel takes next_n in {{1, 2}} only")
    return _native("SM100 FP8: any next_n native")


@_takes(PolicyQuery)
def pr45322(q: PolicyQuery) -> Decision:
    """vLLM PR #45322 (released in 0.24): flatten iff not SM100 and next_n not in {1, 2};
    the FP4 cache on SM100 goes native for next_n > 2 too.
    """
    if (rejected := _fp4_off_sm100(q)) is not None:
        return rejected
    if q.platform.family == "sm100":
        return _native("SM100: any next_n native (multi-atom kernel)")
    if q.next_n in (1, 2):
        return _native("next_n in {1, 2}: native everywhere")
    return _flatten(f"{q.platform.family}: kernel takes next_n in {{1, 2}} only")


@_takes(PolicyQuery)
def pr52164(q: PolicyQuery) -> Decision:
    """vLLM PR #52164: as #45322, plus SM90 native for next_n in {1, 2, 4} (DeepGEMM's
    2-CTA multicast kernel for next_n = 4); SM90 next_n 3 and >= 5 still flatten.
    Modelled from the PR's behaviour matrix, which assumes DeepGEMM is present.
    """
    if (rejected := _fp4_off_sm100(q)) is not None:
        return rejected
    if q.platform.family == "sm100":
        return _native("SM100: any next_n native (multi-atom kernel)")
    if q.platform.family == "sm90" and q.next_n in VLLM_SM90_NATIVE:
        return _native(f"SM90: next_n in {set(VLLM_SM90_NATIVE)} native")
    if q.next_n in (1, 2):
        return _native("next_n in {1, 2}: native everywhere")
    return _flatten(f"{q.platform.family}: no native kernel for next_n={q.next_n}")


# --- vLLM 0.33.0, one helper per function of vllm/v1/attention/backends/mla/indexer.py ---


def _cuda_with_deep_gemm(p: Platform) -> bool:
    """`current_platform.is_cuda() and has_deep_gemm()`; for 'other' (CUDA SM80, or no GPU)
    the answers below coincide either way, so it counts as CUDA."""
    return p.family != "rocm" and p.has_deep_gemm


def _capability_family_90(p: Platform) -> bool:
    """`is_device_capability_family(90)`: Hopper, and ROCm's CDNA2-4 GPUs (gfx90a/942/950
    report capability 9.x; CDNA5's gfx1250 reports 12.5)."""
    return p.family == "sm90" or (p.family == "rocm" and p.cdna in (2, 3, 4))


@_takes(Platform)
def native_next_n_supported(p: Platform, next_n: int) -> bool:
    """`vllm.utils.deep_gemm.native_next_n_supported`: capability family 9 -> {1, 2, 4}, else any.

    On ROCm it says {1, 2, 4} too - harmless, since `_supports_native_decode` never
    consults it off CUDA.
    """
    check_range("next_n", next_n, 1, MAX_NEXT_N)
    return next_n in VLLM_SM90_NATIVE if _capability_family_90(p) else True


@_takes(Platform)
def supports_native_decode(p: Platform, next_n: int) -> bool:
    """`_supports_native_decode`: without CUDA + DeepGEMM, {1, 2}; SM100 any; SM90 asks
    DeepGEMM ({1, 2, 4}); every other GPU (SM120 included) {1, 2}."""
    check_range("next_n", next_n, 1, MAX_NEXT_N)
    if not _cuda_with_deep_gemm(p):
        return next_n in (1, 2)
    if p.family == "sm100":
        return True
    if p.family == "sm90":
        return native_next_n_supported(p, next_n)
    return next_n in (1, 2)


@_takes(Platform)
def vllm_native_sizes(p: Platform) -> tuple[int, ...]:
    """vLLM's view of the row counts the platform's kernel takes natively (`supports_native_decode`):
    what an atom plan as vLLM would see it cuts next_n into. The harness asks each backend instead
    (`LogitsBackend.native_sizes`)."""
    return tuple(n for n in range(1, MAX_DECODE_ROWS + 1) if supports_native_decode(p, n)) or (1,)


@_takes(Platform)
def supports_varlen(p: Platform) -> bool:
    """`_supports_varlen_paged_mqa_logits`: CUDA SM100 with DeepGEMM."""
    return p.family == "sm100" and p.has_deep_gemm


def _adaptive_forces_flatten(q: PolicyQuery) -> bool:
    """`_supports_flattened_device_query_lens` (CUDA SM90 + DeepGEMM) or
    `_rocm_supports_flattened_device_query_lens` (ROCm running DeepSeek-V4 / V4.1)."""
    p = q.platform
    sm90_dg = p.family == "sm90" and p.has_deep_gemm
    rocm_v4 = p.family == "rocm" and q.model_arch in DEEPSEEK_V4_ARCHS
    return q.adaptive_verification and (sm90_dg or rocm_v4)


@_takes(PolicyQuery)
def fp4_rejection_0_33(q: PolicyQuery) -> str | None:
    """`dsa_indexer_uses_fp4`, which raises at startup: why an MXFP4 cache is refused, or None.

    ROCm: DeepSeek-V4 / V4.1 only, on CDNA4, with aiter enabled (checked in that order);
    CUDA: capability family 100 (SM100 / SM103) only.
    """
    if not q.fp4_cache:
        return None
    p = q.platform
    if p.family == "rocm":
        if q.model_arch not in DEEPSEEK_V4_ARCHS:
            return f"MXFP4 indexer cache on ROCm is wired for DeepSeek-V4 / V4.1 only, not {q.model_arch}"
        if p.cdna != 4:
            return f"MXFP4 indexer cache on ROCm needs CDNA4 (MI350X / MI355X); this is CDNA{p.cdna}"
        if not p.aiter:
            return "MXFP4 indexer cache on ROCm runs on aiter's kernels; aiter is not enabled (VLLM_ROCM_USE_AITER=1)"
        return None
    if p.family != "sm100":
        return f"MXFP4 indexer cache needs an SM10x datacenter Blackwell GPU; {p.family} has no kernel for it"
    return None


@_takes(PolicyQuery)
def indexer_builder(q: PolicyQuery) -> str:
    """The indexer metadata builder vLLM 0.33 wires: 'rocm_mxfp4' for DeepSeek-V4 / V4.1
    whose MXFP4 cache ROCm accepted (aiter's paged kernels), 'dense' for everything else.

    V4 gets it from `DeepseekV4ROCMAiterMLAAttention`'s indexer class, V4.1 from its
    indexer cache's backend; V3.2 always keeps `DeepseekV32IndexerBackend`.
    """
    rocm_fp4 = q.platform.family == "rocm" and q.fp4_cache and fp4_rejection_0_33(q) is None
    return "rocm_mxfp4" if rocm_fp4 and q.model_arch in DEEPSEEK_V4_ARCHS else "dense"


@_takes(PolicyQuery)
def indexer_backend_takes_device_query_lens(q: PolicyQuery) -> bool:
    """`supports_device_cpu_query_lens_mismatch()` of the model's indexer backend: the
    varlen kernel or SM90's flattened device lens; V4 / V4.1 backends also on any ROCm."""
    p = q.platform
    cuda = supports_varlen(p) or (p.family == "sm90" and p.has_deep_gemm)
    return cuda or (p.family == "rocm" and q.model_arch in DEEPSEEK_V4_ARCHS)


@_takes(PolicyQuery)
def adaptive_rejection_0_33(q: PolicyQuery) -> str | None:
    """`maybe_create_adaptive_verification_manager`, which raises at startup: why adaptive
    verification is refused, or None.

    Its second check (a FULL-graph builder must replay varlen batches) passes wherever
    this first one does: every backend that takes device query lens has a builder with
    ALWAYS CUDA-graph support (varlen, flattening, or the ROCm MXFP4 builder).
    """
    if not q.adaptive_verification or indexer_backend_takes_device_query_lens(q):
        return None
    backend = INDEXER_BACKENDS[q.model_arch]
    return (
        f"adaptive verification trims drafts on the device; {backend} on {q.platform.label} needs the host's "
        "query lengths (SM100 varlen or SM90 + DeepGEMM flattening, or ROCm for DeepSeek-V4 / V4.1)"
    )


@_takes(PolicyQuery)
def use_flattening_0_33(q: PolicyQuery) -> bool:
    """`_use_flattening(vllm_config)`: no native kernel for next_n, or adaptive
    verification where device-side query lens need the flattened form."""
    return not supports_native_decode(q.platform, q.next_n) or _adaptive_forces_flatten(q)


def _rocm_mxfp4_decision(q: PolicyQuery) -> Decision:
    """`RocmMxfp4IndexerMetadataBuilder`: rows always flattened; a full uniform step is
    launched as next_n-row sequences when next_n >= 2 and adaptive verification is off."""
    if q.adaptive_verification:
        reason = "ROCm MXFP4 builder: adaptive verification reallocates drafts, so every step flattens"
        return Decision(True, False, reason, "flatten", "rocm_mxfp4")
    if q.next_n == 1:
        return Decision(True, False, "ROCm MXFP4 builder: one row per request", "flatten", "rocm_mxfp4")
    reason = f"ROCm MXFP4 builder: full uniform steps run as {q.next_n}-row sequences (ragged steps flatten)"
    return Decision(True, True, reason, "native", "rocm_mxfp4")


@_takes(PolicyQuery)
def vllm_0_33_0(q: PolicyQuery) -> Decision:
    """vLLM 0.33.0 as released: startup acceptance, then the builder-time path
    (`use_flattening`, `supports_varlen`, or the ROCm MXFP4 builder's native sequences).

    Per step the builder may still flatten a non-native batch: see `step_path`.
    """
    for rejection in (fp4_rejection_0_33(q), adaptive_rejection_0_33(q)):
        if rejection is not None:
            return _rejected(f"{rejection}: rejected at startup")
    if indexer_builder(q) == "rocm_mxfp4":
        return _rocm_mxfp4_decision(q)
    p = q.platform
    if supports_varlen(p):
        reason = "SM100 + DeepGEMM: varlen kernel, per-token rows with request indices"
        return Decision(use_flattening_0_33(q), False, reason, "varlen")
    if not supports_native_decode(p, q.next_n):
        where = p.label if _cuda_with_deep_gemm(p) else f"{p.label} (no CUDA+DeepGEMM)"
        return _flatten(f"{where}: no native kernel for next_n={q.next_n}")
    if _adaptive_forces_flatten(q):
        return _flatten(f"{p.label}: adaptive verification needs flattened device query lens")
    return _native(f"{p.label}: native kernel for next_n={q.next_n}")


Policy = Callable[[PolicyQuery], Decision]
POLICIES: dict[str, Policy] = {
    "before_pr45322": before_pr45322,
    "pr45322": pr45322,
    "pr52164": pr52164,
    "vllm_0_33_0": vllm_0_33_0,
}
RELEASES: dict[str, tuple[str, str]] = {  # policy name -> (what readers call it, the PR behind it)
    "before_pr45322": ("vLLM ≤ 0.23", "before PR #45322"),
    "pr45322": ("vLLM 0.24", "PR #45322: SM100 native for every next_n"),
    "pr52164": ("vLLM main, mid-2026", "PR #52164: SM90 native for next_n = 4"),
    "vllm_0_33_0": ("vLLM 0.33.0", "as released; checked against vLLM's own functions"),
}


def all_platforms() -> tuple[Platform, ...]:
    """Every CUDA family with and without DeepGEMM, and ROCm as MI300 (CDNA3) and as
    MI355X with aiter on (CDNA4, where the MXFP4 cache is accepted); DeepGEMM is CUDA-only."""
    cuda = tuple(Platform(f, dg) for f in FAMILIES if f != "rocm" for dg in (True, False))
    return (*cuda, Platform("rocm", False, 3), Platform("rocm", False, 4, aiter=True))


def _as_tuple(value: bool | Iterable[bool]) -> tuple[bool, ...]:
    return (value,) if isinstance(value, bool) else tuple(value)


def decision_matrix(
    policies: Sequence[str] | None = None,
    platforms: Sequence[Platform] | None = None,
    next_ns: Iterable[int] = range(1, 9),
    fp4: bool | Iterable[bool] = False,
    adaptive: bool | Iterable[bool] = False,
    model_arch: str = DEEPSEEK_V32,
) -> pd.DataFrame:
    """Tidy table: one row per policy x platform x next_n x fp4 x adaptive (`platform` is
    `Platform.name`; `builder` is the indexer builder vLLM 0.33 would wire)."""
    names = list(POLICIES) if policies is None else list(policies)
    for name in names:
        check_choice("policy", name, tuple(POLICIES))
    rows = []
    for name in names:
        for p in platforms or all_platforms():
            for n in next_ns:
                for use_fp4 in _as_tuple(fp4):
                    for use_adaptive in _as_tuple(adaptive):
                        d = POLICIES[name](PolicyQuery(p, n, use_fp4, use_adaptive, model_arch))
                        rows.append(
                            dict(
                                policy=name,
                                platform=p.name,
                                deep_gemm=p.has_deep_gemm,
                                next_n=n,
                                fp4=use_fp4,
                                adaptive=use_adaptive,
                                model_arch=model_arch,
                                builder=d.builder,
                                use_flattening=d.use_flattening,
                                path=d.path,
                                reason=d.reason,
                            )
                        )
    return pd.DataFrame(rows)
