#!/usr/bin/env bash
# Round 10, call 1: loader page-id variants against the shipped Gluon kernel; ncu source counters at n=1, 2.
set -uo pipefail
R=$PWD
W=$OUT/work; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.dg:$R
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
P=1:1024:1,1:32768:1,1:32768:2,1:32768:3,1:32768:4,1:32768:8,1:65536:1,1:65536:2,1:65536:3,1:65536:4,1:65536:8
P=$P,16:65536:1,16:65536:8,64:32768:3,128:65536:1,128:65536:2,128:65536:3,128:65536:4,128:65536:8
timeout 360 python3 .scratch/r11/loader_exp.py $W/loader.jsonl $P > $W/loader.log 2>&1; echo "loader rc=$?"
python3 - <<PY
import json, collections
rows=[json.loads(l) for l in open("$W/loader.jsonl")]
t=collections.defaultdict(list)
for r in rows: t[(r["batch"],r["context"],r["next_n"],r["variant"])].append(r["median_us"])
bad=[r for r in rows if "rel_err" in r and (r["rel_err"]>1e-3 or r["unwritten"])]
print("bad", len(bad))
for k in sorted({k[:3] for k in t}):
    base=min(t[k+("shipped",)])
    print(k, " ".join(f"{v}={min(t[k+(v,)]):.1f}({min(t[k+(v,)])/base:.3f})" for v in ("shipped","scalarid","ahead","deepgemm-native") if k+(v,) in t))
PY
for vn in shipped:1 ahead:1 shipped:2; do v=${vn%:*}; n=${vn#*:}
  timeout 75 ncu --profile-from-start off --import-source no --section SpeedOfLight --section WarpStateStats \
    --section SourceCounters --section MemoryWorkloadAnalysis -o $W/ncu-$v-n$n \
    python3 .scratch/r11/ncu_gluon.py $v $n > $W/ncu-$v-n$n.log 2>&1; echo "ncu $v n=$n rc=$?"
  ncu -i $W/ncu-$v-n$n.ncu-rep --page source --csv --print-source sass > $W/ncu-$v-n$n-sass.csv 2>&1
  ncu -i $W/ncu-$v-n$n.ncu-rep --page details --csv > $W/ncu-$v-n$n-details.csv 2>&1
done
ls -la $W | head -30
cd $OUT && tar czf call1.tar.gz work && rm -rf work && ls -la $OUT
