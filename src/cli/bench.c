// bench.c - `vllm bench` (not built yet).
#include <stdio.h>

#include "cli/cli.h"

int cli_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "vllm bench: not implemented yet\n");
    return 2;
}
