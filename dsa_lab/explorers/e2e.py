"""Notebook 05's explorer: pick a GPU, batch, context, next_n, strategy and acceptance curve;
see where the modeled decode step goes, the indexer's share and tokens per second."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from IPython.display import Markdown, display

from dsa_lab.analysis.e2e import CONTEXTS, LABELS, VLLM, IndexerTimes, step_row
from dsa_lab.analysis.labels import context_title
from dsa_lab.errors import check_choice
from dsa_lab.explorers.base import dropdown, explore, show_figure
from dsa_lab.kernels import vllm_backend
from dsa_lab.model.decode_step import ACCEPTANCE_PRESETS, tokens_per_step
from dsa_lab.model.gpus import ARCH_MAJORS, GPUS
from dsa_lab.plots.e2e import COMPONENT_COLORS, plot_step_breakdown


def e2e_explorer(times: IndexerTimes, interactive: bool = True) -> None:
    """GPU x batch x context x next_n x strategy x acceptance -> the step's parts, share, tokens/s."""
    controls = {
        "gpu": dropdown("GPU", list(GPUS), "B200", "160px"),
        "batch": dropdown("requests a GPU", [1, 16, 64, 128, 256], 64, "200px"),
        "context": dropdown("context", [(context_title(str(c)), c) for c in CONTEXTS], 65536, "160px"),
        "next_n": dropdown("next_n", [1, 2, 3, 4], 3, "130px"),
        "label": dropdown("indexer strategy", list(LABELS), VLLM, "260px"),
        "preset": dropdown("acceptance", list(ACCEPTANCE_PRESETS), "V4-Flash, 3 drafts, long text", "320px"),
    }

    def allowed(values: Mapping[str, Any]) -> dict[str, list[str]]:
        """Strategies with a launch at this next_n on this GPU; acceptance curves long enough for next_n."""
        point = (values["batch"], values["context"], values["next_n"])
        steps = {name: step_row(times, values["gpu"], name, *point)["step_us"] for name in LABELS}
        labels = [name for name, step_us in steps.items() if step_us == step_us]  # NaN: no such launch
        presets = [name for name, (rates, _) in ACCEPTANCE_PRESETS.items() if len(rates) >= values["next_n"] - 1]
        return {"label": labels, "preset": presets}

    def draw(gpu: str, batch: int, context: int, next_n: int, label: str, preset: str) -> None:
        check_choice("preset", preset, tuple(ACCEPTANCE_PRESETS))
        acceptance, source = ACCEPTANCE_PRESETS[preset]
        row = step_row(times, gpu, label, batch, context, next_n)  # a batch, context or next_n no step has: named
        accepted = tokens_per_step(acceptance, next_n)
        if row["step_us"] != row["step_us"]:
            raise ValueError(
                f"strategy={label!r}: no such launch for next_n={next_n} on {gpu} (SM90 {vllm_backend().label}: "
                f"{vllm_backend().native_sizes_on(ARCH_MAJORS['sm90'])})"
            )
        display(
            Markdown(
                f"**{row['step_us'] / 1e3:.2f} ms** a step (modeled), indexer **{row['indexer_share']:.0%}** of it "
                f"(its kernel {row['indexer_source']}); {accepted:.2f} tokens a request a step ({source}): "
                f"**{batch * accepted / row['step_us'] * 1e6:,.0f} tokens/s** a GPU."
            )
        )
        show_figure(plot_step_breakdown(pd.DataFrame([row]), list(COMPONENT_COLORS)))

    rows = [["gpu", "batch", "context"], ["next_n", "label", "preset"]]
    explore(
        "Decode-step explorer (modeled)",
        controls,
        draw,
        probe="gpu",
        interactive=interactive,
        rows=rows,
        allowed=allowed,
    )
