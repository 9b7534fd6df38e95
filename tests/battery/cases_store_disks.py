"""The run store: full and read-only disks, and a --root or --out that is (or lies under) a file."""

from __future__ import annotations

import builtins
import errno
import os
from pathlib import Path

from tests.battery import CLEAR, UNCLEAR, Result, case, cli_refused, unchanged
from tests.battery.store_support import AREA, FAST, bench

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
