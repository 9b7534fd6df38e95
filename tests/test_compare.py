"""`compare` as a regression gate: verdicts from the stored samples, a threshold, NaN apart, exit 1, exports."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dsa_lab.analysis.compare import WALL_CLOCK, compare_runs, summarize
from dsa_lab.cli import main
from dsa_lab.store import folders as store
from dsa_lab.store import opening
from dsa_lab.store.provenance import build_provenance

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "data" / "h200" / "h200-full-20261129"
REPEAT = REPO / "data" / "h200" / "h200-repeat-20261129"
TIME_COLUMNS = ("median_ms", "p25_ms", "p75_ms", "iqr_ms", "mean_ms", "min_ms", "p10_ms", "p90_ms")


def scaled_copy(tmp_path: Path, factor: float, name: str = "slower") -> Path:
    """A copy of the shipped run with every time (samples included) multiplied by `factor`."""
    copy = tmp_path / "h200" / name
    copy.mkdir(parents=True)
    shutil.copy(SHIPPED / store.PROVENANCE_FILE, copy / store.PROVENANCE_FILE)
    frame = pd.read_parquet(SHIPPED / store.RESULTS_FILE)
    for column in TIME_COLUMNS:
        frame[column] = frame[column] * factor
    frame["samples_ms"] = frame["samples_ms"].map(lambda s: None if s is None else np.asarray(s) * factor)
    frame.to_parquet(copy / store.RESULTS_FILE, index=False)
    return copy


def test_a_copy_of_the_shipped_run_20_percent_slower_exits_1_and_names_the_regressions(tmp_path, capsys):
    slower = scaled_copy(tmp_path, 1.2)
    markdown, csv = tmp_path / "report.md", tmp_path / "report.csv"
    code = main(["compare", str(SHIPPED), str(slower), "--top", "5", "--markdown", str(markdown), "--csv", str(csv)])
    captured = capsys.readouterr()
    assert code == 1
    out = captured.out
    assert out.index("verdicts:") < out.index("top 5 of 640")  # the summary first, then the rows
    counts = dict(re.findall(r"(slower|unsure|nan|faster|same) (\d+)", out.split("verdicts:")[1].splitlines()[0]))
    slower = int(counts["slower"])
    assert slower >= 630 and slower + int(counts["unsure"]) == 640 and counts["same"] == counts["faster"] == "0"
    assert f"REGRESSION: {slower} point(s) slower by more than 5.0%" in out and "geometric mean 1.2000" in out
    assert f"{slower} regression(s)" in captured.err
    rows = pd.read_csv(csv)
    assert len(rows) == 640 and (rows.loc[rows["verdict"] == "slower", "ci_low"] > 1).all()
    assert (rows["ratio"].round(6) == 1.2).all() and rows["verdict"].iloc[0] == "slower"
    assert markdown.read_text().startswith("B = ") and "| backend | strategy |" in markdown.read_text()


def test_the_shipped_repeat_is_within_the_spread_and_exits_0(capsys):
    assert main(["compare", str(SHIPPED), str(REPEAT), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "no regression beyond 5.0%" in out and "slower 0" in out and "420 only in A" in out


def test_a_small_change_is_same_and_a_large_noisy_one_unsure(tmp_path):
    a = store.load_run(SHIPPED)
    b = store.load_run(scaled_copy(tmp_path, 1.003, "tiny-change"))
    table = compare_runs(a, b)
    assert set(table["verdict"]) <= {"same", "unsure"}  # 0.3 % is inside a 5 % threshold, never "slower"
    unsure = table[table["verdict"] == "unsure"]  # the few points whose median is noisier than the threshold
    assert len(unsure) <= 10 and unsure["note"].str.startswith("noisier than the threshold").all()
    strict = compare_runs(a, b, threshold=0.001)  # beyond a 0.1 % threshold: slower where the noise allows saying so
    assert set(strict["verdict"]) == {"slower", "unsure"} and (strict["verdict"] == "unsure").any()


def test_nan_gets_its_own_verdict(tmp_path):
    copy = scaled_copy(tmp_path, 1.0, "broken")
    frame = pd.read_parquet(copy / store.RESULTS_FILE)
    first_ok = frame.index[frame["status"] == "ok"][0]
    frame.loc[first_ok, ["status", "message"]] = ["failed", "relative error 1e-2 > 0.001"]
    frame.loc[first_ok, ["median_ms", "p25_ms", "p75_ms"]] = np.nan
    frame.to_parquet(copy / store.RESULTS_FILE, index=False)
    a, b = store.load_run(SHIPPED), store.load_run(copy)
    table = compare_runs(a, b)
    nan = table[table["verdict"] == "nan"]
    assert len(nan) == 1 and nan["note"].iloc[0] == "not timed in both: A ok, B failed"
    first_same = table.index[table["verdict"] == "same"][0]
    assert nan.index[0] < first_same  # listed before the points that did not change
    summary = summarize(table, a, b, 0.05)
    assert summary.counts["nan"] == 1 and summary.regressions == 0


def test_rows_without_samples_fall_back_to_the_interquartile_ranges(tmp_path):
    def run(name: str, median: float, device: str = "cuda") -> store.Run:
        device_name = "NVIDIA H200" if device == "cuda" else "cpu"
        provenance = build_provenance(name, device, device_name, "measured", 0, "cuda_events", {})
        run_dir = opening.create_run(tmp_path / name, provenance)
        key = "backend=reference|strategy=native|batch=1|context=64|next_n=1|cache_dtype=fp8|heads=32|head_dim=64"
        store.append_point(
            run_dir,
            {
                "point_key": key,
                "backend": "reference",
                "strategy": "native",
                "batch": 1,
                "context": "64",
                "next_n": 1,
                "cache_dtype": "fp8",
                "heads": 32,
                "head_dim": 64,
                "status": "ok",
                "message": "",
                "source": "measured",
                "median_ms": median,
                "p25_ms": median * 0.99,
                "p75_ms": median * 1.01,
                "iqr_ms": median * 0.02,
                "launches": 1,
                "kernel_rows": 1,
                "pieces": "1",
                "unique_bytes": 1e3,
                "strategy_bytes": 1e3,
                "flops": 1e6,
            },
        )
        store.write_results(run_dir)
        return store.load_run(run_dir)

    table = compare_runs(run("a", 1.0), run("b", 1.5))
    assert table["verdict"].tolist() == ["slower"] and "interquartile" in table["note"].iloc[0]
    a, b = run("cpu-a", 1.0, "cpu"), run("cpu-b", 1.68, "cpu")  # two CPU runs of the same code drift this far
    table = compare_runs(a, b)
    assert table["verdict"].tolist() == ["unsure"] and table["note"].iloc[0] == WALL_CLOCK
    summary = summarize(table, a, b, 0.05)
    assert summary.regressions == 0 and summary.lines("a", "b")[0].startswith("CPU: no verdicts")


def test_bad_threshold_and_top_are_named(capsys):
    assert main(["compare", str(SHIPPED), str(REPEAT), "--threshold", "-1"]) == 2
    assert "threshold=-1.0" in capsys.readouterr().err
    assert main(["compare", str(SHIPPED), str(REPEAT), "--top", "-2"]) == 2
    assert "--top=-2" in capsys.readouterr().err


@pytest.mark.parametrize("factor", [0.8])
def test_faster_is_not_a_regression(tmp_path, factor, capsys):
    assert main(["compare", str(SHIPPED), str(scaled_copy(tmp_path, factor)), "--top", "0"]) == 0
    out = capsys.readouterr().out
    assert int(re.search(r"faster (\d+)", out).group(1)) >= 630 and "slower 0" in out
