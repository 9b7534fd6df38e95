"""The run store: loads that must validate what they read (the types and schemas of results and provenance)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tests.battery import Result, case, refused
from tests.battery.store_support import AREA, _set_provenance, _set_results, partial_run

# ---------------------------------------------------------------- loads validate types and schemas


def _tiny(tmp: Path) -> Path:
    return partial_run(tmp)


def _load_refuses(tmp: Path, change, *names: str) -> Result:
    from dsa_lab.store import folders as store

    out = _tiny(tmp)
    change(out)
    return refused(lambda: store.load_run(out), *names, types=(store.RunFormatError,))


LOADS = {
    "median_ms as numeric strings": (lambda f: f.assign(median_ms=f["median_ms"].map(str)), "median_ms"),
    "p25_ms as strings": (lambda f: f.assign(p25_ms=f["p25_ms"].map(str)), "p25_ms"),
    "next_n NaN": (lambda f: f.assign(next_n=float("nan")), "next_n"),
    "next_n 1.5": (lambda f: f.assign(next_n=1.5), "next_n"),
    "next_n 0": (lambda f: f.assign(next_n=0), "next_n"),
    "next_n 99": (lambda f: f.assign(next_n=99), "next_n"),
    "batch as strings": (lambda f: f.assign(batch="2"), "batch"),
    "batch 0": (lambda f: f.assign(batch=0), "batch"),
    "batch negative": (lambda f: f.assign(batch=-3), "batch"),
    "heads 64.0": (lambda f: f.assign(heads=64.0), "heads"),
    "head_dim as strings": (lambda f: f.assign(head_dim="128"), "head_dim"),
    "context as ints": (lambda f: f.assign(context=64), "context"),
    "context garbage": (lambda f: f.assign(context="long"), "context"),
    "strategy unknown": (lambda f: f.assign(strategy="diagonal"), "strategy"),
    "cache_dtype unknown": (lambda f: f.assign(cache_dtype="int8"), "cache_dtype"),
    "backend with markup": (lambda f: f.assign(backend="<img src=x onerror=alert(1)>"), "backend"),
    "backend empty": (lambda f: f.assign(backend=""), "backend"),
    "status None": (lambda f: f.assign(status=None), "status"),
    "message a number": (lambda f: f.assign(message=5), "message"),
    "only the minimal columns": (
        lambda f: f[list(__import__("dsa_lab.store.folders").store.folders.RESULT_COLUMNS)],
        "kernel_rows",
    ),
    "samples negative": (
        lambda f: f.assign(samples_ms=f["samples_ms"].map(lambda s: [-abs(x) for x in s])),
        "samples_ms",
    ),
    "samples NaN": (
        lambda f: f.assign(samples_ms=f["samples_ms"].map(lambda s: [float("nan")] * len(s))),
        "samples_ms",
    ),
    "samples strings": (
        lambda f: f.assign(samples_ms=f["samples_ms"].map(lambda s: [str(x) for x in s])),
        "samples_ms",
    ),
    "samples a number": (lambda f: f.assign(samples_ms=1.0), "samples_ms"),
    "median inf": (lambda f: f.assign(median_ms=float("inf"), p75_ms=float("inf")), "median_ms"),
    "point_key duplicated": (lambda f: pd.concat([f, f]), "point_key"),
}
for _label, (_change, _name) in LOADS.items():
    case(AREA, f"load_run: {_label}")(
        lambda tmp, c=_change, n=_name: _load_refuses(tmp, lambda out: _set_results(out, c), "results.parquet", n)
    )

PROVENANCES = {
    "git a string": (lambda p: p.update(git="abc"), "git"),
    "environment a list": (lambda p: p.update(environment=[1]), "environment"),
    "created not a time": (lambda p: p.update(created="yesterday"), "created"),
    "run_id with markup": (lambda p: p.update(run_id="<script>alert(1)</script>"), "run_id"),
    "seed a string": (lambda p: p.update(seed="zero"), "seed"),
    "timing_method a number": (lambda p: p.update(timing_method=3), "timing_method"),
    "device a list": (lambda p: p.update(device=["cpu"]), "device"),
    "device_name a number": (lambda p: p.update(device_name=7), "device_name"),
}
for _label, (_change, _name) in PROVENANCES.items():
    case(AREA, f"read provenance: {_label}")(
        lambda tmp, c=_change, n=_name: _load_refuses(tmp, lambda out: _set_provenance(out, c), "provenance.json", n)
    )


@case(AREA, "a results file with a column no group declares is refused, naming it")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    out = partial_run(tmp)
    _set_results(out, lambda f: f.assign(my_notes=[{"a": 1}] * len(f)))
    return refused(lambda: store.load_run(out), "results.parquet", "my_notes", types=(store.RunFormatError,))


@case(AREA, "read provenance: a NaN seed")
def _(tmp: Path) -> Result:
    from dsa_lab.store import folders as store

    out = partial_run(tmp)
    path = out / "provenance.json"
    path.write_text(path.read_text().replace('"seed": 0', '"seed": NaN'))
    return refused(lambda: store.load_run(out), "provenance.json", "seed", types=(store.RunFormatError,))
