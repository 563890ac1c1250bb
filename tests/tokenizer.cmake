# Tokenizer tests. The oracle tests read real tokenizer files from
# tools/oracle/tokenizer/node_modules (scripts/install-deps.sh) and the
# oracle's outputs from tests/fixtures/tokenizer (tools/oracle/tokenizer/oracle.mjs).
set(VLLM_TOK_ORACLE qwen3 llama3 gpt4o gptoss deepseek_v3 llama2 gemma3
    synth_metaspace synth_norms synth_split synth_ws synth_wssplit)
vllm_test_exe(test_tok_oracle tokenizer/test_tok_oracle.c)
target_compile_definitions(test_tok_oracle PRIVATE VLLM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
foreach(name ${VLLM_TOK_ORACLE})
  add_test(NAME tok_oracle_${name} COMMAND test_tok_oracle ${name})
  set_tests_properties(tok_oracle_${name} PROPERTIES SKIP_RETURN_CODE 77)
endforeach()
