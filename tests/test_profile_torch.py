"""Profiling with torch.profiler on the CPU reference path: the phased step, native, atom and flatten
launches, the harness check that refuses an incorrect backend, the plan's columns, a CUDA trace's kernels by
the phase that launched them, and `dsa-lab profile --tool torch`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from profile_support import CPU, TOPK, HoleBackend, OneTwoBackend, SkewedBackend, grid

from dsa_lab.batch.cache import gather_request_keys
from dsa_lab.batch.plan import LaunchPlan
from dsa_lab.bench.inputs import Workload
from dsa_lab.cli import main as cli_main
from dsa_lab.decode import run_decode
from dsa_lab.kernels import get_backend, registry
from dsa_lab.profiling import PHASES, ProfileSettings, load_profile_run, phased_decode, profile_step, run_torch
from dsa_lab.profiling.torch_profile import tables_from_trace


@pytest.fixture(scope="module")
def inputs3():
    point = grid().points()[0]
    return Workload(point, point.seq_lens(0), 3, 5, CPU).inputs(point)


def plan3(strategy: str, sizes=tuple(range(1, 17))) -> LaunchPlan:
    return LaunchPlan((160, 160), 3, strategy, 64, 128, "fp8", sizes)


def test_phased_step_equals_run_decode(inputs3) -> None:
    phased = phased_decode(inputs3, plan3("flatten"), get_backend("reference"), TOPK)
    plain = run_decode(inputs3, "flatten", "reference", TOPK)
    assert torch.equal(phased.logits, plain.logits)
    assert torch.equal(phased.indices, plain.indices)


def test_the_harness_inputs_hold_finite_quantised_keys(inputs3) -> None:
    cache = inputs3.cache
    assert cache.data.shape[1:] == (64, 1, 132)
    used = cache.block_table[:, :3].flatten()
    assert len(set(used.tolist())) == used.numel()  # requests own distinct blocks
    keys = gather_request_keys(cache, 1, 160)
    assert torch.isfinite(keys).all() and keys.abs().sum() > 0
    assert inputs3.q.float().abs().sum() > 0


def test_torch_profile_native_atom_and_flatten_launches(inputs3, tmp_path: Path) -> None:
    reference = get_backend("reference")
    config = {"backend": "reference", "strategy": "native", "batch": 2, "next_n": 3}
    native = profile_step(inputs3, plan3("native"), reference, config, topk=TOPK, trace_dir=tmp_path)
    assert native.launch_shapes == ((2, 3),)
    phases = native.phases.set_index("phase")
    assert set(PHASES) <= set(phases.index)
    assert phases.loc["logits", "calls"] == 1
    assert native.kernels["kernel_launches"].sum() > 0 and (native.kernels["total_us"] >= 0).all()
    assert native.kernels["share"].sum() == pytest.approx(1.0)
    assert (native.kernels["batch"] == 2).all()

    split = profile_step(inputs3, plan3("atom", (1, 2)), OneTwoBackend(), {**config, "strategy": "atom"}, topk=TOPK)
    assert split.launch_shapes == ((2, 2), (2, 1))
    assert split.phases.set_index("phase").loc["logits", "calls"] == 2
    assert split.phases.set_index("phase").loc["pack", "calls"] == 2
    assert split.trace_path is None

    padded = profile_step(inputs3, plan3("atom", (1, 2, 4)), reference, config, topk=TOPK)  # 3 = padded 4
    assert padded.launch_shapes == ((2, 4),)
    flat = profile_step(inputs3, plan3("flatten"), reference, config, topk=TOPK)
    assert flat.launch_shapes == ((6, 1),)

    trace = json.loads(native.trace_path.read_text())
    names = {e.get("name") for e in trace["traceEvents"] if e.get("cat") == "user_annotation"}
    assert set(PHASES) <= names


@pytest.mark.parametrize(("backend", "says"), [(SkewedBackend, "relative error"), (HoleBackend, "NaN")])
def test_an_incorrect_backend_is_refused_by_the_harness_check(monkeypatch, backend, says) -> None:
    monkeypatch.setitem(registry._BACKENDS, backend.name, backend())
    run = run_torch(
        grid(backend=("reference", backend.name), strategy=("native",)),
        CPU,
        ProfileSettings(TOPK),
        log=lambda message: None,
    )
    by = {c["backend"]: c for c in run.configs}
    assert by["reference"]["status"] == "profiled" and by["reference"]["rel_err"] == 0.0
    assert by[backend.name]["status"] == "failed" and says in by[backend.name]["reason"]
    assert "refusing to profile" in by[backend.name]["reason"] and set(run.kernels["backend"]) == {"reference"}


def test_plan_columns_count_kv_once_and_flatten_rereads() -> None:
    native, flatten = LaunchPlan((100, 100), 4, "native"), LaunchPlan((100, 100), 4, "flatten")
    assert native.columns()["unique_kv_bytes"] == 2 * 100 * 132
    assert native.columns()["flops"] == 2 * 64 * 128 * 2 * (97 + 98 + 99 + 100)
    assert native.columns()["strategy_kv_bytes"] == 2 * 100 * 132
    assert flatten.columns()["strategy_kv_bytes"] == 2 * (97 + 98 + 99 + 100) * 132


def test_cli_profile_cpu_reference(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(registry._BACKENDS, SkewedBackend.name, SkewedBackend())
    monkeypatch.setitem(registry._BACKENDS, OneTwoBackend.name, OneTwoBackend())
    out = tmp_path / "run"
    code = cli_main(
        [
            *"profile --tool torch --device cpu --batch 2 --context 128 --next-n 2,3 --heads 64 --head-dim 128".split(),
            "--backend",
            f"reference,{SkewedBackend.name},{OneTwoBackend.name}",
            "--topk",
            str(TOPK),
            "--out",
            str(out),
        ]
    )
    assert code == 0
    run = load_profile_run(out)
    assert run.provenance["kind"] == "profile" and run.provenance["source"] == "measured"
    assert run.provenance["spec"]["next_n"] == [2, 3] and run.provenance["profile"]["topk"] == TOPK
    assert set(run.kernels.loc[run.kernels["backend"] == "reference", "strategy"]) == {"native", "flatten"}
    assert set(run.kernels.loc[run.kernels["backend"] == OneTwoBackend.name, "strategy"]) == {
        "native",
        "flatten",
        "atom",
    }
    assert {"batch", "context", "heads", "launches", "kernel_launches"} <= set(run.kernels.columns)
    status = {(c["backend"], c["strategy"], c["next_n"]): c for c in run.configs}
    assert "same launch as native" in status[("reference", "atom", 3)]["reason"]  # any next_n is native
    assert status[(OneTwoBackend.name, "atom", 3)]["pieces"] == "2+1"
    assert status[(OneTwoBackend.name, "native", 3)]["status"] == "skipped"
    refused = [c for c in run.configs if c["backend"] == SkewedBackend.name and c["strategy"] != "atom"]
    assert len(refused) == 4 and all(c["status"] == "failed" and "relative error" in c["reason"] for c in refused)
    assert (out / "trace_reference.json.gz").is_file()
    assert run.ncu.empty
    assert "reference" in capsys.readouterr().out


def _event(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0 if cat in ("kernel", "gpu_memcpy") else 100,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def test_cuda_trace_kernels_go_to_the_phase_that_launched_them() -> None:
    """A Kineto-style CUDA trace: runtime and driver launches, and a kernel known only by External id."""
    events = [
        _event("user_annotation", "metadata", 0, 10, **{"External id": 1}),
        _event("cuda_runtime", "cudaMemcpyAsync", 2, 1, correlation=11),
        _event("user_annotation", "pack", 10, 10, **{"External id": 2}),
        _event("cpu_op", "aten::index", 11, 5, **{"External id": 3}),
        _event("cuda_runtime", "cudaLaunchKernel", 12, 1, correlation=12),
        _event("user_annotation", "logits", 20, 10, **{"External id": 4}),
        _event("cuda_driver", "cuLaunchKernelEx", 21, 1, correlation=13),
        _event("user_annotation", "logits", 30, 10, **{"External id": 5}),
        _event("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 50, 2, tid=7, correlation=11),
        _event("kernel", "index_kernel", 53, 3, tid=7, correlation=12, grid=[4, 1, 1]),
        _event("kernel", "paged_logits<2>", 57, 30, tid=7, correlation=13, grid=[132, 1, 1]),
        _event("kernel", "paged_logits<2>", 88, 30, tid=7, correlation=99, grid=[132, 1, 1], **{"External id": 5}),
        _event("kernel", "stray", 120, 1, tid=7, correlation=98),
    ]
    kernels, phases = tables_from_trace({"traceEvents": events}, "cuda")
    where = kernels.set_index("kernel")
    assert where.loc["Memcpy HtoD (Pageable -> Device)", "phase"] == "metadata"
    assert where.loc["index_kernel", "phase"] == "pack" and where.loc["index_kernel", "grid"] == "(4, 1, 1)"
    logits = where.loc["paged_logits<2>"]
    assert logits["phase"] == "logits" and logits["kernel_launches"] == 2 and logits["calls"] == 2
    assert logits["total_us"] == 60 and logits["mean_us"] == 30 and logits["first_start_us"] == 7
    assert where.loc["stray", "phase"] == "other"
    assert kernels["share"].sum() == pytest.approx(1.0)
    per_phase = phases.set_index("phase")
    assert per_phase.loc["logits", "calls"] == 2 and per_phase.loc["logits", "device_us"] == 60
    assert per_phase.loc["logits", "wall_us"] == 20
