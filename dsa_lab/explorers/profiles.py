"""Notebook 04's explorer: one configuration's kernel timeline and its Nsight Compute counters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from IPython.display import Markdown, display

from dsa_lab.analysis.profiles import tensor_column
from dsa_lab.explorers.base import dropdown, explore, show_figure
from dsa_lab.plots.profiles import plot_kernel_timeline

COUNTERS = ("duration_ns", "dram_read_per_unique", "l2_hit_pct", "effective_tbps", "useful_tflops")


def profile_explorer(run: object, caption: str, interactive: bool = True) -> None:
    """Backend, batch and next_n of a profile run → its timeline and counters per strategy."""
    kernels = run.kernels
    if kernels.empty:
        raise ValueError(f"profile run {getattr(run, 'path', '')}: no torch.profiler tables to explore")
    backends = sorted(kernels["backend"].unique())
    batches = sorted(int(b) for b in kernels["batch"].unique())
    next_ns = sorted(int(n) for n in kernels["next_n"].unique())
    controls = {
        "backend": dropdown("backend", ["all", *backends], "all", "200px"),
        "batch": dropdown("batch", batches, batches[-1], "150px"),
        "next_n": dropdown("next_n", next_ns, 4 if 4 in next_ns else next_ns[-1], "130px"),
    }
    summary = run.ncu_summary

    def allowed(values: Mapping[str, Any]) -> dict[str, list[int]]:
        """The batches the chosen backend was profiled at, and the next_n profiled at that batch."""
        chosen = kernels if values["backend"] == "all" else kernels[kernels["backend"] == values["backend"]]
        at_batch = chosen[chosen["batch"] == values["batch"]]
        return {
            "batch": sorted(int(b) for b in chosen["batch"].unique()),
            "next_n": sorted(int(n) for n in at_batch["next_n"].unique()),
        }

    def draw(backend: str, batch: int, next_n: int) -> None:
        chosen = kernels if backend == "all" else kernels[kernels["backend"] == backend]
        show_figure(plot_kernel_timeline(chosen, caption, batch, next_n))
        if summary.empty:
            display(Markdown("*No Nsight Compute counters in this run.*"))
            return
        rows = summary[(summary["batch"] == batch) & (summary["next_n"] == next_n)]
        if backend != "all":
            rows = rows[rows["backend"] == backend]
        shown = [c for c in ("backend", "strategy", *COUNTERS, tensor_column(summary)) if c in rows]
        display(Markdown(f"Nsight Compute, logits kernels of one step (B={batch}, next_n={next_n}):"))
        display(rows[shown].set_index(["backend", "strategy"]).style.format(precision=3, escape="html"))

    explore("Profile explorer", controls, draw, probe="next_n", interactive=interactive, allowed=allowed)
