"""Where the performance model's numbers come from, and how far it is from measurements.

- `fit_efficiencies`: a grid search of each backend x strategy's `KernelFit` on a measured
  sweep (least squares on log time); each backend's `model_fits` are its answer on the shipped
  H200 sweep that timed it, and tests fit again to check they still are.
- `reread_table`: DRAM bytes over unique KV bytes per profiled kernel, from the shipped
  Nsight Compute table: how much of flatten's re-reading really reaches DRAM.
- `h200_errors`: the model against every measured H200 point.
- `trtllm_13219`: the model against published SM100 times (DeepGEMM's and TensorRT-LLM's
  CuTe kernel, next_n = 3), the only SM100 measurements this project can check against.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from dsa_lab import axes
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.kernels import vllm_backend
from dsa_lab.kernels.descriptor import KernelFit
from dsa_lab.model.gpus import GpuCeilings, get_gpu
from dsa_lab.model.indexer import fit_key, fits, predict, program_spec_us, spec_us, step_work, traits

FIT_GRID = {
    "bw": np.round(np.arange(0.5, 1.0001, 0.05), 3),
    "compute": np.round(np.arange(0.2, 0.9001, 0.025), 3),
    "launch_us": np.arange(3.0, 8.01, 0.5),
    "overlap": np.array([1.5, 2.0, 3.0, 4.0, 8.0]),
    "serial": np.array([0.2, 0.3, 0.4, 0.5, 0.7, 1.0]),  # kernels of fixed KV slices (Triton's) only; others keep 1
}
# TensorRT-LLM PR #13219 (SM100, next_n = 3, FP8 cache, 64 heads): (batch, context) -> (CuTe DSL µs, DeepGEMM µs),
# as its description's table gives them (the rows shown in the PR's text; the B = 16, 32K row is cut off there).
TRTLLM_13219 = {
    (1, 4096): (4.2, 3.6),
    (2, 4096): (4.2, 3.7),
    (4, 4096): (4.3, 4.1),
    (8, 4096): (4.3, 4.8),
    (16, 4096): (5.3, 5.9),
    (32, 4096): (7.1, 8.2),
    (1, 8192): (4.2, 3.8),
    (2, 8192): (4.2, 4.2),
    (4, 8192): (4.4, 4.8),
    (8, 8192): (5.3, 5.9),
    (16, 8192): (7.0, 8.1),
    (32, 8192): (10.1, 12.3),
    (1, 16384): (4.2, 4.2),
    (2, 16384): (4.4, 4.9),
    (4, 16384): (5.3, 5.9),
    (8, 16384): (7.0, 8.1),
    (16, 16384): (10.1, 12.2),
    (32, 16384): (16.5, 20.3),
    (1, 32768): (4.4, 4.8),
    (2, 32768): (5.3, 6.0),
    (4, 32768): (7.0, 8.1),
    (8, 32768): (10.0, 12.1),
}
TRTLLM_SOURCE = "TensorRT-LLM PR #13219 (CuTe DSL FP8 paged MQA logits), Blackwell SM100, next_n = 3"


def measured_points(results: pd.DataFrame, seed: int) -> pd.DataFrame:
    """The timed rows of a sweep with their per-request lengths (mixed contexts re-drawn with the run's seed)."""
    ok = results[(results["status"] == "ok") & results["median_ms"].notna()].copy()
    ok["seq_lens"] = [ContextSpec.parse(c).seq_lens(int(b), seed) for c, b in zip(ok["context"], ok["batch"])]
    ok["measured_us"] = ok["median_ms"] * 1e3
    return ok.reset_index(drop=True)


def _terms(points: pd.DataFrame, gpu: GpuCeilings) -> tuple[np.ndarray, np.ndarray]:
    """Per launch: the three spec-time terms and Triton's largest program at one SM's full share;
    and each launch's point index."""
    rows, owner = [], []
    for i, p in enumerate(points.itertuples()):
        for work in step_work(gpu, p.backend, p.strategy, p.seq_lens, p.next_n, p.heads, p.head_dim):
            spec = spec_us(work, gpu)
            rows.append([spec["hbm"], spec["fp8_mma"], spec["fp32_epilogue"], *program_spec_us(work, gpu)])
            owner.append(i)
    return np.array(rows), np.array(owner)


def fit_efficiencies(points: pd.DataFrame, gpu: str = "H200") -> dict[tuple[str, str], KernelFit]:
    """Grid search per backend x strategy: the `KernelFit` whose modeled times have the least
    mean squared log error against the measured ones (`points` from `measured_points`).
    A point counts for the fit the model will use for it (`indexer.fit_key`): next_n = 1
    and one-piece atom plans are native launches."""
    spec = get_gpu(gpu)
    keys = pd.Series([fit_key(p.backend, p.strategy, p.next_n, spec.arch) for p in points.itertuples()])
    fits = {}
    for (backend, strategy), group in points.groupby(keys.to_numpy()):
        terms, owner = _terms(group.reset_index(drop=True), spec)
        measured = np.log(group["measured_us"].to_numpy())
        bw, compute, launch = np.meshgrid(FIT_GRID["bw"], FIT_GRID["compute"], FIT_GRID["launch_us"], indexing="ij")
        bw, compute, launch = bw.ravel()[:, None], compute.ravel()[:, None], launch.ravel()[:, None]
        fixed_slices = traits(backend, spec.arch).program_blocks is not None
        serials = FIT_GRID["serial"] if fixed_slices else np.array([1.0])
        best = (np.inf, None)
        for overlap, serial in itertools.product(FIT_GRID["overlap"], serials):
            scaled = [terms[:, 0] / bw, terms[:, 1] / compute, terms[:, 2] / compute]
            body = sum(t**overlap for t in scaled) ** (1 / overlap)
            program = sum((terms[:, k + 3] / ((bw, compute, compute)[k] * serial)) ** overlap for k in range(3)) ** (
                1 / overlap
            )
            per_launch = launch + np.maximum(body, program)
            modeled = np.zeros((per_launch.shape[0], len(group)))
            np.add.at(modeled.T, owner, per_launch.T)
            loss = ((np.log(modeled) - measured) ** 2).mean(axis=1)
            k = int(loss.argmin())
            if loss[k] < best[0]:
                best = (
                    loss[k],
                    KernelFit(
                        float(bw[k, 0]), float(compute[k, 0]), float(launch[k, 0]), float(overlap), float(serial)
                    ),
                )
        fits[backend, strategy] = best[1]
    return fits


def h200_errors(points: pd.DataFrame) -> pd.DataFrame:
    """Every measured point with its modeled time and the relative error (modeled / measured - 1)."""
    modeled = [
        predict("H200", p.backend, p.strategy, p.seq_lens, p.next_n, p.heads, p.head_dim).time_us
        for p in points.itertuples()
    ]
    out = points[[*(name for name in axes.NAMES if name in points), "measured_us"]].copy()
    out["modeled_us"] = modeled
    out["error"] = out["modeled_us"] / out["measured_us"] - 1
    return out


def error_summary(errors: pd.DataFrame) -> pd.DataFrame:
    """Median and worst |error| (and the count) per backend x strategy, and over all points."""
    groups = [((b, s), g) for (b, s), g in errors.groupby(["backend", "strategy"])] + [(("all", "all"), errors)]
    return pd.DataFrame(
        [
            {
                "backend": b,
                "strategy": s,
                "points": len(g),
                "median_abs_error": g["error"].abs().median(),
                "worst_abs_error": g["error"].abs().max(),
                "worst_point": _describe(g.loc[g["error"].abs().idxmax()]),
            }
            for (b, s), g in groups
        ]
    )


def _describe(row: pd.Series) -> str:
    return (
        f"{row.backend} {row.strategy} B={row.batch} L={row.context} n={row.next_n}: "
        f"{row.measured_us:.1f} µs measured, {row.modeled_us:.1f} modeled"
    )


def reread_table(ncu: pd.DataFrame) -> pd.DataFrame:
    """DRAM read over unique KV bytes per launch of a strategy (Nsight Compute's logits kernels,
    `profiling.runs.load_profile_run(...).ncu`): ~1 for native, ~next_n for DeepGEMM's
    flatten at B = 128, ~1 for Triton's."""
    keys = [name for name in axes.NAMES if name in ncu]
    per_launch = ncu.groupby(keys, as_index=False, dropna=False).agg(
        dram_read_bytes=("dram_read_bytes", "mean"), unique_kv_bytes=("unique_kv_bytes", "first")
    )
    per_launch["dram_over_unique"] = per_launch["dram_read_bytes"] / per_launch["unique_kv_bytes"]
    return per_launch


def measured_flatten_dram_share(ncu: pd.DataFrame, backend: str) -> float:
    """Median share of `backend`'s flatten re-reads that reach DRAM: (DRAM / unique - 1) / (next_n - 1)
    (what a backend declares as `ModelTraits.flatten_dram_share`; Triton's)."""
    table = reread_table(ncu)
    rows = table[(table["backend"] == backend) & (table["strategy"] == "flatten") & (table["next_n"] > 1)]
    return float(((rows["dram_over_unique"] - 1) / (rows["next_n"] - 1)).median())


def trtllm_13219(gpu: str = "B200") -> pd.DataFrame:
    """The model (DeepGEMM, what vLLM runs; native = SM100's varlen kernel) against TensorRT-LLM #13219's table."""
    rows = []
    for (batch, context), (cute_us, deepgemm_us) in TRTLLM_13219.items():
        modeled = predict(gpu, vllm_backend().name, "native", [context] * batch, 3)
        rows.append(
            {
                "batch": batch,
                "context": context,
                "next_n": 3,
                "published_deepgemm_us": deepgemm_us,
                "published_cute_us": cute_us,
                "modeled_deepgemm_us": modeled.time_us,
                "bound": modeled.bound,
                "error": modeled.time_us / deepgemm_us - 1,
                "source": f"published: {TRTLLM_SOURCE}; modeled: {gpu}",
            }
        )
    return pd.DataFrame(rows)


def fits_table() -> pd.DataFrame:
    """Every modeled backend's fitted efficiencies (`indexer.fits`) as a table."""
    return pd.DataFrame([{"backend": b, "strategy": s, **vars(f)} for (b, s), f in fits().items()])
