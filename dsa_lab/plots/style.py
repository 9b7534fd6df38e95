"""One look for every chart: what a colour, a marker, a line style and a footer mean.

- **strategy ↔ colour**: native blue, atom green, flatten red, in every notebook.
- **backend ↔ marker**: each backend declares its own (`LogitsBackend.marker`: DeepGEMM a circle,
  our Triton kernel a square, the reference a triangle, Gluon a plus, PR #340 a hexagon); none is the
  modeled glyph, vLLM's diamond or the unknown backend's triangle (the contract test holds that).
- **the answer grids** (`plots.answers`): a cell is an option to use, so its colour is its kernel's
  (`LogitsBackend.color`, the colour key) and its pattern its strategy; every chart of times keeps
  strategy = colour and backend = marker, however many backends it draws (a chart of four native lines
  tells them apart by marker).
- **phases** (notebooks 04 and 05, `PHASE_COLORS`, `COMPONENT_COLORS`): the part of a step a bar is, in
  colours no strategy uses (no blue, green or red).
- **measured ↔ solid, modeled ↔ dashed or hatched**: measured lines are solid with filled
  markers; modeled ones (roofline times, never timed) are dashed with hollow X markers,
  modeled bars hatched, and their labels say 'modeled'.
- **better or worse than vLLM's choice ↔ one diverging palette, one ratio direction**: every
  ratio is a speedup (the other time / this time: > 1 faster), every shaded speedup is
  `SPEEDUP_CMAP` centred at 1 (blue faster, red slower, white the same: `speedup_norm`,
  `shade_speedups`), in heatmaps, tables and the report's index (`BETTER_BACKGROUND`). Modeled
  speedups keep a palette of their own (`MODELED_CMAP`): they never share a scale with measured ones.
- **vLLM's choice**: a hollow black diamond (the point's own colour shows through); the best
  option measured: a black ring.
- **provenance**: every chart of measured data carries a footer naming the GPU, the run, the
  date, the git sha and the library versions (`provenance_line`, drawn by `add_footer`).

Legends sit outside the axes (`legend_outside`). Releases are named by version
(`dsa_lab.policy.vllm.RELEASES`), never by pull request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import TwoSlopeNorm, to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from pandas.io.formats.style import Styler

from dsa_lab import axes
from dsa_lab.env_info import version_line
from dsa_lab.kernels import backend_names, family_of, get_backend, vllm_backend
from dsa_lab.policy.vllm import RELEASES

MAX_WIDTH = 12.0  # inches: a report page shows a figure this wide unscaled (1,200 px), so 9 pt text stays >= 9 px
ANNOTATION_SIZE = 9  # pt: a heatmap cell's number, at least 9 px on a report page
STRATEGY_ORDER = ("native", "atom", "flatten")
STRATEGY_COLORS = {"native": "#1f77b4", "atom": "#2ca02c", "flatten": "#d62728"}
SPEEDUP_CMAP = "RdBu"  # the one diverging palette: blue faster than vLLM's choice (speedup > 1), red slower
BETTER_BACKGROUND = "#d1e5f0"  # the palette's light blue: a table cell that beats vLLM's choice
MODELED_CMAP = "Purples"  # modeled speedups: a scale of their own
# Parts of a step (04's profiled phases, 05's decode-step components): colours no strategy uses, so a bar's part is
# never read as native, atom or flatten.
PART_PALETTE = ("#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#e6ab02", "#c5b0d5")
MEASURED_LINESTYLE = "-"
MODELED_LINESTYLE = "--"
MODELED_MARKER = "X"
MODELED_HATCH = "//"
MODELED_COLOR = "0.45"  # modeled rows that are not one strategy of ours (floors, other GPUs)
MODELED = "modeled"  # the word every modeled label carries
OTHER_COLOR = "#7f7f7f"
VLLM_RELEASE = RELEASES["vllm_0_33_0"][0]  # 'vLLM 0.33.0': what readers call the release we model
VLLM_MARKER = {"marker": "D", "color": "black", "facecolors": "none", "s": 90, "linewidths": 1.8, "zorder": 5}
BEST_MARKER = {"marker": "o", "s": 240, "facecolors": "none", "edgecolors": "black", "linewidths": 1.4, "zorder": 4}
FOOTER_STYLE = {"fontsize": 7, "color": "0.35"}
FOOTER_GID = "provenance-footer"
UNKNOWN_MARKER = "v"  # a backend name no registered backend has (a modeled row's, an older run's)


def point_columns(table: pd.DataFrame) -> list[str]:
    """The point's columns a table for people shows: batch, context, next_n, and a shape axis only when
    it varies (a table shows one shape at a time, `analysis.frames.one_shape`)."""
    step = [k for k in axes.STEP_KEYS if k in table]
    return [*step, *(k for k in axes.SHAPE_KEYS if k in table and table[k].nunique() > 1)]


def sources_label(frame: pd.DataFrame) -> str:
    """'measured', 'modeled' or 'measured + modeled': what a chart of `frame` shows."""
    return " + ".join(s for s in ("measured", "modeled") if s in set(frame["source"]))


def strategy_color(strategy: str) -> str:
    return STRATEGY_COLORS.get(strategy, OTHER_COLOR)


def option_color(strategy: str, backend: str) -> str:
    """A bar's colour where a chart has no markers to tell backends apart: the strategy's colour for vLLM's own
    library (whose options differ by strategy), the backend's declared colour for any other kernel."""
    return strategy_color(strategy) if backend in family_of(vllm_backend().name) else backend_color(backend)


