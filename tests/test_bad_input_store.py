"""Corrupt run and profile files: every read names the file; listings show bad runs beside good ones."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsa_lab import axes
from dsa_lab.kernels import backend_names
from dsa_lab.profiling.runs import ignored_note, load_profile_run, scan_profile_runs, shipped_or_cpu_reference
from dsa_lab.profiling.torch_profile import read_trace
from dsa_lab.store import folders as store
from dsa_lab.store import opening
from dsa_lab.store.format import LOCK_FILE
from dsa_lab.store.listing import list_runs

ROW = {
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
    "median_ms": 1.0,
    "p25_ms": 0.9,
    "p75_ms": 1.1,
    "iqr_ms": 0.2,
    "launches": 1,
    "kernel_rows": 1,
    "pieces": "1",
    "unique_bytes": 1e3,
    "strategy_bytes": 1e3,
    "flops": 1e6,
}  # the plan's columns: every timed row has them
KEY = ROW["point_key"] = axes.point_key(ROW)  # a row's key is its axes' (`store.format.check_keys`)


def rekey(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with each row's point_key made again from its axes, as a producer that changed them would."""
    return frame.assign(point_key=[axes.point_key(row) for row in frame.to_dict("records")])


def provenance(run_id: str, created: str = "2026-01-01T00:00:00+00:00", **extra) -> dict:
    return {
        "schema_version": store.SCHEMA_VERSION,
        "run_id": run_id,
        "source": "measured",
        "device": "cpu",
        "created": created,
        "command": [],
        "timing_method": "test",
        "seed": 0,
        "environment": {},
        "git": {},
        **extra,
    }


def make_run(root: Path, name: str, **extra) -> Path:
    run_dir = opening.create_run(root / "cpu" / name, provenance(name, **extra))
    store.append_point(run_dir, ROW)
    store.write_results(run_dir)
    return run_dir


def make_profile(root: Path, name: str, created: str) -> Path:
    folder = opening.create_run(root / "profiles" / name, provenance(name, created, kind="profile"))
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


# ---------------------------------------------------------------- links: nothing is written through one

VICTIM = b"a file outside the run folder\n"


def _resumable(tmp_path: Path) -> Path:
    """A CPU run of two points with one recorded, through the CLI (as a user makes one)."""
    from dsa_lab.cli import main

    out = tmp_path / "root" / "cpu" / "run"
    assert main([*FAST_BENCH, "--next-n", "1,2", "--out", str(out), "--max-points", "1"]) == 0
    return out


FAST_BENCH = [
    "bench",
    "--preset",
    "ci",
    "--backend",
    "reference",
    "--batch",
    "1",
    "--context",
    "64",
    "--strategy",
    "native",
    "--no-progress",
    "--device",
    "cpu",
    "--max-seconds-per-point",
    "0.01",
]


