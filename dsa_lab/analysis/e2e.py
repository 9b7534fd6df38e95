"""Notebook 05's frames: how much of a DeepSeek-V3.2 decode step the indexer is, and what
MTP and the indexer's strategy do to tokens per second.

The indexer's logits kernel comes from the measured H200 sweep where it has the point
(`source='measured'`) and from the calibrated model otherwise (H200 contexts the sweep did
not cover, every SM100 point: `source='modeled'`); the rest of the step is always the
modeled `model.decode_step`. Nothing here draws; `plots.e2e` does. The model's checks (against the
H200 run, Nsight Compute's re-reads, TensorRT-LLM #13219's SM100 table) come as ready frames and words.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from dsa_lab import axes
from dsa_lab.batch.workload import MAX_NEXT_N, MAX_REQUESTS
from dsa_lab.errors import check_choice, check_range
from dsa_lab.kernels import get_backend, modeled_backends, vllm_backend
from dsa_lab.model import calibration
from dsa_lab.model.decode_step import ACCEPTANCE_PRESETS, DEEPSEEK_V32, DEPLOYMENT, decode_step, tokens_per_step
from dsa_lab.model.gpus import get_gpu
from dsa_lab.model.indexer import atom_sizes, predict
from dsa_lab.policy.steps import step_path
from dsa_lab.policy.vllm import Platform, PolicyQuery

CONTEXTS = (4096, 8192, 16384, 32768, 65536, 131072, 262144)
# What the notebook compares, by label: each strategy on what vLLM runs (DeepGEMM), vLLM 0.33's own
# path (resolved per GPU and next_n), and a candidate kernel's native launch (`IndexerTimes.candidate`).
VLLM = "vLLM 0.33"
CANDIDATE = "dsa_lab kernel"
VLLM_STRATEGIES = ("flatten", "native", "atom")
LABELS = (VLLM, *VLLM_STRATEGIES, CANDIDATE)
PLATFORMS = {"sm90": Platform("sm90", True), "sm100": Platform("sm100", True)}


def vllm_strategy(gpu: str, next_n: int) -> tuple[str, str]:
    """vLLM 0.33's indexer path for a full step on this GPU with DeepGEMM (SM100's varlen is native)."""
    path = step_path(PolicyQuery(PLATFORMS[get_gpu(gpu).arch], next_n), next_n)
    return vllm_backend().name, "native" if path in ("native", "varlen") else "flatten"


class IndexerTimes:
    """One layer's indexer logits time (µs) for a GPU, batch, context, next_n and strategy label:
    the measured median where the sweep timed it, else the calibrated model."""

    def __init__(self, results: pd.DataFrame | None, candidate: str, measured_gpu: str = "H200") -> None:
        self.candidate = get_backend(candidate).name  # the backend behind the CANDIDATE label (native)
        self.measured_gpu = measured_gpu
        self._measured: dict[tuple[str, str, int, int, int], float] = {}
        if results is not None:  # the model's indexer shape only (DeepSeek-V3.2: 64 heads of 128, FP8 cache)
            shape = {"heads": DEEPSEEK_V32.index_heads, "head_dim": DEEPSEEK_V32.index_head_dim, "cache_dtype": "fp8"}
            ok = axes.select(results[(results["status"] == "ok") & (results["source"] == "measured")], shape)
            ok = ok[ok["context"].str.isdigit()]
            for row in ok.itertuples():
                key = (row.backend, row.strategy, int(row.batch), int(row.context), int(row.next_n))
                self._measured[key] = row.median_ms * 1e3

    def option(self, label: str) -> tuple[str, str]:
        """(backend, strategy) behind a label other than VLLM's."""
        check_choice("label", label, LABELS[1:])
        return (self.candidate, "native") if label == CANDIDATE else (vllm_backend().name, label)

    def __call__(
        self, gpu: str, label: str, batch: int, context: int, next_n: int, cache_dtype: str = "fp8"
    ) -> tuple[float, str]:
        """(µs, 'measured' or 'modeled'); NaN where the strategy does not exist (SM90 native n=3)."""
        backend, strategy = vllm_strategy(gpu, next_n) if label == VLLM else self.option(label)
        if next_n == 1 or (strategy == "atom" and next_n in atom_sizes(backend, get_gpu(gpu).arch, next_n)):
            strategy = "native"  # one row a request, or an atom plan of one piece: the native launch
        if gpu == self.measured_gpu and cache_dtype == "fp8":
            seen = self._measured.get((backend, strategy, batch, context, next_n))
            if seen is not None:
                return seen, "measured"
        try:
            return predict(
                gpu, backend, strategy, [context] * batch, next_n, cache_dtype=cache_dtype
            ).time_us, "modeled"
        except ValueError:  # no native kernel for this next_n on this GPU
            return float("nan"), "n/a"


