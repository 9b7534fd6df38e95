"""How a sweep ends (issue 29): every way (an exit, an interrupt, a crash, a probe that raises, the user's
--max-points) is recorded as what it is, with a non-zero exit when it stopped short."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.battery import CLEAR, UNCLEAR, WRONG, Result, case, cli_refused, run_cli
from tests.battery.gate_support import ENDS, _spec, bench_argv, plugin

# ---------------------------------------------------------------- how a sweep ends (through the CLI, a plug-in file)


def _progress(tmp: Path) -> dict[str, Any]:
    return json.loads((tmp / "run" / "provenance.json").read_text()).get("progress", {})


def _ended(tmp: Path, body: str, code: int, stop: str, first: bool = True) -> Result:
    with plugin(tmp, body) as (path, name):
        backends = f"{name},reference" if first else f"reference,{name}"
        done = run_cli(bench_argv(tmp, path, backends))
    if done.raised is not None and not isinstance(done.raised, KeyboardInterrupt):
        return Result(UNCLEAR, f"raised {type(done.raised).__name__}: {str(done.raised)[:200]}")
    if not (tmp / "run" / "provenance.json").is_file():
        return Result(UNCLEAR, f"no run recorded; exit {done.code}: {done.err[-200:]!r}")
    recorded = _progress(tmp).get("stop_reason")
    if done.code == 0 and stop != "complete":
        return Result(WRONG, f"exit 0 for a sweep that stopped short; provenance says {recorded!r}")
    if recorded != stop:
        return Result(WRONG, f"provenance says stop {recorded!r}, it was {stop!r} (exit {done.code})")
    if done.code != code:
        return Result(UNCLEAR, f"exit {done.code}, expected {code}: {done.err[-200:]!r}")
    return Result(CLEAR, f"exit {done.code}, stop {recorded}")


def _method(name: str, line: str, args: str = "self, *args, **kwargs") -> str:
    return f"    def {name}({args}):\n        {line}\n"


ENDINGS = {
    "a kernel calling sys.exit(0)": (_method("logits", "sys.exit(0)"), 4, "exited"),
    "a kernel calling sys.exit(1)": (_method("logits", "sys.exit(1)"), 4, "exited"),
    "a kernel calling sys.exit('bye')": (_method("logits", "sys.exit('bye')"), 4, "exited"),
    "a kernel raising SystemExit(None)": (_method("logits", "raise SystemExit(None)"), 4, "exited"),
    "a schedule() calling sys.exit(0)": (_method("schedule", "sys.exit(0)"), 4, "exited"),
    "availability() calling sys.exit(0)": (_method("availability", "sys.exit(0)", "self, device"), 4, "exited"),
    "native_next_n() calling sys.exit(0)": (_method("native_next_n", "sys.exit(0)", "self, device"), 4, "exited"),
    "a kernel raising KeyboardInterrupt": (_method("logits", "raise KeyboardInterrupt"), 130, "interrupted"),
    "availability() raising TypeError": (
        _method("availability", "raise TypeError('x')", "self, device"),
        0,
        "complete",
    ),
    "availability() returning None": (_method("availability", "return None", "self, device"), 0, "complete"),
    "native_next_n() raising TypeError": (
        _method("native_next_n", "raise TypeError('x')", "self, device"),
        0,
        "complete",
    ),
    "native_next_n() returning a string": (_method("native_next_n", "return 'all'", "self, device"), 0, "complete"),
    "configured() raising KeyError": (_method("configured", "raise KeyError('x')", "self, config"), 0, "complete"),
    "configured() returning None": (_method("configured", "return None", "self, config"), 0, "complete"),
    "require() raising AttributeError": (_method("require", "raise AttributeError('x')"), 0, "complete"),
    "schedule() raising TypeError": (_method("schedule", "raise TypeError('x')"), 0, "complete"),
    "a kernel raising MemoryError": (_method("logits", "raise MemoryError('x')"), 0, "complete"),
    "a kernel returning None": (_method("logits", "return None"), 0, "complete"),
}
for _label, (_body, _code, _stop) in ENDINGS.items():
    for _first in (True, False):
        case(ENDS, f"bench with {_label} ({'first' if _first else 'after the reference'}) records the stop")(
            lambda tmp, b=_body, c=_code, s=_stop, f=_first: _ended(tmp, b, c, s, f)
        )


def _probe_row(tmp: Path, body: str, says: str) -> Result:
    """A probe that raises: the point is an error row naming the backend and the probe; the reference still runs."""
    from dsa_lab.store import folders as store

    with plugin(tmp, body) as (path, name):
        done = run_cli(bench_argv(tmp, path, f"{name},reference"))
        rows = {row["backend"]: row for row in store.read_points(tmp / "run")} if (tmp / "run").is_dir() else {}
    if done.raised is not None or "Traceback" in done.err:
        return Result(UNCLEAR, f"traceback: {done.err[-200:]!r}")
    row = rows.get(name)
    if row is None or rows.get("reference", {}).get("status") != "ok":
        return Result(WRONG, f"rows {sorted(rows)}; exit {done.code}")
    if row["status"] != "error" or row.get("median_ms") is not None:
        return Result(WRONG, f"{row['status']}: {row['message'][:200]}")
    if name not in row["message"] or says not in row["message"]:
        return Result(UNCLEAR, f"not naming the backend and {says!r}: {row['message'][:200]}")
    return Result(CLEAR, row["message"][:200])


PROBES = {
    "availability()": _method("availability", "raise TypeError('a plug-in bug')", "self, device"),
    "native_next_n()": _method("native_next_n", "raise ValueError('a plug-in bug')", "self, device"),
    "configured(": _method("configured", "raise RuntimeError('a plug-in bug')", "self, config"),
    "require()": _method("require", "raise ZeroDivisionError('a plug-in bug')"),
    "schedule()": _method("schedule", "raise LookupError('a plug-in bug')"),
}
for _probe, _body in PROBES.items():
    case(ENDS, f"a backend whose {_probe.rstrip('(')} raises is an error row naming it; the sweep goes on")(
        lambda tmp, b=_body, p=_probe: _probe_row(tmp, b, p)
    )


@case(ENDS, "a backend whose numerics raise is refused before the first point, named")
def _(tmp: Path) -> Result:
    body = "    @property\n    def numerics(self):\n        raise TypeError('a plug-in bug')\n"
    with plugin(tmp, body) as (path, name):
        return cli_refused(bench_argv(tmp, path, name), name, "numerics", harm=lambda: _written(tmp))


@case(ENDS, "a backend whose environment() raises is refused before the first point, named")
def _(tmp: Path) -> Result:
    from dsa_lab import env_info

    env_info.environment_facts.cache_clear()
    body = _method("environment", "raise OSError('no such driver')", "self, requested=True")
    try:
        with plugin(tmp, body) as (path, name):
            return cli_refused(bench_argv(tmp, path, name), name, "environment()", harm=lambda: _written(tmp))
    finally:
        env_info.environment_facts.cache_clear()


def _written(tmp: Path) -> str | None:
    return f"a run was written: {tmp / 'run'}" if (tmp / "run" / "points.jsonl").exists() else None


@case(ENDS, "a crash out of the loop (the walk broken) records 'crashed' with its name before it propagates")
def _(tmp: Path) -> Result:
    from dsa_lab.bench import sweep

    original = sweep.walk

    def broken(*args: Any, **kwargs: Any) -> Iterator[Any]:
        raise ArithmeticError("the walk broke")
        yield

    sweep.walk = broken
    try:
        sweep.run_sweep(_spec("reference"), tmp / "run", "cpu", progress=False)
    except ArithmeticError:
        pass
    else:
        return Result(WRONG, "the crash was swallowed")
    finally:
        sweep.walk = original
    progress = _progress(tmp)
    if progress.get("stop_reason") != "crashed" or "ArithmeticError" not in progress.get("stop_error", ""):
        return Result(WRONG, f"provenance: {progress}")
    return Result(CLEAR, str(progress))


@case(ENDS, "bench --max-points 1 stops where the user asked: exit 0, stop max_points, the resume command printed")
def _(tmp: Path) -> Result:
    with plugin(tmp, "") as (path, name):
        done = run_cli(bench_argv(tmp, path, f"{name},reference", "--max-points", "1"))
    stop = _progress(tmp).get("stop_reason")
    if stop != "max_points":
        return Result(WRONG, f"stop {stop!r}")
    ok = done.code == 0 and "continue with: dsa-lab bench --resume" in done.out
    return Result(CLEAR, "resumable") if ok else Result(UNCLEAR, f"exit {done.code}: {done.out[-200:]!r}")


@case(ENDS, "a resumed run whose backend now exits records 'exited' and exits non-zero")
def _(tmp: Path) -> Result:
    marker = tmp / "exit-now"
    body = (
        "    def logits(self, *args, **kwargs):\n"
        f"        if __import__('os').path.exists({str(marker)!r}):\n"
        "            sys.exit(0)\n"
        "        return super().logits(*args, **kwargs)\n"
    )
    with plugin(tmp, body) as (path, name):
        first = run_cli(bench_argv(tmp, path, name, "--next-n", "1,2", "--max-points", "1"))
        if first.code != 0:
            return Result(UNCLEAR, f"first run: exit {first.code}: {first.err[-200:]!r}")
        marker.write_text("now")
        argv = ["bench", "--backend-module", str(path), "--resume", "--out", str(tmp / "run"), "--no-progress"]
        done = run_cli(argv)
    stop = _progress(tmp).get("stop_reason")
    if done.code == 0 or stop != "exited":
        return Result(WRONG, f"exit {done.code}, stop {stop!r}: {done.err[-200:]!r}")
    return Result(CLEAR, f"exit {done.code}, stop {stop}")
