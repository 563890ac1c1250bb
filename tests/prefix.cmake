# Prefix caching (issue 13). The shared-prefix sets (tests/fixtures/*/prefix:
# a prefix P, P plus tails, P again, P cut mid-block) with caching on:
# token-exact against the oracle, and where requests run one after another
# every one after the first must find cached tokens (--require-hits). Then
# the oracle gates of the same fixtures (hybrid, hybrid with latent MoE,
# attention-only), in every scheduling mode, with caching on and a cache made
# warm by a first pass over the same prompts (--warm). All the gate fixtures
# run that way with VLLM_GATE_PREFIX=warm ctest -R '^gate_' (docs/ENVIRONMENT.md).
set(VLLM_PREFIX_MODES
  "decode|--require-hits"
  "fresh|--fresh-prefill --require-hits"
  "chunk3|--max-num-batched-tokens 3 --require-hits"
  "chunk7_batch|--both-modes --max-num-batched-tokens 7 --batch"
  "preempt_chunk|--both-modes --batch --num-blocks 34 --block-size 4 --max-num-batched-tokens 5 --require-preemption --async-scheduling"
  "staggered|--staggered 3")
set(VLLM_PREFIX_FIXTURES nh_dense nh_latent qwen3)
foreach(fx ${VLLM_PREFIX_FIXTURES})
  foreach(mode ${VLLM_PREFIX_MODES})
    vllm_gate_mode("${mode}" mname parts)
    add_test(NAME gate_prefix_${fx}_${mname}
             COMMAND vllm_cli generate --model ${VLLM_FIXTURES}/${fx} --golden ${VLLM_FIXTURES}/${fx}/prefix/golden.json
                     --threads 1 --enable-prefix-caching ${parts})
    set_tests_properties(gate_prefix_${fx}_${mname} PROPERTIES PASS_REGULAR_EXPRESSION "STRICT PASS [1-9]"
                         FAIL_REGULAR_EXPRESSION "DIVERGE|NOTHING COMPARED|FAIL")
  endforeach()
endforeach()
foreach(fx ${VLLM_PREFIX_FIXTURES})
  foreach(mode ${VLLM_GATE_MODES})
    vllm_gate_mode("${mode}" mname parts)
    add_test(NAME gate_warm_${fx}_${mname}
             COMMAND vllm_cli generate --model ${VLLM_FIXTURES}/${fx} --golden ${VLLM_FIXTURES}/${fx}/golden.json
                     --threads 1 --enable-prefix-caching --warm ${parts})
    set_tests_properties(gate_warm_${fx}_${mname} PROPERTIES PASS_REGULAR_EXPRESSION "STRICT PASS [1-9]"
                         FAIL_REGULAR_EXPRESSION "DIVERGE|NOTHING COMPARED|FAIL")
  endforeach()
endforeach()
# Attention alone: prompts submitted at once start from the blocks the first
# one computes in the same step (committed as scheduled); hybrid models also
# need a checkpoint, which exists only after the step.
set(VLLM_SAME_STEP_ARGS --golden ${VLLM_FIXTURES}/qwen3/prefix/golden.json --enable-prefix-caching --batch --require-hits)
add_test(NAME gate_prefix_qwen3_same_step
         COMMAND vllm_cli generate --model ${VLLM_FIXTURES}/qwen3 --threads 1 ${VLLM_SAME_STEP_ARGS})
set_tests_properties(gate_prefix_qwen3_same_step PROPERTIES PASS_REGULAR_EXPRESSION "STRICT PASS [1-9]"
                     FAIL_REGULAR_EXPRESSION "DIVERGE|NOTHING COMPARED|FAIL")
# the checkpoints of every rank's shards: two CPU ranks
foreach(fx ${VLLM_PREFIX_FIXTURES})
  add_test(NAME tp2_gate_prefix_${fx}
           COMMAND vllm_cli generate --model ${VLLM_FIXTURES}/${fx} --golden ${VLLM_FIXTURES}/${fx}/prefix/golden.json
                   --threads 2 --tensor-parallel-size 2 --enable-prefix-caching --both-modes --require-hits)
  set_tests_properties(tp2_gate_prefix_${fx} PROPERTIES PASS_REGULAR_EXPRESSION "STRICT PASS [1-9]"
                       FAIL_REGULAR_EXPRESSION "DIVERGE|NOTHING COMPARED|FAIL")
