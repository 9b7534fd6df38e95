"""`dsa-lab report` and everything that turns run data into HTML: no destroyed inputs, always an index, and
nothing from a run live in a page (landing page, notebook banners, styled tables)."""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import nbformat
import pandas as pd

from tests.battery import CLEAR, UNCLEAR, WRONG, Result, case, cli_refused, environment, run_cli

AREA = "report"
REPO = Path(__file__).resolve().parents[2]
LIVE = re.compile(
    r"<\s*(script|img|iframe|svg|object|embed)\b|<[^<>]*\son\w+\s*=|<a\s[^<>]*javascript:", re.IGNORECASE
)  # a tag that runs something; escaped text (&lt;img ...) is inert
HOSTILE = "<img src=x onerror=alert(1)><script>alert(2)</script>"
TOUR = REPO / "notebooks" / "00_tour.ipynb"  # its parameters name the headline's run and shape


@functools.cache
def headline() -> tuple[str, int, str]:
    """(run path, batch, context) of the headline, as the tour notebook names them; its run_path '' (the
    newest measured run covering the study's grid) as the run that is in the checkout's own data, so a case
    can damage a copy of it (cached: the first call, at load, reads the checkout's data, not a case's)."""
    from dsa_lab.notebook.runs import relative_to_data
    from dsa_lab.notebook.sections import latency_run
    from dsa_lab.report.page import headline_point

    run_path, batch, context = headline_point(TOUR)
    return run_path or relative_to_data(latency_run(run_path).run.path), batch, context


headline()


def live_markup(html: str) -> str | None:
    found = LIVE.search(html)
    return None if found is None else html[max(0, found.start() - 60) : found.end() + 60]


def notebooks(tmp: Path) -> Path:
    folder = tmp / "nbs"
    folder.mkdir()
    cell = nbformat.v4.new_code_cell('device = "cpu"', metadata={"tags": ["parameters"]})
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# 01 · tiny\n\nOne cell."), cell, nbformat.v4.new_code_cell("x = 1")],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nbformat.write(nb, folder / "01_tiny.ipynb")
    return folder


def with_tour(folder: Path) -> Path:
    """`folder` with a tour notebook (00) whose parameters name the headline's run and shape."""
    run_path, batch, context = headline()
    cell = nbformat.v4.new_code_cell(
        f"run_path = {run_path!r}\nbatch = {batch}\ncontext = {context!r}", metadata={"tags": ["parameters"]}
    )
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# 00 · tour\n\nIts parameters."), cell],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nbformat.write(nb, folder / "00_tour.ipynb")
    return folder


def intact(folder: Path):
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}

    def check() -> str | None:
        now = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} if folder.is_dir() else {}
        lost = [name for name, data in before.items() if now.get(name) != data]
        return f"inputs destroyed or changed: {lost}" if lost else None

    return check


@case(AREA, "report --out X --notebooks X is refused and the notebooks stay", timeout_s=120)
def _(tmp: Path) -> Result:
    folder = notebooks(tmp)
    return cli_refused(["report", "--notebooks", str(folder), "--out", str(folder)], str(folder), harm=intact(folder))


@case(AREA, "report --out inside the notebooks folder is refused", timeout_s=120)
def _(tmp: Path) -> Result:
    folder = notebooks(tmp)
    return cli_refused(
        ["report", "--notebooks", str(folder), "--out", str(folder / "out")], str(folder), harm=intact(folder)
    )


@case(AREA, "report --out the same folder spelled another way (trailing '/.') is refused", timeout_s=120)
def _(tmp: Path) -> Result:
    folder = notebooks(tmp)
    return cli_refused(["report", "--notebooks", str(folder), "--out", f"{folder}/."], str(folder), harm=intact(folder))


@case(AREA, "report --out a link to the notebooks folder is refused", timeout_s=120)
def _(tmp: Path) -> Result:
    folder = notebooks(tmp)
    (tmp / "link").symlink_to(folder)
    return cli_refused(
        ["report", "--notebooks", str(folder), "--out", str(tmp / "link")], str(tmp / "link"), harm=intact(folder)
    )


