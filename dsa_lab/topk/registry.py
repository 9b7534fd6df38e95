"""A registry of the step's top-k implementations, each described once, as logits backends are.

The top-k is part of the decode step a user pays for: after the logits, vLLM keeps the best k
positions of every row. A number for "the step" with a top-k vLLM does not run is a number about
another step, so each implementation declares what it is, where it runs and what its provenance
records, and says why when it cannot run here.

    @register_topk
    class MyTopk(TopkImpl):
        name, label = "mine", "my top-k"
        def availability(self, device): ...
        def prepare(self, rows, width, k, device): ...   # -> a TopkCall, graph-capturable

A `TopkCall` is made once per step shape, outside any timed region (its output and workspace are
allocated there), and called in the step: `call(logits, lengths, max_seq_len) -> int32 [rows, k]`,
each row's k best columns among its first lengths[r], -1 past a short row, in no particular order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dsa_lab.errors import BackendUnavailable, check_choice, check_range, check_tensor

PLAIN_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,39}")  # a top-k's name: one token in every file and label


@dataclass(frozen=True)
class TopkAvailability:
    ok: bool
    reason: str


class TopkCall:
    """One step shape's top-k, ready to run: `__call__(logits, lengths, max_seq_len)`; `kernel` names what runs
    (e.g. vLLM's 'cooperative (cluster 4)'), recorded with every timed row."""

    kernel: str = ""

    def __call__(self, logits: torch.Tensor, lengths: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        raise NotImplementedError


def check_call(logits: torch.Tensor, lengths: torch.Tensor, rows: int) -> None:
    """What every `TopkCall` takes, checked on the host only (no values read: the call runs inside timed loops and
    graph capture): float32 logits of `rows` rows with contiguous columns, int32 lengths beside them."""
    check_tensor("logits", logits, dtype=torch.float32, shape=(rows, None))
    if logits.stride(1) != 1:
        raise ValueError(f"logits: columns must be contiguous (stride(1) == 1), got strides {logits.stride()}")
    check_tensor("lengths", lengths, dtype=torch.int32, shape=(rows,), device=logits.device, contiguous=True)


class TopkImpl:
    """Base class of a top-k implementation: name, label, what vLLM runs or not, the k it takes, where it runs."""

    name: ClassVar[str]
    label: ClassVar[str]  # how tables and charts name it; one that is not vLLM's says so
    is_vllm: ClassVar[bool] = False  # vLLM's own decode top-k: what a user pays for
    sizes: ClassVar[tuple[int, ...] | None] = None  # the k it takes (None: any in [1, MAX_TOPK])
    runs_on: ClassVar[str] = ""  # where it runs, in words

    def availability(self, device: torch.device) -> TopkAvailability:
        return TopkAvailability(True, "")

    def environment(self) -> dict[str, Any]:
        """What a run's provenance records of this implementation (version, build origin)."""
        return {}

    def prepare(self, rows: int, width: int, k: int, device: torch.device) -> TopkCall:
        raise NotImplementedError

    def require(self, device: torch.device, k: int) -> None:
        """Raise ValueError for a k it never takes, BackendUnavailable when it cannot run on `device`."""
        if self.sizes is not None:
            check_choice("topk", k, self.sizes)
        state = self.availability(torch.device(device))
        if not state.ok:
            raise BackendUnavailable(f"top-k {self.name!r} unavailable on {device}: {state.reason}")


_IMPLS: dict[str, TopkImpl] = {}


def register_topk(cls: type[TopkImpl]) -> type[TopkImpl]:
    """Register a top-k implementation under its plain name (a clash or a bad name is refused by name)."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name) or name == "none":
        raise ValueError(
            f"top-k name {name!r}: must be a plain name (lower-case letters, digits, '.', '_', '-'; "
            "at most 40; not 'none')"
        )
    if name in _IMPLS:
        raise ValueError(f"top-k {name!r} registered twice (first by {type(_IMPLS[name]).__module__})")
    if not isinstance(getattr(cls, "label", None), str):
        raise ValueError(f"top-k {name!r}: declares no label (a string)")
    if cls.sizes is not None:
        for k in cls.sizes:
            check_range(f"top-k {name!r} sizes", k, 1, 1 << 20)
    _IMPLS[name] = cls()
    return cls


def topk_names() -> tuple[str, ...]:
    return tuple(_IMPLS)


def get_topk(name: str) -> TopkImpl:
    check_choice("topk_impl", name, topk_names())
    return _IMPLS[name]


def vllm_topk() -> TopkImpl:
    """vLLM's own decode top-k: the one a whole step is timed with."""
    return next(impl for impl in _IMPLS.values() if impl.is_vllm)


def label_of(name: str) -> str:
    """How people read a top-k: its label ("vLLM's top-k", "torch's top-k (not vLLM's)"), 'no top-k' for a
    logits-only point, a name this process has no implementation of as it is."""
    if name == "none":
        return "no top-k"
    return _IMPLS[name].label if name in _IMPLS else name
