"""The run store: symlinks, stuck folders, kill and resume, changed flags, deadlines, full and read-only
disks, odd run ids, DSA_LAB_DATA, and loads that must validate what they read."""

from __future__ import annotations

import atexit
import builtins
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from tests.battery import (
    CLEAR,
    UNCLEAR,
    WRONG,
    Result,
    case,
    cli_refused,
    environment,
    refused,
    run_cli,
    safe,
    unchanged,
)

AREA = "store"
FAST = [
    "bench",
    "--preset",
    "ci",
    "--backend",
    "reference",
    "--batch",
    "1",
    "--context",
    "64",
    "--strategy",
    "native",
    "--no-progress",
    "--device",
    "cpu",
    "--max-seconds-per-point",
    "0.01",
]
VICTIM = b"precious bytes outside the run folder\n"


def bench(out: Path, *extra: str, next_n: str = "1,2"):
    return run_cli([*FAST, "--next-n", next_n, "--out", str(out), *extra])


_TEMPLATE: list[Path] = []


def partial_run(tmp: Path, name: str = "run") -> Path:
    """A run folder with one of its two points recorded (resumable): a copy of one made once per process."""
    if not _TEMPLATE:
        folder = Path(tempfile.mkdtemp(prefix="dsa_lab_battery_template_")) / "run"
        atexit.register(shutil.rmtree, folder.parent, True)
        done = bench(folder, "--max-points", "1")
        assert done.code == 0, done.err
        _TEMPLATE.append(folder)
    out = tmp / "root" / "cpu" / name
    shutil.copytree(_TEMPLATE[0], out)
    return out


def victim(tmp: Path, content: bytes = VICTIM) -> Path:
    path = tmp / "outside" / "victim.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def relink(path: Path, target: Path) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


# ---------------------------------------------------------------- links in a run folder


for _name, _keep in ((".lock", False), ("points.jsonl", True), ("points.jsonl", False)):

    def _make(name: str = _name, keep: bool = _keep):
        def run(tmp: Path) -> Result:
            out = partial_run(tmp)
            content = (out / name).read_bytes() if keep and (out / name).exists() else VICTIM
            target = victim(tmp, content)
            relink(out / name, target)
            return cli_refused(
                [*FAST, "--next-n", "1,2", "--out", str(out), "--resume"], name, harm=unchanged(target, content)
            )

        return run

    case(AREA, f"resume through a symlinked {_name}{' (a copy of the real one)' if _keep else ''}")(_make())


for _name in ("results.parquet", "provenance.json"):

    def _safe_link(tmp: Path, name: str = _name) -> Result:
        out = partial_run(tmp)
        content = (out / name).read_bytes()
        target = victim(tmp, content)
        relink(out / name, target)
        return safe(lambda: bench(out, "--resume"), unchanged(target, content), name)

    case(AREA, f"resume through a symlinked {_name} (a copy of the real one)")(_safe_link)


@case(AREA, "resume with a torn points.jsonl that is a link: the repair must not truncate the target")
def _(tmp: Path) -> Result:
    out = partial_run(tmp)
    content = (out / "points.jsonl").read_bytes() + b'{"point_key": "torn'
    target = victim(tmp, content)
    relink(out / "points.jsonl", target)
    return cli_refused(
        [*FAST, "--next-n", "1,2", "--out", str(out), "--resume"], "points.jsonl", harm=unchanged(target, content)
    )


for _cmd in ("bench", "profile"):

    def _fresh_lock(tmp: Path, cmd: str = _cmd) -> Result:
        out = tmp / "root" / "cpu" / "fresh"
        out.mkdir(parents=True)
        target = victim(tmp)
        (out / ".lock").symlink_to(target)
        argv = (
            [*FAST, "--next-n", "1"]
            if cmd == "bench"
            else [
                "profile",
                "--tool",
                "torch",
                "--device",
                "cpu",
                "--batch",
                "1",
                "--context",
                "64",
                "--next-n",
                "1",
                "--no-trace",
            ]
        )
        return cli_refused([*argv, "--out", str(out)], ".lock", harm=unchanged(target, VICTIM))

    case(AREA, f"{_cmd} into a fresh folder whose .lock is a link to a file outside")(_fresh_lock)


