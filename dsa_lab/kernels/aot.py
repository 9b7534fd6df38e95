"""Our kernels compiled ahead of time at each next_n, and what each cubin holds: no GPU needed.

A backend that builds its kernel for a GPU target on any machine declares it (`LogitsBackend.aot_archs`,
`compile_ahead`); `resource_table` compiles it for `sm_<arch>` at each next_n and reads the cubin
(`cubin.resource_counts`: registers, spills, shared memory, the MMA and TMA instructions). triton.jit picks
the interpreter when TRITON_INTERPRET is set, so the compiles run in a child process without it and with a
Triton cache of its own (`reports_in_child`, which the AOT tests use too): the child prints its reports on
one line, a failed compile reported for its case, not raised. `dsa-lab env --aot` prints the table.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dsa_lab.errors import UnsupportedShape
from dsa_lab.kernels.descriptor import RULE
from dsa_lab.kernels.registry import backend_names, get_backend

CHILD_TIMEOUT_S = 600
REPORT_PREFIX = "AOT-REPORT "


class AotChildError(RuntimeError):
    """The child process that compiles failed as a whole (not one case): its exit status and stderr's tail."""


def report_cases(names: Sequence[str], cases: Sequence[Sequence[Any]], compile_case: Callable[..., dict]) -> None:
    """The child's side: `compile_case(*case)` for each case, every report on one printed line."""
    reports = []
    for case in cases:
        try:
            reports.append(compile_case(*case))
        except Exception as exc:  # report per case: one failed compile must not hide the others
            reports.append({**dict(zip(names, case)), "error": f"{type(exc).__name__}: {exc}"[-4000:]})
    print(REPORT_PREFIX + json.dumps(reports), flush=True)


def reports_in_child(
    command: Sequence[str], cases: Sequence[Sequence[Any]], cache_dir: Path | None = None, cwd: Path | None = None
) -> list[dict]:
    """The parent's side: run `command` (which ends in `report_cases`) over `cases`, given as its last
    argument, without TRITON_INTERPRET and with `cache_dir` as the Triton cache (None: Triton's own)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    if cache_dir is not None:
        env["TRITON_CACHE_DIR"] = str(cache_dir)
    proc = subprocess.run(
        [*command, json.dumps([list(case) for case in cases])],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(REPORT_PREFIX)]
    if proc.returncode != 0 or not lines:
        raise AotChildError(f"the AOT child exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(REPORT_PREFIX) :])


def aot_backends(arch: int | None = None) -> tuple[str, ...]:
    """The registered backends that compile ahead of time (for `sm_<arch>`, when given)."""
    return tuple(
        name for name in backend_names() if get_backend(name).aot_archs and arch in (None, *get_backend(name).aot_archs)
    )


def compile_report(backend: str, arch: int, next_n: int, heads: int, head_dim: int, config: str) -> dict[str, Any]:
    """One case in the child: `backend`'s kernel for `sm_<arch>` at this shape and config, and its cubin's counts."""
    import triton

    from dsa_lab.kernels.cubin import resource_counts

    described, kernel = get_backend(backend).compile_ahead(arch, next_n, heads, head_dim, config)
    case = (backend, arch, next_n, heads, head_dim, described)
    return {**dict(zip(CASE_FIELDS, case)), "triton": triton.__version__, **resource_counts(kernel)}


CASE_FIELDS = tuple(inspect.signature(compile_report).parameters)  # a report names its case as compile_report does


def resource_table(
    backends: Sequence[str],
    arch: int,
    next_ns: Sequence[int],
    heads: int = 64,
    head_dim: int = 128,
    config: str = RULE,
    cache_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """A report per backend and next_n (`compile_report`, or the case and its `error`), compiled in one
    child process. UnsupportedShape names a backend that does not build for `sm_<arch>`."""
    for name in backends:
        if arch not in get_backend(name).aot_archs:
            raise UnsupportedShape(
                f"arch={arch}: backend {name!r} compiles ahead of time for {get_backend(name).aot_archs or 'none'}"
                f" (backends that build for sm_{arch}: {', '.join(aot_backends(arch)) or 'none'})"
            )
    cases = [[name, arch, n, heads, head_dim, config] for name in backends for n in next_ns]
    return reports_in_child([sys.executable, "-m", "dsa_lab.kernels.aot"], cases, cache_dir)


if __name__ == "__main__":
    report_cases(CASE_FIELDS, json.loads(sys.argv[1]), compile_report)
