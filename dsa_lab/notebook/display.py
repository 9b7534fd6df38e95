"""What a notebook displays about its data: which run a chart came from, and a banner when it is not
the measured data. `dsa-lab report` collects both from the executed notebooks (`PROVENANCE_MIME`,
`FALLBACK_MIME`) and lists them on the index; nothing here decides which run to show
(`dsa_lab.notebook.runs` and `notebook.sections` do). Everything a run says (ids, device names, paths, problems) is shown as
text: escaped for Markdown or HTML (`dsa_lab.markup`), never live markup. Beside them, what each
notebook would otherwise write again: its setup (`setup_notebook`), a cell's note (`note`), a section's
run (`announce_section`), a second run's provenance (`show_run`) and the words of an SM100 section
(`show_sm100`)."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Mapping
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from IPython.display import Markdown, display

from dsa_lab.env_info import LIBRARY_KEYS
from dsa_lab.markup import md_code, md_text
from dsa_lab.notebook.runs import ChosenProfile, ChosenRun, relative_to_data
from dsa_lab.store import folders as store

if TYPE_CHECKING:
    from dsa_lab.notebook.answers import Answer
    from dsa_lab.notebook.sm100 import Sm100Frame

PROVENANCE_MIME = "application/vnd.dsa-lab.provenance+json"
FALLBACK_MIME = "application/vnd.dsa-lab.fallback+json"


def setup_notebook(
    style: str = "whitegrid", ignore: tuple[type[Warning], ...] = (), display_width: int | None = None
) -> Callable[[], float]:
    """The first lines every notebook would write: inline charts, seaborn's theme (`style`), no widget
    progress bars in executed notebooks (tqdm's warning), the warnings in `ignore` silenced, pandas'
    `display_width` when given. Returns the seconds since this call, for a notebook's closing time."""
    import seaborn as sns
    from IPython import get_ipython
    from tqdm import TqdmWarning

    shell = get_ipython()
    if shell is not None:
        shell.run_line_magic("matplotlib", "inline")
    for category in (TqdmWarning, *ignore):
        warnings.filterwarnings("ignore", category=category)
    sns.set_theme(style=style, context="notebook")
    if display_width is not None:
        pd.set_option("display.width", display_width, "display.max_columns", 20)
    started = time.perf_counter()
    return lambda: time.perf_counter() - started


def note(*texts: str | None) -> None:
    """The "note" of a cell: each text given (Markdown the library wrote, outside words already escaped),
    empty ones left out."""
    for text in texts:
        if text:
            display(Markdown(text))


def _is_plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None


# What the one line of a run's provenance says, in this order; everything else is folded under it.
_LINE_KEYS = ("run_id", "source", "device_name", "created", "points", "git_sha")


def provenance_html(record: Mapping[str, Any]) -> str:
    """One readable line (label, run, source, device, day, points, commit) with every field folded under it,
    each value shown as text."""
    shown = [k for k in _LINE_KEYS if record.get(k) not in (None, "")] or [k for k in record if k != "label"][:2]
    short = {
        "created": lambda v: str(v)[:10],
        "git_sha": lambda v: f"git {str(v)[:10]}",
        "points": lambda v: f"{v} points",
    }
    parts = [short.get(k, str)(record[k]) for k in shown]
    line = f"Data: {record['label']} · " + " · ".join(parts)
    rows = "".join(
        f"<tr><th>{escape(str(k))}</th><td><code>{escape(str(v))}</code></td></tr>"
        for k, v in record.items()
        if k != "label"
    )
    return (
        '<details class="dsa-lab-provenance" style="color:#57606a;font-size:90%;margin:.3em 0">'
        f"<summary>{escape(line)}</summary><table>{rows}</table></details>"
    )


def show_provenance(provenance: Mapping[str, Any], label: str) -> None:
    """Display, inside a notebook, which run a chart came from (`provenance_html`); `dsa-lab report` collects it."""
    record = {"label": label, **{k: v if _is_plain(v) else json.dumps(v, default=str) for k, v in provenance.items()}}
    summary = ", ".join(f"{k}={v}" for k, v in record.items() if k != "label")
    plain = f"data used ({label}): {summary}"
    display({PROVENANCE_MIME: record, "text/html": provenance_html(record), "text/plain": plain}, raw=True)


def show_fallback(missing: str, shown_instead: str) -> None:
    """A banner saying that the notebook shows stand-in data; `dsa-lab report` flags it on the index.

    Falling back is never silent: a reader sees what was missing, what is shown instead,
    and the command that makes the real data.
    """
    html = (
        '<div class="dsa-lab-fallback" style="border-left:6px solid #d4a72c;background:#fff8c5;'
        'padding:.6em 1em;margin:.4em 0;color:#3b2300">'
        f"<b>Not the measured data: {escape(shown_instead)}.</b><br>{escape(missing)}</div>"
    )
    record = {"missing": missing, "shown_instead": shown_instead}
    plain = f"NOT THE MEASURED DATA: {shown_instead}. {missing}"
    display({FALLBACK_MIME: record, "text/html": html, "text/plain": plain}, raw=True)


def _libraries(environment: Mapping[str, Any]) -> dict[str, Any]:
    return {key: environment.get(key) for key in LIBRARY_KEYS if environment.get(key)}


def announce(chosen: ChosenRun, label: str) -> None:
    """Say in the notebook which run it shows: a banner when it is a stand-in, the runs passed over, and its
    provenance in one line (`provenance_html`)."""
    if chosen.missing:  # a stand-in made now, or another run than the one asked for
        where = f"run {relative_to_data(chosen.run.path)} on {chosen.device_label}"
        show_fallback(chosen.missing, where if chosen.measured else f"{chosen.device_label} and roofline-modeled times")
    show_ignored(chosen.ignored)
    provenance = chosen.run.provenance
    record = {
        "run_id": provenance["run_id"],
        "path": relative_to_data(chosen.run.path),
        "source": chosen.run.source,
        "device_name": chosen.device_label,
        "created": provenance["created"],
        "timing_method": provenance["timing_method"],
        "points": len(chosen.run.results),
        "git_sha": provenance["git"].get("sha"),
        **_libraries(provenance.get("environment") or {}),
    }
    show_provenance(record, label if chosen.measured else f"{label}: {chosen.device_label}")


def announce_section(chosen: ChosenRun | None, why: str | None, label: str) -> None:
    """A section's run as `notebook.sections.Section.run` gives it: why it is not the run asked for (as text),
    then `announce` when there is a run (whose banner says it instead, when the why is the run's own)."""
    if why and (chosen is None or why != chosen.missing):
        display(Markdown(f"*{md_text(why)}*"))
    if chosen is not None:
        announce(chosen, label)


def show_run(run: store.Run, label: str) -> None:
    """`show_provenance` for a second run a chart reads beside the announced one (its id, source, date, commit)."""
    provenance = run.provenance
    record = {
        "run_id": provenance["run_id"],
        "path": relative_to_data(run.path),
        "source": run.source,
        "created": provenance["created"],
        "git_sha": provenance["git"].get("sha"),
    }
    show_provenance(record, label)


def show_answer(found: Answer, label: str = "answer run") -> None:
    """Which runs an answer read (`notebook.answers.answer`): each one's provenance line (`show_run`, collected by
    the report as the runs a card used), and the runs it passed over, with why."""
    for run_id in found.run_ids(found.table):
        show_run(found.runs[run_id], label)
    show_ignored(found.ignored)


def show_ignored(ignored: list[tuple[str, str]], what: str = "run") -> None:
    """The runs a search passed over, each with why, in one line: `*Passed over (run): <path>: <why>; ...*`, every
    path and reason shown as text."""
    if ignored:
        runs = "; ".join(f"{md_code(path)}: {md_text(problem)}" for path, problem in ignored)
        display(Markdown(f"*Passed over ({what}{'s' if len(ignored) > 1 else ''}): {runs}.*"))


def announce_profile(chosen: ChosenProfile) -> None:
    """Notebook 04's counterpart of `announce`: banner, profile runs passed over, provenance."""
    if chosen.missing:
        show_fallback(chosen.missing, "a CPU reference profile")
    show_ignored(chosen.ignored, "profile run")
    provenance = chosen.run.provenance
    folder: Path | None = chosen.run.folder
    record = {
        "run_id": provenance.get("run_id"),
        "source": provenance.get("source"),
        "path": relative_to_data(folder) if folder else "in memory",
        "device_name": provenance.get("device_name"),
        "created": provenance.get("created"),
        "git_sha": (provenance.get("git") or {}).get("sha"),
        **_libraries(provenance.get("environment") or {}),
    }
    show_provenance(record, "kernel profiles")


def show_sm100(sm100: Sm100Frame, label: str) -> None:
    """The words of every SM100 section, written once: whether its rows are measured or modeled (and how
    to make a run), the SM100 runs passed over, and the measured run's banner and provenance."""
    note(sm100.note)
    show_ignored(sm100.ignored)
    if sm100.measured and sm100.chosen is not None:
        announce(sm100.chosen, label)
