"""Outputs go to regular files only (a device, a FIFO, a socket or a link is never replaced or written through),
a run's rows are held to their own keys and samples when read back, and a damaged profile run is named wherever
runs are listed (issue 29, item 5 and the two older findings)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from tests.battery import CLEAR, UNCLEAR, WRONG, Result, case, cli_refused, refused, run_cli

OUTPUTS, INTEGRITY, PROFILES = "outputs", "integrity", "profiles"
REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "data" / "h200" / "h200-harness-20261130"
VICTIM = b"precious bytes the output must not touch\n"


# ---------------------------------------------------------------- things that are not a regular file


@contextlib.contextmanager
def _socket_at(path: Path) -> Iterator[None]:
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        yield
    finally:
        server.close()


def _plant(tmp: Path, kind: str) -> tuple[Path, Callable[[], str | None], contextlib.AbstractContextManager]:
    """A path of `kind` under `tmp`, a harm check that it (and what it points to) is still what it was, and a
    context that keeps it alive (a socket needs its server)."""
    path = tmp / f"planted-{kind}"
    target = tmp / "victim.txt"
    target.write_bytes(VICTIM)
    keep: contextlib.AbstractContextManager = contextlib.nullcontext()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to a file":
        path.symlink_to(target)
    elif kind == "link to a folder":
        (tmp / "folder").mkdir()
        path.symlink_to(tmp / "folder")
    elif kind == "dangling link":
        path.symlink_to(tmp / "nowhere")
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":
        keep = _socket_at(path)

    def harm() -> str | None:
        if target.read_bytes() != VICTIM:
            return f"{target} changed"
        if (tmp / "nowhere").exists():
            return "a file was created through a dangling link"
        if kind == "link to a folder" and any((tmp / "folder").iterdir()):
            return "written into the folder a link points to"
        mode = os.lstat(path).st_mode
        kinds = {"fifo": stat.S_ISFIFO, "folder": stat.S_ISDIR, "socket": stat.S_ISSOCK}
        expected = kinds.get(kind, stat.S_ISLNK)
        return None if expected(mode) else f"{path} is no longer a {kind} (replaced)"

    return path, harm, keep


KINDS = ("fifo", "link to a file", "link to a folder", "dangling link", "folder", "socket")


def _two_runs(tmp: Path) -> tuple[Path, Path]:
    from tests.battery.cases_compare import make_run

    medians = {(1, 1): 1.0, (2, 1): 2.0}
    return make_run(tmp / "runs", "a", medians, seed=1), make_run(tmp / "runs", "b", medians, seed=2)


for _kind in KINDS:
    for _flag in ("--csv", "--markdown"):

        def _compare_out(tmp: Path, kind: str = _kind, flag: str = _flag) -> Result:
            a, b = _two_runs(tmp)
            path, harm, keep = _plant(tmp, kind)
            with keep:
                return cli_refused(["compare", str(a), str(b), flag, str(path)], flag, harm=harm)

        case(OUTPUTS, f"compare {_flag} onto a {_kind} is refused by name, nothing replaced")(_compare_out)


@case(OUTPUTS, "compare --csv onto its own regular file replaces it whole (what the user asked for)")
def _(tmp: Path) -> Result:
    a, b = _two_runs(tmp)
    out = tmp / "table.csv"
    out.write_text("old\n")
    done = run_cli(["compare", str(a), str(b), "--csv", str(out)])
    if done.code not in (0, 1) or done.raised is not None:
        return Result(UNCLEAR, f"exit {done.code}: {done.err[-200:]!r}")
    text = out.read_text()
    return Result(CLEAR, "replaced") if text.startswith("backend") or "," in text else Result(WRONG, text[:100])


for _kind in KINDS:

    def _report_out(tmp: Path, kind: str = _kind) -> Result:
        path, harm, keep = _plant(tmp, kind)
        if kind == "folder":  # a folder is what report --out names: not refused
            return Result(CLEAR, "a folder is a report folder")
        with keep:
            return cli_refused(["report", "--only", "00", "--out", str(path)], "out_dir", harm=harm)

    case(OUTPUTS, f"report --out onto a {_kind} is refused before any notebook runs")(_report_out)

    def _bench_out(tmp: Path, kind: str = _kind) -> Result:
        path, harm, keep = _plant(tmp, kind)
        if kind == "folder":
            return Result(CLEAR, "an empty folder is a fresh run folder")
        argv = ["bench", "--backend", "reference", "--batch", "1", "--context", "64", "--next-n", "1",
                "--strategy", "native", "--device", "cpu", "--no-progress", "--out", str(path)]  # fmt: skip
        with keep:
            return cli_refused(argv, "--out", harm=harm)

    case(OUTPUTS, f"bench --out onto a {_kind} is refused before the first point")(_bench_out)

    def _profile_out(tmp: Path, kind: str = _kind) -> Result:
        path, harm, keep = _plant(tmp, kind)
        if kind == "folder":
            return Result(CLEAR, "an empty folder is a fresh run folder")
        argv = ["profile", "--tool", "torch", "--device", "cpu", "--batch", "1", "--context", "64", "--next-n", "1",
                "--no-trace", "--out", str(path)]  # fmt: skip
        with keep:
            return cli_refused(argv, "--out", harm=harm)

    case(OUTPUTS, f"profile --out onto a {_kind} is refused before the first point")(_profile_out)

    def _atomic(tmp: Path, kind: str = _kind) -> Result:
        from dsa_lab.store.writes import write_text_atomic

        path, harm, keep = _plant(tmp, kind)
        with keep:
            return refused(lambda: write_text_atomic(path, "replaced?\n"), str(path), harm=harm)

    case(OUTPUTS, f"the store's atomic write never replaces a {_kind}")(_atomic)


def _run_copy(tmp: Path) -> Path:
    out = tmp / "h200" / SHIPPED.name
    shutil.copytree(SHIPPED, out)
    return out


for _file in ("points.jsonl", "results.parquet", "provenance.json", ".lock"):
    for _kind in ("fifo", "socket"):

        def _in_run(tmp: Path, name: str = _file, kind: str = _kind) -> Result:
            from dsa_lab.store import folders as store

            run = tmp / "run"
            done = run_cli(["bench", "--backend", "reference", "--batch", "1", "--context", "64", "--next-n", "1,2",
                            "--strategy", "native", "--device", "cpu", "--no-progress", "--max-seconds-per-point",
                            "0.01", "--max-points", "1", "--out", str(run)])  # fmt: skip
            if done.code != 0:
                return Result(UNCLEAR, f"the first run failed: {done.err[-200:]!r}")
            (run / name).unlink(missing_ok=True)
            keep = _socket_at(run / name) if kind == "socket" else contextlib.nullcontext()
            if kind == "fifo":
                os.mkfifo(run / name)
            with keep:
                resumed = cli_refused(["bench", "--resume", "--out", str(run), "--no-progress"], name)
                loaded = refused(lambda: store.load_run(run), name)
            still = stat.S_ISFIFO if kind == "fifo" else stat.S_ISSOCK
            if not still(os.lstat(run / name).st_mode):
                return Result(WRONG, f"the {kind} at {name} was replaced")
            return next((r for r in (resumed, loaded) if r.outcome != CLEAR), resumed)

        case(OUTPUTS, f"a {_kind} planted as a run's {_file} is refused by resume and load, never read or replaced")(
            _in_run
        )


# ---------------------------------------------------------------- rows held to their own keys and samples


def _damaged(tmp: Path, change: Callable[[pd.DataFrame], pd.DataFrame]) -> Path:
    run = _run_copy(tmp)
    frame = pd.read_parquet(run / "results.parquet")
    change(frame.copy()).to_parquet(run / "results.parquet", index=False)
    return run


def _timed(frame: pd.DataFrame) -> list[int]:
    return list(frame.index[frame["status"] == "ok"])


def _rotate_keys(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(point_key=np.roll(frame["point_key"].to_numpy(), 1))


def _swap(column: str, rows: Callable[[pd.DataFrame], tuple[int, int]]) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def change(frame: pd.DataFrame) -> pd.DataFrame:
        i, j = rows(frame)
        values = frame[column].to_numpy(copy=True)
        values[[i, j]] = values[[j, i]]
        return frame.assign(**{column: values})

    return change


def _first_two_timed(frame: pd.DataFrame) -> tuple[int, int]:
    timed = _timed(frame)
    return timed[0], timed[-1]


def _timed_and_untimed(frame: pd.DataFrame) -> tuple[int, int]:
    return _timed(frame)[0], int(frame.index[frame["status"] != "ok"][0])


def _set(column: str, value: object) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def change(frame: pd.DataFrame) -> pd.DataFrame:
        frame.loc[_timed(frame)[0], column] = value
        return frame

    return change


def _scale_median(factor: float) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def change(frame: pd.DataFrame) -> pd.DataFrame:
        i = _timed(frame)[0]
        frame.loc[i, ["p25_ms", "median_ms", "p75_ms"]] = frame.loc[i, ["p25_ms", "median_ms", "p75_ms"]] * factor
        return frame

    return change


def _scale_samples(factor: float) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def change(frame: pd.DataFrame) -> pd.DataFrame:
        i = _timed(frame)[0]
        frame.at[i, "samples_ms"] = list(np.asarray(frame.at[i, "samples_ms"]) * factor)
        return frame

    return change


def _other_key(frame: pd.DataFrame) -> pd.DataFrame:
    i = _timed(frame)[0]
    frame.loc[i, "point_key"] = frame.loc[i, "point_key"].replace("batch=", "batch=9")
    return frame


def _extra_axis(frame: pd.DataFrame) -> pd.DataFrame:
    i = _timed(frame)[0]
    frame.loc[i, "point_key"] = frame.loc[i, "point_key"] + "|timed=logits+topk"
    return frame


def _axis_edit(column: str) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def change(frame: pd.DataFrame) -> pd.DataFrame:
        i = _timed(frame)[0]
        others = [v for v in frame[column].unique() if v != frame.at[i, column]]
        frame.at[i, column] = others[0]
        return frame

    return change


REFUSED = {
    "every key moved one row down": _rotate_keys,
    "the keys of two timed rows swapped": _swap("point_key", _first_two_timed),
    "the keys of a timed and an untimed row swapped": _swap("point_key", _timed_and_untimed),
    "a row's backend changed, its key kept": _axis_edit("backend"),
    "a row's next_n changed, its key kept": _axis_edit("next_n"),
    "a row's strategy changed, its key kept": _axis_edit("strategy"),
    "a row's batch changed, its key kept": _axis_edit("batch"),
    "a row's key naming a batch no row has": _other_key,
    "a row's key naming an axis its columns lack": _extra_axis,
    "a timed row's median (and quartiles) scaled by 1.5": _scale_median(1.5),
    "a timed row's median (and quartiles) scaled by 1.001": _scale_median(1.001),
    "a timed row's samples scaled by 2": _scale_samples(2.0),
    "the samples of two timed rows swapped": _swap("samples_ms", _first_two_timed),
    "the medians (and quartiles) of two timed rows swapped": lambda f: _swap("p75_ms", _first_two_timed)(
        _swap("p25_ms", _first_two_timed)(_swap("median_ms", _first_two_timed)(f))
    ),
}
for _label, _change in REFUSED.items():

    def _refused_on_load(tmp: Path, change=_change) -> Result:
        from dsa_lab.store import folders as store

        run = _damaged(tmp, change)
        return refused(lambda: store.load_run(run), "results.parquet", "row")

    case(INTEGRITY, f"load_run refuses a run with {_label}, naming the file and the row")(_refused_on_load)

for _label in ("every key moved one row down", "the medians (and quartiles) of two timed rows swapped"):

    def _compared(tmp: Path, change=REFUSED[_label]) -> Result:
        run = _damaged(tmp, change)
        return cli_refused(["compare", str(SHIPPED), str(run)], "results.parquet")

    case(INTEGRITY, f"compare of a run with {_label} is refused (exit 2), never a table of mismatched points")(
        _compared
    )

LOADS = {
    "a median within rounding (1e-9) of its samples' median": _scale_median(1 + 1e-9),
    "a timed row storing no samples": _set("samples_ms", None),
    "the rows in another order": lambda f: f.iloc[::-1].reset_index(drop=True),
}
for _label, _change in LOADS.items():

    def _loads(tmp: Path, change=_change) -> Result:
        from dsa_lab.store import folders as store

        run = _damaged(tmp, change)
        try:
            store.load_run(run)
        except Exception as err:
            return Result(WRONG, f"a sound run refused: {type(err).__name__}: {str(err)[:200]}")
        return Result(CLEAR, "loads")

    case(INTEGRITY, f"load_run takes a run with {_label}")(_loads)


@case(INTEGRITY, "a log whose lines' keys were moved is refused by resume, naming the line")
def _(tmp: Path) -> Result:
    run = tmp / "run"
    done = run_cli(["bench", "--backend", "reference", "--batch", "1", "--context", "64", "--next-n", "1,2,3",
                    "--strategy", "native", "--device", "cpu", "--no-progress", "--max-seconds-per-point", "0.01",
                    "--max-points", "2", "--out", str(run)])  # fmt: skip
    if done.code != 0:
        return Result(UNCLEAR, f"the first run failed: {done.err[-200:]!r}")
    lines = [json.loads(line) for line in (run / "points.jsonl").read_text().splitlines()]
    lines[0]["point_key"], lines[1]["point_key"] = lines[1]["point_key"], lines[0]["point_key"]
    (run / "points.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run / "results.parquet").unlink()
    return cli_refused(["bench", "--resume", "--out", str(run), "--no-progress"], "points.jsonl", "line 1")


# ---------------------------------------------------------------- damaged profile runs are named


def _profile(tmp: Path, drop: str | None = None, files: tuple[str, ...] = ("torch_kernels.parquet",), **fields) -> Path:
    from dsa_lab.store import folders as store

    folder = tmp / "profiles" / "p"
    folder.mkdir(parents=True)
    provenance = {
        "schema_version": store.SCHEMA_VERSION,
        "run_id": "p",
        "source": "measured",
        "device": "cpu",
        "created": "2026-01-01T00:00:00+00:00",
        "command": [],
        "timing_method": "test",
        "seed": 0,
        "environment": {},
        "git": {},
        "kind": "profile",
        **fields,
    }
    if drop:
        provenance.pop(drop)
    (folder / store.PROVENANCE_FILE).write_text(json.dumps(provenance))
    for name in files:
        (folder / name).write_bytes(b"x")
    return folder


def _named_by_find(tmp: Path, folder: Path) -> Result:
    from dsa_lab.profiling import find_profile_runs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = find_profile_runs(tmp / "profiles")
    if found:
        return Result(WRONG, f"a damaged run listed as a run: {found}")
    said = [str(w.message) for w in caught if str(folder) in str(w.message)]
    return Result(CLEAR, said[0][:200]) if said else Result(WRONG, "passed over in silence")


PROFILE_DAMAGE = {
    "lacking created": {"drop": "created"},
    "lacking kind, holding tables": {"drop": "kind"},
    "lacking kind, holding only a Chrome trace": {"drop": "kind", "files": ("trace_reference.json.gz",)},
    "lacking kind, holding only an Nsight Compute report": {"drop": "kind", "files": ("ncu_reference.ncu-rep",)},
    "lacking kind, holding only ncu's raw output": {"drop": "kind", "files": ("ncu_raw.txt.gz",)},
    "of kind 'timing', holding tables": {"kind": "timing"},
    "with created not a time": {"created": "yesterday"},
    "with a run id holding markup": {"run_id": "<b>p</b>"},
}
for _label, _how in PROFILE_DAMAGE.items():
    case(PROFILES, f"find_profile_runs names a profile run {_label}")(
        lambda tmp, how=_how: _named_by_find(tmp, _profile(tmp, **how))
    )


@case(PROFILES, "find_profile_runs names a profile folder whose provenance is not JSON")
def _(tmp: Path) -> Result:
    folder = _profile(tmp)
    (folder / "provenance.json").write_text("{not json")
    return _named_by_find(tmp, folder)


@case(PROFILES, "find_profile_runs names a profile folder whose provenance is a FIFO, without blocking")
def _(tmp: Path) -> Result:
    folder = _profile(tmp)
    (folder / "provenance.json").unlink()
    os.mkfifo(folder / "provenance.json")
    return _named_by_find(tmp, folder)


@case(PROFILES, "a sound profile run is listed, with no warning")
def _(tmp: Path) -> Result:
    from dsa_lab.profiling import find_profile_runs

    folder = _profile(tmp)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = find_profile_runs(tmp / "profiles")
    if found != [folder] or caught:
        return Result(WRONG, f"found {found}, warned {[str(w.message) for w in caught]}")
    return Result(CLEAR, "listed")


# ---------------------------------------------------------------- report --run: the run every notebook reads

RUN_PATHS = "run-paths"


def _run_flag(tmp: Path, run: Path, *names: str) -> Result:
    """report --run must refuse before any notebook runs: one line naming --run (a notebook run would take minutes)."""
    return cli_refused(["report", "--only", "00", "--out", str(tmp / "out"), "--run", str(run)], "--run", *names)


@case(RUN_PATHS, "report --run through a loop of links is named, not taken as absent")
def _(tmp: Path) -> Result:
    (tmp / "a").symlink_to(tmp / "b")
    (tmp / "b").symlink_to(tmp / "a")
    return _run_flag(tmp, tmp / "a")


@case(RUN_PATHS, "report --run naming a file is refused")
def _(tmp: Path) -> Result:
    return _run_flag(tmp, SHIPPED / "results.parquet", "not a run folder")


@case(RUN_PATHS, "report --run naming a FIFO is refused without blocking")
def _(tmp: Path) -> Result:
    os.mkfifo(tmp / "fifo")
    return _run_flag(tmp, tmp / "fifo", "not a run folder")


@case(RUN_PATHS, "report --run naming nothing is refused")
def _(tmp: Path) -> Result:
    return _run_flag(tmp, tmp / "gone", "no run there")


@case(RUN_PATHS, "report --run naming an empty folder is refused, naming its provenance")
def _(tmp: Path) -> Result:
    (tmp / "empty").mkdir()
    return _run_flag(tmp, tmp / "empty", "provenance")


for _label in ("every key moved one row down", "a timed row's samples scaled by 2"):

    def _damaged_run_flag(tmp: Path, change=REFUSED[_label]) -> Result:
        return _run_flag(tmp, _damaged(tmp, change), "results.parquet")

    case(RUN_PATHS, f"report --run naming a run with {_label} is refused before any notebook runs")(_damaged_run_flag)


@case(RUN_PATHS, "report --run naming a run folder that is a link is refused")
def _(tmp: Path) -> Result:
    (tmp / "link").symlink_to(_run_copy(tmp))
    return _run_flag(tmp, tmp / "link", "symbolic link")


@case(RUN_PATHS, "report --run naming a run that holds a FIFO is refused without blocking")
def _(tmp: Path) -> Result:
    run = _run_copy(tmp)
    (run / "points.jsonl").unlink(missing_ok=True)
    os.mkfifo(run / "points.jsonl")
    return _run_flag(tmp, run, "FIFO")
