#!/usr/bin/env bash
# Lab-notes round 15's fourth device call, carry [".dg", "build/vllm_topk"], at this commit: the staged-collect split
# select with four loads a thread in flight and its launches started early (dsa_lab/kernels/csrc/split_select.cu),
# and `gluon-fused`. First every GPU test of the step and of our selections; then the grid of call.sh (gluon + vLLM's
# top-k, gluon + cuda-split, gluon-fused) in one process; then the step study (the `step` preset, gluon-fused among
# its backends), shipped as data/h100/h100-step-fused-20261207/.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/.dg:$PWD" DSA_LAB_VLLM_TOPK="$PWD/build/vllm_topk"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
timeout 110 python3 -m pytest -q -p no:cacheprovider --tb=line -k "not triton" tests/test_topk_cuda.py \
    tests/test_topk_gpu.py tests/test_replay_gpu.py tests/test_serving_step_gpu.py 2>&1 | tail -12 \
    | tee "$OUT/gpu-tests.log"
timeout 130 python3 -m dsa_lab.cli bench --backend gluon,gluon-fused --strategy native --batch 1,16,64,128 \
    --context 65536,mixed:2048-131072 --next-n 1,3,4 --heads 64 --head-dim 128 --timed logits,logits+topk \
    --topk-impl vllm,cuda-split --timer graph --logits-width model:163840 --device cuda \
    --out "$OUT/early-unrolled" --max-minutes 1.9 --no-progress | tail -42
rm -f "$OUT/early-unrolled/results.parquet"
SKIP_TESTS=1 RUN_NAME=h100-step-fused MAX_MINUTES=4.0 bash scripts/step_study.sh | tail -5
rm -f "$OUT/h100-step-fused/results.parquet"
