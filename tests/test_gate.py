"""The correctness gate cannot be fooled (issue 29): a backend that writes into its inputs, is right only once,
exits or whose probe raises is failed (or an error) and never timed; the next point is timed on clean inputs;
every way a sweep ends is recorded as what it is; a run that could not be read back is refused before its
first point."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from dsa_lab.bench import check
from dsa_lab.bench.inputs import Workload
from dsa_lab.bench.point import SweepSpec
from dsa_lab.bench.sweep import run_sweep
from dsa_lab.bench.timing import TimingConfig
from dsa_lab.cli import main
from dsa_lab.kernels import registry
from dsa_lab.kernels.reference import ReferenceBackend
from dsa_lab.store import folders as store

FAST = TimingConfig(warmup=1, min_samples=2, max_samples=3, max_seconds=0.01, window=2)


def tiny(*backends: str, **axes) -> SweepSpec:
    base = SweepSpec(
        backend=backends, batch=(2,), context=("96",), next_n=(1,), heads=(32,), head_dim=(64,), timing=FAST
    )
    return base.with_axes(strategy=("native",), **axes)


class _Injected(ReferenceBackend):
    baseline = False
    presets = ()


class _ZeroesCache(_Injected):
    """Right on its own call, then zeroes the KV cache it was handed."""

    name = "test-zeroes-cache"

    def logits(self, call):
        out = super().logits(call)
        call.kv_cache.zero_()
        return out


class _SwapsBlocks(_Injected):
    """On its first call, swaps the first two block ids of its first request in the table it was handed."""

    name = "test-swaps-blocks"
    swapped = False

    def logits(self, call):
        if not self.swapped:
            call.block_table[0, :2] = call.block_table[0, :2].flip(0).clone()
            self.swapped = True
        return super().logits(call)


class _TogglesQ(_Injected):
    """Right on every call, then flips the sign of a query element it was handed: undone by its next call."""

    name = "test-toggles-q"

    def logits(self, call):
        out = super().logits(call)
        raw = call.q.view(torch.uint8).view(-1)
        raw[0] = raw[0] ^ 0x80
        return out


class _Counting(_Injected):
    calls = 0

    def logits(self, call):
        type(self).calls += 1
        out = super().logits(call)
        return out if self.right(type(self).calls) else out * 1.01


class _RightOnce(_Counting):
    name = "test-right-once"

    def right(self, call: int) -> bool:
        return call == 1


class _RightFromSecond(_Counting):
    name = "test-right-from-second"

    def right(self, call: int) -> bool:
        return call >= 2


class _Exits(_Injected):
    name = "test-exits"

    def logits(self, call):
        sys.exit(0)


class _AvailabilityRaises(_Injected):
    name = "test-availability-raises"

    def availability(self, device):
        raise TypeError("a plug-in's bug")


class _Spy(_Injected):
    """Right; remembers the fingerprint of the KV cache and block table of every call."""

    name = "test-spy"
    seen: list[tuple[list[int], list[int]]] = []

    def logits(self, call):
        type(self).seen.append(
            (check.fingerprint(call.kv_cache).tolist(), check.fingerprint(call.block_table).tolist())
        )
        return super().logits(call)


BAD = (_ZeroesCache, _SwapsBlocks, _TogglesQ, _RightOnce, _RightFromSecond, _Exits, _AvailabilityRaises, _Spy)


@pytest.fixture
def injected(monkeypatch):
    """The bad backends, registered for one test only, their counters reset."""
    for cls in BAD:
        monkeypatch.setitem(registry._BACKENDS, cls.name, cls())
    monkeypatch.setattr(_Counting, "calls", 0)
    monkeypatch.setattr(_RightOnce, "calls", 0)
    monkeypatch.setattr(_RightFromSecond, "calls", 0)
    monkeypatch.setattr(_Spy, "seen", [])


def rows(run_dir: Path) -> dict[str, dict]:
    return {row["backend"]: row for row in store.read_points(run_dir)}


def clean_fingerprints(spec: SweepSpec) -> tuple[list[int], list[int]]:
    """The workload's KV cache and block table as built, fingerprinted: what a clean point reads."""
    point = spec.points()[0]
    built = Workload(point, point.seq_lens(spec.seed), max(spec.next_n), spec.seed, torch.device("cpu"))
    return check.fingerprint(built.cache.data).tolist(), check.fingerprint(built.cache.block_table).tolist()


# ---------------------------------------------------------------- the fingerprint


