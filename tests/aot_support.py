"""Compiling kernels ahead of time from a test: in one child process, without the interpreter.

triton.jit picks the interpreter when TRITON_INTERPRET is set (the test runner sets it on CPU
machines) and the compiler needs the real JITFunction, so each AOT test module runs itself as a
child without that variable and with a Triton cache of its own; the child prints one line of
JSON reports, one per case, and a failed compile is reported for its case, not raised.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

CHILD_TIMEOUT_S = 600
REPORT_PREFIX = "AOT-REPORT "


def report_cases(names: Sequence[str], cases: Sequence[Sequence[Any]], compile_case: Callable[..., dict]) -> None:
    """The child's side: `compile_case(*case)` for each case, every report on one printed line."""
    reports = []
    for case in cases:
        try:
            reports.append(compile_case(*case))
        except Exception as exc:  # report per case: one failed compile must not hide the others
            reports.append({**dict(zip(names, case)), "error": f"{type(exc).__name__}: {exc}"[-4000:]})
    print(REPORT_PREFIX + json.dumps(reports), flush=True)


def compile_in_child(test_file: str, cases: Sequence[Sequence[Any]], cache_dir: Path) -> list[dict]:
    """The parent's side: run `test_file` as the child over `cases`; its reports, or a failed test."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    test_path = Path(test_file).resolve()
    proc = subprocess.run(
        [sys.executable, str(test_path), json.dumps([list(case) for case in cases])],
        env=env,
        cwd=test_path.parents[1],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(REPORT_PREFIX)]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"AOT child exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(REPORT_PREFIX) :])
