"""The run store: kill and resume (real processes), changed flags and edited provenance on resume, and logs
that must hold only their grid and sane rows."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.battery import CLEAR, FAST_PROFILE, UNCLEAR, WRONG, Result, case, cli_refused, run_cli, unchanged
from tests.battery.store_support import AREA, FAST, bench, partial_run

# ---------------------------------------------------------------- kill and resume (real processes)


def _child(out: Path, next_n: str) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "dsa_lab.cli",
        *FAST[:-2],
        "--max-seconds-per-point",
        "0.3",
        "--next-n",
        next_n,
        "--out",
        str(out),
    ]

    def default_interrupt() -> None:  # a background battery ignores SIGINT, and children inherit that
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_interrupt
    )


def _wait_for_points(out: Path, count: int, limit_s: float = 60) -> None:
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        points = out / "points.jsonl"
        if points.is_file() and points.read_bytes().count(b"\n") >= count:
            return
        time.sleep(0.05)
    raise TimeoutError(f"{out}: {count} points not logged within {limit_s} s")


def _complete_after_resume(out: Path, total: int) -> Result:
    from dsa_lab.store import folders as store

    done = run_cli(["bench", "--resume", "--out", str(out), "--no-progress", "--device", "cpu"])
    if done.code != 0:
        return Result(UNCLEAR, f"resume exit {done.code}: {done.err.strip()[-300:]}")
    rows = store.load_run(out).results
    keys = store.read_points(out)
    if len(rows) != total or len({r["point_key"] for r in keys}) != len(keys):
        return Result(WRONG, f"{len(rows)} rows of {total}, {len(keys)} log lines")
    return Result(CLEAR, "nothing lost or duplicated")


for _signal in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):

    def _kill(tmp: Path, sig: signal.Signals = _signal) -> Result:
        out = tmp / "root" / "cpu" / "killed"
        child = _child(out, "1,2,3")
        try:
            _wait_for_points(out, 1)
            child.send_signal(sig)
            _, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
        if sig != signal.SIGKILL and (child.returncode != 130 or "Resume with" not in err):
            return Result(UNCLEAR, f"exit {child.returncode} after {sig.name}: {err.strip()[-300:]}")
        return _complete_after_resume(out, 3)

    case(AREA, f"{_signal.name} mid-sweep, then resume", timeout_s=120)(_kill)


@case(AREA, "a torn last line (a kill mid-write) is dropped on resume, the point re-runs")
def _(tmp: Path) -> Result:
    out = partial_run(tmp)
    with open(out / "points.jsonl", "ab") as handle:
        handle.write(b'{"point_key": "backend=reference|str')
    return _complete_after_resume_2(out)


def _complete_after_resume_2(out: Path) -> Result:
    from dsa_lab.store import folders as store

    done = bench(out, "--resume")
    if done.code != 0:
        return Result(UNCLEAR, done.err.strip()[-300:])
    return Result(CLEAR, "repaired") if len(store.load_run(out).results) == 2 else Result(WRONG, "rows lost")


@case(AREA, "resume while another process holds the lock is refused naming the holder")
def _(tmp: Path) -> Result:
    from dsa_lab.store import opening

    out = partial_run(tmp)
    with opening.run_lock(out):
        return cli_refused([*FAST, "--next-n", "1,2", "--out", str(out), "--resume"], "being written by", "pid")


# ---------------------------------------------------------------- changed flags on resume

CHANGED = {
    "--next-n 1,2,3": ["--next-n", "1,2,3"],
    "--batch 2": ["--batch", "2"],
    "--graph": ["--graph"],
    "--warm-l2": ["--warm-l2"],
    "--max-seconds-per-point 0.5": ["--max-seconds-per-point", "0.5"],
    "--seed 5": ["--seed", "5"],
    "--preset smoke": ["--preset", "smoke"],
    "--strategy all": ["--strategy", "all"],
    "--context 128": ["--context", "128"],
    "--heads 64": ["--heads", "64"],
    "--cache-dtype mxfp4": ["--cache-dtype", "mxfp4"],
}
for _label, _flags in CHANGED.items():

    def _changed(tmp: Path, flags: list[str] = _flags) -> Result:
        out = partial_run(tmp)
        before = (out / "points.jsonl").read_bytes()
        argv = ["bench", "--out", str(out), "--resume", "--no-progress", "--device", "cpu", *flags]
        return cli_refused(argv, "spec", harm=unchanged(out / "points.jsonl", before))

    case(AREA, f"resume with a changed flag: {_label}")(_changed)


@case(AREA, "resume with only --max-points (not a change of the grid) continues")
def _(tmp: Path) -> Result:
    out = partial_run(tmp)
    done = run_cli(["bench", "--out", str(out), "--resume", "--no-progress", "--device", "cpu", "--max-points", "1"])
    return Result(CLEAR, "continued") if done.code == 0 else Result(UNCLEAR, done.err.strip()[-300:])


def _edit_provenance(out: Path, change) -> None:
    path = out / "provenance.json"
    provenance = json.loads(path.read_text())
    change(provenance)
    path.write_text(json.dumps(provenance))


for _label, _change, _names in (
    ("another torch", lambda p: p["environment"].update(torch="0.0.1"), ("torch",)),
    ("another device name", lambda p: p.update(device_name="NVIDIA H200"), ("device_name",)),
    (
        "another PR #340 build",
        lambda p: p["environment"].update(deepgemm_pr340_origin="x@1"),
        ("deepgemm_pr340_origin",),
    ),
    ("a spec that is a list", lambda p: p.update(spec=[1, 2]), ("provenance.json", "spec")),
    ("a spec with an unknown field", lambda p: p["spec"].update(colour="red"), ("provenance.json", "colour")),
    ("a spec with a bad axis value", lambda p: p["spec"].update(next_n=[99]), ("provenance.json", "next_n")),
    ("a spec whose timing is a string", lambda p: p["spec"].update(timing="fast"), ("provenance.json", "timing")),
):

    def _provenance_case(tmp: Path, change=_change, names=_names) -> Result:
        out = partial_run(tmp)
        _edit_provenance(out, change)
        before = (out / "points.jsonl").read_bytes()
        return cli_refused(
            ["bench", "--out", str(out), "--resume", "--no-progress", "--device", "cpu"],
            *names,
            harm=unchanged(out / "points.jsonl", before),
        )

    case(AREA, f"resume a run recorded with {_label}")(_provenance_case)


def _log_line(out: Path, row: dict) -> None:
    with open(out / "points.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")


@case(AREA, "resume a run whose log holds a point of another grid")
def _(tmp: Path) -> Result:
    out = partial_run(tmp)
    _log_line(
        out,
        {
            "point_key": "backend=reference|strategy=native|batch=9|context=64|next_n=1|cache_dtype=fp8|"
            "heads=32|head_dim=64",
            "status": "ok",
            "median_ms": 1.0,
            "p25_ms": 0.9,
            "p75_ms": 1.1,
        },
    )
    return cli_refused(
        ["bench", "--out", str(out), "--resume", "--no-progress", "--device", "cpu"], "points.jsonl", "batch=9"
    )


@case(AREA, "resume a run whose log holds a timed row with a string time")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    out = partial_run(tmp)
    row = store.read_points(out)[0]
    (out / "points.jsonl").write_text(json.dumps({**row, "median_ms": "fast"}) + "\n")
    (out / "results.parquet").unlink()
    return cli_refused(
        ["bench", "--out", str(out), "--resume", "--no-progress", "--device", "cpu"], "points.jsonl", "median_ms"
    )


@case(AREA, "resume a run whose log holds a row with an unknown status")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    out = partial_run(tmp)
    row = store.read_points(out)[0]
    (out / "points.jsonl").write_text(json.dumps({**row, "status": "great"}) + "\n")
    (out / "results.parquet").unlink()
    return cli_refused(
        ["bench", "--out", str(out), "--resume", "--no-progress", "--device", "cpu"], "points.jsonl", "great"
    )


@case(AREA, "resume a run whose results hold a row its log lacks")
def _(tmp: Path) -> Result:
    out = partial_run(tmp)
    (out / "points.jsonl").write_text("")
    return cli_refused(["bench", "--out", str(out), "--resume", "--no-progress", "--device", "cpu"], "points.jsonl")


# ---------------------------------------------------------------- beyond the cases


@case(AREA, "resume a profile run as a timing run")
def _(tmp: Path) -> Result:
    out = tmp / "root" / "cpu" / "profiles" / "p"
    done = run_cli([*FAST_PROFILE, "--out", str(out)])
    if done.code != 0:
        return Result(UNCLEAR, f"profile exit {done.code}: {done.err[-200:]}")
    before = sorted(p.name for p in out.iterdir())
    return cli_refused(
        ["bench", "--resume", "--out", str(out), "--no-progress", "--device", "cpu"],
        str(out),
        harm=lambda: None if sorted(p.name for p in out.iterdir()) == before else "files added",
    )


@case(AREA, "resume a run whose log holds a timed row whose time is true")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    out = partial_run(tmp)
    row = store.read_points(out)[0]
    (out / "points.jsonl").write_text(json.dumps({**row, "median_ms": True}) + "\n")
    (out / "results.parquet").unlink()
    return cli_refused(
        ["bench", "--out", str(out), "--resume", "--no-progress", "--device", "cpu"], "points.jsonl", "median_ms"
    )
