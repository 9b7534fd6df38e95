"""A stand-in for nsight-python 1.1.0 on a machine without a GPU: the API surface dsa_lab uses, mirrored.

What it mirrors (read from nsight-python 1.1.0's sources): importing it activates the NCU tool
unless NSPY_NCU_INIT_AT_IMPORT=0; `activate` takes a `Tool` and refuses to switch tools;
`annotate(name)` opens a range, refusing nesting and a name used twice in one run;
`analyze.kernel(configs=, runs=, metrics=, combine_kernel_metrics=, thermal_mode=, verbosity=,
output_prefix=)` decorates a function whose call returns `ProfileResults`, whose `to_dataframe()`
has one row per (annotation, metric) with AvgValue, StdDev, MinValue, MaxValue, NumRuns, CI95_Lower,
CI95_Upper, RelativeStdDevPct, StableMeasurement (RelativeStdDevPct < 2), Metric, Unit, Kernel, GPU,
Host, ComputeClock, MemoryClock; the CUPTI tool collects only gpu__time_duration.sum, and more than
one kernel in an annotation needs combine_kernel_metrics. What it cannot mirror: the GPU. Each
annotated range counts as one kernel named `stand-in`, timed by the host clock.
"""

from __future__ import annotations

import enum
import functools
import math
import os
import socket
import time
from types import SimpleNamespace

import pandas as pd

INIT_AT_IMPORT = os.environ.get("NSPY_NCU_INIT_AT_IMPORT", "1")  # what the variable was when we were imported
__version__ = "1.1.0"


class Tool(str, enum.Enum):  # noqa: UP042 (nsight-python 1.1.0 declares it so)
    NCU = "ncu"
    CUPTI = "cupti"


class VerbosityLevel(enum.IntEnum):
    SILENT = 0
    INFO = 1
    DEBUG = 2


_active: Tool | None = None
_used: set[str] = set()
_open: list[str] = []
_ranges: list[tuple[str, int]] = []  # (annotation, duration ns) of the session in progress


def activate(tool: Tool) -> None:
    global _active
    if not isinstance(tool, Tool):
        raise ValueError(f"tool must be a nsight.Tool member, got {tool!r}")
    if _active is not None and _active != tool:
        raise RuntimeError(f"{_active!r} is already active; cannot switch to {tool!r}")
    _active = tool


def get_active_tool() -> Tool | None:
    return _active


class annotate:  # noqa: N801 (nsight-python's name)
    def __init__(self, name: str, ignore_failures: bool = False) -> None:
        self.name = name

    def __enter__(self) -> annotate:
        if _open:
            raise ValueError(f"Nested annotations are not supported. Cannot enter annotation '{self.name}'")
        if self.name in _used:
            raise ValueError(f"Annotation name '{self.name}' has already been used in this profiling run.")
        _used.add(self.name)
        _open.append(self.name)
        self.started = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> bool:
        _ranges.append((self.name, time.perf_counter_ns() - self.started))
        _open.pop()
        return False


def _kernel(
    _func=None,
    *,
    configs=None,
    runs: int = 1,
    metrics=("gpu__time_duration.sum",),
    combine_kernel_metrics=None,
    thermal_mode: str = "auto",
    verbosity: VerbosityLevel = VerbosityLevel.INFO,
    output_prefix: str | None = None,
):
    if thermal_mode not in ("auto", "manual", "off"):
        raise ValueError(f"Invalid thermal_mode {thermal_mode!r}")
    if output_prefix is not None:
        os.makedirs(os.path.dirname(output_prefix) or ".", exist_ok=True)

    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, configs=configs):
            if _active != Tool.CUPTI:
                raise RuntimeError("the stand-in profiles with the CUPTI tool only (activate(Tool.CUPTI) first)")
            if list(metrics) != ["gpu__time_duration.sum"]:
                raise ValueError("metrics must be ['gpu__time_duration.sum']")
            settings = [tuple(args)] if args else list(configs) if configs is not None else [()]
            _ranges.clear()
            for config in settings:
                for _ in range(runs):
                    _used.clear()
                    func(*config)
            frames = []
            for name in dict.fromkeys(n for n, _ in _ranges):
                values = [float(ns) for n, ns in _ranges if n == name]
                if len(values) % (len(settings) * runs):
                    raise RuntimeError("Expect same number of kernels per run.")
                per_run = len(values) // (len(settings) * runs)
                if per_run > 1 and combine_kernel_metrics is None:
                    raise RuntimeError(
                        f"More than one (total={per_run}) kernel is launched within the {name} annotation."
                    )
                frames.append(_row(name, values, runs))
            return SimpleNamespace(to_dataframe=lambda: pd.DataFrame(frames))

        return wrapper

    return decorate if _func is None else decorate(_func)


def _row(name: str, values: list[float], runs: int) -> dict[str, object]:
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else float("nan")
    half = 1.96 * std / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    relative = 100 * std / abs(mean) if mean and len(values) > 1 else float("nan")
    return {
        "Annotation": name,
        "AvgValue": mean,
        "StdDev": std,
        "MinValue": min(values),
        "MaxValue": max(values),
        "NumRuns": runs,
        "CI95_Lower": mean - half,
        "CI95_Upper": mean + half,
        "RelativeStdDevPct": relative,
        "StableMeasurement": pd.NA if math.isnan(relative) else relative < 2.0,
        "Metric": "gpu__time_duration.sum",
        "Unit": "ns",
        "Kernel": "stand-in",
        "GPU": "stand-in (CPU)",
        "Host": socket.gethostname(),
        "ComputeClock": 0,
        "MemoryClock": 0,
    }


analyze = SimpleNamespace(kernel=_kernel)

if INIT_AT_IMPORT != "0":
    activate(Tool.NCU)  # as nsight-python does: Nsight Compute must attach before CUDA starts
