"""A run folder opened for writing: a fresh one (`check_new_folder`, `create_run`), its lock for the whole sweep
(`run_lock`: one writer at a time, a second refused with `RunLocked`), or an existing one reopened to resume
(`require_run`, `check_resume`: refused when its rows disagree with its log, or it was started with another spec, or
on another device or environment).

A folder left by a kill inside `create_run` (only `.lock` and our temp files) is recognised: a fresh run clears
those leftovers by name and starts, a resume says what the folder is. Nothing is opened through a link
(`writes.check_no_links`, O_NOFOLLOW).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from dsa_lab.env_info import RESUME_FIELDS
from dsa_lab.store.folders import read_points, read_provenance, repair_points
from dsa_lab.store.format import LOCK_FILE, POINTS_FILE, PROVENANCE_FILE, RESULTS_FILE, RunFormatError
from dsa_lab.store.writes import TEMP_PATTERN, check_no_links, open_no_follow, write_json, writing


class RunLocked(RuntimeError):
    """Another process is writing this run folder."""


def leftovers(run_dir: Path) -> list[str]:
    """Names in `run_dir` that a killed writer leaves behind: `.lock` and `write_atomic`'s temp files."""
    if not run_dir.is_dir():
        return []
    return sorted(p.name for p in run_dir.iterdir() if p.name == LOCK_FILE or TEMP_PATTERN.fullmatch(p.name))


def _clear_temp_files(run_dir: Path) -> None:
    """Remove `write_atomic`'s temp files of an earlier writer, by name (called under the run's lock)."""
    for name in leftovers(run_dir):
        if name != LOCK_FILE:
            with writing(run_dir / name, "remove the leftover"):
                (run_dir / name).unlink()


def check_new_folder(run_dir: Path) -> None:
    """A fresh run may go into `run_dir`: absent, empty, or holding only what a killed writer left."""
    if run_dir.exists() and not run_dir.is_dir():
        raise FileExistsError(f"run folder {run_dir} is an existing file, not a folder; choose another --run-id/--out")
    check_no_links(run_dir)
    if run_dir.is_dir() and set(p.name for p in run_dir.iterdir()) - set(leftovers(run_dir)):
        raise FileExistsError(
            f"run folder {run_dir} already exists and is never overwritten: "
            "resume it (--resume) or choose another --run-id/--out"
        )


def require_run(run_dir: Path, flag: str = "--resume") -> None:
    """A run to continue is in `run_dir` (its provenance.json), else a ValueError saying what the folder is.

    Judgement: a folder left by a kill inside `create_run` (only `.lock` and temp files) is
    not resumed, since no provenance says what it was; the same command without `--resume`
    starts it afresh and clears those leftovers by name.
    """
    if (run_dir / PROVENANCE_FILE).is_file() or (run_dir / PROVENANCE_FILE).is_symlink():
        return
    left = leftovers(run_dir)
    if left and set(left) == {p.name for p in run_dir.iterdir()}:
        raise ValueError(
            f"{flag}: {run_dir} was left by a run killed while it was being created (it holds only "
            f"{', '.join(left)}): there is nothing to resume; run the same command without {flag} to start it "
            "afresh (those leftovers are cleared)"
        )
    raise ValueError(f"{flag}: {run_dir} holds no run to resume (no {PROVENANCE_FILE})")


def create_run(run_dir: str | Path, provenance: dict[str, Any]) -> Path:
    """Make a fresh run folder holding provenance.json; refuse if the folder already holds anything
    but a killed writer's leftovers, which are removed by name."""
    run_dir = Path(run_dir)
    check_new_folder(run_dir)
    with writing(run_dir, "create the run folder"):
        run_dir.mkdir(parents=True, exist_ok=True)
    _clear_temp_files(run_dir)
    write_json(run_dir / PROVENANCE_FILE, provenance)
    return run_dir


