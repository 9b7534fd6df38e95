"""Every notebook's parameters are single-line, typed assignments that papermill lists with their types
(`papermill --help-notebook NB`, here through its inspection API), each default of its declared type."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import nbformat
import papermill
import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TYPES = {"str": str, "int": int, "bool": bool, "list[str]": list, "list[int]": list}

# name -> type per notebook: what a user can pass with -p (`dsa-lab report -p`, papermill -p).
EXPECTED = {
    "00": {"device": "str", "interactive": "bool", "run_device": "str", "run_path": "str", "batch": "int",
           "context": "str", "diagram_next_n": "int", "diagram_tiles": "int"},
    "01": {"device": "str", "seed": "int", "interactive": "bool"},
    "02": {"device": "str", "seed": "int", "run_device": "str", "run_path": "str", "serving_run_path": "str",
           "repeat_path": "str",
           "run_fresh": "bool", "fresh_preset": "str", "overlay_modeled": "bool", "decision_backend": "str",
           "candidate_backend": "str", "headline_batch": "int", "headline_context": "str", "interactive": "bool"},
    "03": {"device": "str", "run_device": "str", "run_path": "str", "serving_run_path": "str", "batch": "int",
           "context": "str",
           "candidate_backend": "str", "gluon_run_path": "str", "gluon_ncu_path": "str",
           "timeline_path": "str", "timeline_call": "str", "modeled_gpus": "list[str]", "seed": "int",
           "interactive": "bool"},
    "04": {"device": "str", "profile_path": "str", "focus_batch": "int", "focus_next_n": "int", "cpu_batch": "int",
           "cpu_context": "int", "cpu_next_n": "list[int]", "interactive": "bool"},
    "05": {"device": "str", "interactive": "bool", "run_device": "str", "run_path": "str", "profile_path": "str",
           "candidate_backend": "str", "seed": "int", "batch": "int", "preset": "str"},
}  # fmt: skip


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_papermill_lists_every_parameter_with_its_type(path: Path) -> None:
    params = papermill.inspect_notebook(str(path))
    assert {name: p["inferred_type_name"] for name, p in params.items()} == EXPECTED[path.name[:2]]
    for name, p in params.items():
        value = ast.literal_eval(p["default"])
        kind = TYPES[p["inferred_type_name"]]
        assert type(value) is kind, f"{path.name}: {name} = {p['default']} is not a {p['inferred_type_name']}"
        if p["inferred_type_name"].startswith("list["):
            inner = TYPES[p["inferred_type_name"][5:-1]]
            assert all(type(v) is inner for v in value), f"{path.name}: {name} = {p['default']}"
    cell = next(c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
    lines = [line for line in cell.source.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(lines) == len(params), f"{path.name}: a parameter spans several lines, or a line is no parameter"


def test_the_candidate_is_gluon_and_the_paths_parse() -> None:
    by_stem = {p.name[:2]: papermill.inspect_notebook(str(p)) for p in NOTEBOOKS}
    for nb in ("02", "03"):
        assert by_stem[nb]["candidate_backend"]["default"] == '"gluon"'
    for nb in ("00", "02", "03", "05"):  # "": the newest measured run covering what the notebook reads
        assert ast.literal_eval(by_stem[nb]["run_path"]["default"]) == ""
    assert ast.literal_eval(by_stem["03"]["timeline_path"]["default"]) == "h200/experiments/gluon-round10-20261130"


def test_papermill_help_notebook_prints_the_types() -> None:
    """The command a user types, once: the types are in its output."""
    nb03 = next(p for p in NOTEBOOKS if p.name.startswith("03_"))
    shown = subprocess.run(
        [sys.executable, "-m", "papermill", "--help-notebook", str(nb03)], capture_output=True, text=True, check=True
    ).stdout
    assert 'candidate_backend: str (default "gluon")' in shown and "modeled_gpus: list[str]" in shown
    assert "Unknown type" not in shown


# ---------------------------------------------------------------- the check after the parameters (issue 29)

CHECK_CELL = "check_parameters(globals())"


def _declared(path: Path) -> dict:
    """The notebook's parameters cell run in a fresh namespace: its values and `__annotations__`."""
    cells = nbformat.read(path, as_version=4).cells
    cell = next(c for c in cells if "parameters" in c.metadata.get("tags", []))
    namespace: dict = {}
    exec(compile(cell.source, str(path), "exec", dont_inherit=True), namespace)  # annotations as the kernel has them
    return namespace


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_cell_after_the_parameters_checks_them_and_the_defaults_pass(path: Path) -> None:
    from dsa_lab.notebook.parameters import check_parameters

    cells = nbformat.read(path, as_version=4).cells
    at = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
    assert CHECK_CELL in cells[at + 1].source  # papermill injects its values between the two
    check_parameters(_declared(path))


BAD_VALUES = {  # parameter -> (a bad value, what the error must say besides its name)
    "batch": (0, "allowed range is [1, 4096]"),
    "headline_batch": (10**6, "allowed range"),
    "cpu_batch": ("2", "must be int, got str"),
    "focus_batch": (-1, "allowed range"),
    "context": ("nope", "allowed values are a length"),
    "headline_context": (65536, "must be str, got int"),
    "cpu_context": (0, "context"),
    "seed": (2**64, "allowed range is [0, 9223372036854775807]"),
    "device": ("tpu", "allowed values are 'cpu', 'cuda' or 'cuda:N'"),
    "interactive": ("no", "must be bool, got str"),
    "run_fresh": (1, "must be bool, got int"),
    "run_path": (5, "must be str, got int"),
    "profile_path": ("h200/h200-full-20261129/results.parquet", "is not a folder"),
    "run_device": ("h200/../x", "not a plain name"),
    "candidate_backend": ("nope", "allowed values are"),
    "baseline_backend": ("<b>", "not a plain name"),
    "decision_backend": (None, "must be str, got NoneType"),
    "fresh_preset": ("huge", "allowed values are ('ci', 'smoke'"),
    "preset": ("unknown", "allowed values are ('DeepSeek-V3, 1 draft'"),
    "modeled_gpus": (["B200", "Z9"], "modeled_gpus[1]='Z9': allowed values are"),
    "cpu_next_n": ([1, 0], "next_n=0: allowed range is [1, 16]"),
    "diagram_next_n": (True, "must be int, got bool"),
    "diagram_tiles": (10**9, "allowed range is [1, 64]"),
    "focus_next_n": (17, "allowed range is [1, 16]"),
    "timeline_call": ("call 6", "not a plain name"),
}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_parameter_a_bad_value_is_named_with_what_is_allowed(path: Path) -> None:
    from dsa_lab.notebook.parameters import check_parameters

    declared = _declared(path)
    for name in declared["__annotations__"]:
        value, says = BAD_VALUES.get(name, (None, "must be"))
        with pytest.raises(ValueError) as err:
            check_parameters({**declared, name: value})
        assert str(err.value).startswith(name) and says in str(err.value), (name, str(err.value))


def test_a_path_parameter_that_is_a_loop_of_links_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsa_lab.notebook.parameters import check_parameter

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ValueError, match=r"run_path='.*a': cannot be resolved .*give a run folder under data/"):
        check_parameter("run_path", str(tmp_path / "a"), str)
    check_parameter("run_path", str(tmp_path), str)  # a folder: the notebook's discovery takes it from there
    check_parameter("run_path", "", str)
    with pytest.raises(ValueError, match=r"run_path: a text of 300000 characters; at most 4096"):
        check_parameter("run_path", "x" * 300_000, str)
