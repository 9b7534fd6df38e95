"""When does vLLM flatten the indexer decode batch? One pure function per vLLM behaviour.

Each policy maps a `PolicyQuery` (platform, next_n, cache dtype, adaptive verification,
model architecture) to a `Decision`: which path the DSA indexer's decode takes.

- native: the paged-MQA-logits kernel sees q `[B, next_n]` with 2-D context lens;
- flatten: `B * next_n` single-row pseudo-requests, each re-reading its request's KV;
- varlen (vLLM 0.33, SM100 with DeepGEMM): per-token rows plus a row -> request index,
  DeepGEMM's varlen kernel; neither of the two above;
- rejected: the configuration fails at startup (e.g. an MXFP4 cache off SM100).

The policies read like the code they model; `tests/test_conformance_vllm.py` checks
`vllm_0_33_0` against vLLM 0.33.0's own functions on the whole grid.
"""

from __future__ import annotations

import argparse
import functools
import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType

import pandas as pd
import torch

from dsa_lab.errors import check_choice, check_range

FAMILIES = ("sm90", "sm100", "sm120", "rocm", "other")
PATHS = ("native", "flatten", "varlen", "rejected")
SYMBOLS = {"native": "N", "flatten": "F", "varlen": "V", "rejected": "-"}
DEEPSEEK_V32 = "DeepseekV32ForCausalLM"
DEEPSEEK_V4_ARCHS = ("DeepseekV4ForCausalLM", "DeepseekV41ForCausalLM")
MODEL_ARCHS = (DEEPSEEK_V32, *DEEPSEEK_V4_ARCHS)
MAX_NEXT_N = 32
_CAPABILITY_FAMILIES = {9: "sm90", 10: "sm100", 12: "sm120"}


@dataclass(frozen=True)
class Platform:
    """What the decode policies look at: the GPU family and whether DeepGEMM imports.

    'other' covers CUDA GPUs outside SM90/100/120 (e.g. SM80) and machines with no GPU;
    vLLM 0.33 treats both alike here (native only for next_n in {1, 2}).
    """

    family: str
    has_deep_gemm: bool

    def __post_init__(self) -> None:
        check_choice("family", self.family, FAMILIES)
        if not isinstance(self.has_deep_gemm, bool):
            raise ValueError(f"has_deep_gemm={self.has_deep_gemm!r}: must be a bool")

    @property
    def label(self) -> str:
        return f"{self.family}{'+dg' if self.has_deep_gemm else ''}"

    @classmethod
    def detect(cls) -> Platform:
        """This machine: torch's device capability (or HIP) and an importable deep_gemm.

        deep_gemm counts when it imports (see `import_deep_gemm`).
        """
        if not torch.cuda.is_available():
            family = "other"
        elif torch.version.hip:
            family = "rocm"
        else:
            major, _ = torch.cuda.get_device_capability()
            family = _CAPABILITY_FAMILIES.get(major, "other")
        return cls(family, import_deep_gemm()[0] is not None)


@functools.cache
def import_deep_gemm() -> tuple[ModuleType | None, str]:
    """`deep_gemm`, else vLLM's vendored `vllm.third_party.deep_gemm` (as vLLM's
    `has_deep_gemm()` tries them): the module and its name, or None and every error.

    Only imports (seconds: it imports vLLM); never touches the GPU.
    """
    errors = []
    for name in ("deep_gemm", "vllm.third_party.deep_gemm"):
        try:
            return importlib.import_module(name), name
        except Exception as err:  # ImportError, or an extension that fails to load
            errors.append(f"{name}: {type(err).__name__}: {err}")
    return None, "; ".join(errors)


