#!/bin/bash
# Issue 16: the fp8 (e4m3) KV cache on CUDA (--kv-cache-dtype fp8; cuda_attn.cu's
# kv_write / qk_norm_rope / split-KV decode, cuda_flash.cu's fp8 tiles). One device
# call, in this order (the benches before the mutation, on the clean build):
#   build   build-cuda (Release, sm_90): the tests below and vllm (TARGETS=all for everything)
#   test    gpu_kv_fp8 verbose (every case's error), gpu_kv_fp8_model (end to end), then
#           gpu_ops, the fp32 / bf16 gates of qwen3 and nh_dense and gpu_graphs (the
#           fp32 / bf16 caches through the same kernels), and the CPU kv_fp8 tests
#   bench   qwen3_8b (dummy weights): bf16 KV then fp8 KV at 1 and 64 sequences of 1024 + 128
#           tokens, and a long-context decode line (8192 + 128) where fp8 halves the KV reads
#   mutate  tests/mutations/cuda_kv_fp8_decode_v_scale_dropped.patch (the decode kernel
#           reads V without v_scale): gpu_kv_fp8 must go red in the decode rows of every
#           case with v_scale != 1 that takes the decode kernel; restored after
# `tools/device_kvfp8.sh` runs them all; `tools/device_kvfp8.sh STEP...` those (build first if needed).
# Logs go to $OUT. Estimated (not measured): build ~3 min cold, test ~3 min, bench ~4 min, mutate ~1.5 min.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on the lent machines
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
CM="-DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release"
TG="test_cuda_kv_fp8 test_kv_fp8 test_kv_fp8_model test_cuda_ops vllm_cli"

step_build() {
    cmake -S . -B build-cuda $CM >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; return 1; }
    cmake --build build-cuda -j "$(nproc)" --target ${TARGETS:-$TG} >"$OUT/build.log" 2>&1 ||
        { grep -E "error" "$OUT/build.log" | head -30; return 1; }
    nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
}
step_test() {
    (cd build-cuda && timeout 400 ctest -R '^gpu_kv_fp8' -V >"$OUT/ctest_kvfp8.log" 2>&1)
    grep -E "tests passed|tests failed|\*\*\*|rel err|codes differ|CHECK failed|budget|agreement|checks" \
        "$OUT/ctest_kvfp8.log" | sed 's/^[0-9]*: //' | head -90
    (cd build-cuda && timeout 400 ctest -R '^gpu_ops$|^gpu_gate_(fp32|bf16)_(qwen3|nh_dense)|^gpu_graphs$|^kv_fp8' \
        -j 4 --output-on-failure >"$OUT/ctest.log" 2>&1)
    grep -E "tests passed|tests failed|\*\*\*" "$OUT/ctest.log" | head -40
}
step_bench() {
    local b="build-cuda/vllm bench --model bench/configs/qwen3_8b --load-format dummy --device cuda"
    for kv in auto fp8; do
        echo "== qwen3_8b --kv-cache-dtype $kv, 1024 + 128"
        timeout 280 $b --kv-cache-dtype $kv --batch-sizes 1,64 --input-len 1024 --output-len 128 \
            2>&1 | tee "$OUT/bench_$kv.log" | tail -5
    done
    for kv in auto fp8; do
        echo "== qwen3_8b --kv-cache-dtype $kv, long context 8192 + 128"
        timeout 280 $b --kv-cache-dtype $kv --batch-sizes 1,16 --input-len 8192 --output-len 128 \
            --max-num-batched-tokens 8192 2>&1 | tee "$OUT/bench_long_$kv.log" | tail -4
    done
}
step_mutate() {
    local p=tests/mutations/cuda_kv_fp8_decode_v_scale_dropped.patch
    patch -p1 <$p >/dev/null || { echo "mutation does not apply"; return 1; }
    cmake --build build-cuda -j "$(nproc)" --target test_cuda_kv_fp8 >"$OUT/mutate_build.log" 2>&1 &&
        timeout 300 build-cuda/tests/test_cuda_kv_fp8 >"$OUT/mutate.log" 2>&1
    patch -R -p1 <$p >/dev/null
    grep -E "^[a-z].*heads of|rel err" "$OUT/mutate.log" | head -60
    echo "mutation: $(grep -c "CHECK failed" "$OUT/mutate.log") checks failed (expect the decode rows, plain and" \
        "fixed shapes, of qwen3-8b, mha-64, gqa-96 and long-context, and both graph tests: 12; none of" \
        "nemotron-h (v_scale 1), generic-20 (the generic kernel), the prefill rows or the codes)"
    cmake --build build-cuda -j "$(nproc)" --target test_cuda_kv_fp8 >/dev/null 2>&1 # the restored binary
}

[ $# -eq 0 ] && set -- all
for s in "$@"; do
    case $s in
    build) step_build || exit 1 ;;
    test) step_test ;;
    bench) step_bench ;;
    mutate) step_mutate ;;
    all) step_build || exit 1; step_test; step_bench; step_mutate ;;
    *) echo "usage: $0 [build|test|bench|mutate|all]..."; exit 2 ;;
    esac
done
