"""How dsa_lab writes a file: whole or not at all, never through a symbolic link, an OS refusal one line.

A run folder is data a contributor may send (git stores links), and a report or a comparison
writes beside files a user keeps, so every write here opens with O_NOFOLLOW (a link where a
file belongs is refused by name, `refuse_link`, and a folder holding one by `check_no_links`),
and everything rewritten goes to a temp file created exclusively beside it (`.<name>.tmp-<pid>`,
`TEMP_PATTERN`), then `os.replace` (`write_atomic`): a reader sees the old file or the new one,
never half of one. `os.replace` would put a regular file in place of whatever is at the path, so
it replaces only a regular file (`check_replaceable`): a link there is refused by name, and so is a
device (/dev/null, /dev/full), a FIFO, a socket or a folder, which a rename run as root would
have turned into a regular file. A write the OS refuses (no space, read-only, permission) is one
`RunWriteError` naming the path (`writing`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from dsa_lab.paths import file_kind
from dsa_lab.store.format import RunFormatError

TEMP_PATTERN = re.compile(r"\.(?P<name>.+)\.tmp-\d+")  # `write_atomic`'s temp files: .<name>.tmp-<pid>
NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class RunWriteError(OSError):
    """The OS refused a write (no space, read-only, permission...); one line naming the path."""


@contextlib.contextmanager
def writing(path: Path, action: str = "write") -> Iterator[None]:
    """Turn an OSError while writing `path` into one `RunWriteError` line that names the path."""
    try:
        yield
    except RunWriteError:
        raise
    except OSError as err:
        reason = err.strerror or str(err) or type(err).__name__
        failure = RunWriteError(f"cannot {action} {path}: {reason}")
        failure.errno = err.errno or errno.EIO
        raise failure from None


def refuse_link(path: Path) -> None:
    """A symbolic link where a run file belongs: refused by name (a contributed run folder can carry one)."""
    raise RunFormatError(
        f"{path}: a symbolic link (to {os.readlink(path)}); a run folder holds plain files only and dsa_lab never "
        "reads or writes through a link: remove it (or give the folder it points to)"
    )


def check_no_links(run_dir: str | Path) -> None:
    """Refuse a run folder that is, or holds, a symbolic link, naming it (a link above the run folder, say a
    data root on another disk, is fine), or holds a FIFO, a socket or a device, which a read or an append would
    block on or write into (`check_regular`)."""
    run_dir = Path(run_dir)
    if run_dir.is_symlink():
        refuse_link(run_dir)
    if run_dir.is_dir():
        for entry in sorted(run_dir.iterdir()):
            if not entry.is_dir() or entry.is_symlink():
                check_regular(entry)


def check_regular(path: Path) -> None:
    """`path` is absent or a regular file: a link is refused by name (`refuse_link`), and so is a FIFO, a socket or
    a device (a `RunFormatError` saying what it is: reading one blocks, writing one reaches what it stands for)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise RunFormatError(f"{path}: cannot be inspected ({err.strerror or err})") from None
    if stat.S_ISLNK(mode):
        refuse_link(path)
    if not stat.S_ISREG(mode):
        raise RunFormatError(f"{path}: {file_kind(mode)}, not a regular file; a run folder holds plain files only")


def open_no_follow(path: Path, flags: int, action: str) -> int:
    """os.open with O_NOFOLLOW (and O_NONBLOCK, so a FIFO planted there cannot block the open): a link at `path` is
    refused by name, and so is anything opened that is not a regular file; an OS error is one line naming it."""
    check_regular(path)
    try:
        fd = os.open(path, flags | NO_FOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP or path.is_symlink():
            refuse_link(path)
        with writing(path, action):
            raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # swapped in after the check above
        os.close(fd)
        raise RunFormatError(f"{path}: {file_kind(mode)}, not a regular file; dsa_lab opens plain files only")
    os.set_blocking(fd, True)
    return fd


def check_replaceable(path: Path) -> None:
    """What `write_atomic` may replace: nothing, or a regular file. A link is refused by name (`refuse_link`); a
    device, FIFO, socket or folder is a `RunWriteError` naming what it is."""
    with writing(path, "inspect"):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return
    if stat.S_ISLNK(mode):
        refuse_link(path)
    if not stat.S_ISREG(mode):
        failure = RunWriteError(
            f"cannot write {path}: it is {file_kind(mode)}, not a regular file; dsa_lab replaces only a regular "
            "file, never a device, a FIFO or a folder: choose another path"
        )
        failure.errno = errno.EEXIST
        raise failure


def write_atomic(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write `path` whole or not at all: `write(handle)` fills a temp file created exclusively beside it
    (never through a link planted at its name), then `os.replace` moves it over `path`, which must be absent or a
    regular file (`check_replaceable`, before the write and again before the move)."""
    path = Path(path)
    check_replaceable(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with writing(path):
            if tmp.is_symlink() or tmp.exists():
                tmp.unlink()  # a stale temp file, or a link planted at its name: removed, never followed
            with os.fdopen(open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "write"), "wb") as handle:
                write(handle)
            check_replaceable(path)
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda handle: handle.write(text.encode("utf-8")))


def write_json(path: Path, payload: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
