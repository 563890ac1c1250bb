# safetensors files and model directories a hostile user writes.
vllm_test_exe(test_st_hostile io/test_st_hostile.c)
add_test(NAME st_hostile COMMAND test_st_hostile)
