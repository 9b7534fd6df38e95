#!/usr/bin/env bash
# The device call (2026-12-02, commit c35658f) that checked c4d8c19's shared CUDA-event loop
# (bench/timing.py `_event_samples`) on the H200: the serving GPU tests, then gluon and triton at
# B = 128, mixed:2K-128K, next_n 1, 3, 4, both timed units and both timers. DeepGEMM was not carried
# (too little device time was left to build the carry), so its two GPU tests skipped. The grid's
# heads and head dim are the ci preset's (32, 64), so its times are not the study's shapes; a
# `dsa-lab compare` against the serving study after it found no shared point for that reason.
export PYTHONPATH=$PWD DSA_LAB_GIT_SHA=c35658f PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 70 python -m pytest tests/test_serving_step_gpu.py -q -p no:cacheprovider -rs 2>&1 | tail -6
timeout 90 python -m dsa_lab.cli bench --device cuda --backend gluon,triton --strategy native,flatten \
    --batch 128 --context mixed:2K-128K --next-n 1,3,4 --timed logits,logits+topk --timer events,graph \
    --out "$OUT/verify-c4d8c19" --no-progress --max-minutes 1.3 2>&1 | tail -6