endforeach()
# Through a reply: B = A's prompt + A's reply + a tail hits up to A's last
# full block (decode checkpoints), token- and logit-exact against caching off.
vllm_test_exe(test_prefix_reply engine/test_prefix_reply.c)
add_test(NAME gate_prefix_reply COMMAND test_prefix_reply)
add_test(NAME gate_prefix_reply_reference COMMAND test_prefix_reply)
set_tests_properties(gate_prefix_reply PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")
set_tests_properties(gate_prefix_reply_reference PROPERTIES
                     ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES};VLLM_CPU_REFERENCE=1")
# On the GPU in fp32 (skipped without one): the same, token-exact.
if(VLLM_CUDA)
  add_test(NAME gpu_gate_prefix_reply_fp32
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cuda/gpu_or_skip.sh $<TARGET_FILE:test_prefix_reply> --device cuda)
  set_tests_properties(gpu_gate_prefix_reply_fp32 PROPERTIES SKIP_RETURN_CODE 77
                       ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")
  foreach(fx ${VLLM_PREFIX_FIXTURES})
    foreach(mode ${VLLM_PREFIX_MODES})
      vllm_gate_mode("${mode}" mname parts)
      add_test(NAME gpu_gate_prefix_fp32_${fx}_${mname}
               COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cuda/gpu_or_skip.sh $<TARGET_FILE:vllm_cli> generate
                       --model ${VLLM_FIXTURES}/${fx} --golden ${VLLM_FIXTURES}/${fx}/prefix/golden.json
                       --device cuda --dtype float32 --enable-prefix-caching ${parts})
    endforeach()
  endforeach()
  add_test(NAME gpu_gate_prefix_fp32_qwen3_same_step
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cuda/gpu_or_skip.sh $<TARGET_FILE:vllm_cli> generate
                   --model ${VLLM_FIXTURES}/qwen3 --device cuda --dtype float32 ${VLLM_SAME_STEP_ARGS})
  foreach(fx ${VLLM_PREFIX_FIXTURES})
    foreach(mode ${VLLM_GATE_MODES})
      vllm_gate_mode("${mode}" mname parts)
      add_test(NAME gpu_gate_warm_fp32_${fx}_${mname}
               COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cuda/gpu_or_skip.sh $<TARGET_FILE:vllm_cli> generate
                       --model ${VLLM_FIXTURES}/${fx} --golden ${VLLM_FIXTURES}/${fx}/golden.json
                       --device cuda --dtype float32 --enable-prefix-caching --warm ${parts})
    endforeach()
  endforeach()
  get_property(prefix_tests DIRECTORY PROPERTY TESTS)
  foreach(t ${prefix_tests})
    if(t MATCHES "^gpu_gate_(prefix|warm)_" AND NOT t STREQUAL "gpu_gate_prefix_reply_fp32") # that one counts checks
      set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}"
                           PASS_REGULAR_EXPRESSION "STRICT PASS [1-9]" FAIL_REGULAR_EXPRESSION "DIVERGE|NOTHING COMPARED|FAIL")
    endif()
  endforeach()
endif()
# `vllm bench --workload chat` end to end on a tiny fixture: caching off and
# on give the same conversations, and the later turns hit
add_test(NAME bench_chat_smoke
         COMMAND vllm_cli bench --workload chat --model ${VLLM_FIXTURES}/nh_dense --threads 1 --conversations 3
                 --turns 3 --system-len 200 --user-len 20 --reply-len 20)
set_tests_properties(bench_chat_smoke PROPERTIES PASS_REGULAR_EXPRESSION "\non +[0-9.]+ +[0-9]+ +[1-9][0-9]*/[0-9]+.*outputs identical")
