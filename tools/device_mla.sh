#!/bin/bash
# Issue 18's MLA attention (k_mla_split / k_mla_merge in cuda_mla.cu), in one
# device call of about 4 minutes:
#   1. builds this tree into build-cuda (Release, sm_90; tools/device_run.sh)
#      and runs the kimi GPU gates (fp32, token-exact: ctest -R 'gpu_.*kimi'),
#      then test_cuda_ops itself (gpu_ops), its MLA lines and summary shown;
#   2. the op alone, this tree: build-cuda/cuda_mla (bench/cuda_mla.c):
#      Kimi-Linear-48B's MLA, decode at 1 and 64 sequences and prefill of one
#      sequence, at 1k / 8k / 32k;
#   3. end to end: vllm bench --model bench/configs/kimi48b (bf16, dummy
#      weights), batch 1, input 1024 and 8192, output 8;
#   4. the baseline (BASE=1, default): the branch's merge-base from
#      base.tar.gz, built in the background from the start (nice 19), with
#      bench/cuda_mla.c copied in; its cuda_mla (decode 1k / 8k / 32k,
#      prefill 1k / 8k: the old prefill at 32k takes minutes) runs when its
#      build is done within BUDGET seconds of the call (default 200; else
#      the build is stopped: a second call on a warm machine finishes it),
#      its end to end runs only with BASE_E2E=1 (the figures before are in
#      docs/BENCHMARKS.md).
# base.tar.gz, made on the development machine in the tree's root (this
# script makes it itself when git and main are at hand; .git/info/exclude
# ignores it, so the device call names it in carry, with .devdeps):
#   git archive -o base.tar.gz $(git merge-base main HEAD) src include CMakeLists.txt tests bench
# Knobs: BASE=0 skips the baseline; E2E=0 skips step 3; LENS="1024 8192" for
# step 3; OP_LENS for step 2 (default 1024 8192 32768).
#
# MODE=decode: the decode at few sequences instead (k_mla_split's groups of
# 8 heads, k_mla_absorb_q / _v), in one call of about 7 minutes:
#   1. builds vllm_cli, test_cuda_ops and cuda_mla into build-cuda and runs
#      ctest -R 'gpu_ops|gpu_.*kimi' -V (test_cuda_ops' MLA lines and summary
#      shown from its log);
#   2. build-cuda/cuda_mla step 1024 8192: one decode step of one sequence
#      (kv write, absorb, attention, merge, un-absorb; a graph), us;
#   3. the mutations cuda_mla_hpw1_wrong_head and cuda_mla_absorb_warp_dropped:
#      each applied, rebuilt, the same ctest run, its red tests and
#      test_cuda_ops' passed checks printed, then reverted (build-cuda is
#      left built from the mutated source: the next build redoes cuda_mla.cu);
#   4. the baseline's step 1024 8192 (base.tar.gz as above, built in the
#      background from the start with this tree's bench/cuda_mla.c, waited
#      for up to BUDGET_DECODE s into the call, default 450; BASE=0 or no
#      base.tar.gz: none).
# Files back: build.log, ctest.log, mut_*.log, mla_step*.log, base_build.log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
BASE=${BASE:-1}
BUDGET=${BUDGET:-200}
LENS=${LENS:-1024 8192}
OP_LENS=${OP_LENS:-1024 8192 32768}
mkdir -p "$OUT"
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
if [ "$BASE" = 1 ] && [ ! -f base.tar.gz ] && git rev-parse --verify -q main >/dev/null 2>&1; then
    git archive -o base.tar.gz "$(git merge-base main HEAD)" src include CMakeLists.txt tests bench
fi
[ "$BASE" = 1 ] && [ ! -f base.tar.gz ] && { echo "base.tar.gz missing (see the header of $0): no baseline"; BASE=0; }

# The baseline builds at nice 19 in a session of its own (so that it can be
# stopped whole), under the tree's build and tests.
if [ "$BASE" = 1 ] && [ ! -x build-base/cuda_mla ]; then
    rm -rf build-base-src && mkdir -p build-base-src && tar -xzf base.tar.gz -C build-base-src
    cp bench/cuda_mla.c build-base-src/bench/
    setsid nice -n 19 bash -c "cmake -S build-base-src -B build-base -DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_BUILD_TYPE=Release >'$OUT/base_build.log' 2>&1 &&
        cmake --build build-base -j 8 --target cuda_mla $([ "${MODE:-}" = decode ] || echo vllm_cli) >>'$OUT/base_build.log' 2>&1" &
    base_pid=$!
    trap 'kill -- -"$base_pid" 2>/dev/null' EXIT # never left running past the call
fi

