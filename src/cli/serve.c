// serve.c - `vllm serve` (not built yet).
#include <stdio.h>

#include "cli/cli.h"

int cli_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "vllm serve: not implemented yet\n");
    return 2;
}
