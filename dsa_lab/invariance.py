"""Do native, flatten and atom give the same decode step? One table, one tolerance, one verdict.

The strategies only regroup query rows into launches, so every real token must get the
same context, the same logits on its valid positions and the same top-k whatever the
strategy. `compare_strategies` measures that against a baseline strategy,
`tolerance_for` says how close the logits must be for a backend, and `check_agreement`
turns the table into a sentence or a `StrategiesDisagree` that says what differed.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import torch

from dsa_lab.decode import DecodeResult
from dsa_lab.kernels import get_backend
from dsa_lab.topk import compare_selections

GPU_RELATIVE_TOLERANCE = 1e-5
"""Max |logit difference| between strategies, relative to the largest |logit|, for other
backends. A GPU kernel's float32 accumulation order may follow the launch shape (split-K,
tile sizes, row count), so one token's row may round differently in different launches.
Float32 accumulation at D = 128, H = 64 lands about 3e-7 of the largest |logit| from the
exact value (the earlier float32 reference did), so 1e-5 leaves a wide margin, while a
row given a wrong context or wrong keys is off by O(1) of it."""

LOGITS_COLUMN = "max |diff| on valid positions"


class StrategiesDisagree(ValueError):
    """A strategy's decode step differs from the baseline's; the message says how."""


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor) -> float:
    """Largest |a - b| over `valid`; NaN anywhere, or infinities that differ, count as NaN or inf."""
    x, y = a[valid].double(), b[valid].double()
    if x.numel() == 0:
        return 0.0
    diff = torch.where(x == y, torch.zeros_like(x), (x - y).abs())  # equal infinities: 0, not NaN
    return float("nan") if bool(diff.isnan().any()) else float(diff.max())


def compare_strategies(results: Mapping[str, DecodeResult], baseline: str = "native") -> pd.DataFrame:
    """One row per strategy, compared with `results[baseline]` on the baseline's valid positions.

    Columns: launches, kernel rows, context lens equal, max |diff| on valid positions (NaN
    if either side has a NaN there), top-k rows equal (tie-aware, `topk.compare_selections`),
    token rows, top-k max score gap, top-k equal. `table.attrs` keeps the baseline's name,
    its valid-position count and its largest |logit| (the scale of `tolerance_for`).
    """
    if baseline not in results:
        raise ValueError(f"baseline={baseline!r}: not among the results {tuple(results)}")
    base = results[baseline]
    width = base.logits.shape[1]
    valid = torch.arange(width, device=base.logits.device)[None, :] < base.context_lens[:, None]
    rows = []
    for strategy, result in results.items():
        if result.logits.shape != base.logits.shape:
            raise ValueError(
                f"results[{strategy!r}]: logits {tuple(result.logits.shape)}, the baseline "
                f"{baseline!r} has {tuple(base.logits.shape)}; compare results of one decode step"
            )
        agreement = compare_selections(result.indices, base.indices, base.logits)
        rows.append(
            {
                "strategy": strategy,
                "launches": len(result.metadata.launches),
                "kernel rows": result.metadata.kernel_rows,
                "context lens equal": torch.equal(result.context_lens, base.context_lens),
                LOGITS_COLUMN: _max_abs_diff(result.logits, base.logits, valid),
                "top-k rows equal": agreement.rows_equal,
                "token rows": agreement.rows,
                "top-k max score gap": agreement.max_score_gap,
                "top-k equal": agreement.equal,
            }
        )
    table = pd.DataFrame(rows).set_index("strategy")
    table.attrs["baseline"] = baseline
    table.attrs["valid positions"] = int(valid.sum())
    table.attrs["scale"] = float(base.logits[valid].abs().max()) if bool(valid.any()) else 0.0
    return table


def tolerance_for(backend: str, scale: float) -> float:
    """Allowed max |logit diff| between strategies: 0.0 for a backend that declares itself batch invariant
    (`LogitsBackend.batch_invariant`: a row's logits never depend on the launch it shares, bit for bit, on
    any device, as the reference's exact sums make them), else `GPU_RELATIVE_TOLERANCE` x `scale` (the
    largest |logit|)."""
    invariant = get_backend(backend).batch_invariant  # an unknown name raises, naming the registered ones
    if not (isinstance(scale, (int, float)) and 0 <= scale < float("inf")):
        raise ValueError(f"scale={scale!r}: must be a finite number >= 0 (the largest |logit|)")
    return 0.0 if invariant else GPU_RELATIVE_TOLERANCE * float(scale)


def check_agreement(table: pd.DataFrame, tolerance: float) -> str:
    """A one-sentence verdict on a `compare_strategies` table, or `StrategiesDisagree`.

    Context lens are checked first (a wrong context makes the logits incomparable), then
    the logits against `tolerance`, then the top-k; the first failure is raised in words.
    """
    if not (isinstance(tolerance, (int, float)) and 0 <= tolerance < float("inf")):
        raise ValueError(f"tolerance={tolerance!r}: must be a finite number >= 0")
    baseline = table.attrs.get("baseline", "the baseline")
    for strategy, row in table.iterrows():
        if not row["context lens equal"]:
            raise StrategiesDisagree(
                f"strategy {strategy!r} gives different context lens from {baseline!r}: "
                f"its rows do not see their tokens' causal contexts (context lens, not logits, differ)"
            )
        diff = float(row[LOGITS_COLUMN])
        if not diff <= tolerance:  # NaN fails too
            raise StrategiesDisagree(
                f"strategy {strategy!r} disagrees with {baseline!r} on the logits: max |diff| on "
                f"valid positions is {diff:.6g}, above the tolerance {tolerance:.6g}"
            )
        if not row["top-k equal"]:
            raise StrategiesDisagree(
                f"strategy {strategy!r} picks a different top-k from {baseline!r} in "
                f"{row['token rows'] - row['top-k rows equal']} of {row['token rows']} token rows "
                f"(largest selected-score gap {row['top-k max score gap']:.6g}; logits within the "
                f"tolerance {tolerance:.6g}, max |diff| {diff:.6g})"
            )
    worst = float(table[LOGITS_COLUMN].max()) if len(table) else 0.0
    rows = int(table["token rows"].iloc[0]) if len(table) else 0
    return (
        f"All {len(table)} strategies ({', '.join(map(str, table.index))}) agree with {baseline!r}: "
        f"same context lens, logits within {tolerance:g} (max |diff| {worst:g}) on all "
        f"{table.attrs.get('valid positions', '?')} valid positions, and the same top-k in all {rows} token rows."
    )
