# `vllm serve` tests (tests/server/): each starts the server on 127.0.0.1 with
# a free port and the tiny_chat fixture (CPU), and stops it with SIGTERM,
# which must exit 0. They exit 77 (skipped) while the build has no tokenizer.
set(VLLM_SERVER_MODEL ${VLLM_FIXTURES}/tiny_chat)
foreach(t http load equiv ops metrics)
  vllm_test_exe(test_server_${t} server/test_server_${t}.c server/harness.c)
  add_test(NAME server_${t} COMMAND test_server_${t} $<TARGET_FILE:vllm_cli> ${VLLM_SERVER_MODEL})
endforeach()
set_tests_properties(server_http server_load server_equiv server_ops server_metrics PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
set_tests_properties(server_equiv PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")
# Every request field of the list (tests/server/fields.tsv): honored, no-op
# or rejected by name, and docs/SERVING.md's field table matching the list.
vllm_test_exe(test_server_fields server/test_server_fields.c server/harness.c)
add_test(NAME server_fields COMMAND test_server_fields $<TARGET_FILE:vllm_cli> ${VLLM_SERVER_MODEL}
         ${CMAKE_CURRENT_SOURCE_DIR}/server/fields.tsv ${PROJECT_SOURCE_DIR}/docs/SERVING.md)
set_tests_properties(server_fields PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
# The structured-output glue without HTTP (src/server/guided.c): reasoning first, then the grammar.
vllm_test_exe(test_guided server/test_guided.c)
add_test(NAME server_guided COMMAND test_guided)
set_tests_properties(server_guided PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")

# The official `openai` npm client (tools/oracle/server, installed by
# scripts/install-deps.sh) against a live server.
find_program(VLLM_NODE node)
if(VLLM_NODE)
  add_test(NAME server_openai COMMAND ${VLLM_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/server/openai_client.mjs
           $<TARGET_FILE:vllm_cli> ${VLLM_SERVER_MODEL})
  add_test(NAME server_openai_responses COMMAND ${VLLM_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/server/openai_responses.mjs
           $<TARGET_FILE:vllm_cli> ${VLLM_SERVER_MODEL})
  # n samples, lists of prompts, interleaved streams (tests/server/openai_n.mjs)
  add_test(NAME server_openai_n COMMAND ${VLLM_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/server/openai_n.mjs
           $<TARGET_FILE:vllm_cli> ${VLLM_SERVER_MODEL})
else()
  add_test(NAME server_openai COMMAND sh -c "echo 'SKIP: node is not installed (scripts/install-deps.sh)'; exit 77")
  add_test(NAME server_openai_responses COMMAND sh -c "echo 'SKIP: node is not installed'; exit 77")
  add_test(NAME server_openai_n COMMAND sh -c "echo 'SKIP: node is not installed'; exit 77")
endif()
set_tests_properties(server_openai server_openai_responses server_openai_n PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)

# Log-likelihoods as lm-evaluation-harness asks for them (echo, logprobs,
# max_tokens 0) through the client, against `vllm generate --dump-logits`.
if(VLLM_NODE)
  add_test(NAME server_loglikelihood COMMAND ${VLLM_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/server/loglikelihood.mjs
           $<TARGET_FILE:vllm_cli> ${VLLM_SERVER_MODEL})
else()
  add_test(NAME server_loglikelihood COMMAND sh -c "echo 'SKIP: node is not installed (scripts/install-deps.sh)'; exit 77")
endif()
set_tests_properties(server_loglikelihood PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)

# Qwen3's real tokenizer and chat template (151k ids, a tiny dummy Qwen3):
# the server's chat prompts against @huggingface/jinja + HF tokenizers, with
# tools, a tool call and its result, enable_thinking; streaming; a forced
# tool call through the hermes parser.
if(VLLM_NODE)
  add_test(NAME server_qwen3_chat COMMAND ${VLLM_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/server/qwen3_chat.mjs
           $<TARGET_FILE:vllm_cli> ${VLLM_FIXTURES}/qwen3)
else()
  add_test(NAME server_qwen3_chat COMMAND sh -c "echo 'SKIP: node is not installed'; exit 77")
endif()
set_tests_properties(server_qwen3_chat PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)

# Structured output, tool calls and reasoning end to end (issue 14): every
# JSON schema of tests/fixtures/structured through the server, each answer
# validated by ajv; regexes, choices, forced tool calls, reasoning.
if(VLLM_NODE)
  add_test(NAME server_structured COMMAND ${VLLM_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/server/structured_e2e.mjs
           $<TARGET_FILE:vllm_cli> ${VLLM_SERVER_MODEL})
else()
  add_test(NAME server_structured COMMAND sh -c "echo 'SKIP: node is not installed (scripts/install-deps.sh)'; exit 77")
endif()
set_tests_properties(server_structured PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
