# Chat templates: the Jinja interpreter's unit tests, and every conversation
# of tests/fixtures/chat rendered and compared with @huggingface/jinja's output.
vllm_test_exe(test_jinja chat/test_jinja.c)
add_test(NAME chat_jinja COMMAND test_jinja ${VLLM_FIXTURES}/chat)
vllm_test_exe(test_chat_template chat/test_chat_template.c)
add_test(NAME chat_template COMMAND test_chat_template ${VLLM_FIXTURES}/chat)
