#!/usr/bin/env bash
# Lab-notes round 15's first device call (the count-then-collect split select of 9dbdd6a), carry [".dg", "build/vllm_topk"]: the GPU tests of our two CUDA selections,
# then `cuda-split` (dsa_lab/topk/csrc/split_select.cu) against vLLM's top-k and `cuda-radix` after gluon's logits,
# at the model's shape, in one process (data/h100/experiments/topk-cuda-split-20261207/).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_topk_cuda.py 2>&1 | tail -15 | tee "$OUT/gpu-tests.log"
timeout 300 python3 -m dsa_lab.cli bench --backend gluon --strategy native --batch 1,16,64,128 \
    --context 65536,mixed:2048-131072 --next-n 1,3,4 --heads 64 --head-dim 128 --timed logits,logits+topk \
    --topk-impl vllm,cuda-split,cuda-radix --timer graph --logits-width model:163840 --device cuda \
    --out "$OUT/topk-cuda-split" --max-minutes 4 --no-progress
rm -f "$OUT/topk-cuda-split/results.parquet"
