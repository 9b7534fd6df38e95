"""Develop the Triton paged MQA-logits kernel: check it, read its resources, time it.

Two modes, each one process:

    python scripts/triton_dev.py aot                  # no GPU: compile for sm_90, resource table
    python scripts/triton_dev.py device --out DIR     # on the H200: (a) check (b) resources (c) timing

`device` checks the kernel against the reference at realistic shapes, reads registers,
spills, shared memory and the SASS (QGMMA = FP8 wgmma) of the kernels it compiled, times
the config space at B=128, L=64K and the chosen configs at B=16, L=8K, and prints a short
table last; everything also goes to DIR (log, JSON lines, one PTX/SASS pair).
Floors: bytes = B*L*(D+4) / 4.2e12 B/s, FLOPs = 2*B*L*n*H*D / 1.31e15 FLOP/s.
"""

# %%
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if "--smoke" in sys.argv:  # the interpreter must be chosen before triton is first imported
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.testing  # noqa: E402

from dsa_lab.kernels import triton_native as tn  # noqa: E402
from dsa_lab.kernels.cubin import cuobjdump  # noqa: E402
from dsa_lab.kernels.reference import paged_mqa_logits  # noqa: E402
from dsa_lab.model.roofline import GPUS  # noqa: E402

HBM_BYTES_PER_S = GPUS["H200-measured"].hbm_tbps * 1e12  # 4.2e12, this project's measured ceilings
FP8_FLOPS_PER_S = GPUS["H200-measured"].fp8_tflops * 1e12  # 1.31e15
SASS_OPS = ("QGMMA", "HGMMA", "HMMA", "LDL", "STL", "LDGSTS", "SHFL", "BAR.SYNC")


def floor_us(batch: int, length: int, next_n: int, heads: int = 64, head_dim: int = 128) -> tuple[float, float]:
    """(bytes floor, FLOPs floor) in microseconds."""
    bytes_moved = batch * length * (head_dim + 4)
    flops = 2 * batch * length * next_n * heads * head_dim
    return bytes_moved / HBM_BYTES_PER_S * 1e6, flops / FP8_FLOPS_PER_S * 1e6


def sass_counts(sass: str) -> dict[str, int]:
    """How often the instructions that matter occur (QGMMA = FP8 wgmma; LDL/STL = spills)."""
    return {op: len(re.findall(rf"\b{re.escape(op)}\b", sass)) for op in SASS_OPS}


# %% Offline compile (no GPU): what ptxas makes of each config.
def compile_sm90(next_n: int, heads: int, head_dim: int, config: tn.KernelConfig, dump: str = "") -> dict:
    kernel = tn.compile_for(90, next_n, heads, head_dim, config)
    if dump:  # keep the IR and assembly for reading
        for kind in ("ttgir", "ptx"):
            Path(f"{dump}.{kind}").write_text(kernel.asm[kind])
    usage = cuobjdump(kernel.asm["cubin"], "-res-usage")
    regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", usage).groups()
    counts = sass_counts(cuobjdump(kernel.asm["cubin"], "-sass"))
    return {"regs": int(regs), "stack": int(stack), "shared": kernel.metadata.shared} | counts


def aot_main(args: argparse.Namespace) -> None:
    print(f"triton {triton.__version__}, offline compile for sm_90 (no GPU)")
    if args.rule_matrix:  # the rule's choice for every supported (n, H, D): compiles, no spills?
        for heads in (32, 64):
            for head_dim in (64, 128):
                for next_n in range(1, tn.MAX_NEXT_N + 1):
                    config = tn.choose_config(next_n, heads, head_dim)
                    report = compile_sm90(next_n, heads, head_dim, config)
                    print(f"H={heads} D={head_dim} n={next_n:2d} {config.describe():32s} {report}")
        return
    for next_n in args.next_n:
        for config in candidate_configs(next_n, args.heads):
            try:
                report = compile_sm90(next_n, args.heads, args.head_dim, config)
            except Exception as exc:  # report and go on: one bad config must not hide the rest
                report = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
            print(f"n={next_n:2d} {config.describe():42s} {report}")


