"""Two runs compared point by point: a verdict per point from the stored samples, and a regression gate.

Points are matched by their key (the harness's axes). For a point timed in both runs the
ratio is B's median over A's, and its uncertainty a bootstrap interval: both runs' stored
samples (`samples_ms`) are resampled, the ratio of the two medians taken each time, and
the central `CONFIDENCE` of those ratios kept. Verdicts:

- `slower`: B's median is more than `threshold` above A's and the interval lies above 1
  (a regression: `dsa-lab compare` exits 1);
- `faster`: B's median is more than `threshold` below A's and the interval lies below 1;
- `unsure`: no verdict: the change passes the threshold but the interval holds 1, or a run
  has fewer than `VERDICT_SAMPLES` samples of the point, or its timings are noisier than the
  threshold (the median's own bootstrap interval is wider than the threshold either side), or
  it was flagged `noisy` when timed (`bench.timing`: its IQR above the run's `noisy_rel_iqr`), or
  either run was timed on a CPU (`WALL_CLOCK`: a wall clock on a shared CPU drifts between two runs by
  more than any threshold, however tight each run's own interval: two back-to-back CPU runs of the same
  code moved a point 1.68×), so that two runs of the same code on a CPU never read as a regression;
- `same`: within the threshold;
- `nan`: no ratio (the point was not timed ok in both runs), with the reason.

Rows without stored samples fall back to the interquartile ranges (no overlap counts as
beyond the noise). The gate cannot pass by accident: runs that share no point, or share
points timed in neither, are an error; so are runs of different devices or GPUs unless
`allow_cross_device` (then every summary says so). Measured and modeled runs are never
compared silently. The stored samples were validated when the runs were loaded
(`store.load_run`: finite and positive, like the medians).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dsa_lab import axes
from dsa_lab.paths import check_output_path, resolve_data_path, shown_path
from dsa_lab.store.folders import Run, load_run
from dsa_lab.store.writes import write_text_atomic

VERDICTS = ("slower", "unsure", "nan", "faster", "same")  # the order a report lists them in
DEFAULT_THRESHOLD = 0.05
RESAMPLES = 1000
CONFIDENCE = 0.95
VERDICT_SAMPLES = 10  # fewer samples of a point in either run: no verdict (a median of 3-5 says little)
EXTRA_COLUMNS = ("samples_ms", "samples", "noisy")  # what a verdict reads beside the times, where stored
DEVICE_FIELDS = ("device", "device_name")  # provenance fields that must agree unless allow_cross_device
WALL_CLOCK = "CPU wall clock: no verdict (its drift between runs exceeds the threshold)"


class NothingCompared(ValueError):
    """The runs share no point timed in either: a comparison that says nothing must not pass a gate."""


def _samples(value: object) -> np.ndarray | None:
    """The stored samples (validated by `store.load_run`), or None when the row holds none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return np.asarray(value, dtype=np.float64).ravel()


