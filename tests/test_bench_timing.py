"""The harness's timing on CPU: wall-clock records and their summary statistics, CPU threads, the stopping
rule, the timing config's checks, and the CUDA-event path (faked) that spins the GPU past the host's issue time."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from types import SimpleNamespace

import pytest
import torch

from dsa_lab.bench import presets as bench_presets
from dsa_lab.bench import timing
from dsa_lab.bench.timing import StoppingRule, TimingConfig, summarize, time_callable

# ---------------------------------------------------------------- timing


def test_wall_clock_timing_on_cpu_measures_the_call():
    config = TimingConfig(warmup=1, min_samples=5, max_samples=20, max_seconds=1.0)
    m = time_callable(lambda: time.sleep(0.002), "cpu", config)
    assert m.device == "cpu" and m.timing_method == "wall_clock"
    assert 5 <= m.samples <= 20 and len(m.samples_ms) == m.samples
    assert 2.0 <= m.median_ms < 20.0
    assert m.p10_ms <= m.p25_ms <= m.median_ms <= m.p75_ms <= m.p90_ms
    assert m.stop_reason in ("converged", "max_samples", "time_budget")
    assert m.host_us >= 2000


def test_summary_statistics_on_known_samples():
    m = summarize([1.0, 2.0, 3.0, 4.0, 5.0], [10.0], "cpu", "wall_clock", "max_samples", TimingConfig(warmup=0))
    assert (m.median_ms, m.p25_ms, m.p75_ms, m.iqr_ms, m.min_ms, m.mean_ms) == (3.0, 2.0, 4.0, 2.0, 1.0, 3.0)
    assert m.rel_iqr == pytest.approx(2 / 3) and m.noisy  # an IQR of 2/3 of the median is above the 5 % default
    row = m.as_row()
    assert row["samples_ms"] == [1.0, 2.0, 3.0, 4.0, 5.0] and row["stop_reason"] == "max_samples"
    assert row["noisy"] is True and row["torch_threads"] == torch.get_num_threads()
    steady = summarize([1.0, 1.01, 1.02, 0.99], [1.0], "cpu", "wall_clock", "converged", TimingConfig())
    assert not steady.noisy
    lenient = summarize(
        [1.0, 2.0, 3.0, 4.0, 5.0], [10.0], "cpu", "wall_clock", "max_samples", TimingConfig(noisy_rel_iqr=0.9)
    )
    assert not lenient.noisy


def test_cpu_timing_runs_on_the_configured_threads_and_restores_the_pool():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    seen: list[int] = []
    try:
        config = TimingConfig(warmup=1, min_samples=3, max_samples=5, max_seconds=1.0, cpu_threads=1)
        m = time_callable(lambda: seen.append(torch.get_num_threads()), "cpu", config)
        assert set(seen) == {1} and m.torch_threads == 1
        assert torch.get_num_threads() == 2  # restored
        with pytest.raises(RuntimeError, match="boom"):  # restored when the timed call raises, too
            time_callable(lambda: (_ for _ in ()).throw(RuntimeError("boom")), "cpu", config)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_point_samples_for_at_least_min_seconds():
    config = TimingConfig(warmup=0, min_samples=3, max_samples=100_000, max_seconds=1.0, min_seconds=0.1, window=3)
    started = time.perf_counter()
    m = time_callable(lambda: None, "cpu", config)  # settles at once: only min_seconds keeps it sampling
    assert time.perf_counter() - started >= 0.1
    assert m.samples > 100 and m.stop_reason in ("converged", "time_budget")
    short = time_callable(lambda: None, "cpu", dataclasses.replace(config, min_seconds=0.0))
    assert short.samples < m.samples
    capped = time_callable(lambda: None, "cpu", dataclasses.replace(config, max_samples=20))
    assert capped.samples == 20 and capped.stop_reason == "max_samples"  # max_samples still caps


def test_ci_preset_times_on_one_thread_for_a_measuring_time():
    timing_config = bench_presets.preset("ci").timing
    assert timing_config.cpu_threads == 1 and timing_config.min_seconds > 0
    assert timing_config.max_samples * 0.001 > timing_config.min_seconds  # a 1 ms call is not capped first


def test_stopping_rule_settles_on_steady_samples_and_not_on_noisy_ones():
    steady = StoppingRule(TimingConfig(min_samples=4, max_samples=1000, max_seconds=100, window=4))
    for _ in range(8):
        steady.add(1.0)
    assert steady.reason() == "converged"
    noisy = StoppingRule(TimingConfig(min_samples=4, max_samples=12, max_seconds=100, window=4, rel_tolerance=1e-3))
    for i in range(12):
        assert noisy.reason() is None
        noisy.add(float(1 + 10 * (i % 2) * i))
    assert noisy.reason() == "max_samples"


def test_timing_config_rejects_nonsense():
    with pytest.raises(ValueError, match="max_samples"):
        TimingConfig(min_samples=10, max_samples=5)
    with pytest.raises(ValueError, match="rel_tolerance"):
        TimingConfig(rel_tolerance=0)
    with pytest.raises(ValueError, match="min_seconds=2.*max_seconds=1"):
        TimingConfig(min_seconds=2.0, max_seconds=1.0)
    with pytest.raises(ValueError, match="cpu_threads=0"):
        TimingConfig(cpu_threads=0)
    with pytest.raises(ValueError, match="noisy_rel_iqr"):
        TimingConfig(noisy_rel_iqr=1.5)


def test_cuda_event_path_spins_the_gpu_past_the_host_issue_time(monkeypatch):
    """Without a GPU: fake events, sleep and synchronise, to pin the order of the queued work."""
    queue: list[str] = []

    class FakeEvent:
        def __init__(self, enable_timing=True):
            self.at = 0.0

        def record(self):
            queue.append("event")
            self.at = time.perf_counter()

        def elapsed_time(self, other):
            return (other.at - self.at) * 1e3

    class FakeFlush:
        def __init__(self, device):
            pass

        def __call__(self):
            queue.append("flush")

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: queue.append(f"spin {cycles}"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(clock_rate=2_000_000))
    monkeypatch.setattr(timing, "L2Flusher", FakeFlush)
    config = TimingConfig(warmup=1, min_samples=4, max_samples=4, max_seconds=10, sync_every=4)
    m = time_callable(lambda: (queue.append("call"), time.sleep(0.001)), "cuda", config)
    assert m.timing_method == "cuda_events_cold_l2" and m.samples == 4
    assert m.spin_us >= 2 * 1000  # at least twice the host's ~1 ms issue time
    timed = queue[queue.index("flush") :]
    assert timed[:5] == ["flush", timed[1], "event", "call", "event"] and timed[1].startswith("spin ")
    assert int(timed[1].split()[1]) >= m.spin_us * 2000  # cycles at no less than the rated 2 GHz
