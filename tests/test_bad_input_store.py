"""Corrupt run and profile files: every read names the file; listings show bad runs beside good ones."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsa_lab import store
from dsa_lab.listing import list_runs
from dsa_lab.profiling.runs import ignored_note, load_profile_run, scan_profile_runs, shipped_or_cpu_reference
from dsa_lab.profiling.torch_profile import read_trace

ROW = {"point_key": "k", "backend": "reference", "strategy": "native", "batch": 1, "context": "64", "next_n": 1,
       "cache_dtype": "fp8", "heads": 32, "head_dim": 64, "status": "ok", "message": "", "source": "measured",
       "median_ms": 1.0, "p25_ms": 0.9, "p75_ms": 1.1, "iqr_ms": 0.2}  # fmt: skip


def provenance(run_id: str, created: str = "2026-01-01T00:00:00+00:00", **extra) -> dict:
    return {"schema_version": store.SCHEMA_VERSION, "run_id": run_id, "source": "measured", "device": "cpu",
            "created": created, "command": [], "timing_method": "test", "seed": 0, "environment": {}, "git": {}, **extra}  # fmt: skip


def make_run(root: Path, name: str, **extra) -> Path:
    run_dir = store.create_run(root / "cpu" / name, provenance(name, **extra))
    store.append_point(run_dir, ROW)
    store.write_results(run_dir)
    return run_dir


def make_profile(root: Path, name: str, created: str) -> Path:
    folder = store.create_run(root / "profiles" / name, provenance(name, created, kind="profile"))
    pd.DataFrame({"x": [1]}).to_parquet(folder / "torch_kernels.parquet")
    return folder


PARQUET = store.RESULTS_FILE
PROV = store.PROVENANCE_FILE
POINTS = store.POINTS_FILE

CORRUPT = {  # file, bytes written over it, what the error says
    "parquet garbage": (PARQUET, b"PAR1 not really parquet", "not a readable parquet"),
    "parquet truncated": (PARQUET, None, "not a readable parquet"),
    "parquet empty": (PARQUET, b"", "not a readable parquet"),
    "provenance not JSON": (PROV, b"{broken", "not valid JSON"),
    "provenance not UTF-8": (PROV, b"\xff\xfe\x00garbage", "not valid JSON"),
    "provenance a list": (PROV, b"[1, 2]", "expected a JSON object"),
    "provenance foreign": (PROV, b'{"hello": 1}', "missing keys"),
    "provenance schema": (PROV, json.dumps(provenance("a") | {"schema_version": 99}).encode(), "schema_version 99"),
    "provenance source": (PROV, json.dumps(provenance("a") | {"source": "guessed"}).encode(), "source 'guessed'"),
    "provenance run_id type": (
        PROV,
        json.dumps(provenance("a") | {"run_id": 5}).encode(),
        "run_id and created must be strings",
    ),
    "provenance deep nesting": (PROV, b"[" * 100_000, "not valid JSON"),
    "provenance missing": (PROV, "delete", "no provenance file"),
    "results missing": (PARQUET, "delete", "missing"),
}


def damage(run_dir: Path, name: str, content: bytes | str | None) -> None:
    path = run_dir / name
    if content == "delete":
        path.unlink()
    elif content is None:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.write_bytes(content)


@pytest.mark.parametrize("case", list(CORRUPT))
def test_load_run_names_the_damaged_file(tmp_path: Path, case: str) -> None:
    name, content, says = CORRUPT[case]
    run_dir = make_run(tmp_path, "a")
    damage(run_dir, name, content)
    with pytest.raises(store.RunFormatError, match=says) as err:
        store.load_run(run_dir)
    assert name in str(err.value)


@pytest.mark.parametrize("case", list(CORRUPT))
def test_runs_listing_shows_a_damaged_run_beside_the_good_one(tmp_path: Path, case: str) -> None:
    """One corrupt parquet used to break `dsa-lab runs` and hide every good run."""
    name, content, says = CORRUPT[case]
    make_run(tmp_path, "good")
    damage(make_run(tmp_path, "bad"), name, content)
    listing = list_runs(tmp_path).set_index("path")
    good, bad = str(tmp_path / "cpu" / "good"), str(tmp_path / "cpu" / "bad")
    assert pd.isna(listing.loc[good, "problem"]) and listing.loc[good, "rows"] == 1
    assert name in listing.loc[bad, "problem"] or case == "results missing"


BAD_ROWS = {
    "results status": (lambda f: f.assign(status="exploded"), "unknown status values"),
    "results columns": (lambda f: f.drop(columns=["median_ms"]), "missing columns"),
    "results duplicate keys": (lambda f: pd.concat([f, f]), "point_key must be unique"),
    "results key type": (lambda f: f.assign(point_key=5), "point_key must be unique strings"),
    "results source": (lambda f: f.assign(source="modeled"), "source"),
    "median NaN": (
        lambda f: f.assign(median_ms=float("nan")),
        r"1 timed row\(s\) with non-finite or non-positive times .*: row 0 \(k\)",
    ),
    "median inf": (lambda f: f.assign(median_ms=float("inf"), p75_ms=float("inf")), "non-finite or non-positive"),
    "median zero": (lambda f: f.assign(median_ms=0.0, p25_ms=0.0), "non-finite or non-positive"),
    "p25 negative": (lambda f: f.assign(p25_ms=-1.0), "non-finite or non-positive"),
    "quartiles swapped": (lambda f: f.assign(p25_ms=1.1, p75_ms=0.9), r"quartiles out of order .*: row 0 \(k\)"),
    "median above p75": (lambda f: f.assign(median_ms=2.0), "quartiles out of order"),
}


def test_untimed_rows_may_hold_no_times(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "a")
    store.append_point(run_dir, {**ROW, "point_key": "k2", "status": "skipped", "median_ms": None, "p25_ms": None,
                                 "p75_ms": None, "iqr_ms": None})  # fmt: skip
    store.write_results(run_dir)
    assert list(store.load_run(run_dir).results["status"]) == ["ok", "skipped"]


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_foreign_results_rows_name_the_file(tmp_path: Path, case: str) -> None:
    change, says = BAD_ROWS[case]
    run_dir = make_run(tmp_path, "a")
    change(pd.read_parquet(run_dir / PARQUET)).to_parquet(run_dir / PARQUET, index=False)
    with pytest.raises(store.RunFormatError, match=says) as err:
        store.load_run(run_dir)
    assert PARQUET in str(err.value)


@pytest.mark.parametrize(
    "content, says",
    [(b'{"point_key": "a"}\n{oops}\n', "line 2 is not valid JSON"), (b"5\n", "line 1 is not a point"),
     (b'{"no_key": 1}\n', "line 1 is not a point"), (b"\xff\xfe\n", "not readable as UTF-8")],
)  # fmt: skip
def test_damaged_points_name_the_file_and_line(tmp_path: Path, content: bytes, says: str) -> None:
    run_dir = make_run(tmp_path, "a")
    (run_dir / POINTS).write_bytes(content)
    with pytest.raises(store.RunFormatError, match=says) as err:
        store.read_points(run_dir)
    assert POINTS in str(err.value)


@pytest.mark.parametrize("run_id", ["../..", "..", ".", "a/b", "/etc", "", "-x", "a\\b", "x" * 129, 5, None, "a\nb"])
def test_a_run_id_cannot_leave_its_root(run_id: object) -> None:
    with pytest.raises(ValueError, match=r"run_id="):
        store.run_folder("data", "cpu", run_id)


def test_list_runs_of_a_missing_root_says_so(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"root='.*nowhere': no such folder"):
        list_runs(tmp_path / "nowhere")


def test_create_run_over_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("x")
    with pytest.raises(FileExistsError, match="taken"):
        store.create_run(tmp_path / "taken", provenance("taken"))


def test_a_damaged_profile_run_is_reported_not_skipped(tmp_path: Path) -> None:
    """A profile run with damaged provenance used to be skipped silently (notebook 04 then showed a CPU run)."""
    old = make_profile(tmp_path, "old", "2026-01-01T00:00:00+00:00")
    new = make_profile(tmp_path, "new", "2026-02-01T00:00:00+00:00")
    (new / PROV).write_bytes(b"{torn")
    scan = scan_profile_runs(tmp_path)
    assert scan.runs == [old]
    assert [folder for folder, _ in scan.ignored] == [str(new)] and "not valid JSON" in scan.ignored[0][1]
    run = shipped_or_cpu_reference(tmp_path)
    assert run.folder == old and run.ignored == scan.ignored
    assert f"ignored {new}: " in ignored_note(run) and PROV in ignored_note(run)


def test_a_profile_run_with_a_damaged_table_is_passed_over_with_the_file_named(tmp_path: Path) -> None:
    old = make_profile(tmp_path, "old", "2026-01-01T00:00:00+00:00")
    new = make_profile(tmp_path, "new", "2026-02-01T00:00:00+00:00")
    (new / "torch_kernels.parquet").write_bytes(b"PAR1 nope")
    with pytest.raises(store.RunFormatError, match="torch_kernels.parquet"):
        load_profile_run(new)
    run = shipped_or_cpu_reference(tmp_path)
    assert run.folder == old and "torch_kernels.parquet" in ignored_note(run)
    (new / "torch_kernels.parquet").unlink()
    (new / "ncu_raw.txt.gz").write_bytes(b"\x1f\x8b not gzip")
    with pytest.raises(store.RunFormatError, match="ncu_raw.txt.gz"):
        load_profile_run(new)


@pytest.mark.parametrize("content", [b"\x1f\x8b\x08 broken", gzip.compress(b"{nope"), gzip.compress(b'{"x": 1}')])
def test_a_damaged_trace_names_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "trace.json.gz"
    path.write_bytes(content)
    with pytest.raises(store.RunFormatError, match="trace.json.gz"):
        read_trace(path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=200), name=st.sampled_from([PROV, PARQUET]))
def test_any_bytes_in_a_run_file_give_a_run_format_error_naming_it(tmp_path: Path, content: bytes, name: str) -> None:
    run_dir = tmp_path / "cpu" / "a"
    if not run_dir.exists():
        make_run(tmp_path, "a")
    good = {n: (run_dir / n).read_bytes() for n in (PROV, PARQUET)}
    (run_dir / name).write_bytes(content)
    try:
        store.load_run(run_dir)
    except store.RunFormatError as err:
        assert name in str(err)
    finally:
        for n, data in good.items():
            (run_dir / n).write_bytes(data)


@settings(max_examples=80, deadline=None)
@given(run_id=st.text(max_size=20))
def test_any_accepted_run_id_stays_under_its_root(run_id: str) -> None:
    root = Path("/data-root")
    try:
        folder = store.run_folder(root, "cpu", run_id)
    except ValueError:
        return
    assert folder.parent.parent == root and folder.name == run_id and ".." not in folder.parts
