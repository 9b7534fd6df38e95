"""Runs on disk: `data/<device>/<run_id>/` = results.parquet + provenance.json (+ points.jsonl).

A sweep appends one JSON line per finished point to `points.jsonl` (flushed and
fsynced), so an interrupted run loses at most the point in flight and resumes where it
stopped; `write_results` turns the lines into `results.parquet` (atomic: tmp file +
os.replace). A run folder is never overwritten, and only one process writes it at a time
(`run_lock`: an exclusive lock for the whole sweep; a second writer is refused with
`RunLocked`). Resuming (`check_resume`) refuses a folder whose rows disagree with its log,
that was started with another spec, or on another device or environment. `load_run`
checks both files and names the file (and rows) at fault: every read failure, and any
timed row with a non-finite or non-positive time or quartiles out of order, becomes a
`RunFormatError` (`listing.list_runs` lists a damaged run with its problem instead of failing).
Writes that the OS refuses (no space, read-only, permission) raise `file_writes.RunWriteError`, one
line naming the path. Every row carries `source` (measured or modeled) and a column per axis
(`dsa_lab.axes`; one an older run lacks is filled in on load). Run ids are plain folder names
(`check_run_id`), so a run folder never lands outside its root. A new run's provenance is
`provenance.build_provenance`'s.

Nothing is written through a link: a run folder holds plain files only (`file_writes.check_no_links`
refuses one holding a symbolic link, naming it, before anything reads or writes there), and
every open for writing uses O_NOFOLLOW; everything rewritten goes to a temp file created
exclusively beside it, then `os.replace` (`file_writes.write_atomic`). A folder left by a kill inside
`create_run` (only `.lock` and our temp files) is recognised: a fresh run clears those
leftovers by name and starts, a resume says what the folder is (`require_run`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dsa_lab import axes
from dsa_lab.env_info import RESUME_FIELDS
from dsa_lab.store.format import PLAIN_NAME, TIME_COLUMNS, RunFormatError, check_provenance_fields, check_results
from dsa_lab.store.writes import (
    TEMP_PATTERN,
    check_no_links,
    check_regular,
    open_no_follow,
    write_atomic,
    write_json,
    writing,
)

SCHEMA_VERSION = 1
RESULTS_FILE = "results.parquet"
PROVENANCE_FILE = "provenance.json"
POINTS_FILE = "points.jsonl"
LOCK_FILE = ".lock"
SOURCES = ("measured", "modeled")
STATUSES = ("ok", "failed", "error", "skipped")
PROVENANCE_KEYS = (
    "schema_version",
    "run_id",
    "source",
    "device",
    "created",
    "command",
    "timing_method",
    "seed",
    "environment",
    "git",
)
RESULT_COLUMNS = (  # every run has these; an axis added later is filled in on load (`axes.complete`)
    "point_key",
    "status",
    "message",
    "source",
    *(a.column for a in axes.AXES if a.stored_always),
    "median_ms",
    "p25_ms",
    "p75_ms",
    "iqr_ms",
)
RUN_ID_PATTERN = PLAIN_NAME  # one folder name


class RunLocked(RuntimeError):
    """Another process is writing this run folder."""


def check_run_id(run_id: str) -> str:
    """A run id is one plain folder name: letters, digits, '.', '_', '-' (no '/', no '..')."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id) or set(run_id) == {"."}:
        raise ValueError(
            f"run_id={run_id!r}: allowed are 1-128 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit (one folder name: it cannot leave the data root)"
        )
    return run_id


def run_folder(root: str | Path, device: str, run_id: str) -> Path:
    """`root/<device>/<run_id>`: both parts checked as single names, so the folder stays under `root`."""
    return Path(root) / check_run_id(device) / check_run_id(run_id)


def device_label(device_name: str) -> str:
    """Folder name for a device: 'NVIDIA H200' -> 'h200', 'cpu' -> 'cpu'."""
    label = re.sub(r"^nvidia[\s_-]*", "", device_name.strip(), flags=re.IGNORECASE).lower()
    label = re.sub(r"[^a-z0-9]+", "-", label).strip("-")
    return label or "unknown"


