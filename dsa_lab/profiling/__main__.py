"""`python -m dsa_lab.profiling`: the process Nsight Compute profiles (`--ncu-target ...`), else `dsa-lab profile`."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """`--ncu-target ...`: the process ncu profiles; anything else: `dsa-lab profile ...`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--ncu-target" in args:
        from dsa_lab.profiling.target import target_main

        return target_main(args)
    from dsa_lab.cli import main as cli_main

    return cli_main(["profile", *args])


if __name__ == "__main__":
    raise SystemExit(main())
