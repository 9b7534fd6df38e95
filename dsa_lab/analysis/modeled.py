"""Modeled rows: roofline times for the points a run measured, a grid, or a GPU we do not have.

Every row says `source='modeled'` and carries the plan's bytes and FLOPs at a GPU's
ceilings (`roofline.modeled_time` over a `plan.LaunchPlan`); charts draw them dashed and
labelled, never mixed with measured rows. Atom pieces are SM90 DeepGEMM's (1, 2, 4) unless
`native_sizes` says otherwise (a kernel native for every next_n: `plan.ANY_NEXT_N`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from dsa_lab.analysis.frames import measured_ok, ok_rows
from dsa_lab.metadata import STRATEGIES
from dsa_lab.plan import SM90_DEEPGEMM_SIZES, LaunchPlan
from dsa_lab.roofline import GpuSpec, floor_ms, get_gpu, modeled_time
from dsa_lab.workload import ContextSpec

SM90_NATIVE_SIZES = SM90_DEEPGEMM_SIZES


def _modeled_row(
    backend: str, batch: int, context: str, seq_lens: Sequence[int], next_n: int, strategy: str,
    gpu: GpuSpec, heads: int, head_dim: int, cache_dtype: str, native_sizes: Sequence[int] = SM90_NATIVE_SIZES,
) -> dict[str, object]:  # fmt: skip
    plan = LaunchPlan(tuple(seq_lens), next_n, strategy, heads, head_dim, cache_dtype, tuple(native_sizes))
    point = modeled_time(plan, gpu)
    floor, _ = floor_ms(plan.cost, gpu)
    ms = point.time_ms
    return {
        "backend": backend, "strategy": strategy, "batch": batch, "context": context, "next_n": next_n,
        "cache_dtype": cache_dtype, "heads": heads, "head_dim": head_dim, "status": "ok", "source": "modeled",
        "median_ms": ms, "p25_ms": ms, "p75_ms": ms, "iqr_ms": 0.0, "roofline_gpu": gpu.name,
        "unique_bytes": point.cost.unique_bytes, "strategy_bytes": point.cost.strategy_bytes,
        "flops": point.cost.flops,
        "floor_ms": floor, "achieved_tbps": point.cost.strategy_bytes / (ms * 1e9),
        "achieved_tflops": point.cost.flops / (ms * 1e9), "fraction_of_floor": floor / ms,
    }  # fmt: skip


def modeled_rows_like(results: pd.DataFrame, gpu: GpuSpec, seed: int) -> pd.DataFrame:
    """One modeled row per measured (batch, context, next_n, strategy, shape): the strategy's
    bytes and FLOPs at `gpu`'s ceilings (atom pieces as SM90 DeepGEMM plans them), backend
    'model (<gpu>)'. `seed` must be the run's, so mixed contexts get the same lengths."""
    keys = ["strategy", "batch", "context", "next_n", "heads", "head_dim", "cache_dtype"]
    rows = [
        _modeled_row(f"model ({gpu.name})", k.batch, k.context, ContextSpec.parse(k.context).seq_lens(k.batch, seed),
                     k.next_n, k.strategy, gpu, k.heads, k.head_dim, k.cache_dtype)
        for k in ok_rows(results)[keys].drop_duplicates().itertuples()
    ]  # fmt: skip
    return pd.DataFrame(rows)


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
    rows = []
    for batch in batches:
        for context in map(ContextSpec.parse, contexts):
            seq_lens = context.seq_lens(batch, seed)
            for n in next_ns:
                for strategy in ("native", "flatten") if n in native_sizes else ("atom", "flatten"):
                    rows.append(_modeled_row(f"model ({gpu.name})", batch, context.label, seq_lens, n, strategy,
                                             gpu, heads, head_dim, cache_dtype, native_sizes))  # fmt: skip
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
            rows.append({"next_n": next_n, "strategy": strategy, "source": "modeled",
                         "kv_read_per_unique": cost.strategy_kv_bytes / cost.unique_kv_bytes})  # fmt: skip
    return pd.DataFrame(rows)
