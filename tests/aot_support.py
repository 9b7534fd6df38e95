"""Compiling kernels ahead of time from a test: each AOT test module runs itself as the child of
`dsa_lab.kernels.aot.reports_in_child` (no TRITON_INTERPRET, a Triton cache of its own), whose
`report_cases` is the child's side; a failed child fails the test, a failed compile only its case."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dsa_lab.kernels.aot import AotChildError, reports_in_child


def compile_in_child(test_file: str, cases: Sequence[Sequence[Any]], cache_dir: Path) -> list[dict]:
    """The parent's side: run `test_file` as the child over `cases`; its reports, or a failed test."""
    test_path = Path(test_file).resolve()
    try:
        return reports_in_child([sys.executable, str(test_path)], cases, cache_dir, cwd=test_path.parents[1])
    except AotChildError as err:
        pytest.fail(str(err))