def step_row(
    times: IndexerTimes, gpu: str, label: str, batch: int, context: int, next_n: int, cache_dtype: str = "fp8"
) -> dict[str, object]:
    """One modeled decode step with the indexer as `label` runs it: components, share, source (NaN where the
    strategy has no launch at this next_n on this GPU; a value no step has is refused by name)."""
    check_choice("strategy", label, LABELS)
    check_range("batch", batch, 1, MAX_REQUESTS)
    check_range("context", context, 1, 1 << 31)
    check_range("next_n", next_n, 1, MAX_NEXT_N)
    indexer_us, source = times(gpu, label, batch, context, next_n, cache_dtype)
    draft_us, _ = times(gpu, label, batch, context, 1, cache_dtype)
    if indexer_us != indexer_us:  # NaN: no such strategy here
        return {
            "gpu": gpu,
            "strategy": label,
            "batch": batch,
            "context": context,
            "next_n": next_n,
            "indexer_source": source,
            "step_us": float("nan"),
            "indexer_share": float("nan"),
        }
    step = decode_step(gpu, batch, context, next_n, indexer_us, draft_us)
    return {
        "gpu": gpu,
        "strategy": label,
        "batch": batch,
        "context": context,
        "next_n": next_n,
        "indexer_kernel_us": indexer_us,
        "indexer_source": source,
        "step_us": step.total_us,
        "indexer_us": step.indexer_us,
        "indexer_share": step.indexer_share,
        **step.components,
    }


def share_frame(
    times: IndexerTimes,
    gpus: Sequence[str],
    batches: Iterable[int],
    contexts: Iterable[int] = CONTEXTS,
    next_n: int = 1,
    label: str = VLLM,
) -> pd.DataFrame:
    """The indexer's share of a decode step per GPU, batch and context (one strategy, one next_n)."""
    return pd.DataFrame([step_row(times, g, label, b, c, next_n) for g in gpus for b in batches for c in contexts])


def throughput_frame(
    times: IndexerTimes,
    gpu: str,
    batch: int,
    preset: str,
    contexts: Iterable[int] = CONTEXTS,
    labels: Sequence[str] = LABELS,
) -> pd.DataFrame:
    """Tokens per second per GPU for every strategy, context and next_n the acceptance preset
    covers: batch x (1 + sum of a_k) per step, over the modeled step time."""
    check_choice("preset", preset, tuple(ACCEPTANCE_PRESETS))
    acceptance, _ = ACCEPTANCE_PRESETS[preset]
    rows = []
    for label in labels:
        for context in contexts:
            for next_n in range(1, len(acceptance) + 2):
                row = step_row(times, gpu, label, batch, context, next_n)
                row["preset"] = preset
                row["tokens_per_step"] = tokens_per_step(acceptance, next_n)
                row["tokens_per_s"] = batch * row["tokens_per_step"] / row["step_us"] * 1e6
                rows.append(row)
    return pd.DataFrame(rows)


def best_next_n(throughput: pd.DataFrame) -> pd.DataFrame:
    """Per strategy and context: the next_n with the most tokens per second, and its gain over next_n = 1."""
    valid = throughput.dropna(subset=["tokens_per_s"])
    best = valid.loc[valid.groupby(["strategy", "context"])["tokens_per_s"].idxmax()]
    base = valid[valid["next_n"] == 1].set_index(["strategy", "context"])["tokens_per_s"]
    best = best.assign(
        gain_over_no_mtp=best["tokens_per_s"].to_numpy() / base.loc[list(zip(best.strategy, best.context))].to_numpy()
    )
    steps = [k for k in axes.STEP_KEYS if k in best and k != "batch"]  # one batch: the simulation's
    columns = ["gpu", "preset", "strategy", *steps, "tokens_per_s", "gain_over_no_mtp", "indexer_source"]
    return best[columns].reset_index(drop=True)


