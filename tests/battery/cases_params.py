"""The cases issue 29 found unclear, made clear: papermill parameters checked in each notebook's own cell, plug-in
imports under a time limit and named when they fail, seeds through check_seed, and public helpers that name the
argument they refuse (quantisation at head_dim 0, a q with an empty dimension, policy functions given None, an
unknown release or acceptance preset, a decode step no model has)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.battery import CLEAR, UNCLEAR, Result, case, cli_refused, environment, refused

PARAMS, PLUGINS, INPUTS = "params", "plugins", "inputs"
REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


# ---------------------------------------------------------------- papermill parameters, as papermill runs them


def _cells(path: Path) -> tuple[str, str]:
    """The notebook's parameters cell and the cell after it (papermill injects its values between the two)."""
    import nbformat

    cells = nbformat.read(path, as_version=4).cells
    at = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
    return cells[at].source, cells[at + 1].source


def _declared(path: Path) -> dict[str, str]:
    """name -> declared type of each parameter of the notebook (what `papermill --help-notebook` lists)."""
    tree = ast.parse(_cells(path)[0])
    return {node.target.id: ast.unparse(node.annotation) for node in tree.body if isinstance(node, ast.AnnAssign)}


def _papermill(path: Path, name: str, value: Any) -> Result:
    """The parameters cell, papermill's injected assignment, then the notebook's own next cell."""
    parameters, following = _cells(path)
    namespace: dict[str, Any] = {}

    def run() -> None:
        exec(compile(parameters, "parameters", "exec", dont_inherit=True), namespace)
        exec(compile(f"{name} = {value!r}", "injected-parameters", "exec", dont_inherit=True), namespace)
        exec(compile(following, "the next cell", "exec", dont_inherit=True), namespace)

    return refused(run, name, types=(ValueError,))


BAD = {  # a declared type -> values of another type, or past any length, whatever the parameter
    "int": (True, "128"),
    "str": (5, "x" * 5000),
    "bool": ("no", 1),
    "list[str]": ("B200", ["B200", 7]),
    "list[int]": (4, [1, "2"]),
}
BAD_BY_NAME = {  # values of the right type a parameter of this name cannot take
    "batch": (0, 4097),
    "headline_batch": (0, -1),
    "cpu_batch": (0,),
    "focus_batch": (-1, 10**9),
    "context": ("nope", "mixed:64", "0", "lognormal:8K:9"),
    "headline_context": ("64KB", ""),
    "cpu_context": (0, -64),
    "seed": (-1, 2**63, 2**64),
    "device": ("tpu", "cuda:-1", "CPU"),
    "run_device": ("h200/..", "<b>", ""),
    "candidate_backend": ("nope", "", "a,b"),
    "baseline_backend": ("<img>",),
    "decision_backend": ("deepgemm ",),
    "fresh_preset": ("huge", "CI"),
    "preset": ("unknown", ""),
    "modeled_gpus": (["Z9"], ["B200", "h200"]),
    "cpu_next_n": ([0], [17], [1, -1]),
    "diagram_next_n": (0, 99),
    "diagram_tiles": (0, 10**6),
    "focus_next_n": (0, 17),
    "timeline_call": ("call 6", "../call6"),
    "run_path": ("h200/h200-full-20261129/results.parquet",),
    "profile_path": ("h200/h200-full-20261129/provenance.json",),
}
_SEEN: set[str] = set()
for _path in NOTEBOOKS:  # every parameter of every notebook one value of another type; the rest once per name
    for _name, _type in _declared(_path).items():
        _values = BAD[_type] if _name not in _SEEN else BAD[_type][:1]
        _values += BAD_BY_NAME.get(_name, ()) if _name not in _SEEN else ()
        _SEEN.add(_name)
        for _value in _values:
            case(PARAMS, f"{_path.stem}: -p {_name} {str(_value)[:30]!r} is refused in the notebook's own cell")(
                lambda tmp, p=_path, n=_name, v=_value: _papermill(p, n, v)
            )


@case(PARAMS, "every notebook's defaults pass its own check")
def _(tmp: Path) -> Result:
    for path in NOTEBOOKS:
        parameters, following = _cells(path)
        namespace: dict[str, Any] = {}
        try:
            exec(compile(parameters, "parameters", "exec", dont_inherit=True), namespace)
            exec(compile(following, "the next cell", "exec", dont_inherit=True), namespace)
        except Exception as err:
            return Result(UNCLEAR, f"{path.name}'s defaults refused: {type(err).__name__}: {str(err)[:200]}")
    return Result(CLEAR, "defaults pass")


