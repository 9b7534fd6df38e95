"""Runs that cannot be corrupted on resume: a second writer refused, a folder whose rows disagree with its
log, another device or environment, a failed workload (and --retry-errors), an interrupt recorded."""

from __future__ import annotations

import os
import shutil

import pandas as pd
import pytest
from bench_support import REPO, _bench_argv, _one_line, tiny

from dsa_lab.bench import inputs as bench_inputs
from dsa_lab.bench import walk
from dsa_lab.bench.point import SweepSpec
from dsa_lab.bench.sweep import run_sweep
from dsa_lab.cli import main
from dsa_lab.store import folders as store
from dsa_lab.store import opening

# ---------------------------------------------------------------- runs that cannot be corrupted


def test_a_second_writer_is_refused_while_the_first_holds_the_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(_bench_argv(run_dir, "--max-points", "1")) == 0
    with opening.run_lock(run_dir):  # another sweep is writing this folder
        before = (run_dir / store.POINTS_FILE).read_bytes()
        with pytest.raises(opening.RunLocked, match=f"run folder {run_dir} is being written by pid {os.getpid()}"):
            run_sweep(tiny(), run_dir, "cpu", resume=True, progress=False)
        capsys.readouterr()
        assert main(_bench_argv(run_dir, "--resume")) == 2
        line = _one_line(capsys.readouterr().err)
        assert line.startswith("dsa-lab bench: error: run folder") and "is being written by pid" in line
        assert (run_dir / store.POINTS_FILE).read_bytes() == before
    assert main(_bench_argv(run_dir, "--resume")) == 0  # the lock died with its holder


def test_resume_refuses_a_folder_whose_rows_disagree_with_its_log(tmp_path):
    """A copy of the shipped 840-point run without points.jsonl: resuming would rebuild 3 rows from the log."""
    shipped = REPO / "data" / "h200" / "h200-full-20261129"
    run_dir = tmp_path / "h200" / "copy"
    run_dir.mkdir(parents=True)
    for name in (store.PROVENANCE_FILE, store.RESULTS_FILE):
        shutil.copy(shipped / name, run_dir / name)
    before = (run_dir / store.RESULTS_FILE).read_bytes()
    spec = SweepSpec.from_dict(store.read_provenance(run_dir / store.PROVENANCE_FILE)["spec"])
    with pytest.raises(store.RunFormatError, match="results.parquet holds 840 points, 840 of them not in points.jsonl"):
        run_sweep(spec, run_dir, "cpu", resume=True, progress=False)
    assert (run_dir / store.RESULTS_FILE).read_bytes() == before and not (run_dir / store.POINTS_FILE).exists()

    small = tmp_path / "small"
    run_sweep(tiny(), small, "cpu", progress=False)
    frame = pd.read_parquet(small / store.RESULTS_FILE)
    frame.loc[frame["status"] == "ok", "median_ms"] *= 2  # results edited behind the log's back
    frame.to_parquet(small / store.RESULTS_FILE, index=False)
    with pytest.raises(store.RunFormatError, match="the files disagree; refusing to resume"):
        run_sweep(tiny(), small, "cpu", resume=True, progress=False)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"device": "cuda", "device_name": "NVIDIA H200"},
            "device 'cuda' -> 'cpu'; device_name 'NVIDIA H200' -> 'cpu'",
        ),
        ({"environment": {"torch": "1.0.0"}}, "torch '1.0.0' -> "),
        (
            {"environment": {"deepgemm_pr340_origin": "deepseek-ai/DeepGEMM@57b90e0"}},
            "deepgemm_pr340_origin 'deepseek-ai/DeepGEMM@57b90e0' -> None",
        ),
    ],
)
def test_resume_refuses_another_device_or_environment(tmp_path, change, says):
    run_dir = tmp_path / "run"
    run_sweep(tiny(), run_dir, "cpu", max_points=1, progress=False)
    provenance = store.read_provenance(run_dir / store.PROVENANCE_FILE)
    if "environment" in change:
        change = {"environment": {**provenance["environment"], **change["environment"]}}
    store.update_provenance(run_dir, **change)
    rows = (run_dir / store.POINTS_FILE).read_bytes()
    with pytest.raises(ValueError, match=f"measured on another device or environment \\({says}"):
        run_sweep(tiny(), run_dir, "cpu", resume=True, progress=False)
    assert (run_dir / store.POINTS_FILE).read_bytes() == rows


def test_a_failed_workload_errors_its_own_points_only_and_retry_errors_reruns_them(tmp_path, monkeypatch):
    real = bench_inputs.Workload

    class Flaky(real):
        def __init__(self, point, *args, **kwargs):
            if point.batch == 1:
                raise RuntimeError("CUDA out of memory (simulated)")
            super().__init__(point, *args, **kwargs)

    monkeypatch.setattr(walk, "Workload", Flaky)
    spec = tiny(batch=(1, 2, 3), strategy=("native",))
    run_sweep(spec, tmp_path / "run", "cpu", progress=False)
    status = {(r["batch"], r["next_n"]): (r["status"], r["message"]) for r in store.read_points(tmp_path / "run")}
    assert {k for k, (s, _) in status.items() if s == "error"} == {(1, 1), (1, 3)}
    assert "workload not built: RuntimeError: CUDA out of memory" in status[(1, 3)][1]
    assert all(s == "ok" for (b, _), (s, _) in status.items() if b != 1)  # later workloads built afresh

    monkeypatch.setattr(walk, "Workload", real)
    again = run_sweep(spec, tmp_path / "run", "cpu", resume=True, progress=False)
    assert again.recorded_now == 0 and again.remaining == 0  # a plain resume leaves error rows alone
    retried = run_sweep(spec, tmp_path / "run", "cpu", resume=True, retry_errors=True, progress=False)
    assert retried.recorded_now == 2 and retried.counts == {"ok": 2}
    results = store.load_run(tmp_path / "run").results
    assert len(results) == 6 and set(results["status"]) == {"ok"}
    assert len(store.read_points(tmp_path / "run")) == 8  # the log keeps the error rows too


def test_an_interrupt_is_recorded_exits_130_and_says_how_to_resume(tmp_path, injected, capsys):
    run_dir = tmp_path / "run"
    argv = [*_bench_argv(run_dir), "--backend", "test-interrupted", "--next-n", "1,3"]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert f"Resume with: dsa-lab bench --resume --out {run_dir}" in err
    provenance = store.read_provenance(run_dir / store.PROVENANCE_FILE)
    assert provenance["progress"]["stop_reason"] == "interrupted"
    assert [r["next_n"] for r in store.read_points(run_dir)] == [1]  # the point in flight re-runs on resume
    assert store.load_run(run_dir).results["status"].tolist() == ["ok"]