def median_noise(values: np.ndarray, rng: np.random.Generator, resamples: int = RESAMPLES) -> float:
    """Half the width of the bootstrap interval (central CONFIDENCE) of the samples' median, over the median."""
    medians = np.median(values[rng.integers(0, len(values), size=(resamples, len(values)))], axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return float((high - low) / 2 / np.median(values))


def _no_verdict(
    counts: tuple[int | None, int | None], noise: tuple[float, float], flagged: tuple[bool, bool], threshold: float
) -> str:
    """Why a point gets no verdict ('' when it gets one): too few samples, a median noisier than the
    threshold, or a point its run flagged noisy when it was timed (`bench.timing`: an interquartile range
    above `noisy_rel_iqr` of the median; on a busy CPU the spread of one run is the drift between two,
    however many samples pin its median)."""
    few = [f"{run} {n}" for run, n in zip("AB", counts) if n is not None and n < VERDICT_SAMPLES]
    if few:
        return f"too few samples ({', '.join(few)}; a verdict needs {VERDICT_SAMPLES})"
    noisy = [f"{run} ±{value:.1%}" for run, value in zip("AB", noise) if value > threshold]
    if noisy:
        return f"noisier than the threshold (median uncertain by {', '.join(noisy)})"
    if any(flagged):
        runs = " and ".join(run for run, flag in zip("AB", flagged) if flag)
        return f"noisy when timed (run {runs}: its IQR above that run's noisy_rel_iqr of the median)"
    return ""


def _count(row: dict, side: str, samples: np.ndarray | None) -> int | None:
    if samples is not None:
        return len(samples)
    count = row.get(f"samples_{side}")
    return int(count) if isinstance(count, (int, float, np.number)) and math.isfinite(count) else None


def ratio_interval(
    a: np.ndarray, b: np.ndarray, rng: np.random.Generator, resamples: int = RESAMPLES
) -> tuple[float, float]:
    """Bootstrap interval (central CONFIDENCE) of median(b) / median(a), each run resampled on its own."""
    med_a = np.median(a[rng.integers(0, len(a), size=(resamples, len(a)))], axis=1)
    med_b = np.median(b[rng.integers(0, len(b), size=(resamples, len(b)))], axis=1)
    ratios = med_b / med_a
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def _verdict(ratio: float, low: float, high: float, threshold: float) -> str:
    if not math.isfinite(ratio):
        return "nan"
    if ratio > 1 + threshold:
        return "slower" if low > 1 else "unsure"
    if ratio < 1 / (1 + threshold):
        return "faster" if high < 1 else "unsure"
    return "same"


def on_cpu(run: Run) -> bool:
    """A run timed by a CPU's wall clock (not CUDA events): its times say nothing across runs."""
    return run.provenance.get("device") != "cuda"


def _judge(
    row: dict, threshold: float, rng: np.random.Generator, resamples: int, cpu: bool = False
) -> dict[str, object]:
    """ratio, ci_low, ci_high, verdict and note of one merged row (`cpu`: a run was timed on a CPU)."""
    if not (row["status_a"] == "ok" and row["status_b"] == "ok"):
        note = f"not timed in both: A {row['status_a']}, B {row['status_b']}"
        return {"ratio": math.nan, "ci_low": math.nan, "ci_high": math.nan, "verdict": "nan", "note": note}
    ratio = row["median_ms_b"] / row["median_ms_a"]
    if not math.isfinite(ratio):
        return {
            "ratio": ratio,
            "ci_low": math.nan,
            "ci_high": math.nan,
            "verdict": "nan",
            "note": "a median is not finite",
        }
    sa, sb = _samples(row.get("samples_ms_a")), _samples(row.get("samples_ms_b"))
    note, noise = "", (0.0, 0.0)
    if sa is not None and sb is not None:
        low, high = ratio_interval(sa, sb, rng, resamples)
        noise = (median_noise(sa, rng, resamples), median_noise(sb, rng, resamples))
    else:  # no samples stored: the interquartile ranges stand in for the interval
        apart_up, apart_down = row["p25_ms_b"] > row["p75_ms_a"], row["p75_ms_b"] < row["p25_ms_a"]
        low, high = (1.0 + 1e-9, ratio) if apart_up else ((ratio, 1.0 - 1e-9) if apart_down else (0.0, math.inf))
        note = "no stored samples: interval from the interquartile ranges"
    flagged = tuple(isinstance(row.get(f"noisy_{s}"), (bool, np.bool_)) and bool(row[f"noisy_{s}"]) for s in "ab")
    why_not = (
        WALL_CLOCK if cpu else _no_verdict((_count(row, "a", sa), _count(row, "b", sb)), noise, flagged, threshold)
    )
    verdict = "unsure" if why_not else _verdict(ratio, low, high, threshold)
    return {"ratio": ratio, "ci_low": low, "ci_high": high, "verdict": verdict, "note": why_not or note}


def device_difference(a: Run, b: Run) -> str | None:
    """'device_name 'NVIDIA H200' -> 'cpu'' when the runs were measured on different devices or GPUs, else None."""
    differ = [
        f"{key} {a.provenance.get(key)!r} -> {b.provenance.get(key)!r}"
        for key in DEVICE_FIELDS
        if a.provenance.get(key) != b.provenance.get(key)
    ]
    return "; ".join(differ) or None


def check_comparable(a: Run, b: Run, allow_mixed_sources: bool = False, allow_cross_device: bool = False) -> None:
    """Refuse, by name, runs whose times must not be set against each other without saying so."""
    if a.source != b.source and not allow_mixed_sources:
        raise ValueError(
            f"runs {a.path} ({a.source}) and {b.path} ({b.source}) differ in source; "
            "measured and modeled times are not compared silently (allow_mixed_sources=True to do it anyway)"
        )
    difference = device_difference(a, b)
    if difference and not allow_cross_device:
        raise ValueError(
            f"runs {a.path} and {b.path} were measured on different devices ({difference}): their ratios mix "
            "the device with the code; --allow-cross-device (allow_cross_device=True) compares them anyway, labelled"
        )


def compare_runs(
    a: Run,
    b: Run,
    threshold: float = DEFAULT_THRESHOLD,
    allow_mixed_sources: bool = False,
    seed: int = 0,
    resamples: int = RESAMPLES,
    allow_cross_device: bool = False,
) -> pd.DataFrame:
    """One row per point present in both runs and timed in at least one: medians, `ratio` (B/A), its
    interval, `verdict`, `note`.

    Sorted as a report reads it: regressions first (largest ratio first), then unsure, nan,
    faster and same points (largest change first). `NothingCompared` when no such point exists.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 10:
        raise ValueError(
            f"threshold={threshold!r}: a fraction in (0, 10), e.g. 0.05 for 5 % (no change can be told from noise at 0)"
        )
    check_comparable(a, b, allow_mixed_sources, allow_cross_device)
    keep = ["point_key", *[c for c in axes.NAMES if c in a.results], "status", "median_ms", "p25_ms", "p75_ms"]
    left = a.results.reindex(columns=[*keep, *EXTRA_COLUMNS])  # a column one run lacks: empty, on both sides
    right = b.results.reindex(columns=["point_key", "status", "median_ms", "p25_ms", "p75_ms", *EXTRA_COLUMNS])
    merged = left.merge(right, on="point_key", suffixes=("_a", "_b"))
    shared = len(merged)
    merged = merged[(merged["status_a"] == "ok") | (merged["status_b"] == "ok")]  # untimed in both: nothing to say
    if merged.empty:
        why = "share no point" if not shared else f"share {shared} point(s), none of them timed in either run"
        raise NothingCompared(f"runs {a.path} and {b.path} {why}: nothing was compared, so there is no verdict")
    if not ((merged["status_a"] == "ok") & (merged["status_b"] == "ok")).any():
        untimed = "A" if not (merged["status_a"] == "ok").any() else "B"
        raise NothingCompared(
            f"runs {a.path} and {b.path}: no shared point is timed in both (none timed in "
            f"{untimed}: {a.path if untimed == 'A' else b.path}), so there is no verdict"
        )
    rng = np.random.default_rng(seed)
    cpu = on_cpu(a) or on_cpu(b)
    rows = []
    for row in merged.to_dict("records"):
        out = {key: row[key] for key in ("point_key", *axes.NAMES) if key in row}
        out.update(
            status_a=row["status_a"],
            status_b=row["status_b"],
            median_ms_a=row["median_ms_a"],
            median_ms_b=row["median_ms_b"],
        )
        out.update(_judge(row, threshold, rng, resamples, cpu))
        rows.append(out)
    columns = [
        "point_key",
        *[c for c in axes.NAMES if c in merged],
        "status_a",
        "status_b",
        "median_ms_a",
        "median_ms_b",
        "ratio",
        "ci_low",
        "ci_high",
        "verdict",
        "note",
    ]
    table = pd.DataFrame(rows, columns=columns)
    if table.empty:
        return table
    rank = table["verdict"].map({v: i for i, v in enumerate(VERDICTS)})
    change = np.log(table["ratio"].where(table["ratio"] > 0)).abs().fillna(np.inf)
    order = np.lexsort((-change.to_numpy(), rank.to_numpy()))
    return table.iloc[order].reset_index(drop=True)


@dataclass(frozen=True)
class Summary:
    """What a comparison says in a few lines: counts per verdict, the ratios' spread, the gate."""

    both: int
    untimed: int  # in both runs, timed in neither (skipped, failed or error in both)
    only_a: int
    only_b: int
    counts: dict[str, int]
    geomean: float
    median_ratio: float
    low: float
    high: float
    threshold: float
    cross_device: str | None = None  # how the runs' devices differ, when compared anyway
    no_verdict: int = 0  # unsure for too few samples or a median noisier than the threshold
    cpu: bool = False  # a run was timed on a CPU: no verdicts at all

    @property
    def regressions(self) -> int:
        return self.counts.get("slower", 0)

    def lines(self, name_a: str, name_b: str) -> list[str]:
        verdicts = ", ".join(f"{v} {self.counts.get(v, 0)}" for v in VERDICTS)
        lines = [
            f"B = {name_b} against A = {name_a}: {self.both} points timed in one or both "
            f"({self.untimed} in both but timed in neither, {self.only_a} only in A, {self.only_b} only in B)",
            f"verdicts: {verdicts}  (threshold {self.threshold:.1%}, {CONFIDENCE:.0%} bootstrap interval of "
            "the ratio of medians)",
        ]
        if self.cpu:
            lines.insert(0, "CPU: no verdicts (wall-clock times drift between runs by more than any threshold)")
        if self.cross_device:
            lines.insert(0, f"CROSS-DEVICE: {self.cross_device}: every ratio mixes the device with the code")
        if self.no_verdict:
            lines.append(
                f"no verdict (unsure) for {self.no_verdict} point(s): fewer than {VERDICT_SAMPLES} samples, "
                "a median noisier than the threshold, or flagged noisy when timed (see their note)"
            )
        if math.isfinite(self.geomean):
            lines.append(
                f"ratio B/A over points timed in both: geometric mean {self.geomean:.4f}, median "
                f"{self.median_ratio:.4f}, range {self.low:.4f} to {self.high:.4f}"
            )
        if self.regressions:
            lines.append(
                f"REGRESSION: {self.regressions} point(s) slower by more than {self.threshold:.1%}, beyond their noise"
            )
        elif self.cpu:
            lines.append("no regression verdict: a run was timed on a CPU")
        else:
            lines.append(f"no regression beyond {self.threshold:.1%}")
        return lines


def summarize(table: pd.DataFrame, a: Run, b: Run, threshold: float) -> Summary:
    keys_a, keys_b = set(a.results["point_key"]), set(b.results["point_key"])
    untimed = len(keys_a & keys_b) - len(table)
    ratios = table["ratio"][np.isfinite(table["ratio"])] if not table.empty else pd.Series(dtype=float)
    positive = ratios[ratios > 0]
    counts = table["verdict"].value_counts().to_dict() if not table.empty else {}
    no_verdict = (
        int(table["note"].str.startswith(("too few", "noisier", "noisy", WALL_CLOCK)).sum()) if not table.empty else 0
    )
    return Summary(
        both=len(table),
        untimed=untimed,
        only_a=len(keys_a - keys_b),
        only_b=len(keys_b - keys_a),
        counts=counts,
        geomean=float(np.exp(np.log(positive).mean())) if len(positive) else float("nan"),
        median_ratio=float(ratios.median()) if len(ratios) else float("nan"),
        low=float(ratios.min()) if len(ratios) else float("nan"),
        high=float(ratios.max()) if len(ratios) else float("nan"),
        threshold=threshold,
        cross_device=device_difference(a, b),
        no_verdict=no_verdict,
        cpu=on_cpu(a) or on_cpu(b),
    )


VERDICT_COLUMNS = ["median_us_a", "median_us_b", "ratio", "ci_low", "ci_high", "verdict", "note"]


def _shown(table: pd.DataFrame) -> pd.DataFrame:
    """The rows for people: every axis that varies (backend and strategy always), times in µs, the verdict."""
    shown = table.assign(median_us_a=table["median_ms_a"] * 1e3, median_us_b=table["median_ms_b"] * 1e3)
    return shown[[*axes.shown(shown), *VERDICT_COLUMNS]]


def to_markdown(table: pd.DataFrame, summary_lines: list[str]) -> str:
    """The summary, then every row as a Markdown table (µs, ratios to 4 places)."""
    shown = _shown(table)
    header = "| " + " | ".join(shown.columns) + " |\n|" + "|".join("---" for _ in shown.columns) + "|\n"

    def cell(value: object) -> str:
        if isinstance(value, float):
            return "" if math.isnan(value) else f"{value:.4g}" if abs(value) >= 1e4 else f"{value:.4f}"
        return str(value).replace("|", "\\|")

    body = "".join("| " + " | ".join(cell(v) for v in row) + " |\n" for row in shown.itertuples(index=False))
    return "\n".join(f"{line}  " for line in summary_lines) + "\n\n" + header + body


def _outputs(args: argparse.Namespace, a: Run, b: Run) -> list[tuple[str, Path]]:
    """--csv and --markdown, each refused when it is or lies inside a run compared (or they coincide)."""
    outputs = [
        (flag, check_output_path(path, [a.path, b.path], flag))
        for flag, path in (("--csv", args.csv), ("--markdown", args.markdown))
        if path is not None
    ]
    if len(outputs) == 2 and outputs[0][1].resolve() == outputs[1][1].resolve():
        raise ValueError(f"--csv and --markdown both name {outputs[0][1]}: give two files")
    return outputs


def run_argument(path: str) -> Path:
    """A run as `compare` takes it: a folder (or its results.parquet) as given, else relative to data/ as
    `report --run` reads it ('h200/<run_id>')."""
    given = Path(path)
    return given if given.exists() else resolve_data_path(path)


def _cmd_compare(args: argparse.Namespace) -> int:
    a, b = load_run(run_argument(args.run_a)), load_run(run_argument(args.run_b))
    if args.top < 0:
        raise ValueError(f"--top={args.top}: must be >= 0")
    outputs = _outputs(args, a, b)
    table = compare_runs(
        a, b, args.threshold, allow_mixed_sources=args.allow_mixed_sources, allow_cross_device=args.allow_cross_device
    )
    summary = summarize(table, a, b, args.threshold)
    lines = summary.lines(shown_path(a.path), shown_path(b.path))
    print("\n".join(lines))
    if not table.empty and args.top:
        with pd.option_context("display.width", 220, "display.max_columns", 20, "display.max_colwidth", 60):
            top = _shown(table.head(args.top))
            print(f"\ntop {len(top)} of {len(table)} (regressions first, then by size of change):")
            print(top.to_string(index=False, float_format="{:.4f}".format))
    for flag, path in outputs:  # a temp file beside each, then moved over it
        write_text_atomic(path, table.to_csv(index=False) if flag == "--csv" else to_markdown(table, lines))
        print(f"written {path}")
    if summary.regressions or (args.strict and summary.counts.get("nan", 0)):
        print(
            f"dsa-lab compare: {summary.regressions} regression(s)"
            + (f", {summary.counts.get('nan', 0)} point(s) without a ratio" if args.strict else ""),
            file=sys.stderr,
        )
        return 1
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    compare = subparsers.add_parser(
        "compare",
        help="compare two runs point by point; exit 1 on a regression",
        description="Ratio of medians per matching point with a bootstrap interval from the stored samples; "
        "a summary first, then the largest changes. Exit status 1 when a point is slower by more than "
        "--threshold beyond its noise; 2 when the runs cannot be compared (no point shared and timed, "
        "different devices without --allow-cross-device, an output path inside a run).",
    )
    compare.add_argument("run_a", help="baseline run folder (or its results.parquet), or a run under data/ (h200/RUN)")
    compare.add_argument("run_b", help="run folder compared with the baseline (the same forms)")
    compare.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"relative change that counts (default {DEFAULT_THRESHOLD} = {DEFAULT_THRESHOLD * 100:g} %%)",
    )
    compare.add_argument("--top", type=int, default=20, help="rows shown after the summary (default 20; 0: none)")
    compare.add_argument("--csv", default=None, help="write every row to this CSV file")
    compare.add_argument("--markdown", default=None, help="write the summary and every row to this Markdown file")
    compare.add_argument("--strict", action="store_true", help="also exit 1 when a point has no ratio (nan)")
    compare.add_argument("--allow-mixed-sources", action="store_true", help="compare a measured with a modeled run")
    compare.add_argument(
        "--allow-cross-device",
        action="store_true",
        help="compare runs of different devices or GPUs (labelled CROSS-DEVICE)",
    )
    compare.set_defaults(func=_cmd_compare)
