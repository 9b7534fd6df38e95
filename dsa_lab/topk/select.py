"""Per-row top-k of indexer logits, and a tie-aware comparison of two selections.

vLLM keeps the top 2048 positions per query row and fills rows with fewer valid
tokens with -1. Equal scores may legally swap indices, so two selections agree when
the *scores* they select, sorted, agree - not when their index lists do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsa_lab.errors import INTEGER_DTYPES, NonFiniteLogits, check_choice, check_range, check_tensor

DEFAULT_TOPK = 2048
MAX_TOPK = 1 << 20


def _check_valid_logits(logits: torch.Tensor, context_lens: torch.Tensor) -> None:
    """Context lens in [0, width] and every logit inside a context finite (one device->host copy)."""
    if not context_lens.numel():
        return
    width = logits.shape[1]
    valid = torch.arange(width, device=logits.device)[None, :] < context_lens[:, None]
    bad = valid & ~torch.isfinite(logits)
    low, high, count = torch.stack([context_lens.amin().long(), context_lens.amax().long(), bad.sum()]).tolist()
    if low < 0 or high > width:
        raise ValueError(f"context_lens: values must lie in [0, {width}] (the logits' width), got [{low}, {high}]")
    if count:
        row, col = (int(x) for x in bad.nonzero()[0])
        raise NonFiniteLogits(
            f"logits: {count} non-finite value(s) inside the rows' contexts (first logits[{row}, {col}] = "
            f"{float(logits[row, col])}); a NaN would outrank every score, so none is allowed there"
        )


def topk_per_row(
    logits: torch.Tensor, context_lens: torch.Tensor, k: int = DEFAULT_TOPK, check_values: bool = True
) -> torch.Tensor:
    """int32 `[T, k]`: the k best positions of each row among its first context_lens[t], -1 after.

    Positions at or beyond a row's context are never chosen, whatever the logits hold there.
    Non-finite logits inside a context are *rejected* (NonFiniteLogits), not masked: NaN ranks
    above every score in torch.topk, and it only arises from a broken kernel or non-finite
    inputs, which a masked selection would hide. The scan costs one device->host copy;
    `check_values=False` skips it for a profiled step whose warm-up scanned the same inputs.
    """
    check_tensor("logits", logits, dtype=torch.float32, ndim=2)
    check_tensor("context_lens", context_lens, dtype=INTEGER_DTYPES, shape=(logits.shape[0],), device=logits.device)
    check_range("k", k, 1, MAX_TOPK)
    check_choice("check_values", check_values, (False, True))
    if check_values:
        _check_valid_logits(logits, context_lens)
    rows, width = logits.shape
    pos = torch.arange(width, device=logits.device)
    valid = pos[None, :] < context_lens[:, None]
    masked = torch.where(valid, logits, torch.full_like(logits, float("-inf")))
    take = min(k, width)
    _, idx = torch.topk(masked, take, dim=-1)
    counts = context_lens.clamp(max=take)
    keep = torch.arange(take, device=logits.device)[None, :] < counts[:, None]
    out = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    out[:, :take] = torch.where(keep, idx, torch.full_like(idx, -1)).to(torch.int32)
    return out


def topk_in_context(logits: torch.Tensor, context_lens: torch.Tensor, k: int, columns: int) -> torch.Tensor:
    """int32 `[rows, k]`: each row's k best positions among its first context_lens[r], -1 for the rest;
    the top-k a timed step runs, straight on a kernel's output.

    Reads only the first `columns` columns (the step's longest context, a host int: vLLM's top-k
    gets the same bound, `max_seq_len`, however wide the logits buffer is), masks each row past
    its context to -inf, runs `torch.topk(sorted=False)` and turns every pick at or past the
    context into -1, so nothing past a row's length is read into the choice or chosen. Unlike
    `topk_per_row` it scans nothing (no host sync: it is captured in CUDA graphs), so a row must
    hold finite logits inside its context (checked beforehand); the order within a row is
    unspecified (compare selections with `compare_selections`). It picks the same sets as
    `topk_per_row`, ties aside.
    """
    check_tensor("logits", logits, dtype=torch.float32, ndim=2)
    check_tensor("context_lens", context_lens, dtype=INTEGER_DTYPES, shape=(logits.shape[0],), device=logits.device)
    check_range("k", k, 1, MAX_TOPK)
    columns = check_range("columns", columns, 1, logits.shape[1])
    view = logits[:, :columns]
    lens = context_lens.to(torch.int64)[:, None]
    masked = view.masked_fill(torch.arange(columns, device=logits.device)[None, :] >= lens, float("-inf"))
    take = min(k, columns)
    picked = torch.topk(masked, take, dim=-1, sorted=False).indices
    out = torch.full((logits.shape[0], k), -1, dtype=torch.int32, device=logits.device)
    out[:, :take] = torch.where(picked < lens, picked, torch.full_like(picked, -1)).to(torch.int32)
    return out


@dataclass(frozen=True)
class SelectionAgreement:
    """How two top-k selections compare on the same reference scores."""

    rows: int
    rows_equal: int  # selected score multisets equal within tolerance
    max_score_gap: float  # largest |sorted score difference| over all rows
    index_overlap: float  # mean fraction of shared indices (informative only)

    @property
    def equal(self) -> bool:
        return self.rows_equal == self.rows


def compare_selections(
    a: torch.Tensor, b: torch.Tensor, scores: torch.Tensor, atol: float = 1e-4, rtol: float = 1e-4
) -> SelectionAgreement:
    """Compare selections `a`, `b` (int32 `[T, k]`, -1 = none) by the reference `scores` they pick.

    A row agrees when both pick the same number of positions and the picked scores,
    sorted, match within `atol + rtol * |score|`: ties may swap indices freely.
    """
    check_tensor("a", a, dtype=torch.int32, ndim=2)
    check_tensor("b", b, dtype=torch.int32, shape=tuple(a.shape), device=a.device)
    check_tensor("scores", scores, dtype=(torch.float32, torch.float64), shape=(a.shape[0], None), device=a.device)
    for name, tol in (("atol", atol), ("rtol", rtol)):
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 <= tol < float("inf"):
            raise ValueError(f"{name}={tol!r}: must be a finite number >= 0")
    for name, sel in (("a", a), ("b", b)):
        if sel.numel() and not -1 <= int(sel.min()) <= int(sel.max()) < scores.shape[1]:
            raise ValueError(
                f"{name}: indices must be -1 (none) or in [0, {scores.shape[1] - 1}], got [{int(sel.min())}, {int(sel.max())}]"
            )

    def picked(sel: torch.Tensor) -> torch.Tensor:
        vals = torch.gather(scores.double(), 1, sel.clamp(min=0).long())
        vals = torch.where(sel >= 0, vals, torch.full_like(vals, float("-inf")))
        return torch.sort(vals, dim=-1, descending=True).values

    sa, sb = picked(a), picked(b)
    both = torch.isfinite(sa) & torch.isfinite(sb)
    same_count = (torch.isfinite(sa) == torch.isfinite(sb)).all(dim=-1)
    gap = torch.where(both, (sa - sb).abs(), torch.zeros_like(sa))
    tol = atol + rtol * sa.abs().where(both, torch.zeros_like(sa))
    row_ok = same_count & (gap <= tol).all(dim=-1)
    return SelectionAgreement(
        rows=a.shape[0],
        rows_equal=int(row_ok.sum()),
        max_score_gap=float(gap.max()) if gap.numel() else 0.0,
        index_overlap=_mean_overlap(a, b),
    )


def _mean_overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over rows of |A & B| / |A | B| for the index sets (-1 aside) of two selections, 1 where both
    are empty; on the device, one sort per selection (a step's 1024 rows x 2048 picks in a few ms)."""
    if not a.numel():
        return 1.0

    def distinct(sel: torch.Tensor) -> torch.Tensor:  # sorted, repeats and -1 as -1
        ordered = sel.sort(dim=-1).values
        repeat = torch.zeros_like(ordered, dtype=torch.bool)
        repeat[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
        return torch.where(repeat, torch.full_like(ordered, -1), ordered)

    da, db = distinct(a), distinct(b).sort(dim=-1).values.contiguous()
    size_a, size_b = (da >= 0).sum(dim=-1), (db >= 0).sum(dim=-1)
    at = torch.searchsorted(db, da.contiguous()).clamp(max=db.shape[1] - 1)
    shared = ((db.gather(1, at) == da) & (da >= 0)).sum(dim=-1)
    union = size_a + size_b - shared
    ratio = torch.where(union > 0, shared.double() / union.clamp(min=1).double(), torch.ones_like(union).double())
    return float(ratio.mean())
