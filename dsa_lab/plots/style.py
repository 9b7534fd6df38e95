"""One look for every chart: strategy ↔ colour, backend ↔ marker and line style."""

from __future__ import annotations

STRATEGY_COLORS = {"native": "#1f77b4", "atom": "#2ca02c", "flatten": "#d62728"}
BACKEND_MARKERS = {"deepgemm": "o", "triton": "s", "reference": "^"}
BACKEND_LINESTYLES = {"deepgemm": "-", "triton": "--", "reference": ":"}
VLLM_MARKER = {"marker": "D", "color": "black", "s": 70, "zorder": 5}


def series_style(strategy: str, backend: str) -> dict[str, object]:
    """matplotlib keyword arguments for the line of one (strategy, backend) series."""
    return {
        "color": STRATEGY_COLORS.get(strategy, "#7f7f7f"),
        "marker": BACKEND_MARKERS.get(backend, "x"),
        "linestyle": BACKEND_LINESTYLES.get(backend, "-."),
    }
