"""What vLLM's decode policies are asked and what they answer: a `Platform` (the GPU family, DeepGEMM, on ROCm the
CDNA generation and aiter), a `PolicyQuery` (a platform and one configuration: next_n, the cache, adaptive
verification, the model) and a `Decision` (the path the DSA indexer's decode takes, the builder's flags, why), with
the vocabularies they are checked against. The policies themselves are `policy.vllm`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsa_lab.errors import check_choice, check_range

FAMILIES = ("sm90", "sm100", "sm120", "rocm", "other")
FAMILY_LABELS = {  # how people name each family
    "sm90": "Hopper SM90 (H100, H200)",
    "sm100": "Blackwell SM100 (B200, GB200)",
    "sm120": "SM120 (RTX PRO 6000)",
    "rocm": "ROCm (MI300)",
    "other": "other CUDA GPU or none",
}
PATHS = ("native", "flatten", "varlen", "rejected")
SYMBOLS = {"native": "N", "flatten": "F", "varlen": "V", "rejected": "-"}
DEEPSEEK_V32 = "DeepseekV32ForCausalLM"
DEEPSEEK_V4_ARCHS = ("DeepseekV4ForCausalLM", "DeepseekV41ForCausalLM")
MODEL_ARCHS = (DEEPSEEK_V32, *DEEPSEEK_V4_ARCHS)
MAX_NEXT_N = 32
CAPABILITY_FAMILIES = {9: "sm90", 10: "sm100", 12: "sm120"}  # compute capability major -> family
# vLLM's `get_cdna_version()` by GPU arch (vllm/platforms/rocm.py); 0 = not a CDNA GPU.
CDNA_BY_GFX = {"gfx90a": 2, "gfx942": 3, "gfx950": 4, "gfx1250": 5}
CDNA_VERSIONS = (0, 2, 3, 4, 5)
DEFAULT_CDNA = 3  # a ROCm platform named without a generation: MI300X / MI325X
# Indexer metadata builders of vLLM 0.33 (short name -> class).
BUILDERS = {"dense": "DeepseekV32IndexerMetadataBuilder", "rocm_mxfp4": "RocmMxfp4IndexerMetadataBuilder"}


@dataclass(frozen=True)
class Platform:
    """What the decode policies look at: the GPU family, whether DeepGEMM imports and,
    on ROCm, the CDNA generation and whether aiter's kernels are on.

    'other' covers CUDA GPUs outside SM90/100/120 (e.g. SM80) and machines with no GPU;
    vLLM 0.33 treats both alike here (native only for next_n in {1, 2}). `cdna` is
    vLLM's `get_cdna_version()` (3: MI300X/MI325X, 4: MI350X/MI355X; a ROCm platform
    given none is CDNA3); `aiter` is VLLM_ROCM_USE_AITER=1 with aiter installed. Both
    decide whether the MXFP4 indexer cache is accepted on ROCm.
    """

    family: str
    has_deep_gemm: bool
    cdna: int | None = None
    aiter: bool = False

    def __post_init__(self) -> None:
        check_choice("family", self.family, FAMILIES)
        for name in ("has_deep_gemm", "aiter"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: must be a bool")
        if self.family != "rocm":
            if self.cdna is not None or self.aiter:
                raise ValueError(f"cdna={self.cdna!r}, aiter={self.aiter!r}: ROCm only (family={self.family!r})")
            return
        if self.cdna is None:
            object.__setattr__(self, "cdna", DEFAULT_CDNA)
        check_choice("cdna", self.cdna, CDNA_VERSIONS)

    @property
    def name(self) -> str:
        """The family, with the generation and aiter on ROCm: 'sm90', 'rocm-cdna4+aiter'."""
        if self.family != "rocm":
            return self.family
        return f"rocm-cdna{self.cdna}{'+aiter' if self.aiter else ''}"

    @property
    def label(self) -> str:
        return f"{self.name}{'+dg' if self.has_deep_gemm else ''}"


@dataclass(frozen=True)
class PolicyQuery:
    """One configuration: next_n = 1 + speculative tokens; `model_arch` matters on ROCm
    (which builder, MXFP4 and adaptive acceptance) and names the backend in reasons."""

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
    """The decode path a policy picks, and why.

    `use_flattening` is the builder's flag, `native_next_n` whether a full step's kernel
    sees next_n rows per request. For the dense builder the flag decides the path; the
    ROCm MXFP4 builder sets it always and still launches full uniform steps natively.
    """

    use_flattening: bool
    native_next_n: bool
    reason: str
    path: str
    builder: str = "dense"

    def __post_init__(self) -> None:
        check_choice("path", self.path, PATHS)
        check_choice("builder", self.builder, tuple(BUILDERS))
        flag_ok = (
            self.use_flattening if self.builder == "rocm_mxfp4" else self.use_flattening == (self.path == "flatten")
        )
        if self.path == "rejected":
            flag_ok = not self.use_flattening
        if self.native_next_n != (self.path == "native") or not flag_ok:
            raise ValueError(f"Decision: inconsistent flags for path={self.path!r}, builder={self.builder!r}")

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.path]
