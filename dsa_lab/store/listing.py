"""Every run folder under a data root, newest first, a damaged one listed with its problem (`dsa-lab runs`), and
the one search for "the newest run that covers what a page reads" (`newest`), which says what it passed over.

A run folder is `root/<gpu>/<run_id>/` holding any of a run's files (`store`); listing never fails on a damaged
run and never hides the good ones. Runs are ordered by `created` read as a time (`created_at`: timezone-aware, so
runs written under different UTC offsets order by the moment they were made, never by their text).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd

from dsa_lab.store.folders import Run, device_label, is_scratch, load_run, read_provenance
from dsa_lab.store.format import POINTS_FILE, PROVENANCE_FILE, RESULTS_FILE, RunFormatError
from dsa_lab.store.writes import check_no_links

COLUMNS = ["path", "run_id", "device", "gpu", "source", "purpose", "created", "rows", "problem"]
NOT_FINISHED = f"no {RESULTS_FILE} yet"


def created_at(text: str) -> dt.datetime:
    """A run's `created` (ISO 8601) as a timezone-aware time; one without an offset is read as UTC, the zone
    `provenance.build_provenance` writes. ValueError naming the text when it is not a time."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise ValueError(f"created={text!r:.80}: not an ISO 8601 time") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def gpu_kind(device_name: str) -> str:
    """The GPU a run was measured on, as data/ names its folders: 'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3'
    -> 'h100', 'cpu' -> 'cpu'. Runs of two kinds never stand for each other."""
    return device_label(device_name).split("-")[0]


def _run_folders(root: Path) -> list[Path]:
    """Folders `root/<device>/<run_id>/` holding any run file (a damaged run included)."""
    names = (PROVENANCE_FILE, RESULTS_FILE, POINTS_FILE)
    return sorted(
        folder for folder in root.glob("*/*") if folder.is_dir() and any((folder / n).exists() for n in names)
    )


def _result_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path).num_rows
    except Exception as err:  # pyarrow raises several types for corrupt files
        raise RunFormatError(f"{path}: not a readable parquet file ({type(err).__name__}: {err})") from None


def _listed(folder: Path) -> dict[str, object]:
    """One row of `list_runs` (a damaged run: its path and problem)."""
    try:
        check_no_links(folder)
        provenance = read_provenance(folder / PROVENANCE_FILE)
        moment = created_at(provenance["created"])
        results = folder / RESULTS_FILE
        count = _result_rows(results) if results.is_file() else None
    except (RunFormatError, ValueError) as err:
        return {"path": str(folder), "problem": str(err)}
    device = provenance.get("device_name", provenance["device"])
    return {
        "path": str(folder),
        "run_id": provenance["run_id"],
        "device": device,
        "gpu": gpu_kind(device),
        "source": provenance["source"],
        "purpose": "scratch" if is_scratch(provenance) else "study",
        "created": provenance["created"],
        "created_at": moment,
        "rows": count,
        "problem": None if count is not None else NOT_FINISHED,
    }


