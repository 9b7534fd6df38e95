"""The newest-run search and the one answer (issues 28 and 29): one function orders runs by `created` read as a
time, stays within the GPU a page is about, names every run it passed over and why, on every page that uses it;
the one answer takes each point from the newest run that covers it and never mixes GPUs; CPU runs get no
compare verdicts. A case is `wrong` when a search silently takes the wrong run or drops what it passed over."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from tests.battery import CLEAR, WRONG, Result, case, environment, run_cli

AREA = "newest"
REPO = Path(__file__).resolve().parents[2]
SMALL = "h200/h200-harness-20261130"  # the smallest shipped run (DeepGEMM and Triton)
GLUON = "h200/h200-gluon-20261130"  # a shipped run with Gluon
LIVE = re.compile(r"<\s*(script|img|iframe|svg)\b|<[^<>]*\son\w+\s*=", re.IGNORECASE)
HOSTILE = "<img src=x onerror=alert(1)>"
TIMES = ("median_ms", "p25_ms", "p75_ms", "iqr_ms")


def _copy(data: Path, shipped: str, name: str, **provenance: object) -> Path:
    """A shipped run copied to data/h200/<name>, its provenance changed."""
    folder = data / "h200" / name
    shutil.copytree(REPO / "data" / shipped, folder)
    path = folder / "provenance.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "run_id": name, **provenance}))
    return folder


def _newest(data: Path, covering: object = None) -> object:
    from dsa_lab.store.listing import newest

    return newest(data, "h200", covering)


def _judge(found: object, wanted: str, passed: dict[str, str]) -> Result:
    """`found` must be `wanted`, and name every run of `passed` (name: a word its reason holds)."""
    got = found.run.provenance["run_id"] if found.run is not None else None
    if got != wanted:
        return Result(WRONG, f"took {got!r}, not {wanted!r}")
    said = {p.path.split("/")[-1]: p.why for p in found.passed_over}
    silent = [name for name, word in passed.items() if word not in said.get(name, "")]
    if silent:
        return Result(WRONG, f"passed over {silent} without saying why: {said}")
    return Result(CLEAR, f"{wanted}; passed over {said}"[:200])


for _label, _east, _west, _wanted in (
    ("two UTC offsets (the later text is the earlier moment)", "2026-12-02T01:00:00+05:00", "2026-12-01T21:00:00+00:00", "west"),
    ("a negative offset (the earlier text is the later moment)", "2026-12-01T20:00:00+00:00", "2026-12-01T19:00:00-03:00", "west"),
    ("no offset, read as UTC", "2026-12-01T20:30:00", "2026-12-01T21:00:00+00:00", "west"),
    ("the same moment written twice: the first listed", "2026-12-01T21:00:00+00:00", "2026-12-01T22:00:00+01:00", "east"),
):  # fmt: skip

    def _offsets(tmp: Path, east: str = _east, west: str = _west, wanted: str = _wanted) -> Result:
        data = tmp / "data"
        _copy(data, SMALL, "east", created=east)
        _copy(data, SMALL, "west", created=west)
        return _judge(_newest(data), wanted, {})

    case(AREA, f"created compared as a time: {_label}")(_offsets)


@case(AREA, "a created that is not a time: listed with its problem, the other run taken")
def _(tmp: Path) -> Result:
    data = tmp / "data"
    _copy(data, SMALL, "good", created="2026-12-01T00:00:00+00:00")
    _copy(data, SMALL, "bad", created="yesterday")
    return _judge(_newest(data), "good", {"bad": "created"})


@case(AREA, "a newer run that lacks the section: passed over with what it lacks")
def _(tmp: Path) -> Result:
    from dsa_lab.notebook.sections import Section

    data = tmp / "data"
    _copy(data, GLUON, "with-gluon", created="2026-12-01T00:00:00+00:00")
    _copy(data, SMALL, "without-gluon", created="2026-12-02T00:00:00+00:00")
    return _judge(_newest(data, Section("gluon", {"backend": ("gluon",)})), "with-gluon", {"without-gluon": "lacks"})


@case(AREA, "an H100 run filed under data/h200/: never stands for an H200 run, said")
def _(tmp: Path) -> Result:
    data = tmp / "data"
    _copy(data, SMALL, "h200-run", created="2026-12-01T00:00:00+00:00")
    _copy(data, SMALL, "h100-run", created="2026-12-02T00:00:00+00:00", device_name="NVIDIA H100 80GB HBM3")
    return _judge(_newest(data), "h200-run", {"h100-run": "H100"})


@case(AREA, "a newer scratch run: never chosen unnamed, said")
def _(tmp: Path) -> Result:
    data = tmp / "data"
    _copy(data, SMALL, "study", created="2026-12-01T00:00:00+00:00")
    _copy(data, SMALL, "try-out", created="2026-12-02T00:00:00+00:00", scratch=True)
    return _judge(_newest(data), "study", {"try-out": "scratch"})


@case(AREA, "a modeled run among measured ones: never chosen as a measurement, said")
def _(tmp: Path) -> Result:
    data = tmp / "data"
    _copy(data, SMALL, "measured", created="2026-12-01T00:00:00+00:00")
    modeled = _copy(data, SMALL, "modeled", created="2026-12-02T00:00:00+00:00", source="modeled")
    frame = pd.read_parquet(modeled / "results.parquet").assign(source="modeled")
    frame.to_parquet(modeled / "results.parquet", index=False)
    return _judge(_newest(data), "measured", {"modeled": "modeled"})


def _torn_newer(tmp: Path) -> Path:
    """The shipped serving run and a newer copy of it whose results are torn."""
    data = tmp / "data"
    shutil.copytree(REPO / "data" / "h200" / "h200-serving-20261201", data / "h200" / "h200-serving-20261201")
    torn = _copy(data, "h200/h200-serving-20261201", "torn-20261202", created="2026-12-02T00:00:00+00:00")
    results = torn / "results.parquet"
    results.write_bytes(results.read_bytes()[:400])
    return data


for _card in ("headline", "serving answers"):

    def _card_names(tmp: Path, card: str = _card) -> Result:
        from dsa_lab.report import page

        with environment(DSA_LAB_DATA=str(_torn_newer(tmp))):
            html = page.headline_findings("", 128, "65536").reading_html if card == "headline" else ""
            html = html or page.serving_answers("", 128).html
        if "torn-20261202" not in html or "results.parquet" not in html:
            return Result(WRONG, f"the {card} card skips the torn newer run in silence")
        return Result(CLEAR, "named, with the file")

    case(AREA, f"the index's {_card} card names a torn newer run it passed over", timeout_s=90)(_card_names)


@case(AREA, "a passed-over run whose problem carries markup stays text on the index", timeout_s=90)
def _(tmp: Path) -> Result:
    from dsa_lab.report import page

    data = tmp / "data"
    shutil.copytree(REPO / "data" / SMALL, data / SMALL)
    _copy(data, SMALL, "hostile", created=HOSTILE)
    with environment(DSA_LAB_DATA=str(data)):
        pages = [page.headline_findings("", 128, "65536").reading_html, page.serving_answers("", 128).html]
    found = [p for p in pages if LIVE.search(p)]
    return Result(WRONG, f"live markup: {found[0][:200]!r}") if found else Result(CLEAR, "escaped")


@case(AREA, "a run named by run_path that lacks the section: a banner names it and what is shown", timeout_s=60)
def _(tmp: Path) -> Result:
    from dsa_lab.notebook.sections import SERVING

    data = tmp / "data"
    shutil.copytree(REPO / "data" / "h200" / "h200-serving-20261201", data / "h200" / "h200-serving-20261201")
    _copy(data, SMALL, "mine", created="2026-12-02T00:00:00+00:00")
    with environment(DSA_LAB_DATA=str(data)):
        chosen, note = SERVING.run("h200/mine")
    if chosen is None or chosen.missing != note or "h200/mine" not in note or "h200-serving" not in note:
        return Result(WRONG, f"no banner naming both runs: {note!r}")
    return Result(CLEAR, note[:200])


@case(AREA, "the one answer: two runs cover a point, the newer one's number is shown, named")
def _(tmp: Path) -> Result:
    from dsa_lab.analysis import answers
    from dsa_lab.store import folders as store

    results = store.load_run(REPO / "data" / SMALL).results
    slower = results.assign(**{c: results[c] * 2 for c in TIMES})
    table = answers.fastest(
        [answers.RunFrame("newer", "NVIDIA H200", slower), answers.RunFrame("older", "NVIDIA H200", results)]
    )
    rows = answers.headline(table, 128, "65536")
    if rows.empty or set(rows["run_id"]) != {"newer"}:
        return Result(WRONG, f"the headline mixes or skips the newer run: {sorted(set(rows['run_id']))}")
    return Result(CLEAR, f"{len(rows)} next_n, all from the newer run")


@case(AREA, "the one answer never lets an H100 run answer for an H200 point")
def _(tmp: Path) -> Result:
    from dsa_lab.analysis import answers
    from dsa_lab.store import folders as store

    results = store.load_run(REPO / "data" / SMALL).results
    table = answers.fastest(
        [answers.RunFrame("h100", "NVIDIA H100", results), answers.RunFrame("h200", "NVIDIA H200", results)]
    )
    h200 = table[table["device"] == "NVIDIA H200"]
    if set(h200["run_id"]) != {"h200"} or len(h200) != len(table) / 2:
        return Result(WRONG, f"an H200 point answered by {sorted(set(h200['run_id']))}")
    return Result(CLEAR, "each GPU answers its own points")


@case(AREA, "dsa-lab runs: no machine path and no 'None' in the listing")
def _(tmp: Path) -> Result:
    data = tmp / "data"
    _copy(data, SMALL, "listed", created="2026-12-01T00:00:00+00:00")
    run = run_cli(["runs", "--root", str(data)])
    if run.code != 0 or str(tmp) in run.out or " None" in run.out:
        return Result(WRONG, f"exit {run.code}: {run.out[-300:]!r}")
    return Result(CLEAR, run.out.splitlines()[1][:120])


@case(AREA, "two CPU runs 1.68x apart (drift, the same code): compare exits 0, no verdict", timeout_s=90)
def _(tmp: Path) -> Result:
    runs = []
    for name, factor in (("cpu-a", 1.0), ("cpu-b", 1.68)):
        folder = _copy(tmp / "data", SMALL, name, device="cpu", device_name="cpu")
        frame = pd.read_parquet(folder / "results.parquet")
        for column in TIMES:
            frame[column] = frame[column] * factor
        frame["samples_ms"] = frame["samples_ms"].map(lambda s, f=factor: None if s is None else np.asarray(s) * f)
        frame.to_parquet(folder / "results.parquet", index=False)
        runs.append(str(folder))
    run = run_cli(["compare", *runs, "--top", "0"])
    if run.code != 0 or "CPU: no verdicts" not in run.out:
        return Result(WRONG, f"exit {run.code}: {(run.out + run.err)[-300:]!r}")
    return Result(CLEAR, "exit 0, CPU: no verdicts")
