"""The newest-run search (issue 29, item 4; issue 19's "the user's run everywhere"): one function
(`store.listing.newest`) that orders runs by `created` read as a time, stays within the GPU a page is about, and
names every run it passed over with why; the notebooks' main sections and the index read through it.

Without a `run_path`, notebooks 00, 02 and 05 and the index's headline show the newest measured run that covers
what they read (`notebook.sections.latency_section`, or the one answer per point, `notebook.answers`), the shipped
runs when there is none newer; a run that holds several serving settings is charted at one
(`analysis.frames.one_view`), the note naming the rest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import papermill
import pytest

from dsa_lab.analysis.frames import one_view
from dsa_lab.notebook.display import PROVENANCE_MIME
from dsa_lab.notebook.sections import SERVING, Section, latency_run, latency_section
from dsa_lab.paths import DATA_ENV, resolve_data_path
from dsa_lab.report import page as report_page
from dsa_lab.store import folders as store
from dsa_lab.store.listing import created_at, gpu_kind, list_runs, newest
from tests.test_serving_answers import section_notebook

REPO = Path(__file__).resolve().parents[1]
FULL = "h200/h200-full-20261129"  # the shipped study sweep
SERVING_RUN = "h200/h200-serving-20261201"  # newer than FULL, but without 8K and mixed 1K-64K contexts
NEWER = "h200-full-user-20261202"
SMALL, GLUON = "h200/h200-harness-20261130", "h200/h200-gluon-20261130"  # small shipped runs: without, with gluon


@pytest.fixture
def user_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped sweep and serving run, and a copy of the sweep under a newer id (the user's own run)."""
    data = tmp_path / "data"
    for path in (FULL, SERVING_RUN):
        shutil.copytree(REPO / "data" / path, data / path)
    newer = data / "h200" / NEWER
    shutil.copytree(REPO / "data" / FULL, newer)
    store.update_provenance(newer, run_id=NEWER, created="2026-12-02T00:00:00+00:00")
    monkeypatch.setenv(DATA_ENV, str(data))
    return data


def _copy(data: Path, source: str, run_id: str, **provenance: object) -> Path:
    """A shipped run copied under data/h200/<run_id>, its provenance changed."""
    folder = data / "h200" / run_id
    shutil.copytree(REPO / "data" / source, folder)
    store.update_provenance(folder, run_id=run_id, **provenance)
    return folder


def test_created_is_compared_as_a_time_across_utc_offsets(tmp_path: Path) -> None:
    """'2026-12-02T01:00+05:00' reads later as text than '2026-12-01T21:00+00:00', but it is 20:00 UTC: earlier."""
    data = tmp_path / "data"
    _copy(data, SMALL, "east", created="2026-12-02T01:00:00+05:00")
    _copy(data, SMALL, "west", created="2026-12-01T21:00:00+00:00")
    _copy(data, SMALL, "naive", created="2026-12-01T20:30:00")  # no offset: read as UTC, between the two
    assert created_at("2026-12-02T01:00:00+05:00") < created_at("2026-12-01T21:00:00+00:00")
    assert list(list_runs(data)["run_id"]) == ["west", "naive", "east"]
    assert newest(data, "h200").run.provenance["run_id"] == "west"
    with pytest.raises(ValueError, match="created='yesterday': not an ISO 8601 time"):
        created_at("yesterday")


