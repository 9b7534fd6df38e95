"""Dev script for the Gluon kernel (dsa_lab/kernels/gluon_*.py): offline AOT, H200 checks, variant timing.

    python scripts/gluon_dev.py aot [--next-n 1,2,3] [--arch 90]      # no GPU: resources of the rule's configs
    python scripts/gluon_dev.py check --out FILE.jsonl                # H200: every case vs the reference
    python scripts/gluon_dev.py passing FILE.jsonl                    # next_n whose rule config passed everything
    python scripts/gluon_dev.py variants --out FILE.jsonl             # H200: time configs against each other

`check` runs each case into a NaN-filled output and compares with the reference backend:
||out - ref|| / ||ref|| <= 1e-3 over the valid positions, exactly -inf past each row's context
inside its request's scored blocks, and, as the kernel does not clean the tail, the columns past
those blocks still NaN (nothing written there); with `clean_tail` every column past a row's context
-inf. Cases: uniform, mixed lengths, ragged decode lengths plus CUDA-graph padding (requests and
tokens), zero-length requests among real ones, contexts of 1 and at block boundaries (63, 64, 65),
block tables wider than needed, a logits width past every context (vLLM's max_model_len), one long
request among short ones (a CTA range crossing requests), H = 32 / D = 64, every next_n 1..8 and 16,
the n=3 plans. A watchdog ends the process if one case runs over `--case-timeout` (a hung kernel),
after writing which case it was; the results so far stay in the JSONL file.

`variants` times configs (`rule`, `key=value;...`) against each other on one workload (`--context`
a length or a ContextSpec such as mixed:2K-128K, `--width` the logits width, `batch` or a number),
each checked first; `--baseline PATH` adds a module of an earlier kernel (its `choose_gluon_config`
and `launch(q, kv, w, ctx, table, width, config, out)`), timed in the same process as `baseline`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dsa_lab.kernels import gluon_config as gc  # noqa: E402
from dsa_lab.kernels import gluon_native as gn  # noqa: E402
from dsa_lab.kernels.cubin import resource_counts  # noqa: E402
from dsa_lab.kernels.schedule import balanced_schedule  # noqa: E402

TOLERANCE = 1e-3


def resources(kernel) -> dict:
    """Registers, spills, shared memory and MMA count of a compiled kernel (its cubin)."""
    counts = resource_counts(kernel)
    kept = ("registers", "stack_bytes", "sass_local_accesses", "shared_bytes", "setmaxnreg")
    return {**{key: counts[key] for key in kept}, "sass_qgmma": counts["sass_qgmma_e4m3"]}


def config_from(text: str, next_n: int, heads: int, dim: int) -> gc.GluonConfig:
    """`rule` or `key=value;...` over the rule's config (c consumers, s stages, p plan, m mma, g group,
    w r|l, l loader, q query slots)."""
    base = gc.choose_gluon_config(next_n, heads, dim)
    if text == "rule":
        return base
    kw = dict(item.split("=") for item in text.split(";"))
    return gc.GluonConfig(
        consumers=int(kw.get("c", base.consumers)),
        stages=int(kw.get("s", base.stages)),
        plan=kw.get("p", base.plan),
        mma_columns=int(kw.get("m", base.mma_columns)),
        group_columns=int(kw.get("g", base.group_columns)),
        resident_weights=kw.get("w", "r" if base.resident_weights else "l") == "r",
        loader_registers=int(kw.get("l", base.loader_registers)),
        query_slots=int(kw.get("q", base.query_slots)),
    )


def cmd_aot(args: argparse.Namespace) -> int:
    import triton

    for n in [int(x) for x in args.next_n.split(",")]:
        for text in args.configs.split(","):
            config = config_from(text, n, args.heads, args.head_dim)
            started = time.time()
            try:
                kernel = gn.compile_for(args.arch, n, args.heads, args.head_dim, config)
                row = resources(kernel)
            except Exception as exc:  # one failed compile must not hide the others
                row = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[-1][:300]}"}
            print(json.dumps({"next_n": n, "config": config.describe(), "triton": triton.__version__,
                              "seconds": round(time.time() - started, 1), **row}), flush=True)  # fmt: skip
    return 0


# --- H200 checks ------------------------------------------------------------------------------------


def extra_cases(specs: list[str]) -> list[dict]:
    """A uniform and a ragged+padding case for each `N:config` (configs as in `aot`)."""
    out = []
    for spec in specs:
        n_text, text = spec.split(":", 1)
        n = int(n_text)
        out.append({"name": f"uniform n={n} {text}", "kind": "uniform", "n": n, "config": text, "B": 3, "L": 3000})
        out.append({"name": f"ragged+pad n={n} {text}", "kind": "ragged", "n": n, "config": text, "B": 5, "L": 2500})
    return out


def cases() -> list[dict]:
    """(name, batch kind, next_n, config, heads, head_dim, ...) of every check, the rule's configs first."""
    out = []
    for n in (1, 2, 3, 4, 5, 6, 7, 8):
        out.append({"name": f"uniform n={n}", "kind": "uniform", "n": n, "config": "rule", "B": 3, "L": 3000})
        out.append({"name": f"ragged+pad n={n}", "kind": "ragged", "n": n, "config": "rule", "B": 5, "L": 2500})
        out.append({"name": f"edges n={n}", "kind": "lens", "n": n, "config": "rule",
                    "lens": [0, 1, 63, 64, 65, 0, 129, 2000, 0]})  # fmt: skip
        out.append({"name": f"long among short n={n} clean", "kind": "lens", "n": n, "config": "rule",
                    "lens": [40000] + [700] * 30, "clean_tail": True})  # fmt: skip
    out.append({"name": "mixed n=3", "kind": "mixed", "n": 3, "config": "rule", "B": 6, "L": 5000})
    out.append({"name": "long n=4", "kind": "uniform", "n": 4, "config": "rule", "B": 2, "L": 40000})
    out.append({"name": "uniform n=16", "kind": "uniform", "n": 16, "config": "rule", "B": 2, "L": 1500})
    out.append({"name": "edges n=16 clean", "kind": "lens", "n": 16, "config": "rule",
                "lens": [0, 16, 63, 64, 65, 0, 1000], "clean_tail": True})  # fmt: skip
    out.append({"name": "H32 D64 n=3", "kind": "ragged", "n": 3, "config": "rule", "B": 4, "L": 2000, "H": 32, "D": 64})
    out.append({"name": "wide table, model width n=3", "kind": "lens", "n": 3, "config": "rule",
                "lens": [3000, 0, 70, 4100], "table_extra": 40, "width": 163840})  # fmt: skip
    out.append({"name": "model width n=4 clean", "kind": "lens", "n": 4, "config": "rule",
                "lens": [3000, 70], "width": 163840, "clean_tail": True})  # fmt: skip
    out.append({"name": "all padding but one n=2", "kind": "lens", "n": 2, "config": "rule", "lens": [0, 0, 2, 0]})
    for text in ("p=row;m=64;g=192", "p=pad;m=256;g=256", "p=pair;m=128;g=128", "q=1"):
        out.append({"name": f"ragged+pad n=3 {text}", "kind": "ragged", "n": 3, "config": text, "B": 5, "L": 2500})
    for text in ("c=4;s=8", "c=2;s=8", "q=1"):
        out.append({"name": f"ragged+pad n=1 {text}", "kind": "ragged", "n": 1, "config": text, "B": 5, "L": 2500})
    out.append({"name": "ragged+pad n=8 m=128;g=128;l=72", "kind": "ragged", "n": 8, "config": "m=128;g=128;l=72",
                "B": 4, "L": 2500})  # fmt: skip
    return out


