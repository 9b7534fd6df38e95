"""Modeled time of one paged-MQA-logits decode step, per GPU, backend and strategy.

Every launch of the step costs

    t = launch_us + max(combine(T_hbm, T_mma, T_epilogue), T_program)

where each term is the launch's work at a ceiling of `gpus.GpuCeilings` times an
efficiency fitted on this project's H200 sweeps (each backend's `model_fits`, per strategy):

- T_hbm: DRAM bytes (KV as the kernel really fetches it from DRAM, logits written, q and
  weights) / (HBM bandwidth x `bw`);
- T_mma: FP8 FLOPs of the kernel's MMA tiles (padded rows included) / (FP8 rate x `compute`);
- T_epilogue: CUDA-core instructions of relu x weight summed over heads / (FP32 rate / 2 x
  `compute`); on B200 this is about as large as T_mma, on H200 well below it;
- combine: the p-norm with p = `overlap` (large p: the three overlap; p = 1: they add);
- T_program (a kernel of fixed KV slices, Triton's): its largest program (a fixed run of KV blocks of one request)
  at `serial` times one SM's share of the rates; DeepGEMM spreads work evenly.

How each kernel works decides the counts (each backend's `ModelTraits`, read from its source;
the model names no backend: it reads their descriptors, and `unmodeled` says which it cannot time):
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

from dsa_lab.batch.cache import BLOCK_SIZE, CACHE_DTYPES, bytes_per_token, check_head_dim
from dsa_lab.batch.metadata import STRATEGIES, AtomPiece
from dsa_lab.batch.plan import LaunchPlan
from dsa_lab.batch.workload import MAX_NEXT_N
from dsa_lab.errors import check_choice, check_int_sequence, check_range
from dsa_lab.kernels import backend_names, get_backend, modeled_backends, vllm_backend
from dsa_lab.kernels.descriptor import KernelFit, ModelTraits
from dsa_lab.model.gpus import ARCH_MAJORS, GpuCeilings, get_gpu

BLOCK_TOKENS = BLOCK_SIZE  # tokens a KV block holds (a Triton program's unit): the cache's block


class NotModeled(ValueError):
    """A backend, path or cache the model cannot time, and why (what it lacks, what it has)."""


def fits() -> dict[tuple[str, str], KernelFit]:
    """Every modeled backend's fitted efficiencies, per (backend, strategy) (`LogitsBackend.model_fits`)."""
    return {(name, s): fit for name in modeled_backends() for s, fit in get_backend(name).model_fits.items()}


def calibration_note() -> str:
    """What a prediction's efficiencies are, in words (every row the model makes carries it)."""
    return f"efficiencies fitted on the shipped H200 sweeps ({len(fits())} backend x strategy fits)"


def unmodeled(arch: str) -> dict[str, str]:
    """Every registered backend the model cannot time on `arch` ('sm90', 'sm100'), with why."""
    check_choice("arch", arch, tuple(ARCH_MAJORS))
    out = {}
    for name in backend_names():
        backend = get_backend(name)
        if backend.fuses_topk:
            out[name] = f"backend {name!r} fuses the top-k: its unit is the step, and the model times logits kernels"
        elif not backend.model_traits:
            out[name] = f"backend {name!r} declares no model_traits (how its kernel spends its work)"
        elif arch not in backend.model_traits:
            out[name] = f"backend {name!r} has no kernel on {arch} to model (it models {sorted(backend.model_traits)})"
        elif not backend.model_fits:
            out[name] = (
                f"backend {name!r} declares model_traits but no model_fits (its efficiencies: "
                "`model.calibration.fit_efficiencies` on a run that timed it)"
            )
    return out


def traits(backend: str, arch: str) -> ModelTraits:
    """How `backend`'s kernel on `arch` spends its work, as the backend declares it (`LogitsBackend.model_traits`);
    NotModeled says why for a backend the model cannot time there (`unmodeled`)."""
    check_choice("backend", backend, backend_names())
    why = unmodeled(arch).get(backend)
    if why is not None:
        raise NotModeled(why)
    return get_backend(backend).model_traits[arch]


def native_sizes(backend: str, arch: str) -> tuple[int, ...] | None:
    """The row counts `backend` takes natively on `arch`, as it declares them (None: any)."""
    return get_backend(backend).native_sizes_on(ARCH_MAJORS[arch])


