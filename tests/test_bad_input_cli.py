"""Bad input to `dsa-lab`: exit status 2 and one line naming the flag or file; nothing written outside --root."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_lab.cli import main
from dsa_lab.store import folders as store
from dsa_lab.store import opening
from dsa_lab.store.listing import list_runs
from dsa_lab.store.provenance import build_provenance

FAST_BENCH = "bench --preset ci --backend reference --batch 1 --context 64 --next-n 1 --strategy native --no-progress --device cpu".split()
ROOT = Path(__file__).resolve().parents[1]
PROFILE = ["profile", "--tool", "torch", "--device", "cpu", "--batch", "1", "--context", "64", "--next-n", "1"]

CASES = {  # argv after the command, what stderr must name
    "bench run-id escapes": (FAST_BENCH + ["--run-id", "../.."], r"--run-id: run_id='\.\./\.\.'"),
    "bench run-id with a slash": (FAST_BENCH + ["--run-id", "a/b"], r"--run-id: run_id='a/b'"),
    "bench run-id dot": (FAST_BENCH + ["--run-id", "."], r"--run-id: run_id='\.'"),
    "bench max-points zero": (FAST_BENCH + ["--max-points", "0"], r"--max-points=0"),
    "bench max-minutes negative": (FAST_BENCH + ["--max-minutes", "-1"], r"--max-minutes=-1"),
    "bench max-minutes nan": (FAST_BENCH + ["--max-minutes", "nan"], r"--max-minutes=nan"),
    "bench seconds per point zero": (FAST_BENCH + ["--max-seconds-per-point", "0"], r"--max-seconds-per-point=0"),
    "bench batch zero": (FAST_BENCH + ["--batch", "0"], r"batch=0"),
    "bench batch float": (FAST_BENCH + ["--batch", "1.5"], r"--batch='1.5'"),
    "bench next-n 17": (FAST_BENCH + ["--next-n", "17"], r"next_n=17"),
    "bench context float": (FAST_BENCH + ["--context", "1.5K"], r"context='1\.5K'"),
    "bench context below next_n": (FAST_BENCH + ["--context", "1", "--next-n", "2"], r"context: shortest length 1"),
    "bench backend": (FAST_BENCH + ["--backend", "nope"], r"backend='nope'"),
    "bench cache dtype": (FAST_BENCH + ["--cache-dtype", "int8"], r"cache_dtype='int8'"),
    "bench heads": (FAST_BENCH + ["--heads", "48"], r"heads=48"),
    "bench empty axis": (FAST_BENCH + ["--next-n", ","], r"--next-n: give at least one value"),
    "bench resume nothing": (FAST_BENCH + ["--resume", "--run-id", "none-here"], r"--resume: .* holds no run"),
    "bench device": (FAST_BENCH + ["--device", "tpu"], r"--device='tpu': allowed values are .* \(or 'auto'\)"),
    "bench point timeout zero": (FAST_BENCH + ["--point-timeout", "0"], r"--point-timeout=0"),
    "bench resume without a folder": (FAST_BENCH[:-2] + ["--resume"], r"--resume: name the run to continue with --out"),
    "profile backend": (PROFILE + ["--backend", "nope"], r"backend='nope'"),
    "profile batch zero": (PROFILE + ["--batch", "0"], r"batch=0"),
    "profile next-n 17": (PROFILE + ["--next-n", "17"], r"next_n=17"),
    "profile next-n spaces": (PROFILE + ["--next-n", "1 2"], r"--next-n='1 2': values must be integers, comma-separated"),
    "profile context below next_n": (PROFILE + ["--context", "1", "--next-n", "2"], r"context: shortest length 1"),
    "profile repeats zero": (PROFILE + ["--repeats", "0"], r"repeats=0"),
    "profile topk zero": (PROFILE + ["--topk", "0"], r"topk=0"),
    "profile budget negative": (PROFILE + ["--torch-budget", "-5"], r"--torch-budget=-5"),
    "profile ncu timeout zero": (PROFILE + ["--ncu-timeout", "0"], r"--ncu-timeout=0"),
    "profile device": (PROFILE + ["--device", "tpu"], r"device='tpu'"),
    "profile tool": (PROFILE[:1] + ["--tool", "perf"] + PROFILE[3:], r"--tool='perf': allowed values are"),
    "profile run-id escapes": (PROFILE + ["--run-id", "../.."], r"--run-id: run_id='\.\./\.\.'"),
    "compare missing runs": (["compare", "no-run-a", "no-run-b"], r"no-run-a/provenance.json: no provenance file"),
    "bench retry-errors without resume": (FAST_BENCH + ["--retry-errors"], r"--retry-errors: .*give --resume too"),
    "bench empty --out": (FAST_BENCH + ["--out="], r"--out='': give a folder"),
    "bench run-id with --out": (FAST_BENCH + ["--run-id", "x", "--out", "y"], r"--run-id='x' with --out='y'"),
    "bench seed 2**70": (FAST_BENCH + ["--seed", str(2**70)], r"seed=1180591620717411303424: allowed range is \[0, "),
    "bench seed negative": (FAST_BENCH + ["--seed", "-1"], r"seed=-1: allowed range"),
    "profile seed 2**70": (PROFILE + ["--seed", str(2**70)], r"seed=1180591620717411303424"),
    "profile empty --out": (PROFILE + ["--out="], r"--out='': give a folder"),
    "model next-n 17": (["model", "--next-n", "17"], r"next_n=17: allowed range is \[1, 16\]"),
    "model next-n 33": (["model", "--next-n", "33"], r"next_n=33: allowed range is \[1, 16\]"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_cli_refuses_bad_input_with_one_named_line(tmp_path: Path, monkeypatch, capsys, case: str) -> None:
    argv, name = CASES[case]
    monkeypatch.chdir(tmp_path)  # a run folder a bug let through would land here, not in the repo
    if argv[0] in ("bench", "profile"):
        argv = [*argv, "--root", str(tmp_path / "root")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dsa-lab {argv[0]}: error: ") and len(err.strip().splitlines()) == 1
    assert re.search(name, err), err
    assert not any(p.name == store.PROVENANCE_FILE for p in tmp_path.rglob("*")), "a run was written"


def test_cuda_device_without_a_gpu_is_named(capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    assert main([*FAST_BENCH[:-2], "--device", "cuda", "--dry-run"]) == 2
    assert "--device='cuda': no CUDA device" in capsys.readouterr().err


def test_unknown_flags_and_choices_are_argparse_errors(capsys) -> None:
    for argv, flag in (
        (["bench", "--preset", "huge"], "--preset"),
        (["runs", "--bogus"], "--bogus"),
        (["profile", "--context-len", "64"], "--context-len"),
        (["profile", "--torch"], "--torch"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and flag in capsys.readouterr().err


def _run(root: Path, name: str) -> Path:
    provenance = build_provenance(name, "cpu", "cpu", "measured", 0, "wall_clock", {})
    run_dir = opening.create_run(root / "cpu" / name, provenance)
    store.append_point(run_dir, {"point_key": "k", "status": "skipped", "source": "measured"})
    store.write_results(run_dir)
    return run_dir


def test_runs_lists_a_corrupt_run_with_its_file_and_still_shows_the_good_one(tmp_path: Path, capsys) -> None:
    _run(tmp_path, "good-run")
    bad = _run(tmp_path, "bad-run")
    (bad / store.RESULTS_FILE).write_bytes(b"PAR1 torn")
    assert main(["runs", "--root", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert (
        "good-run" in captured.out
        and "bad-run" in captured.out
        and "results.parquet: not a readable parquet" in captured.out
    )
    assert "1 damaged run" in captured.err


def test_runs_with_a_missing_root_is_named(tmp_path: Path, capsys) -> None:
    assert main(["runs", "--root", str(tmp_path / "typo")]) == 2
    assert "typo': no such folder" in capsys.readouterr().err


def test_reading_the_shipped_data_changes_nothing(capsys) -> None:
    """`dsa-lab runs` and the loaders only read: every file under data/ keeps its bytes."""
    import hashlib

    from dsa_lab.profiling.runs import load_profile_run, scan_profile_runs

    data = Path(__file__).resolve().parents[1] / "data"
    if not data.is_dir():
        pytest.skip("no data/ folder in this checkout")

    def digest() -> dict[Path, str]:
        return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in data.rglob("*") if p.is_file()}

    before = digest()
    assert main(["runs", "--root", str(data)]) == 0
    listing = list_runs(data)
    for path in listing.loc[listing["problem"].isna(), "path"]:
        store.load_run(path)
    for folder in scan_profile_runs(data).runs:
        load_profile_run(folder)
    capsys.readouterr()
    assert digest() == before


@settings(max_examples=30, deadline=None)
@given(run_id=st.text(alphabet="./ab-_\\", min_size=1, max_size=8))
def test_bench_never_writes_outside_its_root(run_id: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        code = main(
            [
                *FAST_BENCH,
                "--root",
                str(root),
                f"--run-id={run_id}",
                "--max-points",
                "1",
                "--max-seconds-per-point",
                "0.01",
            ]
        )
        written = [p for p in Path(tmp).rglob(store.PROVENANCE_FILE)]
        assert all(root in p.parents for p in written)
        if code == 0:
            assert json.loads(written[0].read_text())["run_id"] == run_id
            assert len(pd.read_parquet(written[0].parent / store.RESULTS_FILE)) == 1


@pytest.mark.parametrize(
    ("min_free", "status", "says"),
    [("1000000", 1, r"needs about 1000000 GiB free; .* has \d+ GiB"), ("12G", 2, r"DSA_LAB_MIN_FREE_GIB .* got '12G'")],
)
def test_lab_refuses_a_first_install_it_cannot_finish(tmp_path: Path, min_free: str, status: int, says: str) -> None:
    """A disk too full for the ~11 GiB venv is named before pip starts, not as ENOSPC halfway through."""
    venv = tmp_path / "venv"
    env = {**os.environ, "DSA_LAB_VENV": str(venv), "DSA_LAB_MIN_FREE_GIB": min_free}
    done = subprocess.run(["bash", str(ROOT / "lab"), "--version"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == status
    assert re.search(says, done.stderr), done.stderr
    assert not venv.exists()


def test_an_empty_root_is_refused_not_the_working_directory(tmp_path: Path, monkeypatch, capsys) -> None:
    """`--root ''` used to put the run under the working directory."""
    monkeypatch.chdir(tmp_path)
    assert main([*FAST_BENCH, "--root="]) == 2
    assert "--root='': give a folder" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_a_dry_run_of_any_size_plans_once_per_distinct_shape(monkeypatch, capsys) -> None:
    """`bench --dry-run` over thousands of batch values used to take minutes: a plan per point, each O(batch)."""
    from dsa_lab.bench.point import Point

    planned = []
    real = Point.plan
    monkeypatch.setattr(Point, "plan", lambda self, *a: (planned.append(len(a[0])), real(self, *a))[1])
    batches = ",".join(str(b) for b in range(1, 4097))
    assert main(["bench", "--dry-run", "--device", "cpu", "--batch", batches, "--context", "mixed:1K-128K"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("36864 points (12288 skipped here on cpu); estimated H200 time ~")
    # once per distinct (batch <= 64, next_n, strategy, native sizes): the H200's (1, 2, 4) and any, cpu's any
    assert len(planned) <= 64 * 9 * 3 and max(planned) <= 64
