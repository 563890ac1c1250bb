#!/bin/bash
# Speed before and after in one device call: builds each baseline in BASES
# (default base.tar.gz; each made here with `git archive -o NAME.tar.gz REV src
# include CMakeLists.txt bench tests ':!tests/fixtures'`) beside the tree
# (tools/device_run.sh builds the tree), then runs each BENCH config on all
# of them, baselines first in BASES' order: BENCH_ARGS for all; LONG="cfg..."
# adds an --input-len sweep (LONG_LENS, default 1k / 8k / 32k; 1 sequence,
# output 32, LONG_ARGS) on each of them too. ENVS="VAR=x ...": the tree's
# binary runs each config once under each of these settings too, before its
# run as it is.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
bins=()
for a in ${BASES:-base.tar.gz}; do
    [ -f "$a" ] || continue
    d=/tmp/base_$(basename "$a" .tar.gz)
    mkdir -p "$d" && tar -xzf "$a" -C "$d"
    (cmake -S "$d" -B "$d/build" -DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
        >"$d/cmake.log" 2>&1 && cmake --build "$d/build" -j 8 --target vllm_cli >"$d/build.log" 2>&1) &
    bins+=("$d/build/vllm")
done
BENCH_SAVE=${BENCH:-}; BENCH= tools/device_run.sh
wait
args=${BENCH_ARGS:---batch-sizes 1,64 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192}
for cfg in $BENCH_SAVE; do
    for b in "${bins[@]}" build-cuda/vllm; do
        [ -x "$b" ] || continue
        envs=("")
        [ "$b" = build-cuda/vllm ] && envs=(${ENVS:-} "")
        for e in "${envs[@]}"; do
            echo "== $cfg $b $e"
            env $e timeout 300 $b bench --model bench/configs/$cfg --load-format dummy --device cuda $args 2>&1 | tail -4
        done
    done
done 2>&1 | tee "$OUT/compare.log"
for cfg in ${LONG:-}; do
    for len in ${LONG_LENS:-1024 8192 32768}; do
        for b in "${bins[@]}" build-cuda/vllm; do
            [ -x "$b" ] || continue
            echo "== long $cfg input $len $b"
            timeout 300 $b bench --model bench/configs/$cfg --load-format dummy --device cuda --batch-sizes 1 \
                --input-len $len --output-len 32 --max-model-len 40000 --max-num-batched-tokens 8192 --warmup 0 \
                ${LONG_ARGS:-} 2>&1 | tail -1
        done
    done
done 2>&1 | tee "$OUT/long.log"
