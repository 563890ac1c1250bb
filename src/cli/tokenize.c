// tokenize.c - `vllm tokenize` (not built yet).
#include <stdio.h>

#include "cli/cli.h"

int cli_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "vllm tokenize: not implemented yet\n");
    return 2;
}
