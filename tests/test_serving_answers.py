"""Issue 19's answers per workload (`analysis.workloads`), issue 28's one answer (`analysis.answers.fastest`: per
point, the newest run that timed vLLM's route there) and the user's run everywhere (`notebook.sections.Section`,
`dsa-lab report --run`): a newer run under a temporary DSA_LAB_DATA reaches notebook 02's serving section, notebook
03's ragged section and the index, and every card names the run it used."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import nbformat
import pandas as pd
import papermill
import pytest

from dsa_lab.analysis import answers, workloads
from dsa_lab.notebook.display import PROVENANCE_MIME
from dsa_lab.notebook.sections import SERVING, Section
from dsa_lab.paths import DATA_ENV, resolve_data_path
from dsa_lab.plots.answers import AnswerGrid
from dsa_lab.report import cli as report_cli
from dsa_lab.report.cli import OTHER_RUN_PARAMETERS, RUN_PARAMETERS, register_cli
from dsa_lab.report.execute import NotebookOutcome, build_report
from dsa_lab.store import folders as store

REPO = Path(__file__).resolve().parents[1]
SHIPPED_PATH = "h200/h200-serving-20261201"  # the shipped serving run, relative to data/
SHIPPED = REPO / "data" / SHIPPED_PATH
NEWER = "h200-serving-user-20261202"
STEP_PATH = "h100/h100-step-20261207"  # the shipped step run (logits, then vLLM's top-k), relative to data/
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def _row(context: str, batch: int, next_n: int, backend: str, strategy: str, ms: float, route: str, **axes) -> dict:
    spread = ms * 0.001
    return {
        "batch": batch, "context": context, "next_n": next_n, "cache_dtype": "fp8", "heads": 64, "head_dim": 128,
        "acceptance": "none", "logits_width": "batch", "timed": "logits", "timer": "events", "config": "rule",
        "backend": backend, "strategy": strategy, "status": "ok", "source": "measured", "median_ms": ms,
        "p25_ms": ms - spread, "p75_ms": ms + spread, "pieces": str(next_n), "vllm_route": route,
        "vllm_platform": "sm90+dg", **axes,
    }  # fmt: skip


def two_workloads() -> pd.DataFrame:
    """A uniform and a ragged workload at two batches: at B = 128 the uniform batch's answer is gluon native and
    the ragged batch's DeepGEMM flatten; at B = 16 both keep vLLM's choice (a tie within the spread)."""
    rows = []
    for context in ("65536", "mixed:2048-131072"):
        for batch in (16, 128):
            gluon = 0.5 if batch == 128 and context == "65536" else 1.0
            rows += [
                _row(context, batch, 3, "deepgemm", "flatten", 0.8 if batch == 128 else 1.0, "flatten"),
                _row(context, batch, 3, "gluon", "native", gluon if batch == 128 else 1.0, "flatten"),
            ]
    return pd.DataFrame(rows)


def test_the_answer_per_workload_and_where_it_reverses() -> None:
    table = workloads.answers(two_workloads())
    assert len(table) == 4 and set(table["workload"]) == {"64K", "mixed 2K-128K"}
    assert table.set_index(["workload", "batch"])["choice"].to_dict() == {
        ("64K", 16): "flatten (deepgemm)",
        ("64K", 128): "native (gluon)",
        ("mixed 2K-128K", 16): "flatten (deepgemm)",
        ("mixed 2K-128K", 128): "flatten (deepgemm)",
    }
    assert set(table["vllm_choice"]) == {"flatten (deepgemm)"}  # the recorded route, timed on DeepGEMM
    assert workloads.pairings(table) == [("64K", "mixed 2K-128K")]
    cells = workloads.reversals(table, "64K", "mixed 2K-128K")
    assert cells[["batch", "differs", "strategy_differs"]].values.tolist() == [[16, False, False], [128, True, True]]
    counts = workloads.reversal_counts(table).iloc[0]
    assert (counts["cells"], counts["answer differs"], counts["strategy differs"]) == (2, 1, 1)
    reading = workloads.reversal_reading(table, "r1")
    assert "differs in 1 of 2 cells" in reading and "B = 128, next_n = 3: native \\(gluon\\) on the uniform" in reading
    summary = workloads.answer_summary(table).set_index("workload")
    assert summary.loc["64K", "vLLM beaten"] == 1 and summary.loc["mixed 2K-128K", "vLLM beaten"] == 0
    with pytest.raises(ValueError, match="workload='8K': not in the table; allowed values are"):
        workloads.answer_grid(table, "8K")


def test_a_workload_names_every_axis_away_from_its_default() -> None:
    row = _row("mixed:2048-131072", 128, 3, "gluon", "native", 1.0, "flatten", acceptance="v4flash-vllm41044",
               logits_width="model:163840", timed="logits+topk", timer="graph")  # fmt: skip
    assert workloads.workload_label(row) == "mixed 2K-128K · acceptance v4flash-vllm41044 · logits 160K wide · " \
        "logits + torch's top-k (not vLLM's) · CUDA graph"  # fmt: skip
    assert "logits + vLLM's top-k" in workloads.workload_label({**row, "topk_impl": "vllm"})
    assert workloads.is_ragged(row) and workloads.is_ragged({**row, "context": "65536"})  # acceptance: ragged rows
    assert not workloads.is_ragged({**row, "context": "65536", "acceptance": "none"})


@pytest.fixture(scope="module")
def shipped() -> store.Run:
    return store.load_run(SHIPPED)


def test_the_shipped_serving_run_gives_the_closing_numbers(shipped: store.Run) -> None:
    """Issue 19's closing note, from the shipped run: the pairs and their counts, every option's logits + top-k
    step at B = 128, next_n = 3, mixed:2K-128K (vLLM's route DeepGEMM flatten, Gluon native the fastest)."""
    table = workloads.answers(shipped.results)
    assert len(table) == table[["workload", "batch", "next_n"]].drop_duplicates().shape[0]
    pairs = dict((r, u) for u, r in workloads.pairings(table))
    assert pairs["mixed 2K-128K"] == "64K" and pairs["mixed 16K-64K"] == "64K"  # the most cells; of equals the twin
    counts = workloads.reversal_counts(table).set_index("ragged")
    assert counts.loc["mixed 2K-128K", "cells"] == 36  # B 1..256 x next_n (1, 2, 3, 4, 6, 8 at B <= 16)
    options = workloads.step_options(shipped.results)
    assert set(options["timer"]) == {"events", "graph"} and options.groupby("timer")["vllm"].sum().tolist() == [1, 1]
    assert options.loc[options["vllm"], ["backend", "strategy"]].drop_duplicates().values.tolist() == [
        ["deepgemm", "flatten"]
    ]
    assert (options.groupby("timer").head(1)["backend"] == "gluon").all()
    kernels = workloads.ragged_kernels(shipped.results, ["mixed:2K-128K", "lognormal:16K:1.2"], "gluon")
    assert {"deepgemm / gluon", "deepgemm-pr340 / gluon"} <= set(kernels.columns)
    assert set(kernels["context"]) == {"mixed:2048-131072", "lognormal:16384:1.2"}


def test_the_closing_numbers_print_from_one_call(capsys: pytest.CaptureFixture[str]) -> None:
    assert workloads.main([str(SHIPPED)]) == 0
    out = capsys.readouterr().out
    assert "# Uniform against ragged" in out and "| 64K " in out and "logits + top-k" in out


@pytest.fixture
def newer_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data folder with the shipped serving run and a copy of it under a newer id (the user's own run)."""
    data = tmp_path / "data"
    shutil.copytree(SHIPPED, data / SHIPPED_PATH)
    newer = data / "h200" / NEWER
    shutil.copytree(SHIPPED, newer)
    store.update_provenance(newer, run_id=NEWER, created="2026-12-02T00:00:00+00:00")
    monkeypatch.setenv(DATA_ENV, str(data))
    return data


def test_a_section_takes_the_newest_run_that_covers_it(newer_data: Path) -> None:
    chosen, note = SERVING.run()
    assert chosen.run.provenance["run_id"] == NEWER and note == "" and chosen.missing is None
    chosen, note = SERVING.run(SHIPPED_PATH)  # asked for by name: that one
    assert chosen.run.provenance["run_id"] == Path(SHIPPED_PATH).name and note == ""
    strict = Section("strict section", {"context": ("65536", "8192"), "backend": ("gluon", "nobody")})
    assert strict.lacks(chosen.run) == {"context": ["8192"], "backend": ["nobody"]}
    none, note = strict.run()
    assert none is None and "No measured run timing context 65536, 8192; backend gluon, nobody" in note
    assert "dsa-lab bench --preset h200-serving" in note
    narrow = Section("narrow", {"backend": ("gluon",)})
    shutil.rmtree(newer_data / "h200" / NEWER)
    chosen, note = narrow.run("h200/nowhere")  # absent: said (a banner), then the newest that covers it
    assert chosen.run.provenance["run_id"] == Path(SHIPPED_PATH).name
    assert "The run asked for, h200/nowhere, not in the data folder" in note and chosen.missing == note


def test_a_run_path_that_does_not_cover_the_section_is_said_and_passed_over(newer_data: Path) -> None:
    full = newer_data / "h200" / "h200-full-20261129"
    shutil.copytree(REPO / "data" / "h200" / "h200-full-20261129", full)
    chosen, note = SERVING.run("h200/h200-full-20261129")
    assert chosen.run.provenance["run_id"] == NEWER
    assert "The run asked for, h200/h200-full-20261129, lacks the serving answers (context mixed:2048-131072" in note
    assert f"showing h200/{NEWER} instead" in note and chosen.missing == note  # a banner the index flags


def section_notebook(path: Path, heading: str) -> nbformat.NotebookNode:
    """The notebook's parameters and setup cells (the code before its first '## ' heading) and one section
    (`heading` to the next '## ' heading)."""
    nb = nbformat.read(path, as_version=4)
    start = next(i for i, c in enumerate(nb.cells) if c.source.startswith(heading))
    end = next((i for i in range(start + 1, len(nb.cells)) if nb.cells[i].source.startswith(("## ", "### "))), None)
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("## "))
    setup = [c for c in nb.cells[:first] if c.cell_type == "code"]
    nb.cells = [*setup, *nb.cells[start:end]]
    return nb


@pytest.mark.notebook
@pytest.mark.parametrize(
    ("notebook", "heading", "label"),
    [
        ("02_latency_vs_next_n.ipynb", "## Serving batches", "answer run"),
        ("03_kernel_deep_dive.ipynb", "### Ragged batches", "ragged kernels run"),
    ],
)
def test_the_serving_sections_read_the_newer_run(newer_data: Path, tmp_path: Path, notebook, heading, label) -> None:
    source = tmp_path / notebook
    nbformat.write(section_notebook(REPO / "notebooks" / notebook, heading), source)
    papermill.execute_notebook(str(source), str(tmp_path / "out.ipynb"), parameters={"device": "cpu"},
                               cwd=str(REPO / "notebooks"), progress_bar=False, execution_timeout=300)  # fmt: skip
    nb = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    used = [o["data"][PROVENANCE_MIME] for c in nb.cells for o in c.get("outputs", []) if PROVENANCE_MIME in o.get("data", {})]  # fmt: skip
    assert {(p["label"], p["run_id"], p["path"]) for p in used if p["label"] == label} == {
        (label, NEWER, f"h200/{NEWER}")
    }
    drawn = [o["data"] for c in nb.cells for o in c.get("outputs", []) if "data" in o]
    grids = [d["text/html"] for d in drawn if "dsa-answer-grid" in str(d.get("text/html", ""))]  # 02: the grids
    assert grids or any("image/png" in d for d in drawn), "the section drew nothing"
    assert all(f"run <code>{NEWER}</code>" in grid for grid in grids)


@pytest.mark.notebook
def test_the_index_reads_the_newer_run_and_every_card_names_its_run(newer_data: Path, tmp_path: Path) -> None:
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    cells = [
        nbformat.v4.new_code_cell('device = "cpu"', metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(
            "from dsa_lab.notebook.display import show_provenance\n"
            "show_provenance({'run_id': 'r1', 'path': 'h200/r1', 'source': 'measured'}, 'tiny run')"
        ),
    ]
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC}), notebooks / "01_a.ipynb")
    shutil.copytree(REPO / "data" / STEP_PATH, newer_data / STEP_PATH)  # the step with vLLM's top-k: an H100's
    build_report(notebooks, tmp_path / "reports", device="cpu")
    index = (tmp_path / "reports" / "index.html").read_text()
    findings = index[index.index("<h2>Findings</h2>") : index.index("<h2>Notebooks</h2>")]
    assert f"run <code>{NEWER}</code>" in findings and "gluon native" in findings and "mixed 2K-128K" in findings
    # The whole step opens it, from the run notebook 02 answers it on (no H200 run has it: the H100's, named so)
    assert findings.index("The whole step") < findings.index("The logits kernel")
    whole = findings[findings.index("The whole step") : findings.index("The logits kernel")]
    assert "on NVIDIA H100" in whole and f"run <code>{Path(STEP_PATH).name}</code>" in whole
    assert "No H200 run holds the whole-step answers" in whole and "torch" not in whole
    assert "Runs used: <code>tiny run: h200/r1</code>" in index
    assert f"run `{NEWER}`" in (tmp_path / "reports" / "headline.md").read_text()
    build_report(notebooks, tmp_path / "again", device="cpu", parameters={"run_path": SHIPPED_PATH})
    again = (tmp_path / "again" / "index.html").read_text().split("<h2>Notebooks</h2>")[0]
    assert f"run <code>{Path(SHIPPED_PATH).name}</code>" in again and NEWER not in again


