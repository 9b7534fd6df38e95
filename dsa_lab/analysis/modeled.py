"""Modeled rows: roofline times for the points a run measured, a grid, or a GPU we do not have.

Every row says `source='modeled'` and carries the plan's bytes and FLOPs at a GPU's
ceilings (`roofline.modeled_time` over a `plan.LaunchPlan`); charts draw them dashed and
labelled, never mixed with measured rows. Atom pieces are SM90 DeepGEMM's (`SM90_NATIVE_SIZES`, as its
backend declares them) unless `native_sizes` says otherwise (a kernel native for every next_n: `plan.ANY_NEXT_N`).

SM100 (`calibrated_rows`): the calibrated model's rows (`dsa_lab.model.indexer.predict`, H200-fitted
efficiencies at B200/GB200 ceilings), labelled; which SM100 run a section shows instead, when there is one, is
chosen by `dsa_lab.notebook.sm100`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from dsa_lab import axes
from dsa_lab.analysis.frames import POINT, measured_ok, ok_rows
from dsa_lab.batch.metadata import STRATEGIES
from dsa_lab.batch.plan import ANY_NEXT_N, LaunchPlan
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.bench.point import Point
from dsa_lab.kernels import modeled_backends, vllm_backend
from dsa_lab.model.gpus import ARCH_MAJORS
from dsa_lab.model.roofline import GpuSpec, floor_ms, get_gpu, modeled_time
from dsa_lab.policy.vllm import Platform

SM90_NATIVE_SIZES = vllm_backend().native_sizes_on(ARCH_MAJORS["sm90"])  # SM90 DeepGEMM's (what vLLM runs there)


def _modeled_row(
    backend: str,
    values: Mapping[str, Any],
    gpu: GpuSpec,
    seed: int,
    native_sizes: Sequence[int] = SM90_NATIVE_SIZES,
) -> dict[str, object]:
    """The modeled row of the step a point's axes describe (`values`: strategy and the point's axes; those
    it does not give at their defaults): its plan (`Point.plan`: the acceptance's rows, the logits width)
    at `gpu`'s ceilings. `seed` must be the run's, so drawn lengths and rows are the run's."""
    point = Point(
        backend=backend, **{name: values[name] for name in axes.NAMES if name in values and name != "backend"}
    )
    plan = point.plan(point.seq_lens(seed), native_sizes, seed)
    modeled = modeled_time(plan, gpu)
    floor, _ = floor_ms(plan.cost, gpu)
    ms = modeled.time_ms
    return {
        **point.axes(),
        "status": "ok",
        "source": "modeled",
        "median_ms": ms,
        "p25_ms": ms,
        "p75_ms": ms,
        "iqr_ms": 0.0,
        "roofline_gpu": gpu.name,
        "unique_bytes": modeled.cost.unique_bytes,
        "strategy_bytes": modeled.cost.strategy_bytes,
        "flops": modeled.cost.flops,
        "floor_ms": floor,
        "achieved_tbps": modeled.cost.strategy_bytes / (ms * 1e9),
        "achieved_tflops": modeled.cost.flops / (ms * 1e9),
        "fraction_of_floor": floor / ms,
    }


def modeled_rows_like(results: pd.DataFrame, gpu: GpuSpec, seed: int) -> pd.DataFrame:
    """One modeled row per measured point and strategy (every point axis, the serving step's included): the
    strategy's bytes and FLOPs at `gpu`'s ceilings (atom pieces as SM90 DeepGEMM plans them), backend
    'model (<gpu>)'. `seed` must be the run's, so mixed contexts and acceptance draws are the run's."""
    points = ok_rows(results)[["strategy", *POINT]].drop_duplicates().to_dict("records")
    return pd.DataFrame([_modeled_row(f"model ({gpu.name})", values, gpu, seed) for values in points])


def modeled_grid(
    batches: Sequence[int],
    contexts: Sequence[str],
    next_ns: Sequence[int],
    gpu: GpuSpec,
    seed: int = 0,
    native_sizes: Sequence[int] = SM90_NATIVE_SIZES,
    heads: int = 64,
    head_dim: int = 128,
    cache_dtype: str = "fp8",
) -> pd.DataFrame:
    """Modeled rows for a grid, as `modeled_rows_like`, for what a kernel native for
    `native_sizes` (SM90 DeepGEMM's by default) can run: flatten always, native where
    next_n is native, atom where it is not."""
    rows, shape = [], {"heads": heads, "head_dim": head_dim, "cache_dtype": cache_dtype}
    for batch in batches:
        for context in map(ContextSpec.parse, contexts):
            for n in next_ns:
                for strategy in ("native", "flatten") if n in native_sizes else ("atom", "flatten"):
                    values = {"strategy": strategy, "batch": batch, "context": context.label, "next_n": n, **shape}
                    rows.append(_modeled_row(f"model ({gpu.name})", values, gpu, seed, native_sizes))
    return pd.DataFrame(rows)


def modeled_native_rows(frame: pd.DataFrame, gpus: Sequence[GpuSpec | str], seed: int) -> pd.DataFrame:
    """Roofline rows (source 'modeled', backend 'model (<gpu>)') for a native kernel at every
    measured (batch, context, next_n): KV read once, as SM100 DeepGEMM runs any next_n natively.
    `seed` must be the run's, so mixed contexts get the same lengths."""
    shapes = measured_ok(frame).assign(strategy="native")
    parts = [modeled_rows_like(shapes, get_gpu(g) if isinstance(g, str) else g, seed) for g in gpus]
    return pd.concat(parts, ignore_index=True)


def modeled_reread(
    batch: int, context: str | int, next_ns: Sequence[int], native_sizes: Sequence[int] = SM90_NATIVE_SIZES
) -> pd.DataFrame:
    """KV bytes each strategy reads per unique KV byte, from the launch plan (modeled, no L2)."""
    seq_lens = ContextSpec.parse(context).seq_lens(batch, 0)
    rows = []
    for next_n in next_ns:
        for strategy in STRATEGIES:
            cost = LaunchPlan(seq_lens, next_n, strategy, native_sizes=tuple(native_sizes)).cost
            rows.append(
                {
                    "next_n": next_n,
                    "strategy": strategy,
                    "source": "modeled",
                    "kv_read_per_unique": cost.strategy_kv_bytes / cost.unique_kv_bytes,
                }
            )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- SM100: measured when a run exists, else modeled

SM100_PLATFORM = Platform("sm100", True)  # vLLM 0.33 on SM100 with DeepGEMM: the varlen call, i.e. our 'native'
SM100_GPUS = ("B200", "GB200")
SM100_STRATEGIES = ("native", "flatten")  # atom on SM100 is the native launch (any next_n is native there)
SERVING_AXES = tuple(a for a in axes.AXES if a.role == "point" and not a.stored_always)  # the step's later axes


def _points(points: pd.DataFrame | None) -> pd.DataFrame:
    """The points (`frames.POINT`) to model: `points`' timed rows, or the sm100 preset's grid."""
    if points is None:
        from dsa_lab.bench.presets import preset

        return pd.DataFrame([p.axes() for p in preset("sm100").points()])[POINT].drop_duplicates()
    return ok_rows(points)[POINT].drop_duplicates().reset_index(drop=True)


def calibrated_rows(
    points: pd.DataFrame | None = None,
    gpus: Sequence[str] = SM100_GPUS,
    seed: int = 0,
    backends: Sequence[str] | None = None,
    strategies: Sequence[str] = SM100_STRATEGIES,
) -> pd.DataFrame:
    """The calibrated model's step times (`model.indexer.predict`), one row per GPU x backend x strategy
    x point, in a run's columns: status 'ok', `source='modeled'`, backend 'model (<gpu>, <backend>)'
    (the charts' label for a modeled series; `modeled_backend` and `gpu` name them apart), `bound`,
    and the plan's bytes and FLOPs (a kernel native for any next_n). Points: the timed (batch,
    context, next_n) of `points` (e.g. the H200 run, so bars line up), else the sm100 preset's
    grid; `seed` must be that run's, so mixed contexts get the same lengths. Only points whose serving
    axes are at their old-run values: the model predicts a uniform step's logits, at the batch's width,
    timed eagerly. What the model cannot time (a backend with no kernel on a GPU's architecture, a path
    or cache it lacks) is named, never dropped in silence: `frame.attrs['not_modeled']`, one line each."""
    from dsa_lab.model.indexer import NotModeled, calibration_note, predict

    backends = modeled_backends() if backends is None else backends
    rows, not_modeled, outside = [], set(), 0
    for k in _points(points).itertuples():
        serving = {a.name: getattr(k, a.name, a.old_value) for a in SERVING_AXES}
        if not axes.at_old_setting(serving, [a.name for a in SERVING_AXES]):
            outside += 1  # outside the calibrated model's domain: named below
            continue
        seq_lens = ContextSpec.parse(k.context).seq_lens(int(k.batch), seed)
        for strategy in strategies:
            cost = LaunchPlan(
                tuple(seq_lens), int(k.next_n), strategy, int(k.heads), int(k.head_dim), k.cache_dtype, ANY_NEXT_N
            ).cost
            for gpu in gpus:
                for backend in backends:
                    try:
                        p = predict(
                            gpu,
                            backend,
                            strategy,
                            seq_lens,
                            int(k.next_n),
                            int(k.heads),
                            int(k.head_dim),
                            k.cache_dtype,
                        )
                    except NotModeled as why:  # a kernel, path or cache the model has not for this GPU
                        not_modeled.add(str(why))
                        continue
                    ms = p.time_us / 1e3
                    rows.append(
                        {
                            "backend": f"model ({gpu}, {backend})",
                            "modeled_backend": backend,
                            "gpu": gpu,
                            "strategy": strategy,
                            "batch": int(k.batch),
                            "context": k.context,
                            "next_n": int(k.next_n),
                            "heads": int(k.heads),
                            "head_dim": int(k.head_dim),
                            "cache_dtype": k.cache_dtype,
                            **serving,
                            "status": "ok",
                            "source": "modeled",
                            "median_ms": ms,
                            "p25_ms": ms,
                            "p75_ms": ms,
                            "iqr_ms": 0.0,
                            "bound": p.bound,
                            "model": calibration_note(),
                            "unique_bytes": cost.unique_bytes,
                            "strategy_bytes": cost.strategy_bytes,
                            "flops": cost.flops,
                        }
                    )
    if outside:
        not_modeled.add(
            f"{outside} of the run's points lie outside the calibrated model's domain (a uniform step's logits at the "
            "batch's width, timed with CUDA events, no acceptance curve)"
        )
    frame = pd.DataFrame(rows)
    frame.attrs["not_modeled"] = sorted(not_modeled)
    return frame
