#!/bin/bash
# Builds the libFuzzer harnesses (tests/fuzz/fuzz_*.c) with clang + ASan and
# fuzzes each for SECONDS (default 30), starting from tests/fuzz/corpus/NAME.
# A crash leaves its input in build-fuzz/crashes/NAME/ and fails the script:
# fix it, then copy the input into tests/fuzz/corpus/NAME/ as a regression.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DVLLM_FUZZ=ON -DVLLM_CUDA=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined" >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target $(cd tests/fuzz && ls fuzz_*.c | sed 's/\.c$//') >/dev/null
export VLLM_FIXTURES="$PWD/tests/fixtures"
status=0
for src in tests/fuzz/fuzz_*.c; do
    name=$(basename "$src" .c); short=${name#fuzz_}
    mkdir -p "build-fuzz/corpus/$short" "build-fuzz/crashes/$short"
    echo "fuzz: $short for ${secs}s"
    if ! build-fuzz/tests/$name -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
            -artifact_prefix="build-fuzz/crashes/$short/" \
            "build-fuzz/corpus/$short" "tests/fuzz/corpus/$short" 2>build-fuzz/$short.log; then
        tail -30 build-fuzz/$short.log; status=1
    else
        grep -E '^(Done|#[0-9]+ *DONE)' build-fuzz/$short.log | tail -1 || true
    fi
done
exit $status
