"""Round 10: the 40 SASS instructions with the most warp-stall samples, per ncu report, from the
source page (`ncu -i REP --page source --csv --print-source sass`); shares are of all samples."""
import io
import sys
from pathlib import Path

import pandas as pd

rows = []
for path in sys.argv[2:]:
    text = Path(path).read_text().split("\n", 1)[1]  # line 1 names the kernel
    df = pd.read_csv(io.StringIO(text))
    stalls = [c for c in df.columns if c.startswith("stall_") and "Not Issued" not in c]
    df[stalls] = df[stalls].apply(pd.to_numeric, errors="coerce").fillna(0)
    samples = pd.to_numeric(df["Warp Stall Sampling (All Samples)"], errors="coerce").fillna(0)
    executed = pd.to_numeric(df["Instructions Executed"], errors="coerce").fillna(0)
    base = int(df["Address"].map(lambda a: int(a, 16)).min())
    for i in samples.sort_values(ascending=False).index[:40]:
        reasons = df.loc[i, stalls].sort_values(ascending=False)
        rows.append({
            "report": Path(path).name.removesuffix("-sass.csv"),
            "offset": hex(int(df.loc[i, "Address"], 16) - base),
            "sass": df.loc[i, "Source"].strip(),
            "share_of_samples": round(samples[i] / samples.sum(), 4),
            "executed": int(executed[i]),
            "first_reason": reasons.index[0].removeprefix("stall_"),
            "first_reason_share": round(reasons.iloc[0] / max(samples[i], 1), 3),
            "second_reason": reasons.index[1].removeprefix("stall_"),
        })
pd.DataFrame(rows).to_csv(sys.argv[1], index=False)
