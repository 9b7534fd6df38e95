"""The report's landing page: findings first, then one card per notebook, provenance folded.

`dsa-lab report` (dsa_lab.report.execute) executes the notebooks; this module turns what they
produced into what a reader opens: the headline table generated from the run and shape the tour
notebook (00) names in its parameters (also written as Markdown to paste into a pull request), a line, a thumbnail and a
status per notebook, every chart as PNG and SVG under `figures/`, and the notebooks'
HTML without code (the code-visible page and the executed notebook sit beside it).

Nothing from a run is live in the page: the run's id and device are escaped in the
Markdown of the reading, and the Markdown is rendered with raw HTML off
(`markup.render_markdown`). A headline run that cannot be read does not cost the
report its index: the headline becomes a failed card naming the file and the problem.
"""

from __future__ import annotations

import ast
import base64
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import nbformat
import pandas as pd
import papermill
from nbconvert import HTMLExporter

from dsa_lab.analysis.headline import runs_named
from dsa_lab.analysis.labels import pieces_title
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.kernels import vllm_backend
from dsa_lab.markup import html_text, md_code, md_text, render_markdown
from dsa_lab.paths import shown_path
from dsa_lab.store.writes import write_atomic

if TYPE_CHECKING:
    from dsa_lab.notebook.answers import Answer
    from dsa_lab.plots.answers import AnswerGrid

HEADLINE_NOTEBOOK = "00"  # the tour: its parameters name the headline's run and shape
THUMB_WIDTH = 360
FIGURE_MIMES = {"image/png": "png", "image/svg+xml": "svg"}
CELL_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
PAPERMILL_TAGS = (
    "papermill-error-cell-tag",
    "injected-parameters",
)  # cells papermill adds to an executed notebook  # nbformat's cell id, a safe file name; else the cell's number


@dataclass
class Findings:
    """The headline: a table per next_n and a few sentences, both generated from one run."""

    table: pd.DataFrame | None
    reading_html: str
    markdown: str  # the table as Markdown, for pull requests and issues
    problem: str | None = None  # why the headline run could not be read; `reading_html` is then the failed card

    @property
    def failed(self) -> bool:
        return self.problem is not None


def tour_parameters(notebook: Path) -> dict[str, Any]:
    """The tour notebook's parameters (their defaults), as papermill reads its parameters cell."""
    return {name: ast.literal_eval(p["default"]) for name, p in papermill.inspect_notebook(str(notebook)).items()}


def headline_point(notebook: Path) -> tuple[str, int, str]:
    """(run path, batch, context) of the headline, as the tour notebook's parameters cell names them
    (`run_path`, `batch`, `context`): the report shows the run and shape the tour shows."""
    values = tour_parameters(notebook)
    return values["run_path"], values["batch"], ContextSpec.parse(values["context"]).label


def headline_findings(run_path: str, batch: int, context: str, device: str = "h200") -> Findings:
    """What vLLM 0.33 takes and what is fastest per next_n at one shape: the one answer
    (`notebook.answers.answer`, over every measured run of `device`, or the run `run_path` names)."""
    from dsa_lab.analysis import headline
    from dsa_lab.notebook.answers import answer
    from dsa_lab.notebook.answers import headline as headline_of

    try:
        found = answer(run_path, device)
        shown = headline_of(found, batch, context)
        if shown is None:
            text = (
                f"{_what_is_missing(found, run_path, device)}, so there is no headline. Make one on an H200 with "
                "`dsa-lab bench --preset h200-full`." + _passed_over(found.ignored)
            )
            return Findings(None, f"<div class='fallback'>{render_markdown(text)}</div>", text + "\n")
        runs = ", ".join(found.run_ids(shown.table))
        label = shown.chosen.device_label
        reading = headline.headline_reading(shown.table, label, runs, shown.batch, shown.context)
        reading += "".join(f"\n\n{n}" for n in shown.notes) + _passed_over(found.ignored)
    except (ValueError, OSError) as err:  # a damaged run (store.RunFormatError names its file): a failed card
        return failed_findings(run_path, err)
    markdown = headline_markdown(shown.table, label, runs, shown.batch, shown.context)
    return Findings(shown.table, render_markdown(reading), markdown)