@dataclass(frozen=True)
class PolicyQuery:
    """One configuration: next_n = 1 + speculative tokens; `model_arch` matters on ROCm only."""

    platform: Platform
    next_n: int
    fp4_cache: bool = False
    adaptive_verification: bool = False
    model_arch: str = DEEPSEEK_V32

    def __post_init__(self) -> None:
        check_range("next_n", self.next_n, 1, MAX_NEXT_N)
        check_choice("model_arch", self.model_arch, MODEL_ARCHS)
        for name in ("fp4_cache", "adaptive_verification"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: must be a bool")


@dataclass(frozen=True)
class Decision:
    """The decode path a policy picks, and why. `use_flattening` is the builder's flag."""

    use_flattening: bool
    native_next_n: bool
    reason: str
    path: str

    def __post_init__(self) -> None:
        check_choice("path", self.path, PATHS)
        if self.native_next_n != (self.path == "native") or self.use_flattening != (self.path == "flatten"):
            raise ValueError(f"Decision: inconsistent flags for path={self.path!r}")

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.path]


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


def pr52164(q: PolicyQuery) -> Decision:
    """vLLM PR #52164: as #45322, plus SM90 native for next_n in {1, 2, 4} (DeepGEMM's
    2-CTA multicast kernel for next_n = 4); SM90 next_n 3 and >= 5 still flatten.
    Modelled from the PR's behaviour matrix, which assumes DeepGEMM is present.
    """
    if (rejected := _fp4_off_sm100(q)) is not None:
        return rejected
    if q.platform.family == "sm100":
        return _native("SM100: any next_n native (multi-atom kernel)")
    if q.platform.family == "sm90" and q.next_n in (1, 2, 4):
        return _native("SM90: next_n in {1, 2, 4} native")
    if q.next_n in (1, 2):
        return _native("next_n in {1, 2}: native everywhere")
    return _flatten(f"{q.platform.family}: no native kernel for next_n={q.next_n}")


# --- vLLM 0.33.0, one helper per function of vllm/v1/attention/backends/mla/indexer.py ---


def _cuda_with_deep_gemm(p: Platform) -> bool:
    """`current_platform.is_cuda() and has_deep_gemm()`; for 'other' (CUDA SM80, or no GPU)
    the answers below coincide either way, so it counts as CUDA."""
    return p.family != "rocm" and p.has_deep_gemm


def native_next_n_supported(p: Platform, next_n: int) -> bool:
    """`vllm.utils.deep_gemm.native_next_n_supported`: capability family 9 -> {1, 2, 4}, else any.

    vLLM asks only `is_device_capability_family(90)`; ROCm's CDNA3/4 GPUs report
    capability 9.x (gfx94x/95x), so it says {1, 2, 4} there too - harmless, since
    `_supports_native_decode` never consults it off CUDA.
    """
    if p.family in ("sm90", "rocm"):
        return next_n in (1, 2, 4)
    return True


def supports_native_decode(p: Platform, next_n: int) -> bool:
    """`_supports_native_decode`: without CUDA + DeepGEMM, {1, 2}; SM100 any; SM90 asks
    DeepGEMM ({1, 2, 4}); every other GPU (SM120 included) {1, 2}."""
    if not _cuda_with_deep_gemm(p):
        return next_n in (1, 2)
    if p.family == "sm100":
        return True
    if p.family == "sm90":
        return native_next_n_supported(p, next_n)
    return next_n in (1, 2)


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


def _fp4_rejected_0_33(q: PolicyQuery) -> Decision | None:
    """`dsa_indexer_uses_fp4`: MXFP4 needs SM100, or ROCm running DeepSeek-V4/V4.1
    (vLLM also demands CDNA4 and aiter there; assumed present)."""
    if not q.fp4_cache or q.platform.family == "sm100":
        return None
    if q.platform.family == "rocm" and q.model_arch in DEEPSEEK_V4_ARCHS:
        return None
    return _rejected(f"FP4 indexer cache on {q.platform.family} ({q.model_arch}): rejected at startup")


def use_flattening_0_33(q: PolicyQuery) -> bool:
    """`_use_flattening(vllm_config)`: no native kernel for next_n, or adaptive
    verification where device-side query lens need the flattened form."""
    return not supports_native_decode(q.platform, q.next_n) or _adaptive_forces_flatten(q)


