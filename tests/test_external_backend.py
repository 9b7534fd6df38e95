"""A backend of your own in one file (docs/add_a_kernel.md): the example runs end to end on the CPU (bench
through the CLI, the run loaded, notebooks 02 and 03's candidate analysis on it), gets the contract every
built-in backend keeps, bad modules are named in one line, and an installed entry point's module is imported
only when its name is asked for."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

import tests.test_backend_contract as contract
from dsa_lab import env_info
from dsa_lab.cli import main
from dsa_lab.kernels import external, registry
from dsa_lab.store import folders as store
from dsa_lab.store import format as run_format

matplotlib.use("Agg")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "my_kernel.py"
CANDIDATE = ("my-kernel", "native")


@pytest.fixture
def own_registry(monkeypatch: pytest.MonkeyPatch):
    """The registry and the external modules' records as they are now, restored after the test."""
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    for name in ("_ORIGINS", "_FILES"):
        monkeypatch.setattr(external, name, dict(getattr(external, name)))
    monkeypatch.setattr(external, "_ENVIRONMENT_FAILURES", [])
    env_info.environment_facts.cache_clear()
    yield
    env_info.environment_facts.cache_clear()


def test_the_example_benches_through_the_cli_and_its_run_reaches_notebooks_02_and_03(
    own_registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from dsa_lab.analysis import frames, readings, versus
    from dsa_lab.notebook.sections import kernel_run, latency_run
    from dsa_lab.plots import kernel, latency
    from dsa_lab.plots.style import backend_marker

    bench = ["bench", "--backend-module", str(EXAMPLE), "--backend", "my-kernel,reference", "--preset", "ci"]
    grid = ["--context", "256,mixed:64-256", "--next-n", "3", "--strategy", "native,flatten"]
    assert (
        main(
            [
                *bench,
                *grid,
                "--root",
                str(tmp_path),
                "--run-id",
                "mine",
                "--no-progress",
                "--max-seconds-per-point",
                "0.05",
            ]
        )
        == 0
    )
    assert "my-kernel native" in capsys.readouterr().out  # the results table
    run = store.load_run(tmp_path / "cpu" / "mine")
    mine = run.results[run.results["backend"] == "my-kernel"]
    assert (mine["status"] == "ok").all() and (mine["rel_err"] > 0).all()  # checked: float32, not a copy
    origin = run.provenance["environment"][env_info.EXTERNAL]["my-kernel"]
    assert origin == {
        "path": "examples/my_kernel.py",
        "sha256": hashlib.sha256(EXAMPLE.read_bytes()).hexdigest(),
        "via": "--backend-module",
    }

    # Notebook 02 (data from its run_path, the candidate from candidate_backend) and 03 on that run.
    monkeypatch.setenv("DSA_LAB_DATA", str(tmp_path))
    chosen = latency_run("cpu/mine", "cpu")
    gap = frames.mixed_context_gap(chosen.run.results, chosen.run.provenance["seed"], CANDIDATE, "reference")
    assert list(gap["mixed"]) == ["mixed:64-256"] and gap["vs_best"].notna().all()
    reading = readings.mixed_context_reading(gap, chosen.device_label, CANDIDATE, "reference")
    assert "my-kernel native" in reading
    latency.plot_vs_vllm(chosen.run.results, chosen.device_label, "caption", "reference", ["256", "mixed:64-256"])
    assert backend_marker("my-kernel") == "*"  # its own descriptor draws it
    chosen = kernel_run("cpu/mine", "cpu", "my-kernel")
    comparison = versus.kernel_comparison(chosen.run.results, CANDIDATE, "reference")
    assert set(comparison["context"]) == {"256", "mixed:64-256"}
    kernel.plot_backend_latency(chosen.run.results, 2, "256", chosen.device_label, "caption", "reference")
    kernel.plot_speedup_heatmaps(comparison, chosen.device_label, "caption", CANDIDATE, "reference")
    assert "my-kernel native on cpu" in readings.comparison_reading(
        comparison, 2, "256", chosen.device_label, CANDIDATE, "reference"
    )

    # A checkout that does not know the backend still loads the run (and imports nothing for it).
    registry.forget_backends(("my-kernel",))
    assert set(store.load_run(tmp_path / "cpu" / "mine").results["backend"]) == {"my-kernel", "reference"}


def test_the_example_keeps_the_contract_of_every_backend(own_registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """The contract tests' own checks (DSA_LAB_BACKEND_MODULES=... pytest tests/test_backend_contract.py runs
    them all over it)."""
    assert external.load_backend_files([str(EXAMPLE)]) == ("my-kernel",)
    contract.test_every_backend_declares_what_the_layers_above_read("my-kernel")
    contract.test_each_backend_writes_every_element_here_or_says_why_not("my-kernel", monkeypatch)
    contract.test_one_baseline_one_backend_vllm_runs_and_every_backend_in_a_preset()
    assert external.load_backend_files([str(EXAMPLE)]) == ("my-kernel",)  # once a process


def _registers(name: str) -> str:
    return (
        "from dsa_lab.kernels.registry import LogitsBackend, register_backend\n"
        f"@register_backend\nclass Named(LogitsBackend):\n    name, family, label = {name!r}, 'a', 'A'\n"
    )


BAD_MODULES = {
    "import_error.py": ("import not_a_package_anywhere\n", "importing it failed: ModuleNotFoundError"),
    "syntax.py": ("def broken(:\n", "importing it failed: SyntaxError"),
    "exits.py": ("raise SystemExit(3)\n", "importing it failed: SystemExit: 3"),
    "nothing.py": ("VALUE = 1\n", "registers no backend"),
    "clash.py": (
        "from dsa_lab.kernels import LogitsBackend, register_backend\n"
        "@register_backend\nclass First(LogitsBackend):\n    name, family, label = 'first-of-two', 'a', 'A'\n"
        "@register_backend\nclass Second(LogitsBackend):\n    name, family, label = 'reference', 'b', 'B'\n",
        "backend 'reference' is a built-in backend's name",
    ),
    "baseline.py": (
        "from dsa_lab.kernels import LogitsBackend, register_backend\n"
        "@register_backend\nclass Mine(LogitsBackend):\n    name, family, label, baseline = 'mine', 'a', 'A', True\n",
        "backend 'mine' declares baseline=True",
    ),
    "missing.py": (None, "no such file"),
    "markup_name.py": (_registers("my kernel<b>"), "backend name 'my kernel<b>' is not a plain name"),
    "comma_name.py": (_registers("a,b"), "backend name 'a,b' is not a plain name"),
    "empty_name.py": (_registers(""), "backend name '' is not a plain name"),
    "never_returns.py": ("import time\nwhile True:\n    time.sleep(0.05)\n", "its import was still running after 1 s"),
    "interrupts.py": ("raise KeyboardInterrupt\n", "importing it was interrupted (KeyboardInterrupt)"),
    "swallows.py": ("try:\n    while True: pass\nexcept Exception:\n    pass\n", "still running after 1 s"),
}


@pytest.mark.parametrize("case", sorted(BAD_MODULES))
def test_a_bad_module_is_one_line_naming_the_file_and_leaves_nothing_registered(
    own_registry, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    text, problem = BAD_MODULES[case]
    monkeypatch.setenv(external.TIMEOUT_VAR, "1")
    path = tmp_path / case
    if text is not None:
        path.write_text(text)
    before = registry.backend_names()
    assert main(["bench", "--backend-module", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dsa-lab bench: error: --backend-module {path}: ") and problem in err
    assert "\n" not in err and "Traceback" not in err
    assert registry.backend_names() == before


@pytest.mark.parametrize("kind", ["folder", "loop", "bad limit"])
def test_a_folder_a_loop_of_links_or_a_bad_time_limit_is_named(
    own_registry, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    path = tmp_path / "mine"
    if kind == "folder":
        path.mkdir()
    elif kind == "loop":
        (tmp_path / "other").symlink_to(path)
        path.symlink_to(tmp_path / "other")
    else:
        path = tmp_path / "fresh.py"
        path.write_text(_registers("fresh-one"))
        monkeypatch.setenv(external.TIMEOUT_VAR, "soon")
    assert main(["bench", "--backend-module", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    says = {"folder": "is a folder; give the Python file", "loop": "a loop of symbolic links",
            "bad limit": "DSA_LAB_IMPORT_TIMEOUT_S='soon': must be a finite number of seconds > 0"}[kind]  # fmt: skip
    assert says in err and "\n" not in err and "Traceback" not in err, err


def test_a_second_module_with_a_taken_name_is_named_by_the_first(own_registry, tmp_path: Path) -> None:
    copy = tmp_path / "copy_of_mine.py"
    copy.write_text(EXAMPLE.read_text())
    external.load_backend_files([str(EXAMPLE)])
    with pytest.raises(external.ExternalBackendError, match=r"'my-kernel' is already registered by examples/my_"):
        external.load_backend_files([str(copy)])


def test_a_failed_environment_module_is_raised_when_a_name_is_asked_for(
    own_registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(external.ENV_VAR, f"{EXAMPLE}:{tmp_path / 'gone.py'}")
    with pytest.warns(UserWarning, match="gone.py: no such file"):
        external.load_environment()
    assert "my-kernel" in registry.backend_names()  # the good file still loads
    with pytest.raises(external.ExternalBackendError, match=r"backend 'typo' is not registered, and .*gone\.py"):
        registry.get_backend("typo")
    assert main(["bench", "--dry-run"]) == 2  # bench and profile refuse to run without it


def _installed_entry_point(root: Path) -> Path:
    """A distribution on `root` whose entry point `unasked` names a module that leaves a mark when imported."""
    marker = root / "imported"
    (root / "unasked_kernel.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "from dsa_lab.kernels import LogitsBackend, register_backend\n"
        "@register_backend\nclass Unasked(LogitsBackend):\n    name, family, label = 'unasked', 'unasked', 'Unasked'\n"
    )
    info = root / "unasked_kernel-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: unasked-kernel\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{external.ENTRY_POINT_GROUP}]\nunasked = unasked_kernel\n")
    return marker


def test_an_entry_point_is_imported_only_when_its_name_is_asked_for(
    own_registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = _installed_entry_point(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "unasked_kernel", raising=False)
    from dsa_lab import axes
    from dsa_lab.bench.presets import preset

    assert "unasked" not in registry.backend_names()
    axes.axis("backend").check(("reference",))  # other names asked for, presets, a stored run naming it
    preset("ci")
    run_format.check_axes(pd.DataFrame({"backend": ["unasked", "reference"]}), tmp_path / "results.parquet")
    assert not marker.exists() and "unasked_kernel" not in sys.modules
    assert axes.axis("backend").check("unasked") == ("unasked",)  # --backend unasked
    assert marker.exists() and registry.get_backend("unasked").label == "Unasked"
    origin = external.origins(["unasked"])["unasked"]
    assert origin["path"] == str(tmp_path / "unasked_kernel.py") and "(unasked-kernel 0.1)" in origin["via"]
    assert origin["sha256"] == hashlib.sha256((tmp_path / "unasked_kernel.py").read_bytes()).hexdigest()


def test_env_lists_every_entry_point_saying_it_imported_it(
    own_registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = _installed_entry_point(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "unasked_kernel", raising=False)
    notes, errors = external.load_entry_points()
    assert marker.exists() and not errors
    assert notes == [
        f"entry point {external.ENTRY_POINT_GROUP}: unasked = unasked_kernel (unasked-kernel 0.1): foreign code, "
        "imported by env to list it"
    ]
