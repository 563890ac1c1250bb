#!/bin/bash
# Issue 16: routed experts with quantized weights on CUDA (src/backend/cuda/cuda_moe.cu:
# the GEMV for n <= 32 tokens, the thin-tile and 128-row grouped GEMMs with a
# loader for codes above): FP8 (a scale per row), FP8 blocks (WF_FP8_B128) and NVFP4.
# Steps, in the order `all` runs them (the benches before the mutations, on the clean build):
#   build   build-cuda (Release, sm_90): test_cuda_moe_quant, test_cuda_quant, test_cuda_ops, vllm and cuda_ops
#           (TARGETS=all for everything)
#   test    ctest gpu_moe_quant, gpu_quant and gpu_ops, verbose: every quantized expert case's error printed
#   ops     cuda_ops' moe_experts in bf16, then in FMTS (default fp8 fp8_block nvfp4), at 1, 8, 32 and 64 rows
#   bench   vllm bench nano30b, --quantization none then each of FMTS, 1 and 64 sequences (fp8_block and
#           nvfp4 load only with the CUDA dense matmul of that format: without it, refused at load naming it)
#   mutate  lesson 5: the row scale dropped (row_scale returns 1), `test_cuda_moe_quant fp8`: every FP8
#           case must go red, the refusals stay green; then each tests/mutations/cuda_moe_*.patch alone (its
#           first line says what must go red), `test_cuda_moe_quant`: that format's 22 cases and no other
# `tools/device_fp8moe.sh` runs them all; `tools/device_fp8moe.sh STEP...` those (build first if needed).
# Logs go to $OUT. Estimated (not measured): build ~3 min cold (~30 s when build-cuda is there), test
# ~4 min (the reference op in fp32, 3 formats x 2 shapes), ops ~1 min, bench ~1.5 min a format (dummy
# quantized weights are made on the host), mutate ~1.5 min a mutation: more than one 10-minute call;
# run `build test ops`, then `bench`, then `mutate`.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on the lent machines
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
CM="-DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release"
FMTS=${FMTS:-fp8 fp8_block nvfp4}

step_build() {
    cmake -S . -B build-cuda $CM >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; return 1; }
    cmake --build build-cuda -j "$(nproc)" \
        --target ${TARGETS:-test_cuda_moe_quant test_cuda_quant test_cuda_ops vllm_cli cuda_ops} >"$OUT/build.log" 2>&1 ||
        { grep -E "error" "$OUT/build.log" | head -30; return 1; }
    nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
}
step_test() {
    (cd build-cuda && timeout 500 ctest -R 'gpu_moe_quant|gpu_quant|gpu_ops' -V >"$OUT/ctest.log" 2>&1)
    grep -E "tests passed|tests failed|\*\*\*" "$OUT/ctest.log" | head
    grep -E "moe_experts .*(fp8|nvfp4)|CHECK failed|checks" "$OUT/ctest.log" | sed 's/^[0-9]*: //' | head -150
}
step_ops() {
    for n in 1 8 32 64; do
        for f in $FMTS; do
            echo "== cuda_ops $n 32 $f (moe_experts bf16, then $f)"
            timeout 120 build-cuda/cuda_ops $n 32 $f | grep -E "copy [0-9]|moe_experts"
        done
    done 2>&1 | tee "$OUT/cuda_ops.log"
}
step_bench() {
    for q in none $FMTS; do
        echo "== nano30b --quantization $q"
        timeout 280 build-cuda/vllm bench --model bench/configs/nano30b --load-format dummy --device cuda \
            --dtype bf16 --quantization $q --batch-sizes 1,64 --input-len 1024 --output-len 64 \
            --max-num-batched-tokens 8192 2>&1 | tee "$OUT/bench_$q.log" | tail -8
    done
}
# The failed checks of $1 (a test log): those of each format's expert cases, and the others.
count_red() {
    local red=$(grep -o "CHECK failed.*" "$1") # from there: stdout may share the line
    for f in fp8 fp8_block nvfp4; do echo "  $f: $(echo "$red" | grep -c " $f n=") expert checks red"; done
    echo "  other: $(echo "$red" | grep -vcE " (fp8|fp8_block|nvfp4) n=|^$") checks red"
}
# The scales of every FP8 path go through row_scale (the GEMV's sums and the
# grouped GEMMs' epilogue): dropped, each FP8 case is off by 1 / scale (~1e4)
# and must fail: expect 22 failed checks (11 cases x 2 shapes), none of the
# refusals' (16-bit weights pass no scales: `test_cuda_ops moe` shows their
# experts unchanged).
step_mutate() {
    local f=src/backend/cuda/cuda_moe.cu
    grep -q 'return s ? s\[r\] : 1.0f; }' $f || { echo "mutation site not found"; return 1; }
    cp $f /tmp/cuda_moe.cu.orig
    sed -i "s|return s ? s\\[r\\] : 1.0f; }|return (void)s, (void)r, 1.0f; } // MUTATION|" $f
    cmake --build build-cuda -j "$(nproc)" --target test_cuda_moe_quant >"$OUT/mutate_build.log" 2>&1 &&
        timeout 200 build-cuda/tests/test_cuda_moe_quant fp8 >"$OUT/mutate.log" 2>&1
    cp /tmp/cuda_moe.cu.orig $f
    echo "row scale dropped (expect 22 fp8, 0 other):"
    count_red "$OUT/mutate.log"
    for p in tests/mutations/cuda_moe_*.patch; do
        local n=$(basename "$p" .patch)
        git apply "$p" || { echo "$n: does not apply"; continue; }
        if cmake --build build-cuda -j "$(nproc)" --target test_cuda_moe_quant >"$OUT/mutate_$n.build.log" 2>&1; then
            timeout 400 build-cuda/tests/test_cuda_moe_quant >"$OUT/mutate_$n.log" 2>&1
            echo "$n: $(head -1 "$p")"
            count_red "$OUT/mutate_$n.log"
        else
            echo "$n: build failed"; grep -E "error" "$OUT/mutate_$n.build.log" | head -5
        fi
        git apply -R "$p"
    done
    cmake --build build-cuda -j "$(nproc)" --target test_cuda_moe_quant >/dev/null 2>&1 # the restored binary
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