@case(AREA, "report --out an existing file is refused by name")
def _(tmp: Path) -> Result:
    folder = notebooks(tmp)
    (tmp / "afile").write_text("keep")
    return cli_refused(
        ["report", "--notebooks", str(folder), "--out", str(tmp / "afile")],
        str(tmp / "afile"),
        harm=lambda: None if (tmp / "afile").read_text() == "keep" else "the file was overwritten",
    )


@case(AREA, "report --notebooks a missing folder names it")
def _(tmp: Path) -> Result:
    return cli_refused(["report", "--notebooks", str(tmp / "nowhere"), "--out", str(tmp / "out")], "nowhere")


for _only in ("99", "²", "-1", "1a", "", "0"):

    def _only_case(tmp: Path, only: str = _only) -> Result:
        folder = notebooks(tmp)
        return cli_refused(["report", "--notebooks", str(folder), "--out", str(tmp / "out"), "--only", only], "only")

    case(AREA, f"report --only {_only!r}")(_only_case)


@case(AREA, "report --only with Arabic-Indic digits is refused or read as those digits", timeout_s=120)
def _(tmp: Path) -> Result:
    folder = notebooks(tmp)
    done = run_cli(["report", "--notebooks", str(folder), "--out", str(tmp / "out"), "--only", "٠١"])
    if done.code == 0:
        return Result(CLEAR, "read as 01") if "01_tiny" in done.out else Result(WRONG, done.out[-200:])
    return Result(CLEAR, done.err.strip()[:150]) if "only" in done.err else Result(UNCLEAR, done.err[-200:])


for _param in ("x", "1x=2", "=3", "device"):
    case(AREA, f"report -p {_param!r}")(
        lambda tmp, p=_param: cli_refused(
            ["report", "--notebooks", str(notebooks(tmp)), "--out", str(tmp / "o"), "-p", p], "parameter"
        )
    )


def shipped_copy(tmp: Path, change=None) -> Path:
    """A data folder holding a copy of the headline run (the tour's), changed by `change(folder)`."""
    data = tmp / "data"
    target = data / headline()[0]
    shutil.copytree(REPO / "data" / headline()[0], target)
    if change is not None:
        change(target)
    return data


def _edit(folder: Path, **fields) -> None:
    path = folder / "provenance.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@case(AREA, "a truncated headline run: the report still writes index.html and report.json", timeout_s=120)
def _(tmp: Path) -> Result:
    data = shipped_copy(tmp, lambda f: (f / "results.parquet").write_bytes(b"PAR1 torn"))
    out = tmp / "out"
    with environment(DSA_LAB_DATA=str(data)):
        done = run_cli(["report", "--notebooks", str(with_tour(notebooks(tmp))), "--out", str(out)])
    if not (out / "index.html").is_file() or not (out / "report.json").is_file():
        return Result(UNCLEAR, f"no index (exit {done.code}): {done.err.strip()[-200:]}")
    page = (out / "index.html").read_text()
    return (
        Result(CLEAR, "a failed card names the file")
        if "results.parquet" in page
        else Result(UNCLEAR, "index written without naming the broken file")
    )


@case(AREA, "a headline run with foreign provenance: the report still writes its index", timeout_s=120)
def _(tmp: Path) -> Result:
    data = shipped_copy(tmp, lambda f: (f / "provenance.json").write_text('{"hello": 1}'))
    out = tmp / "out"
    with environment(DSA_LAB_DATA=str(data)):
        run_cli(["report", "--notebooks", str(with_tour(notebooks(tmp))), "--out", str(out)])
    if not (out / "index.html").is_file():
        return Result(UNCLEAR, "no index")
    return (
        Result(CLEAR, "written")
        if "provenance.json" in (out / "index.html").read_text()
        else Result(UNCLEAR, "the problem is not named")
    )


for _field in ("device_name", "run_id", "timing_method"):

    def _landing(tmp: Path, field: str = _field) -> Result:
        from dsa_lab.report import page as report_page

        data = shipped_copy(tmp, lambda f: _edit(f, **{field: HOSTILE}))
        with environment(DSA_LAB_DATA=str(data)):
            try:
                findings = report_page.headline_findings(*headline())
                context = report_page.page_context(findings)
            except Exception as err:
                from tests.battery import judge_error

                return judge_error(err, (field,), (ValueError,))
        import mistune

        for name, html in (*context.items(), ("headline.md", mistune.html(findings.markdown))):
            found = live_markup(html)
            if found:
                return Result(WRONG, f"live markup in {name}: {found!r}")
        return Result(CLEAR, "escaped or refused")

    case(AREA, f"the landing page with {_field} carrying markup", timeout_s=60)(_landing)


