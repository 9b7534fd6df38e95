"""nsight-python's CUPTI timer over the grid, beside the harness's own: a cross-check no anchor has.

`dsa-lab profile --tool nsight` walks the grid as every mode does (`bench.walk`, the harness's
check first) and times each point's logits launches twice on the same inputs: with the
harness's timer (`bench.timing.time_callable`, the spec's timing config: CUDA events, cold
L2 by default) and with nsight-python's `@nsight.analyze.kernel` under its CUPTI tool, which
sums the GPU durations CUPTI records for the kernels launched inside the point's annotation
(`gpu__time_duration.sum`, `runs` runs, each after the same L2 flush outside the annotation).
Each row keeps nsight-python's mean, standard deviation, 95 % interval and stability flag
and the ratio `timer_over_nsight` = harness median / nsight mean: 1.0 when the two timers
agree; above it by the gaps between launches and the events' own cost.

nsight-python 1.x activates Nsight Compute at import unless `NSPY_NCU_INIT_AT_IMPORT=0`; its
NCU tool needs ncu >= 2026.2.1, the CUPTI one only the `cupti-python` and
`nvidia-cuda-cupti` wheels (and `pyelftools`, which cupti-python imports). `load_nsight` sets
the variable before the import and activates CUPTI.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch

from dsa_lab.bench.check import run_launches
from dsa_lab.bench.point import SweepSpec
from dsa_lab.bench.timing import L2Flusher, Measurement, time_callable
from dsa_lab.bench.walk import Visit, prepare
from dsa_lab.errors import check_range
from dsa_lab.profiling.sweep import checked_visits, record_error

METRIC = "gpu__time_duration.sum"  # what the CUPTI tool collects (its only metric)
DEFAULT_RUNS = 5
INSTALL = (
    "pip install nsight-python==1.1.0 cupti-python nvidia-cuda-cupti pyelftools (the gpu extra: "
    "pip install 'dsa_lab[gpu]')"
)


class NsightUnavailable(RuntimeError):
    """nsight-python's CUPTI tool cannot run here; the message says why and what to install."""


def load_nsight() -> Any:
    """nsight-python with its CUPTI tool active (Nsight Compute's injection kept off at import)."""
    if "nsight" not in sys.modules:
        os.environ["NSPY_NCU_INIT_AT_IMPORT"] = "0"  # must be set before the import
    try:
        nsight = importlib.import_module("nsight")
    except ImportError as err:
        raise NsightUnavailable(f"nsight-python is not importable here ({err}); {INSTALL}") from err
    active = nsight.get_active_tool()
    if active is not None and active != nsight.Tool.CUPTI:
        raise NsightUnavailable(
            f"nsight-python's {active!r} tool is already active in this process (imported without "
            "NSPY_NCU_INIT_AT_IMPORT=0); run `dsa-lab profile --tool nsight` in a process of its own"
        )
    try:
        nsight.activate(nsight.Tool.CUPTI)
    except Exception as err:  # cupti-python or libcupti missing, or CUPTI's own error types
        raise NsightUnavailable(
            f"nsight-python's CUPTI tool did not start ({type(err).__name__}: {err}); {INSTALL}"
        ) from err
    return nsight