@case(PARAMS, "a run_path that is a loop of symbolic links is named as such, not called absent")
def _(tmp: Path) -> Result:
    (tmp / "a").symlink_to(tmp / "b")
    (tmp / "b").symlink_to(tmp / "a")
    return _papermill(NOTEBOOKS[0], "run_path", str(tmp / "a"))


for _expression in ("+".join(["1"] * 300_000), "-" * 300_000 + "1", "1" + "*1" * 300_000):

    def _report_parameter(tmp: Path, expression: str = _expression) -> Result:
        return cli_refused(["report", "--only", "00", "--out", str(tmp / "out"), "-p", f"batch={expression}"], "batch")

    case(PARAMS, f"report -p batch={_expression[:12]}... ({len(_expression)} characters) is refused by name")(
        _report_parameter
    )


# ---------------------------------------------------------------- plug-in modules that hang, interrupt or mislead


def _module(tmp: Path, text: str | bytes, name: str = "mine.py") -> Path:
    path = tmp / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _plugged(tmp: Path, path: Path, *names: str, timeout: str = "1") -> Result:
    from dsa_lab.kernels import external, registry

    before = set(registry.backend_names())
    with environment(**{external.TIMEOUT_VAR: timeout}):
        result = cli_refused(["bench", "--backend-module", str(path), "--dry-run"], "--backend-module", *names)
    left = set(registry.backend_names()) - before
    registry.forget_backends(tuple(left))
    return Result(UNCLEAR, f"left registered: {left}") if left and result.outcome == CLEAR else result


REGISTERS = (
    "from dsa_lab.kernels.registry import register_backend\n"
    "from dsa_lab.kernels.reference import ReferenceBackend\n"
    "@register_backend\nclass Mine(ReferenceBackend):\n    name, family, label, baseline = {name!r}, 'm', 'M', False\n"
)
MODULES = {
    "sleeps forever at import": ("import time\nwhile True:\n    time.sleep(0.05)\n", "still running after 1 s"),
    "loops forever at import": ("while True:\n    pass\n", "still running after 1 s"),
    "loops and swallows every Exception": (
        "while True:\n    try:\n        pass\n    except Exception:\n        pass\n",
        "still running after 1 s",
    ),  # fmt: skip
    "waits on a lock forever": ("import threading\nthreading.Event().wait()\n", "still running after 1 s"),
    "raises KeyboardInterrupt at import": ("raise KeyboardInterrupt\n", "interrupted (KeyboardInterrupt)"),
    "calls sys.exit(0) at import": ("import sys\nsys.exit(0)\n", "SystemExit"),
    "raises GeneratorExit at import": ("raise GeneratorExit\n", "GeneratorExit"),
    "registers a backend named 'my kernel<b>'": (REGISTERS.format(name="my kernel<b>"), "not a plain name"),
    "registers a backend named 'a,b'": (REGISTERS.format(name="a,b"), "not a plain name"),
    "registers a backend named ''": (REGISTERS.format(name=""), "not a plain name"),
    "registers a backend named 'a|b' (a key separator)": (REGISTERS.format(name="a|b"), "not a plain name"),
    "registers a backend named 'x=y' (a key separator)": (REGISTERS.format(name="x=y"), "not a plain name"),
    "is binary garbage": (bytes(range(256)), "importing it failed"),
    "holds a NUL byte": ("x = 1\0\n", "importing it failed"),
}
for _label, (_text, _says) in MODULES.items():
    case(PLUGINS, f"--backend-module that {_label} is one line naming it")(
        lambda tmp, t=_text, s=_says: _plugged(tmp, _module(tmp, t), s)
    )


@case(PLUGINS, "--backend-module given a folder says it is a folder")
def _(tmp: Path) -> Result:
    (tmp / "mine").mkdir()
    return _plugged(tmp, tmp / "mine", "is a folder")


@case(PLUGINS, "--backend-module given a loop of links says so, not 'no such file'")
def _(tmp: Path) -> Result:
    (tmp / "a.py").symlink_to(tmp / "b.py")
    (tmp / "b.py").symlink_to(tmp / "a.py")
    return _plugged(tmp, tmp / "a.py", "loop of symbolic links")


@case(PLUGINS, "--backend-module given a dangling link says no such file")
def _(tmp: Path) -> Result:
    (tmp / "a.py").symlink_to(tmp / "gone.py")
    return _plugged(tmp, tmp / "a.py", "no such file")


@case(PLUGINS, "--backend-module given a file that is not .py says so")
def _(tmp: Path) -> Result:
    return _plugged(tmp, _module(tmp, "x = 1\n", "mine.txt"), "not a Python file")


