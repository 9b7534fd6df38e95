"""Notebooks pick up an SM100 run when one exists under data/, and show the model, labelled, until then.

A tiny CPU reference sweep stands in for the SM100 run: its provenance is rewritten to say
what a B200's says (a CUDA device of compute capability 10.0), as
tests/test_notebooks.py rewrites a run's creation date.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from dsa_lab.analysis.frames import vllm_choice, vllm_path
from dsa_lab.bench.presets import STUDY_GRID, preset
from dsa_lab.bench.sweep import run_sweep
from dsa_lab.notebook.runs import sm100_evidence, sm100_run
from dsa_lab.notebook.sm100 import sm100_frame
from dsa_lab.paths import DATA_ENV
from dsa_lab.store import folders as store


def _as_device(run_dir: Path, name: str, capability: str, created: str) -> None:
    provenance = store.read_provenance(run_dir / store.PROVENANCE_FILE)
    environment = {**provenance["environment"], "gpu_name": name, "gpu_capability": capability}
    store.update_provenance(
        run_dir, device="cuda", device_name=name, environment=environment, created=created, scratch=False
    )


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sweep") / "cpu-run"
    run_sweep(preset("ci").with_axes(next_n=(1, 3), context=("96",)), folder, "cpu", progress=False)
    return folder


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv(DATA_ENV, str(root))
    return root


def _place(cpu_run: Path, data: Path, where: str, name: str, capability: str, created: str) -> Path:
    run_dir = data / where
    shutil.copytree(cpu_run, run_dir)
    _as_device(run_dir, name, capability, created)
    return run_dir


def test_no_sm100_run_gives_the_model_labelled(data: Path, cpu_run: Path) -> None:
    _place(cpu_run, data, "h200/h200-run", "NVIDIA H200", "9.0", "2030-01-01T00:00:00+00:00")  # not SM100: not listed
    chosen, ignored = sm100_run()
    assert chosen is None and ignored == []
    view = sm100_frame()
    assert not view.measured and view.chosen is None and "modeled" in view.label
    assert "modeled, not measured" in view.note and "scripts/sm100_sweep.sh" in view.note
    frame = view.frame
    assert set(frame["source"]) == {"modeled"} and set(frame["status"]) == {"ok"}
    assert set(frame["backend"]) == {f"model ({g}, {b})" for g in ("B200", "GB200") for b in ("deepgemm", "triton")}
    assert set(frame["strategy"]) == {"native", "flatten"}  # atom is the native launch on SM100
    assert len(frame) == 2 * 2 * 2 * len(STUDY_GRID["batch"]) * len(STUDY_GRID["context"]) * len(STUDY_GRID["next_n"])
    assert (frame["median_ms"] > 0).all() and frame["bound"].notna().all()
    assert view.platform.family == "sm100"
    # what the model cannot time there is named, not dropped: the SM90-only kernels
    assert frame.attrs["not_modeled"] == [
        "backend 'deepgemm-pr340' has no kernel on sm100 to model (it models ['sm90'])",
        "backend 'gluon' has no kernel on sm100 to model (it models ['sm90'])",
    ]
    assert "Not modeled: backend" in view.note and "gluon" in view.note


def test_modeled_rows_line_up_with_the_points_given(data: Path, cpu_run: Path) -> None:
    results = store.load_run(cpu_run).results
    frame = sm100_frame(results, seed=0, gpus=("B200",)).frame
    timed = results[results["status"] == "ok"]
    assert set(zip(frame["batch"], frame["context"], frame["next_n"])) == set(
        zip(timed["batch"], timed["context"], timed["next_n"])
    )
    assert set(frame["heads"]) == set(timed["heads"]) and set(frame["gpu"]) == {"B200"}
    native = frame[(frame["modeled_backend"] == "deepgemm") & (frame["strategy"] == "native")]
    assert native.set_index("next_n")["median_ms"].is_monotonic_increasing  # more rows, more work


def test_the_newest_measured_sm100_run_is_picked_and_the_others_say_why(data: Path, cpu_run: Path) -> None:
    good = _place(cpu_run, data, "my-blackwell/sm100-cpu", "NVIDIA B200", "10.0", "2030-01-02T00:00:00+00:00")
    _place(cpu_run, data, "b200/older", "NVIDIA B200", "10.0", "2030-01-01T00:00:00+00:00")
    _place(cpu_run, data, "gb200/misfiled", "NVIDIA H200", "9.0", "2030-01-05T00:00:00+00:00")
    failed = _place(cpu_run, data, "b200/all-failed", "NVIDIA B200", "10.0", "2030-01-04T00:00:00+00:00")
    results = pd.read_parquet(failed / store.RESULTS_FILE)
    results.loc[results["status"] == "ok", ["status", "median_ms", "p25_ms", "p75_ms"]] = ["failed", None, None, None]
    results.to_parquet(failed / store.RESULTS_FILE, index=False)
    unfinished = data / "b200" / "unfinished"
    unfinished.mkdir(parents=True)
    shutil.copy(good / store.PROVENANCE_FILE, unfinished / store.PROVENANCE_FILE)  # no results yet
    store.update_provenance(unfinished, created="2030-01-03T00:00:00+00:00")
    _place(cpu_run, data, "h200/newest", "NVIDIA H200", "9.0", "2030-02-01T00:00:00+00:00")
    tried = _place(cpu_run, data, "b200/try-out", "NVIDIA B200", "10.0", "2030-01-06T00:00:00+00:00")
    store.update_provenance(tried, scratch=True)  # a bench run made without --out or --root

    chosen, ignored = sm100_run()
    assert chosen is not None and chosen.run.path == good and chosen.measured
    assert chosen.device_label == "NVIDIA B200" and chosen.gpu.name == "B200" and chosen.ignored == ignored
    assert sm100_evidence(chosen.run.provenance) == "compute capability 10.0"
    reasons = dict(ignored)
    assert set(reasons) == {"gb200/misfiled", "b200/all-failed", "b200/unfinished", "b200/try-out"}  # not h200/newest
    assert "labelled scratch" in reasons["b200/try-out"]
    assert "not an SM100 measurement" in reasons["gb200/misfiled"] and "'9.0'" in reasons["gb200/misfiled"]
    assert "no point timed ok (failed" in reasons["b200/all-failed"]
    assert "no results.parquet" in reasons["b200/unfinished"]

    assert sm100_run("triton")[0] is None  # the stand-in timed the reference only
    assert "did not time backend 'triton'" in dict(sm100_run("triton")[1])["my-blackwell/sm100-cpu"]


def test_a_measured_sm100_run_is_what_notebook_03_draws(data: Path, cpu_run: Path) -> None:
    run_dir = _place(cpu_run, data, "b200/sm100-full", "NVIDIA B200", "10.0", "2030-01-01T00:00:00+00:00")
    view = sm100_frame()
    assert view.measured and view.label == "NVIDIA B200" and view.chosen.run.path == run_dir
    assert view.chosen.gpu.name == "B200" and view.chosen.gpu.hbm_tbps == 7.67
    assert set(view.frame["source"]) == {"measured"}
    assert len(view.frame) == len(store.load_run(run_dir).results)
    assert "Measured on NVIDIA B200 (compute capability 10.0)" in view.note and "b200/sm100-full" in view.note
    # vLLM on SM100 runs DeepGEMM's varlen call: the harness's 'native' there
    path = vllm_path(view.frame, "reference", view.platform)
    assert set(path["vllm_strategy"]) == {"native"} and path["vllm_ms"].notna().all()
    assert [vllm_choice(n, view.platform) for n in (1, 3, 8)] == ["native"] * 3
    assert [vllm_choice(n) for n in (1, 3, 4)] == ["native", "flatten", "native"]  # SM90 + DeepGEMM (0.33)
    with_model = sm100_frame(with_model=True).frame
    modeled_rows = with_model[with_model["source"] == "modeled"]
    assert set(modeled_rows["backend"]) == {"model (B200, deepgemm)", "model (B200, triton)"}
    assert len(with_model) == len(view.frame) + len(modeled_rows)


def test_a_run_timed_only_outside_the_models_domain_is_named_and_nothing_drawn(monkeypatch) -> None:
    """The step run times logits at vLLM's width under graphs and whole steps: no point of it is one the
    calibrated model predicts, so the SM100 section says so and draws nothing (it once crashed notebook 02)."""
    from dsa_lab.analysis.modeled import calibrated_rows
    from dsa_lab.notebook.sm100 import sm100_frame
    from dsa_lab.store import load_run

    run = load_run(Path(__file__).resolve().parents[1] / "data" / "h100" / "h100-step-20261207")
    rows = calibrated_rows(run.results, ("B200",), run.provenance["seed"])
    assert rows.empty and any("outside the calibrated model's domain" in line for line in rows.attrs["not_modeled"])
    shown = sm100_frame(run.results, run.provenance["seed"], gpus=("B200",))
    assert not shown.measured and not shown.drawn and "nothing to model" in shown.note
    assert "outside the calibrated model" in shown.note