def test_a_card_without_a_stored_run_says_so() -> None:
    bare, used = NotebookOutcome("01_a", "ok", 1.0), NotebookOutcome("02_b", "ok", 1.0)
    used.provenance = [{"label": "serving run", "run_id": "x", "path": "h200/x"}, {"label": "modeled", "source": "m"}]
    assert bare.runs == [] and used.runs == ["serving run: h200/x"]


def test_report_run_sets_every_run_parameter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers())
    run = tmp_path / "run"
    shutil.copytree(SHIPPED, run)  # --run must name a run load_run reads
    args = parser.parse_args(["report", "--run", str(run), "-p", "seed=3"])
    captured = {}

    def fake_build(notebooks, out, params, device=None, only=()):
        captured.update(params)
        raise SystemExit(0)

    monkeypatch.setattr(report_cli, "build_report", fake_build)
    with pytest.raises(SystemExit):
        args.func(args)
    cleared = dict.fromkeys(OTHER_RUN_PARAMETERS, "")  # no default that names another run survives
    assert captured == {"seed": 3, **{name: str(run.resolve()) for name in RUN_PARAMETERS}, **cleared}
    assert resolve_data_path(captured["run_path"]) == run.resolve()
    assert report_cli.run_parameter(Path(SHIPPED_PATH)) == SHIPPED_PATH  # relative to data/: kept, no machine path
    for bad, says in ((tmp_path / "empty", "no run there"), (run / "results.parquet", "is not a run folder")):
        with pytest.raises(ValueError, match=f"--run=.*{says}"):
            args.func(parser.parse_args(["report", "--run", str(bad)]))


