"""Hostile DeepGEMM PR #340 builds: foreign code runs only when asked, its import is bounded and named, one
build a process, and whatever its ORIGIN says is shown as text."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dsa_lab import env_info
from dsa_lab.cli import main
from dsa_lab.kernels import deepgemm_pr340 as pr
from dsa_lab.store import folders as store

HOSTILE = {  # what a build's __init__.py does at import -> what the reason must say
    "sys.exit(3)": ("import sys\nsys.exit(3)\n", "exit 3"),
    "raise KeyboardInterrupt": ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
    "raise SystemExit('bye')": ("raise SystemExit('bye')\n", "bye"),
    "a long sleep": ("import time\ntime.sleep(3600)\n", "did not finish within 2 s"),
    "os._exit(0)": ("import os\nos._exit(0)\n", "ended its process (exit 0"),
    "a crash (SIGSEGV)": ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "signal 11"),
}


def build(root: Path, init: str = "__version__ = '2.5.0'\n", origin: bytes | None = b"repo@57b90e0") -> Path:
    package = root / "deep_gemm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    if origin is not None:
        (package / pr.ORIGIN_FILE).write_bytes(origin)
    return root


@pytest.fixture(autouse=True)
def fresh_process():
    """Each test as a fresh process for the PR #340 module (one build a process) and the cached facts."""
    for clear in (pr._LOADED.clear, env_info.environment_facts.cache_clear):
        clear()
    sys.modules.pop(pr.MODULE_NAME, None)
    yield
    pr._LOADED.clear()
    env_info.environment_facts.cache_clear()
    sys.modules.pop(pr.MODULE_NAME, None)


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_build_is_named_and_never_takes_the_process_down(tmp_path, monkeypatch, case: str) -> None:
    """A build that sleeps, exits or raises KeyboardInterrupt at import used to hang the command, end it
    silently or mark it 'interrupted' (only `except Exception` guarded the import)."""
    init, says = HOSTILE[case]
    monkeypatch.setattr(pr, "IMPORT_TIMEOUT_S", 2.0)
    module, why = pr.import_pr340(str(build(tmp_path, init)))
    assert module is None and why.startswith(f"{pr.ENV_VAR}={tmp_path}: importing deep_gemm") and says in why
    assert pr.MODULE_NAME not in sys.modules and not pr._LOADED


def test_a_build_that_raises_in_this_process_is_caught_by_name(tmp_path, monkeypatch) -> None:
    """Past the child's import (which passed), this process's own import: BaseException is caught and named."""
    root = build(tmp_path, "import os\nif os.environ.get('DSA_LAB_TEST_PARENT'):\n    raise KeyboardInterrupt\n")
    monkeypatch.setenv("DSA_LAB_TEST_PARENT", "1")
    monkeypatch.setattr(pr, "_probe", lambda *args: None)
    module, why = pr.import_pr340(str(root))
    assert module is None and "importing deep_gemm failed: KeyboardInterrupt" in why


@pytest.mark.parametrize("case", ["sys.exit(3)", "raise KeyboardInterrupt", "a long sleep"])
def test_a_reference_bench_never_imports_the_build(tmp_path, monkeypatch, capsys, case: str) -> None:
    """DSA_LAB_DEEPGEMM_PR340 used to execute the build in every command that gathers the environment."""
    marker = "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('x')\n"
    root = build(tmp_path / "pr340", marker + HOSTILE[case][0])
    monkeypatch.setenv(pr.ENV_VAR, str(root))
    out = tmp_path / "run"
    assert (
        main(
            [
                "bench",
                "--preset",
                "ci",
                "--batch",
                "1",
                "--context",
                "64",
                "--next-n",
                "1",
                "--strategy",
                "native",
                "--no-progress",
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert not (root / "deep_gemm" / "RAN").exists() and len(store.load_run(out).results) == 1
    assert store.read_provenance(out / store.PROVENANCE_FILE)["environment"]["deepgemm_pr340_origin"] is None


def test_a_second_build_in_one_process_is_refused_by_name(tmp_path) -> None:
    """Build A then build B used to return A's module with B's ORIGIN: provenance named the wrong build."""
    first = build(tmp_path / "a", "__version__ = 'A'\n", b"build-A")
    second = build(tmp_path / "b", "__version__ = 'B'\n", b"build-B")
    module, origin = pr.import_pr340(str(first))
    assert module.__version__ == "A" and origin == "build-A"
    again, why = pr.import_pr340(str(second))
    assert again is None and f"already imported the PR #340 build in {first}" in why and str(second) in why
    assert pr.import_pr340(str(first)) == (module, "build-A")


@pytest.mark.parametrize(
    "origin, folder, shown",
    [
        (b"[bold red]pwned[/] [link=http://x]y[/link]", "pr340", "[bold red]pwned[/]"),
        (b"origin [/x] end", "pr340", "origin [/x] end"),
        (b"plain", "pr340[/x]", "pr340[/x]"),
        (b"\x1b[31mred\x1b[0m build", "pr340", "[31mred [0m build"),
    ],
)
def test_env_shows_an_origin_and_its_folder_as_text(tmp_path, monkeypatch, capsys, origin, folder, shown) -> None:
    """Rich markup in ORIGIN (or a folder named pr340[/x]) used to give a MarkupError traceback in `dsa-lab env`."""
    monkeypatch.setenv(pr.ENV_VAR, str(build(tmp_path / folder, origin=origin)))
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert shown in out and "\x1b[31m" not in out
    assert "env imports that build to report on it" in out


def test_a_non_utf8_origin_names_the_file(tmp_path) -> None:
    """A non-UTF-8 ORIGIN used to give a decode error naming neither the file nor the variable."""
    _, origin = pr.import_pr340(str(build(tmp_path, origin=b"\xff\xfe origin")))
    package = tmp_path / "deep_gemm"
    assert origin == f"unrecorded build ({package}; its {package / 'ORIGIN'} is unreadable: UnicodeDecodeError)"


def test_a_huge_origin_is_cut_to_one_line(tmp_path) -> None:
    _, origin = pr.import_pr340(str(build(tmp_path, origin=b"x" * 100_000 + b"\nsecond line")))
    assert len(origin) < pr.MAX_ORIGIN_CHARS + 20 and origin.endswith("... (cut)") and "\n" not in origin


def test_a_long_utf8_origin_is_cut_between_characters(tmp_path) -> None:
    _, origin = pr.import_pr340(str(build(tmp_path, origin=("é" * 5000).encode())))
    assert origin == "é" * pr.MAX_ORIGIN_CHARS + " ... (cut)"
