"""Every notebook, opened in JupyterLab in a real (headless Chromium) browser, as users run it.

JupyterLab serves `notebooks/` (so each kernel starts there), runs every notebook through
Run → Run All Cells, and no cell may show an error; then each of an explorer's Dropdowns is
moved in turn (those it offers: enabled, with a second option) and after every move its output
must change, without the explorer's one-line error, and every chart must be a new picture that is
not blank (`browser_support.image_problem`: pixel variance and ink; the canary shows it catches a
blank PNG). Screenshots land in reports/browser/. Needs Chromium (Debian: `apt-get install chromium`) and the `playwright`
package; without them the test skips, unless DSA_LAB_REQUIRE_BROWSER is set (as .ci/run does).
"""

from __future__ import annotations

import hashlib
import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from browser_support import (
    EXPLORER_ERROR,
    OUTPUT,
    REQUIRE_ENV,
    SELECTS,
    TRACEBACK_MARK,
    LabServer,
    browser_missing,
    find_chromium,
    image_problem,
)
from notebook_page_support import NotebookPage

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
SCREENSHOTS = REPO / "reports" / "browser"
NOTEBOOK_TIMEOUT = float(os.environ.get("DSA_LAB_BROWSER_TIMEOUT", "300"))  # seconds per notebook

# Notebooks that must show explorers (prefix -> at least this many); a notebook that lost its
# explorer fails here.
EXPECTED_EXPLORERS = {"01": 1, "02": 1, "04": 1}


def cannot_run(why: str) -> None:
    """Skip with one line, or fail where the browser test is required (.ci/run)."""
    if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
        pytest.fail(f"{REQUIRE_ENV} is set but the browser test cannot run: {why}", pytrace=False)
    pytest.skip(f"browser test: {why}")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    why = browser_missing()
    if why is not None:
        cannot_run(why)
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    executable = find_chromium()
    with sync_playwright() as playwright:
        try:
            chromium = playwright.chromium.launch(
                executable_path=executable, headless=True, args=["--disable-dev-shm-usage", "--disable-gpu"]
            )
        except PlaywrightError as err:
            cannot_run(f"{executable} did not start: {str(err).strip().splitlines()[0]}")
        yield chromium
        chromium.close()


@pytest.fixture
def screenshots(request: pytest.FixtureRequest) -> Path:
    """reports/browser/, without this test's pictures from an earlier run."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    stem = request.node.callspec.params["path"].stem if hasattr(request.node, "callspec") else "canary"
    for old in SCREENSHOTS.glob(f"{stem}*.png"):
        old.unlink()
    return SCREENSHOTS


@pytest.fixture(scope="module")
def lab(browser: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab serving notebooks/, as `./lab jupyter` does."""
    server = LabServer(root=NOTEBOOK_DIR, state=tmp_path_factory.mktemp("jupyterlab"))
    try:
        yield server.start()
    finally:
        server.stop()


