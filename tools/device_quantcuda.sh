#!/bin/bash
# Issue 16: quantized dense linears on CUDA (src/backend/cuda/cuda_quant.cu: the
# GEMV of every format for 1..16 rows, prefill dequantized to the model's
# --dtype then the dense GEMM, the opt-in W8A8 FP8 prefill). One device call,
# in this order (the benches before the mutation, so that they run on the
# clean build):
#   build   build-cuda (Release, sm_90): the tests below, vllm and cuda_ops (TARGETS=all for everything)
#   test    ctest gpu_quant (every format against the CPU reference's matmul, exactness, W8A8, refusals),
#           gpu_quant_checkpoints (the quantized qwen3 checkpoints through the engine in fp32), and the
#           dense paths these commits touched: gpu_ops, the nh_dense / qwen3 gates, gpu_graphs
#   ops     cuda_ops quant at 1, 16 and 8192 rows: the GEMVs' GB/s, prefill TFLOP/s (bf16, dequantized
#           FP8 / FP8 blocks / NVFP4, FP8 W8A8)
#   bench   vllm bench h8b (dense: every format runs) and nano30b (FP8 blocks and NVFP4 experts are
#           refused at load until the routed experts run them: expect that error), --quantization
#           none, fp8, fp8_block, nvfp4, 1 and 64 sequences
#   mutate  tests/mutations/cuda_quant_nibble_swap.patch (the NVFP4 kernels' nibble order swapped):
#           gpu_quant must go red on every NVFP4 case, no other; restored after
# `tools/device_quantcuda.sh` runs them all; `tools/device_quantcuda.sh STEP...` those (build first if
# needed). Logs go to $OUT. Estimated (not measured): build ~2 min cold, test ~3 min (gpu_quant's CPU
# reference matmuls at 2048 rows), ops ~1.5 min, bench ~6 min (dummy weights quantized on the host),
# mutate ~2 min: split over calls, e.g. `build test`, then `ops mutate`, then `bench`.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on the lent machines
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
CM="-DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release"

step_build() {
    cmake -S . -B build-cuda $CM >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; return 1; }
    cmake --build build-cuda -j "$(nproc)" --target ${TARGETS:-test_cuda_quant test_quant_checkpoints test_cuda_ops \
        test_prompt_logprobs vllm_cli cuda_ops} >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; return 1; }
    nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
}
step_test() {
    (cd build-cuda && timeout 420 ctest -R '^gpu_quant$|^gpu_quant_checkpoints$' -V >"$OUT/ctest_quant.log" 2>&1)
    grep -E "rel err|exact |fp32, steps|CHECK failed|checks passed|VLLM_FP8_W8A8|tests passed|tests failed" \
        "$OUT/ctest_quant.log" | sed 's/^[0-9]*: //' | head -150
    (cd build-cuda && timeout 400 ctest -R '^gpu_ops$|^gpu_graphs$|^gpu_gate_.*(nh_dense|qwen3)' -j 4 \
        >"$OUT/ctest_dense.log" 2>&1)
    grep -E "tests passed|tests failed|\*\*\*|Failed" "$OUT/ctest_dense.log" | head -20
}
step_ops() {
    for n in 1 16 8192; do
        echo "== cuda_ops $n quant"
        timeout 300 build-cuda/cuda_ops $n $([ $n -gt 16 ] && echo 4 || echo 64) quant | grep -E "copy [0-9]|matmul|mamba|shared|VLLM"
    done 2>&1 | tee "$OUT/cuda_ops.log"
}
step_bench() {
    for m in h8b nano30b; do
        for q in none fp8 fp8_block nvfp4; do
            echo "== $m --quantization $q"
            timeout 300 build-cuda/vllm bench --model bench/configs/$m --load-format dummy --device cuda --dtype bf16 \
                --quantization $q --batch-sizes 1,64 --input-len 1024 --output-len 64 --max-num-batched-tokens 8192 \
                2>&1 | tee "$OUT/bench_${m}_$q.log" | tail -6
        done
    done
}
step_mutate() {
    git apply tests/mutations/cuda_quant_nibble_swap.patch || { echo "mutation does not apply"; return 1; }
    cmake --build build-cuda -j "$(nproc)" --target test_cuda_quant >"$OUT/mutate_build.log" 2>&1 &&
        timeout 400 build-cuda/tests/test_cuda_quant >"$OUT/mutate.log" 2>&1
    git apply -R tests/mutations/cuda_quant_nibble_swap.patch
    echo "mutation: $(grep -c "CHECK failed" "$OUT/mutate.log") checks failed (expect every nvfp4 case)," \
        "$(grep "CHECK failed" "$OUT/mutate.log" | grep -vc nvfp4) of them not NVFP4 (expect 0)"
    grep "CHECK failed" "$OUT/mutate.log" | head -5
    cmake --build build-cuda -j "$(nproc)" --target test_cuda_quant >/dev/null 2>&1 # the restored binary
}

[ $# -eq 0 ] && set -- all
for s in "$@"; do
    case $s in
    build) step_build || exit 1 ;;
    test) step_test ;;
    ops) step_ops ;;
    bench) step_bench ;;
    mutate) step_mutate ;;
    all) step_build || exit 1; step_test; step_ops; step_bench; step_mutate ;;
    *) echo "usage: $0 [build|test|ops|bench|mutate|all]..."; exit 2 ;;
    esac
done
