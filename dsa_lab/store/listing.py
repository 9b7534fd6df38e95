"""Every run folder under a data root, newest first, a damaged one listed with its problem: `dsa-lab runs`.

A run folder is `root/<device>/<run_id>/` holding any of a run's files (`store`); listing never
fails on a damaged run and never hides the good ones.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from dsa_lab.store.folders import is_scratch, read_provenance
from dsa_lab.store.format import POINTS_FILE, PROVENANCE_FILE, RESULTS_FILE, RunFormatError
from dsa_lab.store.writes import check_no_links


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


def list_runs(root: str | Path = "data") -> pd.DataFrame:
    """One row per run folder under `root` (device/run_id/), newest first.

    `purpose` tells study data from scratch (`store.is_scratch`: CPU runs, and bench or profile runs
    written where no --out or --root said). A damaged run (bad provenance, unreadable results)
    is listed with its `problem` (the file and what is wrong) rather than failing the listing
    or hiding the good runs.
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"root={str(root)!r}: no such folder (the data folder holds <device>/<run_id>/ runs)")
    rows = []
    for folder in _run_folders(root):
        try:
            check_no_links(folder)
            provenance = read_provenance(folder / PROVENANCE_FILE)
            results = folder / RESULTS_FILE
            count = _result_rows(results) if results.is_file() else None
        except RunFormatError as err:
            rows.append({"path": str(folder), "problem": str(err)})
            continue
        rows.append(
            {
                "path": str(folder),
                "run_id": provenance["run_id"],
                "device": provenance.get("device_name", provenance["device"]),
                "source": provenance["source"],
                "purpose": "scratch" if is_scratch(provenance) else "study",
                "created": provenance["created"],
                "rows": count,
                "problem": None if count is not None else f"no {RESULTS_FILE} yet",
            }
        )
    columns = ["path", "run_id", "device", "source", "purpose", "created", "rows", "problem"]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values("created", ascending=False, na_position="last").reset_index(drop=True)


def _cmd_runs(args: argparse.Namespace) -> int:
    from dsa_lab.paths import data_dir, scratch_dir

    roots = [Path(args.root)] if args.root else [data_dir(), *[p for p in (scratch_dir(),) if p.is_dir()]]
    frame = pd.concat([list_runs(root) for root in roots], ignore_index=True)
    if frame.empty:
        print(f"no runs under {' or '.join(map(str, roots))}")
        return 0
    print(frame.to_string(index=False))
    bad = int(frame["problem"].notna().sum() - (frame["problem"] == f"no {RESULTS_FILE} yet").sum())
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