def test_the_fingerprint_sees_a_zeroed_word_a_swap_and_nothing_else() -> None:
    table = torch.arange(40, dtype=torch.int32).reshape(4, 10)
    before = check.fingerprint(table)
    assert torch.equal(check.fingerprint(table.clone()), before)
    swapped = table.clone()
    swapped[0, :2] = swapped[0, :2].flip(0).clone()
    assert not torch.equal(check.fingerprint(swapped), before)
    zeroed = table.clone()
    zeroed[3, 9] = 0
    assert not torch.equal(check.fingerprint(zeroed), before)
    raw = torch.arange(7, dtype=torch.uint8)  # 7 bytes: read as bytes, not words
    moved = raw.flip(0).clone()
    assert not torch.equal(check.fingerprint(moved), check.fingerprint(raw))


def test_the_fingerprint_reads_in_passes_and_sees_a_swap_across_them(monkeypatch) -> None:
    monkeypatch.setattr(check, "FINGERPRINT_WORDS", 16)
    data = torch.randint(0, 255, (1000,), dtype=torch.uint8)
    before = check.fingerprint(data)
    moved = data.view(torch.int32).clone()
    moved[[3, 200]] = moved[[200, 3]].clone()
    assert moved[3] != moved[200] and not torch.equal(check.fingerprint(moved.view(torch.uint8)), before)


def test_a_guard_names_what_changed_and_guards_a_shared_tensor_once() -> None:
    cache, table = torch.ones(8, dtype=torch.uint8), torch.arange(6, dtype=torch.int32)
    guard = check.InputGuard.of({"KV cache": cache, "block table": table, "block table (launch 0)": table})
    assert guard.names == ("KV cache", "block table") and guard.changed() == ()
    table[0] = 5
    assert guard.changed() == ("block table",)
    with pytest.raises(ValueError, match="lens: expected a torch.Tensor to guard, got list"):
        check.InputGuard.of({"lens": [1, 2]})


# ---------------------------------------------------------------- bad backends: failed, never timed, next point clean


@pytest.mark.parametrize(
    "bad, says",
    [
        ("test-zeroes-cache", "the backend changed its inputs: KV cache"),
        ("test-swaps-blocks", "the backend changed its inputs: block table"),
        ("test-toggles-q", "the backend changed its inputs: q (launch 0)"),
        ("test-right-once", "call 2 of 2 (call 1: 0.000e+00): relative error"),
        ("test-right-from-second", "call 1 of 2: relative error"),
    ],
)
def test_a_backend_that_damages_its_inputs_or_is_right_once_fails_untimed_and_the_next_point_reads_clean_inputs(
    tmp_path: Path, injected, bad: str, says: str
) -> None:
    spec = tiny(bad, "test-spy", "reference")
    summary = run_sweep(spec, tmp_path / "run", "cpu", progress=False)
    by = rows(tmp_path / "run")
    assert summary.stop_reason == "complete"
    assert by[bad]["status"] == "failed" and says in by[bad]["message"], by[bad]["message"]
    assert by[bad]["median_ms"] is None and "samples_ms" not in by[bad]
    assert by["test-spy"]["status"] == "ok" and by["reference"]["status"] == "ok"
    assert _Spy.seen and all(seen == clean_fingerprints(spec) for seen in _Spy.seen)


def test_a_backend_that_damages_its_inputs_only_while_timed_is_failed_too(tmp_path: Path, monkeypatch) -> None:
    """The check's calls are right and clean; from the third call on (the timing) it zeroes the cache."""

    class Late(_Injected):
        name = "test-late-damage"
        calls = 0

        def logits(self, call):
            type(self).calls += 1
            out = super().logits(call)
            if type(self).calls > check.CHECKED_CALLS:
                call.kv_cache.zero_()
            return out

    monkeypatch.setitem(registry._BACKENDS, Late.name, Late())
    monkeypatch.setitem(registry._BACKENDS, _Spy.name, _Spy())
    monkeypatch.setattr(_Spy, "seen", [])
    spec = tiny(Late.name, "test-spy")
    run_sweep(spec, tmp_path / "run", "cpu", progress=False)
    by = rows(tmp_path / "run")
    assert by[Late.name]["status"] == "failed" and "changed its inputs: KV cache" in by[Late.name]["message"]
    assert by[Late.name]["median_ms"] is None and by[Late.name]["rel_err"] == 0.0  # its check had passed
    assert by["test-spy"]["status"] == "ok" and all(seen == clean_fingerprints(spec) for seen in _Spy.seen)


# ---------------------------------------------------------------- how a sweep ends


