"""`build_report`: a good notebook renders, a failing one is reported by cell, the index lists both."""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from dsa_lab.report.cli import parse_parameter, register_cli
from dsa_lab.report.execute import build_report, find_notebooks
from dsa_lab.store import folders as store

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.notebook

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def _write(path: Path, *sources: str, parameters: str = 'device = "cpu"\nseed = 0') -> None:
    params = new_code_cell(parameters, metadata={"tags": ["parameters"]})
    nb = new_notebook(cells=[params, *(new_code_cell(s) for s in sources)], metadata={"kernelspec": KERNELSPEC})
    nbformat.write(nb, path)


@pytest.fixture
def notebooks(tmp_path: Path) -> Path:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _write(
        folder / "01_good.ipynb",
        "from dsa_lab.notebook.display import show_provenance\n"
        "show_provenance({'run_id': 'r1', 'source': 'measured', 'device': device}, 'tiny run')",
        "print(f'seed={seed} device={device} marker=GOOD-OUTPUT')",
        "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4]); plt.title('A CHART'); plt.show()",
    )
    good = nbformat.read(folder / "01_good.ipynb", as_version=4)
    good.cells.insert(0, nbformat.v4.new_markdown_cell("# 01 · A good `notebook`\n\nIt draws one chart. Then more."))
    nbformat.write(good, folder / "01_good.ipynb")
    _write(
        folder / "02_broken.ipynb",
        "x = 1",
        "raise ValueError('deliberate failure for the test')",
        "print('never reached')",
    )
    (folder / "03_corrupt.ipynb").write_text("{ not json")
    (folder / "README.md").write_text("not a notebook")
    return folder


def test_report_runs_good_and_reports_failing(notebooks: Path, tmp_path: Path) -> None:
    out = tmp_path / "reports"
    out.mkdir()
    (out / "03_corrupt.html").write_text("STALE output of an earlier run")
    result = build_report(notebooks, out, {"seed": 7}, device="cpu")

    assert [o.name for o in result.outcomes] == ["01_good", "02_broken", "03_corrupt"]
    good, broken, corrupt = result.outcomes
    assert good.status == "ok" and good.error is None
    html = (out / "01_good.html").read_text()
    assert "seed=7 device=cpu marker=GOOD-OUTPUT" in html
    assert (
        "matplotlib.pyplot" not in html and "matplotlib.pyplot" in (out / "01_good.code.html").read_text()
    )  # no code for readers
    assert good.title == "01 · A good notebook" and good.description == "It draws one chart."
    chart = next(c for c in nbformat.read(notebooks / "01_good.ipynb", as_version=4).cells if "A CHART" in c.source)
    assert good.figures == [f"figures/01_good-{chart.id}.png", f"figures/01_good-{chart.id}.svg"]  # named by cell
    assert "A CHART" in (out / "figures" / f"01_good-{chart.id}.svg").read_text()
    assert "Data: tiny run · r1 · measured" in html and "data used (tiny run)" not in html  # one line, no dump
    assert not re.search(r"<script[^>]+src=[\"']https?:", html + (out / "01_good.code.html").read_text())
    assert good.thumbnail == "thumbs/01_good.png" and (out / good.thumbnail).stat().st_size > 0
    assert good.provenance == [{"label": "tiny run", "run_id": "r1", "source": "measured", "device": "cpu"}]

    assert broken.status == "failed"
    assert broken.error == "ValueError: deliberate failure for the test"
    source = nbformat.read(notebooks / "02_broken.ipynb", as_version=4)
    assert broken.failed_cell == 2 and "deliberate failure" in source.cells[2].source
    assert broken.failed_source == "raise ValueError('deliberate failure for the test')"
    assert (out / "02_broken.html").exists()
    assert corrupt.status == "failed" and corrupt.failed_cell is None and corrupt.error
    assert corrupt.html is None and not (out / "03_corrupt.html").exists()
    assert result.exit_code == 1

    index = (out / "index.html").read_text()
    assert 'href="01_good.html"' in index and 'href="02_broken.html"' in index
    assert "deliberate failure for the test" in index and "run_id=r1" in index
    assert "<pre>ValueError: deliberate failure for the test</pre>" in index
    assert 'src="thumbs/01_good.png"' in index and "It draws one chart." in index
    assert str(tmp_path) not in index and len(index.encode()) < 400_000
    summary = json.loads((out / "report.json").read_text())
    assert [n["status"] for n in summary["notebooks"]] == ["ok", "failed", "failed"]
    assert summary["parameters"] == {"interactive": False, "seed": 7, "device": "cpu"}


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["report", *argv])
    return args.func(args)