@case(AREA, "bench into a fresh folder whose .lock is a dangling link: nothing created outside")
def _(tmp: Path) -> Result:
    out = tmp / "root" / "cpu" / "fresh"
    out.mkdir(parents=True)
    target = tmp / "outside" / "created-by-the-lock"
    target.parent.mkdir()
    (out / ".lock").symlink_to(target)
    return cli_refused([*FAST, "--next-n", "1", "--out", str(out)], ".lock", harm=unchanged(target, None))


for _tmpname in ("provenance.json", "results.parquet"):

    def _planted_temp(tmp: Path, name: str = _tmpname) -> Result:
        out = partial_run(tmp)
        target = victim(tmp)
        (out / f".{name}.tmp-{os.getpid()}").symlink_to(target)
        return safe(lambda: bench(out, "--resume"), unchanged(target, VICTIM), name)

    case(AREA, f"resume with a link planted at {_tmpname}'s temp file name")(_planted_temp)


@case(AREA, "append_point into a folder whose points.jsonl is a link")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    out = partial_run(tmp)
    target = victim(tmp)
    relink(out / "points.jsonl", target)
    return refused(lambda: store.append_point(out, {"point_key": "x"}), "points.jsonl", harm=unchanged(target, VICTIM))


@case(AREA, "write_results over a results.parquet that is a link")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    out = partial_run(tmp)
    target = victim(tmp)
    relink(out / "results.parquet", target)
    return safe(lambda: store.write_results(out), unchanged(target, VICTIM), "results.parquet")


@case(AREA, "update_provenance over a provenance.json that is a link")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    out = partial_run(tmp)
    content = (out / "provenance.json").read_bytes()
    target = victim(tmp, content)
    relink(out / "provenance.json", target)
    return safe(lambda: store.update_provenance(out, note="x"), unchanged(target, content), "provenance.json")


@case(AREA, "load_run of a run whose results.parquet links to another run's results")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    out, other = partial_run(tmp, "a"), partial_run(tmp, "b")
    relink(out / "results.parquet", other / "results.parquet")
    return refused(lambda: store.load_run(out), "results.parquet")


# ---------------------------------------------------------------- stuck folders (a kill inside create_run)


def stuck(tmp: Path, lock: bool = True) -> Path:
    out = tmp / "root" / "cpu" / "stuck"
    out.mkdir(parents=True)
    if lock:
        (out / ".lock").write_text("pid 99999 since 2026-01-01T00:00:00+00:00\n")
    (out / ".provenance.json.tmp-99999").write_text('{"schema_version": 1, "run_id": "st')
    return out


@case(AREA, "a fresh bench into a folder left by a kill inside create_run completes it")
def _(tmp: Path) -> Result:
    out = stuck(tmp)
    done = bench(out)
    if done.code == 0 and (out / "results.parquet").is_file():
        leftovers = [p.name for p in out.iterdir() if ".tmp-" in p.name]
        return Result(WRONG, f"leftovers kept: {leftovers}") if leftovers else Result(CLEAR, "completed")
    return Result(UNCLEAR, f"exit {done.code}: {done.err.strip()[-300:]}")


@case(AREA, "a fresh bench into a folder holding only a stale temp provenance (no .lock)")
def _(tmp: Path) -> Result:
    out = stuck(tmp, lock=False)
    done = bench(out)
    return Result(CLEAR, "completed") if done.code == 0 else Result(UNCLEAR, done.err.strip()[-300:])


@case(AREA, "resuming a folder left by a kill inside create_run says what it is")
def _(tmp: Path) -> Result:
    out = stuck(tmp)
    return cli_refused([*FAST, "--next-n", "1,2", "--out", str(out), "--resume"], ".provenance.json.tmp-99999")


@case(AREA, "a fresh bench into a folder holding only .lock (killed between lock and create)")
def _(tmp: Path) -> Result:
    out = tmp / "root" / "cpu" / "lockonly"
    out.mkdir(parents=True)
    (out / ".lock").write_text("pid 99999\n")
    done = bench(out)
    return Result(CLEAR, "completed") if done.code == 0 else Result(UNCLEAR, done.err.strip()[-300:])


@case(AREA, "a fresh bench into a folder holding a foreign file is refused by name")
def _(tmp: Path) -> Result:
    out = tmp / "root" / "cpu" / "taken"
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    return cli_refused(
        [*FAST, "--next-n", "1", "--out", str(out)], str(out), harm=unchanged(out / "notes.txt", b"mine")
    )


