"""The harness on CPU: timing records, sweeps (check, skip, fail, error, resume), the bench command."""

from __future__ import annotations

import argparse
import contextlib
import time
from types import SimpleNamespace

import pytest
import torch

from dsa_lab import store
from dsa_lab.bench import cli as bench_cli
from dsa_lab.bench import sweep, timing
from dsa_lab.bench.sweep import ContextSpec, SweepSpec, expand, run_sweep
from dsa_lab.bench.timing import StoppingRule, TimingConfig, summarize, time_callable
from dsa_lab.cache import build_paged_cache, gather_request_keys, random_paged_cache
from dsa_lab.kernels import registry
from dsa_lab.kernels.reference import ReferenceBackend, paged_mqa_logits

FAST = TimingConfig(warmup=1, min_samples=2, max_samples=3, max_seconds=0.01, window=2)


def tiny(**axes) -> SweepSpec:
    base = SweepSpec(backend=("reference",), batch=(2,), context=("96",), next_n=(1, 3), heads=(32,), head_dim=(64,), timing=FAST)
    return base.with_axes(**axes)


class _Injected(ReferenceBackend):
    baseline = False


class _WrongBackend(_Injected):
    """Right everywhere but 1% too large: must be recorded as failed, never timed."""

    name = "test-wrong"

    def logits(self, *args, **kwargs):
        return super().logits(*args, **kwargs) * 1.01


class _HoleBackend(_Injected):
    """Leaves the first valid column of each row unwritten (NaN)."""

    name = "test-hole"

    def logits(self, *args, **kwargs):
        out = super().logits(*args, **kwargs).clone()
        out[:, 0] = float("nan")
        return out


class _BrokenBackend(_Injected):
    name = "test-broken"

    def logits(self, *args, **kwargs):
        raise RuntimeError("kernel exploded")


class _NarrowBackend(_Injected):
    """Native only for next_n in {1, 2}, like a kernel with a fixed set of tile shapes."""

    name = "test-narrow"

    def native_next_n(self, device):
        return frozenset({1, 2})


@pytest.fixture
def injected(monkeypatch):
    """Register the test backends for one test only, so no other test module ever sees them."""
    for cls in (_WrongBackend, _HoleBackend, _BrokenBackend, _NarrowBackend):
        monkeypatch.setitem(registry._BACKENDS, cls.name, cls())


def rows_by_key(run_dir):
    return {row["point_key"]: row for row in store.read_points(run_dir)}


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
    m = summarize([1.0, 2.0, 3.0, 4.0, 5.0], [10.0], "cpu", "wall_clock", "max_samples", 0)
    assert (m.median_ms, m.p25_ms, m.p75_ms, m.iqr_ms, m.min_ms, m.mean_ms) == (3.0, 2.0, 4.0, 2.0, 1.0, 3.0)
    assert m.rel_iqr == pytest.approx(2 / 3)
    row = m.as_row()
    assert row["samples_ms"] == [1.0, 2.0, 3.0, 4.0, 5.0] and row["stop_reason"] == "max_samples"


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


# ---------------------------------------------------------------- inputs


