"""The command line's grammar: every command's --help, one list syntax, flags that mean nothing without
another, seeds and devices named when refused."""

from __future__ import annotations

import json
from pathlib import Path

from tests.battery import CLEAR, FAST_BENCH, FAST_PROFILE, UNCLEAR, WRONG, Result, case, cli_refused, run_cli

AREA = "cli"
FAST = [*FAST_BENCH, "--next-n", "1"]
PROFILE = FAST_PROFILE
COMMANDS = ("env", "policy", "bench", "profile", "compare", "runs", "model", "report")

for _command in COMMANDS:

    def _help(tmp: Path, command: str = _command) -> Result:
        done = run_cli([command, "--help"])
        if done.raised is not None:
            return Result(UNCLEAR, f"--help crashed: {type(done.raised).__name__}: {str(done.raised)[:200]}")
        return Result(CLEAR, "help") if done.code == 0 and "usage:" in done.out else Result(UNCLEAR, done.err[-200:])

    case(AREA, f"{_command} --help")(_help)


def _bench(tmp: Path, *flags: str, names: tuple[str, ...]) -> Result:
    def stray() -> str | None:
        written = [p for p in tmp.rglob("provenance.json")]
        return f"a run was written: {written}" if written else None

    return cli_refused([*FAST, "--root", str(tmp / "root"), *flags], *names, harm=stray)


BENCH_FLAGS = {
    "--retry-errors without --resume": (["--retry-errors"], ("--retry-errors", "--resume")),
    "--seed 2**70": (["--seed", str(2**70)], ("seed",)),
    "--seed -1": (["--seed", "-1"], ("seed",)),
    "--seed 1.5": (["--seed", "1.5"], ("--seed",)),
    "--next-n 0x2": (["--next-n", "0x2"], ("--next-n",)),
    "--next-n 2;3": (["--next-n", "2;3"], ("--next-n",)),
    "--batch 1e3": (["--batch", "1e3"], ("--batch",)),
    "--batch 4097": (["--batch", "4097"], ("batch",)),
    "--batch -1": (["--batch", "-1"], ("batch",)),
    "--batch ²": (["--batch", "²"], ("--batch",)),
    "--strategy ALL": (["--strategy", "ALL"], ("strategy",)),
    "--strategy native;flatten": (["--strategy", "native;flatten"], ("strategy",)),
    "--backend reference,nope": (["--backend", "reference,nope"], ("nope",)),
    "--cache-dtype FP8": (["--cache-dtype", "FP8"], ("cache_dtype",)),
    "--head-dim 96": (["--head-dim", "96"], ("head_dim",)),
    "--device cuda:-1": (["--device", "cuda:-1"], ("--device",)),
    "--device ' cpu'": (["--device", " cpu"], ("--device",)),
    "--device CPU": (["--device", "CPU"], ("--device",)),
    "--device cuda:0 without a GPU": (["--device", "cuda:0"], ("--device",)),
    "--device mps": (["--device", "mps"], ("--device",)),
    "--preset unknown": (["--preset", "huge"], ("--preset",)),
    "--max-points 1.5": (["--max-points", "1.5"], ("--max-points",)),
    "--context mixed:64": (["--context", "mixed:64"], ("context",)),
    "--context 64,,": (["--context", ",,"], ("--context",)),
    "--run-id with --out": (["--run-id", "x", "--out", "y"], ("--run-id", "--out")),
}
for _label, (_flags, _names) in BENCH_FLAGS.items():
    case(AREA, f"bench {_label}")(lambda tmp, f=_flags, n=_names: _bench(tmp, *f, names=n))


@case(AREA, "bench --batch '1, 2' (spaces around commas) reads 1 and 2")
def _(tmp: Path) -> Result:
    done = run_cli([*FAST[:-2], "--max-seconds-per-point", "0.01", "--batch", "1, 2", "--dry-run"])
    return Result(CLEAR, done.out.strip()[:100]) if done.code == 0 else Result(UNCLEAR, done.err[-200:])


