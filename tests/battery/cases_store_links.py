"""The run store: symbolic links in a run folder (nothing is written or read through one), and folders left
by a kill inside create_run."""

from __future__ import annotations

import os
from pathlib import Path

from tests.battery import (
    CLEAR,
    FAST_PROFILE,
    UNCLEAR,
    WRONG,
    Result,
    case,
    cli_refused,
    refused,
    run_cli,
    safe,
    unchanged,
)
from tests.battery.store_support import AREA, FAST, VICTIM, bench, partial_run, relink, victim

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
        argv = [*FAST, "--next-n", "1"] if cmd == "bench" else FAST_PROFILE
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
