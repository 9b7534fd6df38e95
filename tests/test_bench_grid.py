"""Points and plans: sweep axes and their values, contexts and point order, presets (the sm100 preset on a
faked SM100 GPU included), atom plans from a backend's own native set, and the grid loop that builds each
workload once."""

from __future__ import annotations

import json

import pytest
import torch
from bench_support import REPO, tiny

from dsa_lab import axes
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.bench import cli as bench_cli
from dsa_lab.bench import inputs as bench_inputs
from dsa_lab.bench import presets as bench_presets
from dsa_lab.bench import walk
from dsa_lab.bench.point import SweepSpec, expand
from dsa_lab.cli import main
from dsa_lab.kernels import registry

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
