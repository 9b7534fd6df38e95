"""The unit a mode times: a step's logits launches ('logits'), or the launches and the top-k after them
('logits+topk'), the part of the indexer's decode step a user pays for.

vLLM 0.33 follows the decode logits with a top-k of 2048 per row (`SparseIndexerTopk.forward`,
vllm/model_executor/layers/indexer_topk.py). With the default backend 'auto' on an SM90 GPU it
runs `torch.ops._C.cooperative_topk` up to 64 rows (`AUTO_COOPERATIVE_MAX_ROWS`) and
`torch.ops._C.persistent_topk` above, on every row the kernel wrote (padded rows too: it unpacks
them afterwards), each bounded by its row's length and by the batch's longest context
(`max_seq_len`, a host int), not by the buffer's `max_model_len` width. Those are vLLM's compiled
ops, built for vLLM's torch; they do not load on the H200's torch 2.11. So the timed top-k is
`topk.topk_in_context` on each launch's output: a masked copy up to the longest context, then
`torch.topk`. It reads and writes that copy before torch.topk reads it, about three times what a
kernel reading each row's prefix once moves, and the same work per row for every backend and
strategy: its time is an upper bound of vLLM's top-k, not vLLM's. `check_topk` holds its picks to
`topk.topk_per_row` on the same logits, tie-aware; `check_step_topk` is the harness's check of a
'logits+topk' point: the launches run into NaN-poisoned memory as every point's check runs them
(`bench.check.poisoned_run`), then the step's own top-k on those outputs, held to `topk_per_row`
over every row (whose scan also refuses a NaN left inside any row's context).

Nothing here synchronises the host, so a step is timed between CUDA events or captured whole in a
CUDA graph (`bench.timing.time_step`); its launches must have been value-checked beforehand
(`decode.check_launches`, as `bench.walk.prepare` does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from dsa_lab.axes import TIMED_UNITS
from dsa_lab.bench.check import poisoned_run, run_launches
from dsa_lab.cache import PagedCache
from dsa_lab.decode import LaunchInputs, gather_selections, scatter_logits
from dsa_lab.errors import check_choice, check_range
from dsa_lab.kernels import LogitsBackend
from dsa_lab.metadata import DecodeMetadata
from dsa_lab.topk import DEFAULT_TOPK, MAX_TOPK, SelectionAgreement, compare_selections, topk_in_context, topk_per_row


def timed_step(
    unit: str,
    backend: LogitsBackend,
    packed: Sequence[LaunchInputs],
    cache: PagedCache,
    max_context_len: int,
    schedules: Sequence[Any],
    longest_context: int,
    topk: int = DEFAULT_TOPK,
) -> Callable[[], list[torch.Tensor]]:
    """The callable a mode times: every launch of the step (returns their outputs), then for
    'logits+topk' a top-k of `topk` per kernel row over the first `longest_context` columns (returns
    one int32 `[rows, topk]` selection per launch)."""
    check_choice("unit", unit, TIMED_UNITS)
    check_range("longest_context", longest_context, 1, max_context_len)
    check_range("topk", topk, 1, MAX_TOPK)
    packed, schedules = tuple(packed), tuple(schedules)
    row_lens = row_context_lens(packed)  # views, made once outside the timed step

    def logits() -> list[torch.Tensor]:
        return run_launches(backend, packed, cache, max_context_len, schedules)

    def logits_and_topk() -> list[torch.Tensor]:
        return step_topk(logits(), row_lens, topk, longest_context)

    return logits if unit == "logits" else logits_and_topk


def row_context_lens(packed: Sequence[LaunchInputs]) -> tuple[torch.Tensor, ...]:
    """Each launch's context length per kernel row (views of its `[B', n']` context lens)."""
    return tuple(p.context_lens.reshape(-1) for p in packed)


def step_topk(
    outputs: Sequence[torch.Tensor], row_lens: Sequence[torch.Tensor], topk: int, longest_context: int
) -> list[torch.Tensor]:
    """The step's top-k: `topk_in_context` on each launch's output (what 'logits+topk' times)."""
    return [topk_in_context(out, lens, topk, longest_context) for out, lens in zip(outputs, row_lens, strict=True)]


def check_step_topk(
    backend: LogitsBackend,
    packed: Sequence[LaunchInputs],
    cache: PagedCache,
    max_context_len: int,
    schedules: Sequence[Any],
    metadata: DecodeMetadata,
    longest_context: int,
    topk: int = DEFAULT_TOPK,
) -> tuple[SelectionAgreement, bool]:
    """The check of a 'logits+topk' point: the launches run into poisoned memory, the step's top-k on their
    outputs, then `check_topk` over every row; returns the agreement and whether every output was poisoned.
    A NaN left inside any row's context raises `NonFiniteLogits` (from `topk_per_row`'s scan)."""
    device = packed[0].q.device
    outputs, poisoned = poisoned_run(backend, packed, cache, max_context_len, schedules, device)
    selections = step_topk(outputs, row_context_lens(packed), topk, longest_context)
    return check_topk(metadata, outputs, selections, topk), poisoned


def check_topk(
    metadata: DecodeMetadata, outputs: Sequence[torch.Tensor], selections: Sequence[torch.Tensor], topk: int
) -> SelectionAgreement:
    """The step's picks (one selection per launch) against `topk_per_row` on the same logits, per token and
    tie-aware (equal scores may swap indices)."""
    device = outputs[0].device
    logits, context = scatter_logits(metadata, outputs, device)
    expected = topk_per_row(logits, context, topk)
    return compare_selections(gather_selections(metadata, selections), expected, logits, atol=0.0, rtol=0.0)
