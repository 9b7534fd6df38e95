"""What a report page is made of, without executing a notebook: folded tables, the provenance line, lab
notes linked rather than copied, notebook 04's tables in words and units, pages that fetch nothing."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from dsa_lab.notebook import display as notebook
from dsa_lab.paths import DATA_ENV
from dsa_lab.plots import profile_tables
from dsa_lab.plots.tables import top_rows
from dsa_lab.report import page as report_page
from dsa_lab.studies import lab_notes

HOSTILE = "<img src=x onerror=alert(1)>"


def _style(rows: pd.DataFrame):
    return rows.style.format({"speedup": "{:.2f}x"}, escape="html").hide(axis="index")


def test_a_long_table_shows_its_top_rows_and_folds_every_row() -> None:
    shown = pd.DataFrame({"point": [f"p{i}" for i in range(30)], "speedup": [1 + (i % 7) / 10 for i in range(30)]})
    shown.loc[3, "point"] = HOSTILE
    table = top_rows(shown, _style, ["speedup"], "largest speedups", top=5)
    assert list(table.head["speedup"]) == [1.6] * 4 + [1.5]  # the largest first
    html = table._repr_html_()
    head, folded = html.split("<details>")
    assert head.count("<tr>") == 6 and "The 5 largest speedups" in head  # header row + 5
    assert folded.startswith("<summary>All 30 rows</summary>") and folded.count("<tr>") == 31
    assert "&lt;img" in html and HOSTILE not in html
    small = top_rows(shown.head(4), _style, ["speedup"], "largest speedups", top=5)
    assert "<details>" not in small._repr_html_() and small.to_html().count("<tr>") == 5
    ties = top_rows(shown.assign(speedup=1.0001), _style, ["speedup"], "largest speedups", top=5, tie_format="{:.2f}x")
    html = ties._repr_html_()
    assert html.startswith("<details><summary><b>Every row: speedup 1.00x</b> (30 rows)</summary>")
    assert html.count("<tr>") == 31


def test_provenance_is_one_line_with_its_fields_folded(monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[dict] = []
    monkeypatch.setattr(notebook, "display", lambda obj, raw=False: shown.append(obj))
    provenance = {"run_id": "r1", "source": "measured", "device_name": HOSTILE, "created": "2026-11-29T11:22:11+00:00",
                  "points": 840, "git_sha": "b301b21abcdef0123", "torch": "2.11.0"}  # fmt: skip
    notebook.show_provenance(provenance, "latency run")
    html = shown[0]["text/html"]
    summary = re.search(r"<summary>(.*)</summary>", html).group(1)
    assert summary == ("Data: latency run · r1 · measured · &lt;img src=x onerror=alert(1)&gt; · 2026-11-29 · "
                       "840 points · git b301b21abc")  # fmt: skip
    assert html.startswith("<details") and "<th>torch</th><td><code>2.11.0</code></td>" in html
    assert shown[0][notebook.PROVENANCE_MIME]["run_id"] == "r1"  # the index still collects it


def test_lab_notes_are_linked_not_copied() -> None:
    text = lab_notes.linked("triton_kernel.md", lab_notes.round_titles(first=5), "Every round")
    assert "[docs/triton_kernel.md](../docs/triton_kernel.md)" in text
    rounds = text.split(", under ")[1].split(" · ")
    assert rounds[0].startswith("*Round 5") and rounds[-1].startswith("*Round 15") and len(rounds) == 11
    assert len(text) < 1000  # headings only: the document itself holds the rounds
    assert lab_notes.titles("triton_kernel.md", "resource") == ["Resource report"]


def test_notebook_04_tables_have_words_and_units() -> None:
    summary = pd.DataFrame(
        {"backend": ["deepgemm", "deepgemm"], "strategy": ["native", "flatten"], "batch": [128, 128],
         "context": ["65536", "65536"], "next_n": [4, 4], "duration_ns": [538048.0, 1097376.0],
         "dram_read_bytes": [1.114182e09, 4.436794e09], "dram_read_per_unique": [1.006, 4.007],
         "l2_absorbed": [0.0, -0.002], "l2_hit_pct": [49.86, 26.86], "effective_tbps": [2.058, 1.009],
         "useful_tflops": [1021.7, 500.9]}
    )  # fmt: skip
    html = profile_tables.ncu_table(summary).to_html()
    for header in ("kernel µs", "× native", "DRAM read, GB", "DRAM / unique KV", "L2 hit %", "useful TFLOP/s"):
        assert header in html
    assert "e+09" not in html and "1.114" in html and "1097.4" in html and "64K" in html and "2.04" in html
    configs = [{"tool": "ncu", "backend": "triton", "strategy": "flatten", "batch": 64, "context": "65536",
                "next_n": 1, "launches": 1, "rel_err": None, "status": "same_as",
                "reason": "launches identical to native"}]  # fmt: skip
    html = profile_tables.configs_table(configs * 3).to_html()
    assert "configurations" in html and "launches identical to native" in html


class _Fetches(HTMLParser):
    """Every URL a page would fetch by itself: script, link, img, iframe sources (not the links a reader
    clicks)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = {"script": "src", "img": "src", "iframe": "src", "link": "href"}.get(tag)
        self.found += [v for k, v in attrs if k == wanted and v and re.match(r"(https?:)?//", v)]


