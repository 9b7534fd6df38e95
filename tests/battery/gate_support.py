"""What the correctness gate's battery cases (tests/battery/cases_gate_*.py) share: their areas, a small CPU
sweep spec, backends made over the reference and registered for a block (one that writes into an input, one
right only on some calls), and a plug-in backend file run through the CLI."""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

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


ARGS = ("q", "kv_cache", "weights", "context_lens", "block_table")


def _flip(t: torch.Tensor, index: int, mask: int = 1) -> None:
    raw = t.view(torch.uint8).view(-1)
    raw[index] = raw[index] ^ mask


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