def test_the_one_answer_takes_each_point_from_the_newest_run_that_covers_it() -> None:
    """Two runs of one GPU: the newer answers where it timed vLLM's route, the older elsewhere; a run of another
    GPU answers its own points only; every row names its run and device."""
    older = two_workloads()
    newer = older[(older["batch"] == 128) & (older["context"] == "65536")].assign(
        median_ms=lambda f: f["median_ms"] * 2, p25_ms=lambda f: f["p25_ms"] * 2, p75_ms=lambda f: f["p75_ms"] * 2
    )
    table = answers.fastest(
        [answers.RunFrame("new", "NVIDIA H200", newer), answers.RunFrame("old", "NVIDIA H200", older)]
    )
    by_point = table.set_index(["workload", "batch"])["run_id"].to_dict()
    assert by_point == {
        ("64K", 16): "old",
        ("64K", 128): "new",
        ("mixed 2K-128K", 16): "old",
        ("mixed 2K-128K", 128): "old",
    }
    assert set(table["device"]) == {"NVIDIA H200"}
    other = answers.fastest(
        [answers.RunFrame("new", "NVIDIA H200", newer), answers.RunFrame("h100", "NVIDIA H100", older)]
    )
    assert len(other) == len(table) + 1  # the H100 run's 64K B = 128 point stands beside the H200's, never for it
    assert answers.headline(table, 128, "64K")[["next_n", "run_id"]].values.tolist() == [[3, "new"]]


def test_the_answer_grid_colours_by_kernel_and_writes_only_the_speedup() -> None:
    table = answers.fastest([answers.RunFrame("r1", "NVIDIA H200", two_workloads())])
    grid = AnswerGrid(answers.grid(table, [128]), "At B = 128")
    html = grid.to_html()
    cells = [cell.split(">", 1)[1] for cell in html.split("<td ")[1:]]
    assert sorted(c.split("<")[0] for c in cells) == ["1.00×", "1.60×"]  # the speedup is the only text
    assert "font-size:13px" in html and "run <code>r1</code> on NVIDIA H200" in html
    assert "gluon native" in html and "deepgemm flatten" in html  # the colour key names each kernel and strategy
    by_batch = AnswerGrid(answers.grid(table), "Every batch", by_batch=True).to_html()
    assert "64K, B = 16" in by_batch and "mixed 2K-128K, B = 128" in by_batch