def build_inputs(case: dict, seed: int, device: torch.device):
    from dsa_lab.decode import check_launches, pack_launch
    from dsa_lab.metadata import build_native_metadata
    from dsa_lab.workload import (
        DecodeBatch,
        mixed_length_batch,
        ragged_decode_batch,
        random_inputs,
        uniform_batch,
        with_padding,
    )

    n, shape = case["n"], {"num_heads": case.get("H", 64), "head_dim": case.get("D", 128)}
    if case["kind"] == "uniform":
        batch = uniform_batch(case["B"], case["L"], n, **shape)
    elif case["kind"] == "mixed":
        batch = mixed_length_batch(case["B"], 100, case["L"], n, seed, **shape)
    elif case["kind"] == "lens":  # given lengths: 0 is a padding request, 1..n-1 decode that many rows
        lens = tuple(case["lens"])
        batch = DecodeBatch(lens, tuple(min(n, length) for length in lens), n, **shape)
    else:  # ragged decode lens, two padding requests and three padding tokens
        batch = with_padding(ragged_decode_batch(case["B"], n, case["L"], n, seed, **shape), 2, 3)
    inputs = random_inputs(batch, seed=seed, device=device)
    metadata = build_native_metadata(batch, inputs.cache.block_table)
    check_launches(metadata, inputs)
    packed = pack_launch(metadata.launches[0], inputs)
    if case.get("table_extra"):  # a block table wider than any request needs, its spare ids valid but unused
        spare = torch.zeros(packed.block_table.shape[0], case["table_extra"], dtype=torch.int32, device=device)
        table = torch.cat([packed.block_table, spare], dim=1).contiguous()
        packed = type(packed)(packed.q, packed.weights, packed.context_lens, table)
    return inputs, metadata, packed


