"""Corrupt profile runs: a damaged provenance, table or trace names the file; discovery reports the runs it
passes over, never skipping one in silence."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from run_files_support import PROV, provenance

from dsa_lab.profiling.runs import ignored_note, load_profile_run, scan_profile_runs, shipped_or_cpu_reference
from dsa_lab.profiling.torch_profile import read_trace
from dsa_lab.store import folders as store
from dsa_lab.store import opening


def make_profile(root: Path, name: str, created: str) -> Path:
    folder = opening.create_run(root / "profiles" / name, provenance(name, created, kind="profile"))
    pd.DataFrame({"x": [1]}).to_parquet(folder / "torch_kernels.parquet")
    return folder


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
