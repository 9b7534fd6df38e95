"""Round 10 experiment: the shipped Gluon kernel against two loaders that read page ids one at a time
(`scalarid`: a scalar load per tile; `ahead`: the first id with the context lengths, each next one
while the current tile is issued), one process, two repetitions, outputs compared bit for bit to the
shipped kernel's, each checked against the reference. DeepGEMM (vendored) native at next_n = 1 is
timed beside them at B = 1 for the fixed-cost comparison."""
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

mods = {"shipped": gn, "scalarid": load("gluon_scalarid"), "ahead": load("gluon_ahead")}
out = Path(sys.argv[1])
points = [tuple(int(v) for v in p.split(":")) for p in sys.argv[2].split(",")]  # batch:length:next_n
dev = torch.device("cuda"); H, D = 64, 128
timing = TimingConfig(warmup=3, min_samples=10, max_samples=60, max_seconds=0.25)
dg = get_backend("deepgemm")
caches = {}
for batch, length, n in points:
    if (batch, length) not in caches:
        caches.clear()
        caches[(batch, length)] = random_paged_cache([length] * batch, D, seed=0, device=dev)
    cache = caches[(batch, length)]
    gen = torch.Generator(device=dev).manual_seed(7)
    q = torch.randn(batch, n, H, D, generator=gen, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(batch * n, H, generator=gen, device=dev) * H**-0.5
    ctx = (length - n + 1 + torch.arange(n, device=dev, dtype=torch.int32)).repeat(batch, 1).contiguous()
    cfg = gn.choose_gluon_config(n, H, D)
    sample = sorted({0, batch - 1})
    ref = reference(q[sample].contiguous(), cache.data, w.view(batch, n, H)[sample].reshape(-1, H), ctx[sample].contiguous(),
                    cache.block_table[sample].contiguous(), length, cache_dtype="fp8")
    valid = torch.isfinite(ref)
    base = None
    for rep in range(2):
        for name, m in mods.items():
            res = torch.full((batch * n, length), float("nan"), device=dev)
            m.launch(q, cache.data, w, ctx, cache.block_table, length, cfg, res)
            torch.cuda.synchronize()
            if base is None:
                base = res.clone()
            same = bool(torch.equal(res, base))
            got = res.view(batch, n, length)[sample].reshape(-1, length)
            rel = float((got[valid].double() - ref[valid].double()).norm() / ref[valid].double().norm())
            unwritten = int(torch.isnan(res).sum())
            call = lambda: m.launch(q, cache.data, w, ctx, cache.block_table, length, cfg, res)
            t = time_callable(call, dev, timing).as_row()
            row = {"batch": batch, "context": length, "next_n": n, "variant": name, "rep": rep, "config": cfg.describe(),
                   "bitwise_equal_to_shipped": same, "rel_err": rel, "unwritten": unwritten,
                   "median_us": t["median_ms"] * 1e3, "rel_iqr": t.get("rel_iqr")}
            print(json.dumps(row), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
        if batch == 1 and n in (1, 2, 4):
            sched = dg.schedule(ctx, 64)
            call = lambda: dg.logits(q, cache.data, w, ctx, cache.block_table, length, sched, cache_dtype="fp8")
            t = time_callable(call, dev, timing).as_row()
            row = {"batch": batch, "context": length, "next_n": n, "variant": "deepgemm-native", "rep": rep,
                   "median_us": t["median_ms"] * 1e3, "rel_iqr": t.get("rel_iqr")}
            print(json.dumps(row), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
