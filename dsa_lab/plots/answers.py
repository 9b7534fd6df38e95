"""The one answer as a page shows it: a grid of workloads (rows) by next_n (columns), each cell the option to use
there, coloured by its kernel (the backend's declared colour: the colour key) and patterned by its strategy (plain
native, stripes atom, dots flatten), with its speedup over vLLM 0.33's choice as the only text.

An HTML table, not a figure: its text is the page's (13 px), readable at any width, and the same grid serves the
notebooks and the report's index. Drawing only: the rows come from `dsa_lab.analysis.answers.grid`. Everything
from a run (workload names, run ids, devices) is escaped. The grid is drawn only for GPU runs: a CPU run never
times vLLM's route, so it has no answer to draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from matplotlib.colors import to_hex, to_rgb

from dsa_lab.markup import html_text
from dsa_lab.plots.style import STRATEGY_ORDER, VLLM_RELEASE, backend_color

PATTERNS = {  # a strategy's pattern over its kernel's colour
    "native": "",
    "atom": "background-image:repeating-linear-gradient(135deg,rgba(255,255,255,.7) 0 2px,transparent 2px 7px);",
    "flatten": "background-image:radial-gradient(rgba(0,0,0,.45) 1px,transparent 1.5px);background-size:5px 5px;",
}
PATTERN_WORDS = {"native": "plain", "atom": "stripes", "flatten": "dots"}
MARKS = "¹²³⁴⁵⁶⁷⁸⁹"  # a row's run, when a grid draws several
CELL = "padding:.25em .55em;border:1px solid #fff;text-align:right;font-variant-numeric:tabular-nums;"


def kernel_colour(backend: str) -> str:
    """The backend's declared colour, lightened halfway to white so that black text stays readable on it."""
    red, green, blue = to_rgb(backend_color(backend))
    return to_hex(((red + 1) / 2, (green + 1) / 2, (blue + 1) / 2))


def option_css(strategy: str, backend: str) -> str:
    return f"background-color:{kernel_colour(backend)};{PATTERNS.get(strategy, '')}"


def _swatch(strategy: str, backend: str) -> str:
    return (
        f"<span style='display:inline-block;width:2.2em;height:1.1em;vertical-align:middle;border:1px solid #999;"
        f"{option_css(strategy, backend)}'></span>"
    )


@dataclass
class AnswerGrid:
    """`analysis.answers.grid` rows as the page shows them; `by_batch`: a row per workload and batch (else one
    batch, named in `title`)."""

    rows: pd.DataFrame
    title: str
    by_batch: bool = False

    def _row_key(self, row: pd.Series) -> tuple:
        return (row["workload"], int(row["batch"])) if self.by_batch else (row["workload"],)

    def to_html(self) -> str:
        if self.rows.empty:
            return f"<p><b>{html_text(self.title)}</b>: no point answered (no run timed vLLM's route).</p>"
        runs = list(dict.fromkeys(self.rows["run_id"]))
        marks = {run: MARKS[i] if len(runs) > 1 and i < len(MARKS) else "" for i, run in enumerate(runs)}
        next_ns = sorted(self.rows["next_n"].astype(int).unique())
        head = "".join(f"<th style='{CELL}text-align:center'>{n}</th>" for n in next_ns)
        body = []
        for key, part in self.rows.groupby([*(["workload", "batch"] if self.by_batch else ["workload"])], sort=False):
            cells = part.set_index(part["next_n"].astype(int))
            label = html_text(key[0] if isinstance(key, tuple) else key)
            if self.by_batch:
                label += f", B = {int(key[1])}"
            mark = "".join(marks[r] for r in dict.fromkeys(part["run_id"]))
            tds = "".join(
                self._cell(cells.loc[n]) if n in cells.index else f"<td style='{CELL}'></td>" for n in next_ns
            )
            body.append(f"<tr><th style='{CELL}text-align:left;font-weight:normal'>{label}{mark}</th>{tds}</tr>")
        return (
            f"<div class='dsa-answer-grid'><p style='margin:.4em 0'><b>{html_text(self.title)}</b></p>"
            f"<table style='border-collapse:collapse;font-size:13px;margin:.2em 0'>"
            f"<tr><th style='{CELL}text-align:left'>workload \\ next_n</th>{head}</tr>{''.join(body)}</table>"
            f"{self._legend()}{self._runs(runs, marks)}</div>"
        )

    _repr_html_ = to_html

    def _cell(self, row: pd.Series) -> str:
        """One cell: its option's colour and pattern, its speedup; nothing from the run in its markup."""
        strategy, backend = str(row["recommended_strategy"]), str(row["recommended_backend"])
        return f"<td style='{CELL}{option_css(strategy, backend)}'>{row['gain']:.2f}×</td>"

    def _legend(self) -> str:
        used = self.rows[["recommended_strategy", "recommended_backend"]].drop_duplicates()
        used = used.sort_values(
            ["recommended_backend", "recommended_strategy"],
            key=lambda s: s.map(STRATEGY_ORDER.index) if s.name == "recommended_strategy" else s,
        )
        keys = " ".join(
            f"<span style='margin-right:1em;white-space:nowrap'>{_swatch(s, b)} {html_text(b)} {html_text(s)}</span>"
            for s, b in used.itertuples(index=False)
        )
        patterns = ", ".join(f"{PATTERN_WORDS[s]}: {s}" for s in STRATEGY_ORDER)
        return (
            f"<p style='margin:.3em 0;font-size:13px'>{keys}</p><p class='meta' style='margin:.2em 0;font-size:13px'>"
            f"Colour: the kernel to use; pattern: its strategy ({patterns}). Text: {VLLM_RELEASE}'s time over the "
            "option's (1.00×: vLLM's own choice is kept, the fastest or tied with it within the measured spread).</p>"
        )

    def _runs(self, runs: list[str], marks: dict[str, str]) -> str:
        devices = self.rows.drop_duplicates("run_id").set_index("run_id")["device"]
        named = "; ".join(f"{marks[r]}run <code>{html_text(r)}</code> on {html_text(devices[r])}" for r in runs)
        return f"<p class='meta' style='margin:.2em 0;font-size:13px'>Measured: {named}.</p>"
