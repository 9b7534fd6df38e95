"""Every notebook executes on the CPU with papermill and draws what it promises."""

from __future__ import annotations

from pathlib import Path

import nbformat
import papermill
import pytest

from dsa_lab import store
from dsa_lab.bench.sweep import preset, run_sweep
from dsa_lab.report import PROVENANCE_MIME

pytestmark = pytest.mark.notebook

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NB02 = REPO / "notebooks" / "02_latency_vs_next_n.ipynb"


def execute(path: Path, out: Path, **parameters: object) -> nbformat.NotebookNode:
    """Run a notebook as `dsa-lab report` does (repository root as cwd) and read it back."""
    papermill.execute_notebook(
        str(path), str(out), parameters={"device": "cpu", **parameters}, cwd=str(REPO),
        progress_bar=False, execution_timeout=600,
    )  # fmt: skip
    return nbformat.read(out, as_version=4)


def outputs(nb: nbformat.NotebookNode, kind: str) -> list:
    """Every output payload of a MIME type (or every output of an output_type)."""
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == kind:
                found.append(out)
            elif kind in out.get("data", {}):
                found.append(out["data"][kind])
    return found


def text_of(nb: nbformat.NotebookNode) -> str:
    return "\n".join(outputs(nb, "text/markdown") + outputs(nb, "text/plain"))


def test_notebooks_are_committed_without_outputs_and_take_parameters() -> None:
    assert NOTEBOOKS, "no notebooks found"
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert "parameters" in code[0].metadata.get("tags", []), f"{path.name}: first code cell is not tagged 'parameters'"
        assert "device" in code[0].source, f"{path.name}: parameters cell has no 'device'"
        assert all(not c.outputs and c.execution_count is None for c in code), f"{path.name}: committed with outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_and_draws(path: Path, tmp_path: Path) -> None:
    nb = execute(path, tmp_path / path.name)
    assert not outputs(nb, "error")
    assert outputs(nb, "image/png") or outputs(nb, "text/html"), f"{path.name}: drew nothing"
    if path.name.startswith("01_"):
        assert len(outputs(nb, "image/png")) >= 3  # policy matrix, block tables, context lens
        text = text_of(nb)
        assert "All three strategies agree" in text and "max |diff| = 0" in text
        assert "vLLM 0.33.0 runs next_n = [1, 2, 4] natively" in text
    if path.name.startswith("02_"):
        assert len(outputs(nb, "image/png")) >= 3
        assert any("recommended" in html for html in outputs(nb, "text/html")), "no decision table"
        assert outputs(nb, PROVENANCE_MIME), "02 does not say which data it used"


def test_02_without_a_shipped_run_says_so_and_falls_back(tmp_path: Path) -> None:
    nb = execute(NB02, tmp_path / "out.ipynb", data_root=str(tmp_path / "empty"), run_path="", repeat_path="")
    text = text_of(nb)
    assert "No measured H200 run is shipped" in text
    assert "CPU reference, not H200" in text and "modeled" in text
    labels = {p["label"] for p in outputs(nb, PROVENANCE_MIME)}
    assert labels == {"CPU reference sweep (not H200)", "modeled H200 times"}
    assert len(outputs(nb, "image/png")) >= 5  # latency x2, speedup x2, roofline


def test_02_reads_the_newest_measured_run(tmp_path: Path) -> None:
    spec = preset("ci").with_axes(next_n=(1, 3), context=("96",))
    old = tmp_path / "data" / "h200" / "run-old"
    new = tmp_path / "data" / "h200" / "run-new"
    for run_dir in (old, new):
        run_sweep(spec, run_dir, "cpu", progress=False)
    store.update_provenance(old, created="2000-01-01T00:00:00+00:00")  # unambiguously older
    unfinished = tmp_path / "data" / "h200" / "run-unfinished"  # provenance but no results yet
    unfinished.mkdir()
    (unfinished / store.PROVENANCE_FILE).write_text((new / store.PROVENANCE_FILE).read_text())
    nb = execute(NB02, tmp_path / "out.ipynb", data_root=str(tmp_path / "data"), run_path="", repeat_path="")
    used = outputs(nb, PROVENANCE_MIME)
    assert [p["run_id"] for p in used] == ["run-new"] and used[0]["source"] == "measured"
    text = text_of(nb)
    assert "No measured" not in text
    assert "Ignored run" in text and "run-unfinished" in text
    assert "has no timed rows in this run; deciding on `reference`" in text
    assert "**reference on cpu (measured)**: 2 points" in text


def test_03_without_a_shipped_triton_run_says_so_and_falls_back(tmp_path: Path) -> None:
    nb = execute(
        REPO / "notebooks" / "03_kernel_deep_dive.ipynb", tmp_path / "out.ipynb",
        data_root=str(tmp_path / "empty"), run_path=None,
    )  # fmt: skip
    text = text_of(nb)
    assert "No measured H200 run with the `triton` backend" in text
    assert "CPU reference, not H200" in text and "modeled" in text
    assert len(outputs(nb, "image/png")) >= 3
