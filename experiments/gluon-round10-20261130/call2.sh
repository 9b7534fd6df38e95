#!/usr/bin/env bash
# Round 10, call 2: consumer count / ring depth at small batches (B=1, 16) and at B=64 L=32K, against the rule.
set -uo pipefail
R=$PWD
W=$OUT/work; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.dg:$R
C4="c=4;s=12;l=24;w=l"
for bl in 1:32768 1:65536 16:65536 64:32768; do b=${bl%:*}; l=${bl#*:}
  timeout 150 python3 scripts/gluon_dev.py variants --out $W/variants.jsonl --batch $b --context $l \
    "1:rule|$C4|c=4;s=8;l=24;w=l|c=2;s=8|rule" "2:rule|$C4|c=2;s=8|rule" "4:rule|c=2;s=8|rule" > $W/variants-$b-$l.log 2>&1
  echo "B=$b L=$l rc=$?"
done
python3 - <<PY
import json, collections
t=collections.defaultdict(list)
for l in open("$W/variants.jsonl"):
    r=json.loads(l)
    if r.get("ok"): t[(r["batch"],r["context"],r["next_n"])].append((r["config"], round(r["median_ms"]*1e3,2)))
    else: print("FAIL", r)
for k,v in sorted(t.items()): print(k, v)
PY
cd $OUT && tar czf call2.tar.gz work && rm -rf work