def run_case(case: dict, seed: int, device: torch.device) -> dict:
    from dsa_lab.kernels.reference import paged_mqa_logits as reference

    inputs, metadata, packed = build_inputs(case, seed, device)
    batch, n, heads, dim = packed.q.shape
    config = config_from(case["config"], n, heads, dim)
    width = case.get("width", metadata.max_context_len)
    clean = case.get("clean_tail", False)
    out = torch.full((batch * n, width), float("nan"), dtype=torch.float32, device=device)
    gn.paged_mqa_logits_gluon(
        packed.q, inputs.cache.data, packed.weights, packed.context_lens, packed.block_table, width,
        config=config, out=out, cache_dtype="fp8", clean_tail=clean,
    )  # fmt: skip
    ref = reference(packed.q, inputs.cache.data, packed.weights, packed.context_lens, packed.block_table, width,
                    cache_dtype="fp8")  # fmt: skip
    torch.cuda.synchronize()
    ctx = packed.context_lens.reshape(-1).long()
    pos = torch.arange(width, device=device)[None, :]
    valid = pos < ctx[:, None]
    scored = pos < (packed.context_lens.amax(dim=1).long().repeat_interleave(n)[:, None] + 63) // 64 * 64
    got, want = out[valid].double(), ref[valid].double()
    nan_valid = int(torch.isnan(got).sum())
    inside = out[~valid & (scored | clean)]  # must be -inf: past the context inside scored blocks (all, if clean)
    tail_bad = int((inside != float("-inf")).sum())  # NaN (unwritten) or a value where -inf belongs
    untouched = out[~scored] if not clean else out[:0]
    tail_written = int((~torch.isnan(untouched)).sum())  # not cleaned: nothing may be written there
    rel_err = float((got - want).norm() / want.norm().clamp(min=1e-30)) if got.numel() else 0.0
    ok = nan_valid == 0 and tail_bad == 0 and tail_written == 0 and rel_err <= TOLERANCE
    return {"ok": ok, "rel_err": rel_err, "nan_valid": nan_valid, "tail_not_ninf": tail_bad,
            "written_past_blocks": tail_written, "clean_tail": clean, "rows": batch * n, "width": width,
            "table_width": packed.block_table.shape[1], "config": config.describe(),
            "seq_lens": list(inputs.batch.seq_lens)[:8], "decode_lens": list(inputs.batch.decode_lens)[:8]}  # fmt: skip


