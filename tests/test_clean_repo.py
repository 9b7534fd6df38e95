"""Using the workbench leaves the repository clean: notebooks stripped on commit by the filter `./lab`
sets, runs not on the study's GPU (or placed by no --out/--root) in the ignored scratch/, labelled
so `runs` and the notebooks tell them from study data; and `./lab` itself: --help without installing
or importing torch, JupyterLab rooted at the repository and opened on notebooks/.

The lab script runs against a stand-in venv (its python the interpreter running these tests, its
dsa-lab and jupyter recording their arguments) in a copy of the checkout, so nothing here installs
anything or touches this checkout's git configuration.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from dsa_lab.cli import main
from dsa_lab.notebook.git_hook import refresh_entry, refresh_index
from dsa_lab.paths import DATA_ENV, SCRATCH_ENV
from dsa_lab.store import folders as store
from dsa_lab.store import listing as listing

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = "notebooks/01_decode_paths.ipynb"
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", "-c", "init.defaultBranch=main"]


def _stand_in_venv(folder: Path, pyproject: Path) -> Path:
    """A venv `./lab` takes as installed: its stamp matches `pyproject`, python is this interpreter."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    scripts = {
        "python": f'exec "{sys.executable}" "$@"',
        "dsa-lab": 'echo "dsa-lab $*"',
        "jupyter": 'echo "cwd=$PWD"; echo "jupyter $*"',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (folder / ".dsa_lab_installed").write_text(hashlib.sha256(pyproject.read_bytes()).hexdigest() + "\n")
    return folder


