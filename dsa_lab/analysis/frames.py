"""Frames between a run's results and the charts: timed rows, the best option, vLLM's path.

Pure pandas over a results frame (`store.load_run(...).results`, measured or modeled rows);
`dsa_lab.plots` draws them and `analysis.headline` reads them. Nothing here draws or times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import pandas as pd

from dsa_lab import axes
from dsa_lab.batch.workload import CONTEXT_DISTRIBUTIONS, ContextSpec
from dsa_lab.kernels import family_of, get_backend, vllm_backend
from dsa_lab.model.gpus import get_gpu
from dsa_lab.model.indexer import BLOCK_TOKENS
from dsa_lab.policy.steps import step_path
from dsa_lab.policy.vllm import Platform, PolicyQuery

SM90_DEEPGEMM = Platform("sm90", True)
POINT = list(axes.POINT_KEYS)  # what every answer here is computed per: the step and its shape
SERIES = list(axes.SERIES_KEYS)  # what competes at a point: backend, strategy, config
STUDY_SHAPE = {"cache_dtype": "fp8", "heads": 64, "head_dim": 128}  # DeepSeek-V3.2's indexer


def vllm_family() -> tuple[str, ...]:
    """The backends of what vLLM runs (DeepGEMM: the vendored release and a build of a PR of it):
    'the best DeepGEMM option' is the fastest of these."""
    return family_of(vllm_backend().name)


def baseline_backends(
    baseline: str | Sequence[str] | None = None, frame: pd.DataFrame | None = None
) -> tuple[str, ...]:
    """The backends a comparison is held to (the best of them at each point): one name, several, or None for
    every DeepGEMM build (`vllm_family`: what vLLM runs, and a build of a PR of it) that `frame` timed (every one,
    when it timed none or no frame is given), so a label names exactly the builds its numbers come from."""
    if baseline is not None:
        return (baseline,) if isinstance(baseline, str) else tuple(baseline)
    timed = set(frame.loc[frame["status"] == "ok", "backend"]) if frame is not None and "status" in frame else set()
    return tuple(b for b in vllm_family() if b in timed) or vllm_family()


def path_backend(backends: Sequence[str]) -> str:
    """The backend whose strategies stand for vLLM 0.33's path among `backends`: what vLLM runs when it is one of
    them, else the first."""
    return vllm_backend().name if vllm_backend().name in backends else backends[0]


def context_order(labels: Iterable[str]) -> list[str]:
    """Uniform contexts by length, then mixed ones (log-uniform, then log-normal, each by its longest or its
    median), a request order after the drawn one."""

    def key(label: str) -> tuple:
        spec = ContextSpec.parse(label)
        typical = spec.median if spec.distribution == "lognormal" else spec.high
        return (CONTEXT_DISTRIBUTIONS.index(spec.distribution), typical, spec.low, spec.order != "shuffled", label)

    return sorted(set(labels), key=key)


def uniform_twin(label: str) -> str:
    """The uniform context a mixed one is set beside: its longest (mixed:MIN-MAX: MAX) or its median
    (lognormal: the body of the batch; its clipped maximum is no length a batch holds)."""
    spec = ContextSpec.parse(label)
    return str(spec.median if spec.distribution == "lognormal" else spec.high)


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


def one_workload(results: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The rows of one serving setting (`axes.SETTING_KEYS`: acceptance, logits width, timed unit, timer), so a
    chart of (batch, context, next_n) holds one time per series; and a note naming the rest when the run holds
    several ('' when it holds one). The setting kept is each axis's old-run value (no acceptance profile, the
    batch's width, logits, CUDA events), else the first the run holds. An axis the others imply (a
    logits-only row's top-k) is read among the rows the axes before it kept, so it offers no false choice."""
    kept, others = {}, []
    for name in axes.SETTING_KEYS:
        rows = axes.select(results, kept) if axes.axis(name).implied_when is not None else results
        values = list(dict.fromkeys(rows[name])) if name in rows else []
        if len(values) > 1:
            old = axes.axis(name).old_value
            kept[name] = old if old in values else values[0]
            others.append(f"{name} {', '.join(str(v) for v in values if v != kept[name])}")
    if not kept:
        return results, ""
    shown = ", ".join(f"{k}={v}" for k, v in kept.items())
    note = f"This run holds several settings; these charts show {shown} (also measured: {'; '.join(others)})."
    return axes.select(results, kept), note