@case(AREA, "a resumed run clears its own stale temp files (a kill during write_results)")
def _(tmp: Path) -> Result:
    out = partial_run(tmp)
    (out / ".results.parquet.tmp-99999").write_bytes(b"PAR1 half")
    done = bench(out, "--resume")
    if done.code != 0:
        return Result(UNCLEAR, done.err.strip()[-300:])
    left = [p.name for p in out.iterdir() if ".tmp-" in p.name]
    return Result(UNCLEAR, f"stale temp files kept: {left}") if left else Result(CLEAR, "cleared")


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


# ---------------------------------------------------------------- deadlines


def _bench_ok(tmp: Path, *flags: str, expect_status: str | None = None) -> Result:
    from dsa_lab.store import folders as store

    out = tmp / "root" / "cpu" / "deadline"
    done = bench(out, *flags)
    if done.code != 0:
        if "Traceback" in done.err or done.raised is not None:
            return Result(UNCLEAR, f"{done.raised!r} {done.err.strip()[-300:]}")
        return Result(CLEAR, done.err.strip()[-200:])
    if expect_status is not None:
        statuses = set(store.load_run(out).results["status"])
        if statuses != {expect_status}:
            return Result(WRONG, f"statuses {statuses}, expected {expect_status}")
    return Result(CLEAR, "ran")


for _label, _flags, _status in (
    ("--point-timeout 1e-6: every point an error, recorded", ("--point-timeout", "1e-6"), "error"),
    ("--max-minutes 0: the run opens and records nothing", ("--max-minutes", "0"), None),
    ("--max-minutes 1e-9", ("--max-minutes", "1e-9"), None),
    ("--point-timeout 1e300", ("--point-timeout", "1e300"), "ok"),
    ("--max-minutes 1e300", ("--max-minutes", "1e300"), "ok"),
    ("--max-seconds-per-point 1e-9", ("--max-seconds-per-point", "1e-9"), "ok"),
):
    case(AREA, f"deadline {_label}")(lambda tmp, f=_flags, s=_status: _bench_ok(tmp, *f, expect_status=s))

for _label, _flags, _name in (
    ("--point-timeout -0.0", ("--point-timeout", "-0.0"), "--point-timeout"),
    ("--point-timeout inf", ("--point-timeout", "inf"), "--point-timeout"),
    ("--max-minutes inf", ("--max-minutes", "inf"), "--max-minutes"),
    ("--max-seconds-per-point inf", ("--max-seconds-per-point", "inf"), "--max-seconds-per-point"),
    ("--max-seconds-per-point nan", ("--max-seconds-per-point", "nan"), "--max-seconds-per-point"),
    ("--max-points 2**70", ("--max-points", str(2**70)), "--max-points"),
):
    case(AREA, f"deadline refused: {_label}")(
        lambda tmp, f=_flags, n=_name: cli_refused([*FAST, "--next-n", "1", "--root", str(tmp / "r"), *f], n)
    )


# ---------------------------------------------------------------- full and read-only disks


def _os_failure(tmp: Path, target: str, err: int, where: str, name: str) -> Result:
    """An OSError `err` raised by `where` ('fsync', 'replace', 'mkdir', 'open') for paths containing `target`."""

    out = tmp / "root" / "cpu" / "disk"
    owners = {
        "fsync": [(os, "fsync")],
        "replace": [(os, "replace")],
        "mkdir": [(Path, "mkdir")],
        "open": [(os, "open"), (builtins, "open")],
    }[where]
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr in owners]

    def failing_for(real):
        def failing(*args, **kwargs):
            shown = " ".join(str(a) for a in args)
            if where == "fsync" or target in shown:
                raise OSError(err, os.strerror(err))
            return real(*args, **kwargs)

        return failing

    for owner, attr, real in saved:
        setattr(owner, attr, failing_for(real))
    try:
        return cli_refused([*FAST, "--next-n", "1", "--out", str(out)], name, os.strerror(err))
    finally:
        for owner, attr, real in saved:
            setattr(owner, attr, real)


for _label, _args in (
    ("no space while appending a point", ("points", errno.ENOSPC, "fsync", "points.jsonl")),
    ("no space while replacing results.parquet", ("results.parquet", errno.ENOSPC, "replace", "results.parquet")),
    ("read-only file system creating the folder", ("disk", errno.EROFS, "mkdir", "disk")),
    ("permission denied opening the lock", (".lock", errno.EACCES, "open", ".lock")),
    ("no space writing provenance.json", ("provenance.json", errno.ENOSPC, "replace", "provenance.json")),
):
    case(AREA, f"disk: {_label}")(lambda tmp, a=_args: _os_failure(tmp, *a))