@pytest.mark.parametrize("name", [LOCK_FILE, POINTS])
def test_resume_never_writes_through_a_link_in_the_run_folder(tmp_path: Path, capsys, name: str) -> None:
    """`bench --resume` used to write through a `.lock` or `points.jsonl` link (run_lock opened it 'a+' and
    truncated it; append_point appended), outside the run folder: git stores links, so a run can carry one."""
    from dsa_lab.cli import main

    out = _resumable(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    (out / name).unlink(missing_ok=True)
    (out / name).symlink_to(victim)
    capsys.readouterr()
    assert main([*FAST_BENCH, "--next-n", "1,2", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"{out / name}: a symbolic link (to {victim})" in err and len(err.strip().splitlines()) == 1
    assert victim.read_bytes() == VICTIM


def test_a_fresh_run_into_a_folder_with_a_lock_link_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "fresh"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    (out / LOCK_FILE).symlink_to(victim)
    with pytest.raises(store.RunFormatError, match=r"\.lock: a symbolic link"):
        with opening.run_lock(out):
            pass
    dangling = tmp_path / "dangling"
    dangling.mkdir()
    (dangling / LOCK_FILE).symlink_to(tmp_path / "would-be-created")
    with pytest.raises(store.RunFormatError, match=r"\.lock: a symbolic link"):
        with opening.run_lock(dangling):
            pass
    assert victim.read_bytes() == VICTIM and not (tmp_path / "would-be-created").exists()


def test_append_point_refuses_a_link_and_a_planted_temp_file_is_never_followed(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "a")
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    (run_dir / POINTS).unlink()
    (run_dir / POINTS).symlink_to(victim)
    with pytest.raises(store.RunFormatError, match=r"points\.jsonl: a symbolic link"):
        store.append_point(run_dir, ROW)
    (run_dir / POINTS).unlink()
    store.append_point(run_dir, ROW)
    planted = run_dir / f".{PROV}.tmp-{os.getpid()}"  # write_atomic's temp name: a link there is removed, not followed
    planted.symlink_to(victim)
    store.update_provenance(run_dir, note="x")
    assert victim.read_bytes() == VICTIM and not planted.is_symlink()
    assert json.loads((run_dir / PROV).read_text())["note"] == "x" and not (run_dir / PROV).is_symlink()


def test_load_run_refuses_a_run_file_that_is_a_link(tmp_path: Path) -> None:
    a, b = make_run(tmp_path, "a"), make_run(tmp_path, "b")
    (a / PARQUET).unlink()
    (a / PARQUET).symlink_to(b / PARQUET)
    with pytest.raises(store.RunFormatError, match=r"results\.parquet: a symbolic link"):
        store.load_run(a)
    listing = list_runs(tmp_path).set_index("path")
    assert "results.parquet: a symbolic link" in listing.loc[str(a), "problem"]


# ---------------------------------------------------------------- a folder left by a kill inside create_run


def _stuck(tmp_path: Path) -> Path:
    out = tmp_path / "root" / "cpu" / "stuck"
    out.mkdir(parents=True)
    (out / LOCK_FILE).write_text("pid 99999\n")
    (out / f".{PROV}.tmp-99999").write_text('{"schema_version": 1, "run_id": "st')  # cut off mid-write
    return out


def test_a_folder_left_by_a_kill_inside_create_run_is_completed_and_its_leftovers_cleared(tmp_path: Path) -> None:
    """Such a folder (only `.lock` and a temp provenance) used to be neither creatable nor resumable."""
    from dsa_lab.cli import main

    out = _stuck(tmp_path)
    assert main([*FAST_BENCH, "--next-n", "1", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [POINTS, PROV, PARQUET]
    assert len(store.load_run(out).results) == 1


def test_resuming_a_folder_left_by_a_kill_inside_create_run_says_what_it_is(tmp_path: Path, capsys) -> None:
    from dsa_lab.cli import main

    out = _stuck(tmp_path)
    assert main([*FAST_BENCH, "--next-n", "1", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "killed while it was being created" in err and f".{PROV}.tmp-99999" in err and "without --resume" in err
    with pytest.raises(ValueError, match="killed while it was being created"):
        opening.require_run(out)


def test_a_resumed_run_clears_the_temp_files_of_a_writer_killed_mid_write(tmp_path: Path) -> None:
    from dsa_lab.cli import main

    out = _resumable(tmp_path)
    (out / f".{PARQUET}.tmp-99999").write_bytes(b"PAR1 half")
    assert main([*FAST_BENCH, "--next-n", "1,2", "--out", str(out), "--resume"]) == 0
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name] and len(store.load_run(out).results) == 2


def test_a_resumed_log_must_hold_only_its_grid_and_sane_rows(tmp_path: Path, capsys) -> None:
    from dsa_lab.cli import main

    out = _resumable(tmp_path)
    row = store.read_points(out)[0]
    foreign = {**row, "batch": 9, "point_key": row["point_key"].replace("batch=1", "batch=9")}
    with open(out / POINTS, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(foreign) + "\n")
    (out / PARQUET).unlink()
    assert main([*FAST_BENCH, "--next-n", "1,2", "--out", str(out), "--resume"]) == 2
    assert "1 logged point(s) not in the run's grid, e.g. " in capsys.readouterr().err
    (out / POINTS).write_text(json.dumps({**row, "next_n": 2}) + "\n")  # its key no longer its axes
    with pytest.raises(store.RunFormatError, match=r"points\.jsonl: line 1 holds point_key .* but its axes make"):
        store.read_points(out)
    (out / POINTS).write_text(json.dumps({**row, "median_ms": "fast"}) + "\n")
    with pytest.raises(store.RunFormatError, match=r"points\.jsonl: line 1 is timed but its median_ms is 'fast'"):
        store.read_points(out)
    (out / POINTS).write_text(json.dumps({**row, "status": "great"}) + "\n")
    with pytest.raises(store.RunFormatError, match=r"points\.jsonl: line 1 has status 'great'"):
        store.read_points(out)


# ---------------------------------------------------------------- loads validate types and schemas

TYPED = {
    "times as numeric strings": (lambda f: f.assign(median_ms=f["median_ms"].map(str)), r"'median_ms' is not a number"),
    "next_n NaN": (lambda f: f.assign(next_n=float("nan")), r"column 'next_n' must hold integers"),
    "next_n 1.5": (lambda f: f.assign(next_n=1.5), r"column 'next_n' must hold integers"),
    "next_n 17": (lambda f: f.assign(next_n=17), r"column 'next_n': next_n=17: allowed range is \[1, 16\]"),
    "batch as strings": (lambda f: f.assign(batch="1"), r"column 'batch' must hold integers"),
    "batch 0": (lambda f: f.assign(batch=0), r"column 'batch': batch=0: allowed range is \[1, "),
    "context an int": (lambda f: f.assign(context=64), r"column 'context' holds non-text"),
    "context not a label": (lambda f: f.assign(context="64K"), r"column 'context': context='64K': stored as '65536', its one spelling"),
    "strategy unknown": (lambda f: f.assign(strategy="diagonal"), r"column 'strategy': strategy='diagonal': allowed values are"),
    "cache_dtype unknown": (lambda f: f.assign(cache_dtype="int8"), r"column 'cache_dtype': cache_dtype='int8': allowed values are"),
    "backend with markup": (lambda f: f.assign(backend="<img src=x onerror=alert(1)>"), r"column 'backend' holds a value that is not a plain name"),
    "heads no kernel has": (lambda f: f.assign(heads=48), r"column 'heads': heads=48: allowed values are"),
    "only the minimal columns": (lambda f: f[list(store.RESULT_COLUMNS)],
                                 r"timed rows without the plan's columns \['launches', 'kernel_rows', 'pieces'"),
    "samples negative": (lambda f: f.assign(samples_ms=[[-1.0, -2.0]]), r"samples_ms are not a list of finite, positive"),
    "samples NaN": (lambda f: f.assign(samples_ms=[[float("nan")]]), r"samples_ms are not a list"),
    "samples strings": (lambda f: f.assign(samples_ms=[["1.0"]]), r"samples_ms are not a list"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TYPED))
def test_load_run_validates_every_column_naming_the_file_and_rows(tmp_path: Path, case: str) -> None:
    """Times stored as strings, a NaN next_n or only the minimal columns used to load, then break a
    notebook with a raw TypeError or KeyError; a backend name with markup used to load and go live
    through the latency explorer's pandas Styler (a backend is now a plain name)."""
    change, says = TYPED[case]
    run_dir = make_run(tmp_path, "a")
    change(pd.read_parquet(run_dir / PARQUET)).to_parquet(run_dir / PARQUET, index=False)
    with pytest.raises(store.RunFormatError, match=says) as err:
        store.load_run(run_dir)
    assert PARQUET in str(err.value) and (f"row 0 ({KEY})" in str(err.value) or "columns" in case)


def test_a_run_of_a_backend_this_checkout_does_not_know_loads(tmp_path: Path) -> None:
    """A backend from a module not loaded here (docs/add_a_kernel.md) is a plain name in a stored run."""
    run_dir = make_run(tmp_path, "a")
    rekey(pd.read_parquet(run_dir / PARQUET).assign(backend="nobody")).to_parquet(run_dir / PARQUET, index=False)
    assert list(store.load_run(run_dir).results["backend"]) == ["nobody"]


@pytest.mark.parametrize("backend", backend_names())
def test_every_registered_backend_and_a_run_from_before_the_config_axis_load(tmp_path: Path, backend: str) -> None:
    """The vocabularies are the axis table's: every registered backend is a name a run may hold, and a run
    stored before the `config` axis existed (no column) loads with the value it was measured at."""
    run_dir = make_run(tmp_path, "a")
    frame = rekey(pd.read_parquet(run_dir / PARQUET).assign(backend=backend))
    frame.drop(columns=[c for c in ("config",) if c in frame]).to_parquet(run_dir / PARQUET, index=False)
    results = store.load_run(run_dir).results
    assert list(results["backend"]) == [backend] and list(results["config"]) == [axes.axis("config").old_value]


PROVENANCE_TYPES = {
    "git a string": ({"git": "abc"}, r"git must be dict"),
    "environment a list": ({"environment": [1]}, r"environment must be dict"),
    "created not a time": ({"created": "yesterday"}, r"created 'yesterday' is not an ISO 8601 time"),
    "run_id with markup": ({"run_id": "<script>x</script>"}, r"run_id '<script>x</script>' is not a plain name"),
    "seed a string": ({"seed": "zero"}, r"seed must be int"),
    "seed a bool": ({"seed": True}, r"seed must be int"),
    "device_name a number": ({"device_name": 7}, r"device_name must be str"),
}


@pytest.mark.parametrize("case", list(PROVENANCE_TYPES))
def test_provenance_fields_have_their_types(tmp_path: Path, case: str) -> None:
    change, says = PROVENANCE_TYPES[case]
    run_dir = make_run(tmp_path, "a")
    path = run_dir / PROV
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(store.RunFormatError, match=says) as err:
        store.load_run(run_dir)
    assert PROV in str(err.value)


def test_a_run_with_no_rows_still_loads(tmp_path: Path) -> None:
    run_dir = opening.create_run(tmp_path / "cpu" / "empty", provenance("empty"))
    store.write_results(run_dir)
    assert store.load_run(run_dir).results.empty


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.one_of(st.text(max_size=6), st.floats(allow_nan=True), st.booleans(), st.none()))
def test_any_non_integer_batch_is_refused_by_name(tmp_path: Path, value: object) -> None:
    run_dir = tmp_path / "cpu" / "a"
    if not run_dir.exists():
        make_run(tmp_path, "a")
    frame = pd.read_parquet(run_dir / PARQUET)
    frame["batch"] = pd.Series([value], dtype=object)
    try:
        frame.to_parquet(run_dir / PARQUET, index=False)
    except Exception:  # pyarrow cannot store this value at all: nothing to load
        return
    with pytest.raises(store.RunFormatError, match=r"column 'batch'"):
        store.load_run(run_dir)
    frame.assign(batch=1).to_parquet(run_dir / PARQUET, index=False)


@pytest.mark.parametrize("drop", ["created", "kind"])
def test_profile_discovery_reports_the_runs_it_skips(tmp_path: Path, drop: str) -> None:
    """A profile run whose provenance lacks 'created' or 'kind' used to be skipped silently."""
    folder = make_profile(tmp_path, "p", "2026-01-01T00:00:00+00:00")
    path = folder / PROV
    fields = json.loads(path.read_text())
    fields.pop(drop)
    path.write_text(json.dumps(fields))
    scan = scan_profile_runs(tmp_path)
    assert scan.runs == [] and [f for f, _ in scan.ignored] == [str(folder)]
    assert PROV in scan.ignored[0][1] and (drop in scan.ignored[0][1] or "kind" in scan.ignored[0][1])


@pytest.mark.parametrize("drop", ["created", "kind"])
def test_find_profile_runs_names_the_runs_it_passes_over(tmp_path: Path, drop: str) -> None:
    """`find_profile_runs` (re-exported by dsa_lab.profile) used to return [] for such a run without a word."""
    from dsa_lab.profiling import find_profile_runs

    folder = make_profile(tmp_path, "p", "2026-01-01T00:00:00+00:00")
    (folder / "torch_kernels.parquet").unlink()
    (folder / "trace_reference.json.gz").write_bytes(gzip.compress(b"{}"))  # only a trace: still a profile's file
    path = folder / PROV
    fields = json.loads(path.read_text())
    fields.pop(drop)
    path.write_text(json.dumps(fields))
    with pytest.warns(UserWarning, match=rf"find_profile_runs: ignored {re.escape(str(folder))}: .*{PROV}"):
        assert find_profile_runs(tmp_path) == []


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
