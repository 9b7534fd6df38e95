"""Deadlines of a point: a hung point times out and the sweep goes on, --max-minutes holds against it, a
deadline that fires at once leaves no watchdog armed, and a point hung in C ends the process recorded."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time

from bench_support import REPO, _SleepyBackend, tiny

from dsa_lab.bench import sweep
from dsa_lab.bench.sweep import run_sweep
from dsa_lab.store import folders as store
from dsa_lab.store.format import LOCK_FILE


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
