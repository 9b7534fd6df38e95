"""Frames between a run's results and the charts: timed rows, the best option, vLLM's path.

Pure pandas over a results frame (`store.load_run(...).results`, measured or modeled rows);
`dsa_lab.plots` draws them and `analysis.headline` reads them. Nothing here draws or times.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from dsa_lab import axes
from dsa_lab.policy import Platform, PolicyQuery, step_path
from dsa_lab.workload import ContextSpec

SM90_DEEPGEMM = Platform("sm90", True)
BASELINE = "deepgemm"
DEEPGEMM_BACKENDS = ("deepgemm", "deepgemm-pr340")  # the vendored release and a build of its PR #340
POINT = list(axes.POINT_KEYS)  # what every answer here is computed per: the step and its shape
SERIES = list(axes.SERIES_KEYS)  # what competes at a point: backend, strategy, config
STUDY_SHAPE = {"cache_dtype": "fp8", "heads": 64, "head_dim": 128}  # DeepSeek-V3.2's indexer


def context_order(labels: Iterable[str]) -> list[str]:
    """Uniform contexts by length, then mixed ones."""
    return sorted(set(labels), key=lambda c: (c.startswith("mixed"), ContextSpec.parse(c).high, c))


REQUIRED_COLUMNS = (*axes.NAMES, "status", "median_ms", "source")


def ok_rows(results: pd.DataFrame) -> pd.DataFrame:
    """Timed rows with `kernel_us` (median, µs) and a `series` label 'strategy (backend)' (', config' when
    not the backend's own rule); every axis column present (a modeled frame's added later axes filled in)."""
    results = axes.complete(results)
    missing = [c for c in REQUIRED_COLUMNS if c not in results.columns]
    if missing:
        raise ValueError(f"results: missing columns {missing}")
    ok = results[results["status"] == "ok"].copy()
    ok["kernel_us"] = ok["median_ms"] * 1e3
    tuned = ok["config"].map(lambda c: "" if not axes.axis("config").in_key(c) else f", {c}")
    ok["series"] = ok["strategy"] + " (" + ok["backend"] + tuned + ")"
    return ok.reset_index(drop=True)


def one_shape(results: pd.DataFrame, shape: Mapping[str, object] | None = None) -> tuple[pd.DataFrame, str]:
    """The rows of one shape (cache dtype, heads, head dim), which is what a chart draws, and a note
    naming it when the run holds several ('' when it holds one). `shape`: which (default: the one closest
    to the study's, H = 64, D = 128, FP8: most of those values, the first of equals)."""
    present = axes.shapes(results)
    if len(present) <= 1:
        return results, ""
    wanted = dict(shape) if shape is not None else max(present, key=lambda s: sum(s[k] == STUDY_SHAPE[k] for k in s))
    if wanted not in present:
        raise ValueError(f"shape={wanted}: not in this run; its shapes are {present}")
    others = "; ".join(axes.describe_shape(s) for s in present if s != wanted)
    note = f"{len(present)} shapes in this run; showing {axes.describe_shape(wanted)} (also measured: {others})."
    return axes.select(results, wanted), note


def vllm_choice(next_n: int, platform: Platform = SM90_DEEPGEMM) -> str:
    """vLLM 0.33's path for a uniform step of next_n rows, as a run's strategy: 'native' or 'flatten'.

    vLLM's 'varlen' (SM100 with DeepGEMM: one row per token and a row -> request index) is
    'native' here: it is the call the harness's DeepGEMM backend makes on SM100 (`kernels.deepgemm`).
    """
    path = step_path(PolicyQuery(platform, next_n), next_n)
    return "native" if path == "varlen" else path


def by_point(table: pd.DataFrame) -> pd.DataFrame:
    """Rows in (batch, context, next_n) order, uniform contexts by length before mixed ones."""
    order = {c: i for i, c in enumerate(context_order(table["context"]))}
    return table.sort_values(POINT, key=lambda s: s.map(order) if s.name == "context" else s).reset_index(drop=True)


def measured_ok(frame: pd.DataFrame) -> pd.DataFrame:
    """Timed measured rows (`ok_rows`: `kernel_us`, `series`); modeled ones dropped."""
    data = ok_rows(frame)
    return data[data["source"] == "measured"].reset_index(drop=True)


def best_option(
    frame: pd.DataFrame, backend: str | Sequence[str] = BASELINE, strategies: Sequence[str] | None = None
) -> pd.DataFrame:
    """Per (batch, context, next_n): the fastest timed row of `backend` (one name, or several: the best
    over all of them), among `strategies` if given: `best_strategy`, `best_backend`, `best_ms`, its IQR."""
    backends = [backend] if isinstance(backend, str) else list(backend)
    data = measured_ok(frame)
    data = data[data["backend"].isin(backends)]
    if strategies is not None:
        data = data[data["strategy"].isin(list(strategies))]
    best = data.loc[data.groupby(POINT)["median_ms"].idxmin()] if not data.empty else data
    renamed = {"strategy": "best_strategy", "backend": "best_backend", "median_ms": "best_ms",
               "p25_ms": "best_p25_ms", "p75_ms": "best_p75_ms"}  # fmt: skip
    return by_point(best[[*POINT, *renamed]].rename(columns=renamed))


def vllm_path(frame: pd.DataFrame, backend: str = BASELINE, platform: Platform = SM90_DEEPGEMM) -> pd.DataFrame:
    """Per (batch, context, next_n): vLLM 0.33's strategy on `platform` (`vllm_choice`) and `backend`'s
    time for it (NaN if untimed). A frame with no measured timed rows gives no rows."""
    data = measured_ok(frame)
    points = data[POINT].drop_duplicates()
    chosen = [vllm_choice(int(n), platform) for n in points["next_n"]]
    points = points.assign(vllm_strategy=pd.Series(chosen, index=points.index, dtype=object))
    timed = data.loc[data["backend"] == backend, [*POINT, "strategy", "median_ms", "p25_ms", "p75_ms"]]
    renamed = {"strategy": "vllm_strategy", "median_ms": "vllm_ms", "p25_ms": "vllm_p25_ms", "p75_ms": "vllm_p75_ms"}
    timed = timed.rename(columns=renamed)
    return by_point(points.merge(timed, on=[*POINT, "vllm_strategy"], how="left"))


def speedup_over_vllm(frame: pd.DataFrame, backend: str = BASELINE, platform: Platform = SM90_DEEPGEMM) -> pd.DataFrame:
    """Measured timed rows with vLLM 0.33's time at the same point (`vllm_ms`: its strategy on
    `backend`) and `speedup` = vLLM's time / the row's time (> 1: faster than what vLLM runs)."""
    path = vllm_path(frame, backend, platform)[[*POINT, "vllm_strategy", "vllm_ms"]]
    data = measured_ok(frame).merge(path, on=POINT, how="left")
    data["speedup"] = data["vllm_ms"] / data["median_ms"]
    return by_point(data)


H200_SMS = 132  # streaming multiprocessors of an H200 SXM (the Triton kernel's own default off the GPU)


def mixed_context_gap(
    frame: pd.DataFrame, seed: int, candidate: tuple[str, str] = ("triton", "native"), baseline: str = BASELINE,
    num_sms: int = H200_SMS,
) -> pd.DataFrame:  # fmt: skip
    """Why a kernel falls behind on mixed-length batches: per batch with a mixed context
    'mixed:LO-HI' and the uniform context HI both measured, how much of the uniform batch's
    tokens the mixed one holds, and how each side's time scales from uniform to mixed.

    Columns: batch, mixed, uniform, token_share (mixed tokens / uniform tokens), longest and
    mean (the mixed lengths, drawn with the run's `seed`), candidate_scale / baseline_scale
    (min and max over next_n of mixed time / uniform time; baseline: its best option),
    vs_best (min and max of the best baseline time / the candidate's time at the mixed
    context), and for the Triton kernel its grid: `programs`, `busy_programs` (those whose
    range of KV blocks holds a cached token) and `blocks_per_program`, from its own rule
    (`kernels.triton_native.blocks_per_program`) at `num_sms`.
    """
    data = measured_ok(frame)
    backend, strategy = candidate
    mine = data[(data["backend"] == backend) & (data["strategy"] == strategy)].set_index(POINT)["median_ms"]
    best = best_option(frame, baseline).set_index(POINT)["best_ms"]
    at, step = POINT.index("context"), POINT.index("next_n")

    def uniform_twin(key: tuple) -> tuple:
        return (*key[:at], str(ContextSpec.parse(key[at]).high), *key[at + 1 :])

    mixed = [k for k in mine.index if ContextSpec.parse(k[at]).mixed]
    groups: dict[tuple, list[tuple]] = {}
    for key in mixed:  # every next_n of one (batch, mixed context, shape)
        if uniform_twin(key) in mine.index and key in best.index and uniform_twin(key) in best.index:
            groups.setdefault((*key[:step], *key[step + 1 :]), []).append(key)
    rows = []
    for _, keys in sorted(groups.items(), key=lambda item: (item[0][at], item[0])):
        spec = ContextSpec.parse(keys[0][at])
        batch = int(keys[0][POINT.index("batch")])
        lens = spec.seq_lens(batch, seed)
        mixed_ms = pd.Series([mine[k] for k in keys])
        row = {
            **{name: keys[0][i] for i, name in enumerate(POINT) if name not in ("context", "next_n")},
            "batch": batch, "mixed": spec.label, "uniform": str(spec.high),
            "token_share": sum(lens) / (spec.high * batch), "longest": max(lens), "mean": sum(lens) / len(lens),
            "candidate_scale": _span(mixed_ms / [mine[uniform_twin(k)] for k in keys]),
            "baseline_scale": _span(pd.Series([best[k] / best[uniform_twin(k)] for k in keys])),
            "vs_best": _span(pd.Series([best[k] for k in keys]) / mixed_ms),
            "programs": None, "busy_programs": None, "blocks_per_program": None, "num_sms": num_sms,
        }  # fmt: skip
        if backend == "triton":
            row["programs"], row["busy_programs"], row["blocks_per_program"] = _triton_grid(lens, num_sms)
        rows.append(row)
    return pd.DataFrame(rows)


def _span(values: pd.Series) -> tuple[float, float]:
    return float(values.min()), float(values.max())


def _triton_grid(seq_lens: Iterable[int], num_sms: int) -> tuple[int, int, int]:
    """The Triton kernel's programs for one step of these lengths (one per request x range of
    KV blocks, sized by its own rule), how many of them hold a cached token, and the blocks
    of 64 tokens in a range."""
    from dsa_lab.kernels.triton_native import BLOCK_SIZE, blocks_per_program

    blocks = [-(-length // BLOCK_SIZE) for length in seq_lens]
    per_program = blocks_per_program(len(blocks), max(blocks), num_sms)
    ranges = -(-max(blocks) // per_program)
    return len(blocks) * ranges, sum(-(-b // per_program) for b in blocks), per_program
