"""Nsight Compute the tool: find a usable ncu, say which path runs and why, build its command line.

Paths, best first, and why this module takes the one it takes:
- the `ncu` command line (`--csv`, kernel replay, a short metric list): one row per kernel,
  works with any ncu since 2022.1; this is the path we run.
- nsight-python 1.x attaches ncu to the running process but needs ncu >= 2026.2.1 and
  reports metrics per annotation (kernels of one range combined); 0.9.x re-runs the
  calling script under ncu, i.e. this whole command. Both are detected and reported. Its
  CUPTI tool (no ncu needed) is what `--tool nsight` times with (`profiling.nsight_timing`).
Metrics are requested by name; names an ncu does not know are dropped (and listed)
rather than failing the run. The kept report becomes tables through `ncu_report` (ncu's CSV,
`ncu_tables.parse_ncu_csv`, where there is no report).
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MIN_NCU = (2022, 1, 0)  # --print-units base, --replay-mode kernel, --clock-control none
NSIGHT_PYTHON_IN_PROCESS_NCU = (2026, 2, 1)
NCU_GLOBS = ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu")
CHIPS = {(9, 0): "gh100", (8, 0): "ga100", (8, 6): "ga102", (8, 9): "ad102", (10, 0): "gb100", (12, 0): "gb202"}


class NcuUnavailable(RuntimeError):
    """Nsight Compute cannot collect counters here; the message says why and what would fix it."""


@dataclass(frozen=True)
class NcuStatus:
    """What Nsight Compute tooling is present, and which path a profile will take."""

    ncu_path: str | None
    ncu_version: tuple[int, ...] | None
    nsight_python: str | None
    counters_permitted: bool | None  # None: not knowable before a run
    path: str | None  # "ncu-cli", or None when unusable
    reason: str  # why this path, and why not the others
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def usable(self) -> bool:
        return self.path is not None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ncu_version"] = ".".join(map(str, self.ncu_version)) if self.ncu_version else None
        return out


def _version_of(text: str) -> tuple[int, ...] | None:
    match = re.search(r"Version\s+(\d+)\.(\d+)\.(\d+)", text) or re.search(r"(\d{4})\.(\d+)\.(\d+)", text)
    return tuple(int(x) for x in match.groups()) if match else None


def find_ncu(which: Callable[[str], str | None] = shutil.which, globs: Sequence[str] = NCU_GLOBS) -> str | None:
    """ncu on PATH, else the newest under the usual install folders."""
    found = which("ncu")
    if found:
        return found
    candidates = [p for pattern in globs for p in glob.glob(pattern) if os.access(p, os.X_OK)]
    return max(candidates, key=lambda p: _version_of(p) or (0,), default=None)


def _nsight_python_version() -> str | None:
    try:
        return importlib.metadata.version("nsight-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def _counters_permitted(params: Path = Path("/proc/driver/nvidia/params")) -> bool | None:
    """False when the driver restricts counters to admins and we are not root; None if unknown."""
    try:
        text = params.read_text()
    except OSError:
        return None
    restricted = re.search(r"RmProfilingAdminOnly:\s*1", text) is not None
    return not restricted or os.geteuid() == 0


def _nsight_python_note(version: str | None, ncu_version: tuple[int, ...] | None) -> str:
    if version is None:
        return "nsight-python is not installed"
    major = int(version.split(".")[0])
    if major < 1:
        return f"nsight-python {version} re-runs the calling script under ncu (this whole command), so the CLI runs a dedicated target instead"
    if ncu_version is None or ncu_version < NSIGHT_PYTHON_IN_PROCESS_NCU:
        need = ".".join(map(str, NSIGHT_PYTHON_IN_PROCESS_NCU))
        return f"nsight-python {version} attaches in-process only with ncu >= {need}"
    return f"nsight-python {version} could attach in-process, but reports per annotation; per-kernel rows need the CLI"


def detect_ncu(
    which: Callable[[str], str | None] = shutil.which,
    globs: Sequence[str] = NCU_GLOBS,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    params: Path = Path("/proc/driver/nvidia/params"),
) -> NcuStatus:
    """Look for ncu (PATH, /opt/nvidia/nsight-compute/*/ncu), its version, nsight-python, permissions."""
    ncu = find_ncu(which, globs)
    nsight_python = _nsight_python_version()
    permitted = _counters_permitted(params)
    version = None
    problems: list[str] = []
    if ncu is None:
        problems.append(
            "Nsight Compute not found (no `ncu` on PATH or under /opt/nvidia/nsight-compute/*/ncu); "
            f"install Nsight Compute >= {'.'.join(map(str, MIN_NCU))} (CUDA toolkit or NVIDIA's installer) "
            "or put its folder on PATH. The torch.profiler tables (--torch) need no ncu."
        )
    else:
        try:
            version = _version_of(run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout)
        except (OSError, subprocess.SubprocessError) as err:
            problems.append(f"`{ncu} --version` failed ({err}); reinstall Nsight Compute")
        if version is not None and version < MIN_NCU:
            problems.append(
                f"ncu {'.'.join(map(str, version))} at {ncu} is too old: need >= {'.'.join(map(str, MIN_NCU))}"
            )
        if permitted is False:
            problems.append(
                f"ncu found at {ncu}, but the driver lets only admins read GPU performance counters "
                "(RmProfilingAdminOnly=1): run as root, or load nvidia with NVreg_RestrictProfilingToAdminUsers=0"
            )
    note = _nsight_python_note(nsight_python, version)
    if problems:
        return NcuStatus(ncu, version, nsight_python, permitted, None, f"no ncu path usable; {note}", tuple(problems))
    reason = f"ncu CLI {'.'.join(map(str, version or ()))} at {ncu}: one row per kernel; {note}"
    return NcuStatus(ncu, version, nsight_python, permitted, "ncu-cli", reason)


