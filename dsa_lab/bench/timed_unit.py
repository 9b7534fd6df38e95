"""The unit a mode times: a step's logits launches ('logits'), or the launches and the top-k after them
('logits+topk'), the part of the indexer's decode step a user pays for.

vLLM 0.33 follows the decode logits with a top-k of 2048 per row (`SparseIndexerTopk.forward`,
vllm/model_executor/layers/indexer_topk.py): on SM90 `cooperative_topk` up to 64 rows and
`persistent_topk` above, on every row the kernel wrote, each row bounded by its length and the
whole step by the batch's longest context (`max_seq_len`, a host int), not by the buffer's width.
A 'logits+topk' point runs the top-k its `topk_impl` axis names (`dsa_lab.topk`): 'vllm', those
kernels (vLLM's compiled ops, or dsa_lab's build of them where vLLM's wheel does not load), or
'torch', a masked copy and `torch.topk`, which on an H200 took 10-25 times vLLM's and is labelled
not vLLM's wherever it shows. Each launch's output gets its own prepared top-k call (output and
workspace allocated outside the timed step). `check_step_topk` is the harness's check of such a
point: the launches run into NaN-poisoned memory as every point's check runs them
(`bench.check.poisoned_run`), then the point's top-k on those outputs, held to `topk.topk_per_row`
over every row, tie-aware (whose scan also refuses a NaN left inside any row's context); the top-k
must leave the logits it read as they were.

Nothing here synchronises the host, so a step is timed between CUDA events or captured whole in a
CUDA graph (`bench.timing.time_step`); its launches must have been value-checked beforehand
(`decode.check_launches`, as `bench.walk.prepare` does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dsa_lab.axes import TIMED_UNITS
from dsa_lab.batch.metadata import DecodeMetadata
from dsa_lab.bench.check import InputGuard, changed_message, launch_inputs, poisoned, poisoned_run, run_launches
from dsa_lab.bench.numerics import backend_numerics
from dsa_lab.decode import gather_selections, scatter_logits
from dsa_lab.errors import check_choice, check_range
from dsa_lab.kernels import LogitsBackend, LogitsCall, baseline_backend
from dsa_lab.topk import (
    DEFAULT_TOPK,
    MAX_TOPK,
    SelectionAgreement,
    TopkCall,
    compare_selections,
    get_topk,
    topk_per_row,
)

FUSED_KERNEL = "fused ("  # how a fused backend's rows name their top-k kernel: 'fused (<backend>)'


def timed_step(
    unit: str,
    backend: LogitsBackend,
    launches: Sequence[LogitsCall],
    longest_context: int,
    topk: int = DEFAULT_TOPK,
    *,
    topk_impl: str = "vllm",
) -> Callable[[], list[torch.Tensor]]:
    """The callable a mode times: every launch of the step (one backend call each; returns their outputs), then
    for 'logits+topk' the point's top-k (`topk_impl`) of `topk` per kernel row, each bounded by the step's
    `longest_context` (returns one int32 `[rows, topk]` selection per launch)."""
    check_choice("unit", unit, TIMED_UNITS)
    launches = tuple(launches)
    if not launches:
        raise ValueError("launches: a step runs at least one launch (a LogitsCall each), got none")
    check_range("longest_context", longest_context, 1, launches[0].max_context_len)

    if backend.fuses_topk:
        if unit == "logits":
            raise ValueError(f"unit='logits': backend {backend.name!r} fuses the top-k: its unit is the step")
        return lambda: run_fused(backend, launches, topk, longest_context)

    def logits() -> list[torch.Tensor]:
        return run_launches(backend, launches)

    if unit == "logits":
        return logits
    calls, row_lens = prepare_topk(topk_impl, launches, topk), row_context_lens(launches)

    def logits_and_topk() -> list[torch.Tensor]:
        return step_topk(calls, logits(), row_lens, longest_context)

    return logits_and_topk


def run_fused(
    backend: LogitsBackend, launches: Sequence[LogitsCall], topk: int, longest_context: int
) -> list[torch.Tensor]:
    """A fused backend's step (`LogitsBackend.step`) for every launch: one int32 `[rows, topk]` selection each."""
    return [backend.step(p, topk=topk, max_seq_len=longest_context) for p in launches]


def prepare_topk(topk_impl: str, launches: Sequence[LogitsCall], topk: int = DEFAULT_TOPK) -> tuple[TopkCall, ...]:
    """One ready top-k call per launch (its rows, the logits' width), made outside any timed region."""
    check_range("topk", topk, 1, MAX_TOPK)
    impl = get_topk(topk_impl)
    return tuple(impl.prepare(p.context_lens.numel(), p.max_context_len, topk, p.q.device) for p in launches)


