"""Nsight Compute's CSV as tidy tables: one row per kernel, its configuration, per-step summaries.

Values are converted to bytes and nanoseconds whatever units ncu printed; 'n/a' becomes
NaN. Summaries normalise per *useful* byte and FLOP (unique KV bytes, the q.k products)
so strategies that re-read KV compare fairly.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

import pandas as pd

from dsa_lab import axes

# friendly column -> ncu metric; tensor-pipe names differ by generation, so all are asked for.
METRICS: dict[str, str] = {
    "duration_ns": "gpu__time_duration.sum",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "dram_pct_peak": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "l2_read_sectors": "lts__t_sectors_srcunit_tex_op_read.sum",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "tensor_gmma_pct": "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "tensor_hmma_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
}
PERCENT_COLUMNS = ("dram_pct_peak", "l2_hit_pct", "occupancy_pct", "tensor_gmma_pct", "tensor_hmma_pct")
SECTOR_BYTES = 32
MARKER_KERNEL = "dsa_lab_ncu_marker"  # the name of the Triton kernel in marker.py
UNIT_SCALE = {
    "byte": 1.0,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "tbyte": 1e12,
    "nsecond": 1.0,
    "usecond": 1e3,
    "msecond": 1e6,
    "second": 1e9,
    "ns": 1.0,
    "us": 1e3,
    "ms": 1e6,
}


def _number(text: str, unit: str) -> float:
    text = text.strip().replace(",", "")
    if not text or text.lower() == "n/a":
        return float("nan")
    try:
        value = float(text)
    except ValueError:
        return float("nan")
    return value * UNIT_SCALE.get(unit.strip().lower(), 1.0)


def _dims(text: str) -> tuple[int, int, int]:
    numbers = [int(x) for x in re.findall(r"\d+", text or "")]
    return tuple((numbers + [1, 1, 1])[:3]) if numbers else (0, 0, 0)  # type: ignore[return-value]


def parse_ncu_csv(text: str) -> pd.DataFrame:
    """One row per profiled kernel from ncu's `--csv` details output (other lines are skipped).

    Columns: id, kernel, grid, block, one per friendly metric name (NaN where ncu said
    'n/a' or did not collect it), l2_read_bytes, and any unknown metric under its own
    name. Values are converted to bytes and nanoseconds whatever units ncu printed.
    """
    lines = [line for line in text.splitlines() if line.startswith('"')]
    header_at = next((i for i, line in enumerate(lines) if '"Metric Name"' in line and '"ID"' in line), None)
    columns = ["id", "kernel", "grid", "block", *METRICS, "l2_read_bytes"]
    if header_at is None:
        return pd.DataFrame(columns=columns)
    friendly = {metric: name for name, metric in METRICS.items()}
    kernels: dict[int, dict[str, Any]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[header_at:]))):
        if row.get("ID") in (None, "ID"):
            continue
        kernel_id = int(row["ID"])
        record = kernels.setdefault(
            kernel_id,
            {
                "id": kernel_id,
                "kernel": row.get("Kernel Name", ""),
                "grid": "({}, {}, {})".format(*_dims(row.get("Grid Size", ""))),
                "block": "({}, {}, {})".format(*_dims(row.get("Block Size", ""))),
            },
        )
        metric = row.get("Metric Name") or ""
        if not metric:  # rule rows of newer ncu releases carry no metric
            continue
        record[friendly.get(metric, metric)] = _number(row.get("Metric Value", ""), row.get("Metric Unit", ""))
    table = pd.DataFrame(list(kernels.values()))
    for name in METRICS:
        if name not in table:
            table[name] = float("nan")
    table["l2_read_bytes"] = table["l2_read_sectors"] * SECTOR_BYTES
    extra = [c for c in table.columns if c not in columns]
    return table[columns + extra].sort_values("id").reset_index(drop=True)


def attach_configs(kernels: pd.DataFrame, manifest: dict[str, Any]) -> pd.DataFrame:
    """Give each profiled kernel its configuration, using the marker kernels the target launched.

    The target launches `MARKER_KERNEL` with grid `(m + 1, 1, 1)` before the m-th profiled
    step; every kernel after it, up to the next marker, belongs to that step. Markers are
    dropped, and so are kernels before the first marker (none expected). A configuration
    the target did not profile because its launches equal another's (`same_as`) gets
    that one's rows, marked in `copied_from`.
    """
    configs = {c["index"]: c for c in manifest["configs"]}
    steps = {s["marker"]: s for s in manifest["steps"]}
    rows: list[dict[str, Any]] = []
    current, order = None, 0
    for record in kernels.sort_values("id").to_dict("records"):
        if MARKER_KERNEL in str(record["kernel"]):
            current, order = steps.get(_dims(record["grid"])[0] - 1), 0
            continue
        if current is None:
            continue
        config = configs[current["config"]]
        rows.append(
            {**_config_columns(config), "copied_from": None, "repeat": current["repeat"], "order": order, **record}
        )
        order += 1
    for config in configs.values():
        source = config.get("same_as")
        if source is None:
            continue
        origin = configs[source]
        for row in [r for r in rows if r["copied_from"] is None and _same_config(r, origin)]:
            rows.append({**row, **_config_columns(config), "copied_from": origin["strategy"]})
    return pd.DataFrame(rows)


def _same_config(row: dict[str, Any], config: dict[str, Any]) -> bool:
    return all(row.get(key) == config.get(key) for key in CONFIG_KEYS)


# The columns naming a point in every profile table: its axes, the device, and the plan's counts.
CONFIG_KEYS = (*axes.NAMES, "device_name", "launches", "kernel_rows", "unique_kv_bytes", "strategy_kv_bytes", "flops")


def _config_columns(config: dict[str, Any]) -> dict[str, Any]:
    return {key: config.get(key) for key in CONFIG_KEYS}


def _weighted(group: pd.DataFrame, column: str) -> float:
    values, weights = group[column], group["duration_ns"]
    known = values.notna() & weights.notna()
    if not known.any() or float(weights[known].sum()) == 0:
        return float("nan")
    return float((values[known] * weights[known]).sum() / weights[known].sum())


def summarize_ncu(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration: the step's logits kernels summed, percentages time-weighted.

    Normalised columns: `dram_read_per_unique` (DRAM bytes read per unique KV byte; 1.0
    means KV came from DRAM exactly once), `l2_absorbed` (share of the plan's re-reads,
    `strategy_kv_bytes - unique_kv_bytes`, that did not reach DRAM), `effective_tbps`
    (unique KV bytes per second) and `useful_tflops` (q.k FLOPs per second). Repeats are averaged.
    """
    if kernels.empty:
        return pd.DataFrame()
    keys = [k for k in (*CONFIG_KEYS, "copied_from") if k in kernels]
    per_step = []
    for values, group in kernels.groupby([*keys, "repeat"], dropna=False, sort=False):
        *config_values, repeat = values
        per_step.append({**dict(zip(keys, config_values)), "repeat": repeat, **_step_totals(group)})
    steps = pd.DataFrame(per_step)
    value_columns = [c for c in steps.columns if c not in (*keys, "repeat")]
    summary = steps.groupby(keys, dropna=False, sort=False)[value_columns].mean().reset_index()
    summary["repeats"] = steps.groupby(keys, dropna=False, sort=False).size().to_numpy()
    seconds = summary["duration_ns"] * 1e-9
    summary["dram_read_per_unique"] = summary["dram_read_bytes"] / summary["unique_kv_bytes"]
    rereads = summary["strategy_kv_bytes"] - summary["unique_kv_bytes"]
    excess = summary["dram_read_bytes"] - summary["unique_kv_bytes"]
    summary["l2_absorbed"] = (1 - excess / rereads).where(rereads > 0)
    summary["effective_tbps"] = summary["unique_kv_bytes"] / seconds / 1e12
    summary["useful_tflops"] = summary["flops"] / seconds / 1e12
    return summary


def _step_totals(group: pd.DataFrame) -> dict[str, float]:
    totals = {
        "kernels": float(len(group)),
        "duration_ns": float(group["duration_ns"].sum(min_count=1)),
        "dram_read_bytes": float(group["dram_read_bytes"].sum(min_count=1)),
        "dram_write_bytes": float(group["dram_write_bytes"].sum(min_count=1)),
        "l2_read_bytes": float(group["l2_read_bytes"].sum(min_count=1)),
    }
    totals.update({column: _weighted(group, column) for column in PERCENT_COLUMNS})
    return totals
