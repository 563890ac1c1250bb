// generate.c - `vllm generate` (not built yet).
#include <stdio.h>

#include "cli/cli.h"

int cli_generate(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "vllm generate: not implemented yet\n");
    return 2;
}