def backend_marker(backend: str) -> str:
    """The marker the backend declares (`LogitsBackend.marker`)."""
    return get_backend(backend).marker if backend in backend_names() else UNKNOWN_MARKER


def backend_color(backend: str) -> str:
    """The colour the backend declares (`LogitsBackend.color`)."""
    return get_backend(backend).color if backend in backend_names() else OTHER_COLOR


def series_style(strategy: str, backend: str, modeled: bool = False) -> dict[str, object]:
    """matplotlib keyword arguments for the line of one (strategy, backend) series: the strategy's colour and the
    backend's marker, solid. Modeled: dashed, hollow X marker (say 'modeled' in its label)."""
    if modeled:
        return {
            "color": strategy_color(strategy),
            "marker": MODELED_MARKER,
            "linestyle": MODELED_LINESTYLE,
            "markerfacecolor": "none",
        }
    return {"color": strategy_color(strategy), "marker": backend_marker(backend), "linestyle": MEASURED_LINESTYLE}


def speedup_span(values: Any) -> float:
    """How far from 1 a speedup scale reaches (≥ 1.25), the same factor either way: 2 means 0.5× … 2×."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite) & (finite > 0)]
    return max(1.25, float(np.exp(np.abs(np.log(finite)).max()))) if finite.size else 1.25


def speedup_norm(values: Any) -> TwoSlopeNorm:
    """The colour scale of a speedup heatmap: centred at 1 (white), as far either way in ratio."""
    span = speedup_span(values)
    return TwoSlopeNorm(vcenter=1.0, vmin=1 / span, vmax=span)


def shade_speedups(styler: Styler, columns: list[str]) -> Styler:
    """A table's speedup columns shaded as the heatmaps are (`SPEEDUP_CMAP` on `speedup_norm`, one scale for
    all of them): blue faster than what it is held to, red slower, white the same; an empty cell unshaded."""
    norm = speedup_norm(styler.data[columns].to_numpy(dtype=float))
    cmap = colormaps[SPEEDUP_CMAP]

    def css(value: Any) -> str:
        if not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
            return ""
        red, green, blue, _ = cmap(norm(value))
        text = "#f1f1f1" if 0.2126 * red + 0.7152 * green + 0.0722 * blue < 0.45 else "#1f2328"
        return f"background-color: {to_hex((red, green, blue))}; color: {text}"

    return styler.map(css, subset=columns)


def series_label(strategy: str, backend: str, source: str = "measured") -> str:
    """'native (deepgemm)'; modeled rows: 'native (H200 roofline), modeled'."""
    if source == "modeled":
        return f"{strategy} ({backend.removeprefix('model (').removesuffix(')')} roofline), {MODELED}"
    return f"{strategy} ({backend})"


def style_handles(strategies: Iterable[str], backends: Iterable[str]) -> tuple[list[Line2D], list[str]]:
    """Legend entries that explain the code once: a colour per strategy, a marker per backend."""
    handles: list[Line2D] = []
    labels: list[str] = []
    for strategy in strategies:
        handles.append(Line2D([], [], color=strategy_color(strategy), linewidth=3))
        labels.append(strategy)
    for backend in backends:
        handles.append(Line2D([], [], color="0.3", marker=backend_marker(backend), linestyle="none"))
        labels.append(backend)
    return handles, labels


def modeled_handle(color: str = MODELED_COLOR) -> Line2D:
    """A legend entry for a modeled line (dashed, hollow X)."""
    return Line2D([], [], color=color, linestyle=MODELED_LINESTYLE, marker=MODELED_MARKER, markerfacecolor="none")


def legend_outside(
    target: Axes | Figure,
    handles: list[Any] | None = None,
    labels: list[str] | None = None,
    where: str = "right",
    **kwargs: Any,
) -> None:
    """A legend beside (`where='right'`) or under (`'below'`) the axes or figure, never over the data."""
    if handles is None:
        handles, labels = (target.axes[0] if isinstance(target, Figure) else target).get_legend_handles_labels()
    if where == "right":
        place = (
            {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}
            if isinstance(target, Axes)
            else {"loc": "outside right center"}
        )
    else:
        place = (
            {"loc": "upper center", "bbox_to_anchor": (0.5, -0.14)}
            if isinstance(target, Axes)
            else {"loc": "outside lower center"}
        )
    target.legend(handles, labels, frameon=False, **{"fontsize": 8, **place, **kwargs})


def chart_text(value: Any) -> str:
    """Text from a run as matplotlib shows it literally: a '$' would start mathtext (and a stray one fails the
    figure), so each is escaped."""
    return str(value).replace("$", r"\$")


def provenance_line(provenance: Mapping[str, Any]) -> str:
    """'measured on NVIDIA H200 | run h200-full-… | 2026-11-29 | git 1a2b3c4 | torch 2.11.0, triton 3.6.0, …'."""
    git = provenance.get("git") or {}
    sha = (git.get("sha") or provenance.get("git_sha") or "")[:7]
    versions = version_line(provenance.get("environment") or {})
    parts = [
        f"{provenance.get('source', 'measured')} on {provenance.get('device_name', provenance.get('device', '?'))}",
        f"run {provenance.get('run_id', '?')}",
        str(provenance.get("created", ""))[:10],
        f"git {sha}{'+dirty' if git.get('dirty') else ''}" if sha else "",
        versions,
    ]
    return chart_text(" | ".join(p for p in parts if p))


def add_footer(fig: Figure, line: str | None) -> Figure:
    """The provenance line under everything the figure holds (legends below the axes included),
    left-aligned; nothing when `line` is empty. Inline and report figures are saved with a
    tight box, which takes the line in."""
    if line:
        fig.draw_without_rendering()  # run the layout, so that the box below is final
        box = fig.get_tightbbox()
        x = box.x0 / fig.get_figwidth()
        y = box.y0 / fig.get_figheight() - 0.005
        fig.text(x, y, line, ha="left", va="top", gid=FOOTER_GID, **FOOTER_STYLE)
    return fig


def footer_text(fig: Figure) -> str:
    """The footer `add_footer` drew ('' when none): for tests and reports."""
    return next((t.get_text() for t in fig.texts if t.get_gid() == FOOTER_GID), "")
