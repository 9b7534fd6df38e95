"""torch.profiler on one decode step: a tidy table per kernel, a table per phase, a Chrome trace.

Kernels are attributed to phases through the exported Chrome/Perfetto trace: each
device event is matched (by correlation id) to the runtime or driver call that launched
it, and that call lies inside one of the step's `record_function` ranges. On a CPU the
reference path has no kernels; its leaf operators stand in for them, timed on the host.
"""

from __future__ import annotations

import gzip
import json
import tempfile
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from dsa_lab import axes
from dsa_lab.batch.plan import LaunchPlan
from dsa_lab.batch.workload import DecodeInputs
from dsa_lab.errors import check_range
from dsa_lab.kernels import LogitsBackend
from dsa_lab.profiling.step import PHASES, phased_decode
from dsa_lab.topk import DEFAULT_TOPK

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
OUTSIDE_PHASES = "other"
KERNEL_COLUMNS = (
    "phase",
    "kernel",
    "grid",
    "kernel_launches",
    "calls",
    "total_us",
    "mean_us",
    "share",
    "first_start_us",
)
PHASE_COLUMNS = ("phase", "calls", "wall_us", "device_us", "share")


@dataclass(frozen=True)
class ProfileResult:
    """One profiled decode step: per-kernel and per-phase tables, the launches, the trace."""

    config: dict[str, Any]  # the point's axes, device_name and plan columns (the harness's names)
    kernels: pd.DataFrame  # KERNEL_COLUMNS, prefixed by the config columns
    phases: pd.DataFrame  # PHASE_COLUMNS, prefixed by the config columns
    launch_shapes: tuple[tuple[int, int], ...]  # (rows B', next_n') of each logits launch
    trace_path: Path | None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _activities(device: torch.device) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])


def profile_step(
    inputs: DecodeInputs,
    plan: LaunchPlan,
    backend: LogitsBackend,
    config: dict[str, Any],
    *,
    trace_dir: str | Path | None = None,
    topk: int = DEFAULT_TOPK,
    warmup: int = 1,
) -> ProfileResult:
    """Profile one decode step of `plan` after `warmup` steps (which compile, autotune, fill the
    allocator and run the value checks). The point must have passed the harness's check first.
    CUDA activities are recorded on a GPU, CPU activities otherwise; the Chrome trace goes to
    `trace_dir` when given. `config` names the point in every row of the tables."""
    check_range("warmup", warmup, 1, 100)
    device = inputs.q.device
    for _ in range(warmup):
        phased_decode(inputs, plan, backend, topk)
    sync(device)
    with profile(activities=_activities(device)) as prof:  # the warm-up above ran the value checks
        result = phased_decode(inputs, plan, backend, topk, check=False)
        sync(device)
    shapes = tuple((launch.batch_size, launch.next_n) for launch in result.metadata.launches)
    if trace_dir is None:
        with tempfile.TemporaryDirectory(prefix="dsa_lab_trace_") as tmp:
            trace, trace_path = read_trace(_export(prof, tmp, config)), None
    else:
        trace_path = _export(prof, trace_dir, config)
        trace = read_trace(trace_path)
    kernels, phases = tables_from_trace(trace, device.type)
    return ProfileResult(config, _prefixed(kernels, config), _prefixed(phases, config), shapes, trace_path)


def compare_in_one_trace(
    inputs: DecodeInputs,
    plans: Sequence[LaunchPlan],
    backend: LogitsBackend,
    path: str | Path,
    topk: int = DEFAULT_TOPK,
) -> Path:
    """One Chrome trace holding a step of each plan, back to back, each in a `step:<strategy>` range.

    Meant for side-by-side viewing in Perfetto; profile each plan first (`profile_step`) so
    that it is warm and checked.
    """
    device = inputs.q.device
    sync(device)
    with profile(activities=_activities(device)) as prof:
        for plan in plans:
            with record_function(f"step:{plan.strategy}"):
                phased_decode(inputs, plan, backend, topk, check=False)
            sync(device)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return path


def _export(prof: profile, trace_dir: str | Path, config: dict[str, Any]) -> Path:
    name = f"{config['backend']}_{config['strategy']}_B{config['batch']}_n{config['next_n']}.json"
    folder = Path(trace_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    prof.export_chrome_trace(str(path))
    return path


def read_trace(path: str | Path) -> dict[str, Any]:
    """A Chrome trace as written by torch.profiler (plain or .gz); a damaged one names the file."""
    from dsa_lab.store.folders import RunFormatError

    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            trace = json.load(handle)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError, zlib.error) as err:
        raise RunFormatError(f"{path}: not a readable Chrome trace ({type(err).__name__}: {err})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise RunFormatError(f"{path}: not a Chrome trace (no 'traceEvents' list)")
    return trace


def _prefixed(table: pd.DataFrame, config: dict[str, Any]) -> pd.DataFrame:
    front = pd.DataFrame({key: [value] * len(table) for key, value in config.items()}, index=table.index)
    return pd.concat([front, table], axis=1)


@dataclass(frozen=True)
class _Range:
    name: str
    start: float
    end: float
    tid: Any
    index: int  # which instance of this phase name, in start order


def _complete_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]


def _phase_ranges(events: list[dict[str, Any]]) -> list[_Range]:
    found = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and e.get("name") in PHASES),
        key=lambda e: float(e["ts"]),
    )
    seen: dict[str, int] = defaultdict(int)
    ranges = []
    for e in found:
        start = float(e["ts"])
        ranges.append(_Range(e["name"], start, start + float(e["dur"]), e.get("tid"), seen[e["name"]]))
        seen[e["name"]] += 1
    return ranges


