"""The decode path each vLLM release picks, as one heatmap.

Rows are release x platform (x deep_gemm, and fp4 / adaptive when those vary), columns
next_n; each cell shows the path: N native, F flatten, V varlen, - rejected at startup.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from dsa_lab.policy.query import PATHS, SYMBOLS
from dsa_lab.policy.vllm import RELEASES

PATH_COLORS = {"native": "#4c9f70", "flatten": "#e07b39", "varlen": "#4a7fb5", "rejected": "#8c8c8c"}
MATRIX_COLUMNS = ("policy", "platform", "deep_gemm", "next_n", "path")


def _row_label(row: pd.Series, extra: list[str]) -> str:
    release = RELEASES[row["policy"]][0] if row["policy"] in RELEASES else str(row["policy"])
    parts = [release, str(row["platform"]) + ("+dg" if row["deep_gemm"] else "")]
    parts += [name if row[name] else f"no {name}" for name in extra]
    return " | ".join(parts)


def policy_grid(matrix: pd.DataFrame) -> pd.DataFrame:
    """Pivot a `decision_matrix` to rows x next_n holding the index of the path in `PATHS`."""
    missing = [c for c in MATRIX_COLUMNS if c not in matrix.columns]
    if missing:
        raise ValueError(f"matrix: missing columns {missing}; need {MATRIX_COLUMNS}")
    unknown = sorted(set(matrix["path"]) - set(PATHS))
    if unknown:
        raise ValueError(f"matrix: path values {unknown}; allowed values are {PATHS}")
    extra = [c for c in ("fp4", "adaptive") if c in matrix.columns and matrix[c].nunique() > 1]
    labelled = matrix.assign(row=matrix.apply(_row_label, axis=1, extra=extra), code=matrix["path"].map(PATHS.index))
    order = list(dict.fromkeys(labelled["row"]))
    grid = labelled.pivot_table(index="row", columns="next_n", values="code", aggfunc="first")
    return grid.reindex(order).astype(float)


def _settings(matrix: pd.DataFrame) -> str:
    constant = [c for c in ("fp4", "adaptive") if c in matrix.columns and matrix[c].nunique() == 1]
    fixed = [f"{c}={matrix[c].iloc[0]}" for c in constant]
    return f" ({', '.join(fixed)})" if fixed else ""


def plot_policy_matrix(matrix: pd.DataFrame, title: str = "DSA indexer decode path by vLLM release") -> Figure:
    """Heatmap of `dsa_lab.policy.vllm.decision_matrix(...)`, one cell per row and next_n."""
    grid = policy_grid(matrix)
    fig, ax = plt.subplots(figsize=(5.5 + 0.5 * grid.shape[1], 1.3 + 0.32 * grid.shape[0]), constrained_layout=True)
    codes = grid.to_numpy()
    annot = np.vectorize(lambda c: "" if np.isnan(c) else SYMBOLS[PATHS[int(c)]])(codes)
    sns.heatmap(
        grid,
        annot=annot,
        fmt="",
        cmap=ListedColormap([PATH_COLORS[p] for p in PATHS]),
        vmin=-0.5,
        vmax=len(PATHS) - 0.5,
        linewidths=0.5,
        linecolor="white",
        ax=ax,
        cbar_kws={"ticks": list(range(len(PATHS))), "label": "decode path", "shrink": 0.5},
    )
    ax.collections[0].colorbar.set_ticklabels([f"{SYMBOLS[p]}: {p}" for p in PATHS])
    releases = [label.split(" | ")[0] for label in grid.index]
    for i in range(1, len(releases)):  # a rule between releases
        if releases[i] != releases[i - 1]:
            ax.axhline(i, color="black", linewidth=1.5)
    ax.set_xlabel("next_n (query rows per request)")
    ax.set_ylabel("vLLM release | platform (+dg = DeepGEMM present)")
    ax.set_title(title + _settings(matrix))
    return fig