def one_view(results: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """`one_shape`, then `one_workload`: what a chart of (batch, context, next_n) draws, and the notes of both."""
    shaped, shape_note = one_shape(results)
    shown, workload_note = one_workload(shaped)
    return shown, " ".join(n for n in (shape_note, workload_note) if n)


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
    return timed(frame, "measured")


def timed(frame: pd.DataFrame, source: str | None = "measured") -> pd.DataFrame:
    """Timed rows (`ok_rows`) of one source ('measured' or 'modeled'; None: both)."""
    data = ok_rows(frame)
    return (data if source is None else data[data["source"] == source]).reset_index(drop=True)


def native_twins(data: pd.DataFrame) -> pd.Series:
    """Rows whose launches are native's (`plan.LaunchPlan.signature`): flatten at next_n = 1 (one row a
    request) and an atom plan of one native piece. The same kernel work timed twice: never an option of
    its own, or noise would pick a winner between two equal launches."""
    one_piece = (data["pieces"].astype(str) == data["next_n"].astype(str)) if "pieces" in data else False
    return (data["strategy"] == "flatten") & (data["next_n"] == 1) | (data["strategy"] == "atom") & one_piece


def best_option(
    frame: pd.DataFrame,
    backend: str | Sequence[str] | None = None,
    strategies: Sequence[str] | None = None,
    source: str | None = "measured",
    twins: bool = False,
) -> pd.DataFrame:
    """Per point: the fastest timed row of `backend` (one name, or several: the best over all of them;
    None: what vLLM runs), among `strategies` if given, a native twin (`native_twins`) never counted on
    its own unless `twins` (a launch's time, not an option to recommend): `best_strategy`, `best_backend`,
    `best_ms`, its IQR, `best_pieces` (an atom's split)."""
    backend = vllm_backend().name if backend is None else backend
    backends = [backend] if isinstance(backend, str) else list(backend)
    data = timed(frame, source)
    data = data[data["backend"].isin(backends) & (twins | ~native_twins(data))]
    if strategies is not None:
        data = data[data["strategy"].isin(list(strategies))]
    best = data.loc[data.groupby(POINT)["median_ms"].idxmin()] if not data.empty else data
    pieces = best["pieces"].where(best["strategy"] == "atom", "") if "pieces" in best else ""
    best = best.assign(pieces=pd.Series(pieces, index=best.index, dtype=object).fillna(""))
    renamed = {
        "strategy": "best_strategy",
        "backend": "best_backend",
        "median_ms": "best_ms",
        "p25_ms": "best_p25_ms",
        "p75_ms": "best_p75_ms",
        "pieces": "best_pieces",
        "source": "source",
    }
    return by_point(best[[*POINT, *renamed]].rename(columns=renamed))


ROUTE_STRATEGY = {"native": "native", "padded": "native", "flatten": "flatten", "varlen": "native"}


def vllm_path(
    frame: pd.DataFrame, backend: str | None = None, platform: Platform = SM90_DEEPGEMM, source: str | None = "measured"
) -> pd.DataFrame:
    """Per point: vLLM 0.33's strategy on `platform` and `backend`'s time for it (None: what vLLM runs; NaN if
    untimed). The strategy is the route the harness recorded for the point's step on this platform
    (`vllm_route`, e.g. flatten for a ragged step on SM90 + DeepGEMM; 'padded' and 'varlen' are native launches
    here), else that of a uniform step of next_n rows (`vllm_choice`). No timed rows of `source`: no rows."""
    backend = vllm_backend().name if backend is None else backend
    data = timed(frame, source)
    points = data[POINT].drop_duplicates()
    chosen = [vllm_choice(int(n), platform) for n in points["next_n"]]
    if {"vllm_route", "vllm_platform"} <= set(data.columns):
        here = data[data["vllm_platform"] == platform.label].drop_duplicates(POINT).set_index(POINT)["vllm_route"]
        routes = [here.get(key) for key in points.itertuples(index=False, name=None)]
        chosen = [ROUTE_STRATEGY.get(r, c) if isinstance(r, str) else c for r, c in zip(routes, chosen)]
    points = points.assign(vllm_strategy=pd.Series(chosen, index=points.index, dtype=object), vllm_backend=backend)
    times = data.loc[data["backend"] == backend, [*POINT, "strategy", "median_ms", "p25_ms", "p75_ms"]]
    renamed = {"strategy": "vllm_strategy", "median_ms": "vllm_ms", "p25_ms": "vllm_p25_ms", "p75_ms": "vllm_p75_ms"}
    return by_point(points.merge(times.rename(columns=renamed), on=[*POINT, "vllm_strategy"], how="left"))


def recommend(
    frame: pd.DataFrame,
    backends: Sequence[str] | None = None,
    vllm_backend: str | None = None,
    platform: Platform = SM90_DEEPGEMM,
    source: str | None = "measured",
    strategies: Sequence[str] | None = None,
) -> pd.DataFrame:
    """The answer at every point: what vLLM 0.33 takes, the fastest option and which to use.

    Options are the timed rows of `backends` (default: every backend in the frame) and `strategies`
    (default: all) of `source`, native twins left out (`native_twins`); vLLM's choice is timed whatever
    they leave out. `vllm_*` is vLLM's strategy on `platform` timed on `vllm_backend`
    (default: what vLLM runs); `best_*` the fastest option; `speedup` = vLLM's time / the best's;
    `beyond_spread` when vLLM's 25th percentile lies above the best's 75th. The recommendation
    (`recommended_*`) is the best option only beyond the spread: a tie within the measured spread keeps
    vLLM's choice (no noise winner); where vLLM's choice was not timed, the best. `options_timed` lists
    the strategies timed there.
    """
    data = timed(frame, source)
    backends = sorted(data["backend"].unique()) if backends is None else list(backends)
    path = vllm_path(data, vllm_backend, platform, source)
    table = path.merge(best_option(data, backends, strategies, source=source), on=POINT, how="inner")
    table["speedup"] = table["vllm_ms"] / table["best_ms"]
    table["beyond_spread"] = table["vllm_p25_ms"] > table["best_p75_ms"]
    keep = table["vllm_ms"].notna() & ~table["beyond_spread"]
    for what in ("strategy", "backend", "ms"):
        table[f"recommended_{what}"] = table[f"vllm_{what}"].where(keep, table[f"best_{what}"])
    mine = data[data["backend"].isin(backends)]
    mine = mine if strategies is None else mine[mine["strategy"].isin(list(strategies))]
    options = mine.groupby(POINT)["strategy"].agg(lambda s: ", ".join(sorted(set(s)))).rename("options_timed")
    return by_point(table.merge(options.reset_index(), on=POINT, how="left"))


def decisions(frame: pd.DataFrame, backend: str, platform: Platform = SM90_DEEPGEMM) -> pd.DataFrame:
    """`recommend` on one backend's strategies against vLLM 0.33's choice timed on the same backend
    (measured or modeled rows alike: a model's times have no spread, so any gap counts)."""
    available = sorted(timed(frame, None)["backend"].unique())
    if backend not in available:
        raise ValueError(f"backend={backend!r}: no timed rows; allowed values are {available}")
    return recommend(frame, [backend], backend, platform, source=None)


def decision_backend(results: pd.DataFrame, wanted: str, run_name: object) -> tuple[str, str | None]:
    """The backend whose strategies a decision table compares: `wanted` when it has rows timed 'ok', else the
    most-timed one, with a note saying so. `run_name` names the run in the error when nothing was timed."""
    timed_backends = results.loc[results["status"] == "ok", "backend"].value_counts()
    if timed_backends.empty:
        raise ValueError(f"run {run_name}: no point timed ok, nothing to decide")
    if wanted in timed_backends.index:
        return wanted, None
    backend = timed_backends.index[0]
    return backend, (
        f"*Backend `{wanted}` has no timed rows in this run; deciding on `{backend}` "
        f"(timed: {', '.join(timed_backends.index)}).*"
    )


def speedup_over_vllm(
    frame: pd.DataFrame, backend: str | None = None, platform: Platform = SM90_DEEPGEMM
) -> pd.DataFrame:
    """Measured timed rows with vLLM 0.33's time at the same point (`vllm_ms`: its strategy on
    `backend`) and `speedup` = vLLM's time / the row's time (> 1: faster than what vLLM runs)."""
    path = vllm_path(frame, backend, platform)[[*POINT, "vllm_strategy", "vllm_ms"]]
    data = measured_ok(frame).merge(path, on=POINT, how="left")
    data["speedup"] = data["vllm_ms"] / data["median_ms"]
    return by_point(data)


def speedup_over_strategy(frame: pd.DataFrame, baseline: str = "flatten") -> pd.DataFrame:
    """Per backend and point: `baseline` time / strategy time (> 1: the strategy is faster)."""
    data = ok_rows(frame)
    keys = ["source", *(k for k in SERIES if k != "strategy"), *POINT]
    base = data[data["strategy"] == baseline].set_index(keys)["median_ms"].rename("baseline_ms")
    others = data[data["strategy"] != baseline].join(base, on=keys, how="inner")
    others["speedup"] = others["baseline_ms"] / others["median_ms"]
    return others[[*keys, "strategy", "median_ms", "baseline_ms", "speedup"]].reset_index(drop=True)


H200_SMS = int(get_gpu("H200").sms.value)  # streaming multiprocessors of an H200 SXM


def mixed_context_gap(
    frame: pd.DataFrame,
    seed: int,
    candidate: tuple[str, str],
    baseline: str | Sequence[str] | None = None,
    num_sms: int = H200_SMS,
) -> pd.DataFrame:
    """Why a kernel falls behind on mixed-length batches: per batch with a mixed context and its uniform
    twin (`uniform_twin`: HI of 'mixed:LO-HI', a log-normal's median) both measured, how much of the uniform
    batch's tokens the mixed one holds, and how each side's time scales from uniform to mixed.

    Columns: batch, mixed, uniform, token_share (mixed tokens / uniform tokens), longest and
    mean (the mixed lengths, drawn with the run's `seed`), candidate_scale / baseline_scale
    (min and max over next_n of mixed time / uniform time; baseline: its best option, over every DeepGEMM
    build by default),
    vs_best (min and max of the best baseline time / the candidate's time at the mixed
    context), and for a kernel of fixed KV slices (Triton's) its grid: `programs`, `busy_programs`
    (those whose range of KV blocks holds a cached token) and `blocks_per_program`, from its own rule
    (`ModelTraits.program_blocks`) at `num_sms`.
    """
    data = measured_ok(frame)
    backend, strategy = candidate
    mine = data[(data["backend"] == backend) & (data["strategy"] == strategy)].set_index(POINT)["median_ms"]
    best = best_option(frame, list(baseline_backends(baseline, frame))).set_index(POINT)["best_ms"]
    at, step = POINT.index("context"), POINT.index("next_n")

    def twin(key: tuple) -> tuple:
        return (*key[:at], uniform_twin(key[at]), *key[at + 1 :])

    mixed = [k for k in mine.index if ContextSpec.parse(k[at]).mixed]
    groups: dict[tuple, list[tuple]] = {}
    for key in mixed:  # every next_n of one (batch, mixed context, shape)
        if twin(key) in mine.index and key in best.index and twin(key) in best.index:
            groups.setdefault((*key[:step], *key[step + 1 :]), []).append(key)
    rows = []
    for _, keys in sorted(groups.items(), key=lambda item: (item[0][at], item[0])):
        spec = ContextSpec.parse(keys[0][at])
        batch = int(keys[0][POINT.index("batch")])
        lens = spec.seq_lens(batch, seed)
        uniform = int(uniform_twin(spec.label))
        mixed_ms = pd.Series([mine[k] for k in keys])
        row = {
            **{name: keys[0][i] for i, name in enumerate(POINT) if name not in ("context", "next_n")},
            "batch": batch,
            "mixed": spec.label,
            "uniform": str(uniform),
            "token_share": sum(lens) / (uniform * batch),
            "longest": max(lens),
            "mean": sum(lens) / len(lens),
            "candidate_scale": _span(mixed_ms / [mine[twin(k)] for k in keys]),
            "baseline_scale": _span(pd.Series([best[k] / best[twin(k)] for k in keys])),
            "vs_best": _span(pd.Series([best[k] for k in keys]) / mixed_ms),
            "programs": None,
            "busy_programs": None,
            "blocks_per_program": None,
            "num_sms": num_sms,
        }
        traits = get_backend(backend).model_traits.get("sm90")  # the H200's kernel
        rule = traits.program_blocks if traits is not None else None
        if rule is not None:
            row["programs"], row["busy_programs"], row["blocks_per_program"] = _program_grid(lens, num_sms, rule)
        rows.append(row)
    return pd.DataFrame(rows)


def _span(values: pd.Series) -> tuple[float, float]:
    return float(values.min()), float(values.max())


def _program_grid(seq_lens: Iterable[int], num_sms: int, rule: Callable[[int, int, int], int]) -> tuple[int, int, int]:
    """A fixed-slice kernel's programs for one step of these lengths (one per request x range of KV blocks,
    sized by its own `rule`), how many of them hold a cached token, and the blocks of a range."""
    blocks = [-(-length // BLOCK_TOKENS) for length in seq_lens]
    per_program = rule(len(blocks), max(blocks), num_sms)
    ranges = -(-max(blocks) // per_program)
    return len(blocks) * ranges, sum(-(-b // per_program) for b in blocks), per_program
