"""The profiling modes of the harness: torch.profiler in this process, Nsight Compute over the target.

Both walk the same grid as the timing mode (`bench.walk`: one point, one plan, one input
builder) and check each point with the same measure (`bench.check`) before profiling it.
Points a backend cannot run here, that fail the check or that a budget cut are recorded
in `configs` with the reason; the grid goes on. Nsight Compute profiles one backend per
run of the target process (`target.py`), so CUDA start-up and inputs are paid once; each
run keeps its report as `.ncu-rep` for the Nsight Compute GUI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from dsa_lab.batch.plan import LaunchPlan
from dsa_lab.bench.check import check_point
from dsa_lab.bench.point import SweepSpec
from dsa_lab.bench.walk import Visit, prepare, walk
from dsa_lab.env_info import device_name
from dsa_lab.errors import check_range
from dsa_lab.profiling.ncu import (
    CHIPS,
    NcuStatus,
    NcuUnavailable,
    missing_metrics,
    ncu_command,
    ncu_failure,
    query_metric_names,
    require_ncu,
    usable_metrics,
)
from dsa_lab.profiling.ncu_report import NcuReportUnavailable, read_ncu_report
from dsa_lab.profiling.ncu_tables import CONFIG_KEYS, METRICS, attach_configs, parse_ncu_csv, summarize_ncu
from dsa_lab.profiling.torch_profile import compare_in_one_trace, profile_step
from dsa_lab.store import folders as store
from dsa_lab.topk import DEFAULT_TOPK, MAX_TOPK

KERNELS_PER_STEP_CAP = 17  # ncu --launch-count per step: the marker + up to 16 kernels in the logits calls
TARGET_MARGIN_S = 45.0  # of an ncu run's timeout: ncu and CUDA start-up, the config in flight, teardown
TRACE_STRATEGIES = ("native", "flatten")


@dataclass(frozen=True)
class ProfileSettings:
    """What a profile adds to the grid: top-k of the step, ncu steps per point, the comparison trace."""

    topk: int = DEFAULT_TOPK
    repeats: int = 1  # ncu steps per point
    trace: bool = True

    def __post_init__(self) -> None:
        check_range("topk", self.topk, 1, MAX_TOPK)
        check_range("repeats", self.repeats, 1, 1000)


@dataclass
class ProfileRun:
    """What one profile produced; `folder` is None for runs held in memory only."""

    kernels: pd.DataFrame
    phases: pd.DataFrame
    ncu: pd.DataFrame
    configs: list[dict[str, Any]]
    provenance: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None
    raw_ncu: str = ""
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (folder, problem) of stored runs passed over
    nsight: pd.DataFrame = field(default_factory=pd.DataFrame)  # nsight-python's timer beside the harness's

    @property
    def ncu_summary(self) -> pd.DataFrame:
        return summarize_ncu(self.ncu)


def point_config(visit: Visit, device: torch.device, tool: str) -> dict[str, Any]:
    """A point as the profile tables name it: the harness's axes, the device and the plan's columns."""
    plan = visit.plan.columns() if visit.plan is not None else {}
    return {
        "tool": tool,
        **visit.point.axes(),
        "device_name": device_name(device),
        **plan,
        "status": "pending",
        "reason": "",
        "rel_err": None,
    }


def check_visit(visit: Visit, spec: SweepSpec, device: torch.device) -> tuple[float | None, str | None]:
    """(relative error, None) when the point passes the harness's check, else (error, why not)."""
    prepared = prepare(visit, device)
    result = check_point(
        visit.inputs,
        prepared.metadata,
        visit.backend,
        prepared.calls,
        spec.check_tolerance,
        spec.full_check_limit,
        spec.check_requests,
    )
    if result.ok:
        return result.rel_err, None
    return result.rel_err, f"{result.message}; refusing to profile an incorrect configuration"


def _trace_point(spec: SweepSpec) -> tuple[int, str, int]:
    """(batch, context, next_n) of the comparison trace: the largest batch, first context, next_n 4 if swept."""
    return max(spec.batch), spec.context[0], 4 if 4 in spec.next_n else max(spec.next_n)


