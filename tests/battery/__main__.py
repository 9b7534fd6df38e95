"""`python -m tests.battery [--area A,B] [--show wrong,unclear] [--json PATH]`: run the battery, print counts."""

from __future__ import annotations

import argparse
import json
import sys
import time

from tests.battery import counts as count_outcomes
from tests.battery import format_counts, load_cases, run_case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.battery", description=__doc__)
    parser.add_argument("--area", default="", help="only these areas (comma-separated)")
    parser.add_argument("--show", default="wrong,unclear", help="list the cases with these outcomes")
    parser.add_argument("--json", default=None, help="write every case's outcome to this JSON file")
    args = parser.parse_args(argv)
    areas = {a for a in args.area.split(",") if a}
    cases = [c for c in load_cases() if not areas or c.area in areas]
    results = []
    for item in cases:
        started = time.perf_counter()
        result = run_case(item)
        seconds = time.perf_counter() - started
        results.append((item, result, seconds))
        if result.outcome in args.show.split(","):
            print(f"[{result.outcome}] {item.area}: {item.name} ({seconds:.1f} s): {result.detail}", file=sys.stderr)
    print(format_counts(count_outcomes([(c, r) for c, r, _ in results])))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                [
                    {"area": c.area, "name": c.name, "outcome": r.outcome, "detail": r.detail, "seconds": s}
                    for c, r, s in results
                ],
                handle,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