def require_ncu(status: NcuStatus) -> str:
    """The ncu path, or one NcuUnavailable that says why not and the way out."""
    if not status.usable or status.ncu_path is None:
        raise NcuUnavailable("; ".join(status.problems) or status.reason)
    return status.ncu_path


def query_metric_names(ncu: str, chip: str, run: Callable[..., Any] = subprocess.run) -> set[str]:
    """Base metric names ncu offers for `chip` (empty when the query fails: ask for all then)."""
    try:
        out = run([ncu, "--query-metrics", "--chip", chip], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {m.group(1) for line in out.splitlines() if (m := re.match(r"^([a-z0-9]+__[A-Za-z0-9_]+)\s", line))}


def usable_metrics(wanted: Sequence[str], offered: set[str]) -> tuple[list[str], list[str]]:
    """(kept, dropped): a metric is kept when ncu offers its base name (or nothing is known)."""
    if not offered:
        return list(wanted), []
    kept = [m for m in wanted if m.split(".")[0] in offered]
    return kept, [m for m in wanted if m not in kept]


def ncu_command(
    ncu: str, metrics: Sequence[str], target: Sequence[str], launch_count: int, export: Path | None = None
) -> list[str]:
    """Kernel replay of what the target opens with cudaProfilerStart/Stop, as CSV in base units;
    with `export`, the report is also kept there (a `.ncu-rep` the Nsight Compute GUI opens)."""
    kept = ["--export", str(export), "--force-overwrite"] if export is not None else []
    return [
        ncu,
        "--csv",
        "--print-units",
        "base",
        "--clock-control",
        "none",
        "--replay-mode",
        "kernel",
        "--cache-control",
        "all",
        "--profile-from-start",
        "off",
        "--target-processes",
        "application-only",  # not the compilers JIT backends start
        "--launch-count",
        str(launch_count),
        "--metrics",
        ",".join(metrics),
        *kept,
        *target,
    ]


def missing_metrics(output: str) -> list[str]:
    """Metric names ncu said it could not find."""
    return re.findall(r"Failed to find metric\s+(?:regex:)?\^?([A-Za-z0-9_.]+)", output)


def ncu_failure(output: str, returncode: int) -> str | None:
    """One line saying why an ncu run produced nothing usable, or None."""
    if "ERR_NVGPUCTRPERM" in output:
        return (
            "ncu may not read GPU performance counters here (ERR_NVGPUCTRPERM): run as root, or load "
            "nvidia with NVreg_RestrictProfilingToAdminUsers=0"
        )
    errors = [line.strip() for line in output.splitlines() if line.startswith("==ERROR==")]
    if errors:
        return f"ncu failed (exit {returncode}): {errors[0]}"
    if returncode != 0:
        return f"ncu exited with {returncode}; see its log"
    return None