def _lab(checkout: Path, venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DSA_LAB_VENV": str(venv)}
    return subprocess.run(
        ["bash", str(checkout / "lab"), *args], cwd=checkout, env=env, capture_output=True, text=True, timeout=120
    )


def _git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git repository holding the lab script, pyproject.toml, .gitattributes and a notebook as
    committed, with the filter `./lab` sets (run once, as a user's first command would)."""
    repo = tmp_path_factory.mktemp("checkout")
    (repo / "notebooks").mkdir()
    for name in ("lab", "pyproject.toml", ".gitattributes", ".gitignore", NOTEBOOK):
        shutil.copy(REPO / name, repo / name)
    _git(repo, "init", "-q")
    venv = _stand_in_venv(repo.parent / f"{repo.name}-venv", repo / "pyproject.toml")
    done = _lab(repo, venv, "policy")
    assert done.returncode == 0 and "dsa-lab policy" in done.stdout, done.stderr
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "as shipped")
    return repo


def test_lab_help_lists_its_commands_without_a_venv_or_torch(tmp_path: Path) -> None:
    venv = tmp_path / "no-venv"
    env = {**os.environ, "DSA_LAB_VENV": str(venv), "PYTHON": sys.executable, "PYTHONPROFILEIMPORTTIME": "1"}
    done = subprocess.run(["bash", str(REPO / "lab"), "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for command in ("report", "test", "jupyter", "bench", "profile", "compare", "model", "runs"):
        assert f"  {command} " in done.stdout, done.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines() if "|" in line}
    assert "dsa_lab" in imported and "torch" not in imported
    assert not venv.exists()  # nothing installed


def test_lab_jupyter_roots_at_the_repository_and_opens_notebooks(tmp_path: Path) -> None:
    copy = tmp_path / "copy"  # not a git repository: the filter step is skipped
    copy.mkdir()
    for name in ("lab", "pyproject.toml"):
        shutil.copy(REPO / name, copy / name)
    venv = _stand_in_venv(tmp_path / "venv", copy / "pyproject.toml")
    done = _lab(copy, venv, "jupyter", "--no-browser")
    assert done.returncode == 0, done.stderr
    assert f"cwd={copy}" in done.stdout
    args = done.stdout.split("jupyter ", 1)[1].split()
    assert "--ServerApp.root_dir=." in args and "--LabApp.default_url=/lab/tree/notebooks" in args
    assert "--ServerApp.ip=127.0.0.1" in args and args[-1] == "--no-browser"
    assert "--ContentsManager.post_save_hook=dsa_lab.notebook.git_hook.refresh_index" in args
    mine = _lab(copy, venv, "jupyter", "--ServerApp.root_dir=/elsewhere")  # a root of the user's own: theirs only
    assert "--ServerApp.root_dir=." not in mine.stdout and "default_url" not in mine.stdout


def test_lab_sets_the_notebook_filter(checkout: Path) -> None:
    clean = _git(checkout, "config", "--get", "filter.nbstripout.clean").strip()
    assert clean.endswith("/bin/python' -m nbstripout --keep-id --extra-keys metadata.language_info")
    assert _git(checkout, "config", "--get", "filter.nbstripout.required").strip() == "true"
    assert _git(checkout, "check-attr", "filter", NOTEBOOK).strip().endswith("filter: nbstripout")


def test_committed_notebooks_are_what_the_filter_commits(checkout: Path, tmp_path: Path) -> None:
    """Each notebook as shipped is, byte for byte, its own filtered form: a notebook committed without
    the filter (a fresh clone before `./lab`) must still leave `git status` clean after a save."""
    copies = [Path(shutil.copy(path, tmp_path)) for path in sorted((REPO / "notebooks").glob("*.ipynb"))]
    clean = _git(checkout, "config", "--get", "filter.nbstripout.clean").strip()
    subprocess.run(f"{clean} {' '.join(map(str, copies))}", shell=True, check=True, timeout=120)  # strips in place
    for copy in copies:
        assert copy.read_bytes() == (REPO / "notebooks" / copy.name).read_bytes(), f"{copy.name}: not stripped"


def test_a_notebook_saved_after_run_all_leaves_git_status_clean(checkout: Path) -> None:
    """What JupyterLab's autosave writes after Run All (outputs, counts, the running kernel's spec, its
    language_info with the Python version, widget state, execution timings), then its save hook."""
    path = checkout / NOTEBOOK
    nb = nbformat.read(path, as_version=4)
    for count, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = count + 1
        cell.outputs = [
            nbformat.v4.new_output("stream", name="stdout", text="x" * 1000),
            nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="}),
        ]
        cell.metadata["execution"] = {"iopub.status.busy": "2026-12-01T00:00:00Z"}
    nb.metadata["language_info"] = {"name": "python", "version": "3.11.2", "mimetype": "text/x-python"}
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nbformat.write(nb, path)
    assert len(path.read_bytes()) > len(_git(checkout, "show", f"HEAD:{NOTEBOOK}")) + 5000
    assert _git(checkout, "diff") == ""  # the filter commits none of it
    assert _git(checkout, "status", "--porcelain").strip() == f"M {NOTEBOOK}"  # git saw the size change...
    refresh_index(os_path=str(path), model={}, contents_manager=None).join(timeout=120)  # ... until the save hook
    assert _git(checkout, "status", "--porcelain") == ""  # refreshes the entry (in a thread: the save returns at once)
    next(c for c in nb.cells if c.cell_type == "code").outputs.pop()  # the next autosave: another size again
    nbformat.write(nb, path)
    assert _git(checkout, "status", "--porcelain").strip() == f"M {NOTEBOOK}"
    assert refresh_entry(path)
    assert _git(checkout, "status", "--porcelain") == "" and _git(checkout, "diff", "--cached") == ""
    nb.cells[0].source += "\n# an edit of the user's"  # a real change still shows
    nbformat.write(nb, path)
    assert not refresh_entry(path)
    assert _git(checkout, "status", "--porcelain").strip() == f"M {NOTEBOOK}"
    assert '+    "# an edit of the user\'s"' in _git(checkout, "diff")
    _git(checkout, "checkout", "--", NOTEBOOK)


def test_the_save_hook_leaves_what_is_not_a_tracked_notebook_alone(checkout: Path, tmp_path: Path) -> None:
    (checkout / "notebooks" / "mine.ipynb").write_text("{}")  # untracked
    outside = tmp_path / "x.ipynb"  # not in a checkout
    outside.write_text("{}")
    for path in (checkout / "notebooks" / "mine.ipynb", outside, checkout / "lab"):
        assert not refresh_entry(path)
    assert _git(checkout, "status", "--porcelain").strip() == "?? notebooks/mine.ipynb"
    (checkout / "notebooks" / "mine.ipynb").unlink()


# ---------------------------------------------------------------- scratch runs

FAST = "bench --preset ci --device cpu --no-progress --batch 1 --context 64 --next-n 1 --strategy native --max-seconds-per-point 0.01".split()


def test_a_run_placed_by_no_flag_goes_to_scratch_labelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SCRATCH_ENV, str(tmp_path / "scratch"))
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    assert main([*FAST, "--run-id", "try"]) == 0
    folder = tmp_path / "scratch" / "cpu" / "try"
    assert store.read_provenance(folder / store.PROVENANCE_FILE)["scratch"] is True
    assert main([*FAST, "--root", str(tmp_path / "data"), "--run-id", "cpu-in-data"]) == 0
    in_data = store.read_provenance(tmp_path / "data" / "cpu" / "cpu-in-data" / store.PROVENANCE_FILE)
    assert in_data["scratch"] is True  # placed in data/, but a CPU run is never the study's measurement
    profile_argv = "profile --tool torch --device cpu --batch 1 --context 64 --next-n 1 --strategy native"
    assert main([*profile_argv.split(), *"--heads 32 --head-dim 64 --run-id prof".split()]) == 0
    profile = store.read_provenance(tmp_path / "scratch" / "cpu" / "profiles" / "prof" / store.PROVENANCE_FILE)
    assert profile["scratch"] is True and profile["kind"] == "profile"


def test_runs_lists_study_and_scratch_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv(SCRATCH_ENV, str(tmp_path / "scratch"))
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "data"))
    assert main([*FAST, "--run-id", "try"]) == 0
    assert main([*FAST, "--root", str(tmp_path / "data"), "--run-id", "study"]) == 0
    store.update_provenance(tmp_path / "data" / "cpu" / "study", device="cuda", scratch=False)  # as an H200 run's
    old = tmp_path / "data" / "cpu" / "old"  # recorded before the label: its device decides
    shutil.copytree(tmp_path / "scratch" / "cpu" / "try", old)
    provenance = store.read_provenance(old / store.PROVENANCE_FILE)
    del provenance["scratch"]
    (old / store.PROVENANCE_FILE).write_text(json.dumps({**provenance, "run_id": "old"}))
    capsys.readouterr()
    assert main(["runs"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    column = header.split().index("purpose")
    rows = {line.split()[1]: line.split() for line in lines}
    assert rows["study"][column] == "study" and rows["try"][column] == "scratch" and rows["old"][column] == "scratch"
    assert str(tmp_path) not in "\n".join(lines) and "None" not in "\n".join(lines)  # no machine path, no 'None'
    assert rows["try"][0] == "scratch/cpu/try" and rows["study"][0] == "data/cpu/study"
    purposes = listing.list_runs(tmp_path / "data").set_index("run_id")["purpose"].to_dict()
    assert purposes == {"study": "study", "old": "scratch"}


def test_run_fresh_shows_a_progress_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from dsa_lab.bench import sweep
    from dsa_lab.notebook import runs

    seen: dict[str, object] = {}

    def fake_sweep(spec, folder, device, **kwargs):
        seen.update(kwargs, folder=folder)
        raise RuntimeError("stop here")

    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(sweep, "run_sweep", fake_sweep)
    with pytest.raises(RuntimeError, match="stop here"):
        runs.fresh_latency_run("smoke", 0)
    assert seen["progress"] is True and Path(seen["folder"]).parent == tmp_path / "h200"
