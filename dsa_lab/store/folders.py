"""Runs on disk: `data/<device>/<run_id>/` = results.parquet + provenance.json (+ points.jsonl): their names, their
log and their reading.

A sweep appends one JSON line per finished point to `points.jsonl` (flushed and
fsynced), so an interrupted run loses at most the point in flight and resumes where it
stopped; `write_results` turns the lines into `results.parquet` (atomic: tmp file +
os.replace). `load_run` checks both files and names the file (and rows) at fault: every read failure, any
column no group of `format.COLUMN_GROUPS` declares, and any
timed row with a non-finite or non-positive time or quartiles out of order, becomes a
`RunFormatError` (`listing.list_runs` lists a damaged run with its problem instead of failing).
Writes that the OS refuses (no space, read-only, permission) raise `writes.RunWriteError`, one
line naming the path. Every row carries `source` (measured or modeled) and a column per axis
(`dsa_lab.axes`; one an older run lacks is filled in on load). Run ids are plain folder names
(`check_run_id`), so a run folder never lands outside its root. A new run's provenance is
`provenance.build_provenance`'s; a run folder is opened for writing (fresh, locked, or to resume) by
`store.opening`.

Nothing is written through a link: a run folder holds plain files only (`writes.check_no_links`
refuses one holding a symbolic link, naming it, before anything reads or writes there), and
every open for writing uses O_NOFOLLOW; everything rewritten goes to a temp file created
exclusively beside it, then `os.replace` (`writes.write_atomic`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dsa_lab import axes
from dsa_lab.store.format import (
    PLAIN_NAME,
    POINTS_FILE,
    PROVENANCE_FILE,
    PROVENANCE_KEYS,
    RESULT_COLUMNS,
    RESULTS_FILE,
    SCHEMA_VERSION,
    SOURCES,
    STATUSES,
    TIME_COLUMNS,
    RunFormatError,
    check_provenance_fields,
    check_results,
)
from dsa_lab.store.writes import check_no_links, check_regular, open_no_follow, write_atomic, write_json, writing

RUN_ID_PATTERN = PLAIN_NAME  # one folder name


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


# ---------------------------------------------------------------- the log


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


def repair_points(path: Path) -> None:
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