def _announce_outputs(chosen) -> list[str]:
    """HTML of everything `announce` displays, rendered as nbconvert renders Markdown (raw HTML passes)."""
    import mistune

    from dsa_lab.notebook import display as notebook

    shown: list[object] = []
    real = notebook.display
    notebook.display = lambda *objs, **kw: shown.extend(objs)
    try:
        notebook.announce(chosen, "battery <b>label</b>")
    finally:
        notebook.display = real
    pages = []
    for obj in shown:
        if hasattr(obj, "data") and type(obj).__name__ == "Markdown":
            pages.append(mistune.html(obj.data))
        elif isinstance(obj, dict):
            pages.append(str(obj.get("text/html", "")))
    return pages


def _chosen(tmp: Path, **provenance):
    from dsa_lab.notebook.runs import ChosenRun
    from dsa_lab.store import folders as store

    folder = shipped_copy(tmp) / headline()[0]
    run = store.load_run(folder)
    run = store.Run(run.path, {**run.provenance, **provenance}, run.results)
    return ChosenRun(run, True, provenance.get("device_name", "NVIDIA H200"), None)


for _field in ("device_name", "run_id", "created", "timing_method"):

    def _banner(tmp: Path, field: str = _field) -> Result:
        chosen = _chosen(tmp, **{field: HOSTILE})
        for html in _announce_outputs(chosen):
            found = live_markup(html)
            if found:
                return Result(WRONG, f"live markup in a notebook banner: {found!r}")
        return Result(CLEAR, "escaped")

    case(AREA, f"a notebook's run banner with {_field} carrying markup", timeout_s=60)(_banner)


@case(AREA, "a notebook's 'ignored run' lines with a path and a problem carrying markup", timeout_s=60)
def _(tmp: Path) -> Result:
    chosen = _chosen(tmp)
    chosen.ignored = [(f"h200/{HOSTILE}", f"results.parquet: {HOSTILE}")]
    for html in _announce_outputs(chosen):
        found = live_markup(html)
        if found:
            return Result(WRONG, f"live markup: {found!r}")
    return Result(CLEAR, "escaped")


@case(AREA, "a stand-in banner whose missing text carries markup", timeout_s=60)
def _(tmp: Path) -> Result:
    chosen = _chosen(tmp)
    chosen.measured, chosen.missing = False, HOSTILE
    for html in _announce_outputs(chosen):
        found = live_markup(html)
        if found:
            return Result(WRONG, f"live markup: {found!r}")
    return Result(CLEAR, "escaped")


@case(AREA, "the headline reading's Markdown with a device label carrying markup")
def _(tmp: Path) -> Result:
    import mistune

    from dsa_lab.analysis import headline as tables
    from dsa_lab.analysis.frames import one_shape
    from dsa_lab.notebook.sections import latency_run

    run_path, batch, context = headline()
    with environment(DSA_LAB_DATA=str(shipped_copy(tmp))):
        chosen = latency_run(run_path)
    table = tables.headline_table(one_shape(chosen.run.results)[0], batch, context)
    html = mistune.html(tables.headline_reading(table, HOSTILE, "run-1", batch, context))
    found = live_markup(html)
    return Result(WRONG, f"live: {found!r}") if found else Result(CLEAR, "escaped")


