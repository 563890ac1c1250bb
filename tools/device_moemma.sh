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
#   tools/device_moemma.sh wide    (one call, ~7 min) k_moe_mma's tile variants, the 128-row tiles of
#                                  prefill: builds WIDE_VARIANTS side by side, each one's MoE tests
#                                  (pass / fail counts), cuda_ops' moe_experts at WIDE_ROWS (768 1024
#                                  2048 tokens) and `vllm bench` nano30b prefill (64 x 1,024), a table
#                                  (WIDE_BASE=1 with base.tar.gz: the merge-base timed beside them)
#   tools/device_moemma.sh widetest  the same builds and tests only
#   tools/device_moemma.sh widemutate  (~2 min) tests/mutations/cuda_moe_mma_half_step.patch in the first
#                                  variant's build: its red checks (expect 4 in test_cuda_ops moe, 12 in
#                                  test_cuda_moe_quant), then the source and the build restored
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

# k_moe_mma's K step x stages (-DTBK, -DTSTAGES) and the blocks an SM its
# registers must allow (-DTMINB: 2 caps them at 128), "name:flags;...":
# t32s3 the default (60 KB of shared memory, 2 blocks an SM), t64s2 (72 KB,
# 2 blocks), t64s3 (108 KB, 2 blocks), t64s4 (144 KB, 1 block: uncapped).
# Each builds in build-NAME, 4 at a time at -j nproc/4; each one's tests run
# as soon as it is built (the others still building), the timings after all
# builds, cuda_ops interleaved across the variants row count by row count.
IFS=';' read -r -a WIDES <<<"${WIDE_VARIANTS:-t32s3:;t64s2:-DTBK=64 -DTSTAGES=2;t64s3:-DTBK=64 -DTSTAGES=3;t64s4:-DTBK=64 -DTSTAGES=4 -DTMINB=1}"
declare -A W_OK W_OPS W_QUANT W_US W_TF W_PRE
wide_build() { # NAME FLAGS JOBS
    cmake -S . -B build-$1 $CM -DCMAKE_CUDA_FLAGS="$2" >/tmp/wide_$1.log 2>&1 &&
        cmake --build build-$1 -j $3 --target cuda_ops test_cuda_ops test_cuda_moe_quant vllm_cli >>/tmp/wide_$1.log 2>&1
}
# "passed/checks" of a test binary's summary line, FAIL when it printed none
checks() { grep -oE "[0-9]+/[0-9]+ checks passed" | tail -1 | sed 's/ checks passed//' | grep . || echo FAIL; }
wide_dir() { [ "$1" = base ] && echo build-base/build || echo build-$1; }
step_wide() { # $1: 1 = the timings too
    local jobs=$(($(nproc) / 4)) v name fl n us bpid='' pids=() names=()
    for v in "${WIDES[@]}"; do
        wide_build "${v%%:*}" "${v#*:}" $((jobs > 0 ? jobs : 1)) &
        pids+=($!) names+=("${v%%:*}")
    done
    # WIDE_BASE=1 (with base.tar.gz carried): the merge-base's cuda_ops and vllm too, timed beside them
    [ "$1" = 1 ] && [ -n "${WIDE_BASE:-}" ] && [ -f base.tar.gz ] && { build_base & bpid=$!; }
    local i=0
    for v in "${WIDES[@]}"; do
        name=${v%%:*}
        if ! wait ${pids[$i]}; then
            echo "== $name: build failed"; grep -E "error|ptxas" /tmp/wide_$name.log | head -10
            W_OPS[$name]=build W_QUANT[$name]=build
        else
            W_OK[$name]=1
            W_OPS[$name]=$(timeout 300 build-$name/tests/test_cuda_ops ${WIDE_OPS_ARGS-moe} 2>&1 |
                           tee /tmp/wide_${name}_ops.log | checks)
            W_QUANT[$name]=$(timeout 300 build-$name/tests/test_cuda_moe_quant 2>&1 |
                             tee /tmp/wide_${name}_quant.log | checks)
            echo "== $name built ($SECONDS s): test_cuda_ops ${W_OPS[$name]}, test_cuda_moe_quant ${W_QUANT[$name]}"
            grep -h "CHECK failed" /tmp/wide_${name}_ops.log /tmp/wide_${name}_quant.log | head -6
        fi
        i=$((i + 1))
    done
    if [ -n "$bpid" ]; then
        names+=(base) W_OPS[base]=- W_QUANT[base]=-
        wait $bpid && W_OK[base]=1
    fi
    if [ "$1" = 1 ]; then
        for n in ${WIDE_ROWS:-768 1024 2048}; do
            for name in "${names[@]}"; do
                [ -n "${W_OK[$name]:-}" ] && [ $SECONDS -lt ${WIDE_BUDGET:-470} ] || continue
                us=$(timeout 90 "$(wide_dir $name)"/cuda_ops $n 16 moe 2>&1 | grep moe_experts)
                echo "$name $n $us" >>"$OUT/wide_ops.log"
                W_US[$name.$n]=$(awk '{for (i = 2; i <= NF; i++) if ($i == "us") print $(i - 1)}' <<<"$us")
                W_TF[$name.$n]=$(awk '{for (i = 2; i <= NF; i++) if ($i == "TFLOP/s") print $(i - 1)}' <<<"$us")
            done
        done
        for name in "${names[@]}"; do
            [ -n "${W_OK[$name]:-}" ] || continue
            if [ $SECONDS -gt ${WIDE_BUDGET:-470} ]; then W_PRE[$name]="(time)"; continue; fi
            echo "== vllm bench nano30b $name ($SECONDS s)" >>"$OUT/wide_bench.log"
            timeout 150 "$(wide_dir $name)"/vllm bench --model bench/configs/nano30b --load-format dummy --device cuda \
                --batch-sizes 64 --input-len 1024 --output-len 16 --max-num-batched-tokens 8192 \
                >/tmp/wide_bench_$name.log 2>&1
            cat /tmp/wide_bench_$name.log >>"$OUT/wide_bench.log"
            W_PRE[$name]=$(awk '$1 == 64 && NF >= 9 {p = $2 " (" $9 ")"} END {print p}' /tmp/wide_bench_$name.log)
        done
    fi
    {
        printf "%-7s %-36s %-10s %-10s" variant flags gpu_ops moe_quant
        [ "$1" = 1 ] && for n in ${WIDE_ROWS:-768 1024 2048}; do printf " %15s" "us|TF/s@$n"; done &&
            printf "  %s" "nano30b prefill tok/s (of peak)"
        echo
        for name in "${names[@]}"; do
            fl=
            for v in "${WIDES[@]}"; do [ "${v%%:*}" = "$name" ] && fl=${v#*:}; done
            [ $name = base ] && fl="(merge-base)"
            printf "%-7s %-36s %-10s %-10s" $name "${fl:-(default)}" "${W_OPS[$name]}" "${W_QUANT[$name]}"
            [ "$1" = 1 ] && for n in ${WIDE_ROWS:-768 1024 2048}; do
                printf " %15s" "${W_US[$name.$n]:--}|${W_TF[$name.$n]:--}"
            done && printf "  %s" "${W_PRE[$name]:--}"
            echo
        done
        echo "($SECONDS s; cuda_ops: us per call of the routed experts, 16 calls a graph, and TFLOP/s)"
    } | tee "$OUT/wide.txt"
}

# Lesson 5 for the 128-row tiles: the patch halves each K step of k_moe_mma
# alone (BM == TBM in moe_mma_tile; the thin tiles keep theirs): the bf16
# n=600 cases and n=600 + add of both 16-bit shapes (4 in test_cuda_ops moe;
# the width-12 shape runs the SIMT kernel) and the quantized bf16-mode n=600
# cases (3 formats x 2 shapes x 2: 12) go red, nothing else.
step_widemutate() {
    local p=tests/mutations/cuda_moe_mma_half_step.patch name=${WIDES[0]%%:*} fl=${WIDES[0]#*:}
    patch -p1 <$p >/dev/null || { echo "mutation: $p does not apply"; return 1; }
    if wide_build $name "$fl" "$(nproc)"; then
        timeout 300 build-$name/tests/test_cuda_ops moe >/tmp/wide_mut_ops.log 2>&1
        timeout 300 build-$name/tests/test_cuda_moe_quant >/tmp/wide_mut_quant.log 2>&1
        local ro rq
        ro=$(grep -c "CHECK failed" /tmp/wide_mut_ops.log) rq=$(grep -c "CHECK failed" /tmp/wide_mut_quant.log)
        echo "mutation: test_cuda_ops moe $(checks </tmp/wide_mut_ops.log) passed, $ro red (expect 4);" \
            "test_cuda_moe_quant $(checks </tmp/wide_mut_quant.log) passed, $rq red (expect 12)" |
            tee "$OUT/widemutate.txt"
        grep -h "CHECK failed" /tmp/wide_mut_ops.log /tmp/wide_mut_quant.log | sed 's/.*CHECK failed: [^:]*: /  /' |
            tee -a "$OUT/widemutate.txt"
    else
        echo "mutation: build failed"; grep -E "error" /tmp/wide_$name.log | head -10
    fi
    patch -R -p1 <$p >/dev/null
    wide_build $name "$fl" "$(nproc)" || echo "the restored build failed"
}

case "${1:-all}" in
build) step_build ;;
mutate) step_mutate ;;
test) step_test ;;
ops) step_ops ;;
bench) step_bench "${2:?bench CONFIG}" ;;
sweepbuild) step_sweepbuild ;;
sweep) step_sweep ;;
wide) step_wide 1 ;;
widetest) step_wide 0 ;;
widemutate) step_widemutate ;;
all) step_build && step_test && step_mutate && step_ops && step_bench nano30b && step_bench qwen3_30b_a3b ;;
*) echo "usage: $0 build|test|mutate|ops|bench CONFIG|sweepbuild|sweep|wide|widetest|widemutate|all"; exit 2 ;;
esac
