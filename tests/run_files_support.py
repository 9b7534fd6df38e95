"""What the bad-input tests of stored runs (tests/test_bad_input_store_*.py, test_bad_input_profile_runs.py)
share: one timed row with the plan's columns, a valid provenance, a run made of them, and the run files' names."""

from __future__ import annotations

from pathlib import Path

from dsa_lab import axes
from dsa_lab.store import folders as store
from dsa_lab.store import opening

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


PARQUET = store.RESULTS_FILE
PROV = store.PROVENANCE_FILE
POINTS = store.POINTS_FILE
