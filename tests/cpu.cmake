# CPU fast path: every fast op against its reference op, for every kernel set
# this CPU runs (tests/cpu/test_fast_ops.c).
vllm_test_exe(test_cpu_fast_ops cpu/test_fast_ops.c)
add_test(NAME cpu_fast_ops COMMAND test_cpu_fast_ops)
