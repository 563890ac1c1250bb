# Every tests/fuzz/fuzz_NAME.c is a libFuzzer harness (LLVMFuzzerTestOneInput).
# Here it is linked with replay_main.c and replays tests/fuzz/corpus/NAME/
# (seeds and every crash found so far) as a normal test. scripts/fuzz.sh
# builds the same harnesses with clang -fsanitize=fuzzer and fuzzes them.
file(GLOB VLLM_FUZZ_HARNESSES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_*.c)
foreach(src ${VLLM_FUZZ_HARNESSES})
  get_filename_component(name ${src} NAME_WE)
  string(REGEX REPLACE "^fuzz_" "" short ${name})
  if(VLLM_FUZZ)
    add_executable(${name} ${src})
    target_link_libraries(${name} PRIVATE vllm_static)
    target_compile_options(${name} PRIVATE -fsanitize=fuzzer)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  else()
    vllm_test_exe(${name}_replay ${src} fuzz/replay_main.c)
    add_test(NAME fuzz_replay_${short} COMMAND ${name}_replay ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/${short})
    set_tests_properties(fuzz_replay_${short} PROPERTIES ENVIRONMENT "VLLM_FIXTURES=${VLLM_FIXTURES}")
  endif()
endforeach()
