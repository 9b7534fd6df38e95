"""The calibrated performance model: its constants come from the shipped data, it stays close to
every measured H200 point, it checks against published SM100 times, and `dsa-lab model` prints it."""

from __future__ import annotations

import json
import math

import pytest

from dsa_lab.cli import main
from dsa_lab.kernels import backend_names, get_backend, modeled_backends
from dsa_lab.model import calibration
from dsa_lab.model.gpus import GPUS, get_gpu
from dsa_lab.model.indexer import NotModeled, fits, flatten_dram_share, predict, unmodeled
from dsa_lab.paths import resolve_data_path
from dsa_lab.profiling.runs import load_profile_run
from dsa_lab.store import folders as store

PROFILE_RUN = "h200/profiles/profile-20261129T112211Z"
H200_RUN = "h200/h200-full-20261129"  # the sweep the fits and the measured ceilings come from
GLUON_RUN = "h200/h200-issue13-20261130"  # the sweep the Gluon and PR #340 fits come from


@pytest.fixture(scope="module")
def h200_points():
    run = store.load_run(resolve_data_path(H200_RUN))
    return calibration.measured_points(run.results, run.provenance["seed"]), run.provenance


@pytest.fixture(scope="module")
def ncu():
    return load_profile_run(resolve_data_path(PROFILE_RUN)).ncu


def test_fits_are_what_the_shipped_sweeps_give(h200_points):
    points, _ = h200_points
    run = store.load_run(resolve_data_path(GLUON_RUN))  # Gluon and PR #340 beside DeepGEMM and Triton
    later = calibration.measured_points(run.results, run.provenance["seed"])
    later = later[~later["backend"].isin(points["backend"].unique())].reset_index(drop=True)
    assert {**calibration.fit_efficiencies(points), **calibration.fit_efficiencies(later)} == fits()
    # every backend with a kernel to model declares its fits; the one without says so
    assert set(modeled_backends()) == {b for b in backend_names() if get_backend(b).model_traits}
    fused = {name: get_backend(name) for name in backend_names() if get_backend(name).fuses_topk}
    assert unmodeled("sm90") == {
        "reference": "backend 'reference' declares no model_traits (how its kernel spends its work)",
        **{name: f"backend {name!r} fuses the top-k: its unit is the step, and the model times logits kernels"
           for name in fused},
    }  # fmt: skip
    assert fused and not any(b.model_traits or b.model_fits for b in fused.values())


def test_the_model_names_what_it_cannot_time(monkeypatch):
    """A backend with traits but no fits (a plug-in fitted on no run) is not modeled, and says why."""
    monkeypatch.setattr(type(get_backend("gluon")), "model_fits", {})
    assert "gluon" not in modeled_backends() and "no model_fits" in unmodeled("sm90")["gluon"]
    with pytest.raises(NotModeled, match=r"backend 'gluon' declares model_traits but no model_fits"):
        predict("H200", "gluon", "native", [65536] * 128, 3)
    assert "gluon" in unmodeled("sm100")  # and no SM100 kernel: that is said first
    with pytest.raises(ValueError, match=r"backend='nope'"):
        predict("H200", "nope", "native", [4096], 1)


def test_model_error_on_every_measured_h200_point(h200_points):
    points, _ = h200_points
    errors = calibration.h200_errors(points)
    assert len(errors) == 640
    summary = calibration.error_summary(errors).set_index(["backend", "strategy"])
    overall = summary.loc[("all", "all")]
    assert overall.median_abs_error < 0.06 and overall.worst_abs_error < 0.40
    # DeepGEMM, the kernel the SM100 predictions stand on, is closer
    for strategy in ("native", "atom"):
        assert summary.loc[("deepgemm", strategy)].median_abs_error < 0.05