def test_a_backend_that_exits_is_recorded_as_exited_and_bench_exits_non_zero(tmp_path: Path, injected, capsys) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit):
        run_sweep(tiny("test-exits", "reference"), run_dir, "cpu", progress=False)
    progress = store.read_provenance(run_dir / store.PROVENANCE_FILE)["progress"]
    assert progress["stop_reason"] == "exited" and progress["stop_error"] == "SystemExit(0)"
    assert rows(run_dir)["test-exits"]["status"] == "error"
    assert "SystemExit(0) raised while this point ran" in rows(run_dir)["test-exits"]["message"]
    argv = ["bench", "--backend", "test-exits,reference", "--batch", "2", "--context", "96", "--next-n", "1",
            "--strategy", "native", "--heads", "32", "--head-dim", "64", "--device", "cpu", "--no-progress",
            "--max-seconds-per-point", "0.01", "--out", str(tmp_path / "cli")]  # fmt: skip
    assert main(argv) == 4
    assert "a backend raised SystemExit(0) (recorded as stop 'exited'" in capsys.readouterr().err
    progress = store.read_provenance(tmp_path / "cli" / store.PROVENANCE_FILE)["progress"]
    assert progress["stop_reason"] == "exited"


def test_a_probe_that_raises_is_an_error_row_naming_the_backend_and_the_sweep_goes_on(tmp_path: Path, injected) -> None:
    summary = run_sweep(tiny("test-availability-raises", "reference"), tmp_path / "run", "cpu", progress=False)
    by = rows(tmp_path / "run")
    assert summary.stop_reason == "complete" and by["reference"]["status"] == "ok"
    assert by["test-availability-raises"]["status"] == "error"
    assert (
        "backend 'test-availability-raises': availability() raised TypeError: a plug-in's bug"
        in by["test-availability-raises"]["message"]
    )


def test_a_crash_out_of_the_loop_is_recorded_with_its_name_before_it_propagates(tmp_path: Path, monkeypatch) -> None:
    from dsa_lab.bench import sweep

    def broken_walk(*args, **kwargs):
        raise LookupError("the walk broke")
        yield  # a generator, as the walk is

    monkeypatch.setattr(sweep, "walk", broken_walk)
    with pytest.raises(LookupError):
        run_sweep(tiny("reference"), tmp_path / "run", "cpu", progress=False)
    progress = store.read_provenance(tmp_path / "run" / store.PROVENANCE_FILE)["progress"]
    assert progress["stop_reason"] == "crashed" and progress["stop_error"] == "LookupError: the walk broke"


# ---------------------------------------------------------------- names before the first point


def test_a_run_that_could_not_be_read_back_is_refused_before_its_first_point(tmp_path: Path, monkeypatch) -> None:
    class Badly(_Injected):
        name = "my kernel<b>"

    monkeypatch.setitem(registry._BACKENDS, Badly.name, Badly())
    with pytest.raises(ValueError, match=r"the grid cannot be stored.*column 'backend' holds a value that is not a"):
        run_sweep(tiny(Badly.name), tmp_path / "run", "cpu", progress=False)
    with pytest.raises(ValueError, match=r"run folder .*my run: its name is the run id; run_id='my run'"):
        run_sweep(tiny("reference"), tmp_path / "my run", "cpu", progress=False)
    assert not any(tmp_path.iterdir())


def test_bench_refuses_an_out_whose_last_part_is_no_run_id_or_that_is_not_a_folder(tmp_path: Path, capsys) -> None:
    fifo, link = tmp_path / "fifo", tmp_path / "link"
    import os

    os.mkfifo(fifo)
    link.symlink_to(tmp_path / "elsewhere")
    for out, says in (
        (tmp_path / "my run", "its last part is the run id"),
        (fifo, "is a FIFO (named pipe), not a folder"),
        (link, "is a symbolic link to"),
    ):
        assert main(["bench", "--device", "cpu", "--dry-run", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "elsewhere").exists() and fifo.is_fifo()


def test_the_check_result_names_its_calls_and_what_it_held(tmp_path: Path, injected) -> None:
    run_sweep(tiny("reference"), tmp_path / "run", "cpu", progress=False)
    row = rows(tmp_path / "run")["reference"]
    assert row["status"] == "ok" and row["rel_err"] == 0.0
    provenance = json.loads((tmp_path / "run" / store.PROVENANCE_FILE).read_text())
    assert provenance["progress"] == {"points_total": 1, "points_recorded": 1, "stop_reason": "complete"}
