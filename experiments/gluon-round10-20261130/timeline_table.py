"""Round 10, calls 5 and 6: tables from CALL/traces.parquet (slots as gluon_timed.diff writes them);
`python timeline_table.py call5` (the default) or `call6`.

Per CTA: part 0 is the loader, 1 + c consumer c. Loader slots: 0 %globaltimer and 1 %clock64 at
entry, 2 after its first request's context lengths, 3 after its Q copy is issued, 4 + k after the
k-th KV tile's copies are issued. Consumer slots: 0 / 1 at entry, 2 when Q has arrived, and for its
t-th tile from j0 on (19 at most): 3 + 3t the tile arrived, 4 + 3t its first MMA done, 5 + 3t its
epilogue done; 62 / 63 at exit. Clock cycles become ns at the rate each CTA's consumer 0 shows
between entry and exit (%clock64 against %globaltimer).
"""
import sys
from pathlib import Path

import numpy as np
import pandas as pd

here = Path(__file__).resolve().parents[1] / (sys.argv[1] if len(sys.argv) > 1 else "call5")
df = pd.read_parquet(here / "traces.parquet")
steps, overlap = [], []
for (batch, context, next_n, variant), g in df.groupby(["batch", "context", "next_n", "variant"]):
    piv = g.pivot_table(index=["rep", "cta", "part"], columns="slot", values="value")
    loader = piv.xs(0, level="part")
    first = piv.xs(1, level="part")
    ghz = float(((first[63] - first[1]) / (first[62] - first[0])).median())
    if batch == 1:
        row = {"batch": batch, "context": context, "next_n": next_n, "variant": variant, "clock_ghz": round(ghz, 3)}
        ns = lambda a, b: float(((a - b) / ghz).median())  # noqa: E731
        row["context_lengths_read_ns"] = ns(loader[2], loader[1])
        row["q_copy_issued_ns"] = ns(loader[3], loader[1])
        row["first_kv_copy_issued_ns"] = ns(loader[4], loader[1])
        row["q_arrived_ns"] = ns(first[2], loader[1])
        row["first_kv_tile_arrived_ns"] = ns(first[3], loader[1])
        row["first_mma_done_ns"] = ns(first[4], loader[1])
        row["first_epilogue_done_ns"] = ns(first[5], loader[1])
        ends = pd.concat([piv.xs(p, level="part")[63] for p in sorted(set(g.part)) if p > 0], axis=1).max(axis=1)
        row["last_consumer_exit_ns"] = ns(ends, loader[1])
        steps.append({k: round(v) if k.endswith("_ns") else v for k, v in row.items()})
    else:
        for (rep, cta), x in piv.groupby(level=["rep", "cta"]):
            x = x.droplevel(["rep", "cta"])
            c0, c1 = x.loc[1], x.loc[2]
            spans = lambda c, a, b: [(c[a + 3 * t], c[b + 3 * t]) for t in range(19) if not np.isnan(c[a + 3 * t])]  # noqa: E731
            e0, e1 = spans(c0, 4, 5), spans(c1, 4, 5)
            lo, hi = max(e0[0][0], e1[0][0]), min(e0[-1][1], e1[-1][1])
            both = sum(max(0, min(b0, b1, hi) - max(a0, a1, lo)) for a0, b0 in e0 for a1, b1 in e1)
            overlap.append({"variant": variant, "rep": rep, "cta": cta,
                            "both_in_epilogue": both / (hi - lo),
                            "tile_period_ns": np.diff([a for a, _ in spans(c0, 3, 4)]).mean() / ghz,
                            "arrival_to_first_mma_ns": np.mean([b - a for a, b in spans(c0, 3, 4)]) / ghz,
                            "first_mma_to_tile_done_ns": np.mean([b - a for a, b in e0]) / ghz})
pd.DataFrame(steps).to_csv(here / "b1_steps.csv", index=False)
print(pd.DataFrame(steps).to_string(index=False))
if overlap:
    summary = pd.DataFrame(overlap).groupby("variant").median(numeric_only=True).drop(columns=["rep", "cta"]).round(3)
    summary.to_csv(here / "n3_consumers.csv")
    print(summary.to_string())
