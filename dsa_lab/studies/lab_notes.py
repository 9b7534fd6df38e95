"""Sections of the project's lab notes (docs/*.md) that notebooks quote instead of copying (a study: the notes
are research history, cut apart by their headings)."""

from __future__ import annotations

import re

from dsa_lab.markup import md_text
from dsa_lab.paths import docs_dir

HEADING = re.compile(r"^(#+)\s+(.*)$", flags=re.MULTILINE)


def sections(document: str, keyword: str) -> str:
    """Every section of docs/`document` whose heading contains `keyword` (case-insensitive), with its subsections.

    Raises FileNotFoundError when the document is absent and LookupError when no heading matches.
    """
    path = docs_dir() / document
    if not path.is_file():
        raise FileNotFoundError(f"docs/{document} is not in this checkout")
    text = path.read_text(encoding="utf-8")
    headings = list(HEADING.finditer(text))
    found = []
    for i, heading in enumerate(headings):
        if keyword.lower() in heading.group(2).lower():
            level = len(heading.group(1))
            end = next((h.start() for h in headings[i + 1 :] if len(h.group(1)) <= level), len(text))
            found.append(text[heading.start() : end])
    if not found:
        raise LookupError(f"docs/{document}: no section heading contains {keyword!r}")
    return "\n\n".join(found)


def tuning_rounds(first: int = 5, document: str = "triton_kernel.md") -> str:
    """The lab notes' sections 'Round N' from `first` on, up to the first N the document lacks.

    Raises FileNotFoundError without the document and LookupError without round `first` (`sections`).
    """
    found = [sections(document, f"Round {first}")]
    n = first + 1
    while True:
        try:
            found.append(sections(document, f"Round {n}"))
        except LookupError:
            return "\n\n".join(found)
        n += 1


def titles(document: str, keyword: str) -> list[str]:
    """The headings of `sections(document, keyword)`, its subsections' left out."""
    found = HEADING.findall(sections(document, keyword))
    top = min(len(level) for level, _ in found)
    return [title for level, title in found if len(level) == top and keyword.lower() in title.lower()]


def round_titles(first: int = 5, document: str = "triton_kernel.md") -> list[str]:
    """The headings of `tuning_rounds(first, document)`: 'Round 5 (issue 13): ...', 'Round 6: ...'."""
    return [title for _, title in HEADING.findall(tuning_rounds(first, document)) if title.startswith("Round")]


def linked(document: str, section_titles: list[str], what: str) -> str:
    """Markdown that points to the sections of docs/`document` rather than copying them: a link (relative to
    notebooks/ and to the report's folder, both beside docs/) and the sections' titles, in one paragraph."""
    titles = " · ".join(f"*{md_text(title)}*" for title in section_titles)
    return f"{what}: in the lab notes, [docs/{document}](../docs/{document}), under {titles}.\n"
