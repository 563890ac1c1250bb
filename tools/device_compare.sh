#!/bin/bash
# Speed before and after in one device call: builds the baseline source in
# base.tar.gz (made here with `git archive -o base.tar.gz REV src include
# CMakeLists.txt tests bench`)
# beside the tree (tools/device_run.sh builds the tree), then runs each BENCH
# config on both, baseline first: BENCH_ARGS for both; LONG="cfg..." adds the
# tree's --input-len 1k / 8k / 32k sweep (1 sequence, output 32), with LONG_ARGS.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/base
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
if [ -f base.tar.gz ]; then
    tar -xzf base.tar.gz -C /tmp/base
    (cmake -S /tmp/base -B /tmp/base/build -DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
        >"$OUT/base_cmake.log" 2>&1 && cmake --build /tmp/base/build -j 8 --target vllm_cli >"$OUT/base_build.log" 2>&1) &
    base_pid=$!
fi
BENCH_SAVE=${BENCH:-}; BENCH= tools/device_run.sh
[ -n "${base_pid:-}" ] && wait $base_pid
args=${BENCH_ARGS:---batch-sizes 1,64 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192}
for cfg in $BENCH_SAVE; do
    for b in /tmp/base/build/vllm build-cuda/vllm; do
        [ -x "$b" ] || continue
        echo "== $cfg $b"
        timeout 300 $b bench --model bench/configs/$cfg --load-format dummy --device cuda $args 2>&1 | tail -4
    done
done 2>&1 | tee "$OUT/compare.log"
for cfg in ${LONG:-}; do
    for len in ${LONG_LENS:-1024 8192 32768}; do
        echo "== long $cfg input $len"
        timeout 300 build-cuda/vllm bench --model bench/configs/$cfg --load-format dummy --device cuda --batch-sizes 1 \
            --input-len $len --output-len 32 --max-model-len 40000 --max-num-batched-tokens 8192 --warmup 0 ${LONG_ARGS:-} 2>&1 | tail -1
    done
done 2>&1 | tee "$OUT/long.log"
