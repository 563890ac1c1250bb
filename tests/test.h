// test.h - the tiny assertion kit of the C tests. A test that checked
// nothing fails: test_summary() returns 1 when zero checks ran.
#ifndef VLLM_TEST_H
#define VLLM_TEST_H

#include <stdio.h>
#include <stdlib.h>

static int test_checks, test_failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(cond)) {                                                                             \
            test_failures++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);              \
        }                                                                                          \
    } while (0)

#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(cond)) {                                                                             \
            test_failures++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);              \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

// Exit code 77 is ctest's SKIP_RETURN_CODE: loud, and never a pass.
#define TEST_SKIP(...)                                                                             \
    do {                                                                                           \
        fprintf(stderr, "SKIP: ");                                                                 \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        exit(77);                                                                                  \
    } while (0)

static inline int test_summary(const char *name) {
    if (test_checks == 0) {
        fprintf(stderr, "%s: FAIL: zero checks ran\n", name);
        return 1;
    }
    printf("%s: %d/%d checks passed\n", name, test_checks - test_failures, test_checks);
    return test_failures ? 1 : 0;
}

#endif
