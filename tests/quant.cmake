# Quantized oracle fixtures (tests/fixtures/quant/<fixture>_<layout>, made by
# tools/oracle/make_quant_fixtures.py): an fp32 fixture quantized as ModelOpt
# / compressed-tensors / fp8 write it, and transformers' fp32 greedy tokens and
# logits on the dequantized weights. The engine-core gates in every mode on
# the CPU (the quantized weights dequantized in the fast path's registers),
# the reference path's logits within 1e-4 (gate_logits_quant), and the fp32
# gates on CUDA. Quantized, the tiny models have steps of smaller top-2
# margins (9e-5 at the least): each prompt is compared while the oracle's
# margin is at least 1e-3 (past that, its choice is a coin toss).
file(GLOB VLLM_QUANT_FIXTURE_DIRS LIST_DIRECTORIES true ${VLLM_FIXTURES}/quant/*)
set(VLLM_QUANT_FIXTURES "")
foreach(dir ${VLLM_QUANT_FIXTURE_DIRS})
  if(NOT EXISTS ${dir}/golden.json)
    continue()
  endif()
  get_filename_component(fx ${dir} NAME)
  list(APPEND VLLM_QUANT_FIXTURES quant/${fx})
  foreach(mode ${VLLM_GATE_MODES})
    vllm_gate_mode("${mode}" mname parts)
    add_test(NAME gate_q_${fx}_${mname}
             COMMAND vllm_cli generate --model ${dir} --golden ${dir}/golden.json --threads 1
                     --margin-key margins --min-margin 1e-3 ${parts})
    set_tests_properties(gate_q_${fx}_${mname} PROPERTIES PASS_REGULAR_EXPRESSION "STRICT PASS [1-9]"
                         FAIL_REGULAR_EXPRESSION "DIVERGE|NOTHING COMPARED|FAIL")
    if(VLLM_CUDA)
      add_test(NAME gpu_gate_fp32_q_${fx}_${mname}
               COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cuda/gpu_or_skip.sh $<TARGET_FILE:vllm_cli> generate --model ${dir}
                       --golden ${dir}/golden.json --device cuda --dtype float32
                       --margin-key margins --min-margin 1e-3 ${parts})
      set_tests_properties(gpu_gate_fp32_q_${fx}_${mname} PROPERTIES SKIP_RETURN_CODE 77
                           PASS_REGULAR_EXPRESSION "STRICT PASS [1-9]" FAIL_REGULAR_EXPRESSION "DIVERGE|NOTHING COMPARED|FAIL")
    endif()
  endforeach()
endforeach()
if(VLLM_QUANT_FIXTURES)
  string(REPLACE ";" "," csv "${VLLM_QUANT_FIXTURES}")
  add_test(NAME gate_logits_quant COMMAND test_logits VLLM_QUANT_FIXTURES)
  set_tests_properties(gate_logits_quant PROPERTIES
                       ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES};VLLM_QUANT_FIXTURES=${csv};VLLM_CPU_REFERENCE=1")
endif()
