"""`dsa-lab model`: the modeled time of one indexer decode step on a GPU, and what bounds it."""

from __future__ import annotations

import argparse
import json

from dsa_lab.kernels import modeled_backends, vllm_backend
from dsa_lab.metadata import STRATEGIES
from dsa_lab.model.gpus import GPUS, get_gpu
from dsa_lab.model.indexer import predict
from dsa_lab.workload import ContextSpec


def _run(args: argparse.Namespace) -> int:
    gpu = get_gpu(args.gpu)
    context = ContextSpec.parse(args.context)
    seq_lens = context.seq_lens(args.batch, args.seed)
    result = predict(gpu, args.backend, args.strategy, seq_lens, args.next_n, args.heads, args.head_dim)
    record = {
        **result.as_dict(),
        "context": context.label,
        "gpu_ceilings": {row["ceiling"]: {k: row[k] for k in ("value", "unit", "source")} for row in gpu.table()},
    }
    if args.json:
        print(json.dumps(record, default=float))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"modeled: {args.backend} {args.strategy}, {gpu.name}, B={args.batch}, L={context.label}, next_n={args.next_n}"
    )
    table.add_column("term")
    table.add_column("at the ceiling (µs)", justify="right")
    table.add_column("with fitted efficiency (µs)", justify="right")
    for name, value in result.ceiling_us.items():
        table.add_row(name, f"{value:.1f}", f"{result.modeled_us[name]:.1f}")
    console = Console()
    console.print(table)
    console.print(f"[bold]{result.time_us:.1f} µs[/] (modeled, {result.launches} launch(es)), bound: {result.bound}")
    console.print(f"calibration: {result.calibration}")
    for note in result.assumptions:
        console.print(f"assumption: {note}")
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("model", help="modeled time of one indexer decode step on a GPU (calibrated on the H200)")
    parser.add_argument("--gpu", choices=tuple(GPUS), default="B200")
    parser.add_argument("--backend", choices=modeled_backends(), default=vllm_backend().name)
    parser.add_argument("--strategy", choices=STRATEGIES, default="native")
    parser.add_argument("--batch", type=int, default=128, help="requests in the step (default 128)")
    parser.add_argument("--context", default="65536", help="cached tokens a request: 65536, 64K or mixed:1K-64K")
    parser.add_argument("--next-n", type=int, default=1, help="query rows a request (1 + speculative tokens)")
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0, help="draws mixed context lengths")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(func=_run)
