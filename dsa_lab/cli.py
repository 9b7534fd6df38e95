"""`dsa-lab`: one command, sub-commands contributed by the modules that own them.

Each module in `COMMAND_MODULES` defines `register_cli(subparsers)`, adding its
sub-command(s) with `set_defaults(func=...)`; `func(args) -> int` is the exit code.
A module whose dependencies are missing here (say papermill on a bare GPU box) does
not take the others down: its commands stay listed and say what to install.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "dsa_lab.env_info": ("env",),
    "dsa_lab.policy": ("policy",),
    "dsa_lab.bench.cli": ("bench",),
    "dsa_lab.store": ("compare", "runs"),
    "dsa_lab.profile": ("profile",),
    "dsa_lab.report": ("report",),
}


def _register_unavailable(sub: argparse._SubParsersAction, command: str, missing: str) -> None:
    def refuse(args: argparse.Namespace) -> int:
        raise RuntimeError(f"needs the Python package {missing!r}, which is not installed here (pip install {missing})")

    parser = sub.add_parser(command, help=f"unavailable here: needs {missing}")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(func=refuse)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsa-lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, commands in COMMAND_MODULES.items():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name is None or err.name.split(".")[0] == "dsa_lab":
                raise
            for command in commands:
                _register_unavailable(sub, command, err.name.split(".")[0])
            continue
        module.register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, RuntimeError, OSError) as err:  # bad input, unavailable backend, a file: one clear line
        print(f"dsa-lab {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