def describe_best(times: IndexerTimes, gpus: Sequence[str], batch: int, preset: str) -> str:
    """One sentence per GPU: the best next_n of each strategy at the shortest and longest context."""
    lines = []
    for gpu in gpus:
        best = best_next_n(throughput_frame(times, gpu, batch, preset))
        short, long = best["context"].min(), best["context"].max()
        parts = []
        for label in LABELS:
            rows = best[best["strategy"] == label].set_index("context")
            if not rows.empty:
                parts.append(f"{label} {int(rows.loc[short, 'next_n'])} → {int(rows.loc[long, 'next_n'])}")
        lines.append(
            f"- **{gpu}** (B = {batch}, '{preset}'), best next_n from {short // 1024}K to {long // 1024}K "
            f"(modeled): " + "; ".join(parts)
        )
    return "\n".join(lines)


def native_saving(
    times: IndexerTimes,
    gpu: str,
    batches: Iterable[int],
    contexts: Iterable[int],
    next_n: int,
    cache_dtype: str = "fp8",
) -> pd.DataFrame:
    """Share of the decode step that native saves over flatten (DeepGEMM), per batch and context."""
    rows = []
    for batch in batches:
        for context in contexts:
            flat = step_row(times, gpu, "flatten", batch, context, next_n, cache_dtype)
            native = step_row(times, gpu, "native", batch, context, next_n, cache_dtype)
            rows.append(
                {
                    "gpu": gpu,
                    "batch": batch,
                    "context": context,
                    "next_n": next_n,
                    "saving": 1 - native["step_us"] / flat["step_us"],
                    "indexer_share_flatten": flat["indexer_share"],
                }
            )
    return pd.DataFrame(rows)


def typical_error(errors: pd.DataFrame) -> float | None:
    """The model's median |error| against a measured run (`model_errors`), None without one: the width its
    outputs carry (`published_checks`' intervals)."""
    return float(errors["error"].abs().median()) if not errors.empty else None


