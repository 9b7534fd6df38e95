"""Execute the notebooks with papermill into `reports/` and index them.

`dsa-lab report`'s command line (its flags; `--run`'s run checked, then handed to every notebook), a module apart
from the running (`report.execute`), as the other rooms keep theirs.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any

from dsa_lab.paths import resolve_data_path
from dsa_lab.report.execute import build_report
from dsa_lab.store.folders import RunFormatError, load_run

DEFAULT_NOTEBOOKS = Path("notebooks")
DEFAULT_OUT = Path("reports")
RUN_PARAMETERS = ("run_path", "serving_run_path", "gluon_run_path")  # what `--run PATH` sets: every run a page reads
# What `--run` clears: defaults that name another run or another run's measurements ('' : the page says it shows none)
OTHER_RUN_PARAMETERS = ("repeat_path", "gluon_ncu_path", "timeline_path", "profile_path")


def run_parameter(path: Path) -> str:
    """What `--run PATH` hands the notebooks: PATH relative to data/ or as `scratch/...` when it lies there (the
    pages then name it so, never by a machine path), else the folder's absolute path (the notebooks run in the
    repository root); a path that is not a folder is read relative to data/."""
    from dsa_lab.paths import data_dir, resolve_data_path, scratch_dir

    if not path.is_absolute() and resolve_data_path(path).is_dir():
        return str(path)
    if not path.is_dir():
        return str(path)
    folder = path.resolve()
    for root, prefix in ((data_dir(), ""), (scratch_dir(), "scratch/")):
        if folder.is_relative_to(root.resolve()):
            return prefix + folder.relative_to(root.resolve()).as_posix()
    return str(folder)


def parse_parameter(text: str) -> tuple[str, Any]:
    """`key=value` with value read as a Python literal when it is one (3, True, 'x'), else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip().isidentifier():
        raise ValueError(f"parameter {text!r}: expected key=value with key a Python identifier")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    except (RecursionError, MemoryError):  # '1+1+...' 300,000 terms deep: no parameter a notebook declares
        raise ValueError(
            f"parameter {key.strip()!r}: a value of {len(raw)} characters nested too deep to read"
        ) from None
    return key.strip(), value


def run_flag(run: Path) -> str:
    """`--run`'s run as the notebooks take it (a folder as given, resolved; else a path relative to data/), once it
    is known to be a run `load_run` reads: a loop of links, a file, an absent or a damaged run is refused by name
    before any notebook runs (each would fail, or fall back, one by one)."""
    folder = run if run.is_dir() else resolve_data_path(run)
    try:
        resolved = folder.resolve(strict=True)
    except (OSError, RuntimeError) as err:  # absent, or a loop of symbolic links
        raise ValueError(f"--run={str(run)!r}: no run there ({err}); give a run folder or one under data/") from None
    if not folder.is_dir():
        raise ValueError(f"--run={str(run)!r}: {folder} is not a run folder")
    try:
        load_run(folder)  # as given: a run folder that is a link is refused, as the store refuses it everywhere
    except RunFormatError as err:
        raise ValueError(f"--run={str(run)!r}: {err}") from None
    return str(resolved) if run.is_dir() else str(run)


def _cli(args: argparse.Namespace) -> int:
    params = dict(parse_parameter(p) for p in args.parameter)
    if args.run is not None:  # one run everywhere: every notebook's sections and the index; no other run's default
        run = run_parameter(Path(run_flag(args.run)))  # refused by name before any notebook runs unless it loads
        params.update({name: run for name in RUN_PARAMETERS})
        params.update({name: "" for name in OTHER_RUN_PARAMETERS})
    device = params.pop("device", None)
    result = build_report(args.notebooks, args.out, params, device=device, only=args.only)
    for o in result.outcomes:
        print(f"{o.status:>6}  {o.name}  {o.seconds:.1f}s" + (f"  {o.error}" if o.error else ""))
    if result.headline_failed:
        print(f"failed  headline: {result.headline_failed} (its card in the index says so too)")
    print(f"index: {result.out_dir / 'index.html'}")
    return result.exit_code


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report",
        help="execute the notebooks (papermill) into an HTML report",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--notebooks", type=Path, default=DEFAULT_NOTEBOOKS, help="folder of NN_*.ipynb")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report folder (default: reports/)")
    parser.add_argument(
        "--run",
        type=Path,
        metavar="PATH",
        help="the run every notebook and the index read (relative to data/, or a folder): sets -p "
        + " -p ".join(f"{name}=PATH" for name in RUN_PARAMETERS),
    )
    parser.add_argument("--only", action="append", default=[], metavar="NN", help="run only notebook NN (repeatable)")
    parser.add_argument(
        "-p",
        "--parameter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="papermill parameter for every notebook (repeatable), e.g. -p run_fresh=True",
    )
    parser.set_defaults(func=_cli)
