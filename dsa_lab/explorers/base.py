"""The frame every explorer shares: controls, an output area, one-line errors, a headless view.

CSS classes (what the browser test looks for): the explorer box carries
`dsa-lab-explorer`, the control a test may move `dsa-lab-explorer-probe`, the output area
`dsa-lab-explorer-output`, and an error line `dsa-lab-error`.

Figures are rendered explicitly, never through `plt.show()` (ipykernel 7 may run a widget callback
on its main thread rather than the thread that owns the cell, and the inline backend then flushes a
blank figure or none): `show_figure` takes the figure out of pyplot's registry first, then draws it on
an Agg canvas of its own and displays the PNG. The order matters: rendered while still registered,
notebook 05's explorer drew a blank PNG after a move in 3 of 3 JupyterLab runs (the kernel's own
bytes, not the browser's); closed first, every move drew (2 of 2 runs). Redraws never overlap
(`DRAWING`), whichever thread a callback arrives on.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import HTML, Image, Markdown, display
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

EXPLORER_CLASS = "dsa-lab-explorer"
PROBE_CLASS = "dsa-lab-explorer-probe"
OUTPUT_CLASS = "dsa-lab-explorer-output"
ERROR_CLASS = "dsa-lab-error"
DRAWING = threading.RLock()  # one redraw at a time, whichever thread the kernel runs a callback on

Draw = Callable[..., None]
# The options each dependent control may offer, given every control's value: {name: [(label, value), ...]}.
Allowed = Callable[[Mapping[str, Any]], Mapping[str, Sequence[Any]]]


def show_error(err: Exception) -> None:
    """The project's one-line error, in red, where the explorer's output would be."""
    display(
        HTML(f'<div class="{ERROR_CLASS}" style="color:#cf222e"><b>{type(err).__name__}:</b> {escape(str(err))}</div>')
    )


def figure_png(fig: Figure) -> bytes:
    """The figure as the inline backend would show it (a tight box takes the footer in), as PNG bytes, drawn
    on an Agg canvas of its own (no renderer shared with the backend's canvas)."""
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


def show_figure(fig: Figure) -> None:
    """Close `fig`, then display its PNG: the picture is in the output before the callback returns."""
    plt.close(fig)  # out of pyplot's registry first: nothing else may draw or flush it while it renders
    display(Image(data=figure_png(fig), format="png"))


def _draw_safely(draw: Draw, values: Mapping[str, Any]) -> None:
    """Run `draw`; a refused input (ValueError, the project's error type) becomes one line, not a traceback.
    No figure it opened outlives the call: one left open would be flushed again, outside the explorer."""
    before = set(plt.get_fignums())
    try:
        draw(**values)
    except ValueError as err:
        show_error(err)
    finally:
        for number in set(plt.get_fignums()) - before:
            plt.close(number)


def _option_values(options: Sequence[Any]) -> list[Any]:
    return [o[1] if isinstance(o, tuple) else o for o in options]


def _offer(control: widgets.ValueWidget, options: Sequence[Any]) -> bool:
    """Give `control` these options, keeping its value where still offered (else the first); True if it changed.
    A multiple choice given new options selects every one of them: a run or point switched to shows everything it
    timed (never only what the old one shared with it), and the explorer says so."""
    options = list(options)
    allowed = _option_values(options)
    control.disabled = len(allowed) <= 1 and not isinstance(control, widgets.SelectMultiple)  # one choice: shown
    if tuple(control.options) == tuple(options):
        return False
    if isinstance(control, widgets.SelectMultiple):
        control.options = options
        control.value = tuple(allowed)
    else:
        kept = control.value
        control.options = options
        if allowed:
            control.value = kept if kept in allowed else allowed[0]
    return True


def _settle(controls: Mapping[str, widgets.ValueWidget], allowed: Allowed) -> list[str]:
    """Offer each dependent control what the others allow, until nothing changes (a chain settles in
    as many passes as it has links); returns the multiple choices that were given new options (each now
    selects all of them)."""
    renewed: list[str] = []
    for _ in range(len(controls) + 1):
        values = {name: control.value for name, control in controls.items()}
        changed = [name for name, options in allowed(values).items() if _offer(controls[name], options)]
        renewed += [n for n in changed if isinstance(controls[n], widgets.SelectMultiple) and n not in renewed]
        if not changed:
            return renewed
    raise RuntimeError("explorer: the allowed options did not settle")


def _say_selected(controls: Mapping[str, widgets.ValueWidget], renewed: Sequence[str]) -> None:
    """One line naming what a switch selected: every option the run timed at this point, in each renewed choice."""
    if renewed:
        chosen = "; ".join(f"{name}: {', '.join(map(str, controls[name].value))}" for name in renewed)
        display(Markdown(f"*New options here, every one selected ({chosen}).*"))


# A multiple choice's selected options in the selection colour even when the box is not focused (browsers grey
# them out then, which reads as disabled).
SELECTED_CSS = (
    f"<style>.{EXPLORER_CLASS} select[multiple] option:checked "
    "{background: #0969da linear-gradient(0deg, #0969da 0%, #0969da 100%); color: #fff;}</style>"
)


def explore(
    title: str,
    controls: Mapping[str, widgets.ValueWidget],
    draw: Draw,
    probe: str,
    interactive: bool = True,
    rows: list[list[str]] | None = None,
    allowed: Allowed | None = None,
) -> None:
    """Show an explorer: `draw(**values)` redraws whenever a control changes.

    `probe` names the control a browser test moves (a Dropdown). `rows` groups control
    names into lines (default: all on one). `allowed` names, for the current values, the options
    each dependent control may offer: a combination that cannot run is never offered (a control
    left one option is disabled). With `interactive=False` (papermill), draw the default view
    once as plain output.
    """
    if probe not in controls:
        raise ValueError(f"probe={probe!r}: not one of the controls {sorted(controls)}")
    for control in controls.values():
        if isinstance(control, widgets.Text):
            control.continuous_update = False  # redraw on Enter or leaving the box, not at every keystroke
    if allowed is not None:
        _settle(controls, allowed)
    values = {name: control.value for name, control in controls.items()}
    if not interactive:
        display(Markdown(f"**{title}** (default view; run `./lab jupyter` to move the controls)"))
        _draw_safely(draw, values)
        return
    controls[probe].add_class(PROBE_CLASS)
    output = widgets.Output()
    output.add_class(OUTPUT_CLASS)
    settling = False

    def redraw(change: object = None) -> None:
        nonlocal settling
        if settling:  # a control being offered new options: one redraw once all have settled
            return
        with DRAWING, output:
            output.clear_output(wait=True)
            renewed: list[str] = []
            if allowed is not None:
                settling = True
                try:
                    renewed = _settle(controls, allowed)
                except ValueError as err:  # e.g. a run chosen that does not load: named, the controls as they were
                    show_error(err)
                    return
                finally:
                    settling = False
            _say_selected(controls, renewed if change is not None else [])
            _draw_safely(draw, {name: control.value for name, control in controls.items()})

    for control in controls.values():
        control.observe(redraw, names="value")
    lines = rows or [list(controls)]
    box = widgets.VBox(
        [
            widgets.HTML(f"{SELECTED_CSS}<b>{escape(title)}</b>"),
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
