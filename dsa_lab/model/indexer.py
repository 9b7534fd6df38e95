"""Modeled time of one paged-MQA-logits decode step, per GPU, backend and strategy.

Every launch of the step costs

    t = launch_us + max(combine(T_hbm, T_mma, T_epilogue), T_program)

where each term is the launch's work at a ceiling of `gpus.GpuCeilings` times an
efficiency fitted on this project's H200 sweep (`FITS`, per backend and strategy):

- T_hbm: DRAM bytes (KV as the kernel really fetches it from DRAM, logits written, q and
  weights) / (HBM bandwidth x `bw`);
- T_mma: FP8 FLOPs of the kernel's MMA tiles (padded rows included) / (FP8 rate x `compute`);
- T_epilogue: CUDA-core instructions of relu x weight summed over heads / (FP32 rate / 2 x
  `compute`); on B200 this is about as large as T_mma, on H200 well below it;
- combine: the p-norm with p = `overlap` (large p: the three overlap; p = 1: they add);
- T_program (Triton only): its largest program (a fixed run of KV blocks of one request)
  at `serial` times one SM's share of the rates; DeepGEMM spreads work evenly.

How each kernel works decides the counts (`KernelTraits`, from the kernels' sources):
DeepGEMM's SM90 kernel takes 1, 2 or 4 rows natively; its SM100 kernel cuts a request's
rows into Q blocks of 128 / heads tokens (2 at 64 heads) that re-read the request's KV
chunk from L2, not DRAM, so any next_n is native with rows padded to an even count; it
writes bf16 logits and reduces in bf16 pairs. Flatten's re-reads reach DRAM as Nsight
Compute saw on the H200 (`calibration.reread_table`): DeepGEMM's about next_n times once
more rows than SMs are in flight and the KV does not fit L2, dsa_lab's Triton kernel
about once. Everything here is `source='modeled'`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dsa_lab.cache import bytes_per_token, check_head_dim
from dsa_lab.errors import check_choice, check_int_sequence, check_range
from dsa_lab.kernels.deepgemm import SM90_NATIVE_NEXT_N
from dsa_lab.kernels.triton_native import BLOCK_SIZE, blocks_per_program
from dsa_lab.metadata import STRATEGIES, AtomPiece, plan_atoms
from dsa_lab.model.gpus import H200_RUN, GpuCeilings, get_gpu
from dsa_lab.workload import MAX_NEXT_N

BACKENDS = ("deepgemm", "triton")
# Share of flatten's re-reads that Triton's kernel takes from DRAM rather than L2: the median of
# (DRAM read / unique KV - 1) / (next_n - 1) over the shipped Nsight Compute rows (`calibration.reread_table`).
TRITON_FLATTEN_DRAM_SHARE = 0.023


@dataclass(frozen=True)
class KernelFit:
    """Efficiencies of one backend's strategy, fitted on the H200 sweep (`calibration.fit_efficiencies`)."""

    bw: float  # fraction of HBM bandwidth
    compute: float  # fraction of the FP8 and FP32 rates
    launch_us: float  # fixed cost of a launch
    overlap: float  # p of the p-norm that combines the three terms
    serial: float = 1.0  # Triton: the fraction of one SM's share of the rates its largest program reaches


# Fitted on data/h200/h200-full-20261129 (640 points) by `calibration.fit_efficiencies`;
# tests/test_model.py re-fits and checks these. Errors: `calibration.h200_errors`.
FITS: dict[tuple[str, str], KernelFit] = {
    ("deepgemm", "native"): KernelFit(0.8, 0.55, 7.0, 4.0),
    ("deepgemm", "flatten"): KernelFit(0.95, 0.3, 6.0, 8.0),
    ("deepgemm", "atom"): KernelFit(0.9, 0.525, 5.5, 8.0),
    ("triton", "native"): KernelFit(0.85, 0.525, 6.0, 1.5, 0.7),
    ("triton", "flatten"): KernelFit(0.65, 0.35, 4.5, 3.0, 0.5),
    ("triton", "atom"): KernelFit(0.7, 0.675, 5.0, 1.5, 0.7),
}
CALIBRATION = f"efficiencies fitted on data/{H200_RUN} (H200, {len(FITS)} backend x strategy fits)"


