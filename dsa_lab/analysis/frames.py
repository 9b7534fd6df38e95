"""Frames between a run's results and the charts: timed rows, the best option, vLLM's path.

Pure pandas over a results frame (`store.load_run(...).results`, measured or modeled rows);
`dsa_lab.plots` draws them and `analysis.headline` reads them. Nothing here draws or times.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from dsa_lab.policy import Platform, PolicyQuery, step_path
from dsa_lab.workload import ContextSpec

SM90_DEEPGEMM = Platform("sm90", True)
BASELINE = "deepgemm"
POINT = ["batch", "context", "next_n"]


def context_order(labels: Iterable[str]) -> list[str]:
    """Uniform contexts by length, then mixed ones."""
    return sorted(set(labels), key=lambda c: (c.startswith("mixed"), ContextSpec.parse(c).high, c))


REQUIRED_COLUMNS = ("backend", "strategy", "batch", "context", "next_n", "status", "median_ms", "source")
SHAPE_COLUMNS = ("heads", "head_dim", "cache_dtype")


def ok_rows(results: pd.DataFrame) -> pd.DataFrame:
    """Timed rows with `kernel_us` (median, µs) and a `series` label `strategy (backend)`."""
    missing = [c for c in REQUIRED_COLUMNS if c not in results.columns]
    if missing:
        raise ValueError(f"results: missing columns {missing}")
    ok = results[results["status"] == "ok"].copy()
    shape_columns = [c for c in SHAPE_COLUMNS if c in ok.columns]
    shapes = ok[shape_columns].drop_duplicates() if shape_columns else ok.iloc[:1, :0]
    if len(shapes) > 1:
        raise ValueError(
            f"results: {len(shapes)} shapes ({', '.join(shape_columns)}) in one frame; "
            f"filter to one, e.g. results[results.cache_dtype == 'fp8']: {shapes.to_dict('records')}"
        )
    ok["kernel_us"] = ok["median_ms"] * 1e3
    ok["series"] = ok["strategy"] + " (" + ok["backend"] + ")"
    return ok.reset_index(drop=True)


def vllm_choice(next_n: int, platform: Platform = SM90_DEEPGEMM) -> str:
    """vLLM 0.33's path for a uniform step of next_n rows: 'native', 'flatten', 'varlen'."""
    return step_path(PolicyQuery(platform, next_n), next_n)


def by_point(table: pd.DataFrame) -> pd.DataFrame:
    """Rows in (batch, context, next_n) order, uniform contexts by length before mixed ones."""
    order = {c: i for i, c in enumerate(context_order(table["context"]))}
    return table.sort_values(POINT, key=lambda s: s.map(order) if s.name == "context" else s).reset_index(drop=True)


def measured_ok(frame: pd.DataFrame) -> pd.DataFrame:
    """Timed measured rows (`ok_rows`: `kernel_us`, `series`); modeled ones dropped."""
    data = ok_rows(frame)
    return data[data["source"] == "measured"].reset_index(drop=True)


def best_option(frame: pd.DataFrame, backend: str = BASELINE) -> pd.DataFrame:
    """Per (batch, context, next_n): `backend`'s fastest timed strategy (`best_strategy`, `best_ms`, its IQR)."""
    data = measured_ok(frame)
    data = data[data["backend"] == backend]
    if data.empty:
        return pd.DataFrame(columns=[*POINT, "best_strategy", "best_ms", "best_p25_ms", "best_p75_ms"])
    best = data.loc[data.groupby(POINT)["median_ms"].idxmin()]
    renamed = {"strategy": "best_strategy", "median_ms": "best_ms", "p25_ms": "best_p25_ms", "p75_ms": "best_p75_ms"}
    return by_point(best[[*POINT, *renamed]].rename(columns=renamed))


def vllm_path(frame: pd.DataFrame, backend: str = BASELINE, platform: Platform = SM90_DEEPGEMM) -> pd.DataFrame:
    """Per (batch, context, next_n): vLLM 0.33's strategy on `platform` and `backend`'s time for it (NaN if untimed)."""
    data = measured_ok(frame)
    points = data[POINT].drop_duplicates()
    points = points.assign(vllm_strategy=[vllm_choice(int(n), platform) for n in points["next_n"]])
    timed = data.loc[data["backend"] == backend, [*POINT, "strategy", "median_ms", "p25_ms", "p75_ms"]]
    renamed = {"strategy": "vllm_strategy", "median_ms": "vllm_ms", "p25_ms": "vllm_p25_ms", "p75_ms": "vllm_p75_ms"}
    timed = timed.rename(columns=renamed)
    return by_point(points.merge(timed, on=[*POINT, "vllm_strategy"], how="left"))