# %% The config space (docs/triton_kernel.md).
def candidate_configs(next_n: int, heads: int) -> list[tn.KernelConfig]:
    """The config space timed at B=128, L=64K (round 2 of docs/triton_kernel.md, minus the two
    options the measurements retired: scales without prefetch, and query-row groups).

    Round 1 showed latency, not the MMA, bounding every n; so: deeper pipelines, fewer
    registers (more CTAs an SM), larger KV splits. The rule's own choice is timed first.
    Round 3's 128-token steps (M=128, 8 warps) lost at every n and were retired with their
    kernel option.
    """

    def K(rows: int, stages: int, resident: bool = True, bpp: int = 32) -> tn.KernelConfig:
        return tn.KernelConfig(rows, 4, stages, resident, bpp)

    space = {
        1: [K(256, 5), K(256, 7), K(256, 9), K(256, 7, bpp=16), K(256, 7, bpp=64)],
        2: [K(256, 5), K(256, 7), K(256, 7, False), K(256, 9, False), K(64, 5, False), K(64, 7, False)],
        3: [
            K(256, 7),
            K(256, 9),
            K(256, 7, False),
            K(256, 9, False),
            K(64, 5, False),
            K(64, 7, False),
            K(64, 9, False),
            K(64, 5, False, bpp=16),
            K(64, 5, False, bpp=64),
        ],
        4: [K(256, 5), K(256, 7), K(128, 5, False), K(128, 7, False), K(64, 5, False), K(64, 7, False)],
        8: [K(256, 5, False), K(256, 7, False), K(64, 5, False), K(64, 7, False)],
    }
    return [tn.choose_config(next_n, heads, 128)] + space.get(next_n, [])