def reproduces(published: float, low: float, high: float) -> str:
    """Whether a modeled interval [low, high] reproduces a published number. Only an interval narrower than the
    number it judges can: one wider holds that number and its double alike, so it says nothing."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return "not judged: no measured run sizes the model's error here"
    if high - low >= abs(published):
        return f"not judged: the model's interval ({low:.2%} to {high:.2%}) is wider than the number itself"
    return "yes: inside the model's interval" if low <= published <= high else f"no: outside {low:.2%} to {high:.2%}"


def _gain_interval(native_us: float, flatten_us: float, error: float | None) -> tuple[float, float]:
    """The saving 1 - native / flatten when each modeled time may be off by `error` either way (NaN: unknown)."""
    if error is None:
        return float("nan"), float("nan")
    ratio = native_us / flatten_us
    return 1 - ratio * (1 + error) / (1 - error), 1 - ratio * (1 - error) / (1 + error)


def published_checks(times: IndexerTimes, error: float | None = None) -> pd.DataFrame:
    """The three published end-to-end points against the model, each with what the model gives under the closest
    conditions it can express, its interval, whether it reproduces the number (`reproduces`: only an interval
    narrower than the number can) and why it does or does not match. `error`: the model's typical relative error
    (`typical_error`, from a measured run), the width of each modeled time; None: no interval (not judged)."""
    rows = []
    # TensorRT-LLM #18383: native saved 1.15% of the median decode step (GB300, GLM-5.2, MTP-4 -> next_n = 5).
    saving = native_saving(times, "GB200", (16, 64, 128), CONTEXTS, 5)
    low, high = float(saving["saving"].min()), float(saving["saving"].max())
    rows.append(
        {
            "claim": "TensorRT-LLM #18383: native saves 1.15% of the median decode step (GB300, GLM-5.2, MTP-4)",
            "published": 0.0115,
            "modeled": f"{low:.1%} to {high:.1%} (GB200, B 16-128, 4K-256K, next_n = 5: the PR gives neither)",
            "reproduces": reproduces(0.0115, low, high),
            "why": "the saving scales with context and batch, which the PR does not give; GLM-5.2 runs full "
            "indexers on only some layers (the others reuse their top-k), so the same kernel saving is a smaller "
            "share of its step",
        }
    )
    # vLLM #45322: 1.98 vs 1.97 req/s on GB200 (concurrency 64, 10240 in / 1536 out, next_n = 4, MXFP4 cache).
    context = 10240 + 1536 // 2
    published = 1.98 / 1.97 - 1
    for cache_dtype in ("mxfp4", "fp8"):
        native = step_row(times, "GB200", "native", 64, context, 4, cache_dtype)["step_us"]
        flatten = step_row(times, "GB200", "flatten", 64, context, 4, cache_dtype)["step_us"]
        low, high = _gain_interval(native, flatten, error)
        gain = 1 - native / flatten
        rows.append(
            {
                "claim": "vLLM #45322: 1.98 vs 1.97 req/s native vs flatten (GB200, 64 concurrent, ~11K context, "
                f"next_n = 4, MXFP4 cache); modeled at B = 64 a GPU with the {cache_dtype} cache",
                "published": published,
                "modeled": f"{gain / (1 - gain):.2%} faster decode steps"
                + (f" ({low:.1%} to {high:.1%} saved, at the model's ±{error:.0%})" if error is not None else ""),
                "reproduces": reproduces(published, low, high) if cache_dtype == "mxfp4" else "no: the cache differs",
                "why": "with MXFP4 the 64 requests' indexer cache (48 MB) fits the 126.5 MB L2, so flatten's re-reads "
                "hit L2 and cost little; at FP8 (93 MB) they go to DRAM. req/s also pays for 10K-token "
                "prefills, diluting any decode gain",
            }
        )
    # IndexCache (arXiv 2603.12201): removing 75% of indexers gave 1.48x decode at 200K -> indexer ~43% of decode.
    share = 1 - 1 / 1.48
    published = share / 0.75
    shares = share_frame(times, ["H200", "B200"], (1, 16, 64, 128), (204800,))
    low, high = float(shares["indexer_share"].min()), float(shares["indexer_share"].max())
    rows.append(
        {
            "claim": "IndexCache (arXiv 2603.12201): dropping 75% of indexers -> 1.48x decode at 200K, so the indexer is ~43%",
            "published": published,
            "modeled": ", ".join(f"{r.gpu} B={r.batch}: {r.indexer_share:.0%}" for r in shares.itertuples()),
            "reproduces": reproduces(published, low, high),
            "why": "the share grows with batch (the indexer scales with B x L, expert weights do not); the paper's "
            "batch, model and GPU differ, so the model matches it at one batch, not everywhere",
        }
    )
    return pd.DataFrame(rows)


def ceilings_table(gpus: Sequence[str] = ("H200", "B200", "GB200")) -> pd.DataFrame:
    """Every ceiling the models divide by, with its source (and this project's measurement)."""
    return pd.DataFrame([row for name in gpus for row in get_gpu(name).table()])


def headline_predictions(
    times: IndexerTimes,
    batch: int = 128,
    context: int = 65536,
    next_ns: Sequence[int] = (1, 3, 4, 8),
    gpus: Sequence[str] = ("H200", "B200", "GB200"),
    labels: Sequence[str] = ("native", "atom", "flatten", CANDIDATE),
) -> pd.DataFrame:
    """The indexer kernel per GPU, next_n and strategy at one shape: measured where the H200
    sweep has it, modeled (with the bound that limits it) otherwise."""
    rows = []
    for gpu in gpus:
        for next_n in next_ns:
            for label in labels:
                us, source = times(gpu, label, batch, context, next_n)
                if us != us:
                    continue
                backend, strategy = times.option(label)
                bound = predict(gpu, backend, "native" if next_n == 1 else strategy, [context] * batch, next_n).bound
                rows.append(
                    {
                        "gpu": gpu,
                        "next_n": next_n,
                        "strategy": label,
                        "time_us": us,
                        "source": source,
                        "modeled_bound": bound,
                    }
                )
    return pd.DataFrame(rows)


def assumptions() -> list[str]:
    """What the end-to-end frames assume, for the notebook to print."""
    return [
        f"deployment: {DEPLOYMENT}; batch = requests on one GPU",
        "indexer: measured H200 logits kernel where the sweep has the point, the calibrated model elsewhere",
        "other parts: bytes at the H200's measured share of HBM bandwidth, GEMMs at its measured share of the "
        "FP8 rate, all-to-all at NVLink spec; launch gaps, norms, sampling and scheduling not modeled",
        "the other parts carry no fixed per-kernel cost (the indexer's 5-7 µs is in its time), which overstates "
        "the indexer's share at one request a GPU and short contexts",
        "MTP: next_n - 1 draft passes of the MTP layer (next_n = 1) before the target pass",
    ]


def model_errors(results: pd.DataFrame | None, seed: int) -> pd.DataFrame:
    """The model against every timed point of a measured GPU run (`calibration.h200_errors`) that the model can
    predict (its backends, `kernels.modeled_backends`); empty when there is no such run (None) or point."""
    if results is None:
        return pd.DataFrame()
    ok = results[results["backend"].isin(set(modeled_backends()))]
    if not (ok["status"] == "ok").any():
        return pd.DataFrame()
    return calibration.h200_errors(calibration.measured_points(ok, seed))


def flatten_rereads(ncu: pd.DataFrame) -> pd.DataFrame:
    """DRAM read over unique KV bytes of flatten (next_n > 1), per backend and batch against next_n."""
    rereads = calibration.reread_table(ncu)
    flatten = rereads[(rereads["strategy"] == "flatten") & (rereads["next_n"] > 1)]
    return flatten.pivot_table(index=["backend", "batch"], columns="next_n", values="dram_over_unique")


def published_reading(published: pd.DataFrame) -> str:
    """Markdown: the model against TensorRT-LLM #13219 (`calibration.trtllm_13219`) at B = 32, 16K, next_n = 3,
    and how far it is at the launch-bound points."""
    headline = published[(published["batch"] == 32) & (published["context"] == 16384)].iloc[0]
    small = published[published["bound"] == "launch"]
    return (
        f"TensorRT-LLM #13219 at B = 32, 16K, next_n = 3 published **{headline.published_deepgemm_us} µs** for DeepGEMM "
        f"and {headline.published_cute_us} µs for their CuTe kernel; the model says **{headline.modeled_deepgemm_us:.1f} µs** "
        f"(modeled, {headline.error:+.0%}), bound by `{headline.bound}`. At the {len(small)} smaller points the model is "
        f"launch-bound and {small['error'].min():+.0%} to {small['error'].max():+.0%} high: its 7 µs launch cost comes from "
        "the H200 sweep, timed with a cold L2 behind CUDA events, where their table starts at 3.6 µs."
    )


def presets_table() -> pd.DataFrame:
    """The published acceptance curves (`ACCEPTANCE_PRESETS`): a_k, tokens a step at full depth, source."""
    return pd.DataFrame(
        [
            {
                "preset": name,
                "a_k": ", ".join(f"{a:.3f}" for a in values),
                "tokens a step at full depth": 1 + sum(values),
                "source": source,
            }
            for name, (values, source) in ACCEPTANCE_PRESETS.items()
        ]
    )


def best_next_n_by_preset(times: IndexerTimes, gpus: Sequence[str], batch: int) -> pd.DataFrame:
    """The best next_n with vLLM 0.33's indexer path per GPU, acceptance preset and context."""
    rows = []
    for gpu in gpus:
        for name in ACCEPTANCE_PRESETS:
            best = best_next_n(throughput_frame(times, gpu, batch, name, labels=(VLLM,)))
            rows += [
                {"gpu": gpu, "preset": name, **{f"{r.context // 1024}K": int(r.next_n) for r in best.itertuples()}}
            ]
    return pd.DataFrame(rows)
