"""`dsa-lab policy`: the decode path of every vLLM release on every platform, as a table per policy."""

from __future__ import annotations

import argparse

from dsa_lab.errors import check_range
from dsa_lab.policy.query import DEEPSEEK_V32, MAX_NEXT_N, MODEL_ARCHS, SYMBOLS
from dsa_lab.policy.vllm import POLICIES, RELEASES, all_platforms, decision_matrix

_COLOURS = {"N": "bold green", "F": "bold red", "V": "bold cyan", "-": "dim"}


def _print_matrix(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    check_range("next_n_max", args.next_n_max, 1, MAX_NEXT_N)
    names = list(POLICIES) if args.policy == "all" else [args.policy]
    next_ns = range(1, args.next_n_max + 1)
    frame = decision_matrix(names, None, next_ns, args.fp4, args.adaptive, args.model_arch)
    console = Console()
    for name in names:
        release, change = RELEASES[name]
        table = Table(
            title=f"{name}: {release}, {change}  (fp4={args.fp4}, adaptive={args.adaptive}, {args.model_arch})"
        )
        table.add_column("platform")
        table.add_column("deep_gemm")
        for n in next_ns:
            table.add_column(str(n), justify="center")
        part = frame[frame.policy == name]
        for p in all_platforms():
            cells = part[(part.platform == p.name) & (part.deep_gemm == p.has_deep_gemm)].sort_values("next_n")
            symbols = [SYMBOLS[path] for path in cells.path]
            table.add_row(p.name, "yes" if p.has_deep_gemm else "no", *(f"[{_COLOURS[s]}]{s}[/]" for s in symbols))
        console.print(table)
    console.print("N native  F flatten  V varlen (SM100 DeepGEMM, per-token rows)  - rejected at startup")
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("policy", help="which vLLM version flattens the indexer decode batch, where")
    parser.add_argument("--next-n-max", type=int, default=8, help="largest next_n column (default 8)")
    parser.add_argument("--fp4", action="store_true", help="MXFP4 indexer cache")
    parser.add_argument("--adaptive", action="store_true", help="adaptive speculative verification")
    parser.add_argument("--policy", choices=("all", *POLICIES), default="all")
    parser.add_argument(
        "--model-arch",
        choices=MODEL_ARCHS,
        default=DEEPSEEK_V32,
        help="decides the ROCm builder, MXFP4 and adaptive acceptance on ROCm",
    )
    parser.set_defaults(func=_print_matrix)