# %% Inputs on the GPU: a random fused FP8 cache (valid e4m3 values, positive scales).
def timing_inputs(batch: int, length: int, next_n: int, heads: int, head_dim: int, seed: int, device: str = "cuda"):
    gen = torch.Generator(device).manual_seed(seed)
    per_req = -(-length // tn.BLOCK_SIZE)
    blocks = batch * per_req + 1
    values = torch.randn(blocks, tn.BLOCK_SIZE * head_dim, device=device, generator=gen).to(torch.float8_e4m3fn)
    scales = torch.rand(blocks, tn.BLOCK_SIZE, device=device, generator=gen) * 0.02 + 1e-3
    cache = torch.cat([values.view(torch.uint8), scales.view(torch.uint8)], dim=1)
    cache = cache.view(blocks, tn.BLOCK_SIZE, 1, head_dim + 4)
    table = torch.randperm(blocks, device=device, generator=gen)[: batch * per_req].to(torch.int32).view(batch, per_req)
    q = torch.randn(batch, next_n, heads, head_dim, device=device, generator=gen).to(torch.float8_e4m3fn)
    weights = torch.randn(batch * next_n, heads, device=device, generator=gen) * heads**-0.5
    rows = torch.arange(next_n, device=device, dtype=torch.int32)
    context = (length - next_n + 1 + rows).expand(batch, next_n).contiguous()
    return q, cache, weights, context, table, length


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Relative error on valid positions; -inf exactly where the reference has it; no NaN."""
    valid = torch.isfinite(ref)
    err = ((out[valid] - ref[valid]).norm() / ref[valid].norm()).item()
    return {
        "rel_err": err,
        "inf_ok": bool(torch.equal(torch.isfinite(out), valid)),
        "nan": bool(torch.isnan(out).any()),
    }


def run_config(args_tuple, config: tn.KernelConfig):
    """One launch into a NaN-poisoned output; returns (output, compiled kernel)."""
    q, cache, weights, context, table, length = args_tuple
    out = torch.full((q.shape[0] * q.shape[1], length), float("nan"), device=q.device)
    out, kernel = tn._launch(q, cache, weights, context, table, length, config, out)
    return out, kernel


def resources(kernel) -> dict:
    info = {
        "regs": getattr(kernel, "n_regs", None),
        "spills": getattr(kernel, "n_spills", None),
        "shared": kernel.metadata.shared,
    }
    counts = sass_counts(cuobjdump(kernel.asm["cubin"], "-sass"))
    info["wgmma_e4m3_ptx"] = len(re.findall(r"wgmma\.mma_async\S*e4m3\.e4m3", kernel.asm["ptx"]))
    return info | counts


def wall_us(call) -> float:
    """Smoke runs only: one wall-clock call (no GPU, so no events)."""
    begin = time.perf_counter()
    call()
    return (time.perf_counter() - begin) * 1e6


def time_graph(calls: list, reps: int = 20) -> float:
    """Microseconds per call: a CUDA graph of the calls (rotating inputs, so L2 stays cold), replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return sorted(times)[len(times) // 2]


# %% (a) correctness at realistic shapes through the package's own inputs and decode path.
def check_realistic(log, smoke: bool) -> None:
    from dsa_lab.decode import pack_launch, run_decode
    from dsa_lab.metadata import build_native_metadata
    from dsa_lab.workload import mixed_length_batch, ragged_decode_batch, random_inputs, uniform_batch, with_padding

    device = "cpu" if smoke else "cuda"
    scale = 64 if smoke else 1
    for batch in (
        uniform_batch(4, 65536 // scale, 3),
        mixed_length_batch(8, 64, 16384 // scale, 8, seed=2),
        uniform_batch(2, 4096 // scale, 16, num_heads=32, head_dim=64),
    ):
        inputs = random_inputs(batch, seed=5, device=device)
        launch = pack_launch(build_native_metadata(batch, inputs.cache.block_table).launches[0], inputs)
        args_tuple = (
            launch.q,
            inputs.cache.data,
            launch.weights,
            launch.context_lens,
            launch.block_table,
            batch.max_seq_len,
        )
        ref = paged_mqa_logits(*args_tuple, cache_dtype="fp8")
        out = tn.paged_mqa_logits_triton(*args_tuple, out=torch.full_like(ref, float("nan")), cache_dtype="fp8")
        log("check", shape=batch.describe(), config="rule", **compare(out, ref))
    ragged = ragged_decode_batch(
        8 if smoke else 32, 1000 // scale, 20000 // scale, 5, seed=4, num_heads=32, head_dim=64
    )
    batch = with_padding(ragged, 2, 3)
    inputs = random_inputs(batch, seed=6, device=device)
    ref = run_decode(inputs, "native", "reference").logits
    for strategy in ("native", "flatten", "atom"):
        got = run_decode(inputs, strategy, "triton").logits
        log("check", shape=batch.describe() + f" run_decode {strategy}", config="rule", **compare(got, ref))


# %% (b) + (c): every candidate config at B=128, L=64K, checked on the same inputs it is timed on.
def sweep_large(log, next_ns, deadline: float, out_dir: Path, smoke: bool) -> dict[int, tuple[tn.KernelConfig, float]]:
    batch, length, heads, dim = (2, 256, 64, 128) if smoke else (128, 65536, 64, 128)
    device = "cpu" if smoke else "cuda"
    best: dict[int, tuple[tn.KernelConfig, float]] = {}
    for next_n in next_ns:
        args_tuple = timing_inputs(batch, length, next_n, heads, dim, seed=next_n, device=device)
        ref = paged_mqa_logits(*args_tuple, cache_dtype="fp8")
        bytes_us, flops_us = floor_us(batch, length, next_n, heads, dim)
        for config in candidate_configs(next_n, heads):
            if time.monotonic() > deadline:
                log("skip", next_n=next_n, config=config.describe(), reason="time budget")
                continue
            try:
                out, kernel = run_config(args_tuple, config)
                quality = compare(out, ref)
                del out
                res = {} if smoke else resources(kernel)
                call = lambda args=args_tuple, cfg=config: tn._launch(*args, cfg, None)
                us = (
                    wall_us(call)
                    if smoke
                    else triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median") * 1e3
                )
            except Exception as exc:  # one failing config must not hide the others
                log("error", next_n=next_n, config=config.describe(), error=f"{type(exc).__name__}: {exc}"[:300])
                continue
            log(
                "time",
                B=batch,
                L=length,
                next_n=next_n,
                config=config.describe(),
                us=us,
                floor_bytes_us=bytes_us,
                floor_flops_us=flops_us,
                **quality,
                **res,
            )
            good = quality["rel_err"] <= 1e-3 and quality["inf_ok"] and not quality["nan"]
            if good and (next_n not in best or us < best[next_n][1]):
                best[next_n] = (config, us)
            if next_n == 3 and config == candidate_configs(3, heads)[0] and not smoke:
                (out_dir / "kernel_n3.ptx").write_text(kernel.asm["ptx"])
                (out_dir / "kernel_n3.sass").write_text(cuobjdump(kernel.asm["cubin"], "-sass"))
        del args_tuple, ref
    return best


def sweep_small(log, best: dict[int, tuple[tn.KernelConfig, float]], deadline: float, smoke: bool) -> None:
    """B=16, L=8K: the best large-batch config per n at the rule's split (auto) and at 4, 8, 16
    blocks, and the rule's own config at auto when it differs; graph-timed over 8 input sets."""
    batch, length, heads, dim = (2, 128, 64, 128) if smoke else (16, 8192, 64, 128)
    device = "cpu" if smoke else "cuda"
    for next_n, (config, _) in best.items():
        sets = [timing_inputs(batch, length, next_n, heads, dim, seed=100 + i, device=device) for i in range(8)]
        ref = paged_mqa_logits(*sets[0], cache_dtype="fp8")
        bytes_us, flops_us = floor_us(batch, length, next_n, heads, dim)
        variants = [tn.KernelConfig(**(config.__dict__ | {"blocks_per_program": bpp})) for bpp in (0, 4, 8, 16)]
        rule = tn.choose_config(next_n, heads, dim)
        if rule != config:  # right after auto, so it is timed even when time runs short
            variants.insert(1, rule)
        for cfg in variants:
            if time.monotonic() > deadline:
                break
            out, _ = run_config(sets[0], cfg)
            quality = compare(out, ref)
            calls = [lambda s=s, cfg=cfg: tn._launch(*s, cfg, None) for s in sets]
            us = wall_us(calls[0]) if smoke else time_graph(calls)
            log(
                "time",
                B=batch,
                L=length,
                next_n=next_n,
                config=cfg.describe(),
                us=us,
                floor_bytes_us=bytes_us,
                floor_flops_us=flops_us,
                **quality,
            )
        del sets


def device_main(args: argparse.Namespace) -> None:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    records = []
    log_file = (out_dir / "log.txt").open("w")

    def log(kind: str, **fields) -> None:
        record = {"kind": kind, "t": round(time.monotonic() - start, 1)} | fields
        records.append(record)
        line = json.dumps(record, default=str)
        print(line, flush=True)
        log_file.write(line + "\n")

    gpu = "cpu (interpreter smoke run)" if args.smoke else torch.cuda.get_device_name()
    log(
        "env",
        gpu=gpu,
        torch=torch.__version__,
        triton=triton.__version__,
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
        argv=sys.argv,
    )
    try:
        check_realistic(log, args.smoke)
    except Exception as exc:  # report it, and still time the sweep (each config is checked there too)
        log("error", stage="check_realistic", error=f"{type(exc).__name__}: {exc}"[:300])
    best = sweep_large(log, args.next_n, start + args.budget_s * 0.75, out_dir, args.smoke)
    sweep_small(log, best, start + args.budget_s, args.smoke)
    (out_dir / "results.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in records))
    print("\n| shape | n | config | us | floor us (bytes/flops) | us/floor | rel err | regs | spills | smem | QGMMA |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in records:
        if r["kind"] == "time":
            floor = max(r["floor_bytes_us"], r["floor_flops_us"])
            print(
                f"| B={r['B']} L={r['L']} | {r['next_n']} | {r['config']} | {r['us']:.1f} | "
                f"{r['floor_bytes_us']:.0f}/{r['floor_flops_us']:.0f} | {r['us'] / floor:.2f} | "
                f"{r['rel_err']:.1e} | {r.get('regs', '')} | {r.get('spills', '')} | {r.get('shared', '')} | "
                f"{r.get('QGMMA', '')} |"
            )
    for r in records:
        if r["kind"] in ("check", "error", "skip"):
            print(json.dumps(r, default=str))
    print("\nbest per shape and n (checked rows only):")
    best_rows: dict[tuple, dict] = {}
    for r in records:
        if r["kind"] == "time" and r["rel_err"] <= 1e-3 and r["inf_ok"] and not r["nan"]:
            key = (r["B"], r["L"], r["next_n"])
            if key not in best_rows or r["us"] < best_rows[key]["us"]:
                best_rows[key] = r
    for (batch, length, next_n), r in sorted(best_rows.items()):
        floor = max(r["floor_bytes_us"], r["floor_flops_us"])
        print(f"  B={batch} L={length} n={next_n}: {r['us']:.1f} us ({r['us'] / floor:.2f}x floor) {r['config']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    aot = sub.add_parser("aot", help="compile for sm_90 without a GPU and print resources")
    aot.add_argument("--next-n", type=int, nargs="+", default=[1, 2, 3, 4, 8])
    aot.add_argument("--heads", type=int, default=64)
    aot.add_argument("--head-dim", type=int, default=128)
    aot.add_argument("--rule-matrix", action="store_true", help="the rule's config for every (n, H, D)")
    dev = sub.add_parser("device", help="on a GPU: check, resources, timing")
    dev.add_argument("--out", default=os.environ.get("OUT", "triton_dev_out"))
    dev.add_argument("--next-n", type=int, nargs="+", default=[1, 2, 3, 4, 8])
    dev.add_argument("--smoke", action="store_true", help="tiny shapes on CPU via the interpreter")
    dev.add_argument("--budget-s", type=float, default=170.0, help="stop starting new work after this")
    args = parser.parse_args()
    if args.mode == "aot":
        aot_main(args)
    else:
        device_main(args)