def _enclosing(ranges: list[_Range], ts: float, tid: Any) -> _Range | None:
    """The innermost (latest-starting) phase range on thread `tid` that contains `ts`."""
    best = None
    for r in ranges:
        if r.tid == tid and r.start <= ts <= r.end and (best is None or r.start >= best.start):
            best = r
    return best


def _leaf_ops(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """CPU operators with no operator nested inside them (where the host work happens)."""
    ops = sorted(
        (e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (e.get("tid"), float(e["ts"]), -float(e["dur"]))
    )
    leaves = []
    for i, e in enumerate(ops):
        end = float(e["ts"]) + float(e["dur"])
        following = ops[i + 1] if i + 1 < len(ops) else None
        nested = following is not None and following.get("tid") == e.get("tid") and float(following["ts"]) <= end
        if not nested:
            leaves.append(e)
    return leaves


def _grid(event: dict[str, Any]) -> str:
    grid = event.get("args", {}).get("grid")
    return "(" + ", ".join(str(int(g)) for g in grid) + ")" if isinstance(grid, list) else ""


def tables_from_trace(trace: dict[str, Any], device_type: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kernels, phases) tables of one profiled step from its Chrome trace.

    kernels: one row per (phase, kernel name, grid) with launch count, the number of
    phase instances it ran in (`calls`), total and mean time in µs, its share of the
    step's device time and its first start relative to the step's first device event.
    On `device_type='cpu'` the leaf CPU operators are the "kernels".
    """
    events = _complete_events(trace)
    ranges = _phase_ranges(events)
    placed: list[tuple[dict[str, Any], _Range | None]] = []
    if device_type == "cpu":
        placed = [(e, _enclosing(ranges, float(e["ts"]), e.get("tid"))) for e in _leaf_ops(events)]
        placed = [(e, r) for e, r in placed if r is not None]
    else:
        launches = {
            e["args"]["correlation"]: e
            for e in events
            if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})
        }
        host_ops = {
            e["args"]["External id"]: e
            for e in events
            if e.get("cat") in ("cpu_op", "user_annotation") and "External id" in e.get("args", {})
        }
        for e in events:
            if e.get("cat") not in DEVICE_CATEGORIES:
                continue
            args = e.get("args", {})
            # the launching API call; else the host op or range active at launch (External id)
            origin = launches.get(args.get("correlation")) or host_ops.get(args.get("External id"))
            where = _enclosing(ranges, float(origin["ts"]), origin.get("tid")) if origin else None
            placed.append((e, where))
    return _kernel_table(placed), _phase_table(ranges, placed)


def _kernel_table(placed: list[tuple[dict[str, Any], _Range | None]]) -> pd.DataFrame:
    if not placed:
        return pd.DataFrame(columns=list(KERNEL_COLUMNS))
    origin = min(float(e["ts"]) for e, _ in placed)
    rows = pd.DataFrame(
        {
            "phase": [r.name if r else OUTSIDE_PHASES for _, r in placed],
            "instance": [r.index if r else -1 for _, r in placed],
            "kernel": [e["name"] for e, _ in placed],
            "grid": [_grid(e) for e, _ in placed],
            "dur": [float(e["dur"]) for e, _ in placed],
            "start": [float(e["ts"]) - origin for e, _ in placed],
        }
    )
    table = (
        rows.groupby(["phase", "kernel", "grid"], sort=False)
        .agg(
            kernel_launches=("dur", "size"),
            calls=("instance", "nunique"),
            total_us=("dur", "sum"),
            first_start_us=("start", "min"),
        )
        .reset_index()
    )
    table["mean_us"] = table["total_us"] / table["kernel_launches"]
    total = float(rows["dur"].sum())
    table["share"] = table["total_us"] / total if total > 0 else 0.0
    return table.sort_values("first_start_us", kind="stable").reset_index(drop=True)[list(KERNEL_COLUMNS)]


def _phase_table(ranges: list[_Range], placed: list[tuple[dict[str, Any], _Range | None]]) -> pd.DataFrame:
    device_us: dict[str, float] = defaultdict(float)
    for e, r in placed:
        device_us[r.name if r else OUTSIDE_PHASES] += float(e["dur"])
    total = sum(device_us.values())
    rows = []
    for name in (*PHASES, OUTSIDE_PHASES):
        mine = [r for r in ranges if r.name == name]
        if not mine and name not in device_us:
            continue
        busy = device_us.get(name, 0.0)
        rows.append(
            {
                "phase": name,
                "calls": len(mine),
                "wall_us": sum(r.end - r.start for r in mine),
                "device_us": busy,
                "share": busy / total if total > 0 else 0.0,
            }
        )
    return pd.DataFrame(rows, columns=list(PHASE_COLUMNS))


def summarize_torch(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per profiled configuration: step device time, logits time and its share."""
    if kernels.empty:
        return pd.DataFrame()
    keys = [k for k in (*axes.NAMES, "device_name", "launches") if k in kernels]
    logits = kernels["total_us"].where(kernels["phase"] == "logits", 0.0)
    summary = (
        kernels.assign(logits_us=logits)
        .groupby(keys, sort=False, dropna=False)
        .agg(step_us=("total_us", "sum"), logits_us=("logits_us", "sum"), kernels=("kernel_launches", "sum"))
        .reset_index()
    )
    summary["logits_share"] = summary["logits_us"] / summary["step_us"]
    return summary