def _styled(kind: str) -> str:
    from dsa_lab.plots import latency, tour
    from dsa_lab.studies import goal_display

    bad = HOSTILE
    if kind == "decision table":
        table = pd.DataFrame(
            {
                "next_n": [1],
                "source": ["measured"],
                "vllm_strategy": [bad],
                "vllm_ms": [2.0],
                "best_strategy": [bad],
                "best_ms": [1.0],
                "speedup": [2.0],
                "beyond_spread": [True],
                "recommended_strategy": [bad],
            }
        )
        return latency.style_decisions(table).to_html()
    if kind == "headline table":
        table = pd.DataFrame(
            {
                "next_n": [1],
                "vllm_strategy": ["native"],
                "vllm_backend": [bad],
                "vllm_us": [2.0],
                "best_strategy": ["atom"],
                "best_pieces": [""],
                "best_backend": [bad],
                "best_us": [1.0],
                "speedup": [2.0],
                "beyond_spread": [True],
            }
        )
        return tour.style_headline(table, bad).to_html()
    if kind == "goal summary":
        return goal_display.style_goal_summary(
            pd.DataFrame({"next_n": [bad], "speedup_min": [1.0], "speedup_max": [1.1]})
        ).to_html()
    table = pd.DataFrame(
        {
            "backend": [bad],
            "us": [1.0],
            "dram_read_per_unique": [1.0],
            "l2_hit_pct": [1.0],
            "occupancy_pct": [1.0],
            "tensor_pipe_pct": [1.0],
            "useful_tflops": [1.0],
        }
    )
    table.attrs["tensor_counter"] = bad
    return goal_display.style_ncu_comparison(table).to_html()


for _kind in ("decision table", "headline table", "goal summary", "ncu comparison"):

    def _style(tmp: Path, kind: str = _kind) -> Result:
        found = live_markup(_styled(kind))
        return Result(WRONG, f"live markup in a styled {kind}: {found!r}") if found else Result(CLEAR, "escaped")

    case(AREA, f"a styled {_kind} with a backend name carrying markup")(_style)


@case(AREA, "a stand-in banner (show_fallback) with markup in both texts")
def _(tmp: Path) -> Result:
    from dsa_lab.notebook import display as notebook

    shown: list[object] = []
    real = notebook.display
    notebook.display = lambda *objs, **kw: shown.extend(objs)
    try:
        notebook.show_fallback(HOSTILE, HOSTILE)
    finally:
        notebook.display = real
    found = live_markup(" ".join(str(o.get("text/html", "")) for o in shown if isinstance(o, dict)))
    return Result(WRONG, f"live: {found!r}") if found else Result(CLEAR, "escaped")


@case(AREA, "the index with a notebook whose provenance, title and error carry markup")
def _(tmp: Path) -> Result:
    from dsa_lab.report import execute as report
    from dsa_lab.report import page as report_page

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
    result = report.ReportResult(tmp, {"p": HOSTILE}, [outcome], {"sha": HOSTILE})
    findings = report_page.Findings(None, "", "")
    report._write_index(result, findings)
    found = live_markup((tmp / "index.html").read_text())
    return Result(WRONG, f"live: {found!r}") if found else Result(CLEAR, "escaped")


@case(AREA, "the index is written by a temp file and a move")
def _(tmp: Path) -> Result:
    import os

    from dsa_lab.report import execute as report
    from dsa_lab.report import page as report_page

    moved = []
    real = os.replace
    os.replace = lambda src, dst, *a, **k: (moved.append(Path(dst).name), real(src, dst, *a, **k))[1]
    try:
        report._write_index(report.ReportResult(tmp, {}, [], {}), report_page.Findings(None, "", ""))
    finally:
        os.replace = real
    return (
        Result(CLEAR, "moved")
        if {"index.html", "report.json"} <= set(moved)
        else Result(UNCLEAR, f"written in place (moved: {moved})")
    )


@case(AREA, "a chart's title and footer with a device name holding '$' (matplotlib's markup) draw", timeout_s=60)
def _(tmp: Path) -> Result:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dsa_lab.plots import latency, style
    from dsa_lab.store import folders as store

    run = store.load_run(REPO / "data" / headline()[0])
    device = "NVIDIA $\\foo{$ H200"
    results = run.results[(run.results["batch"] == 128) & (run.results["context"] == "65536")]
    fig = latency.plot_vs_vllm(results, device, style.provenance_line({**run.provenance, "device_name": device}))
    try:
        fig.savefig(tmp / "chart.png")
    except ValueError as err:
        return Result(UNCLEAR, f"the figure fails to draw: {str(err)[:150]}")
    finally:
        plt.close(fig)
    return Result(CLEAR, "drawn")
