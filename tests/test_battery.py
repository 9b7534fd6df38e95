"""The adversarial battery of tests/battery (issue 20): no silently wrong result and at most 5 % unclear errors.

The battery's cases run in chunks of each area (`python -m tests.battery` runs them all and prints
the counts by area); a failure lists every case that was wrong or unclear, with what happened.
"""

from __future__ import annotations

import pytest

from tests.battery import UNCLEAR, WRONG, load_cases, run_case

CASES = load_cases()
CHUNK = 25  # cases a test: each stays well under a minute


def _chunks() -> list:
    areas = list(dict.fromkeys(case.area for case in CASES))
    params = []
    for area in areas:
        count = sum(case.area == area for case in CASES)
        params += [pytest.param(area, start, id=f"{area}-{start // CHUNK}") for start in range(0, count, CHUNK)]
    return params


@pytest.mark.parametrize("area, start", _chunks())
def test_the_battery_finds_nothing_silently_wrong(area: str, start: int) -> None:
    chosen = [case for case in CASES if case.area == area][start : start + CHUNK]
    results = [(case, run_case(case)) for case in chosen]
    shown = lambda outcome: [f"{c.name}: {r.detail}" for c, r in results if r.outcome == outcome]  # noqa: E731
    assert not shown(WRONG), "silently wrong or harmful:\n" + "\n".join(shown(WRONG))
    assert len(shown(UNCLEAR)) <= 0.05 * len(chosen), "unclear:\n" + "\n".join(shown(UNCLEAR))
