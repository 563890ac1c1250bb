# `vllm serve` against hostile clients on loopback (tests/server/test_server_abuse.c).
vllm_test_exe(test_server_abuse server/test_server_abuse.c server/harness.c)
add_test(NAME server_abuse COMMAND test_server_abuse $<TARGET_FILE:vllm_cli> ${VLLM_FIXTURES}/tiny_chat)
set_tests_properties(server_abuse PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
