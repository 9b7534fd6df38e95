"""Run folders: round trip, no overwrite, atomic writes, corrupt files, resume repair, compare."""

from __future__ import annotations

import argparse
import json

import pandas as pd
import pytest

from dsa_lab import store


def provenance(run_id: str, source: str = "measured") -> dict:
    return store.build_provenance(run_id, "cpu", "cpu", source, seed=0, timing_method="wall_clock", spec={"axes": [1, 2]})


def row(backend: str, next_n: int, median: float, p25: float, p75: float, source: str = "measured", status: str = "ok") -> dict:
    point = {"backend": backend, "strategy": "native", "batch": 1, "context": "64", "next_n": next_n,
             "cache_dtype": "fp8", "heads": 32, "head_dim": 64}  # fmt: skip
    key = "|".join(f"{k}={v}" for k, v in point.items())
    return {"point_key": key, **point, "status": status, "message": "", "source": source,
            "median_ms": median, "p25_ms": p25, "p75_ms": p75, "iqr_ms": p75 - p25, "samples_ms": [median]}  # fmt: skip


def make_run(tmp_path, name: str, rows: list[dict], source: str = "measured"):
    run_dir = store.create_run(tmp_path / "cpu" / name, provenance(name, source))
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
    listing = store.list_runs(tmp_path)
    assert list(listing["run_id"]) == ["a"] and list(listing["rows"]) == [2]


def test_a_run_is_never_overwritten(tmp_path):
    run_dir = make_run(tmp_path, "a", [row("reference", 1, 1.0, 0.9, 1.1)])
    before = (run_dir / store.PROVENANCE_FILE).read_bytes()
    with pytest.raises(FileExistsError, match="never overwritten"):
        store.create_run(run_dir, provenance("a"))
    assert (run_dir / store.PROVENANCE_FILE).read_bytes() == before


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "provenance.json"
    store.write_json(target, {"old": True})

    def half_write(tmp):
        tmp.write_text('{"new": tr')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        store._atomic_write(target, half_write)
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
    store.resume_run(run_dir, {"axes": [1, 2]})
    store.append_point(run_dir, row("reference", 2, 2.0, 1.9, 2.1))
    assert [r["next_n"] for r in store.read_points(run_dir)] == [1, 2]
    with pytest.raises(ValueError, match="another sweep spec"):
        store.resume_run(run_dir, {"axes": [3]})


def test_compare_gives_ratios_and_flags_changes_beyond_the_spread(tmp_path):
    a = make_run(tmp_path, "a", [row("k", 1, 1.0, 0.95, 1.05), row("k", 2, 1.0, 0.95, 1.05), row("k", 3, 1.0, 0.95, 1.05)])
    b = make_run(tmp_path, "b", [row("k", 1, 1.5, 1.45, 1.55), row("k", 2, 1.02, 0.97, 1.07), row("k", 3, 0.5, 0.45, 0.55),
                                 row("k", 4, 9.0, 8.0, 10.0)])  # fmt: skip
    table = store.compare_runs(store.load_run(a), store.load_run(b)).set_index("next_n")
    assert sorted(table.index) == [1, 2, 3]  # next_n=4 exists only in b
    assert table.loc[1, "ratio"] == pytest.approx(1.5) and table.loc[1, "verdict"] == "slower"
    assert table.loc[2, "verdict"] == "same"
    assert table.loc[3, "ratio"] == pytest.approx(0.5) and table.loc[3, "verdict"] == "faster"


def test_compare_refuses_measured_against_modeled(tmp_path):
    a = make_run(tmp_path, "a", [row("k", 1, 1.0, 0.9, 1.1)])
    b = make_run(tmp_path, "b", [row("k", 1, 1.0, 0.9, 1.1, source="modeled")], source="modeled")
    with pytest.raises(ValueError, match="differ in source"):
        store.compare_runs(store.load_run(a), store.load_run(b))
    assert len(store.compare_runs(store.load_run(a), store.load_run(b), allow_mixed_sources=True)) == 1


def test_compare_and_runs_commands(tmp_path, capsys):
    a = make_run(tmp_path, "a", [row("k", 1, 1.0, 0.95, 1.05)])
    b = make_run(tmp_path, "b", [row("k", 1, 2.0, 1.95, 2.05)])
    parser = argparse.ArgumentParser()
    store.register_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["compare", str(a), str(b)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "slower" in out and "2.000" in out
    args = parser.parse_args(["runs", "--root", str(tmp_path)])
    assert args.func(args) == 0
    assert "a" in capsys.readouterr().out


def test_device_label():
    assert store.device_label("NVIDIA H200") == "h200"
    assert store.device_label("NVIDIA GeForce RTX 4090") == "geforce-rtx-4090"
    assert store.device_label("cpu") == "cpu"
