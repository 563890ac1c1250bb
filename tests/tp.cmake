# Tensor parallelism. On the CPU, through the stand-in of the collectives
# (ranks are threads of one process): the split of every layer kind against
# the whole model, the config checks, the engine over 2 and 4 ranks against 1,
# and the oracle gates at 2 ranks in every scheduling mode.
vllm_test_exe(test_tp_layers tp/test_tp_layers.c tp/tp_model.c)
add_test(NAME tp_layers COMMAND test_tp_layers)
vllm_test_exe(test_tp_config tp/test_tp_config.c tp/tp_model.c)
add_test(NAME tp_config COMMAND test_tp_config)
vllm_test_exe(test_tp_engine tp/test_tp_engine.c tp/tp_model.c)
add_test(NAME tp_engine COMMAND test_tp_engine)
set_tests_properties(tp_layers tp_config tp_engine PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")

foreach(fx ${VLLM_TP2_FIXTURES})
  foreach(mode ${VLLM_GATE_MODES})
    vllm_gate_mode("${mode}" mname parts)
    add_test(NAME tp2_gate_${fx}_${mname}
             COMMAND vllm_cli generate --model ${VLLM_FIXTURES}/${fx} --golden ${VLLM_FIXTURES}/${fx}/golden.json
                     --threads 2 --tensor-parallel-size 2 ${parts})
    set_tests_properties(tp2_gate_${fx}_${mname} PROPERTIES PASS_REGULAR_EXPRESSION "STRICT PASS [1-9]"
                         FAIL_REGULAR_EXPRESSION "DIVERGE|NOTHING COMPARED|FAIL")
  endforeach()
endforeach()
# logits of every row against transformers', through the runner's logits hook
add_test(NAME tp2_gate_logits COMMAND test_logits)
set_tests_properties(tp2_gate_logits PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES};VLLM_TEST_TP_SIZE=2")
# prompt log-probs over two ranks: every rank makes every row's logits, rank 0 their log-probs
add_test(NAME tp2_prompt_logprobs COMMAND test_prompt_logprobs)
set_tests_properties(tp2_prompt_logprobs PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES};VLLM_TEST_TP_SIZE=2")
# the fixtures' 2 Mamba groups do not split over 4 ranks: a clear error
add_test(NAME tp_cli_groups COMMAND vllm_cli generate --model ${VLLM_FIXTURES}/nh_dense --prompt-ids 1,2
         --tensor-parallel-size 4)
set_tests_properties(tp_cli_groups PROPERTIES
  PASS_REGULAR_EXPRESSION "n_groups \\(2\\) is not divisible by tensor_parallel_size 4")

# On GPUs (NCCL): skipped, loudly, without enough of them. NCCL_NVLS_ENABLE=0
# keeps NVLink multicast off (see docs/TENSOR_PARALLEL.md).
if(VLLM_CUDA)
  set(GPUS ${CMAKE_CURRENT_SOURCE_DIR}/tp/gpus_or_skip.sh)
  vllm_test_exe(test_tp_gpu tp/test_tp_gpu.c)
  add_test(NAME gpu_tp_collectives COMMAND ${GPUS} 2 $<TARGET_FILE:test_tp_gpu>)
  # fp32, 2 and 4 ranks token-exact against 1 on the random mixed model
  add_test(NAME gpu_tp_engine_fp32 COMMAND ${GPUS} 4 $<TARGET_FILE:test_tp_engine>)
  set_tests_properties(gpu_tp_engine_fp32 PROPERTIES ENVIRONMENT
    "VLLM_TP_DEVICE=cuda;VLLM_TP_DTYPE=float32;VLLM_TP_SIZES=2,4;NCCL_NVLS_ENABLE=0")
  # fp32 oracle gates at 2 ranks
  foreach(fx ${VLLM_TP2_FIXTURES})
    foreach(mode ${VLLM_GATE_MODES})
      vllm_gate_mode("${mode}" mname parts)
      if(NOT mname MATCHES "^(decode|both_batch|chunk7_batch|preempt|staggered_chunk)$")
        continue()
      endif()
      add_test(NAME gpu_tp2_gate_fp32_${fx}_${mname}
               COMMAND ${GPUS} 2 $<TARGET_FILE:vllm_cli> generate --model ${VLLM_FIXTURES}/${fx}
                       --golden ${VLLM_FIXTURES}/${fx}/golden.json --device cuda --dtype float32
                       --tensor-parallel-size 2 ${parts})
      set_tests_properties(gpu_tp2_gate_fp32_${fx}_${mname} PROPERTIES PASS_REGULAR_EXPRESSION "STRICT PASS [1-9]"
                           FAIL_REGULAR_EXPRESSION "DIVERGE|NOTHING COMPARED|FAIL")
    endforeach()
  endforeach()
  get_property(tp_tests DIRECTORY PROPERTY TESTS)
  foreach(t ${tp_tests})
    if(t MATCHES "^gpu_tp")
      set_property(TEST ${t} PROPERTY SKIP_RETURN_CODE 77)
      set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "NCCL_NVLS_ENABLE=0;VLLM_FIXTURES=${VLLM_FIXTURES}")
    endif()
  endforeach()
endif()