def vllm_0_33_0(q: PolicyQuery) -> Decision:
    """vLLM 0.33.0 as released: the builder-time path (`use_flattening`, `supports_varlen`).

    Per step the builder may still flatten a non-native batch: see `step_path`.
    """
    if (rejected := _fp4_rejected_0_33(q)) is not None:
        return rejected
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


def step_uses_native(q: PolicyQuery, max_decode_len: int) -> bool:
    """vLLM 0.33's per-step rule in `build()`: native only if the builder did not flatten
    (nor take varlen) and the kernel takes this step's `max_decode_len` rows natively.

    e.g. SM90 + DeepGEMM, next_n = 4: a step whose longest request has 3 rows flattens.
    """
    check_range("max_decode_len", max_decode_len, 1, q.next_n)
    if _fp4_rejected_0_33(q) is not None:
        raise ValueError(f"{q}: rejected at startup; no decode step exists")
    builder_native = not (use_flattening_0_33(q) or supports_varlen(q.platform))
    return builder_native and (max_decode_len <= 1 or supports_native_decode(q.platform, max_decode_len))


def step_path(q: PolicyQuery, max_decode_len: int) -> str:
    """'native', 'flatten' or 'varlen' for one vLLM 0.33 decode step."""
    if step_uses_native(q, max_decode_len):
        return "native"
    return "varlen" if supports_varlen(q.platform) else "flatten"


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
    return tuple(Platform(f, dg) for f in FAMILIES for dg in (True, False))


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
    """Tidy table: one row per policy x platform x next_n x fp4 x adaptive."""
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
                                policy=name, platform=p.family, deep_gemm=p.has_deep_gemm, next_n=n,
                                fp4=use_fp4, adaptive=use_adaptive, use_flattening=d.use_flattening,
                                path=d.path, reason=d.reason,
                            )
                        )
    return pd.DataFrame(rows)


_COLOURS = {"N": "bold green", "F": "bold red", "V": "bold cyan", "-": "dim"}


def _print_matrix(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    check_range("next_n_max", args.next_n_max, 1, MAX_NEXT_N)
    names = list(POLICIES) if args.policy == "all" else [args.policy]
    next_ns = range(1, args.next_n_max + 1)
    frame = decision_matrix(names, None, next_ns, args.fp4, args.adaptive, args.model_arch)
    console = Console()
    for name in names:
        table = Table(title=f"{name}  (fp4={args.fp4}, adaptive={args.adaptive}, {args.model_arch})")
        table.add_column("platform")
        table.add_column("deep_gemm")
        for n in next_ns:
            table.add_column(str(n), justify="center")
        part = frame[frame.policy == name]
        for p in all_platforms():
            cells = part[(part.platform == p.family) & (part.deep_gemm == p.has_deep_gemm)].sort_values("next_n")
            symbols = [SYMBOLS[path] for path in cells.path]
            table.add_row(p.family, "yes" if p.has_deep_gemm else "no", *(f"[{_COLOURS[s]}]{s}[/]" for s in symbols))
        console.print(table)
    console.print("N native  F flatten  V varlen (SM100 DeepGEMM, per-token rows)  - rejected at startup")
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("policy", help="which vLLM version flattens the indexer decode batch, where")
    parser.add_argument("--next-n-max", type=int, default=8, help="largest next_n column (default 8)")
    parser.add_argument("--fp4", action="store_true", help="MXFP4 indexer cache")
    parser.add_argument("--adaptive", action="store_true", help="adaptive speculative verification")
    parser.add_argument("--policy", choices=("all", *POLICIES), default="all")
    parser.add_argument("--model-arch", choices=MODEL_ARCHS, default=DEEPSEEK_V32, help="matters on ROCm only")
    parser.set_defaults(func=_print_matrix)
