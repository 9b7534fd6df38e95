"""A kept Nsight Compute report (`.ncu-rep`) as the kernel table, read through NVIDIA's `ncu-report`.

`ncu-report` (PyPI; 2026.3 reads the reports ncu 2025.3 writes, on a machine without a GPU)
opens the report itself, so a run that kept its report no longer depends on parsing ncu's CSV
by hand; `ncu_tables.parse_ncu_csv` stays for older runs, which kept only ncu's printed output
(`ncu_raw.txt.gz`). The table has `parse_ncu_csv`'s columns (id, kernel, grid, block, one per
friendly metric in bytes and nanoseconds, l2_read_bytes), so `attach_configs` and
`summarize_ncu` read either. The kernel is its demangled name; the reader's demangler spells
template arguments with their casts (`<(unsigned int)4, ...>` where ncu 2025.3's CSV prints
`<4, ...>`), the name before `<` is the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from dsa_lab.profiling.ncu_tables import METRICS, SECTOR_BYTES, UNIT_SCALE

INSTALL_HINT = "pip install 'ncu-report>=2026.3.1' (NVIDIA's report reader; it needs no GPU)"


class NcuReportUnavailable(RuntimeError):
    """The `ncu-report` package is not installed here."""


def _module() -> Any:
    try:
        import ncu_report
    except ImportError as err:
        raise NcuReportUnavailable(f"reading .ncu-rep files needs the ncu-report package: {INSTALL_HINT}") from err
    return ncu_report


def _value(action: Any, metric: str) -> float:
    """A metric of one profiled kernel in bytes or nanoseconds (NaN when the report lacks it)."""
    if metric not in action.metric_names():
        return float("nan")
    entry = action[metric]
    value = entry.value()
    if not isinstance(value, (int, float)):
        return float("nan")
    return float(value) * UNIT_SCALE.get(str(entry.unit()).strip().lower(), 1.0)


def _dims(action: Any, kind: str) -> str:
    return "({}, {}, {})".format(*(int(action[f"launch__{kind}_dim_{axis}"].value()) for axis in "xyz"))


def read_ncu_report(path: str | Path) -> pd.DataFrame:
    """One row per profiled kernel of the report at `path`, numbered in profiling order as ncu's CSV
    numbers them; raises `NcuReportUnavailable` without the package and `ValueError` naming the file
    when it cannot be read or holds nothing profiled."""
    module = _module()
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no Nsight Compute report there")
    try:
        report = module.load_report(str(path))
    except Exception as err:  # the reader raises its own types for damaged files
        raise ValueError(f"{path}: not a readable Nsight Compute report ({type(err).__name__}: {err})") from None
    if report.num_ranges() == 0:  # what the reader makes of a file that is no report, too
        raise ValueError(f"{path}: not a readable Nsight Compute report (no profiled range in it)")
    rows = []
    for range_index in range(report.num_ranges()):
        profiled = report.range_by_idx(range_index)
        for action_index in range(profiled.num_actions()):
            action = profiled.action_by_idx(action_index)
            row = {
                "id": len(rows),
                "kernel": action.name(module.IAction.NameBase_DEMANGLED),
                "grid": _dims(action, "grid"),
                "block": _dims(action, "block"),
            }
            row.update({name: _value(action, metric) for name, metric in METRICS.items()})
            rows.append(row)
    table = pd.DataFrame(rows, columns=["id", "kernel", "grid", "block", *METRICS])
    table["l2_read_bytes"] = table["l2_read_sectors"] * SECTOR_BYTES
    return table
