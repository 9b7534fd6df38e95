"""Profiling with Nsight Compute, without one: ncu detection (missing, too old, not permitted, the CLI path),
the metric query and command, CSV parsing, configs attached and normalised per useful byte, the target's
bookkeeping, and the runner (a fake ncu) that retries unknown metrics and reads the kept report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from profile_support import CPU, HEADER, TOPK, OneTwoBackend, SkewedBackend, _csv_for_steps, _metrics, _rows, grid

from dsa_lab.cli import main as cli_main
from dsa_lab.kernels import registry
from dsa_lab.kernels.reference import ReferenceBackend
from dsa_lab.profiling import NcuUnavailable, ProfileSettings, attach_configs, detect_ncu, parse_ncu_csv, summarize_ncu
from dsa_lab.profiling.ncu import missing_metrics, ncu_command, query_metric_names, require_ncu, usable_metrics


def _fake_run(stdout: str):
    def run(command, **kwargs):  # type: ignore[no-untyped-def]
        return subprocess.CompletedProcess(command, 0, stdout=stdout, stderr="")

    return run


def test_missing_ncu_gives_one_clear_message(tmp_path: Path) -> None:
    status = detect_ncu(which=lambda name: None, globs=(), params=tmp_path / "none")
    assert not status.usable
    with pytest.raises(NcuUnavailable) as err:
        require_ncu(status)
    message = str(err.value)
    assert "Nsight Compute not found" in message and "2022.1" in message and "\n" not in message


def test_cli_ncu_without_ncu_exits_with_one_line(monkeypatch, tmp_path: Path, capsys) -> None:
    from dsa_lab.profiling import ncu

    missing = detect_ncu(which=lambda name: None, globs=(), params=tmp_path / "none")
    monkeypatch.setattr(ncu, "detect_ncu", lambda: missing)
    code = cli_main(["profile", "--tool", "ncu", "--device", "cpu", "--out", str(tmp_path / "run")])
    captured = capsys.readouterr()
    assert code == 2
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Nsight Compute not found" in lines[0] and "Traceback" not in captured.err


def test_ncu_too_old_or_not_permitted(tmp_path: Path, monkeypatch) -> None:
    old = detect_ncu(which=lambda name: "/x/ncu", run=_fake_run("Version 2021.1.0 (build 1)"), params=tmp_path / "none")
    assert not old.usable and "too old" in old.problems[0]
    params = tmp_path / "params"
    params.write_text("RmProfilingAdminOnly: 1\n")
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    locked = detect_ncu(
        which=lambda name: "/x/ncu", run=_fake_run("Version 2025.3.1.0 (build 36398880)"), params=params
    )
    assert locked.counters_permitted is False and "RmProfilingAdminOnly" in locked.problems[0]


def test_ncu_cli_path_chosen_and_explained(tmp_path: Path) -> None:
    status = detect_ncu(
        which=lambda name: "/opt/ncu",
        run=_fake_run("NVIDIA Nsight Compute\nVersion 2025.3.1.0 (build 36398880)"),
        params=tmp_path / "none",
    )
    assert status.usable and status.path == "ncu-cli" and status.ncu_version == (2025, 3, 1)
    assert "nsight-python" in status.reason
    assert status.as_dict()["ncu_version"] == "2025.3.1"


def test_metric_query_and_command() -> None:
    listing = (
        "Device NVIDIA H200 (GH100)\ndram__bytes_read   Counter   # of bytes read\ngpu__time_duration  Counter  time\n"
    )
    offered = query_metric_names("/opt/ncu", "gh100", run=_fake_run(listing))
    kept, dropped = usable_metrics(["dram__bytes_read.sum", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct"], offered)
    assert kept == ["dram__bytes_read.sum"] and dropped == ["sm__pipe_tensor_op_gmma_cycles_active.avg.pct"]
    command = ncu_command("/opt/ncu", kept, ["python", "-m", "dsa_lab.profiling", "--ncu-target"], launch_count=40)
    assert command[:2] == ["/opt/ncu", "--csv"] and "--profile-from-start" in command and "kernel" in command
    assert command[command.index("--metrics") + 1] == "dram__bytes_read.sum" and "--export" not in command
    kept = ncu_command("/opt/ncu", kept, ["python"], launch_count=40, export=Path("/r/ncu_x.ncu-rep"))
    assert kept[kept.index("--export") + 1] == "/r/ncu_x.ncu-rep" and kept[-1] == "python"
    assert missing_metrics("==ERROR== Failed to find metric sm__foo.avg.pct_of_peak_sustained_active") == [
        "sm__foo.avg.pct_of_peak_sustained_active"
    ]


NCU_SAMPLE = "\n".join(
    [
        "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
        '==PROF== Profiling "dsa_lab_ncu_marker" - 0: 0%....50%....100% - 1 pass',
        HEADER,
        *_rows(0, "dsa_lab_ncu_marker", "(1, 1, 1)", {"gpu__time_duration.sum": ("nsecond", "1,504")}),
        *_rows(1, "void paged_mqa_logits_kernel<4>(Params)", "(132, 1, 1)", _metrics("0.28", "10", "20")),
        *_rows(2, "dsa_lab_ncu_marker", "(2, 1, 1)", {"gpu__time_duration.sum": ("nsecond", "1,480")}),
        *_rows(3, "void paged_mqa_logits_kernel<1>(Params)", "(132, 1, 1)", _metrics("0.54", "30", "5")),
        '"3","4242","python3.12","127.0.0.1","void paged_mqa_logits_kernel<1>(Params)","1","7","(128, 1, 1)",'
        '"(132, 1, 1)","0","9.0","SOL","","","","SOLBottleneck","WRN","memory bound","global","12"',
        "==PROF== Disconnected from process 4242",
    ]
)


def _manifest() -> dict:
    common = {
        "backend": "fake",
        "device_name": "NVIDIA H200",
        "batch": 2,
        "context": "1024",
        "next_n": 4,
        "heads": 64,
        "head_dim": 128,
        "cache_dtype": "fp8",
        "unique_kv_bytes": 2 * 1024 * 132.0,
        "flops": 2 * 64 * 128 * 2 * (1021 + 1022 + 1023 + 1024.0),
        "kernel_rows": 8,
    }
    return {
        "configs": [
            {**common, "index": 0, "strategy": "native", "launches": 1, "strategy_kv_bytes": 2 * 1024 * 132.0},
            {**common, "index": 1, "strategy": "flatten", "launches": 1, "strategy_kv_bytes": 2 * 4090 * 132.0},
            {
                **common,
                "index": 2,
                "strategy": "atom",
                "launches": 1,
                "strategy_kv_bytes": 2 * 1024 * 132.0,
                "same_as": 0,
            },
        ],
        "steps": [{"marker": 0, "config": 0, "repeat": 0}, {"marker": 1, "config": 1, "repeat": 0}],
    }


def test_parse_ncu_csv_units_and_na() -> None:
    table = parse_ncu_csv(NCU_SAMPLE)
    assert list(table["id"]) == [0, 1, 2, 3]
    logits = table.set_index("id").loc[1]
    assert logits["dram_read_bytes"] == pytest.approx(280_000)
    assert logits["dram_write_bytes"] == 4096
    assert logits["duration_ns"] == pytest.approx(10_000)
    assert logits["l2_read_bytes"] == 320_000
    assert logits["grid"] == "(132, 1, 1)" and logits["block"] == "(128, 1, 1)"
    assert pd.isna(logits["tensor_hmma_pct"]) and logits["tensor_gmma_pct"] == 20
    assert table.set_index("id").loc[0, "duration_ns"] == 1504
    assert parse_ncu_csv("==ERROR== something broke").empty


def test_attach_and_summarize_normalise_per_useful_byte() -> None:
    kernels = attach_configs(parse_ncu_csv(NCU_SAMPLE), _manifest())
    assert "dsa_lab_ncu_marker" not in set(kernels["kernel"])
    assert list(kernels["strategy"]) == ["native", "flatten", "atom"]
    assert kernels.set_index("strategy").loc["atom", "copied_from"] == "native"
    summary = summarize_ncu(kernels).set_index("strategy")
    unique = 2 * 1024 * 132.0
    assert summary.loc["native", "dram_read_per_unique"] == pytest.approx(280_000 / unique)
    assert summary.loc["flatten", "dram_read_per_unique"] == pytest.approx(540_000 / unique)
    reread = 2 * 4090 * 132.0 - unique
    assert summary.loc["flatten", "l2_absorbed"] == pytest.approx(1 - (540_000 - unique) / reread)
    assert pd.isna(summary.loc["native", "l2_absorbed"])
    assert summary.loc["native", "effective_tbps"] == pytest.approx(unique / 10e-6 / 1e12)
    flops = 2 * 64 * 128 * 2 * (1021 + 1022 + 1023 + 1024)
    assert summary.loc["flatten", "useful_tflops"] == pytest.approx(flops / 30e-6 / 1e12)
    assert summary.loc["atom", "duration_ns"] == summary.loc["native", "duration_ns"]


def test_ncu_target_bookkeeping_on_cpu(tmp_path: Path, monkeypatch) -> None:
    from contextlib import nullcontext

    from dsa_lab.profiling.target import TargetPlan, run_target

    markers: list[int] = []
    monkeypatch.setitem(registry._BACKENDS, OneTwoBackend.name, OneTwoBackend())
    spec = grid(backend=(OneTwoBackend.name,), next_n=(1, 3))
    plan = TargetPlan(spec, tmp_path / "m.json", ProfileSettings(TOPK, repeats=2))
    manifest = run_target(plan, CPU, lambda number, device: markers.append(number), nullcontext)
    assert manifest["complete"] and json.loads((tmp_path / "m.json").read_text())["complete"]
    status = {(c["next_n"], c["strategy"]): (c["status"], c["same_as"]) for c in manifest["configs"]}
    assert status[(1, "native")] == ("profiled", None)
    assert status[(1, "flatten")] == ("same_as", 0)  # flatten at next_n = 1 is the native launch
    assert status[(1, "atom")][0] == "skipped"  # an atom plan of one native piece: never run
    assert status[(3, "native")][0] == "skipped"  # 3 is not native for this backend
    assert status[(3, "flatten")] == ("profiled", None) and status[(3, "atom")] == ("profiled", None)
    assert markers == list(range(6)) and [s["marker"] for s in manifest["steps"]] == markers

    kernels = attach_configs(parse_ncu_csv(_csv_for_steps(manifest)), manifest)
    summary = summarize_ncu(kernels)
    assert len(summary) == 4 and set(summary["repeats"]) == {2}
    assert set(summary.loc[summary["copied_from"].notna(), "strategy"]) == {"flatten"}
    assert set(summary.loc[summary["next_n"] == 3, "launches"]) == {1, 2}  # flatten one launch, atom 2 + 1

    monkeypatch.setitem(registry._BACKENDS, SkewedBackend.name, SkewedBackend())
    skewed = TargetPlan(
        grid(backend=(SkewedBackend.name,), strategy=("native",), next_n=(2,)),
        tmp_path / "s.json",
        ProfileSettings(TOPK),
    )
    refused = run_target(skewed, CPU, lambda number, device: None, nullcontext)
    assert refused["steps"] == [] and "relative error" in refused["configs"][0]["reason"]


FAKE_NCU = '''#!{python}
"""Stands in for ncu: refuses an unknown metric, else writes the target's manifest, prints its CSV and
exports its report (a real one, made by ncu 2025.3 on the H200 for two steps as the manifest's)."""
import json, shutil, sys
args = sys.argv[1:]
metrics = args[args.index("--metrics") + 1].split(",")
if "bogus__metric.sum" in metrics:
    print("==ERROR== Failed to find metric bogus__metric.sum")
    sys.exit(1)
assert args[args.index("--profile-from-start") + 1] == "off"
target = args[args.index("--force-overwrite") + 1:]
assert target[1:4] == ["-m", "dsa_lab.profiling", "--ncu-target"], target
assert json.load(open(target[target.index("--grid") + 1]))["backend"] == ["fake"]
manifest = {manifest}
with open(target[target.index("--manifest") + 1], "w") as handle:
    json.dump(manifest, handle)
shutil.copy({report!r}, args[args.index("--export") + 1])
print("==PROF== Connected to process 1")
print({csv!r})
'''
SHIPPED_REPORT = Path(__file__).resolve().parents[1] / "data/h200/experiments/gluon-ncu-20261130/ncu_gluon.ncu-rep"


def test_ncu_runner_retries_unknown_metrics_keeps_the_report_and_reads_it(tmp_path: Path, monkeypatch) -> None:
    """The kernel table comes from the kept report (through ncu-report), not from ncu's printed CSV;
    without the ncu-report package the CSV is parsed, and the log says so."""
    from dsa_lab.profiling import sweep as profiling_sweep
    from dsa_lab.profiling.ncu_report import NcuReportUnavailable

    if not SHIPPED_REPORT.is_file():
        pytest.skip(f"{SHIPPED_REPORT} is not in this checkout")
    pytest.importorskip("ncu_report")
    manifest = _manifest()
    script = tmp_path / "ncu"
    script.write_text(
        FAKE_NCU.format(python=sys.executable, manifest=repr(manifest), csv=NCU_SAMPLE, report=str(SHIPPED_REPORT))
    )
    script.chmod(0o755)
    monkeypatch.setitem(registry._BACKENDS, "fake", ReferenceBackend())
    spec = grid(backend=("fake",), context=("1024",), next_n=(4,))
    metrics, dropped = ["gpu__time_duration.sum", "bogus__metric.sum", "dram__bytes_read.sum"], []
    report = tmp_path / "ncu_fake.ncu-rep"
    kernels, got, output = profiling_sweep.run_ncu_backend(
        str(script), spec, ProfileSettings(TOPK), metrics, dropped, 60.0, lambda message: None, report
    )
    assert dropped == ["bogus__metric.sum"] and "bogus__metric.sum" not in metrics
    assert got["steps"] == manifest["steps"] and "Connected" in output
    assert report.is_file() and list(kernels["strategy"]) == ["native", "flatten", "atom"]
    assert set(kernels["kernel"]) == {"_paged_mqa_logits_gluon_kernel"}  # the report's, not the CSV's
    assert list(kernels["duration_ns"]) == [451264.0, 550464.0, 451264.0]  # atom: the same launch as native

    def missing(path: Path) -> None:
        raise NcuReportUnavailable("reading .ncu-rep files needs the ncu-report package")

    monkeypatch.setattr(profiling_sweep, "read_ncu_report", missing)
    said: list[str] = []
    kernels, _, _ = profiling_sweep.run_ncu_backend(
        str(script), spec, ProfileSettings(TOPK), metrics, dropped, 60.0, said.append, tmp_path / "again.ncu-rep"
    )
    assert set(kernels["kernel"]) == {
        "void paged_mqa_logits_kernel<4>(Params)",
        "void paged_mqa_logits_kernel<1>(Params)",
    }
    assert any("parsing ncu's printed CSV instead" in line for line in said)
