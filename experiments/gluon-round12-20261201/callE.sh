#!/usr/bin/env bash
# Call E (round 12): fewer KV ring stages at next_n = 3-8 (call D: 6 stages beat the rule's 9 at n = 8).
set -uo pipefail
R=$PWD; mkdir -p .dg
export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.dg:$R DSA_LAB_GIT_SHA=${SHA:-unknown} DSA_LAB_GIT_DIRTY=0
tar -xJf .scratch/r11/dg.tar.xz -C .dg
B="python3 -m dsa_lab.cli bench --preset h200-full --device cuda --batch 128 --context 64K,mixed:2K-128K --no-progress --backend gluon --strategy native"
start=$(date +%s)
timeout 200 $B --next-n 5,6,7,8 --config "$(cat .scratch/r12/c58)" --out /tmp/r12/n58 --max-minutes 3 > $OUT/n58.log 2>&1; echo "n58 rc=$? at $(( $(date +%s) - start )) s"
timeout 100 $B --next-n 4 --config "$(cat .scratch/r12/c4)" --out /tmp/r12/n4 --max-minutes 1.5 > $OUT/n4.log 2>&1; echo "n4 rc=$? at $(( $(date +%s) - start )) s"
timeout 100 $B --next-n 3 --config "$(cat .scratch/r12/c3)" --out /tmp/r12/n3 --max-minutes 1.5 > $OUT/n3.log 2>&1; echo "n3 rc=$? at $(( $(date +%s) - start )) s"
grep -A40 "median kernel" $OUT/n58.log | cut -c1-200; grep -A12 "median kernel" $OUT/n4.log | cut -c1-200; grep -A12 "median kernel" $OUT/n3.log | cut -c1-200
tar -C /tmp -czf $OUT/r12e.tar.gz r12 && ls -la $OUT
