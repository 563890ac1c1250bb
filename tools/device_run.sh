#!/bin/bash
# One device call: build with CUDA, run the GPU op tests and gates, optionally
# prove a mutation turns the GPU gates red, then benchmark. Logs go to $OUT.
#   TESTS=regex (default gpu_)  MUTATE=patch-name  BENCH="h8b nano8"  BENCH_ARGS=...
#   MUTATE: tests/mutations/NAME.patch applied, the tree rebuilt, the GPU
#   tests of MUTATE_TESTS run (default: the fp32 gates and the op tests that
#   hold CUDA kernels to the reference ops), then reverted
#   TP="1 2 4": tensor-parallel sizes each benchmark runs at (default 1)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on the lent machines (docs/TENSOR_PARALLEL.md)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
build() {
    cmake -S . -B build-cuda -DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; return 1; }
    cmake --build build-cuda -j "$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; return 1; }
}
build || exit 1
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
(cd build-cuda && timeout ${TEST_TIMEOUT:-300} ctest -R "${TESTS:-gpu_}" -j 4 --output-on-failure >"$OUT/ctest.log" 2>&1)
grep -E "tests passed|\*\*\*" "$OUT/ctest.log" | head -40
grep -E "rel err|sample row|DIVERGE" "$OUT/ctest.log" | head -70
if [ -n "${MUTATE:-}" ]; then
    patch -p1 < tests/mutations/$MUTATE.patch >/dev/null && build &&
        (cd build-cuda && timeout 300 ctest -R "${MUTATE_TESTS:-^gpu_(gate_fp32|ops$|attn|ssd|quant|moe_quant|kv_fp8)}" -j 4 \
            > "$OUT/mutation.log" 2>&1)
    echo "mutation $MUTATE: $(grep -c 'Failed' "$OUT/mutation.log") GPU tests red of $(grep -c 'Test *#' "$OUT/mutation.log")"
    grep -m3 DIVERGE "$OUT/mutation.log"
    patch -R -p1 < tests/mutations/$MUTATE.patch >/dev/null && build
fi
for cfg in ${BENCH:-}; do
  for tp in ${TP:-1}; do
    for g in 1 0; do
        [ $g = 0 ] && export VLLM_NO_GRAPHS=1 || unset VLLM_NO_GRAPHS
        echo "== $cfg tp=$tp graphs=$g"
        timeout 300 build-cuda/vllm bench --model bench/configs/$cfg --load-format dummy --device cuda \
            --tensor-parallel-size $tp \
            ${BENCH_ARGS:---batch-sizes 1,8,32,64 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192} 2>&1 | tee -a "$OUT/bench.log" | tail -6
        [ "${BENCH_NOGRAPHS:-0}" = 1 ] || break
    done
  done
done
