"""`dsa-lab compare` as a gate that cannot pass by accident, and never destroys what it reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from tests.battery import CLEAR, UNCLEAR, WRONG, Result, case, cli_refused, run_cli

AREA = "compare"
KEY_AXES = {
    "backend": "reference",
    "strategy": "native",
    "context": "64",
    "cache_dtype": "fp8",
    "heads": 32,
    "head_dim": 64,
}


def point_key(batch: int, next_n: int) -> str:
    from dsa_lab import axes

    return axes.point_key({**KEY_AXES, "batch": batch, "next_n": next_n, "config": "rule"})


def make_run(
    root: Path,
    name: str,
    medians: dict[tuple[int, int], float],
    *,
    noise: float = 0.01,
    samples: int = 20,
    device_name: str = "NVIDIA H200",
    device: str = "cuda",
    status: str = "ok",
    seed: int = 0,
    sample_change=None,
    source: str = "measured",
) -> Path:
    """A run folder with one timed row per (batch, next_n): `samples` samples around each median."""
    from dsa_lab.store import folders as store

    rng = np.random.default_rng(seed)
    folder = root / name
    folder.mkdir(parents=True)
    provenance = {
        "schema_version": store.SCHEMA_VERSION,
        "run_id": name,
        "source": source,
        "device": device,
        "device_name": device_name,
        "created": "2026-01-01T00:00:00+00:00",
        "command": [],
        "timing_method": "cuda_events",
        "seed": 0,
        "environment": {"gpu_name": device_name},
        "git": {},
    }
    (folder / store.PROVENANCE_FILE).write_text(json.dumps(provenance))
    rows = []
    for (batch, next_n), median in medians.items():
        values = median * np.exp(noise * rng.standard_normal(samples))  # log-normal: positive at any noise
        ok = status == "ok"
        p25, med, p75 = np.percentile(values, [25, 50, 75]) if ok else (None, None, None)
        if sample_change is not None:  # the stored samples only: the quartiles stay those of the clean ones
            values = sample_change(values)
        rows.append(
            {
                "point_key": point_key(batch, next_n),
                **KEY_AXES,
                "batch": batch,
                "next_n": next_n,
                "status": status,
                "message": "" if ok else "skipped here",
                "source": source,
                "device": device,
                "device_name": device_name,
                "median_ms": med,
                "p25_ms": p25,
                "p75_ms": p75,
                "iqr_ms": (p75 - p25) if ok else None,
                "samples": samples if ok else None,
                "samples_ms": list(values) if ok else None,
                "launches": 1,
                "kernel_rows": batch * next_n,
                "pieces": str(next_n),
                "unique_bytes": 1e6,
                "strategy_bytes": 1e6,
                "flops": 1e9,
            }
        )
    frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(store.RESULT_COLUMNS))
    frame.to_parquet(folder / store.RESULTS_FILE, index=False)
    return folder


GRID = {(b, n): 0.1 * b * n for b in (1, 2, 4) for n in (1, 2)}


def compare(a: Path, b: Path, *flags: str):
    return run_cli(["compare", str(a), str(b), "--top", "0", *flags])


def gate(a: Path, b: Path, want: int, *flags: str, says: str = "") -> Result:
    done = compare(a, b, *flags)
    if done.raised is not None or "Traceback" in done.err:
        return Result(UNCLEAR, f"traceback: {done.raised!r} {done.err[-300:]}")
    if done.code != want:
        return Result(WRONG, f"exit {done.code}, wanted {want}: {(done.out + done.err)[-300:]!r}")
    if says and says not in done.out + done.err:
        return Result(UNCLEAR, f"exit {want} without saying {says!r}: {(done.out + done.err)[-300:]!r}")
    return Result(CLEAR, (done.err or done.out).strip().splitlines()[-1][:200])


@case(AREA, "no shared point exits non-zero with the reason")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", {(1, 1): 1.0})
    b = make_run(tmp, "b", {(2, 2): 1.0})
    return cli_refused(["compare", str(a), str(b)], "no point")


@case(AREA, "no shared point with --strict exits non-zero with the reason")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", {(1, 1): 1.0})
    b = make_run(tmp, "b", {(2, 2): 1.0})
    return cli_refused(["compare", str(a), str(b), "--strict"], "no point")


@case(AREA, "an untimed baseline (every point skipped) exits non-zero")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", GRID, status="skipped")
    b = make_run(tmp, "b", GRID)
    return cli_refused(["compare", str(a), str(b)], "timed")


@case(AREA, "an untimed candidate (every point skipped) exits non-zero")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", GRID)
    b = make_run(tmp, "b", GRID, status="skipped")
    return cli_refused(["compare", str(a), str(b)], "timed")


@case(AREA, "two empty runs exit non-zero")
def _(tmp: Path) -> Result:
    return cli_refused(["compare", str(make_run(tmp, "a", {})), str(make_run(tmp, "b", {}))], "no point")


@case(AREA, "an H200 run against a CPU run with the same axes is refused")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", GRID)
    b = make_run(tmp, "b", GRID, device="cpu", device_name="cpu")
    return cli_refused(["compare", str(a), str(b)], "device", "--allow-cross-device")


@case(AREA, "two different GPUs are refused")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", GRID)
    b = make_run(tmp, "b", GRID, device_name="NVIDIA B200")
    return cli_refused(["compare", str(a), str(b)], "NVIDIA B200", "NVIDIA H200")


@case(AREA, "--allow-cross-device compares and labels the result")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", GRID)
    b = make_run(tmp, "b", GRID, device_name="NVIDIA B200")
    return gate(a, b, 0, "--allow-cross-device", says="NVIDIA B200")


for _label, _change in (
    ("negative", lambda v: -v),
    ("NaN", lambda v: np.where(np.arange(len(v)) % 2 == 0, np.nan, v)),
    ("zero", lambda v: v * 0),
    ("infinite", lambda v: np.where(np.arange(len(v)) % 3 == 0, np.inf, v)),
):

    def _bad_samples(tmp: Path, change=_change) -> Result:
        a = make_run(tmp, "a", GRID, seed=1)
        b = make_run(tmp, "b", {k: v * 1.2 for k, v in GRID.items()}, seed=2, sample_change=change)
        return cli_refused(["compare", str(a), str(b)], "samples_ms")

    case(AREA, f"{_label} samples behind a 20 % regression are refused")(_bad_samples)


@case(AREA, "a 1.2x regression with enough quiet samples exits 1")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", GRID, seed=1)
    b = make_run(tmp, "b", {k: v * 1.2 for k, v in GRID.items()}, seed=2)
    return gate(a, b, 1, says="regression")


@case(AREA, "a 1.2x regression at one point of six exits 1")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", GRID, seed=1)
    b = make_run(tmp, "b", {k: v * (1.2 if k == (4, 2) else 1.0) for k, v in GRID.items()}, seed=2)
    return gate(a, b, 1, says="regression")


@case(AREA, "the same code measured twice (1 % noise) exits 0")
def _(tmp: Path) -> Result:
    return gate(make_run(tmp, "a", GRID, seed=1), make_run(tmp, "b", GRID, seed=2), 0)


@case(AREA, "three samples a point that differ 10x: no verdict, exit 0")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", GRID, samples=3, seed=1)
    b = make_run(tmp, "b", {k: v * 10 for k, v in GRID.items()}, samples=3, seed=2)
    return gate(a, b, 0, says="unsure")


@case(AREA, "samples noisier than the threshold: no verdict, exit 0")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", GRID, noise=0.6, seed=1)
    b = make_run(tmp, "b", {k: v * 1.3 for k, v in GRID.items()}, noise=0.6, seed=2)
    return gate(a, b, 0, says="unsure")


@case(AREA, "a 2x regression under 10 % noise with 20 samples still exits 1")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", GRID, noise=0.1, seed=1)
    b = make_run(tmp, "b", {k: v * 2 for k, v in GRID.items()}, noise=0.1, seed=2)
    return gate(a, b, 1, says="regression")


@case(AREA, "a run compared with itself exits 0, all same")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", GRID)
    return gate(a, a, 0, says="same 6")


@case(AREA, "measured against modeled is refused by name")
def _(tmp: Path) -> Result:
    a = make_run(tmp, "a", GRID)
    b = make_run(tmp, "b", GRID, source="modeled")
    return cli_refused(["compare", str(a), str(b)], "modeled")


def _files(*folders: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for folder in folders for p in folder.rglob("*") if p.is_file()}


def _destroy(tmp: Path, flag: str, target) -> Result:
    a = make_run(tmp, "a", GRID, seed=1)
    b = make_run(tmp, "b", GRID, seed=2)
    path = target(a, b)
    before = _files(a, b)

    def harm() -> str | None:
        now = _files(a, b)
        return None if now == before else f"the runs' files changed: {sorted(set(now) ^ set(before) or now)[:3]}"

    return cli_refused(["compare", str(a), str(b), flag, str(path)], str(path), harm=harm)


for _flag in ("--csv", "--markdown"):
    for _label, _target in (
        ("A's results.parquet", lambda a, b: a / "results.parquet"),
        ("B's provenance.json", lambda a, b: b / "provenance.json"),
        ("a new file inside A's folder", lambda a, b: a / "compare.csv"),
        ("A's folder itself", lambda a, b: a),
        ("B's points.jsonl", lambda a, b: b / "points.jsonl"),
    ):
        case(AREA, f"{_flag} {_label} is refused")(lambda tmp, f=_flag, t=_target: _destroy(tmp, f, t))


@case(AREA, "--csv and --markdown naming the same file are refused")
def _(tmp: Path) -> Result:
    a, b = make_run(tmp, "a", GRID, seed=1), make_run(tmp, "b", GRID, seed=2)
    out = tmp / "same.txt"
    return cli_refused(["compare", str(a), str(b), "--csv", str(out), "--markdown", str(out)], str(out))


@case(AREA, "--csv into a missing folder names the path")
def _(tmp: Path) -> Result:
    a, b = make_run(tmp, "a", GRID, seed=1), make_run(tmp, "b", GRID, seed=2)
    return cli_refused(["compare", str(a), str(b), "--csv", str(tmp / "nowhere" / "x.csv")], "nowhere")


@case(AREA, "--csv over an existing file elsewhere is replaced whole (temp file, then move)")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    a, b = make_run(tmp, "a", GRID, seed=1), make_run(tmp, "b", GRID, seed=2)
    out = tmp / "out.csv"
    out.write_text("old")
    real = store.os.replace
    moved = []
    store.os.replace = lambda src, dst, *r, **k: (moved.append(str(dst)), real(src, dst, *r, **k))[1]
    try:
        done = compare(a, b, "--csv", str(out))
    finally:
        store.os.replace = real
    if done.code != 0 or "old" in out.read_text():
        return Result(WRONG, f"exit {done.code}")
    return Result(CLEAR, "moved into place") if str(out) in moved else Result(UNCLEAR, "written in place")


for _value in ("nan", "inf", "-0.01", "10", "1e400", "five"):
    case(AREA, f"--threshold {_value}")(
        lambda tmp, v=_value: cli_refused(
            ["compare", str(make_run(tmp, "a", GRID)), str(make_run(tmp, "b", GRID)), "--threshold", v], "threshold"
        )
    )


@case(AREA, "--top 10**12 prints every row without failing")
def _(tmp: Path) -> Result:
    return gate(make_run(tmp, "a", GRID, seed=1), make_run(tmp, "b", GRID, seed=2), 0, "--top", str(10**12))


@case(AREA, "compare a timing run with a profile run is refused by name")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    a = make_run(tmp, "a", GRID)
    b = tmp / "profile"
    b.mkdir()
    provenance = json.loads((a / store.PROVENANCE_FILE).read_text())
    (b / store.PROVENANCE_FILE).write_text(json.dumps({**provenance, "kind": "profile"}))
    return cli_refused(["compare", str(a), str(b)], str(b))


@case(AREA, "compare --help works")
def _(tmp: Path) -> Result:
    done = run_cli(["compare", "--help"])
    if done.raised is not None:
        return Result(UNCLEAR, f"--help crashed: {type(done.raised).__name__}: {done.raised}")
    return Result(CLEAR, "help printed") if done.code == 0 and "--threshold" in done.out else Result(UNCLEAR, done.err)


@case(AREA, "two real back-to-back `bench --preset ci` runs compare with exit 0", timeout_s=240)
def _(tmp: Path) -> Result:
    runs = []
    for name in ("a", "b"):
        out = tmp / "root" / "cpu" / name
        done = run_cli(["bench", "--preset", "ci", "--device", "cpu", "--no-progress", "--out", str(out)])
        if done.code != 0:
            return Result(UNCLEAR, f"bench exit {done.code}: {done.err[-300:]}")
        runs.append(out)
    return gate(*runs, 0)


@case(AREA, "a copy of a quiet run, every time and sample 1.2x, exits 1")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    a = make_run(tmp, "a", GRID, seed=3, samples=40)
    b = tmp / "b"
    shutil.copytree(a, b)
    frame = pd.read_parquet(b / store.RESULTS_FILE)
    for column in ("median_ms", "p25_ms", "p75_ms", "iqr_ms"):
        frame[column] *= 1.2
    frame["samples_ms"] = frame["samples_ms"].map(lambda s: [x * 1.2 for x in s])
    frame.to_parquet(b / store.RESULTS_FILE, index=False)
    return gate(a, b, 1, says="regression")


@case(AREA, "--threshold 0 (every change counts) is refused: no change can be told from noise")
def _(tmp: Path) -> Result:
    return cli_refused(
        ["compare", str(make_run(tmp, "a", GRID)), str(make_run(tmp, "b", GRID)), "--threshold", "0"], "threshold"
    )


@case(AREA, "a baseline with samples against a candidate without them is still judged (interquartile ranges)")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    a = make_run(tmp, "a", GRID, seed=1)
    b = make_run(tmp, "b", {k: v * 1.5 for k, v in GRID.items()}, seed=2)
    frame = pd.read_parquet(b / store.RESULTS_FILE).drop(columns=["samples_ms"])
    frame.to_parquet(b / store.RESULTS_FILE, index=False)
    return gate(a, b, 1, says="regression")


@case(AREA, "compare a run given by its results.parquet path")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    a, b = make_run(tmp, "a", GRID, seed=1), make_run(tmp, "b", GRID, seed=2)
    return gate(a / store.RESULTS_FILE, b / store.RESULTS_FILE, 0)