@contextlib.contextmanager
def run_lock(run_dir: str | Path) -> Iterator[Path]:
    """Hold an exclusive lock on a run folder (created if absent) until the block ends.

    A second process asking for the same folder gets `RunLocked` at once, naming the
    holder; the lock dies with its process, so a killed sweep never leaves it stuck.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise FileExistsError(f"run folder {run_dir} is an existing file, not a folder; choose another --run-id/--out")
    path = run_dir / LOCK_FILE
    check_no_links(run_dir)  # before the first open: the folder itself may be a link
    with writing(run_dir, "create the run folder"):
        run_dir.mkdir(parents=True, exist_ok=True)
    while True:
        handle = os.fdopen(open_no_follow(path, os.O_RDWR | os.O_CREAT, "lock"), "r+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise RunLocked(
                f"run folder {run_dir} is being written by {holder}; wait for it to finish, or choose another "
                "--run-id/--out"
            ) from None
        if path.exists() and os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
            break  # still the file at `path` (not one a finishing holder just removed)
        handle.close()
    try:
        check_no_links(run_dir)
        _clear_temp_files(run_dir)  # an earlier writer's, killed mid-write: nobody else writes here now
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} since {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}\n")
        handle.flush()
        yield run_dir
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        handle.close()


def check_resume(
    run_dir: str | Path, spec: dict[str, Any], device: str, device_name: str, environment: dict[str, Any]
) -> dict[str, Any]:
    """Reopen a run to continue it, or refuse with the reason; returns its provenance.

    Refused when: the run was started with another spec; its rows disagree with its log
    (results.parquet holds a point points.jsonl lacks, or another status or time for it:
    rebuilding from the log would lose or change rows); or it was measured on another
    device or environment (`env_info.RESUME_FIELDS`), whose times must not be mixed in.
    """
    run_dir = Path(run_dir)
    check_no_links(run_dir)
    require_run(run_dir)
    provenance = read_provenance(run_dir / PROVENANCE_FILE)
    if provenance.get("kind") is not None:  # a profile run (or an experiment's folder) is not a sweep's log
        raise RunFormatError(
            f"{run_dir / PROVENANCE_FILE}: a {provenance['kind']!r} run, not a timing run: only a timing run resumes"
        )
    if provenance.get("spec") != json.loads(json.dumps(spec, default=str)):
        raise ValueError(
            f"{run_dir / PROVENANCE_FILE}: the run was started with another sweep spec; "
            "resume only with the same axes, or start a new run"
        )
    _check_log_against_results(run_dir)
    here = {"device": device, "device_name": device_name}
    there = {"device": provenance.get("device"), "device_name": provenance.get("device_name", device_name)}
    recorded = provenance.get("environment") or {}
    differ = [f"{key} {there[key]!r} -> {here[key]!r}" for key in here if there[key] != here[key]]
    differ += [
        f"{key} {recorded.get(key)!r} -> {environment.get(key)!r}"
        for key in RESUME_FIELDS
        if key in recorded and recorded.get(key) != environment.get(key)
    ]
    if differ:
        raise ValueError(
            f"{run_dir / PROVENANCE_FILE}: the run was measured on another device or environment "
            f"({'; '.join(differ)}); its times must not be mixed with these: start a new run"
        )
    repair_points(run_dir / POINTS_FILE)
    return provenance


def _check_log_against_results(run_dir: Path) -> None:
    results_path = run_dir / RESULTS_FILE
    if not results_path.is_file():
        return
    try:
        results = pd.read_parquet(results_path, columns=None)
    except Exception as err:  # pyarrow raises several types for corrupt files
        raise RunFormatError(f"{results_path}: not a readable parquet file ({type(err).__name__}: {err})") from None
    if results.empty:
        return
    if "point_key" not in results:
        raise RunFormatError(f"{results_path}: not a dsa_lab results file (no point_key column)")
    logged = {row["point_key"]: row for row in read_points(run_dir)}
    missing = [key for key in results["point_key"] if key not in logged]
    if missing:
        raise RunFormatError(
            f"{run_dir}: {RESULTS_FILE} holds {len(results)} points, {len(missing)} of them not in {POINTS_FILE} "
            f"({len(logged)} logged; e.g. {missing[0]}): resuming rebuilds the results from the log and would "
            "lose them; refusing. Restore the log, or start a new run"
        )
    for row in results.itertuples(index=False):
        log = logged[row.point_key]
        same_status = str(log.get("status")) == str(getattr(row, "status", None))
        a, b = log.get("median_ms"), getattr(row, "median_ms", None)
        same_time = (a is None and (b is None or b != b)) or (a is not None and b is not None and math.isclose(a, b))
        if not (same_status and same_time):
            raise RunFormatError(
                f"{run_dir}: point {row.point_key} is {getattr(row, 'status', '?')} {b} in {RESULTS_FILE} but "
                f"{log.get('status')} {a} in {POINTS_FILE}: the files disagree; refusing to resume"
            )
