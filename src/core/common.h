// common.h - error reporting, allocation and small helpers used everywhere.
#ifndef VLLM_CORE_COMMON_H
#define VLLM_CORE_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vllm.h"

// Sets the calling thread's last error and returns status, so that a failing
// path reads `return vllm_err(VLLM_ERR_FORMAT, "%s: bad header", path);`.
int vllm_err(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Prepends "context: " to the thread's last error, keeps status.
int vllm_err_prefix(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void vllm_err_clear(void);

// Allocation that never returns NULL for a nonzero size: out of host memory is
// not a condition this program can continue from, so it exits with a message.
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
// An allocation whose size comes from input (a config, a checkpoint, a file,
// a flag) must fail cleanly instead: NULL, with VLLM_ERR_OUT_OF_MEMORY as the
// last error naming `what` and the bytes, when n * size overflows or the
// allocation fails. Zeroed.
void *try_calloc(size_t n, size_t size, const char *what);
// Grows *p (of *cap elements of elt bytes) to hold at least need elements.
void xgrow(void **p, int *cap, int need, size_t elt);

// Reads a whole regular file (at most VLLM_MAX_READ_FILE bytes), never
// blocking on a FIFO or device. Returns VLLM_OK or VLLM_ERR_IO with the path
// in the error.
#define VLLM_MAX_READ_FILE (256 << 20)
int read_file(const char *path, char **data, size_t *len);
int file_exists(const char *path);
char *path_join(const char *dir, const char *name);

double now_s(void); // monotonic seconds

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define CDIV(a, b) (((a) + (b) - 1) / (b))

// Propagates a nonzero status.
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        int try_rc_ = (expr);                                                                      \
        if (try_rc_ != 0) return try_rc_;                                                          \
    } while (0)

// VLLM_DIAG: comma-separated diagnostic switches, off by default
// (docs/ENVIRONMENT.md). diag_on("1") is true for VLLM_DIAG=1.
int diag_on(const char *name);
void diag_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
