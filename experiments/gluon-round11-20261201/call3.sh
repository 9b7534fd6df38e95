#!/usr/bin/env bash
# Round 11, call 3: where the balanced kernel lost to round 10 on uniform 64K (n = 8 by 11 %, n = 3 by 1.7 %):
# one Q buffer against two, ring depth and issue groups at n = 3, next to the round-10 kernel in one process.
set -uo pipefail
R=$PWD; W=$OUT/work; mkdir -p $W .dg
export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.dg:$R
tar -xJf .scratch/r11/dg.tar.xz -C .dg
started=$(date +%s)
V="python3 scripts/gluon_dev.py variants --baseline .scratch/r11/gluon_r10.py --seconds-per-point 0.2"
timeout 200 $V --out $W/v-b128-64k.jsonl --batch 128 --context 65536 "8:rule|baseline|q=1" "7:rule|baseline|q=1" "5:rule|baseline|q=1" \
  "3:rule|baseline|g=256|s=9;c=3|q=1;s=8" > $W/v1.log 2>&1; echo "v1 rc=$? at $(( $(date +%s) - started )) s"
timeout 100 $V --out $W/v-b128-mixed.jsonl --batch 128 --context mixed:2K-128K "8:rule|q=1" "3:rule|g=256" > $W/v2.log 2>&1; echo "v2 rc=$? at $(( $(date +%s) - started )) s"
for f in $W/v*.log; do echo "== $f"; grep -v "^ \|Traceback\|File" $f | python3 -c "
import sys, json
for line in sys.stdin:
    try: r = json.loads(line)
    except Exception: print(line.rstrip()[:200]); continue
    if 'schedule_median_ms' in r: continue
    print('  n=%s %-60s %s %8s us  iqr %s %s' % (r['next_n'], r['config'][:60], r['ok'], round((r.get('median_ms') or 0)*1e3, 1), round(r.get('rel_iqr') or 0, 4), (r.get('error') or '')[:80]))
"; done
cd $OUT && tar czf call3.tar.gz work && rm -rf work