class Watchdog:
    """Ends the process (exit 3) when a case runs longer than `seconds`: a hung kernel never returns."""

    def __init__(self, seconds: float, log: Path) -> None:
        self.seconds, self.log, self.deadline, self.case = seconds, log, None, None
        threading.Thread(target=self._watch, daemon=True).start()

    def arm(self, case: str) -> None:
        self.case, self.deadline = case, time.time() + self.seconds

    def disarm(self) -> None:
        self.deadline = None

    def _watch(self) -> None:
        while True:
            time.sleep(1)
            if self.deadline is not None and time.time() > self.deadline:
                with self.log.open("a") as f:
                    f.write(json.dumps({"name": self.case, "ok": False, "error": f"hung (> {self.seconds} s)"}) + "\n")
                print(f"WATCHDOG: case {self.case!r} ran over {self.seconds} s: exiting", flush=True)
                os._exit(3)


def cmd_check(args: argparse.Namespace) -> int:
    device = torch.device("cuda")
    out = Path(args.out)
    done = set()
    if out.exists():
        done = {json.loads(line)["name"] for line in out.read_text().splitlines() if line.strip()}
    dog = Watchdog(args.case_timeout, out)
    failures = 0
    todo = ([] if args.only_extra else cases()) + extra_cases(args.extra)
    for i, case in enumerate(todo):
        if case["name"] in done:
            continue
        dog.arm(case["name"])
        started = time.time()
        try:
            row = run_case(case, args.seed + i, device)
        except Exception as exc:
            row = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
        dog.disarm()
        row = {"name": case["name"], "n": case["n"], "seconds": round(time.time() - started, 2), **row}
        failures += not row["ok"]
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(("PASS " if row["ok"] else "FAIL ") + json.dumps(row), flush=True)
    return 1 if failures else 0


def cmd_passing(args: argparse.Namespace) -> int:
    """next_n (1..8) whose every rule-config case passed, comma-separated (empty: none)."""
    rows = [json.loads(line) for line in Path(args.file).read_text().splitlines() if line.strip()]
    names = {c["name"]: c for c in cases()}
    good = []
    for n in range(1, 9):
        mine = [c for c in names.values() if c["n"] == n and c["config"] == "rule"]
        results = {r["name"]: r for r in rows}
        if mine and all(results.get(c["name"], {}).get("ok") for c in mine):
            good.append(str(n))
    print(",".join(good))
    return 0


# --- variant timing -----------------------------------------------------------------------------------


