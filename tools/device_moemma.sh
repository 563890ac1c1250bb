#!/bin/bash
# Issue 11: the thin-tile MoE grouped GEMM (MOE_GEMV_MAXR < n <= MOE_DEC_MAXN
# tokens, src/backend/cuda/cuda_moe.cu) against the merge-base, in steps
# that each fit one 10-minute device call (builds stay in build-cuda and
# build-base between calls on a warm machine; a step rebuilds what is missing).
#
# Here, before the first call (base.tar.gz is git-ignored, so carry it):
#   git archive -o base.tar.gz $(git merge-base main HEAD) src include CMakeLists.txt tests bench
# then, with run(carry=["base.tar.gz"]), in order:
#   tools/device_moemma.sh build   the branch (build-cuda) and the base (build-base), side by side
#   tools/device_moemma.sh test    TESTS (default 'gpu_ops|gpu_gate') on the branch
#   tools/device_moemma.sh mutate  the thin-tile kernel broken on purpose: its test cases go red
#   tools/device_moemma.sh ops     cuda_ops 64 and 32 (moe_experts line), base then branch
#   tools/device_moemma.sh bench nano30b          vllm bench at 32, 64, 128 sequences, base then branch
#   tools/device_moemma.sh bench qwen3_30b_a3b
#   tools/device_moemma.sh sweepbuild   (optional, one call) three more builds of cuda_ops, then
#   tools/device_moemma.sh sweep   cuda_ops' moe_experts on each path at ROWS (default 8..512):
#                                  GEMV (<= 32), thin tiles, 128-row tiles: where the thresholds go
# `all` runs build, test, mutate, ops and both benches (longer than one call: by hand only).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on the lent machines
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
CM="-DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release"

# build-base: the merge-base's vllm and cuda_ops (none without base.tar.gz)
build_base() {
    [ -f base.tar.gz ] || { echo "no base.tar.gz: branch only"; return 0; }
    if [ ! -f build-base/src/CMakeLists.txt ]; then
        mkdir -p build-base/src && tar -xzf base.tar.gz -C build-base/src
    fi
    cmake -S build-base/src -B build-base/build $CM >"$OUT/base_cmake.log" 2>&1 &&
        cmake --build build-base/build -j 8 --target vllm_cli cuda_ops >"$OUT/base_build.log" 2>&1 ||
        { echo "base build failed"; tail -20 "$OUT/base_build.log"; return 1; }
}
build_branch() {
    cmake -S . -B build-cuda $CM >"$OUT/cmake.log" 2>&1 &&
        cmake --build build-cuda -j "$(nproc)" >"$OUT/build.log" 2>&1 ||
        { grep -E "error" "$OUT/build.log" | head -30; return 1; }
}
bins() { for b in build-base/build build-cuda; do [ -x $b/vllm ] && echo $b; done; }

step_build() {
    build_base & local bp=$!
    build_branch; local rc=$?
    wait $bp && return $rc
}
step_test() {
    TESTS=${TESTS:-'gpu_ops|gpu_gate'} BENCH= tools/device_run.sh # (re)builds build-cuda, runs the tests
    # ctest shows a passing test's output not at all: the experts' errors per n, from the binary itself
    timeout 300 build-cuda/tests/test_cuda_ops 2>&1 | grep -E "moe_experts|CHECK failed|checks" | tee "$OUT/moe_errs.log"
}
step_ops() {
    build_branch || return 1
    build_base || return 1
    for n in 64 32; do
        for b in $(bins); do
            echo "== cuda_ops $n $b"
            timeout 120 $b/cuda_ops $n | grep -E "copy [0-9]|moe_experts"
        done
    done 2>&1 | tee "$OUT/cuda_ops.log"
}
step_bench() {
    build_branch || return 1
    build_base || return 1
    for b in $(bins); do
        echo "== $1 $b"
        timeout 280 $b/vllm bench --model bench/configs/$1 --load-format dummy --device cuda --batch-sizes 32,64,128 \
            --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 2>&1 | tail -6
    done 2>&1 | tee -a "$OUT/bench_$1.log"
}
# Lesson 5: the new cases must see the thin-tile kernel break. The last
# half of K dropped in k_moe_mma_dec alone: the bf16 cases at n = 33..200,
# shared 64 and 64 + add must go red, n <= 20 and 600 stay green. The source is
# restored (and rebuilt) after.
step_mutate() {
    local f=src/backend/cuda/cuda_moe.cu
    grep -q 'bool kin = k0 + c < K; // K % 8 == 0: a chunk' $f || { echo "mutation site not found"; return 1; }
    cp $f /tmp/cuda_moe.cu.orig
    sed -i 's|bool kin = k0 + c < K; // K % 8 == 0: a chunk|bool kin = k0 + c < K / 2; // MUTATION|' $f
    cmake --build build-cuda -j "$(nproc)" --target test_cuda_ops >"$OUT/mutate_build.log" 2>&1 &&
        timeout 300 build-cuda/tests/test_cuda_ops 2>&1 | grep -E "moe_experts.*bf16|CHECK failed" | tee "$OUT/mutate.log"
    cp /tmp/cuda_moe.cu.orig $f
    cmake --build build-cuda -j "$(nproc)" --target test_cuda_ops >/dev/null 2>&1
    echo "mutation: $(grep -c "CHECK failed" "$OUT/mutate.log") checks failed (expect 12: bf16 n = 33, 64, 96, 200, shared 64 and 64 + add, both shapes)"
}

