#!/bin/bash
# Issue 18's KDA decode step on the GPU (k_kda_step in cuda_kimi.cu), in one
# device call:
#   1. builds this tree (test_cuda_ops, cuda_kda, vllm_cli into build-cuda)
#      and, where base.tar.gz is here, the baseline's cuda_kda (k_kda: a
#      block per head, its state in shared memory) into build-base, with
#      this tree's bench/cuda_kda.c copied in so both time the same program;
#   2. runs the GPU op tests and the kimi GPU gates: ctest -R 'gpu_ops|gpu_.*kimi';
#   3. times kda_decode alone, baseline then this tree: 1, 16 and 64
#      sequences at Kimi-Linear-48B's 32 heads of 128 (us a step and the
#      fraction of the state's read + write roofline at 4.28 TB/s);
#   4. applies tests/mutations/cuda_kda_step_warp_dropped.patch, rebuilds,
#      counts the red checks of test_cuda_ops and the red kimi gates, reverts.
# base.tar.gz is main's f35eda2 (the branch's merge-base), made on the
# development machine in the tree's root:
#   git archive -o base.tar.gz f35eda2 src include CMakeLists.txt tests bench
# (this script makes it itself when git and main are at hand); carry it if
# ignored. Without it the baseline is skipped.
#   PHASE=all|test|bench (default all)  MUTATE=0 skips step 4
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
PHASE=${PHASE:-all}
mkdir -p "$OUT"
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
if [ ! -f base.tar.gz ] && git rev-parse --verify -q main >/dev/null 2>&1; then
    git archive -o base.tar.gz "$(git merge-base main HEAD)" src include CMakeLists.txt tests bench
fi
J=$(nproc)

# The baseline's cuda_kda, in the background beside this tree's build.
base_pid=
if [ -f base.tar.gz ] && [ ! -x build-base/cuda_kda ]; then
    rm -rf build-base-src && mkdir -p build-base-src && tar -xzf base.tar.gz -C build-base-src
    cp bench/cuda_kda.c build-base-src/bench/
    (cmake -S build-base-src -B build-base -DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
        cmake --build build-base -j $((J / 2)) --target cuda_kda) >"$OUT/base_build.log" 2>&1 &
    base_pid=$!
fi
[ -f base.tar.gz ] || echo "base.tar.gz missing: no baseline (see the header of $0)"

build() { # targets...
    { [ -f build-cuda/CMakeCache.txt ] || cmake -S . -B build-cuda -DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_BUILD_TYPE=Release; } >>"$OUT/build.log" 2>&1
    cmake --build build-cuda -j "$J" --target "$@" >>"$OUT/build.log" 2>&1 || { grep error "$OUT/build.log" | head -20; return 1; }
}
build test_cuda_ops cuda_kda vllm_cli || exit 1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader

if [ "$PHASE" != bench ]; then
    echo "== ctest -R 'gpu_ops|gpu_.*kimi'"
    # -V: the op tests' own lines (a passing test's output too), prefixed by the test's number
    (cd build-cuda && timeout 300 ctest -R 'gpu_ops|gpu_.*kimi' -j 4 -V >"$OUT/ctest.log" 2>&1)
    grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout" "$OUT/ctest.log" | head -30
    grep -E "kda|KDA|CHECK failed|cuda ops: " "$OUT/ctest.log"
fi

if [ -n "$base_pid" ]; then
    wait $base_pid || { echo "baseline build failed:"; tail -5 "$OUT/base_build.log"; }
fi
if [ "$PHASE" != test ]; then
    echo "== kda_decode alone: baseline (k_kda), then this tree (k_kda_step)"
    for b in build-base build-cuda; do
        [ -x $b/cuda_kda ] || continue
        echo "-- $b"
        timeout 120 $b/cuda_kda 0
    done 2>&1 | tee "$OUT/kda_dec.log"
fi

if [ "$PHASE" = all ] && [ "${MUTATE:-1}" != 0 ]; then
    m=tests/mutations/cuda_kda_step_warp_dropped.patch
    patch -p1 <$m >/dev/null && build test_cuda_ops vllm_cli && {
        build-cuda/tests/test_cuda_ops >"$OUT/mutation.log" 2>&1
        echo "mutation $(basename $m .patch): test_cuda_ops $(grep -c 'CHECK failed' "$OUT/mutation.log") checks red:"
        grep 'CHECK failed' "$OUT/mutation.log" | sed 's/.*CHECK failed: [^:]*: /  /' | head -40
        (cd build-cuda && timeout 200 ctest -R 'gpu_.*kimi' -j 4 >>"$OUT/mutation.log" 2>&1)
        echo "  kimi GPU gates: $(grep -c '\*\*\*Failed' "$OUT/mutation.log") red of $(grep -c 'Test *#' "$OUT/mutation.log")"
    }
    patch -R -p1 <$m >/dev/null && build test_cuda_ops vllm_cli >/dev/null
fi