def nsight_version() -> str | None:
    try:
        return importlib.metadata.version("nsight-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def _sum(first: float, second: float) -> float:
    return first + second


def nsight_time(nsight: Any, step: Callable[[], None], before: Callable[[], None], name: str, runs: int) -> dict:
    """`step` timed by nsight-python: `runs` runs, each `before()` (outside the annotation), then `step()`
    inside annotation `name`; the kernels launched in it summed. Returns the columns named nsight_*."""
    with tempfile.TemporaryDirectory(prefix="dsa_lab_nsight_") as scratch:

        @nsight.analyze.kernel(
            runs=runs,
            combine_kernel_metrics=_sum,
            thermal_mode="off",
            verbosity=nsight.VerbosityLevel.SILENT,
            output_prefix=os.path.join(scratch, ""),
        )
        def point() -> None:
            before()
            with nsight.annotate(name):
                step()

        try:
            frame = point().to_dataframe()
        except Exception as err:  # nsight-python's ProfilerException and others: this point's error, not the run's
            raise RuntimeError(f"nsight-python: {type(err).__name__}: {err}") from err
    rows = frame[(frame["Annotation"] == name) & (frame["Metric"] == METRIC)]
    if len(rows) != 1:
        raise RuntimeError(f"nsight-python returned {len(rows)} rows for annotation {name!r} and {METRIC}")
    row = rows.iloc[0]
    stable = row["StableMeasurement"]
    return {
        "nsight_mean_ns": float(row["AvgValue"]),
        "nsight_std_ns": float(row["StdDev"]),
        "nsight_ci95_low_ns": float(row["CI95_Lower"]),
        "nsight_ci95_high_ns": float(row["CI95_Upper"]),
        "nsight_rel_std_pct": float(row["RelativeStdDevPct"]),
        "nsight_stable": None if pd.isna(stable) else bool(stable),
        "nsight_runs": int(row["NumRuns"]),
        "nsight_kernels": str(row["Kernel"]),
        "gpu": str(row["GPU"]),
        "compute_clock": float(row["ComputeClock"]),
        "memory_clock": float(row["MemoryClock"]),
    }


def _time_both(
    visit: Visit, spec: SweepSpec, device: torch.device, nsight: Any, flush: L2Flusher | None, runs: int
) -> tuple[Measurement, dict[str, Any]]:
    """One point's logits launches timed by the harness, then by nsight-python, on the same inputs."""
    prepared = prepare(visit, device)

    def step() -> None:
        run_launches(visit.backend, prepared.calls)

    harness = time_callable(step, device, spec.timing)
    return harness, nsight_time(nsight, step, flush if flush is not None else (lambda: None), visit.point.key, runs)


def run_nsight(
    spec: SweepSpec,
    device: torch.device,
    runs: int = DEFAULT_RUNS,
    log: Callable[[str], None] = print,
    budget_s: float | None = None,
    nsight: Any = None,
) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Every point of `spec` timed by the harness and by nsight-python: (one row per timed point, the
    configs with what happened to each). Points not started within `budget_s` are skipped, as in
    `run_torch`; `nsight` is the loaded module (`load_nsight()` when None)."""
    check_range("runs", runs, 2, 10_000)
    nsight = load_nsight() if nsight is None else nsight
    flush = L2Flusher(device) if spec.timing.cold_l2 else None
    rows, configs = [], []
    for visit, config, label in checked_visits(spec, device, "nsight", configs, log, budget_s):
        try:
            harness, timed = _time_both(visit, spec, device, nsight, flush, runs)
        except (ValueError, RuntimeError) as err:  # unsupported, unavailable, a failing kernel or nsight's refusal
            record_error(config, label, err, log)
            continue
        config["status"] = "profiled"
        ratio = harness.median_ms * 1e6 / timed["nsight_mean_ns"] if timed["nsight_mean_ns"] > 0 else float("nan")
        rows.append(
            {
                **{k: v for k, v in config.items() if k not in ("status", "reason", "tool")},
                **timed,
                "harness_median_ms": harness.median_ms,
                "harness_p25_ms": harness.p25_ms,
                "harness_p75_ms": harness.p75_ms,
                "harness_noisy": harness.noisy,
                "timing_method": harness.timing_method,
                "timer_over_nsight": ratio,
            }
        )
        log(
            f"nsight {label}: {timed['nsight_mean_ns'] / 1e3:.1f} us (CI95 {timed['nsight_ci95_low_ns'] / 1e3:.1f}-"
            f"{timed['nsight_ci95_high_ns'] / 1e3:.1f}), harness {harness.median_ms * 1e3:.1f} us, ratio {ratio:.3f}"
        )
    return pd.DataFrame(rows), configs
