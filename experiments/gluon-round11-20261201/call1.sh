#!/usr/bin/env bash
# Round 11, call 1: PR #340 built in the background; the balanced Gluon kernel checked (every case,
# poisoned); new vs round-10 kernel timed in one process (uniform, mixed, model width, B = 1); then
# the harness over gluon, deepgemm, deepgemm-pr340 on uniform and mixed contexts.
set -uo pipefail
R=$PWD; W=$OUT/work; mkdir -p $W .dg /tmp/pr340
export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.dg:$R DSA_LAB_GIT_SHA=${SHA:-unknown} DSA_LAB_GIT_DIRTY=1
tar -xJf .scratch/r11/dg.tar.xz -C .dg && tar -xJf .scratch/r11/pr340-src.tar.xz -C /tmp/pr340
started=$(date +%s)
( cd /tmp/pr340/src && CC=/usr/bin/gcc CXX=/usr/bin/g++ LDSHARED="/usr/bin/gcc -shared" \
    python3 setup.py build_ext --inplace > $W/pr340-build.log 2>&1; echo "build rc=$? after $(( $(date +%s) - started )) s" >> $W/pr340-build.log ) &
build=$!
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $W/nvidia-smi.txt 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" > $W/versions.txt 2>&1
timeout 200 python3 scripts/gluon_dev.py check --out $W/check.jsonl --case-timeout 90 > $W/check.log 2>&1; echo "check rc=$? at $(( $(date +%s) - started )) s"
grep -c '"ok": true' $W/check.jsonl; grep '"ok": false' $W/check.jsonl | cut -c1-300
V="python3 scripts/gluon_dev.py variants --baseline .scratch/r11/gluon_r10.py --seconds-per-point 0.2"
timeout 100 $V --out $W/v-b128-64k.jsonl --batch 128 --context 65536 "1:rule|baseline" "2:rule|baseline" "3:rule|baseline" "4:rule|baseline" "6:rule|baseline" "8:rule|baseline" > $W/v1.log 2>&1; echo "v1 rc=$?"
timeout 100 $V --out $W/v-b128-mixed.jsonl --batch 128 --context mixed:2K-128K "1:rule|baseline" "3:rule|baseline" "4:rule|baseline" "6:rule|baseline" > $W/v2.log 2>&1; echo "v2 rc=$?"
timeout 60 $V --out $W/v-b128-64k-w163840.jsonl --batch 128 --context 65536 --width 163840 "3:rule|baseline" "4:rule|baseline" > $W/v3.log 2>&1; echo "v3 rc=$?"
timeout 60 $V --out $W/v-b1-64k.jsonl --batch 1 --context 65536 "1:rule|baseline" "3:rule|baseline|q=1" > $W/v4.log 2>&1; echo "v4 rc=$?"
cat $W/v*.log | grep -v "^ " | cut -c1-220
wait $build; tail -2 $W/pr340-build.log
SO=$(ls /tmp/pr340/src/deep_gemm/_C*.so 2>/dev/null | head -1)
if [ -n "$SO" ]; then strip --strip-unneeded "$SO"; cp "$SO" $OUT/; export DSA_LAB_DEEPGEMM_PR340=/tmp/pr340/src; fi
echo "bench from $(( $(date +%s) - started )) s"
timeout 220 python3 -m dsa_lab.cli bench --preset h200-full --device cuda --out $W/bench \
  --backend gluon,deepgemm,deepgemm-pr340 --batch 1,128 --context 64K,mixed:2K-128K --next-n 1,2,3,4,6 --strategy all \
  --max-minutes 3.4 > $W/bench.log 2>&1; echo "bench rc=$?"
tail -45 $W/bench.log | cut -c1-200
cd $OUT && tar czf call1.tar.gz work && rm -rf work && ls -la $OUT
