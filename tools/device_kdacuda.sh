#!/bin/bash
# Issue 18's chunked CUDA KDA prefill (k_kda_chunk in cuda_kimi.cu), in one
# device call: builds this tree (tools/device_run.sh, into build-cuda) and
# the baseline in base.tar.gz (into build-base, beside it), runs the GPU op
# tests and the kimi GPU gates, then times prefill before / after:
#   1. the op alone: build-*/cuda_kda (bench/cuda_kda.c, copied into the
#      baseline's tree so both time the same program): Kimi-Linear-48B's 32
#      heads of 128, one sequence of 1k / 8k / 32k tokens;
#   2. end to end: vllm bench --model bench/configs/kimi48b (bf16, dummy
#      weights), batch 1, one input length per run.
# base.tar.gz is the branch's merge-base with main, made on the development
# machine in the tree's root:
#   git archive -o base.tar.gz $(git merge-base main HEAD) src include CMakeLists.txt tests bench
# (this script makes it itself when git and main are at hand). .git/info/exclude
# ignores it, so the device call names it in carry (with .devdeps), about 17 MB.
#   PHASE=all|test|bench  (default all)  LENS="1024 8192 32768"
#   E2E=0 skips the end-to-end runs; E2E_ARGS adds flags to them.
#   CS="32 64" also builds, tests and times the op at those piece lengths.
# One call may run 10 minutes and each end-to-end run loads 96 GB of dummy
# weights, so on the lent H200 run it as (the builds stay on a warm machine):
#   PHASE=test tools/device_kdacuda.sh            (builds, tests, ~5 min)
#   PHASE=bench LENS="1024 8192" tools/device_kdacuda.sh
#   PHASE=bench LENS=32768 tools/device_kdacuda.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
PHASE=${PHASE:-all}
LENS=${LENS:-1024 8192 32768}
mkdir -p "$OUT"
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
if [ ! -f base.tar.gz ] && git rev-parse --verify -q main >/dev/null 2>&1; then
    git archive -o base.tar.gz "$(git merge-base main HEAD)" src include CMakeLists.txt tests bench
fi
[ -f base.tar.gz ] || { echo "base.tar.gz missing (see the header of $0)"; exit 1; }

# The baseline, built beside the tree (cuda_kda and vllm only) from
# build-base-src; delete build-base to rebuild it.
if [ ! -x build-base/vllm ] || [ ! -x build-base/cuda_kda ]; then
    rm -rf build-base-src && mkdir -p build-base-src && tar -xzf base.tar.gz -C build-base-src
    cp bench/cuda_kda.c build-base-src/bench/
    (cmake -S build-base-src -B build-base -DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
        >"$OUT/base_cmake.log" 2>&1 &&
        cmake --build build-base -j 8 --target vllm_cli cuda_kda >"$OUT/base_build.log" 2>&1) &
    base_pid=$!
fi

if [ "$PHASE" != bench ]; then
    TESTS='gpu_.*kimi|gpu_ops' BENCH= tools/device_run.sh
    # ctest keeps a passing test's output to itself: the errors, from the test itself
    build-cuda/tests/test_cuda_ops 2>&1 | tee "$OUT/test_cuda_ops.log" | grep -E "kda|KDA|checks"
else # a warm machine keeps build-cuda: this rebuilds only what changed
    { [ -f build-cuda/CMakeCache.txt ] || cmake -S . -B build-cuda -DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_BUILD_TYPE=Release; } >"$OUT/cmake.log" 2>&1
    cmake --build build-cuda -j "$(nproc)" --target vllm_cli cuda_kda >"$OUT/build.log" 2>&1 ||
        { grep error "$OUT/build.log" | head; exit 1; }
fi
[ -n "${base_pid:-}" ] && { wait $base_pid || { tail -20 "$OUT/base_build.log"; exit 1; }; }
[ "$PHASE" = test ] && exit 0

echo "== kda_prefill alone (us/token): baseline (token by token), then this tree (chunks)"
for b in build-base build-cuda; do
    echo "-- $b"
    timeout 300 $b/cuda_kda $LENS
done 2>&1 | tee "$OUT/kda_op.log"

# CS="32 64": the chunk kernel at other piece lengths (VLLM_KDA_CS), each
# built into build-cuda-csN, tested against the reference and timed alone.
for cs in ${CS:-}; do
    cmake -S . -B build-cuda-cs$cs -DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_FLAGS=-DVLLM_KDA_CS=$cs >"$OUT/cs$cs.log" 2>&1 &&
        cmake --build build-cuda-cs$cs -j "$(nproc)" --target cuda_kda test_cuda_ops >>"$OUT/cs$cs.log" 2>&1 ||
        { grep error "$OUT/cs$cs.log" | head; continue; }
    echo "-- chunks of $cs"
    build-cuda-cs$cs/tests/test_cuda_ops 2>&1 | grep -E "kda chunks|checks"
    timeout 300 build-cuda-cs$cs/cuda_kda $LENS
done 2>&1 | tee "$OUT/kda_cs.log"

[ "${E2E:-1}" = 0 ] && exit 0
for len in $LENS; do
    for b in build-base build-cuda; do
        echo "== kimi48b bf16, batch 1, input $len: $b"
        timeout 280 $b/vllm bench --model bench/configs/kimi48b --load-format dummy --device cuda --batch-sizes 1 \
            --input-len $len --output-len 8 --warmup 1 --max-model-len $((len + 64)) --max-num-batched-tokens 8192 \
            ${E2E_ARGS:-} 2>&1 | tail -2
    done
done 2>&1 | tee "$OUT/e2e.log"
