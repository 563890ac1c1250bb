// main.c - `vllm <subcommand>`.
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "vllm.h"

static void usage(FILE *f) {
    fprintf(f, "usage: vllm <command> [options]\n\n"
               "commands:\n"
               "  generate   run prompts (token ids) through a model\n"
               "  bench      offline throughput and latency benchmark\n"
               "  tokenize   encode / decode text with a model's tokenizer\n"
               "  serve      OpenAI-compatible HTTP server\n"
               "  version    print the version\n\n"
               "Run `vllm <command> --help` for a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "generate")) return cli_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cli_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return cli_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return cli_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("vllm.c %s\n", vllm_version());
        return 0;
    }
    fprintf(stderr, "vllm: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
