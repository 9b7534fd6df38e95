"""Run folders: round trip, no overwrite, atomic writes, corrupt files, resume repair, compare."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dsa_lab.store import folders as store
from dsa_lab.store import opening
from dsa_lab.store import writes as file_writes
from dsa_lab.store.format import LOCK_FILE
from dsa_lab.store.listing import list_runs
from dsa_lab.store.provenance import build_provenance


def provenance(run_id: str, source: str = "measured") -> dict:
    return build_provenance(run_id, "cpu", "cpu", source, seed=0, timing_method="wall_clock", spec={"axes": [1, 2]})


PLAN = {"launches": 1, "kernel_rows": 1, "pieces": "1", "unique_bytes": 1e3, "strategy_bytes": 1e3, "flops": 1e6}


def row(
    backend: str, next_n: int, median: float, p25: float, p75: float, source: str = "measured", status: str = "ok"
) -> dict:
    point = {
        "backend": backend,
        "strategy": "native",
        "batch": 1,
        "context": "64",
        "next_n": next_n,
        "cache_dtype": "fp8",
        "heads": 32,
        "head_dim": 64,
    }
    key = "|".join(f"{k}={v}" for k, v in point.items())
    return {
        "point_key": key,
        **point,
        "status": status,
        "message": "",
        "source": source,
        "median_ms": median,
        "p25_ms": p25,
        "p75_ms": p75,
        "iqr_ms": p75 - p25,
        "samples_ms": [median],
        **PLAN,
    }


def make_run(tmp_path, name: str, rows: list[dict], source: str = "measured"):
    run_dir = opening.create_run(tmp_path / "cpu" / name, provenance(name, source))
    for r in rows:
        store.append_point(run_dir, r)
    store.write_results(run_dir)
    return run_dir


def test_round_trip_keeps_rows_and_provenance(tmp_path):
    run_dir = make_run(tmp_path, "a", [row("reference", 1, 1.0, 0.9, 1.1), row("reference", 2, 2.0, 1.9, 2.1)])
    run = store.load_run(run_dir)
    assert list(run.results["next_n"]) == [1, 2]
    assert run.provenance["source"] == "measured" and run.provenance["seed"] == 0
    assert "tree_sha256" in run.provenance["git"] and run.provenance["environment"]["torch"]
    assert store.load_run(run_dir / store.RESULTS_FILE).results.equals(run.results)
    listing = list_runs(tmp_path)
    assert list(listing["run_id"]) == ["a"] and list(listing["rows"]) == [2]


def test_a_run_is_never_overwritten(tmp_path):
    run_dir = make_run(tmp_path, "a", [row("reference", 1, 1.0, 0.9, 1.1)])
    before = (run_dir / store.PROVENANCE_FILE).read_bytes()
    with pytest.raises(FileExistsError, match="never overwritten"):
        opening.create_run(run_dir, provenance("a"))
    assert (run_dir / store.PROVENANCE_FILE).read_bytes() == before


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "provenance.json"
    file_writes.write_json(target, {"old": True})

    def half_write(handle):
        handle.write(b'{"new": tr')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        file_writes.write_atomic(target, half_write)
    assert json.loads(target.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["provenance.json"]


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        (store.RESULTS_FILE, b"PAR1 not really parquet", "not a readable parquet"),
        (store.PROVENANCE_FILE, b"{broken json", "not valid JSON"),
        (store.PROVENANCE_FILE, b'{"hello": 1}', "missing keys"),
    ],
)
def test_corrupt_or_foreign_files_name_the_file_and_touch_nothing(tmp_path, name, content, match):
    run_dir = make_run(tmp_path, "a", [row("reference", 1, 1.0, 0.9, 1.1)])
    (run_dir / name).write_bytes(content)
    snapshot = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    with pytest.raises(store.RunFormatError, match=match) as err:
        store.load_run(run_dir)
    assert name in str(err.value)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == snapshot


def test_foreign_parquet_is_rejected(tmp_path):
    run_dir = make_run(tmp_path, "a", [row("reference", 1, 1.0, 0.9, 1.1)])
    pd.DataFrame({"x": [1]}).to_parquet(run_dir / store.RESULTS_FILE)
    with pytest.raises(store.RunFormatError, match="missing columns"):
        store.load_run(run_dir)


def test_rows_whose_source_contradicts_the_provenance_are_rejected(tmp_path):
    run_dir = make_run(tmp_path, "a", [row("reference", 1, 1.0, 0.9, 1.1, source="modeled")])
    with pytest.raises(store.RunFormatError, match="source"):
        store.load_run(run_dir)


def test_a_torn_last_line_is_ignored_then_repaired_on_resume(tmp_path):
    run_dir = make_run(tmp_path, "a", [row("reference", 1, 1.0, 0.9, 1.1)])
    with open(run_dir / store.POINTS_FILE, "a") as handle:
        handle.write('{"point_key": "cut off mid-wr')
    assert len(store.read_points(run_dir)) == 1
    environment = store.read_provenance(run_dir / store.PROVENANCE_FILE)["environment"]
    opening.check_resume(run_dir, {"axes": [1, 2]}, "cpu", "cpu", environment)
    store.append_point(run_dir, row("reference", 2, 2.0, 1.9, 2.1))
    assert [r["next_n"] for r in store.read_points(run_dir)] == [1, 2]
    with pytest.raises(ValueError, match="another sweep spec"):
        opening.check_resume(run_dir, {"axes": [3]}, "cpu", "cpu", environment)


def test_the_lock_is_exclusive_names_its_holder_and_goes_with_it(tmp_path):
    run_dir = tmp_path / "run"
    with opening.run_lock(run_dir):
        assert "pid" in (run_dir / LOCK_FILE).read_text()
        with pytest.raises(opening.RunLocked, match="being written by pid"):
            with opening.run_lock(run_dir):
                pass
        opening.create_run(run_dir, provenance("run"))  # the lock file does not make the folder "existing"
    assert not (run_dir / LOCK_FILE).exists()
    with opening.run_lock(run_dir):
        pass


def test_device_label():
    assert store.device_label("NVIDIA H200") == "h200"
    assert store.device_label("NVIDIA GeForce RTX 4090") == "geforce-rtx-4090"
    assert store.device_label("cpu") == "cpu"