@dataclass(frozen=True)
class KernelTraits:
    """How a backend's kernel on an architecture spends its work (read from its source)."""

    native_sizes: tuple[int, ...] | None  # row counts one launch takes; None: any
    q_block: int  # MMA tiles hold a multiple of this many rows (padding)
    logit_bytes: int  # 4: float32, 2: bf16
    epilogue_per_head: float  # CUDA-core instructions per (row, token, head)
    cleans_tail: bool  # writes -inf up to the batch's longest context
    per_program: bool  # fixed slices of KV per program (Triton) instead of balanced work


def atom_sizes(arch: str, next_n: int) -> tuple[int, ...]:
    """The pieces atom cuts next_n into, for every backend: DeepGEMM's native row counts on
    that architecture (SM90: 1, 2, 4, as the H200 sweep ran it; SM100: any, one piece)."""
    return tuple(sorted(SM90_NATIVE_NEXT_N)) if arch == "sm90" else (next_n,)


def kernel_traits(backend: str, arch: str, heads: int) -> KernelTraits:
    """DeepGEMM SM90: pieces of 1/2/4 rows, float32 logits, relu and a weighted FMA per head.
    DeepGEMM SM100: any rows in Q blocks of 128/heads tokens, bf16 logits, one packed bf16x2
    relu-convert and one HFMA2 per two heads. Triton (ours): any rows, float32, tail cleaned."""
    check_choice("backend", backend, BACKENDS)
    if backend == "triton":
        return KernelTraits(None, 1, 4, 2.0, True, True)
    if arch == "sm100":
        return KernelTraits(None, max(1, 128 // heads), 2, 1.0, False, False)
    return KernelTraits(tuple(sorted(SM90_NATIVE_NEXT_N)), 1, 4, 2.0, False, False)


@dataclass(frozen=True)
class LaunchWork:
    """One launch's work: what the terms above divide."""

    dram_bytes: float
    mma_flops: float
    epilogue_instructions: float
    program: tuple[float, float, float] | None = None  # Triton's largest program: (bytes, flops, instructions)


def _row_context(seq_len: int, next_n: int, row: int) -> int:
    return max(0, seq_len - next_n + 1 + row)


def _padded(rows: int, q_block: int) -> int:
    return -(-rows // q_block) * q_block


def flatten_dram_share(backend: str, gpu: GpuCeilings, rows: int, unique_kv_bytes: float) -> float:
    """Share of flatten's KV re-reads that reach DRAM. DeepGEMM: none while every
    pseudo-request runs at once (rows <= SMs) or the KV fits half the L2, all of them
    otherwise (H200 Nsight Compute: ~next_n x DRAM at B = 128); Triton: its measured share."""
    if backend == "triton":
        return TRITON_FLATTEN_DRAM_SHARE
    fits = rows <= gpu.sms.value or unique_kv_bytes <= gpu.l2_mb.value * 1e6 / 2
    return 0.0 if fits else 1.0


def step_work(
    gpu: GpuCeilings, backend: str, strategy: str, seq_lens: Sequence[int], next_n: int, heads: int, head_dim: int,
    cache_dtype: str = "fp8",
) -> tuple[LaunchWork, ...]:  # fmt: skip
    """The launches of one decode step, uniform decode (every request decodes next_n rows)."""
    traits = kernel_traits(backend, gpu.arch, heads)
    per_token = bytes_per_token(head_dim, cache_dtype)
    side = heads * (head_dim + 4)  # q (fp8) and weight (fp32) bytes of one row
    max_len = max(seq_lens)
    if strategy == "flatten":
        contexts = [_row_context(length, next_n, j) for length in seq_lens for j in range(next_n)]
        unique = sum(seq_lens) * per_token
        reread = (sum(contexts) * per_token - unique) * flatten_dram_share(backend, gpu, len(contexts), unique)
        written = len(contexts) * max_len if traits.cleans_tail else sum(contexts)
        dram = unique + reread + written * traits.logit_bytes + len(contexts) * side
        pairs = sum(contexts) * _padded(1, traits.q_block)
        program = _program(gpu, traits, len(contexts), max_len, 1, per_token, heads, head_dim)
        return (
            LaunchWork(dram, 2 * heads * head_dim * pairs, traits.epilogue_per_head * heads * sum(contexts), program),
        )
    pieces = plan_atoms(next_n, atom_sizes(gpu.arch, next_n)) if strategy == "atom" else (AtomPiece(next_n, 0),)
    if strategy == "native" and traits.native_sizes is not None and next_n not in traits.native_sizes:
        raise ValueError(
            f"next_n={next_n}: {backend} on {gpu.arch} runs {traits.native_sizes} natively; use atom or flatten"
        )
    return tuple(
        _piece_work(gpu, traits, piece, seq_lens, next_n, per_token, side, heads, head_dim) for piece in pieces
    )


def _piece_work(
    gpu: GpuCeilings, traits: KernelTraits, piece: AtomPiece, seq_lens: Sequence[int], next_n: int,
    per_token: int, side: int, heads: int, head_dim: int,
) -> LaunchWork:  # fmt: skip
    """A native launch of `piece.size` rows: each request's KV once, up to its last row's context."""
    last = piece.offset + piece.size - 1
    kv_tokens = sum(_row_context(length, next_n, last) for length in seq_lens)
    real_rows = range(max(piece.offset, 0), last + 1)
    real_contexts = sum(_row_context(length, next_n, j) for length in seq_lens for j in real_rows)
    tile_rows = _padded(piece.size, traits.q_block)
    written = len(seq_lens) * len(real_rows) * max(seq_lens) if traits.cleans_tail else real_contexts
    dram = kv_tokens * per_token + written * traits.logit_bytes + len(seq_lens) * piece.size * side
    # SM100's epilogue loops over a Q block's valid tokens only; SM90's and Triton's over the tile
    epilogue_rows = len(real_rows) if traits.q_block > 1 else tile_rows
    program = _program(gpu, traits, len(seq_lens), max(seq_lens), piece.size, per_token, heads, head_dim)
    return LaunchWork(
        dram, 2 * heads * head_dim * tile_rows * kv_tokens, traits.epilogue_per_head * heads * epilogue_rows * kv_tokens,
        program,
    )  # fmt: skip


def _program(
    gpu: GpuCeilings,
    traits: KernelTraits,
    batch: int,
    max_len: int,
    rows: int,
    per_token: int,
    heads: int,
    head_dim: int,
) -> tuple[float, float, float] | None:
    """Triton's largest program: a run of KV blocks of one request, for all the launch's rows."""
    if not traits.per_program:
        return None
    blocks = blocks_per_program(batch, -(-max_len // BLOCK_SIZE), int(gpu.sms.value))  # the kernel's own rule
    tokens = min(blocks * BLOCK_SIZE, max_len)
    return tokens * per_token, 2 * heads * head_dim * rows * tokens, traits.epilogue_per_head * heads * rows * tokens


TERMS = ("hbm", "fp8_mma", "fp32_epilogue")


def mma_tflops(gpu: GpuCeilings, cache_dtype: str) -> float:
    """The MMA rate that applies: FP8, or MXFP4 (SM100's block-scaled FP4 MMA) for an MXFP4 cache."""
    if cache_dtype == "fp8":
        return gpu.fp8_tflops.value
    if gpu.fp4_tflops is None:
        raise ValueError(f"cache_dtype={cache_dtype!r}: {gpu.name} has no MXFP4 MMA (vLLM accepts it on SM100 only)")
    return gpu.fp4_tflops.value


def spec_us(work: LaunchWork, gpu: GpuCeilings, cache_dtype: str = "fp8") -> dict[str, float]:
    """Each term of a launch at the GPU's spec ceilings, in µs (no efficiency)."""
    return {
        "hbm": work.dram_bytes / (gpu.hbm_tbps.value * 1e6),
        "fp8_mma": work.mma_flops / (mma_tflops(gpu, cache_dtype) * 1e6),
        "fp32_epilogue": work.epilogue_instructions / (gpu.fp32_tflops.value / 2 * 1e6),
    }


def combine(terms: Sequence[float], overlap: float) -> float:
    """p-norm of the terms: p -> infinity is full overlap (the largest wins), p = 1 none."""
    return sum(t**overlap for t in terms) ** (1 / overlap)


def program_spec_us(work: LaunchWork, gpu: GpuCeilings, cache_dtype: str = "fp8") -> tuple[float, float, float]:
    """Triton's largest program's three terms at one SM's share of each spec rate (no efficiency)."""
    if work.program is None:
        return 0.0, 0.0, 0.0
    nbytes, flops, instructions = work.program
    sms = gpu.sms.value
    return (
        nbytes * sms / (gpu.hbm_tbps.value * 1e6),
        flops * sms / (mma_tflops(gpu, cache_dtype) * 1e6),
        instructions * sms / (gpu.fp32_tflops.value / 2 * 1e6),
    )


def _program_us(work: LaunchWork, gpu: GpuCeilings, fit: KernelFit, cache_dtype: str) -> float:
    """The largest program at `serial` x one SM's share, with the fitted efficiencies."""
    hbm, mma, epilogue = program_spec_us(work, gpu, cache_dtype)
    scaled = (hbm / fit.bw, mma / fit.compute, epilogue / fit.compute)
    return combine([t / fit.serial for t in scaled], fit.overlap)


def fit_key(backend: str, strategy: str, next_n: int, arch: str) -> tuple[str, str]:
    """Whose fitted efficiencies apply: a strategy that launches exactly the native kernel
    takes native's. That is next_n = 1 (all three are one single-row launch), an atom plan
    of one native piece, and every strategy of DeepGEMM on SM100, where native, atom and
    flatten all run the one varlen kernel (its padding and re-reads are counted in the work)."""
    one_native_launch = strategy == "atom" and next_n in atom_sizes(arch, next_n)
    if next_n == 1 or one_native_launch or (backend == "deepgemm" and arch == "sm100"):
        return backend, "native"
    return backend, strategy


@dataclass(frozen=True)
class Prediction:
    """A modeled step time, what bounds it, and each ceiling's time; never a measurement."""

    gpu: str
    backend: str
    strategy: str
    batch: int
    mean_context: float
    next_n: int
    heads: int
    head_dim: int
    cache_dtype: str
    time_us: float
    bound: str  # the largest efficiency-scaled term of the longest launch: hbm, fp8_mma, fp32_epilogue, program, launch
    ceiling_us: dict[str, float]  # every launch's terms summed, at spec (no efficiency)
    modeled_us: dict[str, float]  # the same with the fitted efficiencies
    launches: int
    dram_bytes: float
    mma_flops: float
    fit: KernelFit
    source: str = "modeled"
    calibration: str = CALIBRATION
    assumptions: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, object]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("fit", "assumptions")}
        out["efficiencies"] = vars(self.fit).copy()
        out["assumptions"] = list(self.assumptions)
        return out


def shape_extrapolations(backend: str, heads: int, head_dim: int) -> list[str]:
    """A note per shape the backend's kernel does not have (its registered heads and head dims)."""
    from dsa_lab.kernels import get_backend

    kernel = get_backend(backend)
    return [
        f"{name}={value}: {backend}'s kernel has {name} in {allowed}; modeled as an extrapolation, never measured"
        for name, value, allowed in (("heads", heads, kernel.heads), ("head_dim", head_dim, kernel.head_dims))
        if value not in allowed
    ]


def predict(
    gpu: str | GpuCeilings,
    backend: str,
    strategy: str,
    seq_lens: Sequence[int],
    next_n: int,
    heads: int = 64,
    head_dim: int = 128,
    cache_dtype: str = "fp8",
) -> Prediction:
    """Modeled time of one uniform decode step (every request decodes next_n rows). An
    MXFP4 cache (68 B a token, FP4 MMAs) is DeepGEMM's on SM100 only, as in vLLM.

    next_n has the range of every other module (`workload.MAX_NEXT_N`). Judgement: heads
    and head dims the backend's kernel does not have (`shape_extrapolations`) are modeled,
    not refused (the model scales in them), and labelled as an extrapolation in `assumptions`.
    """
    spec = get_gpu(gpu) if isinstance(gpu, str) else gpu
    check_choice("backend", backend, BACKENDS)
    check_choice("strategy", strategy, STRATEGIES)
    next_n = check_range("next_n", next_n, 1, MAX_NEXT_N)
    seq_lens = check_int_sequence("seq_lens", seq_lens, next_n, 1 << 24)
    if not seq_lens:
        raise ValueError("seq_lens: need one cached length >= next_n per request, got none")
    heads = check_range("heads", heads, 1, 1024)
    check_choice("cache_dtype", cache_dtype, ("fp8", "mxfp4"))
    head_dim = check_head_dim(head_dim, cache_dtype)
    if cache_dtype == "mxfp4" and (backend, spec.arch) != ("deepgemm", "sm100"):
        raise ValueError(f"cache_dtype='mxfp4': modeled for DeepGEMM on SM100 only, not {backend} on {spec.name}")
    fit = FITS[fit_key(backend, strategy, next_n, spec.arch)]
    works = step_work(spec, backend, strategy, seq_lens, next_n, heads, head_dim, cache_dtype)
    total, ceiling, modeled, dominant = 0.0, dict.fromkeys(TERMS, 0.0), dict.fromkeys(TERMS, 0.0), (0.0, "launch")
    for work in works:
        at_spec = spec_us(work, spec, cache_dtype)
        scaled = {"hbm": at_spec["hbm"] / fit.bw, "fp8_mma": at_spec["fp8_mma"] / fit.compute,
                  "fp32_epilogue": at_spec["fp32_epilogue"] / fit.compute}  # fmt: skip
        program = _program_us(work, spec, fit, cache_dtype)
        body = max(combine(scaled.values(), fit.overlap), program)
        total += fit.launch_us + body
        for name in TERMS:
            ceiling[name] += at_spec[name]
            modeled[name] += scaled[name]
        candidates = {**scaled, "program": program, "launch": fit.launch_us}
        name = max(candidates, key=candidates.get)
        if fit.launch_us + body > dominant[0]:
            dominant = (fit.launch_us + body, name)
    assumptions = shape_extrapolations(backend, heads, head_dim)
    if spec.arch == "sm100":
        assumptions.append("no SM100 measurement here: H200-fitted efficiencies applied to SM100's ceilings and kernel")
    if (backend, spec.arch) == ("deepgemm", "sm100"):
        assumptions.append("DeepGEMM's SM100 kernel sums relu x weight over heads in bf16 pairs (one CUDA-core "
                           "instruction a head); an FP32 epilogue (two a head) would double fp32_epilogue")  # fmt: skip
    return Prediction(
        spec.name, backend, strategy, len(seq_lens), sum(seq_lens) / len(seq_lens), next_n, heads, head_dim,
        cache_dtype, total, dominant[1], ceiling, modeled, len(works), sum(w.dram_bytes for w in works),
        sum(w.mma_flops for w in works), fit, assumptions=tuple(assumptions),
    )  # fmt: skip
