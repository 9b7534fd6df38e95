"""The harness on CPU: timing records, points and plans, the grid loop, sweeps (check, skip, fail, error,
resume), every way a run could be corrupted (locks, resume checks, failed workloads, interrupts, hung
points, OS errors), the bench command and the sm100 preset."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from dsa_lab import axes
from dsa_lab.batch.cache import build_paged_cache, gather_request_keys, random_paged_cache, split_block
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.bench import cli as bench_cli
from dsa_lab.bench import inputs as bench_inputs
from dsa_lab.bench import numerics, sweep, timing, walk
from dsa_lab.bench import presets as bench_presets
from dsa_lab.bench.point import SweepSpec, expand
from dsa_lab.bench.sweep import run_sweep
from dsa_lab.bench.timing import StoppingRule, TimingConfig, summarize, time_callable
from dsa_lab.cli import main
from dsa_lab.kernels import registry
from dsa_lab.kernels.reference import ReferenceBackend, paged_mqa_logits
from dsa_lab.store import folders as store
from dsa_lab.store import opening
from dsa_lab.store.format import LOCK_FILE

REPO = Path(__file__).resolve().parents[1]

FAST = TimingConfig(warmup=1, min_samples=2, max_samples=3, max_seconds=0.01, window=2)


def tiny(**axes) -> SweepSpec:
    base = SweepSpec(
        backend=("reference",), batch=(2,), context=("96",), next_n=(1, 3), heads=(32,), head_dim=(64,), timing=FAST
    )
    return base.with_axes(**axes)


class _Injected(ReferenceBackend):
    baseline = False
    presets = ()  # in no preset: a test's own


class _WrongBackend(_Injected):
    """Right everywhere but 1% too large: must be recorded as failed, never timed."""

    name = "test-wrong"

    def logits(self, call):
        return super().logits(call) * 1.01


class _HoleBackend(_Injected):
    """Leaves the first valid column of each row unwritten (NaN)."""

    name = "test-hole"

    def logits(self, call):
        out = super().logits(call).clone()
        out[:, 0] = float("nan")
        return out


class _BrokenBackend(_Injected):
    name = "test-broken"

    def logits(self, call):
        raise RuntimeError("kernel exploded")


class _NarrowBackend(_Injected):
    """Native only for next_n in {1, 2}, like a kernel with a fixed set of tile shapes."""

    name = "test-narrow"

    def native_next_n(self, device):
        return frozenset({1, 2})


class _SleepyBackend(_Injected):
    """Right, but each call takes `SLEEP_S` at next_n = 3 (a kernel that hangs, as Python sees it)."""

    name = "test-sleepy"
    SLEEP_S = 60.0  # far above any deadline the tests set, and above what a busy CI machine adds around them

    def logits(self, call):
        if call.q.shape[1] == 3:
            time.sleep(self.SLEEP_S)
        return super().logits(call)


class _InterruptedBackend(_Injected):
    """Ctrl-C arrives while a next_n = 3 point runs."""

    name = "test-interrupted"

    def logits(self, call):
        if call.q.shape[1] == 3:
            raise KeyboardInterrupt
        return super().logits(call)


@pytest.fixture
def injected(monkeypatch):
    """Register the test backends for one test only, so no other test module ever sees them."""
    for cls in (_WrongBackend, _HoleBackend, _BrokenBackend, _NarrowBackend, _SleepyBackend, _InterruptedBackend):
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


def test_device_side_cache_with_power_of_two_scales():
    """ue8m0: the same keys (same seed), each FP8 token's scale rounded up to a power of two, as
    `quantize_fp8(..., ue8m0=True)` does; the keys a kernel reads differ by the FP8 rounding only."""
    lens = [130, 70]
    plain = random_paged_cache(lens, 64, 64, "fp8", seed=5, chunk_tokens=64)
    pow2 = random_paged_cache(lens, 64, 64, "fp8", seed=5, chunk_tokens=64, ue8m0=True)
    assert torch.equal(plain.block_table, pow2.block_table)
    for b, n in enumerate(lens):
        blocks = pow2.block_table[b, : -(-n // 64)].long()
        scales = split_block(pow2)[1][blocks].reshape(-1)[:n]
        assert torch.equal(scales, torch.exp2(torch.log2(scales).round()))  # powers of two
        assert not torch.equal(scales, split_block(plain)[1][blocks].reshape(-1)[:n])
        a, k = gather_request_keys(plain, b, n), gather_request_keys(pow2, b, n)
        assert ((a - k).norm() / a.norm()) < 0.05  # same keys, re-rounded
    with pytest.raises(ValueError, match="ue8m0=1"):
        random_paged_cache(lens, 64, ue8m0=1)
    mx = random_paged_cache(lens, 64, 64, "mxfp4", seed=5, ue8m0=True)  # MXFP4 scales are powers of two anyway
    assert torch.equal(mx.data, random_paged_cache(lens, 64, 64, "mxfp4", seed=5).data)


# ---------------------------------------------------------------- numerics per backend and platform


def _fake_capability(monkeypatch, capability, deepgemm_available=True):
    from dsa_lab.env_info import environment_facts
    from dsa_lab.kernels.deepgemm import DeepGemmBackend
    from dsa_lab.kernels.descriptor import Availability

    environment_facts()  # cached before torch.cuda is faked: provenance describes this machine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    state = Availability(True, "") if deepgemm_available else Availability(False, "faked away")
    monkeypatch.setattr(DeepGemmBackend, "availability", lambda self, device: state)


def test_numerics_are_decided_per_backend_and_capability(monkeypatch):
    cpu = torch.device("cpu")
    assert numerics.backend_numerics("deepgemm", cpu) == numerics.DEFAULT  # unavailable here: points skipped
    assert numerics.cache_k_scales("fp8", ("deepgemm", "reference"), cpu) == "float32"
    _fake_capability(monkeypatch, (10, 0))
    sm100 = numerics.backend_numerics("deepgemm", cpu)
    assert (sm100.k_scales, sm100.tolerance) == ("ue8m0", 1e-2) and "bf16" in sm100.reason
    assert sm100.check_tolerance(1e-3) == (1e-2, sm100.reason)
    assert sm100.check_tolerance(0.05) == (0.05, "the spec's check_tolerance")  # never tighter than the spec
    assert numerics.backend_numerics("reference", cpu) == numerics.DEFAULT
    assert numerics.cache_k_scales("fp8", ("triton", "deepgemm"), cpu) == "ue8m0"  # one cache, shared
    assert numerics.cache_k_scales("fp8", ("triton",), cpu) == "float32"
    assert numerics.cache_k_scales("mxfp4", ("triton",), cpu) == "ue8m0"
    record = numerics.numerics_record(("deepgemm", "reference"), ("fp8",), 1e-3, cpu)
    assert record["backends"]["deepgemm"]["check_tolerance"] == 1e-2
    assert record["backends"]["reference"] == {
        "k_scales": "float32",
        "check_tolerance": 1e-3,
        "reason": "the spec's check_tolerance",
    }
    assert record["cache_k_scales"] == {"fp8": "ue8m0"}
    for capability in ((9, 0), (12, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert numerics.backend_numerics("deepgemm", cpu) == numerics.DEFAULT
    with pytest.raises(ValueError, match="k_scales='fp32'"):
        numerics.Numerics("fp32")


def test_reference_sweep_records_its_numerics(tmp_path):
    run_sweep(tiny(next_n=(1,)), tmp_path / "run", "cpu", progress=False)
    loaded = store.load_run(tmp_path / "run")
    ok = loaded.results[loaded.results["status"] == "ok"]
    assert len(ok) and (ok["check_tolerance"] == 1e-3).all() and (ok["k_scales"] == "float32").all()
    assert (ok["tolerance_reason"] == "the spec's check_tolerance").all()
    assert loaded.provenance["numerics"]["backends"]["reference"]["check_tolerance"] == 1e-3
    assert loaded.provenance["numerics"]["cache_k_scales"] == {"fp8": "float32"}


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
    full = bench_presets.preset("h200-full")
    assert full.batch == (1, 16, 64, 128) and full.next_n == (1, 2, 3, 4, 5, 6, 8)
    assert "mixed:1024-65536" in full.context and "131072" in full.context
    assert bench_presets.preset("ci").backend == ("reference",)
    sm100 = bench_presets.preset("sm100")
    assert (sm100.batch, sm100.context, sm100.next_n) == (full.batch, full.context, full.next_n)
    assert bench_presets.PRESETS == bench_cli.PRESETS
    with pytest.raises(ValueError, match="preset"):
        bench_presets.preset("huge")


def test_one_list_syntax_for_every_axis():
    assert axes.axis("next_n").parse("1, 2,4") == (1, 2, 4)
    assert axes.axis("strategy").parse("all") == ("native", "flatten", "atom")
    assert axes.axis("context").parse("8K,mixed:1K-64K") == ("8K", "mixed:1K-64K")
    with pytest.raises(ValueError, match="--next-n='1 2': values must be integers, comma-separated"):
        axes.axis("next_n").parse("1 2")
    with pytest.raises(ValueError, match="--batch: give at least one value"):
        axes.axis("batch").parse(" , ")


def test_a_spec_round_trips_through_its_provenance_form():
    spec = tiny(next_n=(3, 1), context=("mixed:64-200",), seed=7)
    again = SweepSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and [p.key for p in again.points()] == [p.key for p in spec.points()]
    with pytest.raises(ValueError, match="unknown fields \\['batches'\\]"):
        SweepSpec.from_dict({"batches": [1]})


# ---------------------------------------------------------------- plans and the grid loop


def test_atom_pieces_come_from_the_backends_own_native_set(injected):
    """The reference and Triton run any next_n natively: their atom plan is native itself (skipped);
    a backend native for {1, 2} splits 3 into 2 + 1."""
    cpu = torch.device("cpu")
    points = {
        p.backend: p
        for p in tiny(backend=("reference", "triton", "test-narrow"), strategy=("atom",), next_n=(3,)).points()
    }
    for name in ("reference", "triton"):
        assert "same launch as native" in walk.skip_reason(points[name], cpu)
    visit = next(walk.walk([points["test-narrow"]], tiny(next_n=(3,)), cpu))
    assert visit.ready and visit.plan.label == "2+1" and visit.plan.native_sizes == (1, 2)
    assert visit.plan.launch_shapes == ((2, 2), (2, 1)) and visit.plan.launches == 2


def test_the_grid_loop_builds_each_workload_once(monkeypatch):
    built = []
    real = bench_inputs.Workload

    class Counting(real):
        def __init__(self, point, *args, **kwargs):
            built.append(point.workload_key)
            super().__init__(point, *args, **kwargs)

    monkeypatch.setattr(walk, "Workload", Counting)
    spec = tiny(batch=(1, 2), next_n=(1, 2, 3))
    visits = list(walk.walk(spec.points(), spec, torch.device("cpu")))
    assert len(visits) == len(spec.points()) and built == [(1, "96", "fp8", 32, 64), (2, "96", "fp8", 32, 64)]
    ready = [v for v in visits if v.ready]
    assert all(v.inputs.batch.next_n == v.point.next_n for v in ready)


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
    assert by[("reference", "flatten", 3)]["pieces"] == "6x1"
    assert "same launch as native" in by[("reference", "atom", 3)]["message"]  # any next_n is native
    assert ok["pieces"] == "3" and ok["native_sizes"] == ",".join(map(str, range(1, 17)))
    dg = by[("deepgemm", "native", 1)]
    assert dg["status"] == "skipped" and "needs a CUDA GPU" in dg["message"]
    narrow = by[("test-narrow", "native", 3)]
    assert narrow["status"] == "skipped" and "natively only next_n in [1, 2]" in narrow["message"]
    assert by[("test-narrow", "atom", 3)]["status"] == "ok"  # 3 = 2 + 1 natively
    assert by[("test-narrow", "atom", 3)]["pieces"] == "2+1" and by[("test-narrow", "atom", 3)]["launches"] == 2
    run = store.load_run(tmp_path / "run")
    assert set(run.results["status"]) == {"ok", "skipped"}
    assert run.provenance["progress"]["stop_reason"] == "complete"
    timed = run.results[run.results["status"] == "ok"]
    assert set(timed["torch_threads"]) == {1} and set(timed["noisy"]) <= {True, False}  # stored per row
    assert run.provenance["spec"]["timing"]["cpu_threads"] == 1


def test_the_bench_table_marks_noisy_points():
    rows = pd.DataFrame(
        [
            {
                "backend": "reference",
                "strategy": "native",
                "batch": 1,
                "context": "80",
                "next_n": n,
                "status": "ok",
                "median_ms": ms,
                "noisy": noisy,
                "torch_threads": 1,
            }
            for n, ms, noisy in ((1, 0.5, False), (2, 0.75, True))
        ]
        + [
            {
                "backend": "reference",
                "strategy": "native",
                "batch": 1,
                "context": "80",
                "next_n": 3,
                "status": "skipped",
                "median_ms": None,
                "noisy": None,
                "torch_threads": None,
            }
        ]
    )
    table = bench_cli.results_table(rows, 0.05)
    assert "500.0 " in table + " " and "750.0~" in table
    assert "~ noisy: IQR above 5% of the median (1 of 2 points; torch threads [1])" in table
    assert "~" not in bench_cli.results_table(rows.assign(noisy=False), 0.05)


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
    assert not (tmp_path / "run" / LOCK_FILE).exists()  # the lock goes with its sweep
    second = run_sweep(spec, tmp_path / "run", "cpu", resume=True, progress=False)
    assert second.recorded_before == 2 and second.recorded_now == total - 2 and second.remaining == 0
    keys = [row["point_key"] for row in store.read_points(tmp_path / "run")]
    assert len(keys) == len(set(keys)) == total
    assert len(store.load_run(tmp_path / "run").results) == total


def test_max_minutes_stops_cleanly_and_points_too_big_are_skipped(tmp_path, monkeypatch):
    stopped = run_sweep(tiny(), tmp_path / "a", "cpu", max_minutes=0, progress=False)
    assert stopped.stop_reason == "max_minutes" and stopped.recorded_now == 0
    monkeypatch.setattr(walk, "free_device_bytes", lambda device: 1000)
    run_sweep(tiny(strategy=("native",), next_n=(1,)), tmp_path / "b", "cpu", progress=False)
    (row,) = store.read_points(tmp_path / "b")
    assert row["status"] == "skipped" and "GiB free" in row["message"] and row["estimated_bytes"] > 1000


def test_bench_command_runs_resumes_and_rejects_bad_values(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench_cli.register_cli(parser.add_subparsers(dest="command"))
    common = [
        *"bench --preset ci --device cpu --no-progress --batch 1 --context 80 --next-n 1,2 --strategy native,flatten".split(),
        "--out",
        str(tmp_path / "run"),
    ]
    args = parser.parse_args([*common, "--max-points", "1"])
    assert args.func(args) == 0
    args = parser.parse_args([*common, "--resume"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "0 left of 4" in out and "median kernel time per decode step (µs)" in out and "n=2" in out
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


# ---------------------------------------------------------------- runs that cannot be corrupted


def _bench_argv(run_dir: Path, *extra: str) -> list[str]:
    return [
        *"bench --preset ci --device cpu --no-progress --batch 1 --context 80 --next-n 1,2 --strategy native".split(),
        "--out",
        str(run_dir),
        *extra,
    ]


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_second_writer_is_refused_while_the_first_holds_the_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(_bench_argv(run_dir, "--max-points", "1")) == 0
    with opening.run_lock(run_dir):  # another sweep is writing this folder
        before = (run_dir / store.POINTS_FILE).read_bytes()
        with pytest.raises(opening.RunLocked, match=f"run folder {run_dir} is being written by pid {os.getpid()}"):
            run_sweep(tiny(), run_dir, "cpu", resume=True, progress=False)
        capsys.readouterr()
        assert main(_bench_argv(run_dir, "--resume")) == 2
        line = _one_line(capsys.readouterr().err)
        assert line.startswith("dsa-lab bench: error: run folder") and "is being written by pid" in line
        assert (run_dir / store.POINTS_FILE).read_bytes() == before
    assert main(_bench_argv(run_dir, "--resume")) == 0  # the lock died with its holder


def test_resume_refuses_a_folder_whose_rows_disagree_with_its_log(tmp_path):
    """A copy of the shipped 840-point run without points.jsonl: resuming would rebuild 3 rows from the log."""
    shipped = REPO / "data" / "h200" / "h200-full-20261129"
    run_dir = tmp_path / "h200" / "copy"
    run_dir.mkdir(parents=True)
    for name in (store.PROVENANCE_FILE, store.RESULTS_FILE):
        shutil.copy(shipped / name, run_dir / name)
    before = (run_dir / store.RESULTS_FILE).read_bytes()
    spec = SweepSpec.from_dict(store.read_provenance(run_dir / store.PROVENANCE_FILE)["spec"])
    with pytest.raises(store.RunFormatError, match="results.parquet holds 840 points, 840 of them not in points.jsonl"):
        run_sweep(spec, run_dir, "cpu", resume=True, progress=False)
    assert (run_dir / store.RESULTS_FILE).read_bytes() == before and not (run_dir / store.POINTS_FILE).exists()

    small = tmp_path / "small"
    run_sweep(tiny(), small, "cpu", progress=False)
    frame = pd.read_parquet(small / store.RESULTS_FILE)
    frame.loc[frame["status"] == "ok", "median_ms"] *= 2  # results edited behind the log's back
    frame.to_parquet(small / store.RESULTS_FILE, index=False)
    with pytest.raises(store.RunFormatError, match="the files disagree; refusing to resume"):
        run_sweep(tiny(), small, "cpu", resume=True, progress=False)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"device": "cuda", "device_name": "NVIDIA H200"},
            "device 'cuda' -> 'cpu'; device_name 'NVIDIA H200' -> 'cpu'",
        ),
        ({"environment": {"torch": "1.0.0"}}, "torch '1.0.0' -> "),
        (
            {"environment": {"deepgemm_pr340_origin": "deepseek-ai/DeepGEMM@57b90e0"}},
            "deepgemm_pr340_origin 'deepseek-ai/DeepGEMM@57b90e0' -> None",
        ),
    ],
)
def test_resume_refuses_another_device_or_environment(tmp_path, change, says):
    run_dir = tmp_path / "run"
    run_sweep(tiny(), run_dir, "cpu", max_points=1, progress=False)
    provenance = store.read_provenance(run_dir / store.PROVENANCE_FILE)
    if "environment" in change:
        change = {"environment": {**provenance["environment"], **change["environment"]}}
    store.update_provenance(run_dir, **change)
    rows = (run_dir / store.POINTS_FILE).read_bytes()
    with pytest.raises(ValueError, match=f"measured on another device or environment \\({says}"):
        run_sweep(tiny(), run_dir, "cpu", resume=True, progress=False)
    assert (run_dir / store.POINTS_FILE).read_bytes() == rows


def test_a_failed_workload_errors_its_own_points_only_and_retry_errors_reruns_them(tmp_path, monkeypatch):
    real = bench_inputs.Workload

    class Flaky(real):
        def __init__(self, point, *args, **kwargs):
            if point.batch == 1:
                raise RuntimeError("CUDA out of memory (simulated)")
            super().__init__(point, *args, **kwargs)

    monkeypatch.setattr(walk, "Workload", Flaky)
    spec = tiny(batch=(1, 2, 3), strategy=("native",))
    run_sweep(spec, tmp_path / "run", "cpu", progress=False)
    status = {(r["batch"], r["next_n"]): (r["status"], r["message"]) for r in store.read_points(tmp_path / "run")}
    assert {k for k, (s, _) in status.items() if s == "error"} == {(1, 1), (1, 3)}
    assert "workload not built: RuntimeError: CUDA out of memory" in status[(1, 3)][1]
    assert all(s == "ok" for (b, _), (s, _) in status.items() if b != 1)  # later workloads built afresh

    monkeypatch.setattr(walk, "Workload", real)
    again = run_sweep(spec, tmp_path / "run", "cpu", resume=True, progress=False)
    assert again.recorded_now == 0 and again.remaining == 0  # a plain resume leaves error rows alone
    retried = run_sweep(spec, tmp_path / "run", "cpu", resume=True, retry_errors=True, progress=False)
    assert retried.recorded_now == 2 and retried.counts == {"ok": 2}
    results = store.load_run(tmp_path / "run").results
    assert len(results) == 6 and set(results["status"]) == {"ok"}
    assert len(store.read_points(tmp_path / "run")) == 8  # the log keeps the error rows too


def test_an_interrupt_is_recorded_exits_130_and_says_how_to_resume(tmp_path, injected, capsys):
    run_dir = tmp_path / "run"
    argv = [*_bench_argv(run_dir), "--backend", "test-interrupted", "--next-n", "1,3"]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert f"Resume with: dsa-lab bench --resume --out {run_dir}" in err
    provenance = store.read_provenance(run_dir / store.PROVENANCE_FILE)
    assert provenance["progress"]["stop_reason"] == "interrupted"
    assert [r["next_n"] for r in store.read_points(run_dir)] == [1]  # the point in flight re-runs on resume
    assert store.load_run(run_dir).results["status"].tolist() == ["ok"]


def test_a_hung_point_times_out_and_the_sweep_goes_on(tmp_path, injected):
    spec = tiny(backend=("test-sleepy",), strategy=("native",), next_n=(1, 3), batch=(1, 2))
    started = time.perf_counter()
    summary = run_sweep(spec, tmp_path / "run", "cpu", point_timeout_s=0.5, progress=False)
    assert time.perf_counter() - started < _SleepyBackend.SLEEP_S  # two sleepy points, each cut at 0.5 s
    by = {(r["batch"], r["next_n"]): r for r in store.read_points(tmp_path / "run")}
    assert by[(1, 3)]["status"] == "error" and "timed out after 0.5 s (--point-timeout)" in by[(1, 3)]["message"]
    assert by[(1, 3)]["elapsed_s"] < _SleepyBackend.SLEEP_S / 4  # the point itself was cut, not slept through
    assert by[(2, 1)]["status"] == "ok" and summary.stop_reason == "complete"


def test_max_minutes_holds_against_a_hung_point(tmp_path, injected):
    spec = tiny(backend=("test-sleepy",), strategy=("native",), next_n=(3,), batch=(1, 2, 3))
    started = time.perf_counter()
    summary = run_sweep(spec, tmp_path / "run", "cpu", max_minutes=0.01, progress=False)  # 0.6 s
    assert time.perf_counter() - started < _SleepyBackend.SLEEP_S  # a sleepy point, cut when the 0.6 s budget ends
    assert summary.stop_reason == "max_minutes" and summary.recorded_now == 0  # cut by the budget: re-runs later
    assert store.read_provenance(tmp_path / "run" / store.PROVENANCE_FILE)["progress"]["stop_reason"] == "max_minutes"


def test_a_deadline_that_fires_at_once_never_leaves_its_watchdog_armed(monkeypatch):
    """A timer that fired before the block was entered (a 1 ms deadline while the watchdog thread was
    still starting) used to leave the watchdog armed: `grace_s` later it declared the point hung and ended
    the process."""
    import threading

    from dsa_lab.bench.guard import PointTimeout, deadline

    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (real_start(self), time.sleep(0.005))[0])
    hung = []
    for _ in range(10):
        with contextlib.suppress(PointTimeout), deadline(1e-9, lambda: hung.append(1), grace_s=0.05):
            pass
    time.sleep(0.3)
    assert not hung


HUNG_SCRIPT = textwrap.dedent(
    """
    import signal, sys, time
    from dsa_lab.bench import guard
    from dsa_lab.bench.point import SweepSpec
    from dsa_lab.bench.sweep import run_sweep
    from dsa_lab.bench.timing import TimingConfig
    from dsa_lab.kernels import registry
    from dsa_lab.kernels.reference import ReferenceBackend

    class Hung(ReferenceBackend):
        name, baseline = "test-hung", False
        def logits(self, call):
            if call.q.shape[1] == 3:  # a call stuck in C: no Python signal handler can run
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
                time.sleep(60)
            return super().logits(call)

    registry._BACKENDS["test-hung"] = Hung()
    guard.HANG_GRACE_S = 1.0
    spec = SweepSpec(backend=("test-hung",), strategy=("native",), batch=(2,), context=("96",), next_n=(1, 3),
                     heads=(32,), head_dim=(64,), timing=TimingConfig(warmup=1, min_samples=2, max_samples=3,
                     max_seconds=0.01, window=2))
    run_sweep(spec, sys.argv[1], "cpu", point_timeout_s=1.0, progress=False)
    """
)


def test_a_point_hung_in_c_is_recorded_and_the_process_ends(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", HUNG_SCRIPT, str(run_dir)], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == sweep.HUNG_EXIT_CODE, proc.stderr
    assert time.perf_counter() - started < 60
    assert f"Resume with: dsa-lab bench --resume --out {run_dir}" in proc.stderr
    rows = store.read_points(run_dir)
    assert [(r["next_n"], r["status"]) for r in rows] == [(1, "ok"), (3, "error")] and "hung" in rows[1]["message"]
    assert store.read_provenance(run_dir / store.PROVENANCE_FILE)["progress"]["stop_reason"] == "point_hung"
    assert len(store.load_run(run_dir).results) == 2 and not (run_dir / LOCK_FILE).exists()


def test_os_errors_print_one_line_naming_the_path(tmp_path, monkeypatch, capsys):
    existing = tmp_path / "existing"
    assert main(_bench_argv(existing, "--max-points", "1")) == 0
    capsys.readouterr()
    assert main(_bench_argv(existing)) == 2  # exists
    assert f"run folder {existing} already exists" in _one_line(capsys.readouterr().err)

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert main(_bench_argv(a_file / "run")) == 2  # a parent that is a file: read-only as far as we are concerned
    assert str(a_file) in _one_line(capsys.readouterr().err)

    real_mkdir = Path.mkdir

    def refuse(self, *args, **kwargs):
        if "denied" in str(self):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse)
    assert main(_bench_argv(tmp_path / "denied" / "run")) == 2
    line = _one_line(capsys.readouterr().err)
    assert "Permission denied" in line and str(tmp_path / "denied") in line

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.os, "fsync", full)
    assert main(_bench_argv(tmp_path / "full")) == 2
    line = _one_line(capsys.readouterr().err)
    assert (
        line
        == f"dsa-lab bench: error: cannot append to {tmp_path / 'full' / store.POINTS_FILE}: No space left on device"
    )


# ---------------------------------------------------------------- the sm100 preset


def test_sm100_preset_with_a_faked_sm100_gpu(monkeypatch, capsys):
    """On an SM100 GPU DeepGEMM runs any next_n natively (as Triton does): native runs at next_n = 3,
    and every atom plan is the native launch itself."""
    from dsa_lab.kernels.deepgemm import DeepGemmBackend
    from dsa_lab.kernels.descriptor import Availability

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    monkeypatch.setattr(DeepGemmBackend, "availability", lambda self, device: Availability(True, ""))
    cuda = torch.device("cuda")
    spec = bench_presets.preset("sm100")
    assert len(spec.points()) == 840 and spec.backend == ("deepgemm", "triton")
    reasons = {
        (p.backend, p.strategy, p.next_n): walk.skip_reason(p, cuda)
        for p in spec.points()
        if p.batch == 128 and p.context == "65536"
    }
    assert reasons[("deepgemm", "native", 3)] is None and reasons[("deepgemm", "native", 8)] is None
    assert all("same launch as native" in reasons[(b, "atom", n)] for b in spec.backend for n in spec.next_n)
    assert all(reasons[(b, "flatten", n)] is None for b in spec.backend for n in spec.next_n)
    assert bench_cli.numerics_notes(spec, cuda) == [
        f"numerics: deepgemm on cuda: K scales ue8m0, checked to 0.01 ({registry.get_backend('deepgemm').numerics[10].reason})"
    ]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # the same grid on SM90
    assert bench_cli.numerics_notes(spec, cuda) == []
    point = next(p for p in spec.points() if (p.backend, p.strategy, p.next_n) == ("deepgemm", "native", 3))
    assert "natively only next_n in [1, 2, 4]" in walk.skip_reason(point, cuda)
    assert main(["bench", "--preset", "sm100", "--device", "cpu", "--dry-run"]) == 0
    assert "840 points" in capsys.readouterr().out
    assert (REPO / "scripts" / "sm100_sweep.sh").read_text().count("PRESET=sm100") == 1


def test_cli_help_imports_no_torch_and_version_prints():
    code = (
        "import sys, time; t = time.perf_counter()\n"
        "from dsa_lab.cli import build_parser\n"
        "try:\n    build_parser(['--help']).parse_args(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', time.perf_counter() - t)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert "NO-TORCH" in proc.stdout and "compare" in proc.stdout and "profile" in proc.stdout, proc.stdout
    assert float(proc.stdout.split()[-1]) < 1.0
    version = subprocess.run(
        [sys.executable, "-m", "dsa_lab.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert version.returncode == 0 and version.stdout.startswith("dsa-lab ")
