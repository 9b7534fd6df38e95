"""Where the repository's measured data lives, wherever a notebook kernel was started.

JupyterLab starts kernels in `notebooks/`, `dsa-lab report` in the repository root, and
a user may import the package from anywhere. Every reader of `data/` goes through
`data_dir()` so that relative paths never depend on the working directory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

DATA_ENV = "DSA_LAB_DATA"
SCRATCH_ENV = "DSA_LAB_SCRATCH"
SCRATCH_FOLDER = "scratch"  # in the checkout, ignored by git (.gitignore)
PACKAGE_DIR = Path(__file__).resolve().parent


def _is_repository(folder: Path) -> bool:
    return (folder / "pyproject.toml").is_file() and (folder / "dsa_lab").is_dir()


def repository_root() -> Path | None:
    """The checkout this package was installed from (editable installs), else one above the cwd."""
    if _is_repository(PACKAGE_DIR.parent):
        return PACKAGE_DIR.parent
    here = Path.cwd().resolve()
    return next((folder for folder in (here, *here.parents) if _is_repository(folder)), None)


def build_dir(name: str, env: str) -> Path:
    """Where a build of ours lives: the folder `$<env>` names, else the checkout's (or the cwd's) `build/<name>/`,
    which git ignores."""
    override = os.environ.get(env)
    if override:
        return Path(override).expanduser()
    root = repository_root()
    return (root if root is not None else Path.cwd()) / "build" / name


def data_dir() -> Path:
    """The data folder: `$DSA_LAB_DATA` when set, else the repository's `data/`.

    Raises FileNotFoundError naming what was looked for, so a notebook never reads an
    empty folder by accident.
    """
    override = os.environ.get(DATA_ENV)
    if override:
        folder = Path(override).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"{DATA_ENV}={override!r} is not a folder; point it at a dsa_lab data folder")
        return folder.resolve()
    root = repository_root()
    if root is None:
        raise FileNotFoundError(
            f"no dsa_lab checkout found from {PACKAGE_DIR} or {Path.cwd()}; set {DATA_ENV} to the data folder"
        )
    return root / "data"


def scratch_dir() -> Path:
    """Where `bench` and `profile` write a run when no --out or --root says where: `$DSA_LAB_SCRATCH`
    when set, else the checkout's `scratch/` (ignored by git, so using the workbench leaves the
    repository clean and its provenance undirtied), else `scratch/` below the working directory."""
    override = os.environ.get(SCRATCH_ENV)
    if override:
        return Path(override).expanduser()
    root = repository_root()
    return (root if root is not None else Path.cwd()) / SCRATCH_FOLDER


def resolve_data_path(path: str | os.PathLike[str]) -> Path:
    """An absolute path as given; a relative one inside `data_dir()`.

    A leading `data/` is accepted too (paths written relative to the repository root), and a leading `scratch/`
    names the scratch folder (`scratch_dir()`: where a run of one's own lands), so a page can name either
    without a machine path.
    """
    given = Path(path).expanduser()
    if given.is_absolute():
        return given
    if given.parts and given.parts[0] == SCRATCH_FOLDER:
        return scratch_dir().joinpath(*given.parts[1:])
    if given.parts and given.parts[0] == "data":
        given = Path(*given.parts[1:])
    return data_dir() / given


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as reports show it, never a machine path: `data/...` (or `$DSA_LAB_DATA/...`) inside the data
    folder, `scratch/...` inside the scratch folder, relative to the working directory inside it, else its last
    two parts ('…/cpu/my-run')."""
    given = Path(path).expanduser()
    if not given.is_absolute() and not given.parts[:1] == ("..",):
        return str(path)
    resolved = given.resolve()
    prefix = f"${DATA_ENV}" if os.environ.get(DATA_ENV) else "data"
    roots = [(prefix, _or_none(data_dir)), (SCRATCH_FOLDER, _or_none(scratch_dir)), ("", Path.cwd())]
    for label, root in roots:
        if root is not None and resolved.is_relative_to(root.resolve()):
            inside = resolved.relative_to(root.resolve())
            return str(Path(label) / inside) if label else str(inside)
    return str(Path("…", *resolved.parts[-2:]))


def _or_none(folder: Callable[[], Path]) -> Path | None:
    try:
        return folder()
    except FileNotFoundError:
        return None


def docs_dir() -> Path:
    """The repository's `docs/` folder (lab notes that notebooks quote)."""
    root = repository_root()
    if root is None:
        raise FileNotFoundError(f"no dsa_lab checkout found from {PACKAGE_DIR} or {Path.cwd()}")
    return root / "docs"


def check_output_path(
    path: str | os.PathLike[str], inputs: list[str | os.PathLike[str]], flag: str, folder: bool = False
) -> Path:
    """`path`, an output a command writes, when it neither is nor lies inside one of `inputs` (the files and
    folders the command reads), links resolved, and is absent or what the command writes there (`check_target`);
    else a ValueError naming it. No command destroys its inputs, or anything but its own file or folder."""
    if not str(path).strip():
        raise ValueError(f"{flag}={str(path)!r}: give a path")
    try:
        output = Path(path).expanduser().resolve()
    except (OSError, RuntimeError) as err:  # a loop of links
        raise ValueError(f"{flag}={str(path)!r}: cannot be resolved ({err})") from None
    for given in inputs:
        read = Path(given).expanduser().resolve()
        if output == read or read in output.parents:
            where = "is" if output == read else "lies inside"
            raise ValueError(
                f"{flag}={str(path)!r} {where} {given}, which this command reads; an output never "
                "overwrites an input: choose another path"
            )
    check_target(Path(path).expanduser(), flag, folder)
    return Path(path)


def file_kind(mode: int) -> str:
    """What an `os.lstat` mode is, in words: 'a regular file', 'a folder', 'a FIFO (named pipe)'..."""
    kinds = (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def check_target(path: Path, flag: str, folder: bool = False) -> None:
    """An output's own path: absent, or a regular file (`folder`: a folder) it may replace; a link, a device
    (/dev/null), a FIFO, a socket, or a folder where a file belongs is refused by name, never replaced or written
    through."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise ValueError(f"{flag}={str(path)!r}: cannot be inspected ({err.strerror or err})") from None
    wanted, want = (stat.S_ISDIR, "a folder") if folder else (stat.S_ISREG, "a regular file")
    if not wanted(mode):
        target = f" to {os.readlink(path)}" if stat.S_ISLNK(mode) else ""
        raise ValueError(
            f"{flag}={str(path)!r} is {file_kind(mode)}{target}, not {want}: dsa_lab writes only its own "
            "files and folders, never through a link or over anything else; choose another path"
        )
