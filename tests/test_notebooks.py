"""Every notebook executes on the CPU with papermill, from the repository root (as `dsa-lab
report` runs it) and from notebooks/ (JupyterLab's working directory), and draws what it promises."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import papermill
import pytest

from dsa_lab.bench.sweep import preset, run_sweep
from dsa_lab.notebook.display import FALLBACK_MIME, PROVENANCE_MIME
from dsa_lab.paths import DATA_ENV
from dsa_lab.store import folders as store

pytestmark = pytest.mark.notebook

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NB02 = REPO / "notebooks" / "02_latency_vs_next_n.ipynb"
WORKDIRS = {"root": REPO, "notebooks": REPO / "notebooks"}
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def execute(path: Path, out: Path, cwd: Path = REPO, **parameters: object) -> nbformat.NotebookNode:
    """Run a notebook headless (as `dsa-lab report` does, unless `interactive` is given) and read it back."""
    papermill.execute_notebook(
        str(path),
        str(out),
        parameters={"device": "cpu", "interactive": False, **parameters},
        cwd=str(cwd),
        progress_bar=False,
        execution_timeout=600,
    )
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
    return "\n".join(outputs(nb, "text/markdown") + outputs(nb, "text/plain") + outputs(nb, "text/html"))


def test_notebooks_are_committed_without_outputs_and_take_parameters() -> None:
    assert NOTEBOOKS, "no notebooks found"
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert "parameters" in code[0].metadata.get("tags", []), (
            f"{path.name}: first code cell is not tagged 'parameters'"
        )
        assert "device" in code[0].source, f"{path.name}: parameters cell has no 'device'"
        assert "interactive" in code[0].source, f"{path.name}: parameters cell has no 'interactive'"
        assert all(not c.outputs and c.execution_count is None for c in code), f"{path.name}: committed with outputs"
        assert "../data" not in "".join(c.source for c in code), f"{path.name}: reads data by a relative path"
        written = nbformat.writes(nb)  # what JupyterLab and nbstripout write back: saving leaves git clean
        assert path.read_text(encoding="utf-8").rstrip("\n") == written.rstrip("\n"), f"{path.name}: not as saved"


@pytest.mark.parametrize("workdir", list(WORKDIRS))
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_and_draws(path: Path, workdir: str, tmp_path: Path) -> None:
    nb = execute(path, tmp_path / path.name, WORKDIRS[workdir])
    assert not outputs(nb, "error")
    assert outputs(nb, "image/png") or outputs(nb, "text/html"), f"{path.name}: drew nothing"
    assert not outputs(nb, FALLBACK_MIME), f"{path.name} from {workdir}/: fell back although the shipped data is there"
    text = text_of(nb)
    if path.name.startswith("01_"):
        assert len(outputs(nb, "image/png")) >= 5  # policy matrix, block tables, context lens, explorer's two
        assert "All three strategies agree" in text and "max |diff| = 0" in text
        assert "vLLM 0.33.0 runs next_n = [1, 2, 4] natively" in text
        assert "Decode-path explorer" in text and "Why:" in text
    if path.name.startswith("02_"):
        assert len(outputs(nb, "image/png")) >= 4
        assert any("recommended" in html for html in outputs(nb, "text/html")), "no decision table"
        assert [p["label"] for p in outputs(nb, PROVENANCE_MIME)][0] == "latency run"
        assert "Latency explorer" in text and "speedup over vLLM" in text
    if path.name.startswith("03_"):
        assert outputs(nb, PROVENANCE_MIME)[0]["source"] == "measured"
        assert "Gluon goals run" in [p["label"] for p in outputs(nb, PROVENANCE_MIME)]
        assert "**Goal 1" in text and "**Goal 4" in text and "(../docs/triton_kernel.md)" in text  # linked, not copied
        assert "## Round 5 (issue 13)" not in text and "Round 10" in text
        assert "_paged_mqa_logits_gluon_kernel" in text  # the Nsight Compute table
        assert "round-10 timelines are not in this checkout" not in text  # the CTA timeline chart was drawn
    if path.name.startswith("04_"):
        assert outputs(nb, PROVENANCE_MIME)[0]["device_name"] == "NVIDIA H200"
        assert "Profile explorer" in text


def test_explorers_render_as_widgets_when_interactive(tmp_path: Path) -> None:
    nb = execute(
        REPO / "notebooks" / "01_decode_paths.ipynb", tmp_path / "out.ipynb", REPO / "notebooks", interactive=True
    )
    assert not outputs(nb, "error")
    assert outputs(nb, WIDGET_MIME), "the explorer displayed no widget"


@pytest.fixture
def empty_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(DATA_ENV, str(empty))
    return empty


def test_02_without_a_shipped_run_shows_a_banner_and_falls_back(empty_data: Path, tmp_path: Path) -> None:
    nb = execute(NB02, tmp_path / "out.ipynb", REPO / "notebooks", run_path="", repeat_path="")
    assert not outputs(nb, "error")
    banner = outputs(nb, FALLBACK_MIME)
    assert len(banner) == 1 and "No measured H200 run" in banner[0]["missing"]
    assert "dsa-lab bench --preset h200-full" in banner[0]["missing"]
    text = text_of(nb)
    assert "Not the measured data" in text and "CPU reference, not H200" in text and "modeled" in text
    labels = {p["label"] for p in outputs(nb, PROVENANCE_MIME)}
    assert labels == {"latency run: CPU reference, not H200", "modeled H200 times"}
    assert len(outputs(nb, "image/png")) >= 4  # headline, modeled speedups, explorer, SM100 (modeled)
    assert "No speedups here" in text  # a CPU's wall clock draws times, never speedups


def test_02_reads_the_newest_measured_run_covering_the_study_grid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = REPO / "data" / "h200" / "h200-full-20261129"
    old, new, scratch = (tmp_path / "data" / "h200" / name for name in ("run-old", "run-new", "run-scratch"))
    for run_dir, created in ((old, "2000-01-01"), (new, "2026-12-02"), (scratch, "2100-01-01")):
        shutil.copytree(shipped, run_dir)
        store.update_provenance(run_dir, run_id=run_dir.name, created=f"{created}T00:00:00+00:00")
    store.update_provenance(scratch, scratch=True)  # the newest, but a try-out: never shown
    small = tmp_path / "data" / "h200" / "run-small"  # newer still, measured, but only the ci preset's grid
    run_sweep(preset("ci").with_axes(next_n=(1,), context=("96",)), small, "cpu", progress=False)
    store.update_provenance(small, scratch=False, created="2099-01-01T00:00:00+00:00")
    unfinished = tmp_path / "data" / "h200" / "run-unfinished"  # provenance but no results yet
    unfinished.mkdir()
    (unfinished / store.PROVENANCE_FILE).write_text((new / store.PROVENANCE_FILE).read_text())
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "data"))
    nb = execute(NB02, tmp_path / "out.ipynb", REPO / "notebooks", repeat_path="")  # run_path: its default, ""
    used = outputs(nb, PROVENANCE_MIME)
    assert used[0]["run_id"] == "run-new" and used[0]["source"] == "measured" and used[0]["label"] == "latency run"
    assert used[0]["path"] == "h200/run-new"  # relative to the data folder: no machine paths
    assert not outputs(nb, FALLBACK_MIME)
    text = text_of(nb)
    assert "Passed over (runs)" in text and "run-unfinished" in text  # named, with why
    assert "`h200/run-small`: measured on cpu" in text  # newer, but a CPU run: said


def test_03_without_a_run_of_the_candidate_shows_a_banner_and_falls_back(empty_data: Path, tmp_path: Path) -> None:
    nb = execute(
        REPO / "notebooks" / "03_kernel_deep_dive.ipynb", tmp_path / "out.ipynb", REPO / "notebooks", run_path=""
    )
    assert not outputs(nb, "error")
    banner = outputs(nb, FALLBACK_MIME)
    assert len(banner) == 1 and "timing backend gluon" in banner[0]["missing"]  # the candidate, gluon
    assert "CPU reference, not H200" in text_of(nb) and "modeled" in text_of(nb)
    # the Gluon section has no stand-in: one line each saying what is missing and the command that makes it
    assert "No measured H200 run with the 'gluon' backend" in text_of(nb) and "scripts/h200_sweep.sh" in text_of(nb)
    assert "No Nsight Compute run at" in text_of(nb)
    assert "round-10 timelines are not in this checkout" in text_of(nb)
    assert "No roofline:" in text_of(nb) and "has no GPU ceilings" in text_of(nb)  # skipped, with a note
    assert len(outputs(nb, "image/png")) >= 2  # the strategies of the stand-in, the SM100 model


def test_04_without_a_profile_run_shows_a_banner_and_profiles_the_cpu(empty_data: Path, tmp_path: Path) -> None:
    nb = execute(REPO / "notebooks" / "04_kernel_profiles.ipynb", tmp_path / "out.ipynb", REPO / "notebooks")
    assert not outputs(nb, "error")
    banner = outputs(nb, FALLBACK_MIME)
    assert len(banner) == 1 and "No readable profile run under $DSA_LAB_DATA/h200/profiles" in banner[0]["missing"]
    assert "scripts/h200_profile.sh" in banner[0]["missing"]


@pytest.fixture(scope="module")
def two_shape_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A measured run holding two shapes, H = 32 and H = 64 (the reference and Triton timed on this CPU,
    labelled an H200 so that the charts have ceilings to draw)."""
    data = tmp_path_factory.mktemp("two_shapes") / "data"
    spec = preset("ci").with_axes(
        backend=("reference", "triton"), strategy=("native", "flatten"), heads=(32, 64), context=("96",), next_n=(1, 2)
    )
    run_sweep(spec, data / "h200" / "two-shapes", "cpu", progress=False)
    store.update_provenance(data / "h200" / "two-shapes", device_name="NVIDIA H200")  # so charts take its ceilings
    return data


@pytest.mark.parametrize("name", ["00_tour", "02_latency_vs_next_n", "03_kernel_deep_dive"])
def test_a_run_with_two_head_counts_runs_every_notebook_that_reads_it(
    name: str, two_shape_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Notebook 02 used to crash on a run with H = 32 and H = 64 (the analysis keyed on three of the axes)."""
    monkeypatch.setenv(DATA_ENV, str(two_shape_data))
    extra = {"02": {"repeat_path": ""}, "03": {"baseline_backend": "reference", "candidate_backend": "triton"}}.get(
        name[:2], {}
    )
    nb = execute(
        REPO / "notebooks" / f"{name}.ipynb", tmp_path / "out.ipynb", REPO, run_path="h200/two-shapes", **extra
    )
    assert not outputs(nb, "error")
    assert outputs(nb, PROVENANCE_MIME)[0]["run_id"] == "two-shapes"
    assert "2 shapes in this run; showing cache_dtype=fp8, heads=64, head_dim=64" in text_of(nb)
