#!/bin/bash
# One device call: build with CUDA, run the GPU op tests and gates, then the
# benchmarks named in $BENCH (space-separated config names). Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
cmake -S . -B build-cuda -DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build-cuda -j "$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
(cd build-cuda && timeout ${TEST_TIMEOUT:-300} ctest -R "${TESTS:-gpu_}" -j 4 --output-on-failure >"$OUT/ctest.log" 2>&1)
grep -E "tests passed|Failed|\*\*\*" "$OUT/ctest.log" | head -40
grep -E "rel err|sample row" "$OUT/ctest.log" | head -60
for cfg in ${BENCH:-}; do
    timeout 240 build-cuda/vllm bench --model bench/configs/$cfg --load-format dummy --device cuda \
        ${BENCH_ARGS:---batch-sizes 1,8,32,64 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192} 2>&1 | tee -a "$OUT/bench.log"
done