# One build per path, the thresholds (cuda_moe.cu) forced by -D overrides:
# thin (MOE_GEMV_MAXR=0: the thin tiles at every n <= MOE_DEC_MAXN) and
# wide (both 0: the 128-row tiles at every n); build-cuda gives the GEMV
# (written for n <= 32 only); thin64: the thin tiles with K steps of 64 (a
# 128-byte line of each weight row per stage), 4 stages (83 KB, 2 blocks per
# SM). VARIANTS="name:flags;..." replaces the list, e.g.
# "thin4:-DMOE_GEMV_MAXR=0 -DDSTAGES=4;thin32:-DMOE_GEMV_MAXR=0 -DDBM=32"
# (4 stages: 46 KB, 4 blocks per SM; 32-row tiles). Each is a build of
# vllm_static: should sweepbuild run out of time, call it again (it resumes).
IFS=';' read -r -a SWEEPS <<<"${VARIANTS:-thin:-DMOE_GEMV_MAXR=0;thin64:-DMOE_GEMV_MAXR=0 -DDBK=64 -DDSTAGES=4;wide:-DMOE_GEMV_MAXR=0 -DMOE_DEC_MAXN=0}"
step_sweepbuild() {
    for v in "${SWEEPS[@]}"; do
        local name=${v%%:*} flags=${v#*:}
        cmake -S . -B build-sweep-$name $CM -DCMAKE_CUDA_FLAGS="$flags" >"$OUT/sweep_$name.log" 2>&1 &&
            cmake --build build-sweep-$name -j "$(nproc)" --target cuda_ops >>"$OUT/sweep_$name.log" 2>&1 ||
            { echo "sweep build $name failed"; tail -20 "$OUT/sweep_$name.log"; return 1; }
    done
    build_branch
}
step_sweep() {
    step_sweepbuild || return 1
    for n in ${ROWS:-8 16 24 32 48 64 96 128 192 256 384 512}; do
        for b in build-cuda "${SWEEPS[@]%%:*}"; do
            [ $b = build-cuda ] || b=build-sweep-$b
            [ $b = build-cuda ] && [ $n -gt 32 ] && continue
            printf "%4d %-17s" $n $b
            timeout 60 $b/cuda_ops $n 16 moe | grep -E "moe_experts"
        done
    done 2>&1 | tee "$OUT/sweep.log"
}

case "${1:-all}" in
build) step_build ;;
mutate) step_mutate ;;
test) step_test ;;
ops) step_ops ;;
bench) step_bench "${2:?bench CONFIG}" ;;
sweepbuild) step_sweepbuild ;;
sweep) step_sweep ;;
all) step_build && step_test && step_mutate && step_ops && step_bench nano30b && step_bench qwen3_30b_a3b ;;
*) echo "usage: $0 build|test|mutate|ops|bench CONFIG|sweepbuild|sweep|all"; exit 2 ;;
esac
