#!/bin/bash
# Issue 13's decode checkpoints (branch ckptdec) in one device call: builds
# this tree with CUDA into build-cuda (tools/device_run.sh), runs the GPU op
# tests and the GPU prefix gates (conv1d_update / ssd_decode / kda_decode
# writing batch.ckpt_dst against the CPU reference; gpu_gate_prefix_reply_fp32:
# a next turn hits into the previous reply, token- and logit-exact against
# caching off, with the decode steps replayed from CUDA graphs), prints the
# reply gate's own lines, then the H200 figure of docs/BENCHMARKS.md: the
# nano8 chat workload, caching off and on in one run. Before this branch the
# same command gave later turns' TTFT p50 66.0 ms off / 17.7 ms on (3.7x).
# Logs go to $OUT. About 4 minutes on an H200 (most of it the build).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TESTS=${TESTS:-'gpu_ops|gpu_gate_prefix|gpu_gate_warm'} BENCH= tools/device_run.sh || exit 1
echo "== gpu_gate_prefix_reply_fp32, its lines"
VLLM_FIXTURES=tests/fixtures timeout 120 build-cuda/tests/test_prefix_reply --device cuda 2>&1 | tail -8
echo "== nano8 chat, caching off then on"
timeout 300 build-cuda/vllm bench --workload chat --model bench/configs/nano8 --load-format dummy --device cuda \
    --conversations 8 --turns 4 --max-num-batched-tokens 8192 --kv-cache-gb 16 --prefix-state-gb 4 2>&1 |
    tee "$OUT/chat_nano8.log"