@case(AREA, "disk: a failed create leaves a folder a second bench can use")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    out = tmp / "root" / "cpu" / "disk"
    real = store.os.replace

    def failing(src, dst, *args, **kwargs):
        if "provenance.json" in str(dst):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst, *args, **kwargs)

    store.os.replace = failing
    try:
        first = bench(out)
    finally:
        store.os.replace = real
    second = bench(out)
    if first.code == 2 and second.code == 0:
        return Result(CLEAR, "the second bench ran")
    return Result(UNCLEAR, f"exits {first.code}, {second.code}: {second.err.strip()[-300:]}")


@case(AREA, "disk: --root is a file")
def _(tmp: Path) -> Result:
    (tmp / "afile").write_text("x")
    return cli_refused(
        [*FAST, "--next-n", "1", "--root", str(tmp / "afile")], str(tmp / "afile"), harm=unchanged(tmp / "afile", b"x")
    )


@case(AREA, "disk: --out under a file")
def _(tmp: Path) -> Result:
    (tmp / "afile").write_text("x")
    return cli_refused([*FAST, "--next-n", "1", "--out", str(tmp / "afile" / "run")], str(tmp / "afile"))


@case(AREA, "disk: --out is an existing file")
def _(tmp: Path) -> Result:
    (tmp / "afile").write_text("x")
    return cli_refused(
        [*FAST, "--next-n", "1", "--out", str(tmp / "afile")], str(tmp / "afile"), harm=unchanged(tmp / "afile", b"x")
    )


# ---------------------------------------------------------------- odd run ids and roots

BAD_RUN_IDS = [
    "..",
    ".",
    "../x",
    "a/b",
    "/abs",
    "a\\b",
    "a b",
    "-x",
    ".hidden",
    "a\x00b",
    "a\nb",
    "é",
    "x" * 129,
    "",
    "~",
    "$HOME",
    "a:b",
    "run\t1",
    "💥",
    "a*b",
    "a?b",
    "<b>",
    "a'b",
]
for _run_id in BAD_RUN_IDS:

    def _bad_id(tmp: Path, run_id: str = _run_id) -> Result:
        root = tmp / "root"

        def outside() -> str | None:
            written = [p for p in tmp.rglob("provenance.json") if root not in p.parents]
            return f"written outside --root: {written}" if written else None

        return cli_refused(
            [*FAST, "--next-n", "1", "--root", str(root), f"--run-id={run_id}"], "--run-id", harm=outside
        )

    case(AREA, f"run id {_run_id!r}")(_bad_id)

for _run_id in ("ok-1", "A.b_c", "x" * 128, "2026.01.01", "r..x"):

    def _good_id(tmp: Path, run_id: str = _run_id) -> Result:
        root = tmp / "root"
        done = run_cli([*FAST, "--next-n", "1", "--root", str(root), f"--run-id={run_id}"])
        if done.code != 0:
            return Result(UNCLEAR, f"a plain id refused: {done.err.strip()[-200:]}")
        written = list(tmp.rglob("provenance.json"))
        return (
            Result(CLEAR, "under root")
            if written == [root / "cpu" / run_id / "provenance.json"]
            else Result(WRONG, f"written at {written}")
        )

    case(AREA, f"plain run id {_run_id[:20]!r}")(_good_id)

for _value in (None, 5, b"run", ["run"]):
    case(AREA, f"check_run_id({_value!r})")(
        lambda tmp, v=_value: refused(
            lambda: __import__("dsa_lab.store.folders").store.folders.check_run_id(v), "run_id"
        )
    )


for _flag in ("--root", "--out"):

    def _empty(tmp: Path, flag: str = _flag) -> Result:
        os.chdir(tmp)

        def stray() -> str | None:
            written = list(tmp.rglob("provenance.json"))
            return f"an empty {flag} wrote {written}" if written else None

        return cli_refused([*FAST, "--next-n", "1", f"{flag}="], flag, harm=stray)

    case(AREA, f"bench with an empty {_flag}")(_empty)


# ---------------------------------------------------------------- DSA_LAB_DATA


def _latency(tmp: Path) -> object:
    from dsa_lab.notebook.sections import latency_run

    return latency_run()


