"""Run folders holding links or leftovers: nothing is written or read through a link; a folder left by a kill
inside create_run is completed or named; a resumed run clears stale temp files and its log holds only its
grid and sane rows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from run_files_support import PARQUET, POINTS, PROV, ROW, make_run

from dsa_lab.store import folders as store
from dsa_lab.store import opening
from dsa_lab.store.format import LOCK_FILE
from dsa_lab.store.listing import list_runs
from tests.battery import FAST_BENCH

# ---------------------------------------------------------------- links: nothing is written through one

VICTIM = b"a file outside the run folder\n"


def _resumable(tmp_path: Path) -> Path:
    """A CPU run of two points with one recorded, through the CLI (as a user makes one)."""
    from dsa_lab.cli import main

    out = tmp_path / "root" / "cpu" / "run"
    assert main([*FAST_BENCH, "--next-n", "1,2", "--out", str(out), "--max-points", "1"]) == 0
    return out


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
