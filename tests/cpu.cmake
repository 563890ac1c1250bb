# CPU fast path: every fast op against its reference op, for every kernel set
# this CPU runs (tests/cpu/test_fast_ops.c).
vllm_test_exe(test_cpu_fast_ops cpu/test_fast_ops.c)
add_test(NAME cpu_fast_ops COMMAND test_cpu_fast_ops)
# bf16 weights against the fp32 oracle: logits within a stated bound, greedy
# agreement per fixture, divergence only below the oracle's 1e-2 margin.
vllm_test_exe(test_cpu_bf16_gate cpu/test_bf16_gate.c)
add_test(NAME cpu_bf16_gate COMMAND test_cpu_bf16_gate)
set_tests_properties(cpu_bf16_gate PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")
# The fp32 logits gate (tests/engine.cmake runs it on the best kernel set)
# on the portable kernels, and on AVX2 where x86 machines have it.
set(cpu_isas scalar)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  list(APPEND cpu_isas avx2)
endif()
foreach(isa ${cpu_isas})
  add_test(NAME cpu_gate_logits_${isa} COMMAND test_logits)
  set_tests_properties(cpu_gate_logits_${isa} PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES};VLLM_CPU_ISA=${isa}")
endforeach()
# Quantized weights (FP8, FP8 128-blocks, NVFP4): the fast path's kernels,
# which dequantize in registers, against the reference ops over 1..40 rows.
vllm_test_exe(test_quant_kernels cpu/test_quant_kernels.c)
add_test(NAME quant_kernels COMMAND test_quant_kernels)
# The fp8 (e4m3) KV cache: codes exact against an independent encoder, reads
# exact against the fp32 reference on the codes' values, a stated bound
# against the fp32 cache, the fast path against the reference on it.
vllm_test_exe(test_kv_fp8 cpu/test_kv_fp8.c)
add_test(NAME kv_fp8 COMMAND test_kv_fp8)