def _what_is_missing(found: Answer, run_path: str, device: str) -> str:
    """Why an answer has no point: the run asked for is not there, or times vLLM's step only away from the default
    setting the headline reads, or times no step vLLM takes, or no run does."""
    step = f"the step vLLM 0.33 takes (its backend, {md_text(vllm_backend().name)}, on a GPU)"
    if run_path and not found.asked:
        return f"The measured run {md_code(shown_path(run_path))} is not in this checkout's data folder"
    if run_path and not found.table.empty:
        return (
            f"The run {md_code(shown_path(run_path))} times {step} only away from the study's default setting "
            "(logits alone at the batch's width, CUDA events, no acceptance curve), where the headline is read"
        )
    if run_path:
        return f"The run {md_code(shown_path(run_path))} times no point of {step}"
    return f"No measured {device.upper()} run in this checkout's data folder times {step}"


def _passed_over(ignored: list[tuple[str, str]]) -> str:
    """Markdown naming the runs a search passed over, with why ('' when none): a damaged or a newer run of the
    user's is said on the card, never skipped in silence."""
    if not ignored:
        return ""
    runs = "; ".join(f"{md_code(path)}: {md_text(problem)}" for path, problem in ignored)
    return f"\n\n*Runs passed over: {runs}.*"


@dataclass
class Answers:
    """The answer per workload and next_n (`analysis.answers.grid`): the whole step's grid (`whole_html`, what the
    index opens with), then the kernel's (`html`: its grids, or why there are none, and the runs passed over)."""

    html: str
    markdown: str
    run_ids: tuple[str, ...] = ()  # the runs it read (empty: none answered; `html` says why)
    whole_html: str = ""  # the whole step's grid, when a run timed whole steps


def serving_answers(run_path: str = "", batch: int = 128, device: str = "h200") -> Answers:
    """The option to use per workload and next_n, each cell's speedup over vLLM 0.33's choice: first the whole
    step's (logits, then vLLM's top-k), from the run notebook 02 answers it on (`notebook.sections.WHOLE_STEP`),
    then the kernel's (`notebook.answers.grids`: the one answer over every measured run of `device`, or over the
    run `run_path` names); the runs passed over named."""
    from dsa_lab.notebook.answers import answer, grids, whole_step_grids
    from dsa_lab.notebook.sections import WHOLE_STEP

    try:
        step, step_note = WHOLE_STEP.run(run_path, device)
        whole = whole_step_grids(step.run if step is not None else None, batch)
        found = answer(run_path, device)
        kernel = grids(found, batch, whole_step=False)
    except (ValueError, OSError) as err:  # a damaged run: said on the page, the index still written
        problem = f"{type(err).__name__}: {err}"
        return Answers(f"<div class='failed'>Answers per workload failed: {html_text(problem)}</div>", problem + "\n")
    step_note = f"*{md_text(step_note)}*" if step_note else ""
    whole_html = "".join(grid.to_html() for grid in whole) + (render_markdown(step_note) if step_note else "")
    passed = _passed_over(found.ignored)
    if not kernel:
        note = f"{_what_is_missing(found, run_path, device)}, so there is no answer per workload." + passed
        return Answers(f"<div class='fallback'>{render_markdown(note)}</div>", note + "\n", whole_html=whole_html)
    html = "".join(grid.to_html() for grid in kernel) + (render_markdown(passed.strip()) if passed else "")
    markdown = "\n\n".join([*(_grid_markdown(grid) for grid in [*whole, *kernel]), *([step_note] if step_note else [])])
    step_runs = [step.run.provenance["run_id"]] if step is not None and whole else []
    run_ids = tuple(dict.fromkeys([*step_runs, *found.run_ids(found.table)]))
    return Answers(html, markdown + passed + "\n", run_ids, whole_html)


def _grid_markdown(grid: AnswerGrid) -> str:
    """A grid as Markdown: a row per workload, a column per next_n, each cell 'option speedup×'."""
    rows = grid.rows
    keys = ["workload", "batch"] if grid.by_batch else ["workload"]
    table = rows.assign(cell=rows["choice"] + " " + rows["gain"].map("{:.2f}×".format)).pivot_table(
        index=keys, columns="next_n", values="cell", aggfunc="first", sort=False
    )
    table = table[sorted(table.columns)]
    runs = runs_named(", ".join(dict.fromkeys(rows["run_id"])))
    devices = ", ".join(md_text(d) for d in dict.fromkeys(rows["device"]))
    head = f"**{md_text(grid.title)}** ({runs}, on {devices})"
    return head + "\n\n" + table.fillna("").reset_index().to_markdown(index=False)


