# GPU tests: registered whenever the CUDA backend is built; they skip (exit 77)
# loudly on a machine without a GPU, and a skip is not a pass.
if(VLLM_CUDA)
  set(GPU ${CMAKE_CURRENT_SOURCE_DIR}/cuda/gpu_or_skip.sh)
  vllm_test_exe(test_cuda_ops cuda/test_cuda_ops.c)
  add_test(NAME gpu_ops COMMAND ${GPU} $<TARGET_FILE:test_cuda_ops>)
  # the SSD chunked-scan prefill at Nemotron-3-Nano's shapes, fp32 and bf16 modes, against the CPU reference op
  vllm_test_exe(test_cuda_ssd cuda/test_cuda_ssd.c)
  add_test(NAME gpu_ssd COMMAND ${GPU} $<TARGET_FILE:test_cuda_ssd>)
  # quantized dense weights (FP8, FP8 blocks, NVFP4) against the CPU reference's matmul on the same weight
  vllm_test_exe(test_cuda_quant cuda/test_cuda_quant.c)
  add_test(NAME gpu_quant COMMAND ${GPU} $<TARGET_FILE:test_cuda_quant>)
  # the quantized qwen3 checkpoints of every layout through the engine in fp32 on the device, against the CPU
  # reference on their dequantized fp32 checkpoints (logits within 1e-4)
  add_test(NAME gpu_quant_checkpoints COMMAND ${GPU} $<TARGET_FILE:test_quant_checkpoints>)
  # the routed experts with FP8, FP8-block and NVFP4 weights against the CPU reference op
  vllm_test_exe(test_cuda_moe_quant cuda/test_cuda_moe_quant.c)
  add_test(NAME gpu_moe_quant COMMAND ${GPU} $<TARGET_FILE:test_cuda_moe_quant>)
  # decode attention at long contexts (up to 32k, 1 to 64 sequences, GQA 1 to 16) with fp32, bf16 and fp8
  # caches against the CPU reference on the same cache values (2e-5)
  vllm_test_exe(test_cuda_attn cuda/test_cuda_attn.c)
  add_test(NAME gpu_attn COMMAND ${GPU} $<TARGET_FILE:test_cuda_attn>)
  # the fp8 KV cache: kv_write / qk_norm_rope codes and attention (decode, flash and
  # split-KV prefill, long contexts, fixed shapes, a recorded graph) against the
  # CPU reference on the same fp8 cache
  vllm_test_exe(test_cuda_kv_fp8 cuda/test_cuda_kv_fp8.c)
  add_test(NAME gpu_kv_fp8 COMMAND ${GPU} $<TARGET_FILE:test_cuda_kv_fp8>)
  # ... and end to end: qwen3 / nh_dense with fp32 weights and the fp8 cache on the GPU
  # against the CPU reference on it, greedy decoding (graphs) against the oracle
  add_test(NAME gpu_kv_fp8_model COMMAND ${GPU} $<TARGET_FILE:test_kv_fp8_model>)
  # prompt log-probs on the device (fp32), against the oracle, one chunk and chunked over a cached prompt
  add_test(NAME gpu_prompt_logprobs COMMAND ${GPU} $<TARGET_FILE:test_prompt_logprobs>)
  # gate 2: fp32 on the device, token-exact against the oracle in every mode
  foreach(fx ${VLLM_GATE_FIXTURES})
    foreach(mode ${VLLM_GATE_MODES})
      vllm_gate_mode("${mode}" mname parts)
      if("${fx}" IN_LIST VLLM_NO_KV_FIXTURES AND mname MATCHES "preempt")
        continue() # no KV blocks to preempt for
      endif()
      add_test(NAME gpu_gate_fp32_${fx}_${mname}
               COMMAND ${GPU} $<TARGET_FILE:vllm_cli> generate --model ${VLLM_FIXTURES}/${fx}
                       --golden ${VLLM_FIXTURES}/${fx}/golden.json --device cuda --dtype float32 ${parts})
    endforeach()
    # gate 3: bf16 against transformers' bf16 greedy while its own top-2 margin
    # is above 0.2, and decode == fresh-prefill on the device. Both keep the
    # weights and every GEMM input in bf16 but round in different places
    # (transformers: every activation and the residual; here: GEMM inputs, MoE
    # hidden units and attention's Q and P, with an fp32 residual), so at
    # these models' logits (|logit| in [4, 16): ulps of 2^-5 to 2^-4) the two
    # pick either token within a few ulps; 0.2 is 3 to 6 of them.
    if(NOT "${fx}" IN_LIST VLLM_NO_BF16_FIXTURES)
      add_test(NAME gpu_gate_bf16_${fx}
               COMMAND ${GPU} $<TARGET_FILE:vllm_cli> generate --model ${VLLM_FIXTURES}/${fx}
                       --golden ${VLLM_FIXTURES}/${fx}/golden.json --device cuda --dtype bfloat16
                       --golden-key greedy_bf16 --margin-key margins_bf16 --min-margin 0.2 --modes-agree --batch)
    endif()
  endforeach()
  # pure-decode steps replay recorded graphs (runner_graphs_captured, printed by generate)
  add_test(NAME gpu_graphs COMMAND ${GPU} $<TARGET_FILE:vllm_cli> generate --model ${VLLM_FIXTURES}/nh_dense
           --golden ${VLLM_FIXTURES}/nh_dense/golden.json --device cuda --dtype float32 --batch)
  set_tests_properties(gpu_graphs PROPERTIES PASS_REGULAR_EXPRESSION "graphs recorded [1-9]")
  get_property(gpu_tests DIRECTORY PROPERTY TESTS)
  foreach(t ${gpu_tests})
    if(t MATCHES "^gpu_")
      set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")
      if(t MATCHES "^gpu_gate")
        set_tests_properties(${t} PROPERTIES PASS_REGULAR_EXPRESSION "STRICT PASS [1-9]"
                             FAIL_REGULAR_EXPRESSION "DIVERGE|NOTHING COMPARED|FAIL")
      endif()
    endif()
  endforeach()
  set_tests_properties(gpu_prompt_logprobs gpu_quant_checkpoints gpu_kv_fp8_model PROPERTIES
                       ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES};VLLM_TEST_DEVICE=cuda")
endif()
