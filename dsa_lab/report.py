"""Execute the notebooks with papermill into `reports/` (ipynb + HTML) and index them.

Each `notebooks/NN_*.ipynb` runs in order on whatever device is present (passed to it
as the papermill parameter `device`). A failing notebook is recorded with its cell and
error and the rest still run, so one broken chart never hides the others. Notebooks
announce the data they used with `show_provenance`; the index lists it beside each one.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
import nbformat
import papermill
from nbconvert import HTMLExporter
from papermill.exceptions import PapermillExecutionError
from tqdm import tqdm

from dsa_lab.store import git_state

PAPERMILL_BANNER_TAG = "papermill-error-cell-tag"
PROVENANCE_MIME = "application/vnd.dsa-lab.provenance+json"
FALLBACK_MIME = "application/vnd.dsa-lab.fallback+json"
NOTEBOOK_PATTERN = re.compile(r"^(\d\d)_.+\.ipynb$")
DEFAULT_NOTEBOOKS = Path("notebooks")
DEFAULT_OUT = Path("reports")


def show_provenance(provenance: Mapping[str, Any], label: str) -> None:
    """Display, inside a notebook, which run a chart came from; `build_report` collects it."""
    from IPython.display import display

    record = {"label": label, **{k: v if _is_plain(v) else json.dumps(v, default=str) for k, v in provenance.items()}}
    summary = ", ".join(f"{k}={v}" for k, v in record.items() if k != "label")
    display(
        {PROVENANCE_MIME: record, "text/plain": f"data used ({label}): {summary}"},
        raw=True,
    )


def show_fallback(missing: str, shown_instead: str) -> None:
    """A banner saying that the notebook shows stand-in data; `build_report` flags it in the index.

    Falling back is never silent: a reader sees what was missing, what is shown instead,
    and the command that makes the real data.
    """
    from html import escape

    from IPython.display import display

    html = (
        '<div class="dsa-lab-fallback" style="border-left:6px solid #d4a72c;background:#fff8c5;'
        'padding:.6em 1em;margin:.4em 0;color:#3b2300">'
        f"<b>Not the measured data: {escape(shown_instead)}.</b><br>{escape(missing)}</div>"
    )
    display(
        {FALLBACK_MIME: {"missing": missing, "shown_instead": shown_instead}, "text/html": html,
         "text/plain": f"NOT THE MEASURED DATA: {shown_instead}. {missing}"},
        raw=True,
    )  # fmt: skip


def _is_plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None


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
    provenance: list[dict[str, Any]] = field(default_factory=list)
    fallbacks: list[dict[str, Any]] = field(default_factory=list)  # what it showed instead of measured data


@dataclass
class ReportResult:
    out_dir: Path
    parameters: dict[str, Any]
    outcomes: list[NotebookOutcome]
    code: dict[str, Any] = field(default_factory=dict)  # git state of the dsa_lab that ran them

    @property
    def failed(self) -> list[NotebookOutcome]:
        return [o for o in self.outcomes if o.status != "ok"]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


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
        wanted = {f"{int(x):02d}" if x.isdigit() else x for x in only}
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
    params = {"interactive": False, **(parameters or {}), "device": device or default_device()}
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(cwd) if cwd is not None else notebooks_dir.resolve().parent
    outcomes = []
    bar = tqdm(notebooks, desc="notebooks", unit="nb", file=sys.stderr)
    for path in bar:
        bar.set_postfix_str(path.name)
        outcomes.append(_run_one(path, out_dir, params, workdir, execution_timeout))
    result = ReportResult(out_dir, params, outcomes, git_state())
    _write_index(result)
    return result


def _run_one(
    path: Path, out_dir: Path, params: dict[str, Any], workdir: Path, execution_timeout: int | None
) -> NotebookOutcome:
    executed = out_dir / path.name
    for stale in (executed, executed.with_suffix(".html")):  # never report a previous run's output
        stale.unlink(missing_ok=True)
    start = time.perf_counter()
    outcome = NotebookOutcome(name=path.stem, status="ok", seconds=0.0)
    try:
        papermill.execute_notebook(
            str(path),
            str(executed),
            parameters=params,
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
    if executed.exists():
        outcome.executed = executed.name
        node = nbformat.read(executed, as_version=4)
        outcome.provenance = _collect(node, PROVENANCE_MIME)
        outcome.fallbacks = _collect(node, FALLBACK_MIME)
        if outcome.status != "ok":
            outcome.failed_cell = _failing_source_cell(node)
        html = executed.with_suffix(".html")
        body, _ = HTMLExporter().from_notebook_node(node)
        html.write_text(body, encoding="utf-8")
        outcome.html = html.name
    if outcome.status != "ok":
        where = (
            f" in cell {outcome.failed_cell} (In [{outcome.failed_exec_count}]: {outcome.failed_source!r})"
            if outcome.failed_cell is not None
            else ""
        )
        tqdm.write(f"FAILED {path.name}{where}: {outcome.error}", file=sys.stderr)
    return outcome


def _failing_source_cell(node: nbformat.NotebookNode) -> int | None:
    """Index, in the notebook as written, of the cell whose output is an error.

    Papermill adds an injected-parameters cell and an error banner; neither is counted.
    """
    index = 0
    for cell in node.cells:
        if {"injected-parameters", PAPERMILL_BANNER_TAG} & set(cell.metadata.get("tags", [])):
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
body { font-family: system-ui, sans-serif; margin: 2em; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: .3em .6em; vertical-align: top; }
.ok { color: #1a7f37; font-weight: bold; } .failed { color: #cf222e; font-weight: bold; }
code { font-size: 90%; } pre { white-space: pre-wrap; margin: 0; }
.fallback { background: #fff8c5; border-left: 4px solid #d4a72c; padding: .2em .4em; }
</style></head><body>
<h1>dsa_lab report</h1>
<p>Generated {{ generated }} &middot; parameters:
{% for k, v in parameters.items() %}<code>{{ k }}={{ v }}</code> {% endfor %}
&middot; {{ outcomes|length - failed }} ok, {{ failed }} failed<br>
code: git <code>{{ code.sha or "unknown" }}</code>{% if code.dirty %} (uncommitted changes){% endif %},
package sources sha256 <code>{{ (code.tree_sha256 or "")[:16] }}</code></p>
<table>
<tr><th>notebook</th><th>status</th><th>seconds</th><th>data</th><th>error</th><th>data used</th></tr>
{% for o in outcomes %}
<tr>
<td>{% if o.html %}<a href="{{ o.html }}">{{ o.name }}</a> (<a href="{{ o.executed }}">ipynb</a>){% else %}{{ o.name }}{% endif %}</td>
<td class="{{ o.status }}">{{ o.status }}</td>
<td>{{ o.seconds }}</td>
<td>{% for f in o.fallbacks %}<div class="fallback"><b>stand-in: {{ f.shown_instead }}</b><br>{{ f.missing }}</div>{% else %}{% if o.status == "ok" %}as intended{% endif %}{% endfor %}</td>
<td>{% if o.error %}{% if o.failed_cell is not none %}cell {{ o.failed_cell }} (In [{{ o.failed_exec_count }}]): <code>{{ o.failed_source }}</code><br>{% endif %}<pre>{{ o.error }}</pre>{% endif %}</td>
<td>{% for p in o.provenance %}<b>{{ p.label }}</b>:
{% for k, v in p.items() if k != 'label' %}<code>{{ k }}={{ v }}</code> {% endfor %}<br>{% else %}&mdash;{% endfor %}</td>
</tr>
{% endfor %}
</table></body></html>
"""


