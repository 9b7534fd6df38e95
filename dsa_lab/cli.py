"""`dsa-lab`: one command, sub-commands contributed by the modules that own them, imported lazily.

`COMMANDS` maps each sub-command to the module that defines it (with `register_cli(sub)`,
adding its parser with `set_defaults(func=...)`; `func(args) -> int` is the exit code) and
a one-line help. Only the module of the command being run is imported, so `dsa-lab --help`
and `--version` import no torch (well under a second). A module whose dependencies are
missing here (papermill on a bare GPU box) does not take the others down: its command
says what to install. Adding a command is one line in `COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

COMMANDS: dict[str, tuple[str, str]] = {  # command -> (module with register_cli, help)
    "env": ("dsa_lab.env_info", "versions, GPU, policy platform and which kernel backends run here"),
    "policy": ("dsa_lab.policy.cli", "which vLLM version flattens the indexer decode batch, where"),
    "bench": ("dsa_lab.bench.cli", "check and time a grid of decode points into a run folder (resumable)"),
    "profile": (
        "dsa_lab.profiling.cli",
        "profile a grid of decode points: torch.profiler tables, Nsight Compute counters",
    ),
    "compare": ("dsa_lab.analysis.compare", "compare two runs point by point; exit 1 on a regression"),
    "runs": ("dsa_lab.store.listing", "list the runs stored under a data folder"),
    "model": ("dsa_lab.model.cli", "modeled time of indexer decode steps on a GPU (calibrated on the H200)"),
    "report": ("dsa_lab.report.cli", "execute the notebooks (papermill) into an HTML report"),
}
INTERRUPTED = 130  # the shell's code for a process ended by Ctrl-C


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dsa_lab")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _register_unavailable(sub: argparse._SubParsersAction, command: str, missing: str) -> None:
    def refuse(args: argparse.Namespace) -> int:
        raise RuntimeError(f"needs the Python package {missing!r}, which is not installed here (pip install {missing})")

    parser = sub.add_parser(command, help=f"unavailable here: needs {missing}")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(func=refuse)


def _chosen(argv: list[str]) -> str | None:
    """The sub-command argv names (its first word that is not an option), if any."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser with the full definition of the command `argv` runs, and a help line for every other."""
    parser = argparse.ArgumentParser(prog="dsa-lab", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dsa-lab {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = _chosen(list(sys.argv[1:] if argv is None else argv))
    if chosen in COMMANDS:
        module_name = COMMANDS[chosen][0]
        try:
            importlib.import_module(module_name).register_cli(sub)
        except ModuleNotFoundError as err:
            if err.name is None or err.name.split(".")[0] == "dsa_lab":
                raise
            _register_unavailable(sub, chosen, err.name.split(".")[0])
    for command, (_, help_text) in COMMANDS.items():
        if command not in sub.choices:
            sub.add_parser(command, help=help_text, add_help=False)
    return parser


def _interrupt_on_sigterm() -> None:
    """SIGTERM (a job scheduler, `timeout`) stops a command as Ctrl-C does: cleanly, recorded."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    _interrupt_on_sigterm()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"dsa-lab {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except OSError as err:  # exists, read-only, no space, permission: one line naming the path
        print(f"dsa-lab {args.command}: error: {_os_error(err)}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as err:  # bad input, unavailable backend, a locked run: one clear line
        print(f"dsa-lab {args.command}: error: {err}", file=sys.stderr)
        return 2


def _os_error(err: OSError) -> str:
    """'<path>: <reason>' for an OSError that carries its path, else its own message."""
    if err.filename is not None and err.strerror:
        other = f" -> {err.filename2}" if err.filename2 is not None else ""
        return f"{err.filename}{other}: {err.strerror}"
    return str(err).replace("\n", " ")


if __name__ == "__main__":
    raise SystemExit(main())
