// test_cli_flags.c - every numeric flag of generate / bench / serve refuses a
// bad value with exit code 2 and a message naming the flag and its range, and
// takes a good one. Usage: test_cli_flags VLLM_BINARY MODEL_DIR
#include <string.h>

#include "core/common.h"
#include "proc.h"
#include "test.h"

struct bad {
    const char *cmd, *flag, *value;
};

static const struct bad bads[] = {
    {"generate", "--kv-cache-gb", "0"},     {"generate", "--kv-cache-gb", "-1"},
    {"generate", "--kv-cache-gb", "nan"},   {"generate", "--kv-cache-gb", "1e12"},
    {"generate", "--kv-cache-gb", "1e-12"}, {"generate", "--kv-cache-gb", "inf"},
    {"generate", "--kv-cache-gb", "2GB"},   {"generate", "--kv-cache-gb", ""},
    {"generate", "--kv-cache-gb", "0x10"},  {"generate", "--max-num-seqs", "0"},
    {"generate", "--max-num-seqs", "12abc"}, {"generate", "--max-num-seqs", "99999999999999999999"},
    {"generate", "--max-num-seqs", " 5"},   {"generate", "--max-num-seqs", "0x10"},
    {"generate", "--max-num-seqs", "4.0"},  {"generate", "--max-num-batched-tokens", "-5"},
    {"generate", "--max-model-len", "2147483648"}, {"generate", "--block-size", "0"},
    {"generate", "--num-blocks", "-1"},     {"generate", "--threads", "0"},
    {"generate", "--seed", "-1"},           {"generate", "--tensor-parallel-size", "0"},
    {"generate", "--max-tokens", "0"},      {"generate", "--temperature", "nan"},
    {"generate", "--temperature", "-1"},    {"generate", "--temperature", "inf"},
    {"generate", "--top-p", "0"},           {"generate", "--top-p", "1.5"},
    {"generate", "--top-k", "-2"},          {"generate", "--min-p", "2"},
    {"generate", "--sampling-seed", "2147483648"}, {"generate", "--staggered", "0"},
    {"generate", "--min-margin", "nan"},    {"bench", "--input-len", "0"},
    {"bench", "--output-len", "x"},         {"bench", "--warmup", "101"},
    {"bench", "--batch-sizes", "0"},        {"bench", "--batch-sizes", "1,-2"},
    {"bench", "--batch-sizes", "1,"},       {"bench", "--batch-sizes", "1,,2"},
    {"bench", "--kv-cache-gb", "nan"},      {"serve", "--port", "70000"},
    {"serve", "--port", "-1"},              {"serve", "--max-queued", "-1"},
    {"serve", "--max-body-bytes", "10"},    {"serve", "--timeout-s", "0"},
    {"serve", "--timeout-s", "1e3"},        {"serve", "--kv-cache-gb", "1e-12"},
};

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_cli_flags VLLM MODEL_DIR\n");
        return 2;
    }
    int n = (int)(sizeof bads / sizeof bads[0]), named = 0;
    for (int i = 0; i < n; i++) {
        const struct bad *b = &bads[i];
        char *args[] = {argv[1], (char *)b->cmd, "--model", argv[2], (char *)b->flag, (char *)b->value,
                        "--prompt-ids", "1", NULL};
        if (strcmp(b->cmd, "generate")) args[6] = NULL;
        struct tu_proc p;
        CHECK(tu_run(args, 30, &p) == 0);
        // the message names the flag, the value and a range
        int ok = p.exit_code == 2 && strstr(p.out, b->flag) && strstr(p.out, b->value) && strchr(p.out, ']');
        CHECKF(ok, "%s %s '%s': exit %d, output: %s", b->cmd, b->flag, b->value, p.exit_code, p.out);
        named += ok;
        tu_proc_free(&p);
    }
    printf("cli_flags: %d/%d bad values refused by name\n", named, n);
    // good values are taken
    char *good[] = {argv[1], "generate", "--model", argv[2], "--prompt-ids", "1,2", "--max-tokens", "2",
                    "--kv-cache-gb", "0.5", "--temperature", "0", "--top-p", "1", "--max-num-seqs", "+4", NULL};
    struct tu_proc p;
    CHECK(tu_run(good, 60, &p) == 0);
    CHECKF(p.exit_code == 0 && strstr(p.out, "[finish: length]"), "good flags: exit %d: %s", p.exit_code, p.out);
    tu_proc_free(&p);
    return test_summary("cli_flags");
}