def test_a_newer_run_that_lacks_the_section_is_passed_over_with_a_note(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _copy(data, GLUON, "with-gluon", created="2026-12-01T00:00:00+00:00")
    _copy(data, SMALL, "without-gluon", created="2026-12-02T00:00:00+00:00")
    section = Section("gluon section", {"backend": ("gluon",)})
    found = newest(data, "h200", section)
    assert found.run.provenance["run_id"] == "with-gluon"
    assert [(p.path, p.why) for p in found.passed_over] == [
        ("h200/without-gluon", "lacks the gluon section: backend gluon")
    ]


def test_the_search_stays_within_the_gpu_a_page_is_about(tmp_path: Path) -> None:
    """An H100 run filed under data/h200/ never stands for an H200 one: passed over, named, with why."""
    data = tmp_path / "data"
    _copy(data, SMALL, "h200-run", created="2026-12-01T00:00:00+00:00")
    _copy(data, SMALL, "h100-run", created="2026-12-02T00:00:00+00:00", device_name="NVIDIA H100 80GB HBM3")
    found = newest(data, "h200")
    assert found.run.provenance["run_id"] == "h200-run"
    (why,) = [p.why for p in found.passed_over if p.path == "h200/h100-run"]
    assert "measured on NVIDIA H100 80GB HBM3, not on the H200 read here" in why
    assert gpu_kind("NVIDIA H100 80GB HBM3") == "h100" and gpu_kind("NVIDIA H200") == "h200"
    assert newest(data, "h100").run is None  # nothing under data/h100/


def test_the_newest_run_covering_the_study_grid_is_the_one_shown(user_data: Path) -> None:
    assert latency_run().run.provenance["run_id"] == NEWER
    assert latency_run(FULL).run.provenance["run_id"] == "h200-full-20261129"  # asked for by name: that one
    shutil.rmtree(user_data / "h200" / NEWER)
    chosen = latency_run()
    assert chosen.run.provenance["run_id"] == "h200-full-20261129"  # the newer serving run is passed over, said
    assert ("h200/h200-serving-20261201", "lacks the latency sweep: context 8192, mixed:1024-65536") in chosen.ignored
    assert latency_section().lacks(store.load_run(user_data / SERVING_RUN)) == {"context": ["8192", "mixed:1024-65536"]}


def test_a_grid_section_needs_every_combination_and_names_the_missing_ones() -> None:
    serving = store.load_run(resolve_data_path(SERVING_RUN))  # deepgemm at 32K only at B = 128
    needs = {"backend": ("deepgemm",), "batch": (1, 16, 128), "context": ("65536", "32768")}
    assert not Section("each", needs).lacks(serving)  # every value somewhere: covered
    grid = Section("grid", needs, grid=True)
    assert grid.lacks(serving) == {
        "cells": ["backend=deepgemm, batch=1, context=32768", "backend=deepgemm, batch=16, context=32768"]
    }
    assert not grid.covers(serving) and grid.describe().endswith("at every combination")
    assert not Section("grid", {**needs, "batch": (64, 128, 256), "context": ("65536",)}, grid=True).lacks(serving)


def test_a_run_of_several_serving_settings_is_charted_at_one() -> None:
    serving = store.load_run(resolve_data_path(SERVING_RUN)).results
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
    assert [(p["label"], p["run_id"]) for p in used] == [("latency run", NEWER), ("headline run", NEWER)]
    assert any("image/png" in data for data in outputs)
    findings = report_page.headline_findings("", 128, "65536")  # the index's headline, the tour's run_path ""
    assert f"runs `{NEWER}` and `h200-serving-20261201`" in findings.markdown  # next_n = 7: the serving run's only
    assert "| 7 | flatten (deepgemm) | 1913 | native (gluon) | 932 | 2.05× | `h200-serving-20261201` |" in (
        findings.markdown
    )


def test_the_index_names_a_broken_newer_run_it_passed_over(user_data: Path) -> None:
    results = user_data / "h200" / NEWER / store.RESULTS_FILE
    results.write_bytes(results.read_bytes()[:500])  # the user's newest run, torn
    findings = report_page.headline_findings("", 128, "65536")
    assert "run `h200-serving-20261201`" in findings.markdown  # the newest readable run that covers the point
    assert "Runs passed over:" in findings.reading_html and NEWER in findings.reading_html
    assert "results.parquet" in findings.reading_html  # why, naming the file
    answers = report_page.serving_answers("", 128)  # the serving-answers card says the same
    assert "Runs passed over:" in answers.html and NEWER in answers.html and "results.parquet" in answers.html


def test_a_section_names_the_newer_run_it_passed_over(user_data: Path) -> None:
    """The user's newer sweep lacks the serving workloads: the serving section shows the older serving run and
    names the newer one with what it lacks."""
    chosen, note = SERVING.run()
    assert chosen.run.provenance["run_id"] == "h200-serving-20261201" and note == ""
    (why,) = [why for path, why in chosen.ignored if path == f"h200/{NEWER}"]
    assert why.startswith("lacks the serving answers") and "mixed:2048-131072" in why
    provenance = json.loads((user_data / SERVING_RUN / store.PROVENANCE_FILE).read_text())
    assert created_at(provenance["created"]).tzinfo is not None