def checked_visits(
    spec: SweepSpec,
    device: torch.device,
    tool: str,
    configs: list[dict[str, Any]],
    log: Callable[[str], None],
    budget_s: float | None = None,
) -> Iterator[tuple[Visit, dict[str, Any], str]]:
    """The grid's points a profiling tool runs, in grid order, each as (visit, its config, its label): every
    point's config joins `configs`, and a point skipped by the walk, not started within `budget_s`, refused
    by the harness's check or failing in it is recorded there and not yielded."""
    started = time.perf_counter()
    for visit in walk(spec.points(), spec, device):
        point = visit.point
        config = point_config(visit, device, tool)
        configs.append(config)
        label = f"{point.backend} {point.strategy} B={point.batch} L={point.context} n={point.next_n}"
        if visit.skip or visit.error:
            config.update(status="skipped" if visit.skip else "error", reason=visit.skip or visit.error)
            continue
        if budget_s is not None and time.perf_counter() - started > budget_s:
            config.update(status="skipped", reason=f"time budget of {budget_s:g} s spent")
            continue
        try:
            config["rel_err"], refused = check_visit(visit, spec, device)
        except (ValueError, RuntimeError) as err:  # unsupported, unavailable, or a failing kernel
            record_error(config, label, err, log)
            continue
        if refused:
            config.update(status="failed", reason=refused)
            log(f"refused {label}: {refused}")
            continue
        yield visit, config, label


def record_error(config: dict[str, Any], label: str, err: Exception, log: Callable[[str], None]) -> None:
    """A point whose tool failed: its config says so, and the log names it."""
    config.update(status="error", reason=f"{type(err).__name__}: {err}")
    log(f"error {label}: {config['reason']}")


def run_torch(
    spec: SweepSpec,
    device: torch.device,
    settings: ProfileSettings = ProfileSettings(),
    trace_dir: Path | None = None,
    log: Callable[[str], None] = print,
    budget_s: float | None = None,
) -> ProfileRun:
    """torch.profiler over the grid, in grid order. Points not started within `budget_s` are
    recorded as skipped, so a slow compile cannot eat the time of what follows."""
    kernels, phases, configs = [], [], []
    traced: dict[str, list[LaunchPlan]] = {}
    trace_key = _trace_point(spec)
    for visit, config, label in checked_visits(spec, device, "torch", configs, log, budget_s):
        point = visit.point
        try:
            result = profile_step(visit.inputs, visit.plan, visit.backend, _table_config(config), topk=settings.topk)
        except (ValueError, RuntimeError) as err:  # unsupported, unavailable, or a failing kernel
            record_error(config, label, err, log)
            continue
        config["status"] = "profiled"
        kernels.append(result.kernels)
        phases.append(result.phases)
        step_us = float(result.phases["device_us"].sum())
        log(f"torch {label}: {len(result.launch_shapes)} logits call(s), step {step_us:.1f} us")
        if (point.batch, point.context, point.next_n) == trace_key and point.strategy in TRACE_STRATEGIES:
            traced.setdefault(point.backend, []).append(visit.plan)
            if settings.trace and trace_dir is not None and len(traced[point.backend]) == len(TRACE_STRATEGIES):
                path = trace_dir / f"trace_{point.backend}.json.gz"
                compare_in_one_trace(visit.inputs, traced[point.backend], visit.backend, path, settings.topk)
    return ProfileRun(_concat(kernels), _concat(phases), pd.DataFrame(), configs)


TABLE_KEYS = CONFIG_KEYS  # the columns naming a point in every profile table (axes, device, plan)


def _table_config(config: dict[str, Any]) -> dict[str, Any]:
    """The columns every row of a profile table carries (the point's name and its plan)."""
    return {key: config.get(key) for key in TABLE_KEYS}


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _child_env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


@dataclass
class NcuOutcome:
    kernels: pd.DataFrame
    configs: list[dict[str, Any]]
    raw: str
    metrics: list[str]
    dropped: list[str]
    reports: list[Path]


def run_ncu(
    spec: SweepSpec,
    settings: ProfileSettings,
    status: NcuStatus,
    device: torch.device,
    report_dir: Path | None = None,
    timeout_s: float = 300.0,
    log: Callable[[str], None] = print,
) -> NcuOutcome:
    """One ncu run per backend over the grid (kernel replay, logits kernels only); each run's
    report is kept as `report_dir/ncu_<backend>.ncu-rep`."""
    ncu = require_ncu(status)
    if device.type != "cuda":
        raise NcuUnavailable(
            f"ncu profiles CUDA kernels; device is {device} (use --tool torch on a machine without a GPU)"
        )
    chip = CHIPS.get(torch.cuda.get_device_capability(device))
    metrics, dropped = usable_metrics(list(METRICS.values()), query_metric_names(ncu, chip) if chip else set())
    frames, configs, raw, reports = [], [], [], []
    for backend in spec.backend:
        one = spec.with_axes(backend=(backend,))
        report = report_dir / f"ncu_{backend}.ncu-rep" if report_dir is not None else None
        kernels, manifest, output = run_ncu_backend(ncu, one, settings, metrics, dropped, timeout_s, log, report)
        raw.append(f"### ncu run for backend {backend}\n{output}")
        frames.append(kernels)
        configs += [{k: v for k, v in c.items() if k != "index"} for c in manifest.get("configs", [])]
        if report is not None and report.is_file():
            reports.append(report)
    return NcuOutcome(_concat(frames), configs, "\n".join(raw), metrics, dropped, reports)


