"""Execute the notebooks with papermill into `reports/` and index them.

Each `notebooks/NN_*.ipynb` runs in order on whatever device is present (passed to it
as the papermill parameter `device`). A failing notebook is recorded with its cell and
error and the rest still run, so one broken chart never hides the others. Notebooks
announce the data they used (`dsa_lab.notebook.display.show_provenance`); the index lists it beside each one.
Per notebook the report keeps a reader's page without code (`NN_x.html`), the page with
code (`NN_x.code.html`), the executed notebook, and every chart as PNG and SVG
(`figures/`); `dsa_lab.report.page` builds the landing page, and `dsa_lab.report.cli` is `dsa-lab report`.

The report never destroys its inputs: an `out_dir` that is, or lies inside, the notebooks
folder is refused by name. It always writes an index: a notebook whose output cannot be
rendered, or a headline run that cannot be read, is a failed card naming the file. Every
page, the index and `report.json` are written to a temp file, then moved into place.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

import jinja2
import nbformat
import papermill
from papermill.exceptions import PapermillExecutionError
from tqdm import tqdm

from dsa_lab.notebook.display import FALLBACK_MIME, PROVENANCE_MIME
from dsa_lab.paths import check_output_path, shown_path
from dsa_lab.plots.style import BETTER_BACKGROUND
from dsa_lab.report import page as report_page
from dsa_lab.store.provenance import git_state
from dsa_lab.store.writes import check_replaceable, write_text_atomic

NOTEBOOK_PATTERN = re.compile(r"^(\d\d)_.+\.ipynb$")


@dataclass
class NotebookOutcome:
    """How one notebook's execution went, and where its outputs are."""

    name: str
    status: str  # "ok" | "failed"
    seconds: float
    executed: str | None = None  # executed .ipynb, relative to the report folder
    html: str | None = None
    failed_cell: int | None = None  # index of the failing cell in the source notebook
    failed_exec_count: int | None = None  # its execution count, "In [n]" in the executed one
    failed_source: str | None = None  # its first source line
    error: str | None = None
    provenance: list[dict[str, Any]] = field(default_factory=list)  # one record per run it showed (run_id, path)
    fallbacks: list[dict[str, Any]] = field(default_factory=list)  # what it showed instead of measured data
    title: str = ""
    description: str = ""  # the first sentence of its introduction
    code_html: str | None = None  # the page with code; `html` is the reader's page without it
    thumbnail: str | None = None
    figures: list[str] = field(default_factory=list)  # figures/NN_x-<cell id>[-K].png|svg

    @property
    def runs(self) -> list[str]:
        """The stored runs it used, as its card names them: 'label: path' (a run's id when it has no path)."""
        return list(
            dict.fromkeys(f"{p['label']}: {p.get('path') or p['run_id']}" for p in self.provenance if p.get("run_id"))
        )


@dataclass
class ReportResult:
    out_dir: Path
    parameters: dict[str, Any]
    outcomes: list[NotebookOutcome]
    code: dict[str, Any] = field(default_factory=dict)  # git state of the dsa_lab that ran them
    headline_failed: str | None = None  # why the headline run could not be read (its card in the index says so too)

    @property
    def failed(self) -> list[NotebookOutcome]:
        return [o for o in self.outcomes if o.status != "ok"]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed or self.headline_failed else 0