def test_gluon_and_pr340_are_modeled_from_their_traits():
    run = store.load_run(resolve_data_path(GLUON_RUN))
    points = calibration.measured_points(run.results, run.provenance["seed"])
    errors = calibration.h200_errors(points[points["backend"].isin(["gluon", "deepgemm-pr340"])])
    overall = calibration.error_summary(errors).set_index(["backend", "strategy"]).loc[("all", "all")]
    assert overall.points == 256 and overall.median_abs_error < 0.05 and overall.worst_abs_error < 0.45
    with pytest.raises(ValueError, match=r"backend 'gluon' has no kernel on sm100"):  # an SM90-only kernel
        predict("B200", "gluon", "native", [65536] * 128, 3)


def test_measured_ceilings_are_the_runs(h200_points):
    _, provenance = h200_points
    h200 = get_gpu("H200")
    assert h200.measured["hbm_tbps"].value == pytest.approx(provenance["ceilings"]["read_tbps"], abs=0.01)
    assert h200.measured["fp8_tflops"].value == pytest.approx(provenance["ceilings"]["fp8_tflops"], abs=1)
    for gpu in GPUS.values():
        for row in gpu.table():
            assert row["source"] and row["value"] > 0, row


def test_reread_factors_from_nsight_compute(ncu):
    table = calibration.reread_table(ncu).set_index(["backend", "strategy", "batch", "next_n"])
    for n in (2, 3, 4, 8):  # DeepGEMM's flatten re-reads next_n x from DRAM at B = 128; native reads once
        assert table.loc[("deepgemm", "flatten", 128, n), "dram_over_unique"] == pytest.approx(n, rel=0.02)
        assert table.loc[("triton", "flatten", 128, n), "dram_over_unique"] < 1.3
    assert table.loc[("deepgemm", "native", 128, 4), "dram_over_unique"] == pytest.approx(1, rel=0.01)
    declared = get_backend("triton").model_traits["sm90"].flatten_dram_share
    assert calibration.measured_flatten_dram_share(ncu, "triton") == pytest.approx(declared, abs=5e-4)
    # the model's DeepGEMM rule against every profiled flatten launch
    h200 = get_gpu("H200")
    for (backend, strategy, batch, n), row in table.iterrows():
        if (backend, strategy) == ("deepgemm", "flatten") and n > 1:
            share = flatten_dram_share("deepgemm", h200, batch * n, row.unique_kv_bytes)
            assert 1 + share * (n - 1) == pytest.approx(row.dram_over_unique, rel=0.2), (batch, n)


def test_sm100_predictions_at_the_headline_shape():
    """B = 128, L = 64K: bandwidth-bound at next_n = 1, tensor-core bound from 3 on; the SM100
    kernel pads odd next_n to even rows, so 3 costs what 4 does; about 2x the H200."""
    times = {n: predict("B200", "deepgemm", "native", [65536] * 128, n) for n in (1, 3, 4, 8)}
    assert times[1].bound == "hbm" and all(times[n].bound == "fp8_mma" for n in (3, 4, 8))
    assert times[3].ceiling_us["fp8_mma"] == times[4].ceiling_us["fp8_mma"]
    assert times[3].time_us < times[4].time_us < times[8].time_us
    h200_atom_8 = predict("H200", "deepgemm", "atom", [65536] * 128, 8)
    assert 1.8 < h200_atom_8.time_us / times[8].time_us < 2.8
    assert all(t.source == "modeled" and t.assumptions for t in times.values())
    # on SM100 atom is the native launch, and flatten at next_n = 1 too
    assert predict("B200", "deepgemm", "atom", [65536] * 128, 3).time_us == times[3].time_us
    assert predict("B200", "deepgemm", "flatten", [65536] * 128, 1).time_us == times[1].time_us


def test_epilogue_ceiling_is_counted_on_blackwell():
    """An FP32 relu.weight.sum is about as slow as the FP8 MMA on B200 (issue #12's estimate:
    ~228 vs ~244 µs at n = 8); DeepGEMM's SM100 kernel packs it in bf16 pairs, half of that."""
    b200 = predict("B200", "deepgemm", "native", [65536] * 128, 8)
    assert b200.ceiling_us["fp8_mma"] == pytest.approx(244.3, rel=0.01)
    assert 2 * b200.ceiling_us["fp32_epilogue"] == pytest.approx(229, rel=0.01)
    h200 = predict("H200", "triton", "native", [65536] * 128, 8)
    assert h200.ceiling_us["fp32_epilogue"] < 0.5 * h200.ceiling_us["fp8_mma"]


