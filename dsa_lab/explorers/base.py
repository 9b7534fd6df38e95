"""The frame every explorer shares: controls, an output area, one-line errors, a headless view.

CSS classes (what the browser test looks for): the explorer box carries
`dsa-lab-explorer`, the control a test may move `dsa-lab-explorer-probe`, the output area
`dsa-lab-explorer-output`, and an error line `dsa-lab-error`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from html import escape
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import HTML, Markdown, display

EXPLORER_CLASS = "dsa-lab-explorer"
PROBE_CLASS = "dsa-lab-explorer-probe"
OUTPUT_CLASS = "dsa-lab-explorer-output"
ERROR_CLASS = "dsa-lab-error"

Draw = Callable[..., None]


def show_error(err: Exception) -> None:
    """The project's one-line error, in red, where the explorer's output would be."""
    display(
        HTML(f'<div class="{ERROR_CLASS}" style="color:#cf222e"><b>{type(err).__name__}:</b> {escape(str(err))}</div>')
    )


def _draw_safely(draw: Draw, values: Mapping[str, Any]) -> None:
    """Run `draw`; a refused input (ValueError, the project's error type) becomes one line, not a traceback."""
    try:
        draw(**values)
    except ValueError as err:
        plt.close("all")
        show_error(err)


def explore(
    title: str,
    controls: Mapping[str, widgets.ValueWidget],
    draw: Draw,
    probe: str,
    interactive: bool = True,
    rows: list[list[str]] | None = None,
) -> None:
    """Show an explorer: `draw(**values)` redraws whenever a control changes.

    `probe` names the control a browser test moves (a Dropdown). `rows` groups control
    names into lines (default: all on one). With `interactive=False` (papermill), draw the
    default view once as plain output.
    """
    if probe not in controls:
        raise ValueError(f"probe={probe!r}: not one of the controls {sorted(controls)}")
    values = {name: control.value for name, control in controls.items()}
    if not interactive:
        display(Markdown(f"**{title}** (default view; run `./lab jupyter` to move the controls)"))
        _draw_safely(draw, values)
        return
    controls[probe].add_class(PROBE_CLASS)
    output = widgets.Output()
    output.add_class(OUTPUT_CLASS)

    def redraw(change: object = None) -> None:
        with output:
            output.clear_output(wait=True)
            _draw_safely(draw, {name: control.value for name, control in controls.items()})

    for control in controls.values():
        control.observe(redraw, names="value")
    lines = rows or [list(controls)]
    box = widgets.VBox(
        [
            widgets.HTML(f"<b>{escape(title)}</b>"),
            *(widgets.HBox([controls[n] for n in line]) for line in lines),
            output,
        ]
    )
    box.add_class(EXPLORER_CLASS)
    display(box)  # displayed here, not returned: a returned widget would show twice as the cell's value
    redraw()


def dropdown(description: str, options: Any, value: Any = None, width: str = "220px") -> widgets.Dropdown:
    """A Dropdown that offers only the allowed values."""
    dropdown = widgets.Dropdown(
        options=options,
        description=description,
        style={"description_width": "initial"},
        layout=widgets.Layout(width=width),
    )
    if value is not None:
        dropdown.value = value
    return dropdown