for _label, _value, _names in (
    ("a folder that does not exist", "{tmp}/nowhere", ("DSA_LAB_DATA", "nowhere")),
    ("a file", "{tmp}/afile", ("DSA_LAB_DATA", "afile")),
):

    def _data_env(tmp: Path, value: str = _value, names=_names) -> Result:
        (tmp / "afile").write_text("x")
        with environment(DSA_LAB_DATA=value.format(tmp=tmp)):
            return refused(lambda: _latency(tmp), *names)

    case(AREA, f"DSA_LAB_DATA is {_label}")(_data_env)


def _data_with(tmp: Path, damage) -> Path:
    """A data folder holding one measured h200 study run (a copy of a tiny CPU run relabelled as H200 study data,
    not scratch: run discovery passes scratch and other GPUs' runs over), damaged by `damage`."""
    data = tmp / "data"
    out = partial_run(tmp, "seed")
    run = data / "h200" / "h200-damaged"
    run.mkdir(parents=True)
    for name in ("provenance.json", "results.parquet", "points.jsonl"):
        (run / name).write_bytes((out / name).read_bytes())
    _set_provenance(run, lambda p: p.update(scratch=False, device="cuda", device_name="NVIDIA H200"))
    damage(run)
    return data


def _ignored_names(tmp: Path, damage, *names: str) -> Result:
    """A notebook's run discovery (`notebook.runs.search`, what `latency_run` asks before falling back to a CPU
    stand-in) with a damaged run in the data folder: it is passed over, named, with why; a run it
    does choose is announced."""
    from dsa_lab.notebook import display as notebook
    from dsa_lab.notebook.runs import chosen as as_chosen
    from dsa_lab.notebook.runs import passed, search

    data = _data_with(tmp, damage)
    with environment(DSA_LAB_DATA=str(data)):
        try:
            found = search("h200")
            ignored = passed(found)
            chosen = as_chosen(found.run, ignored) if found.run is not None else None
            if chosen is not None:
                real = notebook.display
                notebook.display = lambda *objs, **kw: None
                try:
                    notebook.announce(chosen, "battery")
                finally:
                    notebook.display = real
        except Exception as err:
            from tests.battery import judge_error

            return judge_error(err, names, (ValueError,))
    if chosen is not None:
        return Result(WRONG, "the damaged run was shown as the measurement")
    text = " ".join(str(problem) for _, problem in ignored)
    missing = [n for n in names if n not in text]
    return Result(UNCLEAR, f"ignored without naming {missing}: {text[:300]}") if missing else Result(CLEAR, text[:200])


def _set_results(run: Path, change) -> None:
    frame = pd.read_parquet(run / "results.parquet")
    change(frame).to_parquet(run / "results.parquet", index=False)


def _set_provenance(run: Path, change) -> None:
    provenance = json.loads((run / "provenance.json").read_text())
    change(provenance)
    (run / "provenance.json").write_text(json.dumps(provenance))


DAMAGES = {
    "truncated results": (lambda r: (r / "results.parquet").write_bytes(b"PAR1"), ("results.parquet",)),
    "git recorded as a string": (lambda r: _set_provenance(r, lambda p: p.update(git="abc")), ("git",)),
    "environment as a list": (lambda r: _set_provenance(r, lambda p: p.update(environment=[1])), ("environment",)),
    "created not a time": (lambda r: _set_provenance(r, lambda p: p.update(created="yesterday")), ("created",)),
    "timing_method a number": (lambda r: _set_provenance(r, lambda p: p.update(timing_method=3)), ("timing_method",)),
    "times stored as strings": (
        lambda r: _set_results(r, lambda f: f.assign(median_ms=f["median_ms"].map(str))),
        ("median_ms",),
    ),
    "next_n NaN": (lambda r: _set_results(r, lambda f: f.assign(next_n=float("nan"))), ("next_n",)),
    "only the minimal columns": (
        lambda r: _set_results(r, lambda f: f[list(__import__("dsa_lab.store.folders").store.folders.RESULT_COLUMNS)]),
        ("columns",),
    ),
}
for _label, (_damage, _names) in DAMAGES.items():
    case(AREA, f"DSA_LAB_DATA holds a run with {_label}: passed over by name", timeout_s=90)(
        lambda tmp, d=_damage, n=_names: _ignored_names(tmp, d, "h200-damaged", *n)
    )


# ---------------------------------------------------------------- loads validate types and schemas


def _tiny(tmp: Path) -> Path:
    return partial_run(tmp)