for _limit in ("soon", "0", "-1", "inf", "nan", ""):

    def _bad_limit(tmp: Path, limit: str = _limit) -> Result:
        from dsa_lab.kernels import external

        path = _module(tmp, REGISTERS.format(name=f"limit-{abs(hash(limit))}"))
        with environment(**{external.TIMEOUT_VAR: limit}):
            if limit == "":  # unset in effect: the default limit, and the module loads
                try:
                    names = external.load_backend_file(path)
                except Exception as err:
                    return Result(UNCLEAR, f"{type(err).__name__}: {err}")
                from dsa_lab.kernels import registry

                registry.forget_backends(names)
                return Result(CLEAR, "the default limit")
            return cli_refused(["bench", "--backend-module", str(path), "--dry-run"], external.TIMEOUT_VAR)

    case(PLUGINS, f"DSA_LAB_IMPORT_TIMEOUT_S={_limit!r} is refused by name (or the default when empty)")(_bad_limit)


@case(PLUGINS, "an import under the time limit keeps an outer timer running")
def _(tmp: Path) -> Result:
    import signal

    from dsa_lab.kernels import external, registry

    left, _ = signal.getitimer(signal.ITIMER_REAL)  # the battery's own case timer
    names = external.load_backend_file(_module(tmp, REGISTERS.format(name="timer-kept")))
    registry.forget_backends(names)
    now, _ = signal.getitimer(signal.ITIMER_REAL)
    return Result(CLEAR, f"{left:.1f} s -> {now:.1f} s") if 0 < now <= left else Result(UNCLEAR, f"{left} -> {now}")


# ---------------------------------------------------------------- seeds, and helpers that name what they refuse


def _seeded(call: Callable[[], object]) -> Result:
    return refused(call, "seed", types=(ValueError,))


SEEDS = {
    "lognormal contexts, seed 2**64": lambda: _context("lognormal:8K:1.5").seq_lens(4, 2**64),
    "lognormal contexts, seed 2**63": lambda: _context("lognormal:8K:1.5").seq_lens(4, 2**63),
    "lognormal contexts, seed -1": lambda: _context("lognormal:8K:1.5").seq_lens(4, -1),
    "mixed contexts, seed 2**64": lambda: _context("mixed:1K-8K").seq_lens(4, 2**64),
    "acceptance draw, seed 2**64": lambda: _acceptance("v3-report").decode_lens(4, 2, 2**64),
    "acceptance draw, seed 2**63": lambda: _acceptance("v3-report").decode_lens(4, 2, 2**63),
    "acceptance draw, seed -1": lambda: _acceptance("v3-report").decode_lens(4, 2, -1),
    "every-draft acceptance, seed -1": lambda: _acceptance("none").decode_lens(4, 2, -1),
    "acceptance draw, seed 1.5": lambda: _acceptance("v3-report").decode_lens(4, 2, 1.5),
}


def _context(label: str) -> Any:
    from dsa_lab.batch.workload import ContextSpec

    return ContextSpec.parse(label)


def _acceptance(label: str) -> Any:
    from dsa_lab.batch.acceptance import AcceptanceSpec

    return AcceptanceSpec.parse(label)


for _label, _call in SEEDS.items():
    case(INPUTS, f"{_label} is refused naming seed")(lambda tmp, c=_call: _seeded(c))


@case(INPUTS, "the top seed 2**63 - 1 draws lognormal contexts and acceptance")
def _(tmp: Path) -> Result:
    top = 2**63 - 1
    _context("lognormal:8K:1.5").seq_lens(4, top)
    _acceptance("v3-report").decode_lens(4, 2, top)
    return Result(CLEAR, "drawn")


