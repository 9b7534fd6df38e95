"""DeepGEMM PR #340 builds: foreign code runs only when asked, bounded, one build a process, its origin shown
as text."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

from tests.battery import CLEAR, UNCLEAR, WRONG, Hung, Result, case, environment, run_cli

AREA = "pr340"


def build(
    root: Path, init: str = "__version__ = '2.5.0'\n", origin: bytes | None = b"deepseek-ai/DeepGEMM@57b90e0 (test)"
) -> Path:
    package = root / "deep_gemm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    if origin is not None:
        (package / "ORIGIN").write_bytes(origin)
    return root


def fresh(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """`code` in a new Python process (the PR #340 module is imported once a process)."""
    import os

    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
    )


HOSTILE = {
    "sys.exit(3)": "import sys\nsys.exit(3)\n",
    "raise KeyboardInterrupt": "raise KeyboardInterrupt\n",
    "raise SystemExit": "raise SystemExit('bye')\n",
    "a long sleep": "import time\ntime.sleep(3600)\n",
    "os._exit(0)": "import os\nos._exit(0)\n",
    "raise MemoryError": "raise MemoryError\n",
    "print to stdout": "print('HELLO FROM PR340')\n",
}
BENCH = (
    "from dsa_lab.cli import main; import sys; sys.exit(main(['bench', '--preset', 'ci', '--batch', '1', '--context', '64', "
    "'--next-n', '1', '--strategy', 'native', '--no-progress', '--device', 'cpu', '--out', {out!r}]))"
)
FATAL = ("os._exit(0)",)  # what no process survives: tried in a child process, the others in this one


def forget_builds() -> None:
    """This process as a fresh one for the PR #340 module (it imports one build a process)."""
    import dsa_lab.kernels.deepgemm_pr340 as pr
    from dsa_lab import env_info

    getattr(pr, "_LOADED", {}).clear()
    sys.modules.pop(pr.MODULE_NAME, None)
    env_info.environment_facts.cache_clear()


