# The `vllm` command against bad flag values (tests/cli/).
vllm_test_exe(test_cli_flags cli/test_cli_flags.c proc.c)
add_test(NAME cli_flags COMMAND test_cli_flags $<TARGET_FILE:vllm_cli> ${VLLM_FIXTURES}/nh_dense)
# `vllm bench`'s decode step while a whole batch decodes (src/cli/bench_stats.c)
vllm_test_exe(test_bench_stats cli/test_bench_stats.c ${PROJECT_SOURCE_DIR}/src/cli/bench_stats.c)
add_test(NAME bench_stats COMMAND test_bench_stats)
