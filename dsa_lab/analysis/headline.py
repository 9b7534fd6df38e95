"""The numbers of the tour (notebook 00): KV-tile reads, modeled bytes, the headline table.

Three small questions, each answered from the project's own code rather than a formula
written again here:

- *How often is each KV tile read?* `tile_reads` builds one request's native, atom or
  flatten metadata (`dsa_lab.batch.metadata`) and counts, per query row and tile, which read
  of that tile serves the row.
- *How many bytes does a step move?* `modeled_bytes` asks the launch plan
  (`dsa_lab.batch.plan.LaunchPlan.cost`) per strategy and next_n; every row says `modeled`.
- *What did the H200 measure?* `headline_table` reads a run's results at one (batch,
  context): what vLLM 0.33 takes on SM90 + DeepGEMM (`analysis.frames.vllm_path`) beside
  the fastest option timed (`analysis.frames.best_option`, over every backend);
  `headline_section` hands the tour that table with the point it shows and its notes.

Drawing lives in `dsa_lab.plots.tour`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from dsa_lab import kernels
from dsa_lab.analysis.frames import POINT, SM90_DEEPGEMM, by_point, measured_ok, one_view, recommend, vllm_choice
from dsa_lab.analysis.labels import pieces_title
from dsa_lab.analysis.modeled import SM90_NATIVE_SIZES
from dsa_lab.analysis.versus import pick_point
from dsa_lab.batch.cache import bytes_per_token
from dsa_lab.batch.metadata import STRATEGIES, DecodeMetadata, build_metadata, plan_atoms
from dsa_lab.batch.plan import LaunchPlan
from dsa_lab.batch.workload import MAX_NEXT_N, ContextSpec, DecodeBatch
from dsa_lab.errors import check_choice, check_range
from dsa_lab.markup import md_code, md_text
from dsa_lab.model.indexer import BLOCK_TOKENS  # tokens per KV block (tile) of the paged cache
from dsa_lab.policy.vllm import Platform

TOUR_STRATEGIES = ("native", "atom", "flatten")


# ---------------------------------------------------------------- which run


def vllm_backend(results: pd.DataFrame, preferred: str | None = None) -> tuple[str, str | None]:
    """The backend whose times stand for vLLM's path: `preferred` (default: what vLLM runs,
    `kernels.vllm_backend`) when it was timed, else the most-timed backend, with a note saying so."""
    preferred = kernels.vllm_backend().name if preferred is None else preferred
    timed = measured_ok(results)["backend"].value_counts()
    if timed.empty:
        raise ValueError("results: no measured rows with status 'ok'")
    if preferred in timed.index:
        return preferred, None
    chosen = str(timed.index[0])
    return chosen, (
        f"Backend `{preferred}` (what vLLM runs) was not timed in this run; vLLM's strategy is shown "
        f"with `{chosen}`'s times (timed: {', '.join(map(str, timed.index))})."
    )


# ---------------------------------------------------------------- KV-tile reads


@dataclass(frozen=True)
class TileReads:
    """One request of `tiles` KV tiles and `next_n` query rows under one strategy.

    `grid[j, t]` is which read of tile t (1, 2, ...) the kernel row scoring query row j
    uses, 0 where the tile lies beyond the row's context. `groups` lists, per kernel row
    group (one read of the request's tiles), the query rows it scores.
    """

    strategy: str
    next_n: int
    grid: np.ndarray
    groups: tuple[tuple[int, ...], ...]
    launches: int
    tile_reads: int  # tiles streamed from memory in all launches (padding rows' groups included)
    label: str


def pieces_label(next_n: int, native_sizes: Sequence[int] = SM90_NATIVE_SIZES) -> str:
    """How atom splits next_n: '4+2', '4 (1 padding row)' for 3 with sizes {1, 2, 4}."""
    pieces = plan_atoms(next_n, native_sizes)
    pad = -min(0, pieces[0].offset)
    text = "+".join(str(p.size) for p in pieces)
    return text + (f" ({pad} padding row{'s' if pad > 1 else ''})" if pad else "")


def tile_reads(
    strategy: str, next_n: int = 6, tiles: int = 5, native_sizes: Sequence[int] = SM90_NATIVE_SIZES
) -> TileReads:
    """Count KV-tile reads of one request from the metadata the strategy builds.

    Every kernel row group (a request row of a native/atom launch, a pseudo-request of
    flatten) streams its block-table row once, up to its longest context, and scores all
    its query rows with that read.
    """
    check_choice("strategy", strategy, STRATEGIES)
    tiles = check_range("tiles", tiles, 1, 64)
    next_n = check_range("next_n", next_n, 1, MAX_NEXT_N)
    seq_len = tiles * BLOCK_TOKENS
    batch = DecodeBatch(seq_lens=(seq_len,), decode_lens=(next_n,), next_n=next_n)
    table = torch.arange(tiles, dtype=torch.int32)[None, :]
    metadata = build_metadata(strategy, batch, table, native_sizes)
    grid = np.zeros((next_n, tiles), dtype=int)
    read_count = np.zeros(tiles, dtype=int)
    groups: list[tuple[int, ...]] = []
    for launch in metadata.launches:
        per_group = zip(launch.token_rows.tolist(), launch.context_lens.tolist(), launch.block_table.tolist())
        for rows, contexts, blocks in per_group:
            streamed = blocks[: -(-max(contexts) // BLOCK_TOKENS)]
            read_count[streamed] += 1
            for row, context in zip(rows, contexts):
                if row >= 0:
                    seen = blocks[: -(-context // BLOCK_TOKENS)]
                    grid[row, seen] = read_count[seen]
            groups.append(tuple(row for row in rows if row >= 0))
    label = {"native": "native", "flatten": "flatten", "atom": f"atom {pieces_label(next_n, native_sizes)}"}[strategy]
    return TileReads(strategy, next_n, grid, tuple(groups), len(metadata.launches), int(read_count.sum()), label)


def blocks_read(metadata: DecodeMetadata, block_size: int) -> int:
    """KV blocks the launches stream: once per kernel row-group (request), for its longest row."""
    total = 0
    for launch in metadata.launches:
        longest = launch.context_lens.max(dim=1).values.long()
        total += int(((longest + block_size - 1) // block_size).sum())
    return total


def strategy_reads(batch: DecodeBatch, table: torch.Tensor, native_sizes: Sequence[int]) -> pd.DataFrame:
    """Launches, kernel rows, KV blocks and bytes read per strategy for `batch` (atom in `native_sizes`)."""
    block_bytes = batch.block_size * bytes_per_token(batch.head_dim, batch.cache_dtype)
    rows = []
    for strategy in STRATEGIES:
        metadata = build_metadata(strategy, batch, table, native_sizes)
        blocks = blocks_read(metadata, batch.block_size)
        rows.append(
            {
                "strategy": strategy,
                "launches": len(metadata.launches),
                "kernel rows": metadata.kernel_rows,
                "KV blocks read": blocks,
                "KV bytes read": blocks * block_bytes,
            }
        )
    frame = pd.DataFrame(rows).set_index("strategy")
    frame["× native bytes"] = (frame["KV bytes read"] / frame.loc["native", "KV bytes read"]).round(2)
    return frame


# ---------------------------------------------------------------- modeled bytes


def modeled_bytes(
    batch: int = 128,
    context: str | int = 65536,
    next_ns: Sequence[int] = range(1, 9),
    seed: int = 0,
    native_sizes: Sequence[int] = SM90_NATIVE_SIZES,
    heads: int = 64,
    head_dim: int = 128,
    cache_dtype: str = "fp8",
) -> pd.DataFrame:
    """Bytes one decode step moves per strategy and next_n, from the launch plan (`plan.LaunchPlan.cost`; source 'modeled').

    `context` is a length (65536, '64K') or 'mixed:MIN-MAX' (lengths drawn with `seed`, as a
    sweep draws them). native: a kernel native for every next_n (our Triton kernel; DeepGEMM
    on SM100); atom: pieces of `native_sizes` (SM90 DeepGEMM's by default); flatten: a row per
    query token. `vllm_0_33` marks the strategy vLLM 0.33 runs on SM90 + DeepGEMM.
    """
    check_range("batch", batch, 1, 1 << 20)
    seq_lens = ContextSpec.parse(context).seq_lens(batch, seed)
    rows = []
    for n in next_ns:
        n = check_range("next_n", n, 1, MAX_NEXT_N)
        shapes = {"native": f"[B, {n}]", "flatten": f"[B·{n}, 1]"}  # the rows a launch sees
        for strategy in TOUR_STRATEGIES:
            cost = LaunchPlan(seq_lens, n, strategy, heads, head_dim, cache_dtype, tuple(native_sizes)).cost
            rows.append(
                {
                    "next_n": n,
                    "strategy": strategy,
                    "pieces": pieces_label(n, native_sizes) if strategy == "atom" else shapes[strategy],
                    "launches": cost.launches,
                    "kv_bytes": cost.strategy_kv_bytes,
                    "bytes": cost.strategy_bytes,
                    "unique_bytes": cost.unique_bytes,
                    "vllm_0_33": vllm_choice(n) == strategy,
                    "source": "modeled",
                    "heads": heads,
                    "head_dim": head_dim,
                    "cache_dtype": cache_dtype,
                    "bytes_per_token": bytes_per_token(head_dim, cache_dtype),
                }
            )
    frame = pd.DataFrame(rows)
    native = frame[frame["strategy"] == "native"].set_index("next_n")["bytes"]
    frame["vs_native"] = frame["bytes"] / frame["next_n"].map(native)
    return frame


def bytes_reading(frame: pd.DataFrame) -> str:
    """Markdown from `modeled_bytes`: what each strategy moves at the largest next_n, against native."""
    top = frame[frame["next_n"] == frame["next_n"].max()].set_index("strategy")
    n = int(frame["next_n"].max())
    native_gb = top.loc["native", "bytes"] / 1e9
    parts = [f"At next_n = {n} (modeled): native moves {native_gb:.2f} GB per step"]
    for strategy in ("atom", "flatten"):
        if strategy in top.index:
            row = top.loc[strategy]
            pieces = f" ({row['pieces']})" if strategy == "atom" else ""
            parts.append(f"{strategy}{pieces} {row['bytes'] / 1e9:.2f} GB ({row['vs_native']:.1f}× native)")
    reads = {s: top.loc[s, "kv_bytes"] / top.loc["native", "kv_bytes"] for s in ("atom", "flatten") if s in top.index}
    said = " and ".join(f"{s} {r:.0f} times" for s, r in reads.items())
    return (
        ", ".join(parts) + ". All strategies move the same queries, weights and logits; the difference is the KV "
        f"cache, which native reads once{', ' + said if said else ''}."
    )


# ---------------------------------------------------------------- the headline table


HEADLINE_COLUMNS = [
    "next_n",
    "vllm_strategy",
    "vllm_backend",
    "vllm_us",
    "best_strategy",
    "best_backend",
    "best_pieces",
    "best_us",
    "speedup",
    "beyond_spread",
    "floor_us",
    "floor_bound",
]


def headline_table(
    results: pd.DataFrame, batch: int, context: str, vllm_backend: str | None = None, platform: Platform = SM90_DEEPGEMM
) -> pd.DataFrame:
    """Per next_n at one (batch, context) of a run: what vLLM 0.33 takes on `platform` (its
    strategy, timed on `vllm_backend`), the fastest option measured (strategy and backend, any
    backend; `frames.recommend`, whose native twins never count), and `speedup` = vLLM's time / the
    best (> 1: vLLM leaves time on the table).

    `beyond_spread` is True when vLLM's 25th percentile lies above the best option's 75th (only then
    is the best option recommended over vLLM's choice).
    `floor_us` is the point's time floor, modeled: its unique bytes (KV read once) or its
    FLOPs at the run's ceilings, whichever takes longer (`floor_bound`: memory or compute;
    NaN where the run has no ceilings for its device). Only measured rows with status 'ok'
    count; raises ValueError when the point has none.
    """
    data = measured_ok(results)
    data = data[(data["batch"] == batch) & (data["context"] == context)]
    if data.empty:
        everything = measured_ok(results)
        points = sorted(set(zip(everything["batch"].astype(int), everything["context"])))
        raise ValueError(
            f"batch={batch}, context={context!r}: no measured rows with status 'ok'; measured points: {points}"
        )
    backends = sorted(data["backend"].unique())
    vllm_backend = kernels.vllm_backend().name if vllm_backend is None else vllm_backend
    if vllm_backend not in backends:
        raise ValueError(f"vllm_backend={vllm_backend!r}: not timed at this point; allowed values are {backends}")
    table = recommend(data, backends, vllm_backend, platform)
    table["vllm_us"] = table["vllm_ms"] * 1e3
    table["best_us"] = table["best_ms"] * 1e3
    if "floor_ms" in data:
        floors = data.groupby(POINT, as_index=False)[["floor_ms", "floor_bound"]].first()
        table = table.merge(floors, on=POINT, how="left").assign(floor_us=lambda t: t["floor_ms"] * 1e3)
    else:
        table = table.assign(floor_us=np.nan, floor_bound=None)
    table["next_n"] = table["next_n"].astype(int)
    return by_point(table)[[*HEADLINE_COLUMNS, *(k for k in POINT if k not in HEADLINE_COLUMNS)]]


@dataclass(frozen=True)
class HeadlineSection:
    """The tour's headline section, ready to draw: the run's rows of one shape, the (batch, context)
    shown (the one asked for, or the nearest measured), the backend standing for vLLM and the table;
    `notes` say, in Markdown, each substitution made on the way (none when the run has what was asked)."""

    results: pd.DataFrame
    batch: int
    context: str
    vllm_backend: str
    table: pd.DataFrame
    notes: tuple[str, ...]


def headline_section(results: pd.DataFrame, batch: int, context: str) -> HeadlineSection:
    """The headline section of a run at (batch, context): `frames.one_view`, `versus.pick_point`,
    `vllm_backend`, then `headline_table`, each one's note kept in order."""
    shown, shape_note = one_view(results)  # a chart shows one shape and one serving setting
    point_batch, point_context, point_note = pick_point(shown, batch, context)
    backend, backend_note = vllm_backend(shown)
    table = headline_table(shown, point_batch, point_context, backend)
    notes = tuple(f"*{n}*" for n in (shape_note, point_note, backend_note) if n)
    return HeadlineSection(shown, point_batch, point_context, backend, table, notes)


def runs_named(run_ids: str) -> str:
    """'run `a`', or 'runs `a` and `b`' for 'a, b' (the runs a table's rows come from), as Markdown."""
    names = [md_code(run_id) for run_id in run_ids.split(", ")]
    return f"run {names[0]}" if len(names) == 1 else f"runs {', '.join(names[:-1])} and {names[-1]}"


def headline_reading(
    table: pd.DataFrame, device_label: str, run_id: str, batch: int, context: str, speedups: bool = True
) -> str:
    """Markdown: where vLLM's choice is the best option (within the spread), and where it is not, by how much;
    `run_id` names the run(s) the rows come from. Without `speedups` (a CPU's wall clock, whose drift between runs
    exceeds most gaps) the fastest option per next_n, and no ratio."""
    short = ContextSpec.parse(context).short
    if table.empty:
        return f"No next_n at B = {batch}, {short} has a timed decision in {runs_named(run_id)}."
    if not speedups:
        fastest = "; ".join(
            f"next_n = {row.next_n}: {md_text(row.best_strategy)} ({md_text(row.best_backend)}, {row.best_us:.0f} µs)"
            for row in table.itertuples()
        )
        return (
            f"**Wall-clock times on {md_text(device_label)}, {runs_named(run_id)}, B = {batch}, {short}** "
            f"(no speedups read from a CPU run). Fastest here: {fastest}."
        )
    timed = table.dropna(subset=["vllm_us", "best_us"])
    same = timed[~timed["beyond_spread"]]
    worse = timed[timed["beyond_spread"]]
    lines = [f"**Measured on {md_text(device_label)}, {runs_named(run_id)}, B = {batch}, context {short}.**"]
    if not same.empty:
        lines.append(
            f"- vLLM 0.33's choice is as fast as the best option (within the measured spread) at next_n = "
            f"{', '.join(map(str, same['next_n']))}."
        )
    for row in worse.itertuples():
        pieces = f" {pieces_title(row.best_pieces)}" if row.best_pieces else ""
        lines.append(
            f"- next_n = {row.next_n}: vLLM takes **{row.vllm_strategy}** ({row.vllm_us:.0f} µs); "
            f"**{row.best_strategy}{pieces}** on {md_text(row.best_backend)} takes {row.best_us:.0f} µs: "
            f"**{row.speedup:.2f}×** faster."
        )
    untimed = table[table["vllm_us"].isna()]
    if not untimed.empty:
        lines.append(
            f"- vLLM's strategy was not timed on {md_text(table['vllm_backend'].iloc[0])} at next_n = "
            f"{', '.join(map(str, untimed['next_n']))}."
        )
    return "\n".join(lines)