if [ "${MODE:-}" = decode ]; then
    build() {
        cmake -S . -B build-cuda -DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
            >"$OUT/build.log" 2>&1 && cmake --build build-cuda -j "$(nproc)" --target vllm_cli test_cuda_ops cuda_mla \
            >>"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -20; return 1; }
    }
    gates() { # $1: log name (-V: test_cuda_ops' lines kept); prints red tests and test_cuda_ops' checks
        (cd build-cuda && timeout 240 ctest -R 'gpu_ops|gpu_.*kimi' -j 4 -V >"$OUT/$1.log" 2>&1)
        echo "$1: $(grep -cE 'Test +#.*\*\*\*(Failed|Timeout|Exception)' "$OUT/$1.log") tests red of" \
            "$(grep -cE 'Test +#' "$OUT/$1.log") run;" \
            "$(grep -oE 'cuda ops: [0-9]+/[0-9]+ checks passed' "$OUT/$1.log" || echo 'no test_cuda_ops summary')"
        grep -E "Test +#.*\*\*\*(Failed|Timeout|Exception)" "$OUT/$1.log" | head -40
    }
    build || exit 1
    nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
    echo "== [$SECONDS s] ctest -R 'gpu_ops|gpu_.*kimi'"
    gates ctest
    grep -E "^[0-9]+: +MLA|FAIL" "$OUT/ctest.log" | head -140
    echo "== [$SECONDS s] one decode step, this tree"
    timeout 120 build-cuda/cuda_mla step 1024 8192 2>&1 | tee "$OUT/mla_step.log"
    for m in cuda_mla_hpw1_wrong_head cuda_mla_absorb_warp_dropped; do
        echo "== [$SECONDS s] mutation $m"
        patch -p1 <tests/mutations/$m.patch >/dev/null || { echo "$m does not apply"; continue; }
        build && gates "mut_$m"
        patch -R -p1 <tests/mutations/$m.patch >/dev/null
    done
    if [ "$BASE" = 1 ]; then # its build had until now, and BUDGET (here 450 s by default) at most
        while [ -n "${base_pid:-}" ] && kill -0 "$base_pid" 2>/dev/null && [ "$SECONDS" -lt "${BUDGET_DECODE:-450}" ]; do
            sleep 2
        done
        [ -n "${base_pid:-}" ] && kill -0 "$base_pid" 2>/dev/null && { kill -- -"$base_pid"; echo "baseline not built in time"; }
        if [ -x build-base/cuda_mla ]; then
            echo "== [$SECONDS s] one decode step, baseline"
            timeout 120 build-base/cuda_mla step 1024 8192 2>&1 | tee "$OUT/mla_step_base.log"
        else grep -E "error" "$OUT/base_build.log" 2>/dev/null | head; fi
    fi
    echo "== [$SECONDS s] done"
    exit 0
fi

TESTS='gpu_.*kimi' BENCH= tools/device_run.sh || exit 1
echo "== test_cuda_ops (gpu_ops): the MLA cases and the summary"
timeout 240 build-cuda/tests/test_cuda_ops >"$OUT/test_cuda_ops.log" 2>&1
echo "test_cuda_ops exit $?"
grep -E "MLA|FAIL|failed|checks" "$OUT/test_cuda_ops.log"
echo "== [$SECONDS s] mla_attn alone, this tree"
timeout 120 build-cuda/cuda_mla all $OP_LENS 2>&1 | tee "$OUT/mla_op.log"

if [ "${E2E:-1}" != 0 ]; then
    for len in $LENS; do
        echo "== [$SECONDS s] kimi48b bf16, batch 1, input $len: build-cuda"
        timeout 200 build-cuda/vllm bench --model bench/configs/kimi48b --load-format dummy --device cuda \
            --batch-sizes 1 --input-len $len --output-len 8 --max-model-len $((len + 64)) \
            --max-num-batched-tokens 8192 2>&1 | tail -2
    done 2>&1 | tee "$OUT/e2e.log"
fi

[ "$BASE" = 1 ] || exit 0
# the baseline's build may take what is left of BUDGET, then is stopped
while [ -n "${base_pid:-}" ] && kill -0 "$base_pid" 2>/dev/null && [ "$SECONDS" -lt "$BUDGET" ]; do sleep 2; done
if [ -n "${base_pid:-}" ] && kill -0 "$base_pid" 2>/dev/null; then
    kill -- -"$base_pid" 2>/dev/null
    echo "== [$SECONDS s] baseline skipped: its build was not done within BUDGET=$BUDGET s (build-base keeps what it built)"
    exit 0
fi
[ -x build-base/cuda_mla ] || { echo "baseline build failed:"; grep -E "error" "$OUT/base_build.log" | head; exit 0; }
echo "== [$SECONDS s] mla_attn alone, baseline (k_mla: a block per token and head)"
{
    timeout 90 build-base/cuda_mla decode $OP_LENS
    timeout 60 build-base/cuda_mla prefill 1024 8192
} 2>&1 | tee "$OUT/mla_op_base.log"
if [ "${BASE_E2E:-0}" = 1 ]; then
    for len in $LENS; do
        echo "== [$SECONDS s] kimi48b bf16, batch 1, input $len: build-base"
        timeout 200 build-base/vllm bench --model bench/configs/kimi48b --load-format dummy --device cuda \
            --batch-sizes 1 --input-len $len --output-len 8 --max-model-len $((len + 64)) \
            --max-num-batched-tokens 8192 2>&1 | tail -2
    done 2>&1 | tee "$OUT/e2e_base.log"
fi
echo "== [$SECONDS s] done"
