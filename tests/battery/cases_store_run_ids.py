"""The run store: odd run ids and empty roots, refused by name with nothing written outside --root."""

from __future__ import annotations

import os
from pathlib import Path

from tests.battery import CLEAR, UNCLEAR, WRONG, Result, case, cli_refused, refused, run_cli
from tests.battery.store_support import AREA, FAST

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
