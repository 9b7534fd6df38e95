"""Stored profile runs: notebook 04 draws every chart of a run with torch tables and ncu rows, and a run
stored before the harness merge reads under the harness's names."""

from __future__ import annotations

from pathlib import Path

import pytest
from profile_support import CPU, TOPK, OneTwoBackend, _csv_for_steps, grid

from dsa_lab.kernels import registry
from dsa_lab.profiling import ProfileSettings, attach_configs, load_profile_run, parse_ncu_csv, run_torch


@pytest.mark.notebook
def test_notebook_renders_a_shipped_run_with_counters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored run with torch tables and (synthetic) ncu rows: every chart of notebook 04 draws."""
    from contextlib import nullcontext

    import nbformat
    import papermill

    from dsa_lab.profiling.runs import write_tables
    from dsa_lab.profiling.sweep import ProfileRun
    from dsa_lab.profiling.target import TargetPlan, run_target
    from dsa_lab.store import folders as store
    from dsa_lab.store import opening

    monkeypatch.setitem(registry._BACKENDS, OneTwoBackend.name, OneTwoBackend())  # atom runs 3 as 2 + 1
    spec = grid(backend=("reference", OneTwoBackend.name), next_n=(1, 3))
    settings = ProfileSettings(TOPK, trace=False)
    run = run_torch(spec, CPU, settings, log=lambda message: None)
    manifest = run_target(
        TargetPlan(spec, tmp_path / "m.json", settings), CPU, lambda number, device: None, nullcontext
    )
    run.ncu = attach_configs(parse_ncu_csv(_csv_for_steps(manifest)), manifest)
    folder = tmp_path / "data" / "h200" / "profiles" / "profile-test"
    provenance = {
        "schema_version": store.SCHEMA_VERSION,
        "run_id": "profile-test",
        "source": "measured",
        "device": "cuda",
        "device_name": "NVIDIA H200 (synthetic test run)",
        "created": "2026-01-01T00:00:00+00:00",
        "command": [],
        "timing_method": "test",
        "seed": 0,
        "environment": {},
        "git": {"sha": "0123456789"},
        "kind": "profile",
        "spec": spec.to_dict(),
    }
    opening.create_run(folder, provenance)
    write_tables(ProfileRun(run.kernels, run.phases, run.ncu, run.configs), folder)

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("DSA_LAB_DATA", str(tmp_path / "data"))
    out = tmp_path / "04.ipynb"
    papermill.execute_notebook(
        str(repo / "notebooks" / "04_kernel_profiles.ipynb"),
        str(out),
        cwd=str(repo),
        progress_bar=False,
        parameters={"device": "cpu", "profile_path": "h200/profiles", "interactive": False},
    )
    nb = nbformat.read(out, as_version=4)
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    text = "\n".join(
        str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
        for c in nb.cells
        for o in c.get("outputs", [])
    )
    assert len(images) == 5  # timeline, phases, the explorer's timeline, DRAM vs unique, tensor pipe
    assert "NVIDIA H200 (synthetic test run)" in text and "CPU reference" not in text
    assert "DRAM / unique KV" in text and "<function" not in text  # human headers; no stray repr


def test_a_profile_run_stored_before_the_merge_reads_under_the_harness_names() -> None:
    shipped = Path(__file__).resolve().parents[1] / "data" / "h200" / "profiles" / "profile-20261129T112211Z"
    if not shipped.is_dir():
        pytest.skip("no shipped profile run in this checkout")
    run = load_profile_run(shipped)
    assert {"batch", "context", "heads", "launches", "kernel_launches", "device_name"} <= set(run.kernels.columns)
    assert not {"batch_size", "context_len", "num_heads", "logits_calls"} & set(run.kernels.columns)
    assert set(run.kernels["context"]) == {"65536"} and run.provenance["spec"]["batch"] == [128, 64]
    assert all("batch" in c and "batch_size" not in c for c in run.configs)
    summary = run.ncu_summary
    native = summary[(summary["backend"] == "deepgemm") & (summary["strategy"] == "native") & (summary["next_n"] == 4)]
    assert native["dram_read_per_unique"].iloc[0] == pytest.approx(1.0, abs=0.02)
    assert (summary["useful_tflops"] > 0).all()
