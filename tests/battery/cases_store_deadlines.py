"""The run store: deadlines (--point-timeout, --max-minutes, --max-seconds-per-point, --max-points), each
kept or refused by name."""

from __future__ import annotations

from pathlib import Path

from tests.battery import CLEAR, UNCLEAR, WRONG, Result, case, cli_refused
from tests.battery.store_support import AREA, FAST, bench

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
