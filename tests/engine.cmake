# Engine-core gates: greedy tokens against the transformers oracle, in every
# scheduling mode (VLLM_GATE_MODES, tests/CMakeLists.txt), for each tiny
# fixture model (tests/fixtures/nh_*).
foreach(fx ${VLLM_GATE_FIXTURES})
  foreach(mode ${VLLM_GATE_MODES})
    vllm_gate_mode("${mode}" mname parts)
    if("${fx}" IN_LIST VLLM_NO_KV_FIXTURES AND mname MATCHES "preempt")
      continue() # preemption frees KV blocks: a model without attention never runs out of them
    endif()
    add_test(NAME gate_${fx}_${mname}
             COMMAND vllm_cli generate --model ${VLLM_FIXTURES}/${fx}
                     --golden ${VLLM_FIXTURES}/${fx}/golden.json --threads 1 ${parts})
    set_tests_properties(gate_${fx}_${mname} PROPERTIES PASS_REGULAR_EXPRESSION "STRICT PASS [1-9]"
                         FAIL_REGULAR_EXPRESSION "DIVERGE|NOTHING COMPARED|FAIL")
  endforeach()
endforeach()

vllm_test_exe(test_logits engine/test_logits.c)
add_test(NAME gate_logits COMMAND test_logits)
vllm_test_exe(test_ops ops/test_ops.c)
add_test(NAME ops_cpu COMMAND test_ops)
vllm_test_exe(test_kimi_ops ops/test_kimi_ops.c)
add_test(NAME ops_cpu_kimi COMMAND test_kimi_ops)
vllm_test_exe(test_config engine/test_config.c)
add_test(NAME config COMMAND test_config)
vllm_test_exe(test_safetensors engine/test_safetensors.c)
add_test(NAME safetensors COMMAND test_safetensors)
vllm_test_exe(test_api engine/test_api.c)
add_test(NAME api COMMAND test_api)
# Constrained decoding through the engine (vllm_constraint): masks, batching, preemption.
vllm_test_exe(test_constraint engine/test_constraint.c)
add_test(NAME constraint COMMAND test_constraint)
# Prompt log-probs against the oracle's logits: one prefill chunk, and chunks over steps with the prompt cached.
vllm_test_exe(test_prompt_logprobs engine/test_prompt_logprobs.c)
add_test(NAME prompt_logprobs COMMAND test_prompt_logprobs)
add_test(NAME prompt_logprobs_reference COMMAND test_prompt_logprobs)
set_tests_properties(prompt_logprobs_reference PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES};VLLM_CPU_REFERENCE=1")
vllm_test_exe(test_scheduler engine/test_scheduler.c)
add_test(NAME scheduler COMMAND test_scheduler)
vllm_test_exe(test_rows engine/test_rows.c)
add_test(NAME rows COMMAND test_rows)
vllm_test_exe(test_registry engine/test_registry.c)
add_test(NAME registry COMMAND test_registry)
set_tests_properties(gate_logits config safetensors api constraint registry rows prompt_logprobs PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")
vllm_test_exe(test_kv_cache engine/test_kv_cache.c)
add_test(NAME kv_cache COMMAND test_kv_cache)
vllm_test_exe(test_prefix engine/test_prefix.c)
add_test(NAME gate_prefix_pressure COMMAND test_prefix)
set_tests_properties(gate_prefix_pressure PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")
