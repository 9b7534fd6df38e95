"""Round 10, call 4: at B = 1, how much would a loader that never waits for the context lengths gain?
`noctx` (diagnostic: takes every block of its slice as scored, valid here because every context
covers its slice) against the shipped kernel and `ahead`, with DeepGEMM native beside them."""
import json, sys, importlib.util
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dsa_lab.kernels import gluon_native as gn, get_backend
from dsa_lab.cache import random_paged_cache
from dsa_lab.bench.timing import TimingConfig, time_callable
from dsa_lab.kernels.reference import paged_mqa_logits as reference

def load(name):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / f"{name}.py")
    m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m); return m

mods = {"shipped": gn, "ahead": load("gluon_ahead"), "noctx": load("gluon_noctx")}
out = Path(sys.argv[1])
points = [tuple(int(v) for v in p.split(":")) for p in sys.argv[2].split(",")]
dev = torch.device("cuda"); H, D = 64, 128
timing = TimingConfig(warmup=3, min_samples=20, max_samples=100, max_seconds=0.3)
dg = get_backend("deepgemm")
for batch, length, n in points:
    cache = random_paged_cache([length] * batch, D, seed=0, device=dev)
    gen = torch.Generator(device=dev).manual_seed(7)
    q = torch.randn(batch, n, H, D, generator=gen, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(batch * n, H, generator=gen, device=dev) * H**-0.5
    ctx = (length - n + 1 + torch.arange(n, device=dev, dtype=torch.int32)).repeat(batch, 1).contiguous()
    cfg = gn.choose_gluon_config(n, H, D)
    ref = reference(q, cache.data, w, ctx, cache.block_table, length, cache_dtype="fp8")
    valid = torch.isfinite(ref)
    sched = dg.schedule(ctx, 64)
    for rep in range(3):
        for name, m in mods.items():
            res = torch.full((batch * n, length), float("nan"), device=dev)
            m.launch(q, cache.data, w, ctx, cache.block_table, length, cfg, res)
            torch.cuda.synchronize()
            rel = float((res[valid].double() - ref[valid].double()).norm() / ref[valid].double().norm())
            ok = bool(torch.equal(torch.isfinite(res), valid)) and not bool(torch.isnan(res).any())
            t = time_callable(lambda: m.launch(q, cache.data, w, ctx, cache.block_table, length, cfg, res), dev, timing).as_row()
            row = {"batch": batch, "context": length, "next_n": n, "variant": name, "rep": rep, "rel_err": rel,
                   "masks_match": ok, "median_us": t["median_ms"] * 1e3, "rel_iqr": t.get("rel_iqr")}
            print(json.dumps(row), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
        if n in (1, 2, 4):
            t = time_callable(lambda: dg.logits(q, cache.data, w, ctx, cache.block_table, length, sched, cache_dtype="fp8"), dev, timing).as_row()
            row = {"batch": batch, "context": length, "next_n": n, "variant": "deepgemm-native", "rep": rep,
                   "median_us": t["median_ms"] * 1e3, "rel_iqr": t.get("rel_iqr")}
            print(json.dumps(row), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
