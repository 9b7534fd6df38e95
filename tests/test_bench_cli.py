"""The bench command: its table (noisy points marked), runs, resumes and bad values, the dry run, OS errors
in one line naming the path, and `dsa-lab --help` without torch."""

from __future__ import annotations

import argparse
import errno
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from bench_support import REPO, _bench_argv, _one_line

from dsa_lab.bench import cli as bench_cli
from dsa_lab.cli import main
from dsa_lab.store import folders as store


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