def failed_findings(source: str, err: BaseException) -> Findings:
    """The headline as a failed card: the run (or the notebook naming it) and why it could not be read (the
    error names the file)."""
    problem = f"{type(err).__name__}: {err}"
    card = (
        f"<div class='card failed-card'><span class='failed'>Headline failed</span>: "
        f"<code>{html_text(source)}</code> could not be read.<pre>{html_text(problem)}</pre></div>"
    )
    markdown = f"The headline's {md_code(source)} could not be read: {md_text(problem)}\n"
    return Findings(None, card, markdown, problem=f"{source} could not be read: {problem}")


def headline_markdown(table: pd.DataFrame, device_label: str, run_id: str, batch: int, context: str) -> str:
    """The headline table in Markdown, with its provenance line (`run_id`: the runs its rows come from)."""
    lines = [
        f"Paged MQA logits, one decode step, B = {batch}, context {int(context) // 1024}K, FP8; the workload: a "
        "uniform batch (every request that context), logits only at the batch's width, CUDA events; "
        f"measured on {md_text(device_label)} ({runs_named(run_id)}), median µs.",
        "",
        "| next_n | vLLM 0.33 takes | µs | fastest measured | µs | speedup |" + (" run |" if "," in run_id else ""),
        "|---|---|---|---|---|---|" + ("---|" if "," in run_id else ""),
    ]
    for row in table.itertuples():
        pieces = f" {pieces_title(row.best_pieces)}" if row.best_pieces else ""
        lines.append(
            f"| {row.next_n} | {row.vllm_strategy} ({row.vllm_backend}) | {row.vllm_us:.0f} | "
            f"{row.best_strategy}{pieces} ({row.best_backend}) | {row.best_us:.0f} | {row.speedup:.2f}× |"
            + (f" {md_code(row.run_id)} |" if "," in run_id else "")
        )
    return "\n".join(lines) + "\n"


ABBREVIATIONS = re.compile(r"\b(e\.g|i\.e|cf|vs|etc|Fig|No)\.$")  # a full stop that ends no sentence


def describe(node: nbformat.NotebookNode) -> tuple[str, str]:
    """(title, one line) from a notebook's first markdown cell of its own (papermill's error banner and injected
    cells are not the notebook's): its heading and first sentence, a full stop after 'e.g.' ending none."""
    own = (
        c.source
        for c in node.cells
        if c.cell_type == "markdown" and not set(PAPERMILL_TAGS) & set(c.get("metadata", {}).get("tags", []))
    )
    first = next(own, "")
    lines = [line.strip() for line in first.splitlines()]
    title = re.sub(r"[*`]", "", next((line.lstrip("# ").strip() for line in lines if line.startswith("#")), ""))
    prose = " ".join(line for line in lines if line and not line.startswith("#"))
    return title, re.sub(r"[*`]", "", first_sentence(prose))


def first_sentence(prose: str) -> str:
    """The text up to the first full stop, question or exclamation mark that ends a sentence."""
    for found in re.finditer(r"[.?!](?=\s|$)", prose):
        if not ABBREVIATIONS.search(prose[: found.end()]):
            return prose[: found.end()]
    return prose


def images(node: nbformat.NotebookNode) -> list[tuple[str, str, str | bytes]]:
    """Every chart a notebook drew, in order, as (name, extension, payload); a chart drawn in two formats
    counts once per format, under one name.

    The name is the drawing cell's id (nbstripout keeps ids: they are the cells' names; an id that is not
    nbformat's `[A-Za-z0-9_-]` gives `cellNN`), with `-2`, `-3`...
    for a cell's later charts, so a figure keeps its file when cells are added or moved above it."""
    found = []
    for number, cell in enumerate(node.cells):
        counters = {"png": 0, "svg": 0}
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            for mime, ext in FIGURE_MIMES.items():
                if mime in data:
                    counters[ext] += 1
                    cell_id = str(cell.get("id") or "")
                    name = (cell_id if CELL_ID.fullmatch(cell_id) else f"cell{number:02d}") + (
                        f"-{counters[ext]}" if counters[ext] > 1 else ""
                    )
                    payload = data[mime]
                    found.append((name, ext, base64.b64decode(payload) if ext == "png" else "".join(payload)))
    return found