def atom_sizes(backend: str, arch: str, next_n: int) -> tuple[int, ...]:
    """The pieces atom cuts next_n into: the backend's own native row counts on `arch`; for a kernel
    native for any next_n, those of what vLLM runs there (SM90: DeepGEMM's, as the H200 sweep ran
    Triton's atom); else one piece."""
    own = native_sizes(backend, arch)
    return own or vllm_backend().native_sizes_on(ARCH_MAJORS[arch]) or (next_n,)


@dataclass(frozen=True)
class LaunchWork:
    """One launch's work: what the terms above divide."""

    dram_bytes: float
    mma_flops: float
    epilogue_instructions: float
    program: tuple[float, float, float] | None = None  # the largest fixed KV slice: (bytes, flops, instructions)


def _padded(rows: int, q_block: int) -> int:
    return -(-rows // q_block) * q_block


def flatten_dram_share(backend: str, gpu: GpuCeilings, rows: int, unique_kv_bytes: float) -> float:
    """Share of flatten's KV re-reads that reach DRAM: the backend's measured share where it declares
    one (Triton's); otherwise none while every pseudo-request runs at once (rows <= SMs) or the KV
    fits half the L2, all of them otherwise (DeepGEMM on the H200, Nsight Compute: ~next_n x DRAM at B = 128)."""
    measured = traits(backend, gpu.arch).flatten_dram_share
    if measured is not None:
        return measured
    fits = rows <= gpu.sms.value or unique_kv_bytes <= gpu.l2_mb.value * 1e6 / 2
    return 0.0 if fits else 1.0


def step_work(
    gpu: GpuCeilings,
    backend: str,
    strategy: str,
    seq_lens: Sequence[int],
    next_n: int,
    heads: int,
    head_dim: int,
    cache_dtype: str = "fp8",
) -> tuple[LaunchWork, ...]:
    """The launches of one uniform decode step (every request decodes next_n rows), read from its
    `LaunchPlan`: its pieces, its row contexts and its KV tokens."""
    kernel = traits(backend, gpu.arch)
    native = native_sizes(backend, gpu.arch)
    if strategy == "native" and native is not None and next_n not in native:
        raise NotModeled(f"next_n={next_n}: {backend} on {gpu.arch} runs {native} natively; use atom or flatten")
    sizes = atom_sizes(backend, gpu.arch, next_n)
    plan = LaunchPlan(tuple(seq_lens), next_n, strategy, heads, head_dim, cache_dtype, sizes)
    per_token = bytes_per_token(head_dim, cache_dtype)
    side = heads * (head_dim + 4)  # q (fp8) and weight (fp32) bytes of one row
    cleans = get_backend(backend).cleans_tail
    max_len = max(seq_lens)
    if strategy == "flatten":
        rows, contexts = plan.kernel_rows, sum(plan.row_contexts())
        unique = plan.cost.unique_kv_bytes
        reread = (plan.cost.strategy_kv_bytes - unique) * flatten_dram_share(backend, gpu, rows, unique)
        written = rows * max_len if cleans else contexts
        dram = unique + reread + written * kernel.logit_bytes + rows * side
        pairs = contexts * _padded(1, kernel.q_block(heads))
        program = _program(gpu, kernel, rows, max_len, 1, per_token, heads, head_dim)
        return (LaunchWork(dram, 2 * heads * head_dim * pairs, kernel.epilogue_per_head * heads * contexts, program),)
    return tuple(_piece_work(gpu, kernel, cleans, plan, piece, per_token, side) for piece in plan.pieces)


def _piece_work(
    gpu: GpuCeilings, kernel: ModelTraits, cleans: bool, plan: LaunchPlan, piece: AtomPiece, per_token: int, side: int
) -> LaunchWork:
    """A native launch of `piece.size` rows: each request's KV once, up to its last row's context."""
    kv_tokens = plan.piece_kv_tokens(piece)
    real_rows = plan.piece_rows(piece)
    real_contexts = sum(plan.row_contexts(real_rows))
    heads, head_dim, batch, max_len = plan.heads, plan.head_dim, plan.batch, max(plan.seq_lens)
    tile_rows = _padded(piece.size, kernel.q_block(heads))
    written = batch * len(real_rows) * max_len if cleans else real_contexts
    dram = kv_tokens * per_token + written * kernel.logit_bytes + batch * piece.size * side
    epilogue_rows = len(real_rows) if kernel.epilogue_over_valid_rows else tile_rows
    program = _program(gpu, kernel, batch, max_len, piece.size, per_token, heads, head_dim)
    mma = 2 * heads * head_dim * tile_rows * kv_tokens
    return LaunchWork(dram, mma, kernel.epilogue_per_head * heads * epilogue_rows * kv_tokens, program)


def _program(
    gpu: GpuCeilings,
    kernel: ModelTraits,
    batch: int,
    max_len: int,
    rows: int,
    per_token: int,
    heads: int,
    head_dim: int,
) -> tuple[float, float, float] | None:
    """The largest program of a kernel of fixed KV slices (Triton's): a run of KV blocks of one request,
    for all the launch's rows, sized by the kernel's own rule (`ModelTraits.program_blocks`)."""
    if kernel.program_blocks is None:
        return None
    blocks = kernel.program_blocks(batch, -(-max_len // BLOCK_TOKENS), int(gpu.sms.value))
    tokens = min(blocks * BLOCK_TOKENS, max_len)
    return tokens * per_token, 2 * heads * head_dim * rows * tokens, kernel.epilogue_per_head * heads * rows * tokens


TERMS = ("hbm", "fp8_mma", "fp32_epilogue")


def mma_tflops(gpu: GpuCeilings, cache_dtype: str) -> float:
    """The MMA rate that applies: FP8, or MXFP4 (SM100's block-scaled FP4 MMA) for an MXFP4 cache."""
    if cache_dtype == "fp8":
        return gpu.fp8_tflops.value
    if gpu.fp4_tflops is None:
        raise NotModeled(f"cache_dtype={cache_dtype!r}: {gpu.name} has no MXFP4 MMA (vLLM accepts it on SM100 only)")
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
    of one native piece, and every strategy of a backend whose strategies all run one kernel
    (`ModelTraits.one_kernel`: DeepGEMM's varlen kernel on SM100; its padding and re-reads are
    counted in the work)."""
    one_native_launch = strategy == "atom" and next_n in atom_sizes(backend, arch, next_n)
    if next_n == 1 or one_native_launch or traits(backend, arch).one_kernel:
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
    calibration: str = field(default_factory=calibration_note)
    assumptions: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, object]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("fit", "assumptions")}
        out["efficiencies"] = vars(self.fit).copy()
        out["assumptions"] = list(self.assumptions)
        return out


def shape_extrapolations(backend: str, heads: int, head_dim: int) -> list[str]:
    """A note per shape the backend's kernel does not have (its registered heads and head dims)."""
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
    kernel = traits(backend, spec.arch)
    check_choice("strategy", strategy, STRATEGIES)
    next_n = check_range("next_n", next_n, 1, MAX_NEXT_N)
    seq_lens = check_int_sequence("seq_lens", seq_lens, next_n, 1 << 24)
    if not seq_lens:
        raise ValueError("seq_lens: need one cached length >= next_n per request, got none")
    heads = check_range("heads", heads, 1, 1024)
    check_choice("cache_dtype", cache_dtype, CACHE_DTYPES)
    head_dim = check_head_dim(head_dim, cache_dtype)
    if cache_dtype not in kernel.cache_dtypes:
        raise NotModeled(f"cache_dtype={cache_dtype!r}: {backend} on {spec.name} is modeled for {kernel.cache_dtypes}")
    key = fit_key(backend, strategy, next_n, spec.arch)
    fitted = get_backend(backend).model_fits
    if key[1] not in fitted:
        raise NotModeled(f"backend={backend!r}, strategy={key[1]!r}: no fitted efficiencies (fitted: {sorted(fitted)})")
    fit = fitted[key[1]]
    works = step_work(spec, backend, strategy, seq_lens, next_n, heads, head_dim, cache_dtype)
    total, ceiling, modeled, dominant = 0.0, dict.fromkeys(TERMS, 0.0), dict.fromkeys(TERMS, 0.0), (0.0, "launch")
    for work in works:
        at_spec = spec_us(work, spec, cache_dtype)
        scaled = {
            "hbm": at_spec["hbm"] / fit.bw,
            "fp8_mma": at_spec["fp8_mma"] / fit.compute,
            "fp32_epilogue": at_spec["fp32_epilogue"] / fit.compute,
        }
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
    if kernel.assumption:
        assumptions.append(kernel.assumption)
    return Prediction(
        spec.name,
        backend,
        strategy,
        len(seq_lens),
        sum(seq_lens) / len(seq_lens),
        next_n,
        heads,
        head_dim,
        cache_dtype,
        total,
        dominant[1],
        ceiling,
        modeled,
        len(works),
        sum(w.dram_bytes for w in works),
        sum(w.mma_flops for w in works),
        fit,
        assumptions=tuple(assumptions),
    )
