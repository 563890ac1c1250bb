# The `vllm` command's own behavior.
# `vllm bench --workload throughput`: 6 requests, 2 at a time, every one of
# them generating its 5 tokens
add_test(NAME bench_throughput_smoke
         COMMAND vllm_cli bench --workload throughput --model ${VLLM_FIXTURES}/nh_dense --threads 1 --num-prompts 6
                 --max-num-seqs 2 --input-len 8 --output-len 5 --json)
set_tests_properties(bench_throughput_smoke PROPERTIES
  PASS_REGULAR_EXPRESSION "\"num_prompts\": 6, \"input_len\": 8, \"output_len\": 5, \"output_tokens\": 30, .*\"output_tok_s\": [1-9]")
add_test(NAME cli_tokenize_chat COMMAND vllm_cli tokenize --model ${VLLM_FIXTURES}/chat/qwen3
         --chat ${VLLM_FIXTURES}/chat_request.json)
set_tests_properties(cli_tokenize_chat PROPERTIES
  PASS_REGULAR_EXPRESSION "<\\|im_start\\|>system\nBe brief.<\\|im_end\\|>\n<\\|im_start\\|>user\nHi!<\\|im_end\\|>\n<\\|im_start\\|>assistant\n")
add_test(NAME cli_generate_ids COMMAND vllm_cli generate --model ${VLLM_FIXTURES}/nh_dense --prompt-ids 1,2,3,4,5 --max-tokens 4)
set_tests_properties(cli_generate_ids PROPERTIES PASS_REGULAR_EXPRESSION "^234 173 142 207\n\\[finish: length\\]")
add_test(NAME cli_bad_model COMMAND vllm_cli generate --model /nonexistent --prompt-ids 1)
set_tests_properties(cli_bad_model PROPERTIES WILL_FAIL TRUE)
add_test(NAME cli_unknown_flag COMMAND vllm_cli generate --frobnicate)
set_tests_properties(cli_unknown_flag PROPERTIES WILL_FAIL TRUE)
# `vllm serve` takes vLLM's command line: the model as a positional, a flag
# vllm.c lacks is an error naming it (and why), an unknown one too.
add_test(NAME cli_serve_positional COMMAND vllm_cli serve /nonexistent_model_dir --port 0)
set_tests_properties(cli_serve_positional PROPERTIES PASS_REGULAR_EXPRESSION "loading /nonexistent_model_dir")
add_test(NAME cli_serve_unsupported_flag COMMAND vllm_cli serve ${VLLM_FIXTURES}/tiny_chat --lora-modules a=b)
set_tests_properties(cli_serve_unsupported_flag PROPERTIES
  PASS_REGULAR_EXPRESSION "--lora-modules is not supported: LoRA is not supported")
# --gpu-memory-utilization sizes the KV pool from the device's memory (RAM
# here): a sliver leaves no room, and says what took the rest.
add_test(NAME cli_gpu_mem_util_small COMMAND vllm_cli generate --model ${VLLM_FIXTURES}/tiny_chat
  --gpu-memory-utilization 0.001 --prompt-ids 1,2 --max-tokens 1)
set_tests_properties(cli_gpu_mem_util_small PROPERTIES
  PASS_REGULAR_EXPRESSION "gpu_memory_utilization 0.00 leaves no room for the KV cache: of [0-9.]+ GiB")
add_test(NAME cli_gpu_mem_util COMMAND vllm_cli generate --model ${VLLM_FIXTURES}/tiny_chat
  --gpu-memory-utilization 0.98 --prompt-ids 1,2 --max-tokens 1)
add_test(NAME cli_serve_unknown_flag COMMAND vllm_cli serve ${VLLM_FIXTURES}/tiny_chat --frobnicate=1)
set_tests_properties(cli_serve_unknown_flag PROPERTIES PASS_REGULAR_EXPRESSION "unknown option '--frobnicate'")
# `vllm bench --quantization A,B`: each format in turn, then the figures side
# by side as multiples of the first's; a list with an empty entry, or with a
# workload other than the batch one, is refused by name
add_test(NAME bench_quant_list COMMAND vllm_cli bench --model ${VLLM_FIXTURES}/nh_dense --load-format dummy --threads 1
         --quantization none,fp8 --batch-sizes 1,2 --input-len 8 --output-len 3 --warmup 0)
set_tests_properties(bench_quant_list PROPERTIES PASS_REGULAR_EXPRESSION
  "quantization none, .*quantization fp8, .*decode tok/s by --quantization \\(x none\\):\n batch +none +fp8\n +1 +[0-9.]+  1\\.00x +[0-9.]+ +[0-9.]+x\n +2 .*prefill tok/s by --quantization")
add_test(NAME bench_quant_list_empty COMMAND vllm_cli bench --model ${VLLM_FIXTURES}/nh_dense --quantization none,,fp8)
set_tests_properties(bench_quant_list_empty PROPERTIES PASS_REGULAR_EXPRESSION "'none,,fp8' has an empty entry")
add_test(NAME bench_quant_list_workload COMMAND vllm_cli bench --model ${VLLM_FIXTURES}/nh_dense --quantization none,fp8
         --workload throughput)
set_tests_properties(bench_quant_list_workload PROPERTIES PASS_REGULAR_EXPRESSION "goes with the batch workload")
# With --output-len 1 no decode step runs: the decode fraction prints "-",
# not a negative percentage
add_test(NAME bench_no_decode_frac COMMAND vllm_cli bench --model ${VLLM_FIXTURES}/nh_dense --threads 1
         --batch-sizes 1 --input-len 8 --output-len 1)
set_tests_properties(bench_no_decode_frac PROPERTIES PASS_REGULAR_EXPRESSION "\n +1 +[0-9.]+ +0\\.0 +[0-9.]+ +0\\.00 +[0-9.]+ +- "
                     FAIL_REGULAR_EXPRESSION "-[0-9.]+%")
