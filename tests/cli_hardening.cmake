# The `vllm` command against bad flag values (tests/cli/).
vllm_test_exe(test_cli_flags cli/test_cli_flags.c proc.c)
add_test(NAME cli_flags COMMAND test_cli_flags $<TARGET_FILE:vllm_cli> ${VLLM_FIXTURES}/nh_dense)
