"""Text from outside (a run's provenance, ids, device and backend names, messages, paths) as inert markup.

Whatever a run carries may end up in a notebook's Markdown, the report's HTML or a terminal
table; none of it may become live markup there. `md_text` makes any string literal text in
Markdown (every ASCII punctuation character backslash-escaped, as CommonMark allows, so `<`,
`*`, `[` and backticks are text and a line break is a space); `md_code` makes it a code span
that no content can close; `html_text` escapes it for HTML. `render_markdown` renders
Markdown the project writes itself with raw HTML off. Rich output escapes with
`rich.markup.escape` where it prints (`env_info`).
"""

from __future__ import annotations

import html
import re
from functools import cache
from typing import Any

_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character (CommonMark's escapable set)
_BACKTICKS = re.compile(r"`+")


def _one_line(value: Any) -> str:
    return " ".join(str(value).split())


def md_text(value: Any) -> str:
    """`value` as literal Markdown text: no emphasis, link, HTML tag or heading can come out of it."""
    return _PUNCTUATION.sub(r"\\\1", _one_line(value))


def md_code(value: Any) -> str:
    """`value` as a Markdown code span, fenced by more backticks than it holds (CommonMark's rule)."""
    text = _one_line(value)
    fence = "`" * (max((len(run) for run in _BACKTICKS.findall(text)), default=0) + 1)
    return f"{fence} {text} {fence}" if text.startswith("`") or text.endswith("`") else f"{fence}{text}{fence}"


def html_text(value: Any) -> str:
    """`value` escaped for HTML text and attribute values."""
    return html.escape(str(value), quote=True)


@cache
def _renderer() -> Any:
    import mistune

    return mistune.create_markdown(escape=True)


def render_markdown(text: str) -> str:
    """HTML of Markdown the project writes, raw HTML escaped (shown as text, never live)."""
    return _renderer()(text)