def canary_notebook() -> nbformat.NotebookNode:
    """A notebook the check must judge right: a warning on stderr (fine), three explorers that
    follow the convention (one shows the one-line error once moved, one a blank chart), then an exception."""
    explorer = textwrap.dedent("""
        import ipywidgets as w
        from IPython.display import HTML, display

        def explorer(options, draw):
            probe = w.Dropdown(options=options); probe.add_class("dsa-lab-explorer-probe")
            out = w.Output(); out.add_class("dsa-lab-explorer-output")
            def redraw(change=None):
                out.clear_output(wait=True)
                with out:
                    draw(probe.value)
            probe.observe(redraw, names="value"); redraw()
            box = w.VBox([probe, out]); box.add_class("dsa-lab-explorer")
            return box

        display(explorer(["a", "b"], lambda v: print("value", v)))
        display(explorer(["valid", "invalid"], lambda v: display(HTML(
            '<span class="dsa-lab-error">invalid: pick another</span>' if v == "invalid" else "fine"))))

        import io
        import matplotlib.pyplot as plt
        from IPython.display import Image

        def png(blank):
            fig = plt.figure(figsize=(3, 2))
            if not blank:
                fig.gca().plot([0, 1], [0, 1])
            buffer = io.BytesIO(); fig.savefig(buffer, format="png"); plt.close(fig)
            return buffer.getvalue()

        display(explorer(["chart", "blank"], lambda v: display(Image(png(v == "blank")))))
    """)  # fmt: skip
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.cells = [
        nbformat.v4.new_code_cell('device = "cpu"', metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(
            "import sys, warnings\nwarnings.warn('only a warning')\nprint('on stderr', file=sys.stderr)"
        ),
        nbformat.v4.new_code_cell(explorer.strip()),
        nbformat.v4.new_code_cell("raise ValueError('deliberate')"),
        nbformat.v4.new_code_cell("print('never reached')"),
    ]
    return nb


def test_the_browser_check_tells_errors_from_warnings_and_sees_explorers_move(
    browser: object, tmp_path_factory: pytest.TempPathFactory, screenshots: Path
) -> None:
    root = tmp_path_factory.mktemp("canary")
    nbformat.write(canary_notebook(), root / "canary.ipynb")
    server = LabServer(root=root, state=tmp_path_factory.mktemp("canary-jupyterlab")).start()
    page = None
    try:
        page = NotebookPage(browser, server, "canary.ipynb")
        outcome = page.run_all(timeout=120)
        page.screenshot_notebook(screenshots / "canary.png")
        assert [e.split(": ", 1)[1] for e in outcome.errors] == ["ValueError: deliberate"], outcome.errors
        assert outcome.not_run == ["cell 4 (\"print('never reached')\")"], outcome.not_run
        stderr = page.page.locator("[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
        assert any("only a warning" in text for text in stderr), "the warning was not shown on stderr"
        good, bad, blank = page.explorers()
        assert page.move_probe(good) == ("a", "b")
        assert "value b" in good.locator(OUTPUT).inner_text()
        assert good.locator(EXPLORER_ERROR).count() == 0
        assert page.move_probe(bad) == ("valid", "invalid")
        assert bad.locator(EXPLORER_ERROR).count() == 1, "the explorer's one-line error was not seen"
        (chart,) = page.images(blank)
        assert image_problem(chart) is None, image_problem(chart)
        assert page.move_probe(blank, images=1) == ("chart", "blank")
        (drawn,) = page.images(blank)
        assert (image_problem(drawn) or "").startswith("blank:"), "the pixel check passed a blank chart"
    finally:
        if page is not None:
            page.close()
        server.stop()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_jupyterlab_and_its_explorers_respond(
    path: Path, browser: object, lab: LabServer, screenshots: Path
) -> None:
    committed = hashlib.sha256(path.read_bytes()).hexdigest()
    page = NotebookPage(browser, lab, path.name)
    try:
        try:
            outcome = page.run_all(timeout=NOTEBOOK_TIMEOUT)
        finally:
            page.screenshot_notebook(screenshots / f"{path.stem}.png")
        assert not outcome.errors, (
            f"{path.name} run in JupyterLab (kernel cwd notebooks/) shows errors: {outcome.errors}"
        )
        assert not outcome.not_run, f"{path.name}: cells that did not run: {outcome.not_run}"
        assert lab.kernel_cwds() in (set(), {NOTEBOOK_DIR}), f"kernels ran in {lab.kernel_cwds()}, not notebooks/"

        explorers = page.explorers()
        expected = EXPECTED_EXPLORERS.get(path.name[:2], 0)
        assert len(explorers) >= expected, f"{path.name}: {len(explorers)} explorer(s) on the page, expected {expected}"
        changes = checked = 0
        for number, explorer in enumerate(explorers, start=1):
            charts = explorer.locator("img")
            charts_before = charts.count()
            assert charts_before > 0, f"{path.name}, explorer {number}: drew no chart before any move"
            shown = page.images(explorer)
            checked += len(shown)
            problems = [p for p in map(image_problem, shown) if p]
            assert not problems, f"{path.name}, explorer {number}, as first drawn: {problems}"
            # every Dropdown it offers, in turn (counted anew: a control may offer more after another moved)
            index = 0
            while index < len(page.selects(explorer)):
                select = page.selects(explorer)[index]
                charts.evaluate_all("els => els.forEach(e => { e.__dsaOld = true; })")
                old, new = page.move_select(explorer, select, images=charts_before)
                changes += 1
                where = f"{path.name}, explorer {number}, control {index + 1} moved from {old!r} to {new!r}"
                errors = explorer.locator(EXPLORER_ERROR).all_inner_texts()
                assert not errors, f"{where}: the explorer shows its error: {errors}"
                assert TRACEBACK_MARK not in explorer.inner_text(), f"{where}: a traceback in the explorer's output"
                assert charts.count() == charts_before, (
                    f"{where}: {charts.count()} charts after the move, {charts_before} before"
                )
                stale = charts.evaluate_all("els => els.filter(e => e.__dsaOld).length")
                assert stale == 0, f"{where}: {stale} chart(s) not redrawn"
                drawn = page.images(explorer)
                problems = [p for p in map(image_problem, drawn) if p]
                for k, png in enumerate(drawn if problems else []):  # kept beside the screenshots, to look at
                    (screenshots / f"{path.stem}-explorer{number}-move{changes}-chart{k + 1}.png").write_bytes(png)
                assert not problems, f"{where}: {problems}"
                assert drawn != shown, f"{where}: the charts are the same pictures as before the move"
                checked += len(drawn)
                shown = drawn
                index += 1
            page.screenshot_explorer(explorer, screenshots / f"{path.stem}-explorer{number}.png")
        print(f"{path.name}: {len(explorers)} explorer(s), {changes} control moves, {checked} charts checked")
    finally:
        page.close()
        lab.shutdown_kernels()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == committed, f"{path.name} was modified on disk"


def test_a_run_switch_in_the_02_explorer_selects_every_option_the_run_timed(
    browser: object, lab: LabServer, tmp_path: Path
) -> None:
    """Issue 28: switching 02's explorer from the notebook's run (DeepGEMM and Triton) to the serving run selects
    every backend that run timed, Gluon and PR #340 included, and says so; selected options look selected."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = NotebookPage(browser, lab, "02_latency_vs_next_n.ipynb")
    try:
        outcome = page.run_all(timeout=NOTEBOOK_TIMEOUT)
        assert not outcome.errors, outcome.errors
        (explorer,) = page.explorers()
        run = explorer.locator(SELECTS).first  # the run selector: the notebook's run, then the newest study run
        labels = [label.replace("\xa0", " ") for label in run.locator("option").all_inner_texts()]
        serving = next(i for i, label in enumerate(labels) if label.startswith("h200-serving-"))
        assert labels[0] == "this notebook's run" and serving >= 1  # each other run named with its card
        backends = explorer.locator("select[multiple]").first
        before = backends.locator("option:checked").all_inner_texts()
        assert "gluon" not in before
        page.move_select(explorer, run, images=1, to=serving)
        chosen = backends.locator("option:checked").all_inner_texts()
        assert {"gluon", "deepgemm-pr340", "deepgemm"} <= set(chosen), chosen  # every backend the new run timed
        assert "every one selected" in explorer.locator(OUTPUT).inner_text()  # and it says so
        colour = backends.locator("option:checked").first.evaluate("o => getComputedStyle(o).backgroundImage")
        assert "rgb(9, 105, 218)" in colour  # the selection blue, focused or not (not a disabled-looking grey)
        page.screenshot_explorer(explorer, SCREENSHOTS / "02-run-switch.png")
    finally:
        page.close()
        lab.shutdown_kernels()


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    """`dsa-lab report --run` of a CPU run made now (bench --preset ci into a scratch folder of its own): the
    report folder, the run's id and the report's exit status."""
    import subprocess
    import sys

    scratch = tmp_path_factory.mktemp("scratch")
    env = {**os.environ, "DSA_LAB_SCRATCH": str(scratch), "PYTHONPATH": str(REPO)}
    bench = [sys.executable, "-m", "dsa_lab.cli", "bench", "--preset", "ci", "--no-progress"]
    subprocess.run(bench, cwd=REPO, env=env, check=True, capture_output=True)
    (run,) = (scratch / "cpu").iterdir()
    out = tmp_path_factory.mktemp("report")
    report = [sys.executable, "-m", "dsa_lab.cli", "report", "--run", f"scratch/cpu/{run.name}", "--out", str(out)]
    done = subprocess.run(report, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert "Kernel is running over TCP" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
    return out, run.name, done.returncode


def test_a_report_of_a_fresh_cpu_run_reads_it_on_every_page(browser: object, cpu_report: tuple[Path, str, int]) -> None:
    """Issue 28: `report --run <a fresh CPU ci run>` exits 0; every page shows that run or a banner saying why not;
    no page holds a machine path, a stderr box, a traceback or raw HTML; the index names the run. Each page's height
    at 1280 px is printed, and its screenshot kept in reports/browser/."""
    out, run_id, code = cpu_report
    assert code == 0
    cards = json.loads((out / "report.json").read_text())["notebooks"]
    reading = {card["html"] for card in cards if any(p.get("run_id") for p in card["provenance"])}  # read a run
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        for html in sorted(out.glob("*.html")):
            text = html.read_text(encoding="utf-8")
            for machine in (str(out), str(REPO), os.path.expanduser("~")):
                assert machine not in text, f"{html.name}: a machine path ({machine})"
            assert 'data-mime-type="application/vnd.jupyter.stderr"' not in text, f"{html.name}: a stderr box"
            assert TRACEBACK_MARK not in text and "&lt;span style" not in text, f"{html.name}: a traceback or raw HTML"
            page.goto(html.resolve().as_uri())
            height = page.evaluate("document.documentElement.scrollHeight")
            page.screenshot(path=str(SCREENSHOTS / f"cpu-run-{html.stem}.png"), full_page=True)
            print(f"{html.name}: {height} px")
            if html.name == "index.html":
                assert run_id in page.inner_text("body") and "6 of 6 notebooks ok" in page.inner_text("body")
            elif html.name in reading:
                body = page.inner_text("body")
                assert run_id in body or "Not the measured data" in body, f"{html.name} shows neither the run nor why"
    finally:
        page.close()
