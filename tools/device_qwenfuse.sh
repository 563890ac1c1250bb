#!/bin/bash
# One device call (issues 11 and 12, the qwenfuse branch): the fused decode
# ops of the attention families: qk_norm_rope (q/k head norms + RoPE + KV
# write) and matmul_act_mul (SwiGLU and the bias in the gate | up GEMV's
# epilogue).
#   1. builds build-cuda (Release, sm_90): vllm and test_cuda_ops only;
#   2. TESTS (default: the op tests and the Qwen / Llama / NemotronH GPU gates);
#   3. (MUTATE=0 skips it) each new CUDA kernel broken on purpose,
#      test_cuda_ops rebuilt and run: its cases must go red;
#   4. vllm bench at 1 sequence (input 1024, output 128) on qwen3_8b and
#      qwen3_30b_a3b: decode tok/s and the roofline fraction (before this
#      branch on the H200: 183.8 tok/s = 67.2% and 236.1 tok/s = 35.0%);
#   5. the kernels of one decode step: VLLM_DIAG=graphs prints the kernel
#      nodes of each recorded graph; a 1- and a 2-layer copy of each config
#      (num_hidden_layers edited under /tmp) give the kernels per layer.
# Logs go to $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on the lent machines
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
TESTS=${TESTS:-'gpu_ops|gpu_gate_(fp32|bf16)_(qwen|llama|nh_dense)'}
build() {
    cmake --build build-cuda -j "$(nproc)" --target vllm_cli test_cuda_ops >>"$OUT/build.log" 2>&1 ||
        { grep -E "error" "$OUT/build.log" | head -30; return 1; }
}
cmake -S . -B build-cuda -DVLLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 ||
    { tail -30 "$OUT/cmake.log"; exit 1; }
build || exit 1
echo "== built in $SECONDS s"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader

(cd build-cuda && timeout 150 ctest -R "$TESTS" -j 4 -V >"$OUT/ctest.log" 2>&1)
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" "$OUT/ctest.log" | head -20
grep -E "qk_norm_rope|its [KV] cache|matmul_act_mul|router|its weights|CHECK failed" "$OUT/ctest.log" | sed 's/^[0-9]*: //' | head -120
echo "== tests done at $SECONDS s"

# 3. red once: each new kernel broken, its test cases must fail. Only
# test_cuda_ops is rebuilt (the vllm binary the benches run stays as built).
if [ "${MUTATE:-1}" = 1 ]; then
    for f in cuda_attn cuda_backend; do cp src/backend/cuda/$f.cu /tmp/qf_$f.cu; done
    # RoPE's second half with the wrong sign; the fused epilogue's act on up,
    # not gate
    sed -i 's/b = v \* c\[i\] + u \* sn\[i\];/b = v * c[i] - u * sn[i];/' src/backend/cuda/cuda_attn.cu
    sed -i 's/= act_dev(kind, gv) \* uv;/= act_dev(kind, uv) * gv;/' src/backend/cuda/cuda_backend.cu
    echo "mutated lines (2 expected): $(for f in cuda_attn cuda_backend; do
        diff /tmp/qf_$f.cu src/backend/cuda/$f.cu; done | grep -c '^>')"
    cmake --build build-cuda -j "$(nproc)" --target test_cuda_ops >"$OUT/build_mut.log" 2>&1 &&
        timeout 60 build-cuda/tests/test_cuda_ops >"$OUT/mutation.log" 2>&1
    echo "mutation: $(grep -c 'CHECK failed.*qk_norm_rope' "$OUT/mutation.log") qk_norm_rope checks red (of" \
        "$(grep -c 'qk_norm_rope [0-9]' "$OUT/mutation.log") cases), $(grep -c 'CHECK failed.*matmul_act_mul' "$OUT/mutation.log")" \
        "matmul_act_mul checks red;" \
        "$(tail -1 "$OUT/mutation.log")"
    for f in cuda_attn cuda_backend; do cp /tmp/qf_$f.cu src/backend/cuda/$f.cu; done
    echo "== mutation done at $SECONDS s (build-cuda/tests/test_cuda_ops is the mutated one now)"
fi

for cfg in qwen3_8b qwen3_30b_a3b; do
    echo "== bench $cfg, 1 sequence"
    timeout 120 build-cuda/vllm bench --model bench/configs/$cfg --load-format dummy --device cuda --batch-sizes 1 \
        --input-len 1024 --output-len 128 2>&1 | tee -a "$OUT/bench.log" | tail -6
done
echo "== benches done at $SECONDS s"

# kernels per decode step from recorded graphs at 1 and 2 layers
for cfg in qwen3_8b qwen3_30b_a3b; do
    k=()
    for L in 1 2; do
        d=/tmp/qwenfuse_cfg/${cfg}_L$L
        mkdir -p $d
        sed -E "s/\"num_hidden_layers\": *[0-9]+/\"num_hidden_layers\": $L/" bench/configs/$cfg/config.json >$d/config.json
        n=$(VLLM_DIAG=graphs timeout 60 build-cuda/vllm bench --model $d --load-format dummy --device cuda \
            --batch-sizes 1 --input-len 16 --output-len 8 --warmup 0 2>&1 | tee "$OUT/graphs_${cfg}_L$L.log" |
            grep -m1 -oE "graph recorded: [0-9]+ kernels" | grep -oE "[0-9]+")
        k+=("${n:-0}")
    done
    echo "$cfg decode step at 1 sequence: ${k[0]} kernels with 1 layer, ${k[1]} with 2: $(( k[1] - k[0] )) a layer (0: not found, see $OUT/graphs_*.log)"
done
echo "== kernel counts done at $SECONDS s"

