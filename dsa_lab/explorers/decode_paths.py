"""Notebook 01's explorer: pick a vLLM release, a platform, next_n and a small batch;
see the decode path vLLM takes and why, the metadata each strategy hands the kernel,
and the KV blocks and bytes each strategy reads."""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import Markdown, display

from dsa_lab.cache import bytes_per_token
from dsa_lab.explorers.base import dropdown, explore
from dsa_lab.metadata import STRATEGIES, build_metadata
from dsa_lab.plots.metadata import blocks_read, plot_block_tables, plot_context_lens
from dsa_lab.policy import POLICIES, RELEASES, Platform, PolicyQuery, step_path, supports_native_decode
from dsa_lab.workload import MAX_NEXT_N, DecodeBatch, random_inputs, with_padding

FAMILY_LABELS = {
    "sm90": "Hopper SM90 (H100, H200)",
    "sm100": "Blackwell SM100 (B200, GB200)",
    "sm120": "SM120 (RTX PRO 6000)",
    "rocm": "ROCm (MI300)",
    "other": "other CUDA GPU or none",
}
MAX_REQUESTS = 8
MAX_DRAWN_CONTEXT = 4096  # longer contexts make block tables too wide to read


def parse_lengths(name: str, text: str, count: int | None = None) -> tuple[int, ...]:
    """'150, 70, 260' -> (150, 70, 260); refuses anything that is not whole numbers."""
    parts = [p.strip() for p in text.replace(";", ",").split(",") if p.strip()]
    if not parts:
        raise ValueError(f"{name}: empty; enter comma-separated whole numbers, e.g. 150, 70, 260")
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"{name}={text!r}: enter comma-separated whole numbers ≥ 0, e.g. 150, 70, 260")
    values = tuple(int(p) for p in parts)
    if count is not None and len(values) != count:
        raise ValueError(f"{name}={text!r}: {len(values)} values, one per request ({count}) needed")
    return values


def native_sizes(platform: Platform) -> tuple[int, ...]:
    """Row counts the platform's kernel takes natively: what atom cuts next_n into."""
    return tuple(n for n in range(1, MAX_NEXT_N + 1) if supports_native_decode(platform, n)) or (1,)


def editor_batch(
    context_text: str, decode_text: str, next_n: int, padding_requests: int, padding_tokens: int
) -> DecodeBatch:
    """The batch the editor describes; decode lengths 'all' means next_n rows for every request."""
    seq_lens = parse_lengths("context lengths", context_text)
    if len(seq_lens) > MAX_REQUESTS or max(seq_lens) > MAX_DRAWN_CONTEXT:
        raise ValueError(
            f"context lengths={context_text!r}: the explorer draws up to {MAX_REQUESTS} requests of at most "
            f"{MAX_DRAWN_CONTEXT} tokens"
        )
    if decode_text.strip().lower() == "all":
        decode_lens = tuple(min(next_n, length) for length in seq_lens)
    else:
        decode_lens = parse_lengths("decode lengths", decode_text, len(seq_lens))
    return with_padding(DecodeBatch(seq_lens, decode_lens, next_n), padding_requests, padding_tokens)


def strategy_costs(batch: DecodeBatch, table: torch.Tensor, platform: Platform) -> pd.DataFrame:
    """Launches, kernel rows, KV blocks and bytes read per strategy for `batch`."""
    block_bytes = batch.block_size * bytes_per_token(batch.head_dim, batch.cache_dtype)
    rows = []
    for strategy in STRATEGIES:
        metadata = build_metadata(strategy, batch, table, native_sizes(platform))
        blocks = blocks_read(metadata, batch.block_size)
        rows.append({"strategy": strategy, "launches": len(metadata.launches), "kernel rows": metadata.kernel_rows,
                     "KV blocks read": blocks, "KV bytes read": blocks * block_bytes})  # fmt: skip
    frame = pd.DataFrame(rows).set_index("strategy")
    frame["× native bytes"] = (frame["KV bytes read"] / frame.loc["native", "KV bytes read"]).round(2)
    return frame


def describe_decision(release: str, platform: Platform, batch: DecodeBatch) -> str:
    """One paragraph: the path the release takes for this batch, and vLLM's reason."""
    version, detail = RELEASES[release]
    decision = POLICIES[release](PolicyQuery(platform, batch.next_n))
    text = (f"**{version}** ({detail}) on **{FAMILY_LABELS[platform.family]}**"
            f"{' with' if platform.has_deep_gemm else ' without'} DeepGEMM, next_n = {batch.next_n}: "
            f"**{decision.path}**. Why: {decision.reason}.")  # fmt: skip
    if release == "vllm_0_33_0" and decision.path != "rejected":
        step = step_path(PolicyQuery(platform, batch.next_n), batch.max_decode_len)
        if step != decision.path:
            text += (f" This step's longest request decodes {batch.max_decode_len} rows, so vLLM 0.33 takes "
                     f"**{step}** for it (the per-step rule).")  # fmt: skip
    return text


def decode_path_explorer(interactive: bool = True) -> None:
    """Release × platform × next_n × a small batch → decision, metadata drawings, bytes per strategy."""
    controls = {
        "release": dropdown(
            "vLLM release", [(version, name) for name, (version, _) in RELEASES.items()], "vllm_0_33_0"
        ),
        "family": dropdown("platform", [(label, family) for family, label in FAMILY_LABELS.items()], "sm90", "300px"),
        "deep_gemm": widgets.Checkbox(value=True, description="DeepGEMM present"),
        "next_n": dropdown("next_n", list(range(1, 9)), 3, "130px"),
        "context_text": widgets.Text(
            value="150, 70, 260", description="context lengths", style={"description_width": "initial"}
        ),  # fmt: skip
        "decode_text": widgets.Text(
            value="all", description="decode lengths ('all' = next_n each)", style={"description_width": "initial"}
        ),  # fmt: skip
        "padding_requests": widgets.IntSlider(
            value=1, min=0, max=3, description="padding requests", style={"description_width": "initial"}
        ),  # fmt: skip
        "padding_tokens": widgets.IntSlider(
            value=0, min=0, max=4, description="padding tokens", style={"description_width": "initial"}
        ),  # fmt: skip
    }

    def draw(release: str, family: str, deep_gemm: bool, next_n: int, context_text: str, decode_text: str,
             padding_requests: int, padding_tokens: int) -> None:  # fmt: skip
        platform = Platform(family, deep_gemm)
        batch = editor_batch(context_text, decode_text, next_n, padding_requests, padding_tokens)
        display(Markdown(describe_decision(release, platform, batch)))
        table = random_inputs(batch, seed=0).cache.block_table
        costs = strategy_costs(batch, table, platform)
        display(Markdown(f"KV read per strategy for `{batch.describe()}` (atom pieces from the platform's native "
                         f"sizes {native_sizes(platform)}):"))  # fmt: skip
        display(costs.style.format({"KV bytes read": "{:,.0f} B", "× native bytes": "{:.2f}×"}))
        plot_block_tables(batch, table)
        plt.show()
        plot_context_lens(batch, table)
        plt.show()

    rows = [["release", "family", "deep_gemm", "next_n"], ["context_text", "decode_text"],
            ["padding_requests", "padding_tokens"]]  # fmt: skip
    explore("Decode-path explorer", controls, draw, probe="release", interactive=interactive, rows=rows)
