"""Notebook 01's explorer: pick a vLLM release, a platform, next_n and a small batch;
see the decode path vLLM takes and why, the metadata each strategy hands the kernel,
and the KV blocks and bytes each strategy reads."""

from __future__ import annotations

import ipywidgets as widgets
from IPython.display import Markdown, display

from dsa_lab.analysis.headline import strategy_reads
from dsa_lab.analysis.readings import decision_reading
from dsa_lab.batch.workload import DecodeBatch, random_inputs, with_padding
from dsa_lab.explorers.base import dropdown, explore, show_figure
from dsa_lab.plots.metadata import plot_block_tables, plot_context_lens
from dsa_lab.policy.query import FAMILY_LABELS
from dsa_lab.policy.vllm import POLICIES, RELEASES, Platform, PolicyQuery, vllm_native_sizes

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
    try:
        return with_padding(DecodeBatch(seq_lens, decode_lens, next_n), padding_requests, padding_tokens)
    except ValueError as err:  # named in the editor's words: the boxes the user typed into
        raise ValueError(f"context lengths={context_text!r}, decode lengths={decode_text!r}: {err}") from None


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
        ),
        "decode_text": widgets.Text(
            value="all", description="decode lengths ('all' = next_n each)", style={"description_width": "initial"}
        ),
        "padding_requests": widgets.IntSlider(
            value=1, min=0, max=3, description="padding requests", style={"description_width": "initial"}
        ),
        "padding_tokens": widgets.IntSlider(
            value=0, min=0, max=4, description="padding tokens", style={"description_width": "initial"}
        ),
    }

    def draw(
        release: str,
        family: str,
        deep_gemm: bool,
        next_n: int,
        context_text: str,
        decode_text: str,
        padding_requests: int,
        padding_tokens: int,
    ) -> None:
        platform = Platform(family, deep_gemm)
        batch = editor_batch(context_text, decode_text, next_n, padding_requests, padding_tokens)
        display(Markdown(decision_reading(release, platform, batch)))
        table = random_inputs(batch, seed=0).cache.block_table
        costs = strategy_reads(batch, table, vllm_native_sizes(platform))
        display(
            Markdown(
                f"KV read per strategy for `{batch.describe()}` (atom pieces from the platform's native "
                f"sizes {vllm_native_sizes(platform)}):"
            )
        )
        display(costs.style.format({"KV bytes read": "{:,.0f} B", "× native bytes": "{:.2f}×"}, escape="html"))
        taken = f"{RELEASES[release][0]} on {FAMILY_LABELS[family]}{'' if deep_gemm else ' without DeepGEMM'}: " + (
            POLICIES[release](PolicyQuery(platform, next_n)).path
        )
        show_figure(plot_block_tables(batch, table, taken))
        show_figure(plot_context_lens(batch, table))

    rows = [
        ["release", "family", "deep_gemm", "next_n"],
        ["context_text", "decode_text"],
        ["padding_requests", "padding_tokens"],
    ]
    explore("Decode-path explorer", controls, draw, probe="release", interactive=interactive, rows=rows)
