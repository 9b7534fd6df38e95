"""The report and every page made from run data: inputs never destroyed, an index always written, and nothing
from a run (provenance, ids, device and backend names, messages, paths) live in a page."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import mistune
import nbformat
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_lab.analysis import headline
from dsa_lab.cli import main
from dsa_lab.markup import md_code, md_text, render_markdown
from dsa_lab.notebook import display as notebook
from dsa_lab.notebook import runs, sections
from dsa_lab.report import execute as report
from dsa_lab.report import page as report_page
from dsa_lab.store import folders as store

REPO = Path(__file__).resolve().parents[1]
HOSTILE = "<img src=x onerror=alert(1)><script>alert(2)</script>"
LIVE = re.compile(r"<\s*(script|img|iframe|svg)\b|<[^<>]*\son\w+\s*=", re.IGNORECASE)  # a tag that runs something
TOUR = REPO / "notebooks" / "00_tour.ipynb"
HEADLINE = report_page.headline_point(TOUR)  # (run path, batch, context): the run and shape the tour names
HEADLINE_RUN = HEADLINE[0] or runs.relative_to_data(sections.latency_run(HEADLINE[0]).run.path)  # '': the one it shows
HEADLINE = (HEADLINE_RUN, *HEADLINE[1:])


def notebooks(tmp_path: Path) -> Path:
    folder = tmp_path / "nbs"
    folder.mkdir()
    params = nbformat.v4.new_code_cell('device = "cpu"', metadata={"tags": ["parameters"]})
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# 01 · tiny\n\nOne cell."), params, nbformat.v4.new_code_cell("x = 1")],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nbformat.write(nb, folder / "01_tiny.ipynb")
    return folder


def with_tour(folder: Path) -> Path:
    """`folder` with a tour notebook (00) whose parameters name the headline's run and shape, as the real one's."""
    run_path, batch, context = HEADLINE
    source = f"run_path = {run_path!r}\nbatch = {batch}\ncontext = {context!r}"
    params = nbformat.v4.new_code_cell(source, metadata={"tags": ["parameters"]})
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# 00 · tour\n\nIts parameters."), params],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nbformat.write(nb, folder / "00_tour.ipynb")
    return folder


def shipped_copy(tmp_path: Path, **provenance: object) -> Path:
    """A data folder holding a copy of the headline run, its provenance changed by `provenance`."""
    target = tmp_path / "data" / HEADLINE_RUN
    shutil.copytree(REPO / "data" / HEADLINE_RUN, target)
    path = target / store.PROVENANCE_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), **provenance}))
    return tmp_path / "data"


@pytest.mark.parametrize("out", ["same", "same/.", "inside", "link"])
def test_report_never_writes_into_its_notebooks_folder(tmp_path: Path, capsys, out: str) -> None:
    """`report --out X --notebooks X` used to delete the source notebooks."""
    folder = notebooks(tmp_path)
    (tmp_path / "link").symlink_to(folder)
    target = {
        "same": str(folder),
        "same/.": f"{folder}/.",
        "inside": str(folder / "out"),
        "link": str(tmp_path / "link"),
    }[out]
    before = {p: p.read_bytes() for p in folder.iterdir()}
    assert main(["report", "--notebooks", str(folder), "--out", target]) == 2
    err = capsys.readouterr().err
    assert (
        "dsa-lab report: error: out_dir=" in err and str(folder) in err and "an output never overwrites an input" in err
    )
    assert {p: p.read_bytes() for p in folder.iterdir()} == before


@pytest.mark.parametrize("only", ["²", "٠١", "99"])
def test_only_names_a_notebook_or_is_refused_by_name(tmp_path: Path, capsys, only: str) -> None:
    """'²' passes str.isdigit and used to fail in int() with a message naming nothing."""
    assert main(["report", "--notebooks", str(notebooks(tmp_path)), "--out", str(tmp_path / "o"), "--only", only]) == 2
    assert f"only=[{only!r}]: no such notebook; allowed values are ['01']" in capsys.readouterr().err


@pytest.mark.notebook
@pytest.mark.parametrize("damage", ["truncated", "foreign provenance"])
def test_a_broken_headline_run_gives_a_failed_card_not_a_missing_report(tmp_path: Path, monkeypatch, damage) -> None:
    """A truncated headline results.parquet used to end `report` with exit 2 and no index.html, no report.json."""
    data = shipped_copy(tmp_path)
    run = data / HEADLINE_RUN
    if damage == "truncated":
        (run / store.RESULTS_FILE).write_bytes((run / store.RESULTS_FILE).read_bytes()[:500])
    else:
        (run / store.PROVENANCE_FILE).write_text('{"hello": 1}')
    monkeypatch.setenv("DSA_LAB_DATA", str(data))
    out = tmp_path / "out"
    result = report.build_report(with_tour(notebooks(tmp_path)), out, device="cpu")
    assert result.headline_failed and result.exit_code == 1 and [o.status for o in result.outcomes] == ["ok"] * 2
    page = (out / "index.html").read_text()
    name = store.RESULTS_FILE if damage == "truncated" else store.PROVENANCE_FILE
    assert "Headline failed" in page and f"{html.escape(str(run / name))}" in page
    assert [o["status"] for o in json.loads((out / "report.json").read_text())["notebooks"]] == ["ok"] * 2


@pytest.mark.parametrize("field", ["device_name", "timing_method", "run_id"])
def test_the_landing_page_holds_no_live_markup_from_a_run(tmp_path: Path, monkeypatch, field: str) -> None:
    """A device_name or run_id with <img onerror> or <script> used to go live in index.html (mistune passes HTML)."""
    monkeypatch.setenv("DSA_LAB_DATA", str(shipped_copy(tmp_path, **{field: HOSTILE})))
    findings = report_page.headline_findings(*HEADLINE)
    context = report_page.page_context(findings)
    for page in (*context.values(), mistune.html(findings.markdown)):
        assert not LIVE.search(page), page[:500]
    if field == "run_id":  # not a plain name: the run is refused, and the card says so as text
        assert findings.failed and "run_id" in findings.reading_html and "&lt;img" in findings.reading_html
    else:
        assert findings.table is not None


def _shown(monkeypatch, call) -> list[str]:
    """HTML of what `call()` displays in a notebook, Markdown rendered as nbconvert does (raw HTML passes)."""
    import IPython.display

    shown: list[object] = []
    for module in (IPython.display, notebook):  # notebook.py holds its own reference
        monkeypatch.setattr(module, "display", lambda *objs, **kw: shown.extend(objs))
    call()
    pages = []
    for obj in shown:
        if type(obj).__name__ == "Markdown":
            pages.append(mistune.html(obj.data))
        elif isinstance(obj, dict):
            pages.append(str(obj.get("text/html", "")))  # text/plain is shown escaped, in a <pre>
    return pages


@pytest.mark.parametrize("field", ["device_name", "run_id", "created", "timing_method"])
def test_notebook_banners_hold_no_live_markup_from_a_run(tmp_path: Path, monkeypatch, field: str) -> None:
    """The same values used to be live in every notebook page through `announce` (now `notebook.announce`)."""
    run = store.load_run(REPO / "data" / HEADLINE_RUN)
    run = store.Run(run.path, {**run.provenance, field: HOSTILE}, run.results)
    label = HOSTILE if field == "device_name" else "NVIDIA H200"
    chosen = runs.ChosenRun(run, True, label, None, ignored=[(f"h200/{HOSTILE}", f"{HOSTILE}: bad")])
    pages = _shown(monkeypatch, lambda: notebook.announce(chosen, "label"))
    assert len(pages) >= 2 and not any(LIVE.search(page) for page in pages)
    assert any("&lt;img src=x onerror=alert(1)&gt;" in page for page in pages)  # shown, as text
    chosen.measured, chosen.missing = False, HOSTILE
    assert not any(LIVE.search(page) for page in _shown(monkeypatch, lambda: notebook.announce(chosen, "label")))


def test_the_headline_reading_escapes_the_device_and_the_run() -> None:
    run = store.load_run(REPO / "data" / HEADLINE_RUN)
    table = headline.headline_table(run.results, 128, "65536")
    reading = headline.headline_reading(table, HOSTILE, "run`1`", 128, "65536")
    assert not LIVE.search(mistune.html(reading)) and "run `` run`1` ``" in reading


def test_styled_tables_escape_names_from_a_run() -> None:
    """Backend names from results.parquet used to be live through a pandas Styler."""
    from dsa_lab.plots import latency, tour
    from dsa_lab.plots.answers import AnswerGrid
    from dsa_lab.studies import goal_display

    decision = pd.DataFrame(
        {
            "next_n": [1],
            "source": ["measured"],
            "vllm_strategy": [HOSTILE],
            "vllm_ms": [2.0],
            "best_strategy": [HOSTILE],
            "best_ms": [1.0],
            "speedup": [2.0],
            "beyond_spread": [True],
            "recommended_strategy": [HOSTILE],
        }
    )
    best = pd.DataFrame(
        {
            "next_n": [1],
            "vllm_strategy": ["native"],
            "vllm_backend": [HOSTILE],
            "vllm_us": [2.0],
            "best_strategy": ["atom"],
            "best_pieces": [""],
            "best_backend": [HOSTILE],
            "best_us": [1.0],
            "speedup": [2.0],
            "beyond_spread": [True],
        }
    )
    ncu = pd.DataFrame(
        {
            "backend": [HOSTILE],
            "us": [1.0],
            "dram_read_per_unique": [1.0],
            "l2_hit_pct": [1.0],
            "occupancy_pct": [1.0],
            "tensor_pipe_pct": [1.0],
            "useful_tflops": [1.0],
        }
    )
    ncu.attrs["tensor_counter"] = HOSTILE
    grid = pd.DataFrame(
        {
            "workload": [HOSTILE],
            "batch": [128],
            "next_n": [3],
            "recommended_strategy": ["native"],
            "recommended_backend": [HOSTILE],
            "recommended_ms": [0.4],
            "choice": [HOSTILE],
            "vllm_choice": [HOSTILE],
            "vllm_ms": [0.8],
            "gain": [2.0],
            "run_id": [HOSTILE],
            "device": [HOSTILE],
        }
    )
    for styled in (
        latency.style_decisions(decision),
        tour.style_headline(best, HOSTILE),
        goal_display.style_ncu_comparison(ncu),
        goal_display.style_goal_summary(pd.DataFrame({"n": [HOSTILE], "speedup_min": [1.0], "speedup_max": [1.0]})),
        AnswerGrid(grid, HOSTILE),
        AnswerGrid(grid, HOSTILE, by_batch=True),
        latency.style_verdicts(pd.DataFrame({"backend": [HOSTILE, "x"], "verdict": [HOSTILE, "same"]})),
    ):
        page = styled.to_html()
        assert not LIVE.search(page) and "&lt;img" in page


def test_the_index_escapes_everything_a_notebook_reported(tmp_path: Path) -> None:
    outcome = report.NotebookOutcome(
        name="01_x",
        status="failed",
        seconds=1.0,
        error=HOSTILE,
        title=HOSTILE,
        description=HOSTILE,
        failed_source=HOSTILE,
        failed_cell=1,
        provenance=[{"label": HOSTILE, "run_id": HOSTILE}],
        fallbacks=[{"missing": HOSTILE, "shown_instead": HOSTILE}],
    )
    result = report.ReportResult(tmp_path, {"p": HOSTILE}, [outcome], {"sha": HOSTILE})
    report._write_index(result, report_page.failed_findings(HOSTILE, ValueError(HOSTILE)))
    assert not LIVE.search((tmp_path / "index.html").read_text())
    assert not LIVE.search(mistune.html((tmp_path / "headline.md").read_text()))
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]  # written to temp files, then moved


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=40))
def test_any_text_is_inert_in_markdown(text: str) -> None:
    """md_text and md_code show any string as itself, on one line: no tag, link, emphasis or code span of its own."""
    flat = " ".join(text.split())
    if not flat:
        return
    for markdown in (md_text(text), md_code(text)):
        rendered = mistune.html(markdown).strip()
        inner = re.sub(r"^<p>(<code>)?|(</code>)?</p>$", "", rendered)
        assert "<" not in inner and html.unescape(inner) == flat, (markdown, rendered)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=40))
def test_markdown_the_project_renders_never_passes_raw_html(text: str) -> None:
    assert "<script" not in render_markdown(f"{text}<script>x</script>")
