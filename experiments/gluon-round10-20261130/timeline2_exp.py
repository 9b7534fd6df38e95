"""Round 10, call 6: (a) the shipped kernel against `prefetch` (its loader prefetches the four TMA
descriptors at entry), timed in one process; (b) timelines at B = 1 of the timed copy cold and warm
(no L2 flush: the same launch again) and of the timed copy with the prefetch, cold."""
import json, sys, importlib.util
from pathlib import Path
import numpy as np
import pandas as pd
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dsa_lab.kernels import gluon_native as gn
from dsa_lab.cache import random_paged_cache
from dsa_lab.bench.timing import L2Flusher, TimingConfig, time_callable
from dsa_lab.kernels.reference import paged_mqa_logits as reference

def load(name):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / f"{name}.py")
    m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m); return m

timed = {"timed": load("gluon_timed"), "timed_prefetch": load("gluon_timed_prefetch")}
plain = {"shipped": gn, "prefetch": load("gluon_prefetch")}
outdir = Path(sys.argv[1]); outdir.mkdir(parents=True, exist_ok=True)
dev = torch.device("cuda"); H, D = 64, 128
timing = TimingConfig(warmup=3, min_samples=20, max_samples=80, max_seconds=0.3)
flush = L2Flusher(dev)
frames, rows = [], []
def record(row):
    rows.append(row); print(json.dumps(row), flush=True)
for spec in sys.argv[2].split(","):  # batch:length:next_n
    batch, length, n = (int(v) for v in spec.split(":"))
    cache = random_paged_cache([length] * batch, D, seed=0, device=dev)
    gen = torch.Generator(device=dev).manual_seed(7)
    q = torch.randn(batch, n, H, D, generator=gen, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(batch * n, H, generator=gen, device=dev) * H**-0.5
    ctx = (length - n + 1 + torch.arange(n, device=dev, dtype=torch.int32)).repeat(batch, 1).contiguous()
    cfg = gn.choose_gluon_config(n, H, D)
    sample = sorted({0, batch - 1})
    ref = reference(q[sample].contiguous(), cache.data, w.view(batch, n, H)[sample].reshape(-1, H), ctx[sample].contiguous(),
                    cache.block_table[sample].contiguous(), length, cache_dtype="fp8")
    valid = torch.isfinite(ref)
    res = torch.full((batch * n, length), float("nan"), device=dev)
    def check():
        got = res.view(batch, n, length)[sample].reshape(-1, length)
        rel = float((got[valid].double() - ref[valid].double()).norm() / ref[valid].double().norm())
        return rel, rel < 1e-3 and not bool(torch.isnan(res).any())
    for rep in range(3):
        for name, m in plain.items():
            res.fill_(float("nan")); m.launch(q, cache.data, w, ctx, cache.block_table, length, cfg, res); torch.cuda.synchronize()
            rel, ok = check()
            t = time_callable(lambda: m.launch(q, cache.data, w, ctx, cache.block_table, length, cfg, res), dev, timing).as_row()
            record({"batch": batch, "context": length, "next_n": n, "variant": name, "rep": rep, "ok": ok, "rel_err": rel,
                    "median_us": t["median_ms"] * 1e3, "rel_iqr": t.get("rel_iqr")})
    if batch != 1:
        continue
    programs = min(torch.cuda.get_device_properties(0).multi_processor_count, batch * -(-length // 64))
    for name, l2 in (("timed", "cold"), ("timed", "warm"), ("timed_prefetch", "cold")):
        m = timed[name]
        trace = torch.full((programs * 5 * 64,), -1, dtype=torch.int64, device=dev)
        call = lambda: m.launch(q, cache.data, w, ctx, cache.block_table, length, cfg, res, trace=trace, j0=0)
        for rep in range(5):
            res.fill_(float("nan"))
            if l2 == "warm":
                call()
            else:
                flush()
            trace.fill_(-1); torch.cuda.synchronize()
            call(); torch.cuda.synchronize()
            rel, ok = check()
            v = trace.view(programs, 5, 64).cpu().numpy()
            cta, part, slot = np.nonzero(v != -1)
            frames.append(pd.DataFrame({"batch": batch, "context": length, "next_n": n, "j0": 0, "variant": f"{name}-{l2}",
                                        "rep": rep, "cta": cta, "part": part, "slot": slot, "value": v[cta, part, slot]}))
            record({"batch": batch, "context": length, "next_n": n, "variant": f"{name}-{l2}", "rep": rep, "ok": ok, "rel_err": rel})
pd.concat(frames).to_parquet(outdir / "traces.parquet", index=False, compression="zstd")
with (outdir / "runs.jsonl").open("w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