def default_device() -> str:
    """'cuda' when a GPU is visible, else 'cpu'."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def find_notebooks(notebooks_dir: Path, only: Sequence[str] = ()) -> list[Path]:
    """`NN_*.ipynb` in `notebooks_dir`, sorted by NN; `only` keeps the given NN prefixes."""
    if not notebooks_dir.is_dir():
        raise ValueError(f"notebooks_dir={str(notebooks_dir)!r}: not a directory")
    found = sorted(p for p in notebooks_dir.iterdir() if NOTEBOOK_PATTERN.match(p.name))
    if only:
        wanted = {f"{int(x):02d}" if x.isascii() and x.isdigit() else x for x in only}
        available = [p.name[:2] for p in found]
        unknown = sorted(wanted - set(available))
        if unknown:
            raise ValueError(f"only={unknown}: no such notebook; allowed values are {available}")
        found = [p for p in found if p.name[:2] in wanted]
    if not found:
        raise ValueError(f"notebooks_dir={str(notebooks_dir)!r}: holds no NN_*.ipynb notebook")
    return found


def build_report(
    notebooks_dir: str | Path,
    out_dir: str | Path,
    parameters: Mapping[str, Any] | None = None,
    device: str | None = None,
    only: Sequence[str] = (),
    cwd: str | Path | None = None,
    execution_timeout: int | None = 1800,
) -> ReportResult:
    """Run every notebook with papermill, render HTML, write `index.html` and `report.json`.

    `device` (default: 'cuda' if present, else 'cpu') is passed to each notebook as a
    papermill parameter alongside `parameters`, and `interactive=False` unless given, so
    that explorers draw their default view as plain output the HTML keeps. Notebooks run with `cwd` as their working
    directory (default: the folder above `notebooks_dir`, the repository root).
    """
    notebooks_dir, out_dir = Path(notebooks_dir), Path(out_dir)
    notebooks = find_notebooks(notebooks_dir, only)
    check_output_path(out_dir, [notebooks_dir], "out_dir", folder=True)  # absent, or a folder (not a link to one)
    params = {"interactive": False, **(parameters or {}), "device": device or default_device()}
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(cwd) if cwd is not None else notebooks_dir.resolve().parent
    outcomes = []
    bar = tqdm(notebooks, desc="notebooks", unit="nb", file=sys.stderr)
    with _kernels_draw_svg_too():
        for path in bar:
            bar.set_postfix_str(path.name)
            outcomes.append(_run_one(path, out_dir, params, workdir, execution_timeout))
    run_path = str(params.get("run_path") or "")
    findings, point = _findings(notebooks_dir, run_path)
    result = ReportResult(out_dir, params, outcomes, git_state(), headline_failed=findings.problem)
    answers = report_page.serving_answers(str(params.get("serving_run_path") or run_path), point[1], point[3])
    _write_index(result, findings, answers)
    return result


def _findings(notebooks_dir: Path, run_path: str = "") -> tuple[report_page.Findings, tuple[str, int, str, str]]:
    """The headline of the run and shape the tour notebook names, or of `run_path` when one is given (none
    without the tour), and that point (run path, batch, context, GPU)."""
    point = (run_path, 128, "65536", "h200")  # the study's headline, when the tour cannot name it
    tour = [p for p in find_notebooks(notebooks_dir) if p.name.startswith(report_page.HEADLINE_NOTEBOOK)]
    if not tour:
        text = f"No tour notebook ({report_page.HEADLINE_NOTEBOOK}_*.ipynb) among the notebooks: no headline."
        return report_page.Findings(None, f"<p class='fallback'>{escape(text)}</p>", text + "\n"), point
    try:
        shape = report_page.headline_point(tour[0])
        device = report_page.tour_parameters(tour[0]).get("run_device", "h200")
        point = (run_path or shape[0], shape[1], shape[2], device)
    except Exception as err:  # parameters the tour cannot give: the index is written, with a failed card
        return report_page.failed_findings(tour[0].name, err), point
    try:
        return report_page.headline_findings(*point), point
    except Exception as err:  # whatever the headline run does, the index is written, with a failed card
        return report_page.failed_findings(point[0], err), point


@contextlib.contextmanager
def _kernels_draw_svg_too() -> Iterator[None]:
    """Kernels started meanwhile render every inline chart as PNG and SVG (an IPython profile
    of their own), so `figures/` can keep both; the user's IPython profile is left alone."""
    with tempfile.TemporaryDirectory(prefix="dsa_lab_ipython_") as ipython_dir:
        profile = Path(ipython_dir) / "profile_default"
        profile.mkdir()
        # and keep their own log quiet: its notes (that it talks TCP to papermill on this machine, the interrupt
        # jupyter_client sends every kernel it shuts down) are not the report's; a cell's error comes back as output
        config = 'c.InlineBackend.figure_formats = {"png", "svg"}\nc.IPKernelApp.log_level = "CRITICAL"\n'
        (profile / "ipython_kernel_config.py").write_text(config)
        previous = os.environ.get("IPYTHONDIR")
        os.environ["IPYTHONDIR"] = ipython_dir
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("IPYTHONDIR", None)
            else:
                os.environ["IPYTHONDIR"] = previous