def _bench_here(out: Path, root: Path) -> tuple[int | None, str]:
    printed = io.StringIO()
    forget_builds()
    try:
        with environment(DSA_LAB_DEEPGEMM_PR340=str(root)), contextlib.redirect_stdout(printed):
            done = run_cli(
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
    finally:
        forget_builds()
    return (None if done.raised is not None else done.code), printed.getvalue() + done.out


for _label, _init in HOSTILE.items():

    def _reference_bench(tmp: Path, init: str = _init, label: str = _label) -> Result:
        root = build(tmp / "pr340", init)
        out = tmp / "run"
        if label in FATAL:
            try:
                done = fresh(BENCH.format(out=str(out)), {"DSA_LAB_DEEPGEMM_PR340": str(root)}, timeout=60)
            except subprocess.TimeoutExpired:
                return Result(WRONG, "a reference-only bench hung inside the build's import")
            code, printed = done.returncode, done.stdout
        else:
            code, printed = _bench_here(out, root)
        ran = (out / "results.parquet").is_file()
        if code == 0 and ran and "HELLO FROM PR340" not in printed:
            return Result(CLEAR, "the reference bench never ran the build")
        return Result(WRONG, f"a reference-only bench exit {code}, results {ran}")

    case(AREA, f"a reference-only CPU bench with a PR #340 build that does {_label} at import", timeout_s=90)(
        _reference_bench
    )

    def _asked(tmp: Path, init: str = _init, label: str = _label) -> Result:
        import dsa_lab.kernels.deepgemm_pr340 as pr

        root = build(tmp / "pr340", init)
        if label in FATAL:
            code = (
                "import dsa_lab.kernels.deepgemm_pr340 as pr\npr.IMPORT_TIMEOUT_S = 3\n"
                "module, why = pr.import_pr340()\nprint('RESULT', module is None, why)"
            )
            try:
                done = fresh(code, {"DSA_LAB_DEEPGEMM_PR340": str(root)}, timeout=30)
            except subprocess.TimeoutExpired:
                return Result(UNCLEAR, "the import hung")
            line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT")), None)
            if line is None:
                return Result(WRONG, f"the process ended inside the import: exit {done.returncode}")
            module_none, why = line.split()[1] == "True", line
        else:
            forget_builds()
            previous = getattr(pr, "IMPORT_TIMEOUT_S", None)
            pr.IMPORT_TIMEOUT_S = 3
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    module, why = pr.import_pr340(str(root))
                module_none = module is None
            except Hung:
                raise
            except BaseException as err:  # SystemExit, KeyboardInterrupt... escaping the import
                return Result(WRONG, f"{type(err).__name__} escaped the import")
            finally:
                pr.IMPORT_TIMEOUT_S = previous
                forget_builds()
        if label == "print to stdout":
            return Result(CLEAR, why[:200]) if not module_none else Result(UNCLEAR, f"a harmless build refused: {why}")
        if module_none and "DSA_LAB_DEEPGEMM_PR340" in why:
            return Result(CLEAR, why[:200])
        return Result(UNCLEAR, why[:200])

    case(AREA, f"importing a PR #340 build that does {_label} is bounded and named", timeout_s=60)(_asked)


@case(AREA, "a second build in one process is refused by name")
def _(tmp: Path) -> Result:
    import dsa_lab.kernels.deepgemm_pr340 as pr

    first = build(tmp / "a", "__version__ = 'A'\n", b"build-A")
    second = build(tmp / "b", "__version__ = 'B'\n", b"build-B")
    forget_builds()
    try:
        (m1, o1), (m2, o2) = pr.import_pr340(str(first)), pr.import_pr340(str(second))
    finally:
        forget_builds()
    if m2 is not None and o2 == "build-B" and getattr(m2, "__version__", None) == "A":
        return Result(WRONG, "build A's module with build B's origin")
    if m1 is not None and m2 is None and str(second) in o2:
        return Result(CLEAR, o2[:200])
    return Result(UNCLEAR, f"{o1[:100]} | {o2[:100]}")


@case(AREA, "the same build asked for twice is one import")
def _(tmp: Path) -> Result:
    import builtins

    import dsa_lab.kernels.deepgemm_pr340 as pr

    root = build(tmp / "a", "import builtins\nbuiltins.PR340_COUNT = getattr(builtins, 'PR340_COUNT', 0) + 1\n")
    forget_builds()
    builtins.PR340_COUNT = 0
    try:
        pr.import_pr340(str(root))
        pr.import_pr340(str(root))
        count = builtins.PR340_COUNT
    finally:
        forget_builds()
        del builtins.PR340_COUNT
    return Result(CLEAR, "once") if count == 1 else Result(UNCLEAR, f"imported {count} times in this process")


def env_output(tmp: Path, origin: bytes | None, folder: str = "pr340") -> tuple[int, str, str]:
    root = build(tmp / folder, origin=origin)
    forget_builds()  # one build a process: each case stands for a fresh process
    try:
        with environment(DSA_LAB_DEEPGEMM_PR340=str(root)):
            done = run_cli(["env"])
    finally:
        forget_builds()
    if done.raised is not None:
        return -1, "", f"{type(done.raised).__name__}: {done.raised}"
    return done.code or 0, done.out, done.err


for _label, _origin, _folder, _shown in (
    ("rich markup in ORIGIN", b"[bold red]pwned[/] [link=http://x]y[/link]", "pr340", "[bold red]pwned[/]"),
    ("a closing tag in ORIGIN", b"origin [/x] end", "pr340", "[/x]"),
    ("a folder named pr340[/x]", b"plain", "pr340[/x]", "pr340[/x]"),
    ("ANSI escapes in ORIGIN", b"\x1b[31mred\x1b[0m build", "pr340", "build"),
):

    def _env(tmp: Path, origin=_origin, folder=_folder, shown=_shown) -> Result:
        code, out, err = env_output(tmp, origin, folder)
        if code != 0:
            return Result(UNCLEAR, f"env failed: {err[-300:]}")
        if "\x1b[31m" in out:
            return Result(WRONG, "raw terminal escapes from ORIGIN printed")
        flat = " ".join(out.split())
        return (
            Result(CLEAR, "shown as text")
            if shown in flat or shown.replace(" ", "") in flat.replace(" ", "")
            else Result(WRONG, f"{shown!r} not shown as text (interpreted as markup)")
        )

    case(AREA, f"env with {_label}")(_env)


@case(AREA, "a non-UTF-8 ORIGIN names the file")
def _(tmp: Path) -> Result:
    code, out, err = env_output(tmp, b"\xff\xfe origin")
    if code != 0:
        return Result(UNCLEAR, f"env failed: {err[-300:]}")
    return Result(CLEAR, "named") if "ORIGIN" in out else Result(UNCLEAR, "the ORIGIN problem is not named")


@case(AREA, "a huge ORIGIN is cut, not pasted whole into provenance")
def _(tmp: Path) -> Result:
    import dsa_lab.kernels.deepgemm_pr340 as pr

    root = build(tmp / "pr340", origin=b"x" * 5_000_000)
    forget_builds()
    try:
        _, origin = pr.import_pr340(str(root))
    finally:
        forget_builds()
    return Result(CLEAR, f"{len(origin)} chars") if len(origin) < 10_000 else Result(WRONG, f"{len(origin)} chars")


for _label, _setup, _names in (
    ("a folder that does not exist", lambda tmp: tmp / "nowhere", ("DSA_LAB_DEEPGEMM_PR340", "nowhere")),
    ("a file", lambda tmp: (tmp / "f").write_text("x") and tmp / "f", ("DSA_LAB_DEEPGEMM_PR340",)),
    (
        "deep_gemm a file",
        lambda tmp: ((tmp / "p").mkdir(), (tmp / "p" / "deep_gemm").write_text("x"), tmp / "p")[2],
        ("deep_gemm/__init__.py",),
    ),
    ("a relative path", lambda tmp: Path("relative-nowhere"), ("relative-nowhere",)),
):

    def _bad_root(tmp: Path, setup=_setup, names=_names) -> Result:
        import dsa_lab.kernels.deepgemm_pr340 as pr

        module, why = pr.import_pr340(str(setup(tmp)))
        if module is not None:
            return Result(WRONG, "imported")
        missing = [n for n in names if n not in why]
        return Result(UNCLEAR, f"not naming {missing}: {why}") if missing else Result(CLEAR, why[:200])

    case(AREA, f"DSA_LAB_DEEPGEMM_PR340 is {_label}")(_bad_root)


@case(AREA, "environment_facts() without the backend asked for does not import the build")
def _(tmp: Path) -> Result:
    from dsa_lab.env_info import environment_facts

    root = build(tmp / "pr340", "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('x')\n")
    forget_builds()
    try:
        with environment(DSA_LAB_DEEPGEMM_PR340=str(root)):
            environment_facts()
    finally:
        forget_builds()
    ran = (root / "deep_gemm" / "RAN").exists()
    return Result(WRONG, "imported without being asked") if ran else Result(CLEAR, "not run")


@case(AREA, "`dsa-lab env` says that it imports the build")
def _(tmp: Path) -> Result:
    code, out, err = env_output(tmp, b"origin-x")
    if code != 0:
        return Result(UNCLEAR, err[-300:])
    text = " ".join(out.split()).lower()
    return (
        Result(CLEAR, "said")
        if "import" in text and "pr340" in text and "dsa_lab_deepgemm_pr340" in text
        else Result(UNCLEAR, "env does not say that it ran the build's import")
    )
