"""The run store: DSA_LAB_DATA (a folder that is missing or a file, damaged runs passed over by name) and
profile discovery."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from tests.battery import CLEAR, UNCLEAR, WRONG, Result, case, environment, refused
from tests.battery.store_support import AREA, _set_provenance, _set_results, partial_run

# ---------------------------------------------------------------- DSA_LAB_DATA


def _latency(tmp: Path) -> object:
    from dsa_lab.notebook.sections import latency_run

    return latency_run()


for _label, _value, _names in (
    ("a folder that does not exist", "{tmp}/nowhere", ("DSA_LAB_DATA", "nowhere")),
    ("a file", "{tmp}/afile", ("DSA_LAB_DATA", "afile")),
):

    def _data_env(tmp: Path, value: str = _value, names=_names) -> Result:
        (tmp / "afile").write_text("x")
        with environment(DSA_LAB_DATA=value.format(tmp=tmp)):
            return refused(lambda: _latency(tmp), *names)

    case(AREA, f"DSA_LAB_DATA is {_label}")(_data_env)


def _data_with(tmp: Path, damage) -> Path:
    """A data folder holding one measured h200 study run (a copy of a tiny CPU run relabelled as H200 study data,
    not scratch: run discovery passes scratch and other GPUs' runs over), damaged by `damage`."""
    data = tmp / "data"
    out = partial_run(tmp, "seed")
    run = data / "h200" / "h200-damaged"
    run.mkdir(parents=True)
    for name in ("provenance.json", "results.parquet", "points.jsonl"):
        (run / name).write_bytes((out / name).read_bytes())
    _set_provenance(run, lambda p: p.update(scratch=False, device="cuda", device_name="NVIDIA H200"))
    damage(run)
    return data


def _ignored_names(tmp: Path, damage, *names: str) -> Result:
    """A notebook's run discovery (`notebook.runs.search`, what `latency_run` asks before falling back to a CPU
    stand-in) with a damaged run in the data folder: it is passed over, named, with why; a run it
    does choose is announced."""
    from dsa_lab.notebook import display as notebook
    from dsa_lab.notebook.runs import chosen as as_chosen
    from dsa_lab.notebook.runs import passed, search

    data = _data_with(tmp, damage)
    with environment(DSA_LAB_DATA=str(data)):
        try:
            found = search("h200")
            ignored = passed(found)
            chosen = as_chosen(found.run, ignored) if found.run is not None else None
            if chosen is not None:
                real = notebook.display
                notebook.display = lambda *objs, **kw: None
                try:
                    notebook.announce(chosen, "battery")
                finally:
                    notebook.display = real
        except Exception as err:
            from tests.battery import judge_error

            return judge_error(err, names, (ValueError,))
    if chosen is not None:
        return Result(WRONG, "the damaged run was shown as the measurement")
    text = " ".join(str(problem) for _, problem in ignored)
    missing = [n for n in names if n not in text]
    return Result(UNCLEAR, f"ignored without naming {missing}: {text[:300]}") if missing else Result(CLEAR, text[:200])


DAMAGES = {
    "truncated results": (lambda r: (r / "results.parquet").write_bytes(b"PAR1"), ("results.parquet",)),
    "git recorded as a string": (lambda r: _set_provenance(r, lambda p: p.update(git="abc")), ("git",)),
    "environment as a list": (lambda r: _set_provenance(r, lambda p: p.update(environment=[1])), ("environment",)),
    "created not a time": (lambda r: _set_provenance(r, lambda p: p.update(created="yesterday")), ("created",)),
    "timing_method a number": (lambda r: _set_provenance(r, lambda p: p.update(timing_method=3)), ("timing_method",)),
    "times stored as strings": (
        lambda r: _set_results(r, lambda f: f.assign(median_ms=f["median_ms"].map(str))),
        ("median_ms",),
    ),
    "next_n NaN": (lambda r: _set_results(r, lambda f: f.assign(next_n=float("nan"))), ("next_n",)),
    "only the minimal columns": (
        lambda r: _set_results(r, lambda f: f[list(__import__("dsa_lab.store.folders").store.folders.RESULT_COLUMNS)]),
        ("columns",),
    ),
}
for _label, (_damage, _names) in DAMAGES.items():
    case(AREA, f"DSA_LAB_DATA holds a run with {_label}: passed over by name", timeout_s=90)(
        lambda tmp, d=_damage, n=_names: _ignored_names(tmp, d, "h200-damaged", *n)
    )


# ---------------------------------------------------------------- profile discovery


def _profile_folder(tmp: Path, drop: str | None) -> Path:
    from dsa_lab.store import folders as store

    root = tmp / "profiles"
    folder = root / "p1"
    folder.mkdir(parents=True)
    provenance = {
        "schema_version": store.SCHEMA_VERSION,
        "run_id": "p1",
        "source": "measured",
        "device": "cpu",
        "created": "2026-01-01T00:00:00+00:00",
        "command": [],
        "timing_method": "t",
        "seed": 0,
        "environment": {},
        "git": {},
        "kind": "profile",
    }
    if drop:
        provenance.pop(drop)
    (folder / "provenance.json").write_text(json.dumps(provenance))
    pd.DataFrame({"x": [1]}).to_parquet(folder / "torch_kernels.parquet")
    return root


for _drop in ("created", "kind", "run_id", "source"):

    def _profile(tmp: Path, drop: str = _drop) -> Result:
        from dsa_lab.profiling.runs import scan_profile_runs

        scan = scan_profile_runs(_profile_folder(tmp, drop))
        if scan.runs:
            return Result(CLEAR, "kept")
        text = " ".join(problem for _, problem in scan.ignored)
        if not scan.ignored:
            return Result(WRONG, "skipped silently")
        return Result(CLEAR, text[:200]) if drop in text else Result(UNCLEAR, f"ignored, not naming {drop}: {text}")

    case(AREA, f"profile discovery: a profile run whose provenance lacks {_drop!r}")(_profile)


@case(AREA, "profile discovery: a profile run whose configs is a string is passed over by name")
def _(tmp: Path) -> Result:
    from dsa_lab.profiling.runs import shipped_or_cpu_reference

    root = _profile_folder(tmp, None)
    path = root / "p1" / "provenance.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "configs": "x"}))
    run = shipped_or_cpu_reference(root, batch=1, context=64, next_ns=(1,))
    text = " ".join(p for _, p in run.ignored)
    return Result(CLEAR, text[:200]) if "configs" in text else Result(WRONG, f"not reported: {run.ignored}")


@case(AREA, "DSA_LAB_DATA holds a run whose provenance.json is a link: passed over by name")
def _(tmp: Path) -> Result:
    def link(run: Path) -> None:
        target = tmp / "elsewhere.json"
        target.write_bytes((run / "provenance.json").read_bytes())
        (run / "provenance.json").unlink()
        (run / "provenance.json").symlink_to(target)

    return _ignored_names(tmp, link, "h200-damaged", "symbolic link")
