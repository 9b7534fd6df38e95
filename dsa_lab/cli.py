"""`dsa-lab`: one command, sub-commands contributed by the modules that own them.

Each module in `COMMAND_MODULES` defines `register_cli(subparsers)`, adding its
sub-command(s) with `set_defaults(func=...)`; `func(args) -> int` is the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = (
    "dsa_lab.env_info",
    "dsa_lab.policy",
    "dsa_lab.bench.cli",
    "dsa_lab.store",
    "dsa_lab.profile",
    "dsa_lab.report",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsa-lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, RuntimeError) as err:  # bad input or unavailable backend: one clear line
        print(f"dsa-lab {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
