"""The correctness gate (issue 29) over a whole sweep: a backend that writes into its inputs or is right only
once is failed, untimed, and the next points read clean inputs; a fused backend (its unit the whole step) too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.battery import CLEAR, UNCLEAR, WRONG, Result, case
from tests.battery.gate_support import CPU, GATE, ONCE, _base, _flip, _mutant, _spec, _varying, registered

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


# ---------------------------------------------------------------- fused backends


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