def _target_args(grid: Path, manifest: Path, settings: ProfileSettings, budget_s: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dsa_lab.profiling",
        "--ncu-target",
        "--grid",
        str(grid),
        "--manifest",
        str(manifest),
        "--repeats",
        str(settings.repeats),
        "--topk",
        str(settings.topk),
        "--time-budget-s",
        f"{budget_s:g}",
    ]


def run_ncu_backend(
    ncu: str,
    spec: SweepSpec,
    settings: ProfileSettings,
    metrics: list[str],
    dropped: list[str],
    timeout_s: float,
    log: Callable[[str], None],
    report: Path | None = None,
) -> tuple[pd.DataFrame, dict[str, Any], str]:
    """ncu over the target for one backend's grid: (kernel rows with configs, the manifest, ncu's output).

    Metrics ncu reports as unknown move from `metrics` to `dropped` and the run is retried.
    With `report`, ncu also writes its report there (`--export`) and the kernel table is read
    from it (`ncu_report.read_ncu_report`); ncu's printed CSV is parsed only without a report,
    or, said in the log, where the ncu-report package is missing or cannot read the report.
    """
    backend = spec.backend[0]
    steps = len(spec.points()) * settings.repeats
    with tempfile.TemporaryDirectory(prefix="dsa_lab_ncu_") as tmp:
        grid_path, manifest_path = Path(tmp) / "grid.json", Path(tmp) / "manifest.json"
        grid_path.write_text(json.dumps(spec.to_dict()))
        target = _target_args(grid_path, manifest_path, settings, max(30.0, timeout_s - TARGET_MARGIN_S))
        for _ in range(3):  # retried only when ncu names metrics it does not know
            command = ncu_command(ncu, metrics, target, launch_count=steps * KERNELS_PER_STEP_CAP, export=report)
            log(f"ncu {backend}: {len(metrics)} metrics, up to {steps} steps")
            started = time.perf_counter()
            try:
                proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=_child_env())
                output, code = proc.stdout + proc.stderr, proc.returncode
            except subprocess.TimeoutExpired as err:
                output = _text(err.stdout) + _text(err.stderr)
                code = -1
                log(f"ncu {backend}: stopped after {timeout_s:g} s; keeping what it printed")
            missing = {name.split(".")[0] for name in missing_metrics(output)}  # ncu may quote a regex form
            unknown = [m for m in metrics if m.split(".")[0] in missing]
            if not unknown:
                break
            metrics[:] = [m for m in metrics if m not in unknown]
            dropped += unknown
        log(f"ncu {backend}: exit {code} after {time.perf_counter() - started:.0f} s")
        manifest = _read_manifest(manifest_path)
    table = None
    if report is not None and report.is_file():
        try:
            table = read_ncu_report(report)
        except (NcuReportUnavailable, ValueError) as err:
            log(f"ncu {backend}: {err}; parsing ncu's printed CSV instead")
    kernels = attach_configs(parse_ncu_csv(output) if table is None else table, manifest)
    if kernels.empty:
        failure = ncu_failure(output, code) or "ncu profiled no logits kernel"
        log(f"ncu {backend}: {failure}")
        for config in manifest.get("configs", []):
            if config.get("status") == "profiled":
                config.update(status="failed", reason=failure)
    return kernels, manifest, output


def _read_manifest(path: Path) -> dict[str, Any]:
    """The target's manifest (absent when it never started); a damaged one names the file."""
    if not path.exists():
        return {"configs": [], "steps": []}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise store.RunFormatError(f"{path}: the ncu target's manifest is not valid JSON ({err})") from None
    if not isinstance(manifest, dict):
        raise store.RunFormatError(f"{path}: the ncu target's manifest is not a JSON object")
    return manifest


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


__all__ = ["NcuOutcome", "ProfileRun", "ProfileSettings", "run_ncu", "run_ncu_backend", "run_torch"]
