"""Sweeps on CPU: each point checked, timed or skipped with its reason; wrong numbers fail untimed and
exceptions error while the sweep goes on; an interrupted sweep resumes without duplicates; --max-minutes
stops cleanly and points too big are skipped."""

from __future__ import annotations

import pytest
from bench_support import rows_by_key, tiny

from dsa_lab.bench import walk
from dsa_lab.bench.point import expand
from dsa_lab.bench.sweep import run_sweep
from dsa_lab.store import folders as store
from dsa_lab.store.format import LOCK_FILE

# ---------------------------------------------------------------- sweeps


def test_sweep_checks_times_and_skips_with_reasons(tmp_path, injected):
    spec = tiny(backend=("reference", "deepgemm", "test-narrow"))
    summary = run_sweep(spec, tmp_path / "run", "cpu", progress=False)
    assert summary.stop_reason == "complete" and summary.remaining == 0
    rows = rows_by_key(tmp_path / "run")
    assert len(rows) == len(expand(spec))
    by = {(r["backend"], r["strategy"], r["next_n"]): r for r in rows.values()}
    ok = by[("reference", "native", 3)]
    assert ok["status"] == "ok" and ok["rel_err"] <= 1e-3 and ok["median_ms"] > 0
    assert ok["timing_method"] == "wall_clock" and ok["device"] == "cpu" and ok["source"] == "measured"
    assert ok["launches"] == 1 and ok["kernel_rows"] == 6 and ok["strategy_bytes"] > 0
    assert by[("reference", "flatten", 3)]["pieces"] == "6x1"
    assert "same launch as native" in by[("reference", "atom", 3)]["message"]  # any next_n is native
    assert ok["pieces"] == "3" and ok["native_sizes"] == ",".join(map(str, range(1, 17)))
    dg = by[("deepgemm", "native", 1)]
    assert dg["status"] == "skipped" and "needs a CUDA GPU" in dg["message"]
    narrow = by[("test-narrow", "native", 3)]
    assert narrow["status"] == "skipped" and "natively only next_n in [1, 2]" in narrow["message"]
    assert by[("test-narrow", "atom", 3)]["status"] == "ok"  # 3 = 2 + 1 natively
    assert by[("test-narrow", "atom", 3)]["pieces"] == "2+1" and by[("test-narrow", "atom", 3)]["launches"] == 2
    run = store.load_run(tmp_path / "run")
    assert set(run.results["status"]) == {"ok", "skipped"}
    assert run.provenance["progress"]["stop_reason"] == "complete"
    timed = run.results[run.results["status"] == "ok"]
    assert set(timed["torch_threads"]) == {1} and set(timed["noisy"]) <= {True, False}  # stored per row
    assert run.provenance["spec"]["timing"]["cpu_threads"] == 1


def test_wrong_numbers_fail_untimed_and_exceptions_error_while_the_sweep_goes_on(tmp_path, injected):
    spec = tiny(backend=("test-wrong", "test-hole", "test-broken", "reference"), strategy=("native",), next_n=(1,))
    run_sweep(spec, tmp_path / "run", "cpu", progress=False)
    by = {r["backend"]: r for r in store.read_points(tmp_path / "run")}
    assert by["test-wrong"]["status"] == "failed" and "relative error" in by["test-wrong"]["message"]
    assert by["test-wrong"]["median_ms"] is None and "samples" not in by["test-wrong"]
    assert by["test-hole"]["status"] == "failed" and "NaN" in by["test-hole"]["message"]
    assert by["test-broken"]["status"] == "error" and "kernel exploded" in by["test-broken"]["message"]
    assert by["reference"]["status"] == "ok"  # after the error, the sweep went on


def test_interrupted_sweep_resumes_without_duplicates(tmp_path):
    spec = tiny()
    total = len(expand(spec))
    first = run_sweep(spec, tmp_path / "run", "cpu", max_points=2, progress=False)
    assert first.stop_reason == "max_points" and first.recorded_now == 2 and first.remaining == total - 2
    with pytest.raises(FileExistsError):
        run_sweep(spec, tmp_path / "run", "cpu", progress=False)  # no silent overwrite
    with pytest.raises(ValueError, match="another sweep spec"):
        run_sweep(tiny(next_n=(1,)), tmp_path / "run", "cpu", resume=True, progress=False)
    assert not (tmp_path / "run" / LOCK_FILE).exists()  # the lock goes with its sweep
    second = run_sweep(spec, tmp_path / "run", "cpu", resume=True, progress=False)
    assert second.recorded_before == 2 and second.recorded_now == total - 2 and second.remaining == 0
    keys = [row["point_key"] for row in store.read_points(tmp_path / "run")]
    assert len(keys) == len(set(keys)) == total
    assert len(store.load_run(tmp_path / "run").results) == total


def test_max_minutes_stops_cleanly_and_points_too_big_are_skipped(tmp_path, monkeypatch):
    stopped = run_sweep(tiny(), tmp_path / "a", "cpu", max_minutes=0, progress=False)
    assert stopped.stop_reason == "max_minutes" and stopped.recorded_now == 0
    monkeypatch.setattr(walk, "free_device_bytes", lambda device: 1000)
    run_sweep(tiny(strategy=("native",), next_n=(1,)), tmp_path / "b", "cpu", progress=False)
    (row,) = store.read_points(tmp_path / "b")
    assert row["status"] == "skipped" and "GiB free" in row["message"] and row["estimated_bytes"] > 1000