def _baseline(path: str):
    """An earlier kernel's module, loaded from a file under a private name (timed as `baseline`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gluon_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gluon_baseline"] = module  # its dataclasses look their module up while being made
    spec.loader.exec_module(module)
    return module


def cmd_variants(args: argparse.Namespace) -> int:
    """Time Gluon configs on one workload (uniform or mixed lengths, one GPU-drawn cache) in one
    process, each checked first (sampled requests vs the reference: rel. error, no NaN in the
    poisoned output); the schedule is made once outside the timed region and timed apart."""
    from dsa_lab.bench.timing import TimingConfig, time_callable
    from dsa_lab.cache import random_paged_cache
    from dsa_lab.kernels.reference import paged_mqa_logits as reference
    from dsa_lab.workload import ContextSpec

    device = torch.device("cuda")
    timing = TimingConfig(warmup=3, min_samples=10, max_samples=60, max_seconds=args.seconds_per_point)
    out = Path(args.out)
    baseline = _baseline(args.baseline) if args.baseline else None
    batch, heads, dim = args.batch, 64, 128
    seq_lens = ContextSpec.parse(args.context).seq_lens(batch, args.seed)
    longest = max(seq_lens)
    width = longest if args.width == "batch" else int(args.width)
    cache = random_paged_cache(seq_lens, dim, seed=args.seed, device=device)
    gen = torch.Generator(device=device).manual_seed(args.seed + 7)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    for spec in args.spec:
        n_text, texts = spec.split(":", 1)
        n = int(n_text)
        q = torch.randn(batch, n, heads, dim, generator=gen, device=device).to(torch.float8_e4m3fn)
        weights = torch.randn(batch * n, heads, generator=gen, device=device) * heads**-0.5
        ctx = (lens[:, None] - n + 1 + torch.arange(n, device=device, dtype=torch.int32)[None, :]).contiguous()
        table = cache.block_table
        sample = sorted({0, batch - 1, int(lens.argmax())})
        ref = reference(q[sample].contiguous(), cache.data, weights.view(batch, n, heads)[sample].reshape(-1, heads),
                        ctx[sample].contiguous(), table[sample].contiguous(), width, cache_dtype="fp8")  # fmt: skip
        valid = torch.isfinite(ref)
        schedule = balanced_schedule(ctx, table, gn.num_sms(0))
        for text in texts.split("|"):
            row = {"next_n": n, "batch": batch, "context": args.context, "width": width}
            try:
                if text == "baseline":
                    config = baseline.choose_gluon_config(n, heads, dim)
                    run = functools.partial(baseline.launch, q, cache.data, weights, ctx, table, width, config)
                    row["config"] = "baseline " + config.describe()
                else:
                    config = config_from(text, n, heads, dim)
                    run = functools.partial(gn.launch, q, cache.data, weights, ctx, table, width, config, schedule)
                    row["config"] = config.describe()
                result = torch.full((batch * n, width), float("nan"), device=device)
                _, kernel = run(result)
                torch.cuda.synchronize()
                got = result.view(batch, n, width)[sample].reshape(-1, width)
                rel = float((got[valid].double() - ref[valid].double()).norm() / ref[valid].double().norm())
                row.update({"rel_err": rel, "ok": bool(rel <= TOLERANCE and not torch.isnan(got[valid]).any())})
                row.update(resources(kernel))
                if row["ok"]:
                    m = time_callable(functools.partial(run, result), device, timing)
                    row.update({k: v for k, v in m.as_row().items() if isinstance(v, (int, float, str))})
            except Exception as exc:
                row.update({"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps({k: row.get(k) for k in ("next_n", "context", "width", "config", "ok", "rel_err",
                                                      "median_ms", "rel_iqr", "error")}), flush=True)  # fmt: skip
        schedule_ms = time_callable(functools.partial(balanced_schedule, ctx, table, gn.num_sms(0)), device,
                                    TimingConfig(warmup=3, min_samples=20, max_samples=100, max_seconds=0.1))  # fmt: skip
        with out.open("a") as f:
            f.write(json.dumps({"next_n": n, "batch": batch, "context": args.context, "schedule": True,
                                **schedule_ms.as_row()}, default=str) + "\n")  # fmt: skip
        print(json.dumps({"next_n": n, "schedule_median_ms": schedule_ms.median_ms}), flush=True)
        del q, weights, ref
        torch.cuda.empty_cache()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    aot = sub.add_parser("aot")
    aot.add_argument("--next-n", default="1,2,3,4,5,6,7,8")
    aot.add_argument("--configs", default="rule", help="comma-separated: rule or key=value;... (see config_from)")
    aot.add_argument("--arch", type=int, default=90)
    aot.add_argument("--heads", type=int, default=64)
    aot.add_argument("--head-dim", type=int, default=128)
    aot.set_defaults(func=cmd_aot)
    check = sub.add_parser("check")
    check.add_argument("--out", required=True)
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--case-timeout", type=float, default=60.0)
    check.add_argument("--extra", nargs="*", default=[], help="N:config: uniform and ragged cases of these configs")
    check.add_argument("--only-extra", action="store_true", help="run only the --extra cases")
    check.set_defaults(func=cmd_check)
    passing = sub.add_parser("passing")
    passing.add_argument("file")
    passing.set_defaults(func=cmd_passing)
    variants = sub.add_parser("variants")
    variants.add_argument("--out", required=True)
    variants.add_argument("--batch", type=int, default=128)
    variants.add_argument("--context", default="65536", help="a length or a ContextSpec (mixed:2K-128K)")
    variants.add_argument("--width", default="batch", help="logits width: batch (the longest context) or a number")
    variants.add_argument("--baseline", default="", help="path of an earlier kernel module to time as `baseline`")
    variants.add_argument("--seed", type=int, default=0)
    variants.add_argument("--seconds-per-point", type=float, default=0.25)
    variants.add_argument("spec", nargs="+", help="N:config|config|... (configs as in `aot`)")
    variants.set_defaults(func=cmd_variants)
    args = parser.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