def list_runs(root: str | Path = "data") -> pd.DataFrame:
    """One row per run folder under `root` (device/run_id/), newest first (`created_at`), damaged ones last.

    `purpose` tells study data from scratch (`store.is_scratch`: CPU runs, and bench or profile runs
    written where no --out or --root said); `gpu` is the kind of device (`gpu_kind`). A damaged run (bad
    provenance, unreadable results) is listed with its `problem` (the file and what is wrong) rather than
    failing the listing or hiding the good runs.
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"root={str(root)!r}: no such folder (the data folder holds <device>/<run_id>/ runs)")
    frame = pd.DataFrame([_listed(folder) for folder in _run_folders(root)], columns=[*COLUMNS, "created_at"])
    order = frame["created_at"].map(lambda t: -t.timestamp() if pd.notna(t) else float("inf"))
    frame = frame.iloc[order.argsort(kind="stable")]
    return frame.drop(columns="created_at").reset_index(drop=True)


# ---------------------------------------------------------------- the newest run that covers a section


class Coverage(Protocol):
    """What a page reads from a run (`dsa_lab.notebook.sections.Section`): its name, and per axis the values a
    run lacks (empty when the run covers it)."""

    name: str

    def lacks(self, run: Run) -> Mapping[str, Sequence[str]]: ...


@dataclass(frozen=True)
class PassedOver:
    """A run a search did not take, and why; `path` relative to the root searched ('h200/<run_id>'), never a
    machine path."""

    path: str
    why: str


@dataclass
class Found:
    """What a search found: the run (None when none qualifies) and every run it passed over, with why."""

    run: Run | None
    passed_over: list[PassedOver] = field(default_factory=list)


def _relative(root: Path, path: str | Path) -> str:
    return Path(path).relative_to(root).as_posix() if Path(path).is_relative_to(root) else Path(path).name


def study_runs(
    root: str | Path, gpu: str, source: str = "measured", scratch: bool = False
) -> tuple[list[Run], list[PassedOver]]:
    """Every readable run under `root/<gpu>/` measured on that kind of GPU (`gpu_kind`), newest first; and the
    runs passed over on the way, with why: damaged or unreadable ones, runs of another GPU kind in the folder,
    runs of another `source`, and scratch runs (try-outs, never study data) unless `scratch`."""
    root = Path(root)
    if not root.is_dir():
        return [], []
    listed = list_runs(root)
    listed = listed[listed["path"].map(lambda p: Path(p).parent.name == gpu)]
    runs, passed = [], []
    for row in listed.to_dict("records"):
        why = _why_not_listed(row, gpu, source, scratch)
        if why is None:
            try:
                runs.append(load_run(row["path"]))
                continue
            except (RunFormatError, ValueError) as err:
                why = str(err)
        passed.append(PassedOver(_relative(root, row["path"]), why))
    return runs, passed


def _why_not_listed(row: Mapping[str, object], gpu: str, source: str, scratch: bool) -> str | None:
    """Why a listed run is no candidate (None: it is one)."""
    if isinstance(row["problem"], str):
        return row["problem"]
    if row["gpu"] != gpu:
        return f"measured on {row['device']}, not on the {gpu.upper()} read here (two GPUs never stand for each other)"
    if row["source"] != source:
        return f"a {row['source']} run, not {source}"
    if row["purpose"] == "scratch" and not scratch:
        return "a scratch run (a try-out: chosen only when named)"
    return None


def newest(
    root: str | Path,
    gpu: str,
    covering: Coverage | None = None,
    accept: Callable[[Run], str | None] | None = None,
    source: str = "measured",
    scratch: bool = False,
) -> Found:
    """The newest run of `study_runs(root, gpu)` that covers `covering` (lacks none of its values) and that
    `accept` takes (it returns why not, or None); every run passed over on the way, with why: the newer ones that
    lack what is covered or that `accept` refused, and the damaged, foreign or scratch ones `study_runs` names.
    The one search every page uses, so a newer run that lacks a section is never skipped in silence."""
    runs, passed = study_runs(root, gpu, source, scratch)
    for run in runs:
        why = accept(run) if accept is not None else None
        gaps = covering.lacks(run) if covering is not None and why is None else {}
        if why is None and not gaps:
            return Found(run, passed)
        if why is None:
            why = f"lacks the {covering.name}: " + "; ".join(f"{k} {', '.join(map(str, v))}" for k, v in gaps.items())
        passed.append(PassedOver(_relative(Path(root), run.path), why))
    return Found(None, passed)


# ---------------------------------------------------------------- dsa-lab runs


def _shown(frame: pd.DataFrame, root: Path, label: str) -> pd.DataFrame:
    """The listing as people read it: paths under `label/` (data/ or scratch/), no machine path; no 'None'."""
    return frame.assign(
        path=[f"{label}/{_relative(root, p)}" for p in frame["path"]],
        rows=[str(int(r)) if pd.notna(r) else "" for r in frame["rows"]],
        problem=frame["problem"].fillna(""),
    ).fillna("")


def _cmd_runs(args: argparse.Namespace) -> int:
    from dsa_lab.paths import data_dir, scratch_dir

    if args.root:
        roots = [(Path(args.root), Path(args.root).name or str(args.root))]
    else:
        roots = [(data_dir(), "data"), *[(p, "scratch") for p in (scratch_dir(),) if p.is_dir()]]
    frame = pd.concat([_shown(list_runs(root), root, label) for root, label in roots], ignore_index=True)
    if frame.empty:
        print(f"no runs under {' or '.join(label + '/' for _, label in roots)}")
        return 0
    print(frame.to_string(index=False))
    bad = int((frame["problem"] != "").sum() - (frame["problem"] == NOT_FINISHED).sum())
    if bad:
        print(f"{bad} damaged run(s) listed with their problem", file=sys.stderr)
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    runs = subparsers.add_parser("runs", help="list the runs stored under a data folder")
    runs.add_argument(
        "--root",
        default=None,
        help="folder holding <device>/<run_id>/ runs (default: data/ and scratch/, the purpose column "
        "telling study from scratch)",
    )
    runs.set_defaults(func=_cmd_runs)
