"""The correctness gate (issue 29) on one point's check: a backend that writes into any input it is handed,
at any call, or is right only once, is failed and never timed; correct backends that do odd but legal things
still pass."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.battery import CLEAR, UNCLEAR, WRONG, Result, case
from tests.battery.gate_support import CPU, GATE, ONCE, _base, _flip, _mutant, _spec, _varying, registered


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


def _swap_rows(t: torch.Tensor) -> None:
    """Its first two rows (blocks of a cache, requests of a table) swapped in place."""
    t[[0, 1]] = t[[1, 0]].clone()


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
