"""Names checked before the first point (issue 29): a backend, a run folder or a top-k implementation a run
could not be read back with is refused before anything is measured."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.battery import CLEAR, UNCLEAR, Result, case, cli_refused, refused, run_cli
from tests.battery.gate_support import NAMES, _base, _spec, bench_argv, plugin

# ---------------------------------------------------------------- names checked before the first point

BAD_NAMES = ("my kernel<b>", "a,b", "", " lead", "-lead", "..", "a|b", "a=b", "a/b", "ünï", "x" * 129, "a\nb")


def _no_run(tmp: Path) -> Callable[[], str | None]:
    def check() -> str | None:
        points = list(tmp.rglob("points.jsonl"))
        return f"points were measured: {points}" if points else None

    return check


for _bad in BAD_NAMES:

    def _plugged_name(tmp: Path, bad: str = _bad) -> Result:
        with plugin(tmp, "", name=bad) as (path, name):
            return cli_refused(bench_argv(tmp, path, "reference"), "not a plain name", harm=_no_run(tmp))

    case(NAMES, f"a plug-in registering the backend {_bad[:20]!r} is refused at registration")(_plugged_name)

    def _direct_name(tmp: Path, bad: str = _bad) -> Result:
        """Registered without the plug-in loader (a notebook's own class): the sweep refuses it before measuring."""
        from dsa_lab.bench.sweep import run_sweep
        from dsa_lab.kernels import registry

        cls = type("Direct", (_base(),), {"name": bad, "family": "direct", "label": "Direct"})
        try:
            registry.register_backend(cls)
        except ValueError as err:  # refused at registration: clear too
            return Result(CLEAR, str(err)[:200])
        try:
            return refused(lambda: run_sweep(_spec(bad), tmp / "run", "cpu", progress=False), "backend",
                           harm=_no_run(tmp))  # fmt: skip
        finally:
            registry.forget_backends((bad,))

    case(NAMES, f"a backend named {_bad[:20]!r} registered directly is refused before the first point")(_direct_name)

for _bad in ("my run", "a<b>", "a|b", "x" * 129, "-x", "ünï", "a\tb"):

    def _out_name(tmp: Path, bad: str = _bad) -> Result:
        argv = ["bench", "--backend", "reference", "--batch", "1", "--context", "64", "--next-n", "1",
                "--strategy", "native", "--device", "cpu", "--no-progress", "--out", str(tmp / "scratch" / bad)]  # fmt: skip
        return cli_refused(argv, "--out", "run id", harm=_no_run(tmp))

    case(NAMES, f"bench --out .../{_bad[:20]!r} (not a run id) is refused before the first point")(_out_name)

    def _api_name(tmp: Path, bad: str = _bad) -> Result:
        from dsa_lab.bench.sweep import run_sweep

        return refused(lambda: run_sweep(_spec("reference"), tmp / bad, "cpu", progress=False), "run id",
                       harm=_no_run(tmp))  # fmt: skip

    case(NAMES, f"run_sweep into a folder named {_bad[:20]!r} is refused before the first point")(_api_name)


@case(NAMES, "profile --out .../'my run' is refused before its first point")
def _(tmp: Path) -> Result:
    argv = ["profile", "--tool", "torch", "--device", "cpu", "--batch", "1", "--context", "64", "--next-n", "1",
            "--no-trace", "--out", str(tmp / "my run")]  # fmt: skip
    return cli_refused(argv, "--out", harm=_no_run(tmp))


@case(NAMES, "bench --out ending in '..' is refused")
def _(tmp: Path) -> Result:
    return cli_refused(["bench", "--device", "cpu", "--dry-run", "--out", f"{tmp}/x/.."], "--out", "run id")


# ---------------------------------------------------------------- the top-k registry's names

for _impl in ("nope", "<b>", "", "torch,", "vllm|x", "Torch"):

    def _topk_name(tmp: Path, impl: str = _impl) -> Result:
        argv = ["bench", "--backend", "reference", "--batch", "1", "--context", "64", "--next-n", "1",
                "--strategy", "native", "--timed", "logits+topk", "--topk-impl", impl, "--device", "cpu",
                "--no-progress", "--out", str(tmp / "run")]  # fmt: skip
        if impl == "torch,":  # an empty item after a comma: one list syntax reads it as 'torch' or refuses it
            done = run_cli([*argv, "--dry-run"])
            return Result(CLEAR, "read or refused") if done.raised is None else Result(UNCLEAR, repr(done.raised))
        return cli_refused(argv, "topk", harm=_no_run(tmp))

    case(NAMES, f"bench --topk-impl {_impl!r} is refused by name before the first point")(_topk_name)
