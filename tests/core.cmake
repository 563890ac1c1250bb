vllm_test_exe(test_json core/test_json.c)
add_test(NAME core_json COMMAND test_json)