def test_cli_only_selects_one_notebook_and_exit_code_follows(notebooks: Path, tmp_path: Path) -> None:
    out = tmp_path / "only"
    assert _cli("--notebooks", str(notebooks), "--out", str(out), "--only", "01", "-p", "device=cpu") == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "01_good.code.html",
        "01_good.html",
        "01_good.ipynb",
        "figures",
        "headline.md",
        "index.html",
        "report.json",
        "thumbs",
    ]
    assert _cli("--notebooks", str(notebooks), "--out", str(out), "--only", "2", "-p", "device=cpu") == 1


def test_bad_arguments_name_the_field(notebooks: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"only=\['09'\].*'01', '02', '03'"):
        find_notebooks(notebooks, ["09"])
    with pytest.raises(ValueError, match="not a directory"):
        find_notebooks(tmp_path / "missing")
    with pytest.raises(ValueError, match="key=value"):
        parse_parameter("novalue")
    assert parse_parameter("run_fresh=True") == ("run_fresh", True)
    assert parse_parameter("device=cuda") == ("device", "cuda")
    assert parse_parameter("label='a b'") == ("label", "a b")


# ---------------------------------------------------------------- the tables behind the charts


def _row(strategy: str, next_n: int, median_us: float, spread_us: float = 0.5, source: str = "measured") -> dict:
    ms, half = median_us / 1e3, spread_us / 1e3
    return dict(
        backend="deepgemm",
        strategy=strategy,
        batch=4,
        context="8192",
        next_n=next_n,
        status="ok",
        source=source,
        median_ms=ms,
        p25_ms=ms - half,
        p75_ms=ms + half,
        heads=64,
        head_dim=128,
        cache_dtype="fp8",
    )


def test_decisions_keep_vllm_0_33_s_choice_unless_beaten_beyond_the_spread() -> None:
    from dsa_lab.analysis.frames import decisions, speedup_over_strategy
    from dsa_lab.analysis.readings import decisions_reading

    results = pd.DataFrame(
        [
            _row("native", 1, 559.6),
            _row("flatten", 1, 558.4),  # the same launch at next_n = 1: never a winner
            _row("native", 2, 10.0),
            _row("flatten", 2, 10.2),  # vLLM native; within the spread of flatten
            _row("atom", 3, 10.0),
            _row("flatten", 3, 30.0),  # vLLM flattens next_n=3: 3x slower
            _row("atom", 5, 20.0, spread_us=8),
            _row("flatten", 5, 24.0, spread_us=8),  # faster only within the spread
            {**_row("native", 6, 1.0), "status": "skipped"},  # never drawn or decided on
            _row("atom", 6, 12.0),
            _row("flatten", 6, 36.0),
        ]
    )
    table = decisions(results, "deepgemm").set_index("next_n")
    assert table["vllm_strategy"].to_dict() == {1: "native", 2: "native", 3: "flatten", 5: "flatten", 6: "flatten"}
    assert table["best_strategy"].to_dict() == {1: "native", 2: "native", 3: "atom", 5: "atom", 6: "atom"}
    assert table["recommended_strategy"].to_dict() == {1: "native", 2: "native", 3: "atom", 5: "flatten", 6: "atom"}
    assert table["speedup"].round(6).to_dict() == {1: 1.0, 2: 1.0, 3: 3.0, 5: 1.2, 6: 3.0}
    assert table["beyond_spread"].to_dict() == {1: False, 2: False, 3: True, 5: False, 6: True}

    text = decisions_reading(table.reset_index(), "NVIDIA H200", "deepgemm")
    assert "it is kept in 3 of them (1 where another strategy is faster only within the measured spread" in text
    assert "beaten beyond the spread in 2" in text
    assert (
        "next_n=3, batch=4, context 8K: vLLM takes **flatten** (30.0 µs); **atom** takes 10.0 µs, 3.00x faster." in text
    )
    assert "flatten" not in text.split("next_n=1")[-1][:40]  # nothing names flatten at next_n = 1

    speedups = speedup_over_strategy(results).set_index(["strategy", "next_n"])["speedup"].round(6)
    assert speedups.to_dict() == {
        ("native", 1): round(558.4 / 559.6, 6),
        ("native", 2): 1.02,
        ("atom", 3): 3.0,
        ("atom", 5): 1.2,
        ("atom", 6): 3.0,
    }

    with pytest.raises(ValueError, match=r"backend='triton'.*\['deepgemm'\]"):
        decisions(results, "triton")
    other = {**_row("atom", 3, 9.0), "cache_dtype": "mxfp4", "strategy": "flatten"}  # another shape: decided apart
    mixed = decisions(pd.concat([results, pd.DataFrame([other])]), "deepgemm")
    assert mixed.groupby("cache_dtype").size().to_dict() == {"fp8": 5, "mxfp4": 1}
    assert mixed.set_index("cache_dtype").loc["mxfp4", "recommended_ms"] == 9.0 / 1e3


