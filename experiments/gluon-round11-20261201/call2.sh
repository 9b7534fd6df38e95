#!/usr/bin/env bash
# Round 11, call 2: checks of the kernel with page ids in the schedule (every case, poisoned, plus the
# pipelined and one-Q-buffer configs); new vs round-10 kernel in one process: uniform 64K, mixed
# 2K-128K, model width, B = 1; ablations q=1 and pipe=1.
set -uo pipefail
R=$PWD; W=$OUT/work; mkdir -p $W .dg
export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.dg:$R DSA_LAB_GIT_SHA=${SHA:-unknown} DSA_LAB_GIT_DIRTY=1
tar -xJf .scratch/r11/dg.tar.xz -C .dg
started=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $W/nvidia-smi.txt 2>&1
timeout 170 python3 scripts/gluon_dev.py check --out $W/check.jsonl --case-timeout 60 \
  --extra "1:pipe=1" "1:pipe=1;c=2;s=12" "2:pipe=1;c=2;s=12" "2:c=2;s=12" > $W/check.log 2>&1; echo "check rc=$? at $(( $(date +%s) - started )) s"
echo "ok $(grep -c '"ok": true' $W/check.jsonl) of $(wc -l < $W/check.jsonl)"; grep '"ok": false' $W/check.jsonl | cut -c1-300
V="python3 scripts/gluon_dev.py variants --baseline .scratch/r11/gluon_r10.py --seconds-per-point 0.2"
P1="1:rule|baseline|q=1|pipe=1|pipe=1;c=2;s=12"
P2="2:rule|baseline|q=1|c=2;s=12|pipe=1;c=2;s=12"
timeout 150 $V --out $W/v-b128-64k.jsonl --batch 128 --context 65536 "$P1" "$P2" "3:rule|baseline|q=1" "4:rule|baseline|q=1" "6:rule|baseline" "8:rule|baseline" > $W/v1.log 2>&1; echo "v1 rc=$? at $(( $(date +%s) - started )) s"
timeout 80 $V --out $W/v-b128-mixed.jsonl --batch 128 --context mixed:2K-128K "$P1" "$P2" "3:rule|baseline" "4:rule|baseline" "6:rule|baseline" > $W/v2.log 2>&1; echo "v2 rc=$? at $(( $(date +%s) - started )) s"
timeout 50 $V --out $W/v-b128-64k-w163840.jsonl --batch 128 --context 65536 --width 163840 "1:rule|baseline" "3:rule|baseline" "4:rule|baseline" > $W/v3.log 2>&1; echo "v3 rc=$?"
timeout 60 $V --out $W/v-b1-64k.jsonl --batch 1 --context 65536 "$P1" "$P2" "3:rule|baseline|q=1" "4:rule|baseline" > $W/v4.log 2>&1; echo "v4 rc=$? at $(( $(date +%s) - started )) s"
for f in $W/v*.log; do echo "== $f"; grep -v "^ \|Traceback\|File" $f | python3 -c "
import sys, json
for line in sys.stdin:
    try: r = json.loads(line)
    except Exception: print(line.rstrip()[:200]); continue
    if 'schedule_median_ms' in r: print('  schedule', r['next_n'], round(r['schedule_median_ms']*1e3, 2), 'us'); continue
    print('  n=%s %-60s %s %8s us  iqr %s %s' % (r['next_n'], r['config'][:60], r['ok'], round((r.get('median_ms') or 0)*1e3, 1), round(r.get('rel_iqr') or 0, 4), (r.get('error') or '')[:80]))
"; done
cd $OUT && tar czf call2.tar.gz work && rm -rf work && ls -la $OUT