def new_run_id(prefix: str) -> str:
    return f"{prefix}-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}"


def scratch_device(device: str | None) -> bool:
    """A run on anything but a CUDA GPU is scratch: it is not a measurement of the study's GPU."""
    return device != "cuda"


def is_scratch(provenance: dict[str, Any]) -> bool:
    """Whether a run is scratch (a try-out) rather than study data: its provenance's `scratch`
    (written by bench and profile), else, for runs recorded before it, `scratch_device`."""
    return bool(provenance.get("scratch", scratch_device(provenance.get("device"))))


# ---------------------------------------------------------------- writing


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
    _repair_points(run_dir / POINTS_FILE)
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


def update_provenance(run_dir: str | Path, **fields: Any) -> None:
    path = Path(run_dir) / PROVENANCE_FILE
    provenance = read_provenance(path)
    provenance.update(fields)
    write_json(path, provenance)


def append_point(run_dir: str | Path, row: dict[str, Any]) -> None:
    """Append one finished point as a JSON line and force it to disk."""
    path = Path(run_dir) / POINTS_FILE
    line = json.dumps(row, default=_json_default, allow_nan=True) + "\n"
    fd = open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "append to")
    with writing(path, "append to"), os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (tuple, set)):
        return list(value)
    return str(value)


def _repair_points(path: Path) -> None:
    """Drop a torn last line (a point cut off mid-write), so appends start on a fresh line."""
    check_regular(path)
    if not path.exists():
        return
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut != len(data):
        fd = open_no_follow(path, os.O_RDWR, "repair")
        with writing(path, "repair"), os.fdopen(fd, "r+b") as handle:
            handle.truncate(cut)


