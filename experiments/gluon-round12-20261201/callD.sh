#!/usr/bin/env bash
# Call D (round 12): Gluon configs against the rule at next_n = 2 and 8 (where DeepGEMM still leads),
# B = 128, 64K and mixed:2K-128K, through the harness (checked, cold L2), beside DeepGEMM's best option.
set -uo pipefail
R=$PWD; mkdir -p .dg /tmp/pr340
export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.dg:$R DSA_LAB_GIT_SHA=${SHA:-unknown} DSA_LAB_GIT_DIRTY=0
tar -xJf .scratch/r11/dg.tar.xz -C .dg && tar -xJf .scratch/r11/pr340-src.tar.xz -C /tmp/pr340
cp .scratch/r11/pr340_C.so /tmp/pr340/src/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so
export DSA_LAB_DEEPGEMM_PR340=/tmp/pr340/src
B="python3 -m dsa_lab.cli bench --preset h200-full --device cuda --batch 128 --context 64K,mixed:2K-128K --no-progress"
start=$(date +%s)
timeout 200 $B --backend gluon --strategy native --next-n 2 --config "$(cat .scratch/r12/c2)" --out /tmp/r12/n2 --max-minutes 3 > $OUT/n2.log 2>&1; echo "n2 rc=$? at $(( $(date +%s) - start )) s"
timeout 200 $B --backend gluon --strategy native --next-n 8 --config "$(cat .scratch/r12/c8)" --out /tmp/r12/n8 --max-minutes 3 > $OUT/n8.log 2>&1; echo "n8 rc=$? at $(( $(date +%s) - start )) s"
timeout 120 $B --backend deepgemm,deepgemm-pr340 --strategy all --next-n 2,8 --out /tmp/r12/dg --max-minutes 1.5 > $OUT/dg.log 2>&1; echo "dg rc=$? at $(( $(date +%s) - start )) s"
tail -30 $OUT/n2.log | cut -c1-200; tail -30 $OUT/n8.log | cut -c1-200; tail -12 $OUT/dg.log | cut -c1-200
tar -C /tmp -czf $OUT/r12.tar.gz r12 && ls -la $OUT
