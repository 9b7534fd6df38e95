"""What timing one point means: how long and how carefully it is sampled (`TimingConfig`), when sampling stops
(`StoppingRule`: once the running median has settled, in the spirit of nvbench, or when the sample or time budget
ends; the reason is recorded) and the summary of its samples a row stores (`Measurement`, `summarize`). The timers
themselves are `bench.timing`'s.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from dsa_lab.errors import check_choice, check_positive, check_range


@dataclass(frozen=True)
class TimingConfig:
    """How long and how carefully to time one point."""

    warmup: int = 3
    min_samples: int = 10
    max_samples: int = 200
    max_seconds: float = 0.5  # wall-clock budget for the timed samples of one point
    min_seconds: float = 0.0  # sample at least this long (unless max_samples comes first), as do_bench's `rep`
    rel_tolerance: float = 0.005  # relative IQR of the recent running medians that counts as settled
    window: int = 8  # running medians the noise rule looks at
    sync_every: int = 8  # timed samples between host synchronisations
    cold_l2: bool = True
    use_graph: bool = False
    graph_launches: int = 10
    cpu_threads: int = 1  # torch intra-op threads while timing on the CPU (restored afterwards)
    noisy_rel_iqr: float = 0.05  # a point whose IQR exceeds this share of its median is flagged noisy

    def __post_init__(self) -> None:
        check_range("warmup", self.warmup, 0, 10_000)
        check_range("min_samples", self.min_samples, 1, 100_000)
        check_range("max_samples", self.max_samples, self.min_samples, 100_000)
        check_range("window", self.window, 2, 10_000)
        check_range("sync_every", self.sync_every, 1, 10_000)
        check_range("graph_launches", self.graph_launches, 1, 10_000)
        check_range("cpu_threads", self.cpu_threads, 1, 4096)
        check_positive("max_seconds", self.max_seconds)
        check_positive("min_seconds", self.min_seconds, allow_zero=True)
        if self.min_seconds > self.max_seconds:
            raise ValueError(f"min_seconds={self.min_seconds!r}: must not exceed max_seconds={self.max_seconds!r}")
        for name in ("rel_tolerance", "noisy_rel_iqr"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
                raise ValueError(f"{name}={value!r}: must lie in (0, 1)")
        for name in ("cold_l2", "use_graph"):
            check_choice(name, getattr(self, name), (False, True))


@dataclass(frozen=True)
class Measurement:
    """Summary of the samples of one timed callable (all times in ms, host time in us)."""

    device: str  # 'cuda' or 'cpu'
    timing_method: str
    samples: int
    median_ms: float
    mean_ms: float
    min_ms: float
    p10_ms: float
    p25_ms: float
    p75_ms: float
    p90_ms: float
    iqr_ms: float
    rel_iqr: float
    noisy: bool  # rel_iqr above the config's noisy_rel_iqr: the median is not to be trusted to that share
    stop_reason: str  # 'converged', 'max_samples' or 'time_budget'
    host_us: float  # median host time to issue one call (no synchronisation inside)
    warmup: int
    torch_threads: int  # torch intra-op threads while sampling (pinned to cpu_threads on the CPU)
    spin_us: float = 0.0  # GPU busy-wait queued before each timed call (hides the host's issue time)
    samples_ms: tuple[float, ...] = field(repr=False, default=())

    def as_row(self, prefix: str = "") -> dict[str, object]:
        row = asdict(self)
        row["samples_ms"] = list(self.samples_ms)
        return {f"{prefix}{key}": value for key, value in row.items()}


def summarize(
    samples_ms: list[float],
    host_us: list[float],
    device: str,
    method: str,
    stop: str,
    config: TimingConfig,
    spin_us: float = 0.0,
) -> Measurement:
    values = np.asarray(samples_ms, dtype=np.float64)
    p10, p25, median, p75, p90 = np.percentile(values, [10, 25, 50, 75, 90])
    rel_iqr = float((p75 - p25) / median) if median > 0 else float("inf")
    return Measurement(
        device=device,
        timing_method=method,
        samples=len(samples_ms),
        median_ms=float(median),
        mean_ms=float(values.mean()),
        min_ms=float(values.min()),
        p10_ms=float(p10),
        p25_ms=float(p25),
        p75_ms=float(p75),
        p90_ms=float(p90),
        iqr_ms=float(p75 - p25),
        rel_iqr=rel_iqr,
        noisy=bool(rel_iqr > config.noisy_rel_iqr),
        stop_reason=stop,
        host_us=float(np.median(host_us)) if host_us else float("nan"),
        warmup=config.warmup if device == "cpu" else max(1, config.warmup),
        torch_threads=torch.get_num_threads(),
        spin_us=spin_us,
        samples_ms=tuple(float(x) for x in values),
    )


class StoppingRule:
    """Tracks running medians; `reason()` says why to stop, or None to keep sampling."""

    def __init__(self, config: TimingConfig) -> None:
        self.config = config
        self.samples: list[float] = []
        self.medians: list[float] = []
        self.started = time.perf_counter()

    def add(self, sample_ms: float) -> None:
        self.samples.append(sample_ms)
        self.medians.append(float(np.median(self.samples)))

    def settled(self) -> bool:
        recent = np.asarray(self.medians[-self.config.window :])
        if len(recent) < self.config.window:
            return False
        q25, mid, q75 = np.percentile(recent, [25, 50, 75])
        return mid > 0 and (q75 - q25) / mid <= self.config.rel_tolerance

    def reason(self) -> str | None:
        cfg = self.config
        enough = len(self.samples) >= cfg.min_samples
        elapsed = time.perf_counter() - self.started
        if enough and elapsed >= cfg.min_seconds and self.settled():
            return "converged"
        if len(self.samples) >= cfg.max_samples:
            return "max_samples"
        if enough and elapsed >= cfg.max_seconds:
            return "time_budget"
        return None
