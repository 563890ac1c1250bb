#!/bin/bash
# Issue 16: routed experts with FP8 weights on CUDA (src/backend/cuda/cuda_moe.cu:
# the GEMV for n <= 32 tokens, the thin-tile and 128-row grouped GEMMs with an
# FP8 loader above). One device call, in this order (the benches before the mutation, so
# that they run on the clean build):
#   build   build-cuda (Release, sm_90): test_cuda_ops, vllm and cuda_ops (TARGETS=all for everything)
#   test    ctest gpu_ops, verbose: every FP8 case's error printed (a pass shows no output otherwise)
#   ops     cuda_ops' moe_experts in bf16 and FP8 at 1, 8 and 32 rows: GB/s and % of copy
#   bench   vllm bench nano30b, --quantization none then fp8, 1 and 8 sequences
#   mutate  lesson 5: the row scale dropped (row_scale returns 1), `test_cuda_ops fp8` (the routers
#           and the FP8 experts): every FP8 case must go red, the routers stay green; restored after
# `tools/device_fp8moe.sh` runs them all; `tools/device_fp8moe.sh STEP...` those (build first if needed).
# Logs go to $OUT. Estimated (not measured): build ~2 min cold (~30 s when build-cuda is there), test
# ~1 min, ops ~30 s, bench ~1.5 min (the FP8 dummy weights are quantized on the host), mutate ~1 min:
# ~4 min on a warm build-cuda, ~6 cold; should one call not hold it, run `build test ops` steps, then
# `bench mutate` in a second.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on the lent machines
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
CM="-DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release"

step_build() {
    cmake -S . -B build-cuda $CM >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; return 1; }
    cmake --build build-cuda -j "$(nproc)" --target ${TARGETS:-test_cuda_ops vllm_cli cuda_ops} >"$OUT/build.log" 2>&1 ||
        { grep -E "error" "$OUT/build.log" | head -30; return 1; }
    nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
}
step_test() {
    (cd build-cuda && timeout 300 ctest -R gpu_ops -V >"$OUT/ctest.log" 2>&1)
    grep -E "tests passed|tests failed|\*\*\*" "$OUT/ctest.log" | head
    grep -E "moe_experts .*fp8|FP8|CHECK failed|checks" "$OUT/ctest.log" | sed 's/^[0-9]*: //' | head -60
}
step_ops() {
    for n in 1 8 32; do
        echo "== cuda_ops $n (moe_experts bf16, then FP8)"
        timeout 120 build-cuda/cuda_ops $n 32 fp8 | grep -E "copy [0-9]|moe_experts"
    done 2>&1 | tee "$OUT/cuda_ops.log"
}
step_bench() {
    for q in none fp8; do
        echo "== nano30b --quantization $q"
        timeout 280 build-cuda/vllm bench --model bench/configs/nano30b --load-format dummy --device cuda \
            --quantization $q --batch-sizes 1,8 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 \
            2>&1 | tee "$OUT/bench_$q.log" | tail -8
    done
}
# The scales of every FP8 path go through row_scale (the GEMV's sums and the
# grouped GEMMs' epilogue): dropped, each FP8 case is off by 1 / scale (~1e4)
# and must fail: expect 22 failed checks (11 cases x 2 shapes), none of the
# routers' (16-bit weights pass no scales: `test_cuda_ops moe` shows their
# experts unchanged, at twice the time).
step_mutate() {
    local f=src/backend/cuda/cuda_moe.cu
    grep -q 'return s ? s\[r\] : 1.0f; }' $f || { echo "mutation site not found"; return 1; }
    cp $f /tmp/cuda_moe.cu.orig
    sed -i "s|return s ? s\\[r\\] : 1.0f; }|return (void)s, (void)r, 1.0f; } // MUTATION|" $f
    cmake --build build-cuda -j "$(nproc)" --target test_cuda_ops >"$OUT/mutate_build.log" 2>&1 &&
        timeout 200 build-cuda/tests/test_cuda_ops fp8 >"$OUT/mutate.log" 2>&1
    cp /tmp/cuda_moe.cu.orig $f
    grep -E "moe_experts .*fp8" "$OUT/mutate.log" | head -24
    echo "mutation: $(grep -c "CHECK failed" "$OUT/mutate.log") checks failed (expect 22: every FP8 case)," \
        "$(grep "CHECK failed" "$OUT/mutate.log" | grep -vc fp8) of them not FP8 (expect 0: the routers')"
    cmake --build build-cuda -j "$(nproc)" --target test_cuda_ops >/dev/null 2>&1 # the restored binary
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
