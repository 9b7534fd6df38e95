"""`dsa-lab profile --tool nsight` on the CPU, against a stand-in for nsight-python 1.1.0
(tests/stand_ins/nsight: the API surface dsa_lab uses, read from nsight-python's sources): the
import order its CUPTI tool needs, each point timed by the harness and by nsight-python on the same
inputs with the ratio stored, the table kept in the profile run, and the refusals that say why."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from dsa_lab.bench.presets import preset
from dsa_lab.cli import main
from dsa_lab.kernels import registry
from dsa_lab.kernels.reference import ReferenceBackend
from dsa_lab.profiling import cli as profile_cli
from dsa_lab.profiling import nsight_timing
from dsa_lab.profiling.nsight_timing import NsightUnavailable, load_nsight, run_nsight
from dsa_lab.profiling.runs import load_profile_run

STAND_IN = Path(__file__).resolve().parent / "stand_ins"
CPU = torch.device("cpu")


@pytest.fixture
def nsight(monkeypatch: pytest.MonkeyPatch):
    """A fresh import of the stand-in, as `load_nsight` makes it (NSPY_NCU_INIT_AT_IMPORT unset before)."""
    monkeypatch.syspath_prepend(str(STAND_IN))
    monkeypatch.delitem(sys.modules, "nsight", raising=False)
    monkeypatch.delenv("NSPY_NCU_INIT_AT_IMPORT", raising=False)
    module = load_nsight()
    yield module
    sys.modules.pop("nsight", None)


class _Wrong(ReferenceBackend):
    name = "test-nsight-wrong"
    baseline = False

    def logits(self, call):
        return super().logits(call) * 1.01


def _spec(**axes):
    return preset("ci").with_axes(batch=(1,), context=("96",), next_n=(1, 2), **axes)


def test_load_nsight_keeps_ncu_off_at_import_and_activates_cupti(nsight) -> None:
    assert nsight.INIT_AT_IMPORT == "0"  # set before the import, or NCU would have taken the process
    assert nsight.get_active_tool() == nsight.Tool.CUPTI
    assert load_nsight() is nsight  # a second call is a no-op


def test_an_ncu_tool_already_active_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(STAND_IN))
    monkeypatch.delitem(sys.modules, "nsight", raising=False)
    monkeypatch.setenv("NSPY_NCU_INIT_AT_IMPORT", "1")
    __import__("nsight")  # imported by someone else first: NCU activated

    try:
        with pytest.raises(NsightUnavailable, match="'ncu' tool|Tool.NCU.*already active"):
            load_nsight()
    finally:
        sys.modules.pop("nsight", None)


def test_without_nsight_python_the_install_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nsight", None)  # import nsight raises ImportError
    with pytest.raises(
        NsightUnavailable, match="nsight-python is not importable here.*pip install nsight-python==1.1.0"
    ):
        load_nsight()


def test_each_point_is_timed_by_both_timers_on_the_same_inputs(nsight, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._BACKENDS, _Wrong.name, _Wrong())
    calls: list[tuple[str, int]] = []
    real = nsight_timing.nsight_time

    def spy(module, step, before, name, runs):
        calls.append((name, runs))
        return real(module, step, before, name, runs)

    monkeypatch.setattr(nsight_timing, "nsight_time", spy)
    said: list[str] = []
    table, configs = run_nsight(
        _spec(backend=("reference", _Wrong.name, "deepgemm")), CPU, runs=4, log=said.append, nsight=nsight
    )
    status = {(c["backend"], c["strategy"], c["next_n"]): c["status"] for c in configs}
    assert status[("reference", "native", 1)] == "profiled" and status[("reference", "flatten", 2)] == "profiled"
    assert status[(_Wrong.name, "native", 1)] == "failed"  # the harness's check first: never timed
    assert status[("deepgemm", "native", 1)] == "skipped" and status[("reference", "atom", 2)] == "skipped"
    assert len(table) == sum(s == "profiled" for s in status.values()) == len(calls)
    assert {runs for _, runs in calls} == {4} and all(name.startswith("backend=reference|") for name, _ in calls)
    assert set(table["backend"]) == {"reference"} and (table["nsight_runs"] == 4).all()
    assert (table["nsight_mean_ns"] > 0).all() and (table["nsight_ci95_low_ns"] <= table["nsight_mean_ns"]).all()
    ratio = table["harness_median_ms"] * 1e6 / table["nsight_mean_ns"]
    assert table["timer_over_nsight"].tolist() == pytest.approx(ratio.tolist())
    assert table["timing_method"].eq("wall_clock").all() and table["nsight_stable"].map(type).isin([bool]).all()
    assert {"strategy_kv_bytes", "launches", "device_name"} <= set(table.columns)  # the point's plan on every row
    assert any(line.startswith("nsight reference native B=1 L=96 n=1:") for line in said)


def test_a_point_nsight_python_refuses_is_an_error_of_its_own(nsight, monkeypatch: pytest.MonkeyPatch) -> None:
    class ProfilerException(Exception):  # nsight-python's own type derives from Exception only
        pass

    def refuse(*args, **kwargs):
        def decorate(func):
            def wrapper():
                raise ProfilerException("The cupti tool dropped 3 activity records")

            return wrapper

        return decorate

    monkeypatch.setattr(nsight.analyze, "kernel", refuse)
    table, configs = run_nsight(_spec(strategy=("native",)), CPU, runs=2, log=lambda m: None, nsight=nsight)
    assert table.empty and [c["status"] for c in configs] == ["error", "error"]  # next_n 1 and 2
    assert (
        configs[0]["reason"]
        == "RuntimeError: nsight-python: ProfilerException: The cupti tool dropped 3 activity records"
    )


def test_the_profile_command_keeps_the_nsight_table(
    nsight, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The CLI's wiring with the device check passed (there is no CUDA here): tables, provenance, summary."""
    monkeypatch.setattr(profile_cli, "_nsight_for", lambda tools, device: nsight if "nsight" in tools else None)
    out = tmp_path / "profile"
    argv = [
        *"profile --tool torch,nsight --device cpu --batch 1 --context 96 --next-n 1 --heads 32 --head-dim 64 --no-trace --nsight-runs 3".split(),
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "timer_over_nsight = harness median / nsight mean" in printed
    run = load_profile_run(out)
    assert len(run.nsight) == 2 and set(run.nsight["strategy"]) == {"native", "flatten"}
    assert run.provenance["nsight"] == {"version": nsight_timing.nsight_version(), "tool": "cupti", "runs": 3}
    assert {c["tool"] for c in run.provenance["configs"]} == {"torch", "nsight"}
    assert not run.kernels.empty  # torch's tables beside it
    assert (out / "nsight_times.parquet").is_file()


def test_the_profile_command_refuses_nsight_without_a_gpu(tmp_path: Path, capsys) -> None:
    argv = [
        *"profile --tool nsight --device cpu --batch 1 --context 96 --next-n 1".split(),
        "--out",
        str(tmp_path / "run"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == "dsa-lab profile: error: --tool nsight times CUDA kernels through CUPTI; device is cpu"
    assert not (tmp_path / "run").exists()
    assert main([*argv[:-2], "--nsight-runs", "1", "--out", str(tmp_path / "run")]) == 2
    assert "--nsight-runs=1" in capsys.readouterr().err


def test_notebook_04_says_how_to_open_traces_and_reports() -> None:
    import nbformat

    path = Path(__file__).resolve().parents[1] / "notebooks" / "04_kernel_profiles.ipynb"
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    assert "ui.perfetto.dev" in text and "Nsight Compute UI" in text and "read_ncu_report" in text
    assert "nsight_times.parquet" in text
