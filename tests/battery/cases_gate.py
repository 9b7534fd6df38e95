"""The correctness gate (issue 29, items 1-3): a backend that writes into any input it is handed, at any call, or
is right only once, is failed and never timed, and the next point reads clean inputs; correct backends that do
odd but legal things still pass; every way a sweep ends is recorded as what it is, with a non-zero exit when it
stopped short; names a run could not be read back with are refused before the first point."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tests.battery import CLEAR, UNCLEAR, WRONG, Result, case, cli_refused, refused, run_cli

GATE, ENDS, NAMES = "gate", "sweep-end", "names"
CPU = torch.device("cpu")
_COUNTER = itertools.count()


def _timing() -> Any:
    from dsa_lab.bench.timing import TimingConfig

    return TimingConfig(warmup=1, min_samples=2, max_samples=3, max_seconds=0.01, window=2)


def _spec(*backends: str, **axes: Any) -> Any:
    from dsa_lab.bench.point import SweepSpec

    base = SweepSpec(backend=backends, batch=(2,), context=("160",), next_n=(2,), heads=(32,), head_dim=(64,))
    return base.with_axes(**{"strategy": ("native",), "timing": _timing(), **axes})


@functools.cache
def _base() -> type:
    from dsa_lab.kernels.reference import ReferenceBackend

    class Base(ReferenceBackend):
        baseline = False
        presets = ()

    return Base


@contextlib.contextmanager
def registered(**attributes: Any) -> Iterator[str]:
    """A backend class made of `attributes` over the reference, registered under a fresh name for the block."""
    from dsa_lab.kernels import registry

    name = f"battery-{next(_COUNTER)}"
    cls = type("Battery", (_base(),), {"name": name, "family": "battery", "label": "Battery", **attributes})
    registry.register_backend(cls)
    try:
        yield name
    finally:
        registry.forget_backends((name,))


def _check(name: str, spec: Any) -> Any:
    """The harness's check of the spec's first point, as every mode runs it (`walk`, `prepare`, `check_point`); an
    exception out of the backend's own call makes the point an error, never timed (what the sweep records)."""
    from dsa_lab.bench.check import check_point
    from dsa_lab.bench.walk import prepare, walk

    visit = next(iter(walk(spec.points(), spec, CPU)))
    if not visit.ready:
        raise RuntimeError(f"point not ready: {visit.skip or visit.error}")
    prepared = prepare(visit, CPU)
    return _Errored.of(
        lambda: check_point(
            visit.inputs,
            prepared.metadata,
            visit.backend,
            prepared.calls,
            spec.check_tolerance,
            spec.full_check_limit,
            spec.check_requests,
        )
    )


