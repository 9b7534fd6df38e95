"""Round 10, call 5: per-CTA timelines of the shipped kernel (a copy that stores %globaltimer and
%clock64 at each step: gluon_timed.py) at B = 1 and at next_n = 3, B = 128, the latter also with the
scalar-id loader (gluon_timed_scalarid.py). Each trace is one cold-L2 launch into a NaN-poisoned
output, checked against the reference; the timed copies are also timed against the shipped kernel."""
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

mods = {"timed": load("gluon_timed"), "timed_scalarid": load("gluon_timed_scalarid")}
outdir = Path(sys.argv[1]); outdir.mkdir(parents=True, exist_ok=True)
dev = torch.device("cuda"); H, D = 64, 128
timing = TimingConfig(warmup=3, min_samples=20, max_samples=80, max_seconds=0.3)
flush = L2Flusher(dev)
frames, rows = [], []
for spec in sys.argv[2].split(","):  # batch:length:next_n:j0:variants(+)
    batch, length, n, j0, variants = spec.split(":")
    batch, length, n, j0 = int(batch), int(length), int(n), int(j0)
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
    programs = min(torch.cuda.get_device_properties(0).multi_processor_count, batch * -(-length // 64))
    res = torch.full((batch * n, length), float("nan"), device=dev)
    t = time_callable(lambda: gn.launch(q, cache.data, w, ctx, cache.block_table, length, cfg, res), dev, timing).as_row()
    rows.append({"batch": batch, "context": length, "next_n": n, "variant": "shipped", "median_us": t["median_ms"] * 1e3})
    for name in variants.split("+"):
        m = mods[name]
        trace = torch.full((programs * 5 * 64,), -1, dtype=torch.int64, device=dev)
        call = lambda: m.launch(q, cache.data, w, ctx, cache.block_table, length, cfg, res, trace=trace, j0=j0)
        t = time_callable(call, dev, timing).as_row()
        for rep in range(5):
            res.fill_(float("nan")); trace.fill_(-1)
            flush(); torch.cuda.synchronize()
            call(); torch.cuda.synchronize()
            got = res.view(batch, n, length)[sample].reshape(-1, length)
            rel = float((got[valid].double() - ref[valid].double()).norm() / ref[valid].double().norm())
            ok = rel < 1e-3 and not bool(torch.isnan(res).any())
            v = trace.view(programs, 5, 64).cpu().numpy()
            cta, part, slot = np.nonzero(v != -1)
            frames.append(pd.DataFrame({"batch": batch, "context": length, "next_n": n, "j0": j0, "variant": name, "rep": rep,
                                        "cta": cta, "part": part, "slot": slot, "value": v[cta, part, slot]}))
            rows.append({"batch": batch, "context": length, "next_n": n, "variant": name, "rep": rep, "ok": ok, "rel_err": rel,
                         "median_us": t["median_ms"] * 1e3})
            print(json.dumps(rows[-1]), flush=True)
pd.concat(frames).to_parquet(outdir / "traces.parquet", index=False)
with (outdir / "timeline_runs.jsonl").open("w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