def test_modeled_rows_have_no_spread_a_gap_could_hide_in() -> None:
    from dsa_lab.analysis.frames import decisions
    from dsa_lab.analysis.modeled import modeled_grid
    from dsa_lab.model.roofline import get_gpu

    modeled = modeled_grid((2,), ("4096",), (3, 4), get_gpu("H200"))
    assert set(modeled["source"]) == {"modeled"}
    assert set(zip(modeled["next_n"], modeled["strategy"])) == {
        (3, "atom"),
        (3, "flatten"),
        (4, "native"),
        (4, "flatten"),
    }
    table = decisions(modeled, modeled["backend"].iloc[0])
    assert (table["best_p25_ms"] == table["best_p75_ms"]).all()  # a model's time has no spread
    # flatten re-reads the KV once per row, so the model never prefers it for next_n > 1
    assert (table["recommended_strategy"] != "flatten").all()


def test_policy_grid_and_blocks_read() -> None:
    from dsa_lab.analysis.headline import blocks_read
    from dsa_lab.batch.metadata import build_flatten_metadata, build_native_metadata
    from dsa_lab.batch.workload import random_inputs, uniform_batch
    from dsa_lab.plots.policy import policy_grid
    from dsa_lab.policy.query import PATHS, Platform
    from dsa_lab.policy.vllm import decision_matrix

    matrix = decision_matrix(["vllm_0_33_0"], [Platform("sm90", True)], range(1, 7))
    grid = policy_grid(matrix)
    assert list(grid.index) == ["vLLM 0.33.0 | sm90+dg"]  # releases named by version
    assert [PATHS[int(c)] for c in grid.iloc[0]] == ["native", "native", "flatten", "native", "flatten", "flatten"]
    with pytest.raises(ValueError, match=r"missing columns \['path'\]"):
        policy_grid(matrix.drop(columns="path"))

    batch = uniform_batch(2, 130, 3)  # rows see 128, 129, 130 tokens: 2, 3, 3 blocks of 64
    table = random_inputs(batch).cache.block_table
    assert blocks_read(build_native_metadata(batch, table), 64) == 2 * 3  # once per request
    assert blocks_read(build_flatten_metadata(batch, table), 64) == 2 * (2 + 3 + 3)  # once per row


def test_index_opens_with_the_one_answer_of_the_shipped_runs(notebooks: Path, tmp_path: Path) -> None:
    """A reader finds the whole step's answer per workload, then the fastest option for next_n = 3 at B = 128,
    64K at the top of the index, from the one answer (the newest run that timed vLLM's route there: the serving
    run, whose Gluon and PR #340 the older sweep lacks), at the shape the tour notebook's parameters name."""
    shutil.copy(REPO / "notebooks" / "00_tour.ipynb", notebooks / "00_tour.ipynb")
    out = tmp_path / "reports"
    build_report(notebooks, out, device="cpu", only=["01"])
    index = (out / "index.html").read_text()
    findings = index[index.index("<h2>Findings</h2>") : index.index("<h2>Notebooks</h2>")]
    assert findings.index("The whole step (logits and top-k)") < findings.index("<table class='headline'>")
    row = findings[findings.index("<tr><td>3</td>") :].split("</tr>")[0]
    assert "flatten (deepgemm)" in row and "<b>native</b> (gluon)" in row and "1.93×" in row
    assert "measured on NVIDIA H200" in findings and "h200-serving-20261201" in findings
    markdown = (out / "headline.md").read_text()
    assert "| 3 | flatten (deepgemm) | 830 | native (gluon) | 431 | 1.93× |" in markdown
    assert "measured on NVIDIA H200 (run `h200-serving-20261201`)" in markdown  # its provenance, not a placeholder
    serving = store.load_run(REPO / "data" / "h200" / "h200-serving-20261201").results
    gluon = serving[(serving["backend"] == "gluon") & (serving["batch"] == 128) & (serving["context"] == "65536")]
    gluon = gluon[(gluon["next_n"] == 3) & (gluon["timed"] == "logits") & (gluon["timer"] == "events")]
    assert f"| {gluon['median_ms'].iloc[0] * 1e3:.0f} |" in markdown.split("| 3 |")[1]  # the serving data's number
