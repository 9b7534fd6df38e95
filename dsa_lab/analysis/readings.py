"""What the frames say, in words: the markdown readings under notebooks 02 and 03's charts.

Every number comes from the frame it reads (`frames.recommend` / `frames.decisions`,
`versus.kernel_comparison`, `frames.mixed_context_gap`); nothing is computed here that a frame
does not hold, and nothing is drawn. Names from a run (device, backend) are Markdown text
(`markup.md_text`), never live markup.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from dsa_lab.analysis import versus
from dsa_lab.analysis.frames import baseline_backends, measured_ok, path_backend
from dsa_lab.analysis.labels import baseline_label
from dsa_lab.batch.workload import ContextSpec, DecodeBatch
from dsa_lab.errors import check_choice
from dsa_lab.markup import md_code, md_text
from dsa_lab.model.indexer import BLOCK_TOKENS
from dsa_lab.model.roofline import GpuSpec
from dsa_lab.policy.query import FAMILY_LABELS
from dsa_lab.policy.steps import step_path
from dsa_lab.policy.vllm import POLICIES, RELEASES, Platform, PolicyQuery

DECISIONS_NAMED = 5  # the points where vLLM's choice loses most, named in words by `decisions_reading`


def _points(count: int) -> str:
    return f"{count} point{'' if count == 1 else 's'}"


def _short(label: str) -> str:
    return ContextSpec.parse(label).short


def decisions_reading(table: pd.DataFrame, device: str, backend: str) -> str:
    """A short markdown reading of `frames.decisions`: where vLLM's choice is kept (the fastest, or within
    the measured spread of it) and where a strategy beats it beyond the spread, by how much."""
    if table.empty:
        return f"No point on {md_text(device)} has a timed decision for backend {md_text(backend)}."
    known = table.dropna(subset=["vllm_ms"])
    beaten = known[known["beyond_spread"]].sort_values("speedup", ascending=False)
    tied = known[~known["beyond_spread"] & (known["best_strategy"] != known["vllm_strategy"])]
    sources = f"({' + '.join(sorted(table['source'].unique()))})"
    named = device if device.endswith(sources) else f"{device} {sources}"  # a modeled device's label says it already
    lines = [
        f"**{md_text(backend)} on {md_text(named)}**: {_points(len(table))} (next_n x batch x context). "
        f"vLLM 0.33's choice was timed in {len(known)}; it is kept in {len(known) - len(beaten)} of them "
        f"({len(tied)} where another strategy is faster only within the measured spread, a tie that keeps "
        f"vLLM's choice) and beaten beyond the spread in {len(beaten)}."
    ]
    missing = table[table["vllm_ms"].isna()]
    if not missing.empty:
        first = missing.iloc[0]
        lines.append(
            f"In {_points(len(missing))} vLLM's choice was not timed here (e.g. next_n={first['next_n']}: "
            f"'{first['vllm_strategy']}', timed: {first['options_timed']})."
        )
    for row in beaten.head(DECISIONS_NAMED).itertuples():
        lines.append(
            f"- next_n={row.next_n}, batch={row.batch}, context {_short(row.context)}: vLLM takes **{row.vllm_strategy}** "
            f"({row.vllm_ms * 1e3:.1f} µs); **{row.best_strategy}** takes {row.best_ms * 1e3:.1f} µs, "
            f"{row.speedup:.2f}x faster."
        )
    if len(beaten) > DECISIONS_NAMED:
        lines.append(f"- ... and {len(beaten) - DECISIONS_NAMED} more (see the table below).")
    per_n = beaten.groupby("next_n")["speedup"].agg(["count", "max"])
    if not per_n.empty:
        parts = [f"next_n={n}: {_points(int(r['count']))}, up to {r['max']:.2f}x" for n, r in per_n.iterrows()]
        lines.append("By next_n, where vLLM's choice loses: " + "; ".join(parts) + ".")
    return "\n".join(lines)


def comparison_reading(
    comparison: pd.DataFrame,
    batch: int,
    context: str,
    device: str,
    candidate: tuple[str, str],
    baseline: str | Sequence[str] | None = None,
) -> str:
    """Markdown: per next_n at (batch, context) the candidate's time, its speedups (the other's time over the
    candidate's: > 1, the candidate is faster) and share of the floor; then the whole run in one line. Every
    number comes from `comparison`; the baseline is named by `labels.baseline_label`."""
    backends = versus.held_to(comparison, baseline)
    held_to = md_text(baseline_label(backends))
    name = f"{candidate[0]} {candidate[1]}"
    here = comparison[(comparison["batch"] == batch) & (comparison["context"] == context)]
    lines = [f"**{name} on {md_text(device)}, batch={batch}, context {_short(context)} (measured):**", ""]
    for row in here.itertuples():
        parts = [f"- next_n={row.next_n}: {row.candidate_ms * 1e3:.1f} µs"]
        if pd.notna(row.vllm_ms):
            parts.append(f"{row.speedup_vs_vllm:.2f}× vs vLLM's path ({row.vllm_strategy}, {row.vllm_ms * 1e3:.1f} µs)")
        else:
            parts.append(f"vLLM's path ({row.vllm_strategy}) not timed on {md_text(path_backend(backends))}")
        if pd.notna(row.best_ms):
            parts.append(
                f"{row.speedup_vs_best:.2f}× vs {held_to} ({row.best_strategy} on {md_text(row.best_backend)}, "
                f"{row.best_ms * 1e3:.1f} µs)"
            )
        if pd.notna(row.floor_pct):
            parts.append(f"{row.floor_pct:.0f}% of the floor ({row.floor_bound}-bound)")
        lines.append("; ".join(parts) + ".")
    both = comparison.dropna(subset=["best_ms"])
    if both.empty:
        lines.append(f"\nNo point has {held_to} timed, so no speedup over it can be read from this run.")
    else:
        wins = int((both["speedup_vs_best"] > 1).sum())
        clear = int(both["beyond_spread_vs_best"].sum())
        lines.append(
            f"\nOver the whole run ({len(both)} points with both): {name} is faster than {held_to} in "
            f"{wins} ({clear} beyond the measured spread); speedup (its time over the candidate's) median "
            f"{both['speedup_vs_best'].median():.2f}×, range {both['speedup_vs_best'].min():.2f}× to "
            f"{both['speedup_vs_best'].max():.2f}×."
        )
    return "\n".join(lines)


def _range(span: tuple[float, float], digits: int = 2) -> str:
    low, high = span
    return f"{low:.{digits}f}" if round(low, digits) == round(high, digits) else f"{low:.{digits}f}–{high:.{digits}f}"


def mixed_context_reading(
    gap: pd.DataFrame, device: str, candidate: tuple[str, str], baseline: str | Sequence[str] | None = None
) -> str:
    """Markdown: why the candidate falls behind on a mixed-length batch, every number from
    `analysis.frames.mixed_context_gap` (the batch where it falls furthest behind first)."""
    held_to = md_text(baseline_label(baseline_backends(baseline)))
    name = f"{candidate[0]} {candidate[1]}"
    if gap.empty:
        return f"*No mixed-length batch of this run has {md_code(name)} measured beside its uniform twin.*"
    worst = gap.loc[gap["vs_best"].map(lambda span: span[0]).idxmin()]
    k = lambda n: f"{n / 1024:.1f}K"  # noqa: E731
    text = (
        f"**Why {name} falls behind at B = {worst.batch} with {_short(worst.mixed)} contexts "
        f"({_range(worst.vs_best)}× {held_to}'s time, measured on {md_text(device)}).** The batch's requests hold "
        f"{k(worst['mean'])} tokens on average and {k(worst.longest)} at most: {100 * worst.token_share:.0f} % of "
        f"the tokens of a uniform {_short(worst.uniform)} batch. The time of {held_to} falls "
        f"with the tokens ({_range(worst.baseline_scale)}× its uniform-{_short(worst.uniform)} time over "
        f"next_n); {name}'s falls only to {_range(worst.candidate_scale)}×."
    )
    if pd.notna(worst.busy_programs):
        idle = int(worst.num_sms - worst.busy_programs)
        text += (
            f" {candidate[0]} launches one program per request and range of {int(worst.blocks_per_program)} KV "
            f"blocks ({BLOCK_TOKENS * int(worst.blocks_per_program)} tokens), the range sized from the batch and its "
            f"longest request (its own rule, `ModelTraits.program_blocks`): here only {int(worst.busy_programs)} of its "
            f"{int(worst.programs)} programs hold any cached token"
            + (f", so at least {idle} of the H200's {int(worst.num_sms)} SMs get no work at all" if idle > 0 else "")
            + " and the step lasts as long as its fullest program: a load imbalance between programs, not slower "
            "arithmetic. DeepGEMM's schedule metadata instead divides the batch's KV, in segments of 256 tokens, "
            "evenly over the SMs."
        )
    others = gap[gap["batch"] != worst.batch]
    if not others.empty:
        parts = [
            f"B = {row.batch}: {_range(row.vs_best)}×"
            + (f" ({int(row.busy_programs)} busy programs)" if pd.notna(row.busy_programs) else "")
            for row in others.itertuples()
        ]
        text += f" At the other batch sizes ({_short(worst.mixed)}, against the best option): " + "; ".join(parts) + "."
    return text


def roofline_reading(comparison: pd.DataFrame, frame: pd.DataFrame, gpu: GpuSpec) -> str:
    """Where the ridge falls in next_n, and which term bounds the candidate's floor per next_n."""
    data = measured_ok(frame).dropna(subset=["flops", "unique_bytes"])
    intensity = (data["flops"] / data["unique_bytes"]).groupby(data["next_n"]).median()
    ridge = gpu.fp8_tflops / gpu.hbm_tbps
    right = [int(n) for n, value in intensity.items() if value >= ridge]
    text = (
        f"The ridge of {gpu.name} lies at {ridge:.0f} FLOP/B. Median intensity per next_n: "
        + ", ".join(f"n={n}: {v:.0f}" for n, v in intensity.items())
        + ". "
    )
    text += (
        f"From next_n = {min(right)} the points lie right of the ridge: the FP8 MMA, not HBM, bounds a kernel "
        "that reads KV once."
        if right
        else "No point reaches the ridge: HBM bounds every one."
    )
    bounded = comparison.dropna(subset=["floor_bound"])
    bounds = bounded.groupby("next_n")["floor_bound"].agg(lambda s: "/".join(sorted(set(s))))
    if not bounds.empty:
        text += " The candidate's floor is " + ", ".join(f"{b} at n={n}" for n, b in bounds.items()) + "."
    return text


def decision_reading(release: str, platform: Platform, batch: DecodeBatch) -> str:
    """One paragraph: the path the release takes for this batch, and vLLM's reason."""
    check_choice("release", release, tuple(RELEASES))
    version, detail = RELEASES[release]
    decision = POLICIES[release](PolicyQuery(platform, batch.next_n))
    text = (
        f"**{version}** ({detail}) on **{FAMILY_LABELS[platform.family]}**"
        f"{' with' if platform.has_deep_gemm else ' without'} DeepGEMM, next_n = {batch.next_n}: "
        f"**{decision.path}**. Why: {decision.reason}."
    )
    if release == "vllm_0_33_0" and decision.path != "rejected":
        step = step_path(PolicyQuery(platform, batch.next_n), batch.max_decode_len)
        if step != decision.path:
            text += (
                f" This step's longest request decodes {batch.max_decode_len} rows, so vLLM 0.33 takes "
                f"**{step}** for it (the per-step rule)."
            )
    return text