def row_context_lens(launches: Sequence[LogitsCall]) -> tuple[torch.Tensor, ...]:
    """Each launch's context length per kernel row (views of its `[B', n']` context lens)."""
    return tuple(p.context_lens.reshape(-1) for p in launches)


def step_topk(
    calls: Sequence[TopkCall], outputs: Sequence[torch.Tensor], row_lens: Sequence[torch.Tensor], longest_context: int
) -> list[torch.Tensor]:
    """The step's top-k: each launch's call on its output (what 'logits+topk' times)."""
    return [call(out, lens, longest_context) for call, out, lens in zip(calls, outputs, row_lens, strict=True)]


@dataclass(frozen=True)
class TopkCheck:
    """What the check of a 'logits+topk' point found: the picks against `topk_per_row`, whether every output
    was poisoned first, the kernels that ran (e.g. vLLM's 'cooperative (cluster 4)')."""

    agreement: SelectionAgreement
    poisoned: bool
    kernels: str


def check_step_topk(
    backend: LogitsBackend,
    launches: Sequence[LogitsCall],
    metadata: DecodeMetadata,
    longest_context: int,
    topk_impl: str,
    topk: int = DEFAULT_TOPK,
    *,
    tolerance: float,
) -> TopkCheck:
    """The check of a 'logits+topk' point: the launches run into poisoned memory, the point's top-k on their
    outputs, then `check_topk` over every row. A NaN left inside any row's context raises `NonFiniteLogits`
    (from `topk_per_row`'s scan); a top-k that wrote into the logits it read raises ValueError naming it."""
    device = launches[0].q.device
    if backend.fuses_topk:
        run = lambda: run_fused(backend, launches, topk, longest_context)
        return _check_fused(backend, run, launches, metadata, topk, tolerance)
    outputs, poisoned = poisoned_run(backend, launches, device)
    calls = prepare_topk(topk_impl, launches, topk)
    kept = [out.clone() for out in outputs]
    selections = [s.clone() for s in step_topk(calls, outputs, row_context_lens(launches), longest_context)]
    for index, (before, after) in enumerate(zip(kept, outputs)):
        if not torch.equal(before.view(torch.int32), after.view(torch.int32)):  # bitwise: NaN poison included
            raise ValueError(
                f"top-k {topk_impl!r} wrote into the logits it read (launch {index}): inputs are not its own"
            )
    kernels = ", ".join(dict.fromkeys(call.kernel for call in calls))
    return TopkCheck(check_topk(metadata, outputs, selections, topk), poisoned, kernels)


def _check_fused(
    backend: LogitsBackend,
    run: Callable[[], list[torch.Tensor]],
    launches: Sequence[LogitsCall],
    metadata: DecodeMetadata,
    topk: int,
    tolerance: float,
) -> TopkCheck:
    """A fused backend's check: its selections (into poisoned memory: an unwritten pick reads -1), and a second
    call's, against
    `topk_per_row` on the reference's logits, tie-aware within the point's bound (`tolerance`, loosened by the
    backend's numerics), since its scores are its own arithmetic's and a near tie at the k-th may fall either way."""
    device = launches[0].q.device
    guard = InputGuard.of({"KV cache": launches[0].kv_cache, **launch_inputs(launches)})

    def guarded() -> list[torch.Tensor]:  # every call verified: a change the next call would undo is seen
        selections = run()
        if changed := guard.changed():
            raise ValueError(changed_message(changed))
        return selections

    selections, poisoned_out = poisoned(guarded, device)
    selections = [s.clone() for s in selections]
    again = guarded()  # a second call held to the same picks: a kernel right only once is not timed
    reference = run_launches(baseline_backend(), [p.scheduled(None) for p in launches])
    logits, context = scatter_logits(metadata, reference, device)
    bound, _ = backend_numerics(backend, device).check_tolerance(tolerance)
    inside = torch.arange(logits.shape[1], device=device)[None, :] < context[:, None]
    scale = float(logits[inside].abs().max()) if bool(inside.any()) else 0.0
    expected = topk_per_row(logits, context, topk)
    agreements = [
        compare_selections(gather_selections(metadata, list(calls)), expected, logits, atol=bound * scale, rtol=0.0)
        for calls in (selections, again)
    ]
    return TopkCheck(min(agreements, key=lambda a: a.rows_equal), poisoned_out, f"{FUSED_KERNEL}{backend.name})")


def check_topk(
    metadata: DecodeMetadata, outputs: Sequence[torch.Tensor], selections: Sequence[torch.Tensor], topk: int
) -> SelectionAgreement:
    """The step's picks (one selection per launch) against `topk_per_row` on the same logits, per token and
    tie-aware (equal scores may swap indices)."""
    device = outputs[0].device
    logits, context = scatter_logits(metadata, outputs, device)
    expected = topk_per_row(logits, context, topk)
    return compare_selections(gather_selections(metadata, selections), expected, logits, atol=0.0, rtol=0.0)
