#!/usr/bin/env bash
# Lab-notes round 15's fifth device call, carry [".dg", "build/vllm_topk"], at this commit: the GPU tests of the
# step and of our selections again, after the fused step's test took each next_n's serving acceptance curve
# (call4.sh's run of it stopped at next_n = 4, whose curve it had wrong). Its log ships as gpu-tests-call5.log.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/.dg:$PWD" DSA_LAB_VLLM_TOPK="$PWD/build/vllm_topk"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -k "not triton" tests/test_topk_cuda.py \
    tests/test_topk_gpu.py tests/test_serving_step_gpu.py 2>&1 | tail -15 | tee "$OUT/gpu-tests.log"
