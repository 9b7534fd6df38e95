"""Time floors of one paged-MQA-logits decode step: a GPU table, floors, modeled times.

The bytes and FLOPs come from the step's `plan.LaunchPlan` (computed once there): what
*must* move (each request's KV once, the valid logits written once, q and weights read
once) and what a strategy *does* read (flatten re-reads a request's KV once per query
row, atom once per piece). Floors use a GPU table whose rows say where each number comes
from; times for GPUs we do not have are *modeled* and labelled `source='modeled'`, never
mixed with measured rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dsa_lab.batch.plan import LaunchPlan, StepCost
from dsa_lab.errors import check_choice
from dsa_lab.model import gpus as model_gpus


@dataclass(frozen=True)
class GpuSpec:
    """Ceilings of one GPU: HBM bandwidth and dense FP8 tensor throughput, with sources."""

    name: str
    hbm_tbps: float
    fp8_tflops: float
    source: str  # where the numbers come from
    measured: bool = False


def from_model(name: str) -> GpuSpec:
    """A roofline row read from `dsa_lab.model.gpus`, the one table of the GPUs the model covers:
    its spec HBM bandwidth and dense FP8 rate, with their sources."""
    gpu = model_gpus.get_gpu(name)
    return GpuSpec(name, gpu.hbm_tbps.value, gpu.fp8_tflops.value, f"{gpu.hbm_tbps.source}; {gpu.fp8_tflops.source}")


def measured_from_model(name: str) -> GpuSpec:
    """The row of what this project measured on `name` (its sustained read and FP8 GEMM rate), kept
    beside the spec in `dsa_lab.model.gpus` with the run that measured them: one set of H200 ceilings."""
    gpu = model_gpus.get_gpu(name)
    hbm, fp8 = gpu.measured["hbm_tbps"], gpu.measured["fp8_tflops"]
    return GpuSpec(f"{name}-measured", hbm.value, fp8.value, f"{hbm.source}; {fp8.source}", measured=True)


# H200, B200 and GB200 come from model.gpus (B200's 7.67 TB/s: the driver's 7680-bit bus x 3996 MHz x 2,
# not the datasheet's rounded 8), and so do the H200's measured ceilings; H100 is kept here.
GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec(
            "H100",
            3.35,
            1979.0,
            "NVIDIA H100 SXM datasheet: 3.35 TB/s HBM3, 3,958 TFLOPS FP8 with sparsity (half dense)",
        ),
        *(from_model(name) for name in model_gpus.GPUS),
        measured_from_model("H200"),
    )
}


def get_gpu(name: str) -> GpuSpec:
    check_choice("gpu", name, tuple(GPUS))
    return GPUS[name]


def floor_ms(cost: StepCost, gpu: GpuSpec, strategy_bytes: bool = False) -> tuple[float, str]:
    """max(bytes / bandwidth, FLOPs / peak) in ms, and which term bounds it ('memory'/'compute')."""
    moved = cost.strategy_bytes if strategy_bytes else cost.unique_bytes
    memory_ms = moved / (gpu.hbm_tbps * 1e12) * 1e3
    compute_ms = cost.flops / (gpu.fp8_tflops * 1e12) * 1e3
    return (memory_ms, "memory") if memory_ms >= compute_ms else (compute_ms, "compute")


def gpu_for_device(device_name: str, ceilings: dict[str, float] | None = None) -> GpuSpec | None:
    """Ceilings to judge a device by: those measured in this run, else the table's row for its name."""
    if ceilings:
        return GpuSpec(
            f"{device_name} (this run)",
            ceilings["read_tbps"],
            ceilings["fp8_tflops"],
            "measured at the start of this run (see provenance 'ceilings')",
            measured=True,
        )
    upper = device_name.upper()
    if "H200" in upper:
        return GPUS["H200-measured"]
    for name in ("GB200", "B200", "H100"):
        if name in upper:
            return GPUS[name]
    return None


def roofline_columns(
    cost: StepCost, median_ms: float | None, gpu: GpuSpec | None, cleans_tail: bool = False
) -> dict[str, float | int | str | None]:
    """The per-row roofline columns of a point: rates None when untimed, floor None without a GPU row.

    `moved_bytes` is what the launches of a backend that does (or does not) clean the tail move
    (`StepCost.moved_bytes`: re-reads, filler rows and, for a kernel that cleans, every column up to the
    logits' width), and `achieved_tbps` is that over the time; `strategy_bytes` counts each real row's
    logits only, whatever the kernel writes (the modeled rows' bytes)."""
    floor, bound = floor_ms(cost, gpu) if gpu is not None else (None, None)
    timed = median_ms is not None and median_ms > 0
    moved = cost.moved_bytes(cleans_tail)
    return {
        "unique_bytes": cost.unique_bytes,
        "strategy_bytes": cost.strategy_bytes,
        "moved_bytes": moved,
        "logit_bytes": cost.logit_bytes(cleans_tail),
        "flops": cost.flops,
        "roofline_gpu": gpu.name if gpu is not None else None,
        "floor_ms": floor,
        "floor_bound": bound,
        "achieved_tbps": moved / (median_ms * 1e9) if timed else None,
        "effective_tbps": cost.unique_bytes / (median_ms * 1e9) if timed else None,
        "achieved_tflops": cost.flops / (median_ms * 1e9) if timed else None,
        "fraction_of_floor": floor / median_ms if timed and floor is not None else None,
    }


@dataclass(frozen=True)
class ModeledPoint:
    """A time for a GPU we did not measure: the strategy's bytes and FLOPs at the GPU's ceilings."""

    shape: LaunchPlan
    gpu: str
    time_ms: float
    bound: str
    cost: StepCost
    source: str = "modeled"


def modeled_time(shape: LaunchPlan, gpu: GpuSpec | str) -> ModeledPoint:
    """Roofline time of the strategy as it reads (re-reads included): a lower bound, not a measurement."""
    if not isinstance(shape, LaunchPlan):
        raise ValueError(f"plan: expected a LaunchPlan, got {type(shape).__name__}")
    spec = get_gpu(gpu) if isinstance(gpu, str) else gpu
    cost = shape.cost
    time, bound = floor_ms(cost, spec, strategy_bytes=True)
    return ModeledPoint(shape, spec.name, time, bound, cost)


def modeled_rows(shapes: Sequence[LaunchPlan], gpus: Sequence[str]) -> list[dict[str, object]]:
    """Flat records of `modeled_time` for every shape on every GPU, each tagged source='modeled'."""
    rows = []
    for shape in shapes:
        for name in gpus:
            point = modeled_time(shape, name)
            rows.append(
                {
                    "source": point.source,
                    "gpu": point.gpu,
                    "batch": len(shape.seq_lens),
                    "mean_seq_len": sum(shape.seq_lens) / len(shape.seq_lens),
                    "next_n": shape.next_n,
                    "strategy": shape.strategy,
                    "heads": shape.heads,
                    "head_dim": shape.head_dim,
                    "cache_dtype": shape.cache_dtype,
                    "modeled_ms": point.time_ms,
                    "bound": point.bound,
                    "unique_bytes": point.cost.unique_bytes,
                    "strategy_bytes": point.cost.strategy_bytes,
                    "flops": point.cost.flops,
                    "launches": point.cost.launches,
                    "kernel_rows": point.cost.kernel_rows,
                }
            )
    return rows
