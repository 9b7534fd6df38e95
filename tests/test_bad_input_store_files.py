"""Corrupt run files: every read names the file (any bytes, foreign rows, damaged points, a FIFO);
listings show bad runs beside good ones; a run id never leaves its root."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from run_files_support import KEY, PARQUET, POINTS, PROV, ROW, make_run, provenance

from dsa_lab import axes
from dsa_lab.store import folders as store
from dsa_lab.store import opening
from dsa_lab.store.listing import list_runs

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
        r"1 timed row\(s\) with non-finite or non-positive times .*: row 0 \(" + re.escape(KEY),
    ),
    "median inf": (lambda f: f.assign(median_ms=float("inf"), p75_ms=float("inf")), "non-finite or non-positive"),
    "median zero": (lambda f: f.assign(median_ms=0.0, p25_ms=0.0), "non-finite or non-positive"),
    "p25 negative": (lambda f: f.assign(p25_ms=-1.0), "non-finite or non-positive"),
    "quartiles swapped": (
        lambda f: f.assign(p25_ms=1.1, p75_ms=0.9),
        r"quartiles out of order .*: row 0 \(" + re.escape(KEY),
    ),
    "median above p75": (lambda f: f.assign(median_ms=2.0), "quartiles out of order"),
}


def test_untimed_rows_may_hold_no_times(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "a")
    store.append_point(
        run_dir,
        {
            **ROW,
            "next_n": 2,
            "point_key": axes.point_key({**ROW, "next_n": 2}),
            "status": "skipped",
            "median_ms": None,
            "p25_ms": None,
            "p75_ms": None,
            "iqr_ms": None,
        },
    )
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
    [
        (b'{"point_key": "a"}\n{oops}\n', "line 2 is not valid JSON"),
        (b"5\n", "line 1 is not a point"),
        (b'{"no_key": 1}\n', "line 1 is not a point"),
        (b"\xff\xfe\n", "not readable as UTF-8"),
    ],
)
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
        opening.create_run(tmp_path / "taken", provenance("taken"))


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


@pytest.mark.parametrize("name", [POINTS, PARQUET, PROV])
def test_a_fifo_in_a_run_folder_is_refused_by_name_never_read_or_written(tmp_path: Path, name: str) -> None:
    """A FIFO where a run file belongs used to block every read (and an append) of it forever."""
    run_dir = make_run(tmp_path, "a")
    (run_dir / name).unlink()
    os.mkfifo(run_dir / name)
    reads = [lambda: store.read_points(run_dir), lambda: store.append_point(run_dir, ROW)] if name == POINTS else []
    for call in (lambda: store.load_run(run_dir), *reads):
        with pytest.raises(store.RunFormatError, match=rf"{re.escape(name)}: a FIFO \(named pipe\), not a regular"):
            call()
    assert (run_dir / name).is_fifo()
