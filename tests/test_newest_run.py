"""Issue 19's "the user's run everywhere" for the notebooks' main sections: without a `run_path`, notebooks 00,
02 and 05 and the index's headline show the newest measured run that covers the study's grid
(`analysis.runs.latency_section`), the shipped sweep when there is none newer; a run that holds several serving
settings is charted at one (`analysis.frames.one_view`), the note naming the rest."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import papermill
import pytest

from dsa_lab.analysis.frames import one_view
from dsa_lab.analysis.runs import Section, latency_run, latency_section
from dsa_lab.notebook.display import PROVENANCE_MIME
from dsa_lab.paths import DATA_ENV, resolve_data_path
from dsa_lab.report import page as report_page
from dsa_lab.store import folders as store
from tests.test_serving_answers import section_notebook

REPO = Path(__file__).resolve().parents[1]
FULL = "h200/h200-full-20261129"  # the shipped study sweep
SERVING = "h200/h200-serving-20261201"  # newer than FULL, but without 8K and mixed 1K-64K contexts
NEWER = "h200-full-user-20261202"


@pytest.fixture
def user_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped sweep and serving run, and a copy of the sweep under a newer id (the user's own run)."""
    data = tmp_path / "data"
    for path in (FULL, SERVING):
        shutil.copytree(REPO / "data" / path, data / path)
    newer = data / "h200" / NEWER
    shutil.copytree(REPO / "data" / FULL, newer)
    store.update_provenance(newer, run_id=NEWER, created="2026-12-02T00:00:00+00:00")
    monkeypatch.setenv(DATA_ENV, str(data))
    return data


def test_the_newest_run_covering_the_study_grid_is_the_one_shown(user_data: Path) -> None:
    assert latency_run().run.provenance["run_id"] == NEWER
    assert latency_run(FULL).run.provenance["run_id"] == "h200-full-20261129"  # asked for by name: that one
    shutil.rmtree(user_data / "h200" / NEWER)
    assert latency_run().run.provenance["run_id"] == "h200-full-20261129"  # the newer serving run is passed over
    assert latency_section().lacks(store.load_run(user_data / SERVING)) == {"context": ["8192", "mixed:1024-65536"]}


def test_a_grid_section_needs_every_combination_and_names_the_missing_ones() -> None:
    serving = store.load_run(resolve_data_path(SERVING))  # deepgemm at 32K only at B = 128
    needs = {"backend": ("deepgemm",), "batch": (1, 16, 128), "context": ("65536", "32768")}
    assert not Section("each", needs).lacks(serving)  # every value somewhere: covered
    grid = Section("grid", needs, grid=True)
    assert grid.lacks(serving) == {
        "cells": ["backend=deepgemm, batch=1, context=32768", "backend=deepgemm, batch=16, context=32768"]
    }
    assert not grid.covers(serving) and grid.describe().endswith("at every combination")
    assert not Section("grid", {**needs, "batch": (64, 128, 256), "context": ("65536",)}, grid=True).lacks(serving)


def test_a_run_of_several_serving_settings_is_charted_at_one() -> None:
    serving = store.load_run(resolve_data_path(SERVING)).results
    shown, note = one_view(serving)
    series = ["batch", "context", "next_n", "backend", "strategy"]
    assert not shown.duplicated(series).any() and serving.duplicated(series).any()
    assert set(shown["timed"]) == {"logits"} and set(shown["logits_width"]) == {"batch"}
    assert "these charts show acceptance=none, logits_width=batch, timed=logits, timer=events" in note
    assert "timed logits+topk" in note and "logits_width model:163840" in note and "timer graph" in note
    only_topk = serving[serving["timed"] == "logits+topk"]
    shown, note = one_view(only_topk)  # the one value a run holds is kept, even when it is not the old one
    assert set(shown["timed"]) == {"logits+topk"} and "timed" not in note.split("show")[-1].split("(")[0]
    full = store.load_run(resolve_data_path(FULL)).results
    assert one_view(full)[1] == "" and len(one_view(full)[0]) == len(full)


@pytest.mark.notebook
def test_notebook_02s_headline_and_the_index_read_the_newer_run(user_data: Path, tmp_path: Path) -> None:
    source = tmp_path / "02.ipynb"
    nbformat.write(section_notebook(REPO / "notebooks" / "02_latency_vs_next_n.ipynb", "## The headline"), source)
    papermill.execute_notebook(
        str(source),
        str(tmp_path / "out.ipynb"),
        parameters={"device": "cpu"},
        cwd=str(REPO / "notebooks"),
        progress_bar=False,
        execution_timeout=300,
    )
    nb = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    outputs = [o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])]
    used = [data[PROVENANCE_MIME] for data in outputs if PROVENANCE_MIME in data]
    assert [(p["label"], p["run_id"]) for p in used] == [("latency run", NEWER)]
    assert any("image/png" in data for data in outputs)
    findings = report_page.headline_findings("", 128, "65536")  # the index's headline, the tour's run_path ""
    assert f"run `{NEWER}`" in findings.markdown


def test_the_index_names_a_broken_newer_run_it_passed_over(user_data: Path) -> None:
    results = user_data / "h200" / NEWER / store.RESULTS_FILE
    results.write_bytes(results.read_bytes()[:500])  # the user's newest run, torn
    findings = report_page.headline_findings("", 128, "65536")
    assert "run `h200-full-20261129`" in findings.markdown  # the next one that covers the grid
    assert "Runs passed over:" in findings.reading_html and NEWER in findings.reading_html
    assert "results.parquet" in findings.reading_html  # why, naming the file
