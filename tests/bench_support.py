"""What the harness tests (tests/test_bench_*.py) share: a small CPU sweep spec, backends that are wrong,
leave a hole, raise, run natively only some next_n, hang or are interrupted (registered per test by the
`injected` fixture of tests/conftest.py), and the bench command line they run."""

from __future__ import annotations

import time
from pathlib import Path

from dsa_lab.bench.point import SweepSpec
from dsa_lab.bench.timing import TimingConfig
from dsa_lab.kernels.reference import ReferenceBackend
from dsa_lab.store import folders as store

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


def rows_by_key(run_dir):
    return {row["point_key"]: row for row in store.read_points(run_dir)}


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