class _Errored:
    """A check that raised: the point is an error row, not timed (`ok` False, the exception as its message)."""

    ok, rel_err = False, float("nan")

    def __init__(self, err: Exception) -> None:
        self.message = f"the point errored: {type(err).__name__}: {err}"

    @classmethod
    def of(cls, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except (ValueError, RuntimeError) as err:  # the backend's own value checks refusing what it was handed
            return cls(err)


def _must_fail(result: Any, names: str = "") -> Result:
    if isinstance(result, _Errored):
        return Result(CLEAR, result.message[:200])
    if result.ok:
        return Result(WRONG, f"passed the check (rel_err {result.rel_err:.3g}): it would be timed")
    if names and names not in result.message:
        return Result(UNCLEAR, f"failed, but not naming {names!r}: {result.message[:200]}")
    return Result(CLEAR, result.message[:200])


def _must_pass(result: Any) -> Result:
    return Result(CLEAR, "passed") if result.ok else Result(WRONG, f"a correct backend failed: {result.message[:200]}")


# ---------------------------------------------------------------- inputs written into, at any call

ARGS = ("q", "kv_cache", "weights", "context_lens", "block_table")


def _swap_rows(t: torch.Tensor) -> None:
    """Its first two rows (blocks of a cache, requests of a table) swapped in place."""
    t[[0, 1]] = t[[1, 0]].clone()


def _flip(t: torch.Tensor, index: int, mask: int = 1) -> None:
    raw = t.view(torch.uint8).view(-1)
    raw[index] = raw[index] ^ mask


MUTATIONS: dict[str, tuple[str, Callable[[torch.Tensor], None], str]] = {  # label -> (argument, change, named)
    "zeroes the KV cache": ("kv_cache", lambda t: t.zero_(), "KV cache"),
    "flips one bit of one cached key": ("kv_cache", lambda t: _flip(t, 200), "KV cache"),
    "flips the last byte of the cache": ("kv_cache", lambda t: _flip(t, -1, 0xFF), "KV cache"),
    "swaps two cache blocks": ("kv_cache", _swap_rows, "KV cache"),
    "copies one cache block over another": ("kv_cache", lambda t: t[1].copy_(t[0]), "KV cache"),
    "writes NaN bytes into a block's scales": ("kv_cache", lambda t: t[0, -1, 0, -4:].fill_(0xFF), "KV cache"),
    "swaps two block ids of a request": (
        "block_table",
        lambda t: t[0, :2].copy_(t[0, :2].flip(0).clone()),
        "block table",
    ),
    "points a block id at another request's block": ("block_table", lambda t: t[0, :1].copy_(t[1, :1]), "block table"),
    "swaps two requests' rows of the table": ("block_table", _swap_rows, "block table"),
    "shortens one context by a token": ("context_lens", lambda t: t.view(-1)[:1].sub_(1), "context lens"),
    "zeroes one context": ("context_lens", lambda t: t.view(-1)[:1].zero_(), "context lens"),
    "lengthens one context by a token": ("context_lens", lambda t: t.view(-1)[:1].add_(1), "context lens"),
    "negates one query element": ("q", lambda t: _flip(t, 0, 0x80), "q"),
    "zeroes the queries": ("q", lambda t: t.view(torch.uint8).zero_(), "q"),
    "nudges one head weight by one ulp": ("weights", lambda t: _flip(t, 0, 1), "weights"),
    "zeroes the head weights": ("weights", lambda t: t.zero_(), "weights"),
    "negates the head weights": ("weights", lambda t: t.neg_(), "weights"),
}
WHEN = {  # label -> (calls it changes the input at, before computing (else after))
    "after its first call": (lambda call: call == 1, False),
    "before its first call": (lambda call: call == 1, True),
    "from its second call on": (lambda call: call >= 2, True),
    "after every call (a flip undone by the next)": (lambda call: True, False),
}


def _mutant(argument: str, change: Callable[[torch.Tensor], None], when: Callable[[int], bool], before: bool):
    def logits(self, *args, **kwargs):
        type(self).calls += 1
        target = dict(zip(ARGS, args))[argument]
        if before and when(type(self).calls):
            change(target)
        out = _base().logits(self, *args, **kwargs)
        if not before and when(type(self).calls):
            change(target)
        return out

    return {"logits": logits, "calls": 0}


for (_label, (_arg, _change, _named)), (_when, (_calls, _before)) in itertools.product(MUTATIONS.items(), WHEN.items()):

    def _mutation(tmp: Path, arg=_arg, change=_change, named=_named, calls=_calls, before=_before) -> Result:
        with registered(**_mutant(arg, change, calls, before)) as name:
            return _must_fail(_check(name, _spec(name)), named)

    case(GATE, f"a backend that {_label} {_when} is failed, naming it")(_mutation)

for _strategy in ("flatten", "atom"):
    for _label in ("swaps two block ids of a request", "shortens one context by a token", "zeroes the KV cache"):

        def _strategies(tmp: Path, strategy=_strategy, label=_label) -> Result:
            arg, change, named = MUTATIONS[label]
            narrow = {"native_next_n": lambda self, device: frozenset({1, 2})}  # atom: 2 + 1, two launches
            with registered(**_mutant(arg, change, lambda call: call == 1, False), **narrow) as name:
                return _must_fail(_check(name, _spec(name, strategy=(strategy,), next_n=(3,))), named)

        case(GATE, f"{_strategy}: a backend that {_label} after its first call is failed")(_strategies)

for _label in ("shortens one context by a token", "zeroes one context", "swaps two block ids of a request"):

    def _ragged(tmp: Path, label=_label) -> Result:
        arg, change, named = MUTATIONS[label]
        with registered(**_mutant(arg, change, lambda call: call == 1, False)) as name:
            spec = _spec(name, next_n=(3,), acceptance=("v4flash-ascend131",), batch=(4,))
            return _must_fail(_check(name, spec), named)

    case(GATE, f"ragged verification (per-request decode lengths): a backend that {_label} is failed")(_ragged)


# ---------------------------------------------------------------- right only once, or only sometimes

ONCE: dict[str, Callable[[int], float]] = {  # label -> factor on its call's output
    "right only on its first call": lambda call: 1.0 if call == 1 else 1.01,
    "right only from its second call": lambda call: 1.01 if call == 1 else 1.0,
    "wrong only on its second call": lambda call: 1.01 if call == 2 else 1.0,
    "just past the bound on its second call": lambda call: 1.0 + 3e-3 * (call == 2),
    "NaN everywhere on its second call": lambda call: float("nan") if call == 2 else 1.0,
    "zero on its first call": lambda call: 0.0 if call == 1 else 1.0,
    "negated on its second call": lambda call: -1.0 if call == 2 else 1.0,
}


def _varying(factor: Callable[[int], float]) -> dict[str, Any]:
    def logits(self, *args, **kwargs):
        type(self).calls += 1
        return _base().logits(self, *args, **kwargs) * factor(type(self).calls)

    return {"logits": logits, "calls": 0}


for _label, _factor in ONCE.items():
    for _strategy in ("native", "flatten"):

        def _once(tmp: Path, factor=_factor, strategy=_strategy) -> Result:
            with registered(**_varying(factor)) as name:
                return _must_fail(_check(name, _spec(name, strategy=(strategy,))))

        case(GATE, f"{_strategy}: a backend {_label} is failed")(_once)


@case(GATE, "a backend that swaps two block ids and swaps them back on its next call is failed")
def _(tmp: Path) -> Result:
    def logits(self, q, kv_cache, weights, context_lens, block_table, *args, **kwargs):
        block_table[0, :2] = block_table[0, :2].flip(0).clone()  # an even number of calls leaves the table as it was
        return _base().logits(self, q, kv_cache, weights, context_lens, block_table, *args, **kwargs)

    with registered(logits=logits) as name:
        return _must_fail(_check(name, _spec(name)))


# ---------------------------------------------------------------- correct backends that do odd, legal things pass


def _garbage_tail(self, q, kv_cache, weights, context_lens, block_table, max_context_len, *args, **kwargs):
    out = _base().logits(self, q, kv_cache, weights, context_lens, block_table, max_context_len, *args, **kwargs)
    cols = torch.arange(out.shape[1])[None, :]
    return torch.where(cols < context_lens.reshape(-1, 1), out, torch.full_like(out, 1e30))


def _own_copies(self, q, kv_cache, weights, context_lens, block_table, *args, **kwargs):
    mine = [t.clone() for t in (q, kv_cache, weights, context_lens, block_table)]
    out = _base().logits(self, *mine, *args, **kwargs)
    for t in mine:
        t.view(torch.uint8).zero_()  # its own scratch copies: not the inputs
    return out


def _reads_twice(self, *args, **kwargs):
    _base().logits(self, *args, **kwargs)
    return _base().logits(self, *args, **kwargs)


LEGAL = {
    "writes garbage past each row's context (the tail is unspecified)": _garbage_tail,
    "scribbles over private copies of its inputs": _own_copies,
    "computes every call twice": _reads_twice,
}
for _label, _logits in LEGAL.items():
    for _strategy in ("native", "flatten"):

        def _legal(tmp: Path, logits=_logits, strategy=_strategy) -> Result:
            with registered(logits=logits) as name:
                return _must_pass(_check(name, _spec(name, strategy=(strategy,))))

        case(GATE, f"{_strategy}: a correct backend that {_label} passes")(_legal)


# ---------------------------------------------------------------- a whole sweep: failed, untimed, next point clean


def _spy() -> dict[str, Any]:
    from dsa_lab.bench.check import fingerprint

    def logits(self, q, kv_cache, weights, context_lens, block_table, *args, **kwargs):
        type(self).seen.append((fingerprint(kv_cache).tolist(), fingerprint(block_table).tolist()))
        return _base().logits(self, q, kv_cache, weights, context_lens, block_table, *args, **kwargs)

    return {"logits": logits, "seen": []}


def _clean(spec: Any) -> tuple[list[int], list[int]]:
    from dsa_lab.bench.check import fingerprint
    from dsa_lab.bench.inputs import Workload

    point = spec.points()[0]
    built = Workload(point, point.seq_lens(spec.seed), max(spec.next_n), spec.seed, CPU)
    return fingerprint(built.cache.data).tolist(), fingerprint(built.cache.block_table).tolist()


def _sweep_case(tmp: Path, bad: dict[str, Any], says: str = "") -> Result:
    from dsa_lab.bench.sweep import run_sweep
    from dsa_lab.kernels import get_backend
    from dsa_lab.store import folders as store

    with registered(**bad) as name, registered(**_spy()) as spy:
        spec = _spec(name, spy, "reference")
        run_sweep(spec, tmp / "run", "cpu", progress=False)
        rows = {row["backend"]: row for row in store.read_points(tmp / "run")}
        seen = type(get_backend(spy)).seen
        clean = _clean(spec)
    if rows[name]["status"] == "ok" or rows[name].get("median_ms") is not None:
        return Result(WRONG, f"timed: {rows[name]['status']} {rows[name].get('median_ms')}")
    if not seen or any(s != clean for s in seen):
        return Result(WRONG, "the next point read the damaged inputs")
    if rows["reference"]["status"] != "ok":
        return Result(WRONG, f"the reference after it: {rows['reference']['status']} {rows['reference']['message']}")
    if says not in rows[name]["message"]:
        return Result(UNCLEAR, f"not naming {says!r}: {rows[name]['message'][:200]}")
    return Result(CLEAR, rows[name]["message"][:200])


SWEEPS = {
    "zeroes its KV cache": (_mutant("kv_cache", lambda t: t.zero_(), lambda c: c == 1, False), "KV cache"),
    "swaps two block ids": (
        _mutant("block_table", lambda t: t[0, :2].copy_(t[0, :2].flip(0).clone()), lambda c: c == 1, False),
        "block table",
    ),
    "is right only on its first call": (_varying(ONCE["right only on its first call"]), "call 2 of 2"),
    "is right only from its second call": (_varying(ONCE["right only from its second call"]), "call 1 of 2"),
    "zeroes its KV cache only while it is timed": (
        _mutant("kv_cache", lambda t: t.zero_(), lambda c: c > 2, False),
        "changed its inputs: KV cache",
    ),
    "swaps block ids only while it is timed": (
        _mutant("block_table", lambda t: t[0, :2].copy_(t[0, :2].flip(0).clone()), lambda c: c == 4, False),
        "changed its inputs: block table",
    ),
}
for _label, (_bad, _says) in SWEEPS.items():
    case(GATE, f"sweep: a backend that {_label} is failed, untimed, and the next points read clean inputs")(
        lambda tmp, bad=_bad, says=_says: _sweep_case(tmp, dict(bad), says)
    )


@case(GATE, "sweep: a backend whose schedule() writes into its block table is failed; the next point reads clean")
def _(tmp: Path) -> Result:
    def schedule(self, context_lens, block_size, block_table):
        block_table.view(-1)[:1].add_(1)
        return None

    return _sweep_case(tmp, {"schedule": schedule}, "block table")


# ---------------------------------------------------------------- how a sweep ends (through the CLI, a plug-in file)

MODULE = """from dsa_lab.kernels.reference import ReferenceBackend
from dsa_lab.kernels.registry import register_backend
import sys

@register_backend
class Plugged(ReferenceBackend):
    name, family, label, baseline, presets = {name!r}, "plug", "Plug", False, ()
{body}
"""


@contextlib.contextmanager
def plugin(tmp: Path, body: str, name: str | None = None) -> Iterator[tuple[Path, str]]:
    """A backend module file under `tmp` whose class has `body` (indented methods); forgotten after the block."""
    from dsa_lab.kernels import external, registry

    name = name if name is not None else f"plug-{next(_COUNTER)}"
    path = tmp / f"plugged_{next(_COUNTER)}.py"
    path.write_text(MODULE.format(name=name, body=body))
    try:
        yield path, name
    finally:
        registry.forget_backends((name,))
        external._ORIGINS.pop(name, None)
        external._FILES.pop(path.resolve(), None)


def bench_argv(tmp: Path, module: Path, backends: str, *extra: str) -> list[str]:
    return ["bench", "--backend-module", str(module), "--backend", backends, "--batch", "2", "--context", "96",
            "--next-n", "1", "--strategy", "native", "--heads", "32", "--head-dim", "64", "--device", "cpu",
            "--no-progress", "--max-seconds-per-point", "0.01", "--out", str(tmp / "run"), *extra]  # fmt: skip


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


# ---------------------------------------------------------------- names checked before the first point

BAD_NAMES = ("my kernel<b>", "a,b", "", " lead", "-lead", "..", "a|b", "a=b", "a/b", "ünï", "x" * 129, "a\nb")


def _no_run(tmp: Path) -> Callable[[], str | None]:
    def check() -> str | None:
        points = list(tmp.rglob("points.jsonl"))
        return f"points were measured: {points}" if points else None

    return check


for _bad in BAD_NAMES:

    def _plugged_name(tmp: Path, bad: str = _bad) -> Result:
        with plugin(tmp, "", name=bad) as (path, name):
            return cli_refused(bench_argv(tmp, path, "reference"), "not a plain name", harm=_no_run(tmp))

    case(NAMES, f"a plug-in registering the backend {_bad[:20]!r} is refused at registration")(_plugged_name)

    def _direct_name(tmp: Path, bad: str = _bad) -> Result:
        """Registered without the plug-in loader (a notebook's own class): the sweep refuses it before measuring."""
        from dsa_lab.bench.sweep import run_sweep
        from dsa_lab.kernels import registry

        cls = type("Direct", (_base(),), {"name": bad, "family": "direct", "label": "Direct"})
        try:
            registry.register_backend(cls)
        except ValueError as err:  # refused at registration: clear too
            return Result(CLEAR, str(err)[:200])
        try:
            return refused(lambda: run_sweep(_spec(bad), tmp / "run", "cpu", progress=False), "backend",
                           harm=_no_run(tmp))  # fmt: skip
        finally:
            registry.forget_backends((bad,))

    case(NAMES, f"a backend named {_bad[:20]!r} registered directly is refused before the first point")(_direct_name)

for _bad in ("my run", "a<b>", "a|b", "x" * 129, "-x", "ünï", "a\tb"):

    def _out_name(tmp: Path, bad: str = _bad) -> Result:
        argv = ["bench", "--backend", "reference", "--batch", "1", "--context", "64", "--next-n", "1",
                "--strategy", "native", "--device", "cpu", "--no-progress", "--out", str(tmp / "scratch" / bad)]  # fmt: skip
        return cli_refused(argv, "--out", "run id", harm=_no_run(tmp))

    case(NAMES, f"bench --out .../{_bad[:20]!r} (not a run id) is refused before the first point")(_out_name)

    def _api_name(tmp: Path, bad: str = _bad) -> Result:
        from dsa_lab.bench.sweep import run_sweep

        return refused(lambda: run_sweep(_spec("reference"), tmp / bad, "cpu", progress=False), "run id",
                       harm=_no_run(tmp))  # fmt: skip

    case(NAMES, f"run_sweep into a folder named {_bad[:20]!r} is refused before the first point")(_api_name)


@case(NAMES, "profile --out .../'my run' is refused before its first point")
def _(tmp: Path) -> Result:
    argv = ["profile", "--tool", "torch", "--device", "cpu", "--batch", "1", "--context", "64", "--next-n", "1",
            "--no-trace", "--out", str(tmp / "my run")]  # fmt: skip
    return cli_refused(argv, "--out", harm=_no_run(tmp))


@case(NAMES, "bench --out ending in '..' is refused")
def _(tmp: Path) -> Result:
    return cli_refused(["bench", "--device", "cpu", "--dry-run", "--out", f"{tmp}/x/.."], "--out", "run id")


# ---------------------------------------------------------------- fused backends and the top-k registry


def _fused(after: Callable[[dict[str, torch.Tensor]], None]) -> dict[str, Any]:
    """A fused backend (its unit is the step): the reference's logits, the exact top-k, then `after` on what it was
    handed."""

    def step(self, q, kv_cache, weights, context_lens, block_table, max_context_len, schedule=None, *, cache_dtype,
             topk, max_seq_len):  # fmt: skip
        from dsa_lab.topk import topk_per_row

        logits = _base().logits(
            self, q, kv_cache, weights, context_lens, block_table, max_context_len, cache_dtype=cache_dtype
        )
        picks = topk_per_row(logits, context_lens.reshape(-1), topk)
        after({"kv_cache": kv_cache, "block_table": block_table, "context_lens": context_lens, "q": q})
        return picks

    return {"fuses_topk": True, "step": step}


FUSED = {
    "zeroes its KV cache": (lambda t: t["kv_cache"].zero_(), "KV cache"),
    "swaps two block ids": (
        lambda t: t["block_table"][0, :2].copy_(t["block_table"][0, :2].flip(0).clone()),
        "block table",
    ),  # fmt: skip
    "shortens a context": (lambda t: t["context_lens"].view(-1)[:1].sub_(1), "context lens"),
    "negates a query element": (lambda t: _flip(t["q"], 0, 0x80), "q"),
}
for _label, (_after, _says) in FUSED.items():

    def _fused_case(tmp: Path, after=_after, says=_says) -> Result:
        from dsa_lab.bench.sweep import run_sweep
        from dsa_lab.kernels import get_backend
        from dsa_lab.store import folders as store

        with registered(**_fused(after)) as name, registered(**_spy()) as spy:
            spec = _spec(name, spy, "reference", timed=("logits+topk",), topk_impl=("torch",))
            run_sweep(spec, tmp / "run", "cpu", progress=False)
            rows = {row["backend"]: row for row in store.read_points(tmp / "run")}
            seen, clean = type(get_backend(spy)).seen, _clean(spec)
        bad = rows[name]
        if bad["status"] == "ok" or bad.get("median_ms") is not None:
            return Result(WRONG, f"timed: {bad['status']} {bad.get('median_ms')}")
        if not seen or any(s != clean for s in seen) or rows["reference"]["status"] != "ok":
            return Result(WRONG, "a later point read the damaged inputs")
        return Result(CLEAR, bad["message"][:200]) if says in bad["message"] else Result(UNCLEAR, bad["message"][:200])

    case(GATE, f"a fused backend that {_label} after its picks is failed, untimed; the next points read clean")(
        _fused_case
    )

for _impl in ("nope", "<b>", "", "torch,", "vllm|x", "Torch"):

    def _topk_name(tmp: Path, impl: str = _impl) -> Result:
        argv = ["bench", "--backend", "reference", "--batch", "1", "--context", "64", "--next-n", "1",
                "--strategy", "native", "--timed", "logits+topk", "--topk-impl", impl, "--device", "cpu",
                "--no-progress", "--out", str(tmp / "run")]  # fmt: skip
        if impl == "torch,":  # an empty item after a comma: one list syntax reads it as 'torch' or refuses it
            done = run_cli([*argv, "--dry-run"])
            return Result(CLEAR, "read or refused") if done.raised is None else Result(UNCLEAR, repr(done.raised))
        return cli_refused(argv, "topk", harm=_no_run(tmp))

    case(NAMES, f"bench --topk-impl {_impl!r} is refused by name before the first point")(_topk_name)
