"""The harness: a point declared once, its plan, one input builder, one check, measured by timing or profilers.

`point` (axes, grid, presets, the CLI's list syntax), `inputs` (the one input builder),
`walk` (the grid loop), `check` (the one correctness measure), `timing` and `sweep` (the
timing mode), `guard` (per-point deadlines), `cli` (`dsa-lab bench` and `dsa-lab profile`).
The profiling modes live in `dsa_lab.profiling` and walk the same grid.
"""
