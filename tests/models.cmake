# Model configs: config.json values range-checked, derived sizes bounded.
vllm_test_exe(test_config_values models/test_config_values.c)
add_test(NAME config_values COMMAND test_config_values)
set_tests_properties(config_values PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")
# `vllm generate` on a few hundred malformed model directories made from nh_dense.
vllm_test_exe(test_hostile_dirs models/test_hostile_dirs.c proc.c)
add_test(NAME hostile_dirs COMMAND test_hostile_dirs $<TARGET_FILE:vllm_cli> ${VLLM_FIXTURES}/nh_dense
         ${VLLM_FIXTURES}/qwen3)
set_tests_properties(hostile_dirs PROPERTIES TIMEOUT 600)
# Quantized checkpoints (FP8 / NVFP4, ModelOpt and compressed-tensors layouts)
# made at test time from the qwen3 and nh_moe fixtures: the reference and the
# fast path against the dequantized fp32 checkpoint, the loader at several
# scale blocks, and the loader's errors (tests/models/test_quant_checkpoints.c).
vllm_test_exe(test_quant_checkpoints models/test_quant_checkpoints.c)
add_test(NAME quant_checkpoints COMMAND test_quant_checkpoints)
set_tests_properties(quant_checkpoints PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")
# Kimi-Linear's config: both spellings of each key, unsupported options and missing keys named.
vllm_test_exe(test_kimi_config models/test_kimi_config.c)
add_test(NAME kimi_config COMMAND test_kimi_config)
set_tests_properties(kimi_config PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")
# The fp8 KV cache end to end (reference path, qwen3 and nh_dense: logits
# within a stated bound of the fp32-KV logits, greedy against the oracle while
# its margin allows), the fast path on it, and k_scale / v_scale read from a
# checkpoint (vLLM's names; malformed ones named in the error).
vllm_test_exe(test_kv_fp8_model models/test_kv_fp8_model.c)
add_test(NAME kv_fp8_model COMMAND test_kv_fp8_model)
set_tests_properties(kv_fp8_model PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")
