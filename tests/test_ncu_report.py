"""The shipped Nsight Compute reports (ncu 2025.3.1 on the H200) read through ncu-report, on this CPU:
the same table, kernel for kernel, as ncu's own CSV of the same run, which the profile runs kept."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np
import pytest

from dsa_lab.profiling.ncu_report import read_ncu_report
from dsa_lab.profiling.ncu_tables import METRICS, PERCENT_COLUMNS, parse_ncu_csv

pytest.importorskip("ncu_report")
EXPERIMENTS = Path(__file__).resolve().parents[1] / "data" / "h200" / "experiments"
WITH_CSV = ("gluon-ncu-20261130", "gluon-ncu-pr340-20261130")  # profile runs: a report and ncu's output per backend


def _shipped(run: str) -> Path:
    folder = EXPERIMENTS / run
    if not folder.is_dir():
        pytest.skip(f"{folder} is not in this checkout")
    return folder


def _csv_by_backend(folder: Path) -> dict[str, str]:
    with gzip.open(folder / "ncu_raw.txt.gz", "rt", encoding="utf-8") as handle:
        parts = re.split(r"^### ncu run for backend (\S+)\n", handle.read(), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def _short(name: str) -> str:
    return name.removeprefix("void ").split("<")[0].split("(")[0]


@pytest.mark.parametrize("run", WITH_CSV)
def test_a_report_reads_as_ncus_csv_of_the_same_run(run: str) -> None:
    folder = _shipped(run)
    for backend, printed in _csv_by_backend(folder).items():
        from_csv, from_report = parse_ncu_csv(printed), read_ncu_report(folder / f"ncu_{backend}.ncu-rep")
        assert list(from_report.columns) == list(from_csv.columns) and len(from_report) == len(from_csv) > 0
        assert list(from_report["id"]) == list(from_csv["id"])
        assert list(from_report["grid"]) == list(from_csv["grid"]) and list(from_report["block"]) == list(
            from_csv["block"]
        )
        assert list(map(_short, from_report["kernel"])) == list(map(_short, from_csv["kernel"]))
        for column in (*METRICS, "l2_read_bytes"):
            exact = column not in PERCENT_COLUMNS  # ncu's CSV prints percentages to two decimals
            expected, got = from_csv[column].to_numpy(float), from_report[column].to_numpy(float)
            assert np.allclose(got, expected, rtol=1e-9 if exact else 0, atol=0 if exact else 0.006, equal_nan=True), (
                backend,
                column,
                got,
                expected,
            )


def test_every_shipped_report_opens() -> None:
    """Round 9 and 10's reports were taken with other sections (source counters, warp stalls): the
    metrics they lack are NaN, and every one has its kernels' durations and launch shapes."""
    reports = sorted(EXPERIMENTS.rglob("*.ncu-rep")) if EXPERIMENTS.is_dir() else []
    if not reports:
        pytest.skip("no shipped .ncu-rep files in this checkout")
    for path in reports:
        table = read_ncu_report(path)
        logits = table[~table["kernel"].str.contains("dsa_lab_ncu_marker")]
        assert not logits.empty and (logits["duration_ns"] > 0).all(), path
        assert logits["grid"].str.match(r"\(\d+, \d+, \d+\)").all() and (logits["block"] != "(0, 0, 0)").all(), path


def test_a_file_that_is_not_a_report_is_named(tmp_path: Path) -> None:
    bogus = tmp_path / "ncu_x.ncu-rep"
    bogus.write_text("not a report")
    with pytest.raises(ValueError, match=f"{bogus}: not a readable Nsight Compute report"):
        read_ncu_report(bogus)
    with pytest.raises(ValueError, match="no Nsight Compute report there"):
        read_ncu_report(tmp_path / "absent.ncu-rep")