def _load_refuses(tmp: Path, change, *names: str) -> Result:
    from dsa_lab.store import folders as store

    out = _tiny(tmp)
    change(out)
    return refused(lambda: store.load_run(out), *names, types=(store.RunFormatError,))


LOADS = {
    "median_ms as numeric strings": (lambda f: f.assign(median_ms=f["median_ms"].map(str)), "median_ms"),
    "p25_ms as strings": (lambda f: f.assign(p25_ms=f["p25_ms"].map(str)), "p25_ms"),
    "next_n NaN": (lambda f: f.assign(next_n=float("nan")), "next_n"),
    "next_n 1.5": (lambda f: f.assign(next_n=1.5), "next_n"),
    "next_n 0": (lambda f: f.assign(next_n=0), "next_n"),
    "next_n 99": (lambda f: f.assign(next_n=99), "next_n"),
    "batch as strings": (lambda f: f.assign(batch="2"), "batch"),
    "batch 0": (lambda f: f.assign(batch=0), "batch"),
    "batch negative": (lambda f: f.assign(batch=-3), "batch"),
    "heads 64.0": (lambda f: f.assign(heads=64.0), "heads"),
    "head_dim as strings": (lambda f: f.assign(head_dim="128"), "head_dim"),
    "context as ints": (lambda f: f.assign(context=64), "context"),
    "context garbage": (lambda f: f.assign(context="long"), "context"),
    "strategy unknown": (lambda f: f.assign(strategy="diagonal"), "strategy"),
    "cache_dtype unknown": (lambda f: f.assign(cache_dtype="int8"), "cache_dtype"),
    "backend with markup": (lambda f: f.assign(backend="<img src=x onerror=alert(1)>"), "backend"),
    "backend empty": (lambda f: f.assign(backend=""), "backend"),
    "status None": (lambda f: f.assign(status=None), "status"),
    "message a number": (lambda f: f.assign(message=5), "message"),
    "only the minimal columns": (
        lambda f: f[list(__import__("dsa_lab.store.folders").store.folders.RESULT_COLUMNS)],
        "kernel_rows",
    ),
    "samples negative": (
        lambda f: f.assign(samples_ms=f["samples_ms"].map(lambda s: [-abs(x) for x in s])),
        "samples_ms",
    ),
    "samples NaN": (
        lambda f: f.assign(samples_ms=f["samples_ms"].map(lambda s: [float("nan")] * len(s))),
        "samples_ms",
    ),
    "samples strings": (
        lambda f: f.assign(samples_ms=f["samples_ms"].map(lambda s: [str(x) for x in s])),
        "samples_ms",
    ),
    "samples a number": (lambda f: f.assign(samples_ms=1.0), "samples_ms"),
    "median inf": (lambda f: f.assign(median_ms=float("inf"), p75_ms=float("inf")), "median_ms"),
    "point_key duplicated": (lambda f: pd.concat([f, f]), "point_key"),
}
for _label, (_change, _name) in LOADS.items():
    case(AREA, f"load_run: {_label}")(
        lambda tmp, c=_change, n=_name: _load_refuses(tmp, lambda out: _set_results(out, c), "results.parquet", n)
    )

PROVENANCES = {
    "git a string": (lambda p: p.update(git="abc"), "git"),
    "environment a list": (lambda p: p.update(environment=[1]), "environment"),
    "created not a time": (lambda p: p.update(created="yesterday"), "created"),
    "run_id with markup": (lambda p: p.update(run_id="<script>alert(1)</script>"), "run_id"),
    "seed a string": (lambda p: p.update(seed="zero"), "seed"),
    "timing_method a number": (lambda p: p.update(timing_method=3), "timing_method"),
    "device a list": (lambda p: p.update(device=["cpu"]), "device"),
    "device_name a number": (lambda p: p.update(device_name=7), "device_name"),
}
for _label, (_change, _name) in PROVENANCES.items():
    case(AREA, f"read provenance: {_label}")(
        lambda tmp, c=_change, n=_name: _load_refuses(tmp, lambda out: _set_provenance(out, c), "provenance.json", n)
    )


# ---------------------------------------------------------------- profile discovery


