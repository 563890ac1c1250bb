#!/bin/bash
# One device call for the model families: makes the oracle fixtures of CASES
# with transformers (tools/oracle/device_fixtures.sh, in the background),
# builds with CUDA and runs the GPU tests (tools/device_run.sh: TESTS, BENCH,
# BENCH_ARGS), then the fp32 and bf16 GPU gates on the fresh fixtures.
# Logs and fixtures.tar.gz go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
(CASES=${CASES:-} PREFIX=${PREFIX:-} tools/oracle/device_fixtures.sh >"$OUT/fixtures.out" 2>&1) &
fx_pid=$!
tools/device_run.sh
wait $fx_pid
grep -E "seed [0-9]+,|failed|Error" "$OUT/fixtures.out" | grep -v rejected | head -20
modes=("" "--batch" "--both-modes --max-num-batched-tokens 3 --batch" "--batch --num-blocks 36 --block-size 4 --require-preemption" "--staggered 2 --max-num-batched-tokens 9 --max-num-seqs 3")
for d in /tmp/fx/*/; do
    [ -f "$d/golden.json" ] || continue
    n=$(basename "$d")
    for m in "${modes[@]}"; do
        r=$(timeout 120 build-cuda/vllm generate --model "$d" --golden "$d/golden.json" --device cuda --dtype float32 $m 2>&1 | tail -1)
        echo "gpu fp32 $n [$m]: $r"
    done
    r=$(timeout 120 build-cuda/vllm generate --model "$d" --golden "$d/golden.json" --device cuda --dtype bfloat16 \
        --golden-key greedy_bf16 --margin-key margins_bf16 --min-margin 0.2 --modes-agree --batch 2>&1 | tail -1)
    echo "gpu bf16 $n: $r"
done 2>&1 | tee "$OUT/family_gates.log"