def fetched(html: str) -> list[str]:
    parser = _Fetches()
    parser.feed(html)
    imports = re.findall(r"""import\(\s*["']((?:https?:)?//[^"']+)""", html)  # a module script's import()
    return parser.found + imports


@pytest.mark.filterwarnings("ignore:Your element with mimetype")  # the widget view: no live widgets offline
@pytest.mark.parametrize("with_code", [False, True])
def test_pages_fetch_nothing_from_the_network(with_code: bool) -> None:
    cell = new_code_cell("x", outputs=[new_output("display_data", data={"text/plain": "x", "text/html": "<b>ok</b>"})])
    widget = new_code_cell(
        "w", outputs=[new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "1"}})]
    )
    node = new_notebook(cells=[new_markdown_cell("# t\n\n$x^2$ and [a link](https://ui.perfetto.dev)"), cell, widget])
    node.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2}}
    body, _ = report_page.page_exporter(with_code).from_notebook_node(nbformat.from_dict(node))
    assert fetched(body) == [] and "<b>ok</b>" in body
    assert 'href="https://ui.perfetto.dev"' in body  # a link a reader clicks stays
    stock, _ = __import__("nbconvert").HTMLExporter().from_notebook_node(nbformat.from_dict(node))
    assert fetched(stock), "the check finds nothing even in nbconvert's stock page"


def test_figures_are_named_by_their_cell_never_by_a_path(tmp_path) -> None:
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    chart = new_output("display_data", data={"image/png": png})
    node = new_notebook(cells=[new_code_cell("a", outputs=[chart, chart]), new_code_cell("b", outputs=[chart])])
    node.cells[0]["id"], node.cells[1]["id"] = "headline", "../../escape"
    written = report_page.write_figures(node, "02_x", tmp_path)
    assert written == ["figures/02_x-headline.png", "figures/02_x-headline-2.png", "figures/02_x-cell01.png"]
    assert sorted(p.name for p in tmp_path.rglob("*.png")) == [
        "02_x-cell01.png",
        "02_x-headline-2.png",
        "02_x-headline.png",
    ]


def test_the_index_without_data_says_so_and_nothing_else(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsa_lab.report import execute as report

    monkeypatch.setenv(DATA_ENV, str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    findings = report_page.headline_findings("h200/h200-full-20261129", 128, "65536")
    result = report.ReportResult(tmp_path, {"device": "cpu"}, [], {"sha": "abc"})
    report._write_index(result, findings)
    index = (tmp_path / "index.html").read_text()
    box = re.search(r"<div class='fallback'>(.*?)</div>", index, flags=re.S).group(1)
    assert "is not in this checkout's data folder" in box and "dsa-lab bench --preset h200-full" in box
    assert "Blue:" not in index and 'href="headline.md"' not in index  # no legend, no link, for a table not there
    assert "<table" not in index and 'href="figures/"' in index


def test_the_ragged_kernel_table_is_folded_and_escaped() -> None:
    from dsa_lab.plots import kernel_tables

    table = pd.DataFrame({"backend": ["<b>x</b>", "deepgemm"], "ratio": [1.234, float("nan")]})
    html = kernel_tables.style_ragged(table).to_html()
    assert html.startswith("<details><summary>") and "(2 rows)" in html  # one line, the rows under it
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html and "1.23" in html and "—" in html


def test_the_readme_table_is_the_reports_headline() -> None:
    """'What the H200 says' quotes the one answer: the table between its markers is the report's headline.md
    table for the tour's shape (`report_page.headline_findings`, over every shipped run)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    quoted = readme.split("<!-- headline: the report's headline.md table -->")[1].split("<!-- /headline -->")[0]
    table = [
        line for line in report_page.headline_findings("", 128, "65536").markdown.splitlines() if line.startswith("|")
    ]
    assert [line for line in quoted.splitlines() if line.startswith("|")] == table


def test_a_run_given_as_a_folder_outside_data_is_never_shown_by_its_machine_path(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report --run /some/folder` hands the notebooks a whole path; the index names the run, not the machine."""
    from dsa_lab.report import execute as report

    monkeypatch.setenv(DATA_ENV, str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    folder = str(tmp_path / "elsewhere" / "cpu" / "my-run")
    findings = report_page.headline_findings(folder, 128, "65536")
    result = report.ReportResult(tmp_path, {"device": "cpu", "run_path": folder, "batch": 128}, [], {"sha": "abc"})
    report._write_index(result, findings)
    index = (tmp_path / "index.html").read_text()
    assert str(tmp_path) not in index
    assert "<code>run_path=…/cpu/my-run</code>" in index and "<code>batch=128</code>" in index