def _profile_folder(tmp: Path, drop: str | None) -> Path:
    from dsa_lab.store import folders as store

    root = tmp / "profiles"
    folder = root / "p1"
    folder.mkdir(parents=True)
    provenance = {
        "schema_version": store.SCHEMA_VERSION,
        "run_id": "p1",
        "source": "measured",
        "device": "cpu",
        "created": "2026-01-01T00:00:00+00:00",
        "command": [],
        "timing_method": "t",
        "seed": 0,
        "environment": {},
        "git": {},
        "kind": "profile",
    }
    if drop:
        provenance.pop(drop)
    (folder / "provenance.json").write_text(json.dumps(provenance))
    pd.DataFrame({"x": [1]}).to_parquet(folder / "torch_kernels.parquet")
    return root


for _drop in ("created", "kind", "run_id", "source"):

    def _profile(tmp: Path, drop: str = _drop) -> Result:
        from dsa_lab.profiling.runs import scan_profile_runs

        scan = scan_profile_runs(_profile_folder(tmp, drop))
        if scan.runs:
            return Result(CLEAR, "kept")
        text = " ".join(problem for _, problem in scan.ignored)
        if not scan.ignored:
            return Result(WRONG, "skipped silently")
        return Result(CLEAR, text[:200]) if drop in text else Result(UNCLEAR, f"ignored, not naming {drop}: {text}")

    case(AREA, f"profile discovery: a profile run whose provenance lacks {_drop!r}")(_profile)


@case(AREA, "profile discovery: a profile run whose configs is a string is passed over by name")
def _(tmp: Path) -> Result:
    from dsa_lab.profiling.runs import shipped_or_cpu_reference

    root = _profile_folder(tmp, None)
    path = root / "p1" / "provenance.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "configs": "x"}))
    run = shipped_or_cpu_reference(root, batch=1, context=64, next_ns=(1,))
    text = " ".join(p for _, p in run.ignored)
    return Result(CLEAR, text[:200]) if "configs" in text else Result(WRONG, f"not reported: {run.ignored}")


# ---------------------------------------------------------------- beyond the cases


@case(AREA, "resume a profile run as a timing run")
def _(tmp: Path) -> Result:
    out = tmp / "root" / "cpu" / "profiles" / "p"
    done = run_cli(
        [
            "profile",
            "--tool",
            "torch",
            "--device",
            "cpu",
            "--batch",
            "1",
            "--context",
            "64",
            "--next-n",
            "1",
            "--no-trace",
            "--out",
            str(out),
        ]
    )
    if done.code != 0:
        return Result(UNCLEAR, f"profile exit {done.code}: {done.err[-200:]}")
    before = sorted(p.name for p in out.iterdir())
    return cli_refused(
        ["bench", "--resume", "--out", str(out), "--no-progress", "--device", "cpu"],
        str(out),
        harm=lambda: None if sorted(p.name for p in out.iterdir()) == before else "files added",
    )


@case(AREA, "DSA_LAB_DATA holds a run whose provenance.json is a link: passed over by name")
def _(tmp: Path) -> Result:
    def link(run: Path) -> None:
        target = tmp / "elsewhere.json"
        target.write_bytes((run / "provenance.json").read_bytes())
        (run / "provenance.json").unlink()
        (run / "provenance.json").symlink_to(target)

    return _ignored_names(tmp, link, "h200-damaged", "symbolic link")


@case(AREA, "a results file with an extra column of any type still loads")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    out = partial_run(tmp)
    _set_results(out, lambda f: f.assign(my_notes=[{"a": 1}] * len(f)))
    return Result(CLEAR, "loaded") if len(store.load_run(out).results) == 1 else Result(WRONG, "rows lost")


@case(AREA, "read provenance: a NaN seed")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    out = partial_run(tmp)
    path = out / "provenance.json"
    path.write_text(path.read_text().replace('"seed": 0', '"seed": NaN'))
    return refused(lambda: store.load_run(out), "provenance.json", "seed", types=(store.RunFormatError,))


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


@case(AREA, "runs --root lists a run holding a link as damaged, beside the good one")
def _(tmp: Path) -> Result:
    good, bad = partial_run(tmp, "good"), partial_run(tmp, "bad")
    (bad / "results.parquet").unlink()
    (bad / "results.parquet").symlink_to(good / "results.parquet")
    done = run_cli(["runs", "--root", str(tmp / "root")])
    if done.code != 0:
        return Result(UNCLEAR, done.err[-200:])
    ok = "symbolic link" in done.out and "good" in done.out
    return Result(CLEAR, "listed") if ok else Result(WRONG, f"the link is not reported: {done.out[-300:]}")