def _write_index(result: ReportResult) -> None:
    env = jinja2.Environment(autoescape=True)
    page = env.from_string(_INDEX_TEMPLATE).render(
        generated=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        parameters=result.parameters,
        outcomes=result.outcomes,
        failed=len(result.failed),
        code=result.code,
    )
    (result.out_dir / "index.html").write_text(page, encoding="utf-8")
    summary = {"parameters": result.parameters, "code": result.code, "notebooks": [asdict(o) for o in result.outcomes]}
    (result.out_dir / "report.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")


def parse_parameter(text: str) -> tuple[str, Any]:
    """`key=value` with value read as a Python literal when it is one (3, True, 'x'), else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip().isidentifier():
        raise ValueError(f"parameter {text!r}: expected key=value with key a Python identifier")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return key.strip(), value


def _cli(args: argparse.Namespace) -> int:
    params = dict(parse_parameter(p) for p in args.parameter)
    device = params.pop("device", None)
    result = build_report(args.notebooks, args.out, params, device=device, only=args.only)
    for o in result.outcomes:
        print(f"{o.status:>6}  {o.name}  {o.seconds:.1f}s" + (f"  {o.error}" if o.error else ""))
    print(f"index: {result.out_dir / 'index.html'}")
    return result.exit_code


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report",
        help="execute the notebooks (papermill) into an HTML report",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--notebooks", type=Path, default=DEFAULT_NOTEBOOKS, help="folder of NN_*.ipynb")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report folder (default: reports/)")
    parser.add_argument("--only", action="append", default=[], metavar="NN", help="run only notebook NN (repeatable)")
    parser.add_argument(
        "-p", "--parameter", action="append", default=[], metavar="KEY=VALUE",
        help="papermill parameter for every notebook (repeatable), e.g. -p run_fresh=True",
    )
    parser.set_defaults(func=_cli)
