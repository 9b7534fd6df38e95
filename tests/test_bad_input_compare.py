"""`dsa-lab compare` as a gate that cannot pass by accident: nothing compared, other devices, bad samples, too
few or too noisy samples, and outputs that would overwrite a run are each refused or judged by name."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsa_lab import axes
from dsa_lab.analysis.compare import VERDICT_SAMPLES, NothingCompared, compare_runs
from dsa_lab.cli import main
from dsa_lab.store import folders as store

AXES = {
    "backend": "reference",
    "strategy": "native",
    "context": "64",
    "cache_dtype": "fp8",
    "heads": 32,
    "head_dim": 64,
}
GRID = {(b, n): 0.1 * b * n for b in (1, 2, 4) for n in (1, 2)}
ROOT = Path(__file__).resolve().parents[1]


def key(batch: int, next_n: int) -> str:
    later = {a.name: a.old_value for a in axes.AXES if a.name not in AXES and a.old_value is not axes.ALWAYS_STORED}
    values = {**later, **AXES, "batch": batch, "next_n": next_n}  # axes added since: their old-run value
    return axes.point_key(values)


def make_run(
    root: Path,
    name: str,
    medians: dict[tuple[int, int], float],
    *,
    noise: float = 0.01,
    samples: int = 20,
    seed: int = 0,
    status: str = "ok",
    device: str = "cuda",
    device_name: str = "NVIDIA H200",
    stored=None,
) -> Path:
    """A run with one row per (batch, next_n): log-normal samples around each median; `stored(samples)`
    replaces the stored samples (not the quartiles)."""
    rng = np.random.default_rng(seed)
    folder = root / name
    folder.mkdir(parents=True)
    provenance = {
        "schema_version": store.SCHEMA_VERSION,
        "run_id": name,
        "source": "measured",
        "device": device,
        "device_name": device_name,
        "created": "2026-01-01T00:00:00+00:00",
        "command": [],
        "timing_method": "test",
        "seed": 0,
        "environment": {},
        "git": {},
    }
    (folder / store.PROVENANCE_FILE).write_text(json.dumps(provenance))
    rows = []
    for (batch, next_n), median in medians.items():
        values = median * np.exp(noise * rng.standard_normal(samples))
        ok = status == "ok"
        p25, mid, p75 = np.percentile(values, [25, 50, 75]) if ok else (None, None, None)
        kept = stored(values) if stored is not None else values
        rows.append(
            {
                "point_key": key(batch, next_n),
                **AXES,
                "batch": batch,
                "next_n": next_n,
                "status": status,
                "message": "",
                "source": "measured",
                "median_ms": mid,
                "p25_ms": p25,
                "p75_ms": p75,
                "iqr_ms": None if p25 is None else p75 - p25,
                "samples": samples if ok else None,
                "samples_ms": list(kept) if ok else None,
                "launches": 1,
                "kernel_rows": batch * next_n,
                "pieces": str(next_n),
                "unique_bytes": 1e6,
                "strategy_bytes": 1e6,
                "flops": 1e9,
            }
        )
    pd.DataFrame(rows).to_parquet(folder / store.RESULTS_FILE, index=False)
    return folder


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("strict", [[], ["--strict"]])
def test_no_shared_point_exits_2_with_the_reason(tmp_path: Path, capsys, strict: list[str]) -> None:
    """Runs sharing no point used to exit 0, 'no regression', having compared nothing (with --strict too)."""
    a, b = make_run(tmp_path, "a", {(1, 1): 1.0}), make_run(tmp_path, "b", {(2, 2): 1.0})
    assert main(["compare", str(a), str(b), *strict]) == 2
    assert "share no point: nothing was compared, so there is no verdict" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("untimed", ["A", "B"])
def test_an_untimed_run_exits_2_naming_it(tmp_path: Path, capsys, untimed: str) -> None:
    """An untimed baseline (every point skipped) used to pass the gate."""
    a = make_run(tmp_path, "a", GRID, status="skipped" if untimed == "A" else "ok")
    b = make_run(tmp_path, "b", GRID, status="skipped" if untimed == "B" else "ok")
    assert main(["compare", str(a), str(b)]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"none timed in {untimed}: {a if untimed == 'A' else b}" in line
    with pytest.raises(NothingCompared):
        compare_runs(store.load_run(a), store.load_run(b))


def test_another_device_is_refused_unless_allowed_and_then_labelled(tmp_path: Path, capsys) -> None:
    """An H200 run against a CPU run with the same axes used to get verdicts with no word about the devices."""
    a = make_run(tmp_path, "a", GRID)
    b = make_run(tmp_path, "b", GRID, device="cpu", device_name="cpu")
    assert main(["compare", str(a), str(b)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "different devices (device 'cuda' -> 'cpu'; device_name 'NVIDIA H200' -> 'cpu')" in line
    assert "--allow-cross-device" in line
    assert main(["compare", str(a), str(b), "--allow-cross-device", "--top", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("CROSS-DEVICE: device 'cuda' -> 'cpu'; device_name 'NVIDIA H200' -> 'cpu'")
    assert "CPU: no verdicts" in out and "no regression verdict: a run was timed on a CPU" in out
    assert "no regression beyond" not in out
    gpu = make_run(tmp_path, "b200", GRID, device_name="NVIDIA B200")
    assert main(["compare", str(a), str(gpu)]) == 2 and "'NVIDIA H200' -> 'NVIDIA B200'" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["negative", "nan", "zero", "inf"])
def test_bad_samples_behind_a_regression_are_refused_by_name(tmp_path: Path, capsys, bad: str) -> None:
    """Negative samples behind a 20 % regression used to turn it into 'unsure' and pass the gate."""
    change = {
        "negative": lambda v: -v,
        "nan": lambda v: np.where(np.arange(len(v)) % 2, np.nan, v),
        "zero": lambda v: v * 0,
        "inf": lambda v: np.where(np.arange(len(v)) % 3, v, np.inf),
    }[bad]
    a = make_run(tmp_path, "a", GRID, seed=1)
    b = make_run(tmp_path, "b", {k: v * 1.2 for k, v in GRID.items()}, seed=2, stored=change)
    assert main(["compare", str(a), str(b)]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{b / store.RESULTS_FILE}: timed rows whose samples_ms are not a list of finite, positive times" in line


def test_a_real_regression_with_quiet_samples_exits_1(tmp_path: Path, capsys) -> None:
    a = make_run(tmp_path, "a", GRID, seed=1)
    b = make_run(tmp_path, "b", {k: v * (1.2 if k == (4, 2) else 1.0) for k, v in GRID.items()}, seed=2)
    assert main(["compare", str(a), str(b), "--top", "1"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION: 1 point(s) slower by more than 5.0%" in out and re.search(r"slower 1, unsure 0, nan 0", out)


@pytest.mark.parametrize("samples, noise", [(3, 0.01), (VERDICT_SAMPLES - 1, 0.01), (20, 0.8)])
def test_too_few_or_too_noisy_samples_get_no_verdict(tmp_path: Path, capsys, samples: int, noise: float) -> None:
    """Three to five samples a point on a busy CPU used to read as 'REGRESSION ... beyond their noise'."""
    a = make_run(tmp_path, "a", GRID, samples=samples, noise=noise, seed=1)
    b = make_run(tmp_path, "b", {k: v * 3 for k, v in GRID.items()}, samples=samples, noise=noise, seed=2)
    assert main(["compare", str(a), str(b), "--top", "0"]) == 0
    out = capsys.readouterr().out
    assert "slower 0, unsure 6" in out and "no verdict (unsure) for 6 point(s)" in out
    table = compare_runs(store.load_run(a), store.load_run(b))
    why = "too few samples" if samples < VERDICT_SAMPLES else "noisier than the threshold"
    assert table["note"].str.startswith(why).all()


@pytest.mark.parametrize("flagged", ["a", "b"])
def test_a_point_flagged_noisy_when_timed_gets_no_verdict(tmp_path: Path, flagged: str) -> None:
    """Issue 21's harness flags a point whose IQR passes its noisy_rel_iqr; many samples pin such a point's
    median within its run, not the drift between two runs on a busy CPU, so it gets no verdict either."""
    a = make_run(tmp_path, "a", GRID, seed=1)
    b = make_run(tmp_path, "b", {k: v * 1.2 for k, v in GRID.items()}, seed=2)
    path = {"a": a, "b": b}[flagged] / store.RESULTS_FILE
    pd.read_parquet(path).assign(noisy=True).to_parquet(path, index=False)
    table = compare_runs(store.load_run(a), store.load_run(b))
    assert set(table["verdict"]) == {"unsure"}
    assert table["note"].str.startswith(f"noisy when timed (run {flagged.upper()}:").all()


def test_two_real_back_to_back_ci_benches_compare_with_exit_0(tmp_path: Path) -> None:
    """Issue 21: two `bench --preset ci` runs of the same code on this CPU; noise is never a regression."""
    runs = []
    for name in ("a", "b"):
        out = tmp_path / "cpu" / name
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "dsa_lab.cli",
                "bench",
                "--preset",
                "ci",
                "--device",
                "cpu",
                "--no-progress",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(out)
    done = subprocess.run(
        [sys.executable, "-m", "dsa_lab.cli", "compare", *map(str, runs), "--top", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "slower 0" in done.stdout and "no regression verdict: a run was timed on a CPU" in done.stdout


@pytest.mark.parametrize("flag", ["--csv", "--markdown"])
@pytest.mark.parametrize("target", ["results", "provenance", "inside", "folder"])
def test_an_output_inside_a_run_compared_is_refused_and_the_run_kept(
    tmp_path: Path, capsys, flag: str, target: str
) -> None:
    """`compare A B --csv A/results.parquet` used to overwrite the baseline's results with a CSV."""
    a, b = make_run(tmp_path, "a", GRID, seed=1), make_run(tmp_path, "b", GRID, seed=2)
    path = {
        "results": a / store.RESULTS_FILE,
        "provenance": b / store.PROVENANCE_FILE,
        "inside": a / "new.csv",
        "folder": a,
    }[target]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["compare", str(a), str(b), flag, str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{flag}={str(path)!r}" in line and "an output never overwrites an input" in line
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_outputs_go_to_a_temp_file_then_move(tmp_path: Path, monkeypatch, capsys) -> None:
    a, b = make_run(tmp_path, "a", GRID, seed=1), make_run(tmp_path, "b", GRID, seed=2)
    out = tmp_path / "out.csv"
    out.write_text("old")
    moved = []
    real = store.os.replace
    monkeypatch.setattr(store.os, "replace", lambda src, dst: (moved.append(Path(dst)), real(src, dst))[1])
    assert main(["compare", str(a), str(b), "--csv", str(out), "--markdown", str(tmp_path / "out.md")]) == 0
    assert moved == [out, tmp_path / "out.md"] and len(pd.read_csv(out)) == len(GRID)
    assert main(["compare", str(a), str(b), "--csv", str(out), "--markdown", str(out)]) == 2
    assert "both name" in capsys.readouterr().err


def test_compare_help_works(capsys) -> None:
    """A bare '%' in a help string used to crash `compare --help`."""
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--help"])
    assert exit_.value.code == 0 and "5 %" in capsys.readouterr().out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(factor=st.floats(1.3, 5.0), noise=st.floats(0.001, 0.02))
def test_any_clear_regression_on_quiet_samples_is_slower(tmp_path: Path, factor: float, noise: float) -> None:
    folder = Path(tempfile.mkdtemp(dir=tmp_path))  # one folder an example (two examples may print alike)
    a = make_run(folder, "a", GRID, noise=noise, seed=1)
    b = make_run(folder, "b", {k: v * factor for k, v in GRID.items()}, noise=noise, seed=2)
    assert set(compare_runs(store.load_run(a), store.load_run(b))["verdict"]) == {"slower"}
