"""Long tables as a report page shows them: the few rows that carry the finding, the whole table folded.

A notebook displays a `FoldedTable` like any table; its HTML is the top rows, then every row under a
closed `<details>`, so a 140-row decision table costs a page a dozen rows of height, and nothing is lost.
Headers are words with units (`kernel µs`, not `duration_ns`); every cell is formatted and escaped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

import pandas as pd
from pandas.io.formats.style import Styler

TOP_ROWS = 5  # a folded table's head: the few rows that carry its finding; every row is under it


@dataclass
class FoldedTable:
    """`head` (what it holds: `what`) above `full`, folded; `style` formats `full` (and `head`, unless
    `head_style` does: an overview of other columns than the rows it sums up). An empty `head` makes `what`
    the folded rows' one line (a ranking in which every row ties says nothing)."""

    head: pd.DataFrame
    full: pd.DataFrame
    style: Callable[[pd.DataFrame], Styler]
    what: str  # e.g. "points where vLLM's choice is furthest from the fastest"
    head_style: Callable[[pd.DataFrame], Styler] | None = None

    def _repr_html_(self) -> str:
        if self.head is self.full:
            return self.style(self.full).to_html()
        rows = self.style(self.full).to_html()
        if self.head.empty:  # one line, the rows under it
            return f"<details><summary><b>{escape(self.what)}</b> ({len(self.full)} rows)</summary>{rows}</details>"
        head = f"<p><b>{escape(self.what)}</b> (all {len(self.full)} rows below).</p>"
        top = (self.head_style or self.style)(self.head).to_html()
        return f"{head}{top}<details><summary>All {len(self.full)} rows</summary>{rows}</details>"

    to_html = _repr_html_

    def __repr__(self) -> str:
        return (self.full if self.head.empty else self.head).to_string(index=False)


def top_rows(
    shown: pd.DataFrame,
    style: Callable[[pd.DataFrame], Styler],
    order: Sequence[str],
    what: str,
    top: int = TOP_ROWS,
    tie_format: str = "{}",
) -> FoldedTable:
    """The `top` rows of `shown` with the largest `order` values (e.g. the largest speedups) above all rows in
    their own order; a table of `top` rows or fewer is shown whole, and one whose rows all tie on the first
    `order` column (shown with `tie_format`) says so in place of a ranking."""
    if len(shown) <= top:
        return FoldedTable(shown, shown, style, what)
    first = shown[order[0]].dropna().map(tie_format.format)  # ties as a reader sees them
    if first.nunique() == 1:
        return FoldedTable(shown.iloc[:0], shown, style, f"Every row: {order[0]} {first.iloc[0]}")
    head = shown.sort_values(list(order), ascending=False, kind="stable").head(top)
    return FoldedTable(head, shown, style, f"The {top} {what}")


def folded(shown: pd.DataFrame, style: Callable[[pd.DataFrame], Styler], what: str) -> FoldedTable:
    """Every row of `shown` folded under one line saying `what` they are: detail a chart or a reading above
    already summarises."""
    return FoldedTable(shown.iloc[:0], shown, style, what)