def _own(path: Path, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters `path` declares (papermill would warn of the others, one line each)."""
    declared = papermill.inspect_notebook(str(path))
    return {name: value for name, value in params.items() if name in declared}


def _run_one(
    path: Path, out_dir: Path, params: dict[str, Any], workdir: Path, execution_timeout: int | None
) -> NotebookOutcome:
    executed = out_dir / path.name
    for stale in (executed, executed.with_suffix(".html"), executed.with_suffix(".code.html")):
        check_replaceable(stale)  # a link, device or FIFO where a page belongs is refused by name, never removed
        stale.unlink(missing_ok=True)  # never report a previous run's output
    start = time.perf_counter()
    outcome = NotebookOutcome(name=path.stem, status="ok", seconds=0.0)
    running = executed.with_name(f".tmp-{os.getpid()}-{executed.name}")  # papermill saves as it goes: moved at the end
    if running.is_symlink() or running.exists():
        running.unlink()  # a stale temp file, or a link planted at its name: removed, never written through
    try:
        papermill.execute_notebook(
            str(path),
            str(running),
            parameters=_own(path, params),
            cwd=str(workdir),
            progress_bar=False,
            execution_timeout=execution_timeout,
        )
    except PapermillExecutionError as err:
        outcome.status = "failed"
        outcome.failed_exec_count = err.exec_count
        outcome.failed_source = next(iter((err.source or "").strip().splitlines()), "")
        outcome.error = f"{err.ename}: {err.evalue}"
    except Exception as err:  # kernel death, unreadable notebook...: record it, run the rest
        outcome.status = "failed"
        outcome.error = f"{type(err).__name__}: {err}"
    outcome.seconds = round(time.perf_counter() - start, 2)
    if running.exists():
        os.replace(running, executed)
    if executed.exists():
        try:
            _render(executed, path, out_dir, outcome)
        except Exception as err:  # an executed notebook that cannot be read or rendered: its card says so
            outcome.status = "failed"
            problem = f"rendering {executed} failed: {type(err).__name__}: {err}"
            outcome.error = f"{outcome.error}; {problem}" if outcome.error else problem
    if outcome.status != "ok":
        where = (
            f" in cell {outcome.failed_cell} (In [{outcome.failed_exec_count}]: {outcome.failed_source!r})"
            if outcome.failed_cell is not None
            else ""
        )
        tqdm.write(f"FAILED {path.name}{where}: {outcome.error}", file=sys.stderr)
    return outcome


def _render(executed: Path, path: Path, out_dir: Path, outcome: NotebookOutcome) -> None:
    """An executed notebook's card (provenance, fallbacks, title, figures) and its two HTML pages."""
    outcome.executed = executed.name
    node = nbformat.read(executed, as_version=4)
    outcome.provenance = _collect(node, PROVENANCE_MIME)
    outcome.fallbacks = _collect(node, FALLBACK_MIME)
    if outcome.status != "ok":
        outcome.failed_cell = _failing_source_cell(node)
    outcome.title, outcome.description = report_page.describe(node)
    outcome.figures = report_page.write_figures(node, path.stem, out_dir)
    outcome.thumbnail = report_page.write_thumbnail(node, path.stem, out_dir)
    light = report_page.without_svg(node)
    for with_code, target in ((False, executed.with_suffix(".html")), (True, executed.with_suffix(".code.html"))):
        body, _ = report_page.page_exporter(with_code).from_notebook_node(light)
        write_text_atomic(target, body)
    outcome.html, outcome.code_html = executed.with_suffix(".html").name, executed.with_suffix(".code.html").name


def _failing_source_cell(node: nbformat.NotebookNode) -> int | None:
    """Index, in the notebook as written, of the cell whose output is an error.

    Papermill adds an injected-parameters cell and an error banner; neither is counted.
    """
    index = 0
    for cell in node.cells:
        if set(report_page.PAPERMILL_TAGS) & set(cell.metadata.get("tags", [])):
            continue
        if any(out.get("output_type") == "error" for out in cell.get("outputs", [])):
            return index
        index += 1
    return None


def _collect(node: nbformat.NotebookNode, mime: str) -> list[dict[str, Any]]:
    found = []
    for cell in node.cells:
        for output in cell.get("outputs", []):
            record = output.get("data", {}).get(mime)
            if record is not None:
                found.append(dict(record))
    return found


_INDEX_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dsa_lab report</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #1f2328; }
h1 { margin-bottom: .2em; } .meta { color: #57606a; font-size: 90%; }
table { border-collapse: collapse; } td, th { border: 1px solid #d0d7de; padding: .3em .6em; vertical-align: top; }
table.headline td:nth-child(3), table.headline td:nth-child(5), table.headline td:nth-child(6) { text-align: right; }
td.win { background: {{ better_background }}; } caption { text-align: left; font-weight: bold; padding: .3em 0; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(330px, 1fr)); gap: 1em; }
.card { border: 1px solid #d0d7de; border-radius: 6px; padding: .8em; }
.card img { max-width: 100%; border: 1px solid #eee; }
.ok { color: #1a7f37; font-weight: bold; } .failed { color: #cf222e; font-weight: bold; }
.fallback { background: #fff8c5; border-left: 4px solid #d4a72c; padding: .3em .5em; margin: .4em 0; }
.fallback p { margin: 0; }
pre { white-space: pre-wrap; background: #f6f8fa; padding: .5em; margin: .3em 0; }
code { font-size: 90%; } details { margin: .3em 0; } summary { cursor: pointer; color: #57606a; }
</style></head><body>
<h1>dsa_lab report</h1>
<p class="meta">{{ outcomes|length - failed }} of {{ outcomes|length }} notebooks ok &middot; generated {{ generated }}
&middot; git <code>{{ (code.sha or "unknown")[:12] }}</code>{% if code.dirty %} (uncommitted changes){% endif %}
&middot; parameters {% for k, v in parameters.items() %}<code>{{ k }}={{ v }}</code> {% endfor %}</p>

<h2>Findings</h2>
{{ whole_step_html|safe }}
{{ headline_table|safe }}
{{ headline_reading|safe }}
{{ answers_html|safe }}
<p class="meta">{% if headline_table %}Blue: vLLM 0.33's choice is slower than the fastest option by more than the measured spread.
The table as Markdown: <a href="headline.md">headline.md</a>. {% endif %}Every chart as PNG and SVG: <a href="figures/">figures/</a>.</p>

<h2>Notebooks</h2>
<div class="cards">
{% for o in outcomes %}<div class="card">
<div><b>{% if o.html %}<a href="{{ o.html }}">{{ o.title or o.name }}</a>{% else %}{{ o.title or o.name }}{% endif %}</b>
&middot; <span class="{{ o.status }}">{{ o.status }}</span> &middot; {{ o.seconds }} s</div>
<div class="meta">{{ o.description }}</div>
<div class="meta runs">{% if o.runs %}Runs used: {% for r in o.runs %}<code>{{ r }}</code>{% if not loop.last %}; {% endif %}{% endfor %}{% else %}No stored run used.{% endif %}</div>
{% if o.thumbnail %}<a href="{{ o.html }}"><img src="{{ o.thumbnail }}" alt="first chart of {{ o.name }}"></a>{% endif %}
{% for f in o.fallbacks %}<div class="fallback"><b>Not the measured data: {{ f.shown_instead }}.</b> {{ f.missing }}</div>{% endfor %}
{% if o.error %}<div class="failed">Failed{% if o.failed_cell is not none %} in cell {{ o.failed_cell }} (In [{{ o.failed_exec_count }}]): <code>{{ o.failed_source }}</code>{% endif %}</div><pre>{{ o.error }}</pre>{% endif %}
<div class="meta">{% if o.code_html %}<a href="{{ o.code_html }}">with code</a> &middot; {% endif %}{% if o.executed %}<a href="{{ o.executed }}">notebook</a> &middot; {% endif %}{{ o.figures|length }} figure files</div>
{% if o.provenance %}<details><summary>data used ({{ o.provenance|length }})</summary>
{% for p in o.provenance %}<div><b>{{ p.label }}</b>: {% for k, v in p.items() if k != 'label' %}<code>{{ k }}={{ v }}</code> {% endfor %}</div>{% endfor %}
</details>{% endif %}
</div>
{% endfor %}</div>
</body></html>
"""


def _shown(value: Any) -> Any:
    """A parameter as the index shows it: a folder given whole is shown as `paths.shown_path` shows it."""
    return shown_path(value) if isinstance(value, str) and Path(value).is_absolute() else value


def _write_index(
    result: ReportResult, findings: report_page.Findings, answers: report_page.Answers | None = None
) -> None:
    env = jinja2.Environment(autoescape=True)
    page = env.from_string(_INDEX_TEMPLATE).render(
        better_background=BETTER_BACKGROUND,  # the speedup palette's 'faster than vLLM's choice' (plots.style)
        generated=datetime.now(UTC).isoformat(timespec="seconds"),
        parameters={k: _shown(v) for k, v in result.parameters.items()},
        outcomes=result.outcomes,
        failed=len(result.failed),
        code=result.code,
        **report_page.page_context(findings, answers),
    )
    write_text_atomic(result.out_dir / "index.html", page)
    write_text_atomic(result.out_dir / "headline.md", findings.markdown + (f"\n{answers.markdown}" if answers else ""))
    summary = {"parameters": result.parameters, "code": result.code, "notebooks": [asdict(o) for o in result.outcomes]}
    write_text_atomic(result.out_dir / "report.json", json.dumps(summary, indent=2, default=str))