def write_figures(node: nbformat.NotebookNode, stem: str, out_dir: Path) -> list[str]:
    """Each chart as figures/<stem>-<cell id>[-K].png / .svg (`images`); returns the paths relative to `out_dir`."""
    folder = out_dir / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(f"{stem}-*"):
        stale.unlink()
    written = []
    for name, ext, payload in images(node):
        path = folder / f"{stem}-{name}.{ext}"
        data = payload if isinstance(payload, bytes) else payload.encode("utf-8")
        write_atomic(path, lambda handle, data=data: handle.write(data))
        written.append(str(path.relative_to(out_dir)))
    return written


def write_thumbnail(node: nbformat.NotebookNode, stem: str, out_dir: Path) -> str | None:
    """The notebook's first PNG chart, shrunk to `THUMB_WIDTH`, as thumbs/<stem>.png."""
    from PIL import Image

    first = next((payload for _, ext, payload in images(node) if ext == "png"), None)
    if first is None:
        return None
    image = Image.open(io.BytesIO(first))
    image.thumbnail((THUMB_WIDTH, THUMB_WIDTH * 3))
    path = out_dir / "thumbs" / f"{stem}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda handle: image.save(handle, format="PNG", optimize=True))
    return str(path.relative_to(out_dir))


def without_svg(node: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy whose outputs keep PNG only where both were drawn: the pages stay light, figures/ keeps the SVG."""
    copy = nbformat.from_dict(node)
    for cell in copy.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/svg+xml" in data and "image/png" in data:
                del data["image/svg+xml"]
    return copy


# nbconvert's lab page without what it fetches from CDNs (require.js, MathJax, mermaid, the widget
# manager): a report opens on an offline GPU box, and its pages have no math, diagrams or live widgets.
_OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{% block html_head_js %}{% endblock html_head_js %}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
{% block html_head_js_mathjax %}{% endblock html_head_js_mathjax %}
{% block html_head_js_mermaidjs %}{% endblock html_head_js_mermaidjs %}
"""


def page_exporter(with_code: bool) -> HTMLExporter:
    """The exporter of a notebook's page: the reader's page without code and prompts, or the page with code;
    either one loads nothing from the network (`_OFFLINE_TEMPLATE`)."""
    loader = jinja2.DictLoader({"dsa_lab_offline.html.j2": _OFFLINE_TEMPLATE})
    hide = {} if with_code else {"exclude_input": True, "exclude_input_prompt": True, "exclude_output_prompt": True}
    return HTMLExporter(extra_loaders=[loader], template_file="dsa_lab_offline.html.j2", **hide)


def headline_html(findings: Findings) -> str:
    """The findings' table as HTML, the fastest option of each next_n in bold."""
    if findings.table is None:
        return ""
    rows = []
    for row in findings.table.itertuples():
        pieces = f" {pieces_title(row.best_pieces)}" if row.best_pieces else ""
        mark = " class='win'" if row.beyond_spread else ""
        rows.append(
            f"<tr><td>{row.next_n}</td><td>{html_text(row.vllm_strategy)} ({html_text(row.vllm_backend)})</td>"
            f"<td>{row.vllm_us:.0f}</td><td{mark}><b>{html_text(row.best_strategy)}{html_text(pieces)}</b> "
            f"({html_text(row.best_backend)})</td><td>{row.best_us:.0f}</td>"
            f"<td{mark}>{row.speedup:.2f}×</td></tr>"
        )
    head = (
        "<tr><th>next_n</th><th>vLLM 0.33 takes</th><th>µs</th><th>fastest measured</th><th>µs</th>"
        "<th>speedup over vLLM</th></tr>"
    )
    caption = render_markdown(findings.markdown.splitlines()[0]).strip().removeprefix("<p>").removesuffix("</p>")
    return f"<table class='headline'><caption>{caption}</caption>{head}{''.join(rows)}</table>"


def page_context(findings: Findings, answers: Answers | None = None) -> dict[str, Any]:
    """What the index template needs of the findings."""
    return {
        "headline_table": headline_html(findings),
        "headline_reading": findings.reading_html,
        "answers_html": answers.html if answers is not None else "",
        "whole_step_html": answers.whole_html if answers is not None else "",
    }
