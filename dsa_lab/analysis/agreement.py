"""Notebook 01's invariant as a section: one decode step run by every strategy on one backend, the
table of how they differ (`invariance.compare_strategies`, with the KV blocks each reads), the check
(`invariance.check_agreement` at the backend's `tolerance_for`) and its reading in words."""

from __future__ import annotations

import pandas as pd

from dsa_lab.analysis.headline import blocks_read
from dsa_lab.batch.workload import DecodeInputs
from dsa_lab.decode import run_decode
from dsa_lab.invariance import LOGITS_COLUMN, check_agreement, compare_strategies, tolerance_for

BLOCKS_COLUMN = "KV blocks read"


def strategy_table(inputs: DecodeInputs, backend: str, topk: int) -> pd.DataFrame:
    """Native, flatten and atom of one step on `backend`, compared with native (`compare_strategies`:
    its `attrs` kept), and the KV blocks each strategy's launches read."""
    results = {strategy: run_decode(inputs, strategy, backend, topk=topk) for strategy in ("native", "flatten", "atom")}
    table = compare_strategies(results)
    table[BLOCKS_COLUMN] = [blocks_read(results[s].metadata, inputs.batch.block_size) for s in table.index]
    return table


def checked_tolerance(table: pd.DataFrame, backend: str) -> float:
    """The tolerance `backend` is held to on this table, once the table meets it (`StrategiesDisagree`
    otherwise, naming the strategy that differs and by how much)."""
    tolerance = tolerance_for(backend, table.attrs["scale"])
    check_agreement(table, tolerance)
    return tolerance


def agreement_reading(table: pd.DataFrame, tolerance: float, topk: int, token_rows: int) -> str:
    """Markdown: the strategies agree on every valid logit and top-k row, and what flatten and atom read for it."""
    flatten_blocks, native_blocks = table.loc["flatten", BLOCKS_COLUMN], table.loc["native", BLOCKS_COLUMN]
    return (
        f"All three strategies agree on all {table.attrs['valid positions']} valid logits "
        f"(max |diff| = {table[LOGITS_COLUMN].max():g}, tolerance {tolerance:g}) and on the "
        f"top-{topk} of every one of the {token_rows} token rows. Flatten gets there by reading "
        f"{flatten_blocks} KV blocks where native reads {native_blocks} "
        f"({flatten_blocks / native_blocks:.1f}x); atom reads {table.loc['atom', BLOCKS_COLUMN]} "
        f"in {table.loc['atom', 'launches']} launch(es)."
    )
