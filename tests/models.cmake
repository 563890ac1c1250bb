# Model configs: config.json values range-checked, derived sizes bounded.
vllm_test_exe(test_config_values models/test_config_values.c)
add_test(NAME config_values COMMAND test_config_values)
set_tests_properties(config_values PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")
