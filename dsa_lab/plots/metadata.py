"""What flattening does to decode metadata, drawn for a small ragged batch.

Native keeps one block-table row per request and a `[B, n]` grid of context lens;
flatten gives every query token its own row, so block-table rows repeat and each
pseudo-request re-reads its request's KV blocks. Grey cells are not real work:
filler rows of ragged requests, CUDA-graph padding, and table slots nobody reads.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from dsa_lab.analysis.headline import blocks_read
from dsa_lab.batch.metadata import build_flatten_metadata, build_native_metadata
from dsa_lab.batch.workload import DecodeBatch

UNUSED_COLOR = "#d9d9d9"


def _native_labels(batch: DecodeBatch) -> list[str]:
    return [
        f"req {b} (padding)" if length == 0 else f"req {b}: L={length}, d={d}"
        for b, (length, d) in enumerate(zip(batch.seq_lens, batch.decode_lens))
    ]


def _flatten_labels(batch: DecodeBatch) -> list[str]:
    owners = batch.token_requests()
    labels = [f"tok {t} <- req {b}" for t, b in enumerate(owners)]
    labels += [f"tok {t} (padding)" for t in range(len(owners), batch.num_decode_tokens)]
    return labels


def _table_panel(
    ax: plt.Axes, table: torch.Tensor, reads: torch.Tensor, labels: list[str], title: str, vmax: int
) -> None:
    """Heatmap of physical block ids; slots beyond what a row reads are greyed."""
    ids = table.cpu().numpy()
    used = np.arange(ids.shape[1])[None, :] < reads.cpu().numpy()[:, None]
    ax.set_facecolor(UNUSED_COLOR)
    sns.heatmap(
        ids,
        mask=~used,
        annot=True,
        fmt="d",
        cmap="viridis",
        vmin=0,
        vmax=vmax,
        cbar=False,
        linewidths=0.5,
        linecolor="white",
        ax=ax,
        yticklabels=labels,
        annot_kws={"fontsize": 8},
    )
    ax.set_title(title)
    ax.set_xlabel("logical block slot")
    ax.tick_params(axis="y", labelrotation=0)


def plot_block_tables(batch: DecodeBatch, block_table: torch.Tensor, taken: str | None = None) -> Figure:
    """Native (one row per request) beside flatten (one row per query token, rows repeated); `taken`, a
    line under the title: which of them a release takes for this batch (the decode-path explorer's)."""
    native = build_native_metadata(batch, block_table)
    flatten = build_flatten_metadata(batch, block_table)
    bs = batch.block_size
    vmax = int(block_table.max())
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.45 * batch.num_decode_tokens + 2.2), constrained_layout=True)
    seq = torch.tensor(batch.seq_lens)
    _table_panel(
        left,
        native.launches[0].block_table,
        (seq + bs - 1) // bs,
        _native_labels(batch),
        f"native: {batch.batch_size} rows, one per request",
        vmax,
    )
    launch = flatten.launches[0]
    ctx = launch.context_lens[:, 0].cpu().long()
    _table_panel(
        right,
        launch.block_table,
        (ctx + bs - 1) // bs,
        _flatten_labels(batch),
        f"flatten: {batch.num_decode_tokens} rows, one per query token",
        vmax,
    )
    fig.suptitle(
        f"Block tables (physical block ids) for {batch.describe()}\n"
        f"KV blocks read: native {blocks_read(native, bs)}, flatten {blocks_read(flatten, bs)}"
        + (f"\n{taken}" if taken else "")
    )
    fig.legend(
        handles=[Patch(color=UNUSED_COLOR, label="not read (beyond context / padding)")],
        loc="lower center",
        bbox_to_anchor=(0.5, -0.04),
        frameon=False,
    )
    return fig


def _context_panel(
    ax: plt.Axes, context: torch.Tensor, real: torch.Tensor, labels: list[str], title: str, xlabels: list[str]
) -> None:
    """Heatmap of context lengths; filler and padding rows greyed but still labelled."""
    values = context.cpu().numpy()
    mask = ~real.cpu().numpy()
    ax.set_facecolor(UNUSED_COLOR)
    sns.heatmap(
        values,
        mask=mask,
        annot=True,
        fmt="d",
        cmap="crest",
        cbar=False,
        linewidths=0.5,
        linecolor="white",
        ax=ax,
        yticklabels=labels,
        xticklabels=xlabels,
        annot_kws={"fontsize": 8},
        vmin=0,
        vmax=max(1, int(values.max())),
    )
    for r, c in zip(*np.nonzero(mask)):  # greyed cells still show what the kernel is given
        ax.text(
            c + 0.5, r + 0.5, f"{values[r, c]}", ha="center", va="center", color="#777777", fontsize=8, style="italic"
        )
    ax.set_title(title)
    ax.tick_params(axis="y", labelrotation=0)


def plot_context_lens(batch: DecodeBatch, block_table: torch.Tensor) -> Figure:
    """Native `[B, n]` context grid (filler rows grey) beside flatten's per-token column (padding grey)."""
    native = build_native_metadata(batch, block_table).launches[0]
    flatten = build_flatten_metadata(batch, block_table).launches[0]
    fig, (left, right) = plt.subplots(
        1,
        2,
        figsize=(10, 0.45 * batch.num_decode_tokens + 2.2),
        gridspec_kw={"width_ratios": [max(2, native.next_n), 1.2]},
        constrained_layout=True,
    )
    _context_panel(
        left,
        native.context_lens,
        native.token_rows >= 0,
        _native_labels(batch),
        f"native: context_lens [B={native.batch_size}, n={native.next_n}]",
        [f"row {j}" for j in range(native.next_n)],
    )
    real_tokens = flatten.token_rows[:, 0] < batch.num_real_tokens
    _context_panel(
        right,
        flatten.context_lens,
        real_tokens[:, None],
        _flatten_labels(batch),
        f"flatten: context_lens [{flatten.batch_size}, 1]",
        ["row 0"],
    )
    fig.suptitle(f"Context lengths each kernel row sees, {batch.describe()}")
    fig.legend(
        handles=[Patch(color=UNUSED_COLOR, label="filler / padding row (grey italic: value the kernel still gets)")],
        loc="lower center",
        bbox_to_anchor=(0.5, -0.04),
        frameon=False,
    )
    return fig