def test_device_side_cache_holds_what_the_reference_path_reads():
    lens = [130, 1, 64]
    cache = random_paged_cache(lens, 64, 64, "fp8", seed=3, chunk_tokens=50)
    used = torch.cat([cache.block_table[b, : -(-n // 64)] for b, n in enumerate(lens)])
    assert len(set(used.tolist())) == used.numel()  # each block belongs to one request
    keys = [gather_request_keys(cache, b, n) for b, n in enumerate(lens)]
    assert all(torch.isfinite(k).all() and k.abs().max() > 0.5 for k in keys)
    rebuilt = build_paged_cache(keys, 64, "fp8", seed=9)  # FP8 re-quantises its own values exactly
    q = torch.randn(3, 1, 32, 64).to(torch.float8_e4m3fn)
    w = torch.randn(3, 32)
    ctx = torch.tensor([[130], [1], [64]], dtype=torch.int32)
    a = paged_mqa_logits(q, cache.data, w, ctx, cache.block_table, 130, cache_dtype="fp8")
    b = paged_mqa_logits(q, rebuilt.data, w, ctx, rebuilt.block_table, 130, cache_dtype="fp8")
    assert torch.equal(a, b)


# ---------------------------------------------------------------- axes


def test_bad_axes_and_values_are_rejected_with_the_allowed_ones():
    with pytest.raises(ValueError, match="backend='nope': allowed values are"):
        tiny(backend=("nope",))
    with pytest.raises(ValueError, match="strategy"):
        tiny(strategy=("sideways",))
    with pytest.raises(ValueError, match="unknown sweep axes \\['colour'\\]"):
        tiny(colour=("red",))
    with pytest.raises(ValueError, match="mixed:MIN-MAX"):
        tiny(context=("mixed:5",))
    with pytest.raises(ValueError, match="next_n=17"):
        tiny(next_n=(17,))
    with pytest.raises(ValueError, match="below the largest next_n"):
        tiny(context=("2",), next_n=(4,))


def test_context_parsing_and_point_order():
    assert ContextSpec.parse("8K").label == "8192"
    assert ContextSpec.parse("mixed:1K-64K").label == "mixed:1024-65536"
    lens = ContextSpec.parse("mixed:100-200").seq_lens(16, seed=1)
    assert min(lens) >= 100 and max(lens) <= 200 and len(set(lens)) > 1
    points = expand(tiny(batch=(1, 2), next_n=(1, 2)))
    workloads = [p.workload_key for p in points]
    assert workloads == sorted(workloads, key=workloads.index)  # each workload's points are contiguous
    assert len({p.key for p in points}) == len(points) == 2 * 2 * 3


def test_presets_exist_and_h200_full_covers_the_study():
    full = sweep.preset("h200-full")
    assert full.batch == (1, 16, 64, 128) and full.next_n == (1, 2, 3, 4, 5, 6, 8)
    assert "mixed:1024-65536" in full.context and "131072" in full.context
    assert sweep.preset("ci").backend == ("reference",)
    with pytest.raises(ValueError, match="preset"):
        sweep.preset("huge")


# ---------------------------------------------------------------- sweeps


def test_sweep_checks_times_and_skips_with_reasons(tmp_path, injected):
    spec = tiny(backend=("reference", "deepgemm", "test-narrow"))
    summary = run_sweep(spec, tmp_path / "run", "cpu", progress=False)
    assert summary.stop_reason == "complete" and summary.remaining == 0
    rows = rows_by_key(tmp_path / "run")
    assert len(rows) == len(expand(spec))
    by = {(r["backend"], r["strategy"], r["next_n"]): r for r in rows.values()}
    ok = by[("reference", "native", 3)]
    assert ok["status"] == "ok" and ok["rel_err"] <= 1e-3 and ok["median_ms"] > 0
    assert ok["timing_method"] == "wall_clock" and ok["device"] == "cpu" and ok["source"] == "measured"
    assert ok["launches"] == 1 and ok["kernel_rows"] == 6 and ok["strategy_bytes"] > 0
    atom = by[("reference", "atom", 3)]
    assert atom["status"] == "ok" and atom["pieces"] == "4[pad 1]" and atom["kernel_rows"] == 8
    assert by[("reference", "flatten", 3)]["pieces"] == "6x1"
    assert "same launch as native" in by[("reference", "atom", 1)]["message"]
    dg = by[("deepgemm", "native", 1)]
    assert dg["status"] == "skipped" and "needs a CUDA GPU" in dg["message"]
    narrow = by[("test-narrow", "native", 3)]
    assert narrow["status"] == "skipped" and "natively only next_n in [1, 2]" in narrow["message"]
    assert by[("test-narrow", "atom", 3)]["status"] == "ok"  # 3 = 2 + 1 natively
    assert by[("test-narrow", "atom", 3)]["pieces"] == "2+1"
    run = store.load_run(tmp_path / "run")
    assert set(run.results["status"]) == {"ok", "skipped"}
    assert run.provenance["progress"]["stop_reason"] == "complete"


def test_wrong_numbers_fail_untimed_and_exceptions_error_while_the_sweep_goes_on(tmp_path, injected):
    spec = tiny(backend=("test-wrong", "test-hole", "test-broken", "reference"), strategy=("native",), next_n=(1,))
    run_sweep(spec, tmp_path / "run", "cpu", progress=False)
    by = {r["backend"]: r for r in store.read_points(tmp_path / "run")}
    assert by["test-wrong"]["status"] == "failed" and "relative error" in by["test-wrong"]["message"]
    assert by["test-wrong"]["median_ms"] is None and "samples" not in by["test-wrong"]
    assert by["test-hole"]["status"] == "failed" and "NaN" in by["test-hole"]["message"]
    assert by["test-broken"]["status"] == "error" and "kernel exploded" in by["test-broken"]["message"]
    assert by["reference"]["status"] == "ok"  # after the error, the sweep went on


def test_interrupted_sweep_resumes_without_duplicates(tmp_path):
    spec = tiny()
    total = len(expand(spec))
    first = run_sweep(spec, tmp_path / "run", "cpu", max_points=2, progress=False)
    assert first.stop_reason == "max_points" and first.recorded_now == 2 and first.remaining == total - 2
    with pytest.raises(FileExistsError):
        run_sweep(spec, tmp_path / "run", "cpu", progress=False)  # no silent overwrite
    with pytest.raises(ValueError, match="another sweep spec"):
        run_sweep(tiny(next_n=(1,)), tmp_path / "run", "cpu", resume=True, progress=False)
    second = run_sweep(spec, tmp_path / "run", "cpu", resume=True, progress=False)
    assert second.recorded_before == 2 and second.recorded_now == total - 2 and second.remaining == 0
    keys = [row["point_key"] for row in store.read_points(tmp_path / "run")]
    assert len(keys) == len(set(keys)) == total
    assert len(store.load_run(tmp_path / "run").results) == total


def test_max_minutes_stops_cleanly_and_points_too_big_are_skipped(tmp_path, monkeypatch):
    stopped = run_sweep(tiny(), tmp_path / "a", "cpu", max_minutes=0, progress=False)
    assert stopped.stop_reason == "max_minutes" and stopped.recorded_now == 0
    monkeypatch.setattr(sweep, "free_device_bytes", lambda device: 1000)
    run_sweep(tiny(strategy=("native",), next_n=(1,)), tmp_path / "b", "cpu", progress=False)
    (row,) = store.read_points(tmp_path / "b")
    assert row["status"] == "skipped" and "GiB free" in row["message"] and row["estimated_bytes"] > 1000


def test_bench_command_runs_resumes_and_rejects_bad_values(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench_cli.register_cli(parser.add_subparsers(dest="command"))
    common = ["bench", "--preset", "ci", "--device", "cpu", "--out", str(tmp_path / "run"), "--no-progress",
              "--batch", "1", "--context", "80", "--next-n", "1,2", "--strategy", "native,flatten"]  # fmt: skip
    args = parser.parse_args([*common, "--max-points", "1"])
    assert args.func(args) == 0
    args = parser.parse_args([*common, "--resume"])
    assert args.func(args) == 0
    assert "0 left of 4" in capsys.readouterr().out
    assert len(store.load_run(tmp_path / "run").results) == 4
    args = parser.parse_args([*common[:-2], "--strategy", "diagonal"])
    with pytest.raises(ValueError, match="strategy='diagonal': allowed values are"):
        args.func(args)
    args = parser.parse_args(["bench", "--preset", "ci", "--next-n", "one"])
    with pytest.raises(ValueError, match="integers"):
        args.func(args)
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--colour", "red"])


def test_dry_run_estimates_the_full_preset(capsys):
    parser = argparse.ArgumentParser()
    bench_cli.register_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--preset", "h200-full", "--device", "cpu", "--dry-run"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "points" in out and "min" in out


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
