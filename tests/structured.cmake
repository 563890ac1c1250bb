# Structured output (src/structured): grammars, masks, tool-call and reasoning
# parsers. The mask and tokenizer tests read the real tokenizers from
# tools/oracle/tokenizer/node_modules (scripts/install-deps.sh) and skip (77)
# without them.
foreach(t sg_unit sg_tok_bytes sg_mask sg_schema sg_tools sg_reasoning)
  vllm_test_exe(test_${t} structured/test_${t}.c)
  target_compile_definitions(test_${t} PRIVATE VLLM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  add_test(NAME structured_${t} COMMAND test_${t})
  set_tests_properties(structured_${t} PROPERTIES SKIP_RETURN_CODE 77)
endforeach()
