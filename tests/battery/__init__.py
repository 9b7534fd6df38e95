"""An adversarial battery over the surfaces issues 20 and 29 name: each case is one bad or hostile input.

Issue 29 added the correctness gate (`cases_gate_*`: backends that write into their inputs or are right
only once, how a sweep ends, names checked before the first point), outputs, load integrity and profile
discovery (`cases_outputs`), and the cases it found unclear (`cases_params`: papermill parameters,
plug-in imports, seeds, helpers that name what they refuse).

Every case ends in one of three outcomes:

- `wrong`: a silently wrong or harmful result: bad input accepted, a file written outside
  where it belongs, an input destroyed, live markup in a page, a gate passed by accident;
- `unclear`: refused, but not as the project promises (a raw TypeError or KeyError, a
  traceback, a message that names neither the argument nor the file, a hang);
- `clear`: refused with the project's error naming the argument or file, or handled safely.

`python -m tests.battery` prints the counts by area (`--show wrong,unclear` lists those
cases); `tests/test_battery.py` runs it and holds the line at no `wrong` and at most 5 %
`unclear`. The cases call the package only through surfaces it had before issue 20 (the
CLI, public functions), so the same battery measures a checkout from before the fixes
(`PYTHONPATH=<old checkout>:. python -m tests.battery`).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

WRONG, UNCLEAR, CLEAR = "wrong", "unclear", "clear"
OUTCOMES = (WRONG, UNCLEAR, CLEAR)
CASE_TIMEOUT_S = 30.0
# A CPU bench of one reference shape, each point cut at 0.01 s (add --next-n and --out), and a CPU profile of one
# point without a trace (add --out): the fast runs the cases and the store's bad-input tests make.
FAST_BENCH = [
    "bench",
    "--preset",
    "ci",
    "--backend",
    "reference",
    "--batch",
    "1",
    "--context",
    "64",
    "--strategy",
    "native",
    "--no-progress",
    "--device",
    "cpu",
    "--max-seconds-per-point",
    "0.01",
]
FAST_PROFILE = [
    "profile",
    "--tool",
    "torch",
    "--device",
    "cpu",
    "--batch",
    "1",
    "--context",
    "64",
    "--next-n",
    "1",
    "--no-trace",
]


class Hung(BaseException):
    """A case ran past its time limit (a BaseException, so no `except Exception` in the code under test eats it)."""


@dataclass(frozen=True)
class Result:
    outcome: str
    detail: str = ""


@dataclass(frozen=True)
class Case:
    area: str
    name: str
    run: Callable[[Path], Result]
    timeout_s: float = CASE_TIMEOUT_S


CASES: list[Case] = []


def case(area: str, name: str, timeout_s: float = CASE_TIMEOUT_S) -> Callable[[Callable[[Path], Result]], None]:
    """Register `fn(tmp) -> Result` as a case of `area`."""

    def register(fn: Callable[[Path], Result]) -> None:
        CASES.append(Case(area, name, fn, timeout_s))

    return register


# ---------------------------------------------------------------- judging an outcome

CLEAR_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, RuntimeError, LookupError)


def judge_error(err: BaseException, names: tuple[str, ...], types: tuple[type[BaseException], ...]) -> Result:
    """A raised error: clear when of `types` and naming every one of `names`, else unclear."""
    message = str(err)
    if isinstance(err, Hung):
        raise err
    if type(err) in (
        TypeError,
        KeyError,
        AttributeError,
        IndexError,
        AssertionError,
        ZeroDivisionError,
        OverflowError,
        UnicodeDecodeError,
        RecursionError,
    ) or not isinstance(err, types):
        return Result(UNCLEAR, f"raw {type(err).__name__}: {message[:300]}")
    missing = [name for name in names if name not in message]
    if missing:
        return Result(UNCLEAR, f"{type(err).__name__} not naming {missing}: {message[:300]}")
    return Result(CLEAR, f"{type(err).__name__}: {message[:200]}")


def refused(
    call: Callable[[], object],
    *names: str,
    types: tuple[type[BaseException], ...] = CLEAR_ERRORS,
    harm: Callable[[], str | None] | None = None,
) -> Result:
    """`call()` must raise a clear error naming `names`; returning is `wrong`; `harm()` (a description
    of damage done, or None) makes any outcome `wrong`."""
    try:
        value = call()
    except Hung:
        raise
    except BaseException as err:  # SystemExit and KeyboardInterrupt from the code under test included
        result = judge_error(err, names, types)
    else:
        result = Result(WRONG, f"accepted: returned {str(value)[:200]!r}")
    damage = harm() if harm is not None else None
    return Result(WRONG, f"harm: {damage} ({result.detail})") if damage else result


def safe(call: Callable[[], object], harm: Callable[[], str | None], *names: str, may_refuse: bool = True) -> Result:
    """`call()` may succeed or (with `may_refuse`) refuse clearly naming `names`; `harm()` must find nothing."""
    try:
        call()
    except Hung:
        raise
    except BaseException as err:
        result = judge_error(err, names, CLEAR_ERRORS) if may_refuse else Result(UNCLEAR, f"raised {err!r:.300}")
    else:
        result = Result(CLEAR, "handled")
    damage = harm()
    return Result(WRONG, f"harm: {damage} ({result.detail})") if damage else result


@dataclass
class CliRun:
    code: int | None
    out: str
    err: str
    raised: BaseException | None = None


def run_cli(argv: list[str]) -> CliRun:
    """`dsa-lab argv` in this process, its exit code and output captured (argparse's SystemExit too)."""
    from dsa_lab.cli import main

    out, err = io.StringIO(), io.StringIO()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code: int | None = main(argv)
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
    except Hung:
        raise
    except BaseException as raised:
        return CliRun(None, out.getvalue(), err.getvalue(), raised)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return CliRun(code, out.getvalue(), err.getvalue())


def cli_refused(argv: list[str], *names: str, harm: Callable[[], str | None] | None = None) -> Result:
    """The command must exit 2 with an error naming `names` (one line, or argparse's usage + error)."""
    run = run_cli(argv)
    damage = harm() if harm is not None else None
    if run.raised is not None:
        result = Result(UNCLEAR, f"traceback: {type(run.raised).__name__}: {str(run.raised)[:300]}")
    elif run.code == 0:
        result = Result(WRONG, f"exit 0: {run.out[-300:]!r}")
    elif "Traceback" in run.err:
        result = Result(UNCLEAR, f"traceback in stderr: {run.err[-300:]!r}")
    else:
        missing = [name for name in names if name not in run.err]
        lines = [line for line in run.err.strip().splitlines() if line.strip()]
        error_lines = [line for line in lines if line.startswith("dsa-lab") and ": error: " in line]
        if missing:
            result = Result(UNCLEAR, f"exit {run.code}, not naming {missing}: {run.err[-300:]!r}")
        elif len(error_lines) != 1:
            result = Result(UNCLEAR, f"exit {run.code}, {len(error_lines)} error lines: {run.err[-300:]!r}")
        else:
            result = Result(CLEAR, error_lines[0][:200])
    return Result(WRONG, f"harm: {damage} ({result.detail})") if damage else result


def unchanged(path: Path, before: bytes | None) -> Callable[[], str | None]:
    """A harm check: `path` still holds `before` (None: still absent)."""

    def check() -> str | None:
        now = path.read_bytes() if path.exists() else None
        return None if now == before else f"{path} changed ({len(before or b'')} -> {len(now or b'')} bytes)"

    return check


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Environment variables set (None: removed) for the block."""
    previous = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def alarm(signum: int, frame: object) -> None:
        raise Hung(f"still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_case(item: Case) -> Result:
    """One case in a fresh temporary folder, bounded in time; a hang is `unclear`."""
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="dsa_lab_battery_") as tmp:
        try:
            with time_limit(item.timeout_s):
                return item.run(Path(tmp))
        except Hung as err:
            return Result(UNCLEAR, f"hung: {err}")
        except Exception as err:  # a case that broke on its own (an API it expects is gone): counted, not fatal
            return Result(UNCLEAR, f"case raised {type(err).__name__}: {str(err)[:300]}")
        finally:
            os.chdir(cwd)


def load_cases() -> list[Case]:
    """Every case of every area module (importing them registers their cases)."""
    from tests.battery import (  # noqa: F401
        cases_aot,
        cases_batches,
        cases_cli,
        cases_compare,
        cases_gate_ends,
        cases_gate_inputs,
        cases_gate_names,
        cases_gate_sweep,
        cases_model,
        cases_newest,
        cases_outputs,
        cases_params,
        cases_pr340,
        cases_report,
        cases_store_deadlines,
        cases_store_discovery,
        cases_store_disks,
        cases_store_links,
        cases_store_loads,
        cases_store_resume,
        cases_store_run_ids,
    )

    return list(CASES)


def counts(results: list[tuple[Case, Result]]) -> dict[str, dict[str, int]]:
    """{area: {outcome: count}}, areas in the order their cases were declared, plus 'all'."""
    table: dict[str, dict[str, int]] = {}
    for item, result in results:
        for area in (item.area, "all"):
            table.setdefault(area, dict.fromkeys(OUTCOMES, 0))[result.outcome] += 1
    table["all"] = table.pop("all", dict.fromkeys(OUTCOMES, 0))
    return table


def format_counts(table: dict[str, dict[str, int]]) -> str:
    lines = [f"{'area':<10} {'cases':>5} {'wrong':>6} {'unclear':>8} {'clear':>6} {'unclear %':>9}"]
    for area, row in table.items():
        total = sum(row.values())
        lines.append(
            f"{area:<10} {total:>5} {row[WRONG]:>6} {row[UNCLEAR]:>8} {row[CLEAR]:>6} "
            f"{100 * row[UNCLEAR] / max(total, 1):>8.1f}%"
        )
    return "\n".join(lines)