@case(AREA, "bench --next-n with Arabic-Indic digits is refused or read as those numbers")
def _(tmp: Path) -> Result:
    done = run_cli([*FAST, "--next-n", "٢", "--dry-run"])
    if done.code == 0:
        return (
            Result(CLEAR, "read")
            if "2 points" in done.out or done.out.startswith("1 points")
            else Result(WRONG, done.out[:200])
        )
    return Result(CLEAR, done.err.strip()[:200]) if "--next-n" in done.err else Result(UNCLEAR, done.err[-200:])


PROFILE_FLAGS = {
    "--tool ''": (["--tool", ""], ("--tool",)),
    "--tool torch,perf": (["--tool", "torch,perf"], ("perf",)),
    "--topk 10**9": (["--topk", str(10**9)], ("topk",)),
    "--repeats 10**7": (["--repeats", str(10**7)], ("repeats",)),
    "--repeats -1": (["--repeats", "-1"], ("repeats",)),
    "--ncu-timeout nan": (["--ncu-timeout", "nan"], ("--ncu-timeout",)),
    "--torch-budget inf": (["--torch-budget", "inf"], ("--torch-budget",)),
    "--seed 2**70": (["--seed", str(2**70)], ("seed",)),
    "--resume (a bench flag)": (["--resume"], ("--resume",)),
}
for _label, (_flags, _names) in PROFILE_FLAGS.items():

    def _profile(tmp: Path, flags=_flags, names=_names) -> Result:
        def stray() -> str | None:
            written = [p for p in tmp.rglob("provenance.json")]
            return f"a run was written: {written}" if written else None

        return cli_refused([*PROFILE, *flags, "--root", str(tmp / "root")], *names, harm=stray)

    case(AREA, f"profile {_label}")(_profile)


OTHER = {
    "no command": ([], ("COMMAND",)),
    "an unknown command": (["benchmark"], ("benchmark",)),
    "model --next-n 1,x": (["model", "--next-n", "1,x"], ("--next-n",)),
    "policy --next-n-max 0": (["policy", "--next-n-max", "0"], ("next_n_max",)),
    "policy --next-n-max 10**6": (["policy", "--next-n-max", str(10**6)], ("next_n_max",)),
    "policy --policy nope": (["policy", "--policy", "nope"], ("--policy",)),
    "runs --root a file": (["runs", "--root", "{tmp}/afile"], ("afile",)),
    "compare with one run": (["compare", "x"], ("run_b",)),
    "compare --top 1.5": (["compare", "a", "b", "--top", "1.5"], ("--top",)),
}
for _label, (_argv, _names) in OTHER.items():

    def _other(tmp: Path, argv=_argv, names=_names) -> Result:
        (tmp / "afile").write_text("x")
        return cli_refused([a.format(tmp=tmp) for a in argv], *names)

    case(AREA, _label)(_other)


@case(AREA, "model --next-n 1,3,99: the grid is modeled and next_n=99 listed as not modeled, with why")
def _(tmp: Path) -> Result:
    done = run_cli(["model", "--next-n", "1,3,99", "--json"])
    if done.raised is not None or done.code != 0:
        return Result(UNCLEAR, f"exit {done.code}: {(done.err or str(done.raised))[-200:]}")
    rows = [json.loads(line) for line in done.out.splitlines() if line.strip()]
    refused = [row for row in rows if "refused" in row]
    modeled = sorted(row["next_n"] for row in rows if "refused" not in row)
    if modeled != [1, 3] or [row["next_n"] for row in refused] != [99]:
        return Result(WRONG, f"modeled {modeled}, refused {[row['next_n'] for row in refused]}")
    return (
        Result(CLEAR, refused[0]["refused"][:150])
        if "next_n=99" in refused[0]["refused"]
        else Result(UNCLEAR, f"the refusal does not name next_n: {refused[0]['refused'][:150]}")
    )


@case(AREA, "dsa-lab --version imports no torch")
def _(tmp: Path) -> Result:
    import subprocess
    import sys

    code = (
        "import sys\nfrom dsa_lab.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
        "print('TORCH', 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return Result(CLEAR, "no torch") if "TORCH False" in done.stdout else Result(UNCLEAR, done.stdout[-200:])