def _q(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.zeros(shape).to(torch.float8_e4m3fn)


def _reference_call(q: torch.Tensor) -> object:
    from dsa_lab.kernels import get_backend

    batch, next_n = q.shape[0], q.shape[1]
    cache = torch.zeros(2, 64, 1, 68, dtype=torch.uint8)
    return get_backend("reference").logits(
        q,
        cache,
        torch.zeros(batch * next_n, q.shape[2]),
        torch.ones(batch, next_n, dtype=torch.int32),
        torch.zeros(batch, 1, dtype=torch.int32),
        64,
        cache_dtype="fp8",
    )


HELPERS: dict[str, tuple[Callable[[], object], tuple[str, ...]]] = {
    "quantize_fp8 at head_dim 0": (lambda: _cache().quantize_fp8(torch.zeros(4, 0)), ("k", "head_dim")),
    "quantize_mxfp4 at head_dim 0": (lambda: _cache().quantize_mxfp4(torch.zeros(4, 0)), ("k", "head_dim")),
    "quantize_fp8 of no tokens at head_dim 0": (lambda: _cache().quantize_fp8(torch.zeros(0, 0)), ("k",)),
    "the reference at next_n 0": (lambda: _reference_call(_q((2, 0, 32, 64))), ("q", "next_n")),
    "the reference at batch 0": (lambda: _reference_call(_q((0, 1, 32, 64))), ("q", "batch")),
    "the reference at heads 0": (lambda: _reference_call(_q((2, 1, 0, 64))), ("q", "heads")),
    "an unknown release's reading": (lambda: _reading("vllm_9_9"), ("release", "vllm_0_33_0")),
    "an unknown acceptance preset's throughput": (lambda: _throughput("nope"), ("preset",)),
    "a decode step at batch 0": (lambda: _step(batch=0), ("batch",)),
    "a decode step at next_n 0": (lambda: _step(next_n=0), ("next_n",)),
    "a decode step at context 0": (lambda: _step(context=0), ("context",)),
    "a decode step of an unknown strategy": (lambda: _step(label="diagonal"), ("strategy",)),
    "a decode step at batch 1.5": (lambda: _step(batch=1.5), ("batch",)),
}


def _cache() -> Any:
    from dsa_lab.batch import cache

    return cache


def _reading(release: str) -> object:
    from dsa_lab.analysis.readings import decision_reading
    from dsa_lab.batch.workload import uniform_batch
    from dsa_lab.policy.query import Platform

    return decision_reading(release, Platform("sm90", True), uniform_batch(1, 64, 1))


def _times() -> Any:
    from dsa_lab.analysis.e2e import IndexerTimes

    return IndexerTimes(None, "triton")


def _throughput(preset: str) -> object:
    from dsa_lab.analysis.e2e import throughput_frame

    return throughput_frame(_times(), "H200", 1, preset)


def _step(batch: Any = 1, context: int = 4096, next_n: int = 1, label: str = "vLLM 0.33") -> object:
    from dsa_lab.analysis.e2e import step_row

    return step_row(_times(), "H200", label, batch, context, next_n)


for _label, (_call, _names) in HELPERS.items():
    case(INPUTS, f"{_label} is refused naming {', '.join(_names)}")(
        lambda tmp, c=_call, n=_names: refused(c, *n, types=(ValueError,))
    )


def _policies() -> dict[str, tuple[Callable[..., object], str]]:
    from dsa_lab.policy import vllm

    queries = ("before_pr45322", "pr45322", "pr52164", "fp4_rejection_0_33", "indexer_builder",
               "indexer_backend_takes_device_query_lens", "adaptive_rejection_0_33", "use_flattening_0_33",
               "vllm_0_33_0")  # fmt: skip
    platforms = ("native_next_n_supported", "supports_native_decode", "vllm_native_sizes", "supports_varlen")
    return {
        **{name: (getattr(vllm, name), "PolicyQuery") for name in queries},
        **{name: (getattr(vllm, name), "Platform") for name in platforms},
    }


for _name in ("before_pr45322", "pr45322", "pr52164", "fp4_rejection_0_33", "indexer_builder",
              "indexer_backend_takes_device_query_lens", "adaptive_rejection_0_33", "use_flattening_0_33",
              "vllm_0_33_0", "native_next_n_supported", "supports_native_decode", "vllm_native_sizes",
              "supports_varlen"):  # fmt: skip

    def _given_none(tmp: Path, name: str = _name) -> Result:
        function, takes = _policies()[name]
        args = (None, 2) if name in ("native_next_n_supported", "supports_native_decode") else (None,)
        return refused(lambda: function(*args), name, takes, types=(ValueError,))

    case(INPUTS, f"policy.vllm.{_name}(None) names what it takes")(_given_none)


@case(INPUTS, "policy.vllm.vllm_0_33_0 given a Platform where a PolicyQuery belongs names what it takes")
def _(tmp: Path) -> Result:
    from dsa_lab.policy.query import Platform
    from dsa_lab.policy.vllm import vllm_0_33_0

    return refused(lambda: vllm_0_33_0(Platform("sm90", True)), "PolicyQuery", types=(ValueError,))


for _next_n in (None, 0, 99, 2.0):

    def _native_n(tmp: Path, next_n: object = _next_n) -> Result:
        from dsa_lab.policy.query import Platform
        from dsa_lab.policy.vllm import supports_native_decode

        return refused(lambda: supports_native_decode(Platform("sm90", True), next_n), "next_n", types=(ValueError,))

    case(INPUTS, f"policy.vllm.supports_native_decode at next_n {_next_n!r} names next_n")(_native_n)