def test_trtllm_13219_point(capsys):
    table = calibration.trtllm_13219().set_index(["batch", "context"])
    headline = table.loc[(32, 16384)]
    assert headline.published_deepgemm_us == 20.3 and headline.published_cute_us == 16.5
    assert abs(headline.error) < 0.15
    assert (table["modeled_deepgemm_us"] > 0).all() and len(table) == 22


def test_mxfp4_cache_fits_l2_where_fp8_does_not():
    fp4_flat = predict("GB200", "deepgemm", "flatten", [11008] * 64, 4, cache_dtype="mxfp4")
    fp8_flat = predict("GB200", "deepgemm", "flatten", [11008] * 64, 4)
    assert fp4_flat.dram_bytes < 0.35 * fp8_flat.dram_bytes  # 68 vs 132 B a token, and no DRAM re-reads
    with pytest.raises(ValueError, match="mxfp4"):
        predict("H200", "deepgemm", "native", [4096], 2, cache_dtype="mxfp4")


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="gpu"):
        predict("A100", "deepgemm", "native", [4096], 1)
    with pytest.raises(ValueError, match="strategy"):
        predict("B200", "deepgemm", "sideways", [4096], 1)
    with pytest.raises(ValueError, match="next_n=3"):
        predict("H200", "deepgemm", "native", [4096], 3)  # SM90 DeepGEMM has no 3-row kernel
    with pytest.raises(ValueError, match="seq_lens"):
        predict("B200", "deepgemm", "native", [2], 3)


def test_model_command_prints_one_json_object(capsys):
    argv = ["model", "--gpu", "B200", "--batch", "128", "--context", "65536", "--next-n", "8", "--strategy", "native"]
    assert main([*argv, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["source"] == "modeled" and record["bound"] == "fp8_mma"
    assert set(record["ceiling_us"]) == {"hbm", "fp8_mma", "fp32_epilogue"}
    assert math.isclose(record["time_us"], predict("B200", "deepgemm", "native", [65536] * 128, 8).time_us)
    assert record["gpu_ceilings"]["hbm_tbps"]["value"] == 7.67
    assert main(argv) == 0
    assert "modeled" in capsys.readouterr().out
    assert main(["model", "--gpu", "H200", "--next-n", "3"]) == 2  # no native 3-row kernel on SM90
    assert "next_n=3" in capsys.readouterr().err


def test_model_command_takes_lists_as_bench_does(capsys):
    argv = "model --gpu H200 --batch 1,128 --context 8K,128K --next-n 1,3,8 --strategy all".split()
    assert main([*argv, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2 * 2 * 3 * 3  # batch x context x next_n x strategy, each once
    refused = [r for r in lines if "refused" in r]
    assert {(r["strategy"], r["next_n"]) for r in refused} == {("native", 3), ("native", 8)}  # no SM90 kernel
    assert all("natively" in r["refused"] and r["source"] == "modeled" for r in refused)
    atom = next(
        r
        for r in lines
        if "refused" not in r
        and (r["strategy"], r["next_n"], r["batch"]) == ("atom", 8, 128)
        and r["context"] == "131072"
    )
    assert math.isclose(atom["time_us"], predict("H200", "deepgemm", "atom", [131072] * 128, 8).time_us)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "modeled on H200" in out and "not modeled: DeepGEMM native B=1 L=8K next_n=3" in " ".join(out.split())
    assert main(["model", "--gpu", "H200", "--next-n", "1,x"]) == 2
    assert "--next-n='1,x': values must be integers" in capsys.readouterr().err
    assert main(["model", "--gpu", "H200", "--strategy", "native", "--next-n", "3,5"]) == 2  # nothing to model
    assert "no combination could be modeled" in capsys.readouterr().err