def read_points(run_dir: str | Path) -> list[dict[str, Any]]:
    """Rows of points.jsonl; a torn last line is ignored, any other bad line is an error naming the file."""
    path = Path(run_dir) / POINTS_FILE
    check_regular(path)  # a link is refused by name; a FIFO would block the read
    if not path.exists():
        return []
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as err:
        raise RunFormatError(f"{path}: not readable as UTF-8 text ({type(err).__name__}: {err})") from None
    complete, torn = lines[:-1], lines[-1]
    rows = []
    for number, line in enumerate(complete, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise RunFormatError(f"{path}: line {number} is not valid JSON ({err})") from None
        if not isinstance(row, dict) or not isinstance(row.get("point_key"), str):
            raise RunFormatError(f"{path}: line {number} is not a point (a JSON object with a string 'point_key')")
        _check_logged(row, path, number)
        if all(a.name in row for a in axes.AXES if a.stored_always) and _key_of(row) != row["point_key"]:
            raise RunFormatError(
                f"{path}: line {number} holds point_key {row['point_key']!r:.200}, but its axes make "
                f"{_key_of(row)!r:.200}: a line moved or edited; resume and compare match rows by key"
            )
        rows.append(row)
    del torn  # a line without its newline was cut off mid-write: that point re-runs
    return rows


def _check_logged(row: dict[str, Any], path: Path, number: int) -> None:
    """A logged point's status is one of ours, and a timed one's times are numbers (finite, positive and in
    order is `load_run`'s check)."""
    status = row.get("status")
    if status is not None and status not in STATUSES:
        raise RunFormatError(f"{path}: line {number} has status {status!r}, allowed {STATUSES}")
    if status == "ok":
        for column in TIME_COLUMNS:
            value = row.get(column)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise RunFormatError(f"{path}: line {number} is timed but its {column} is {value!r}, not a number")


def _key_of(row: dict[str, Any]) -> str | None:
    """The key a logged row's axes make (`axes.point_key`); None when an axis holds what no key can be made of."""
    try:
        return axes.point_key(row)
    except (TypeError, ValueError):
        return None


def done_keys(run_dir: str | Path) -> set[str]:
    return {row["point_key"] for row in read_points(run_dir)}


def latest_rows(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The last logged row of every point (a retried point is logged again; the last one counts)."""
    return {row["point_key"]: row for row in read_points(run_dir)}


def write_results(run_dir: str | Path) -> Path:
    """Write results.parquet from points.jsonl atomically; returns its path."""
    run_dir = Path(run_dir)
    rows = read_points(run_dir)
    frame = pd.DataFrame(rows)
    if frame.empty:
        frame = pd.DataFrame(columns=list(RESULT_COLUMNS))
    frame = frame.drop_duplicates("point_key", keep="last").reset_index(drop=True)
    path = run_dir / RESULTS_FILE
    write_atomic(path, lambda handle: frame.to_parquet(handle, index=False))
    return path


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class Run:
    path: Path
    provenance: dict[str, Any]
    results: pd.DataFrame

    @property
    def source(self) -> str:
        return self.provenance["source"]


def read_provenance(path: Path) -> dict[str, Any]:
    """A run's provenance.json, checked: one of ours, of this schema, every field a reader uses of its type."""
    check_regular(path)
    if not path.is_file():
        raise RunFormatError(f"{path}: no provenance file (is this a dsa_lab run folder?)")
    try:
        provenance = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise RunFormatError(f"{path}: not valid JSON ({type(err).__name__}: {err})") from None
    if not isinstance(provenance, dict):
        raise RunFormatError(f"{path}: expected a JSON object, got {type(provenance).__name__}")
    missing = [key for key in PROVENANCE_KEYS if key not in provenance]
    if missing:
        raise RunFormatError(f"{path}: not a dsa_lab provenance file (missing keys {missing})")
    if provenance["schema_version"] != SCHEMA_VERSION:
        raise RunFormatError(
            f"{path}: schema_version {provenance['schema_version']!r}, this dsa_lab reads {SCHEMA_VERSION}"
        )
    if provenance["source"] not in SOURCES:
        raise RunFormatError(f"{path}: source {provenance['source']!r}, allowed {SOURCES}")
    if not isinstance(provenance["run_id"], str) or not isinstance(provenance["created"], str):
        raise RunFormatError(f"{path}: run_id and created must be strings")
    check_provenance_fields(provenance, path)
    return provenance


def load_run(path: str | Path) -> Run:
    """Read and validate a run (its folder, or its results.parquet); never writes."""
    path = Path(path)
    run_dir = path.parent if path.name == RESULTS_FILE else path
    check_no_links(run_dir)
    provenance = read_provenance(run_dir / PROVENANCE_FILE)
    results_path = run_dir / RESULTS_FILE
    if not results_path.is_file():
        raise RunFormatError(
            f"{results_path}: missing (an unfinished run? `write_results` builds it from {POINTS_FILE})"
        )
    try:
        results = pd.read_parquet(results_path)
    except Exception as err:  # pyarrow raises several types for corrupt files
        raise RunFormatError(f"{results_path}: not a readable parquet file ({type(err).__name__}: {err})") from None
    missing = [column for column in RESULT_COLUMNS if column not in results.columns]
    if missing:
        raise RunFormatError(f"{results_path}: not a dsa_lab results file (missing columns {missing})")
    bad_status = sorted({str(s) for s in results["status"]} - set(STATUSES))
    if bad_status:
        raise RunFormatError(f"{results_path}: unknown status values {bad_status}, allowed {STATUSES}")
    sources = {str(s) for s in results["source"]}
    if sources - {provenance["source"]}:
        raise RunFormatError(
            f"{results_path}: rows of source {sorted(sources)} in a run whose provenance says {provenance['source']!r}"
        )
    if results["point_key"].map(lambda key: not isinstance(key, str)).any() or results["point_key"].duplicated().any():
        raise RunFormatError(f"{results_path}: point_key must be unique strings")
    results = axes.complete(results)
    check_results(results, results_path)
    return Run(run_dir, provenance, results)
