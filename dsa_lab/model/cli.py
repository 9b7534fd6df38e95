"""`dsa-lab model`: the modeled time of indexer decode steps on a GPU, and what bounds each.

Backend, strategy, batch, context and next_n take comma-separated lists in the harness's
one list syntax (`axes.Axis.parse`: `--next-n 1,3,8`, `--strategy all`); every
combination is modeled. One combination prints the terms behind its time; several print
a row each, and a combination the model refuses (no SM90 kernel for 3 rows) is listed with
the reason. Tables name a backend by its label (`LogitsBackend.label`, as charts do); `--json`
prints one JSON object per combination, one a line, with the backend's name.
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

from dsa_lab import axes
from dsa_lab.batch.workload import ContextSpec
from dsa_lab.kernels import get_backend, modeled_backends, vllm_backend
from dsa_lab.model.gpus import GPUS, get_gpu
from dsa_lab.model.indexer import Prediction, predict

# What the model varies, in the order combinations are listed: the option (backend, strategy) and the step (batch,
# context, next_n), the axes every run stores but the shape (one `--heads`, one `--head-dim`) and the config.
LIST_AXES = tuple(a.name for a in axes.AXES if a.stored_always and a.role != "shape")


def _grid(args: argparse.Namespace) -> list[dict[str, Any]]:
    values = [axes.axis(name).parse(getattr(args, name)) for name in LIST_AXES]
    return [dict(zip(LIST_AXES, combination)) for combination in itertools.product(*values)]


def _record(gpu: Any, result: Prediction, context: ContextSpec) -> dict[str, Any]:
    return {
        **result.as_dict(),
        "context": context.label,
        "gpu_ceilings": {row["ceiling"]: {k: row[k] for k in ("value", "unit", "source")} for row in gpu.table()},
    }


def _run(args: argparse.Namespace) -> int:
    gpu = get_gpu(args.gpu)
    modeled: list[tuple[dict[str, Any], Prediction, ContextSpec]] = []
    refused: list[tuple[dict[str, Any], str]] = []
    grid = _grid(args)
    for point in grid:
        context = ContextSpec.parse(point["context"])
        seq_lens = context.seq_lens(point["batch"], args.seed)
        try:
            result = predict(
                gpu, point["backend"], point["strategy"], seq_lens, point["next_n"], args.heads, args.head_dim
            )
        except ValueError as err:
            if len(grid) == 1:
                raise
            refused.append((point, str(err)))
            continue
        modeled.append((point, result, context))
    if not modeled:
        raise ValueError(f"no combination could be modeled: {refused[0][1]} (and {len(refused) - 1} more)")
    if args.json:
        for _, result, context in modeled:
            print(json.dumps(_record(gpu, result, context), default=float))
        for point, reason in refused:
            print(json.dumps({**point, "gpu": gpu.name, "source": "modeled", "refused": reason}))
        return 0
    from rich.console import Console

    console = Console()
    if len(grid) == 1:
        _print_terms(console, gpu, modeled[0])
    else:
        _print_grid(console, gpu, modeled, refused)
    return 0


def _label(name: str) -> str:
    """A backend's label, as charts and tables name it, escaped for rich (a plug-in's label is its own text)."""
    from rich.markup import escape

    return escape(get_backend(name).label)


def _print_terms(console: Any, gpu: Any, modeled: tuple[dict[str, Any], Prediction, ContextSpec]) -> None:
    from rich.table import Table

    point, result, context = modeled
    table = Table(
        title=f"modeled: {_label(point['backend'])} {point['strategy']}, {gpu.name}, B={point['batch']}, "
        f"L={context.label}, "
        f"next_n={point['next_n']}"
    )
    table.add_column("term")
    table.add_column("at the ceiling (µs)", justify="right")
    table.add_column("with fitted efficiency (µs)", justify="right")
    for name, value in result.ceiling_us.items():
        table.add_row(name, f"{value:.1f}", f"{result.modeled_us[name]:.1f}")
    console.print(table)
    console.print(f"[bold]{result.time_us:.1f} µs[/] (modeled, {result.launches} launch(es)), bound: {result.bound}")
    console.print(f"calibration: {result.calibration}")
    for note in result.assumptions:
        console.print(f"assumption: {note}")


def _print_grid(
    console: Any,
    gpu: Any,
    modeled: list[tuple[dict[str, Any], Prediction, ContextSpec]],
    refused: list[tuple[dict[str, Any], str]],
) -> None:
    from rich.table import Table

    table = Table(title=f"modeled on {gpu.name} (calibrated on the H200 sweep; not measured)")
    for name in LIST_AXES:
        table.add_column("B" if name == "batch" else name)
    for column in ("µs", "launches"):
        table.add_column(column, justify="right")
    table.add_column("bound")
    for point, result, context in modeled:
        table.add_row(
            _label(point["backend"]),
            point["strategy"],
            str(point["batch"]),
            context.short,
            str(point["next_n"]),
            f"{result.time_us:.1f}",
            str(result.launches),
            result.bound,
        )
    console.print(table)
    for point, reason in refused:
        console.print(
            f"not modeled: {get_backend(point['backend']).label} {point['strategy']} B={point['batch']} "
            f"L={ContextSpec.parse(point['context']).short} "
            f"next_n={point['next_n']}: {reason}",
            markup=False,
            highlight=False,
        )
    assumptions = sorted({note for _, result, _ in modeled for note in result.assumptions})
    for note in assumptions:
        console.print(f"assumption: {note}")


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "model",
        help="modeled time of indexer decode steps on a GPU (calibrated on the H200)",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
    )
    parser.add_argument("--gpu", choices=tuple(GPUS), default="B200")
    lists = parser.add_argument_group("the grid (comma-separated lists, as `dsa-lab bench` takes them)")
    lists.add_argument(
        "--backend", default=vllm_backend().name, metavar="LIST", help=f"of {', '.join(modeled_backends())}"
    )
    lists.add_argument("--strategy", default="native", metavar="LIST", help="native, flatten, atom, or all")
    lists.add_argument("--batch", default="128", metavar="LIST", help="requests in the step (default 128)")
    lists.add_argument(
        "--context", default="65536", metavar="LIST", help="cached tokens a request: 65536, 64K or mixed:1K-64K"
    )
    lists.add_argument(
        "--next-n", dest="next_n", default="1", metavar="LIST", help="query rows a request (1 + speculative tokens)"
    )
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0, help="draws mixed context lengths")
    parser.add_argument("--json", action="store_true", help="one JSON object per combination (one a line)")
    parser.set_defaults(func=_run)
