// error.c - the thread-local last error behind vllm_last_error().
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include "core/common.h"

static _Thread_local char err_msg[1024];

int vllm_err(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    return status;
}

int vllm_err_prefix(int status, const char *fmt, ...) {
    char prefix[512], old[sizeof err_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof err_msg - 3) n = sizeof err_msg - 3;
    memcpy(err_msg, prefix, n);
    memcpy(err_msg + n, ": ", 2);
    size_t m = strlen(old);
    if (m > sizeof err_msg - n - 3) m = sizeof err_msg - n - 3;
    memcpy(err_msg + n + 2, old, m);
    err_msg[n + 2 + m] = 0;
    return status;
}

void vllm_err_clear(void) { err_msg[0] = 0; }

const char *vllm_last_error(void) { return err_msg; }

const char *vllm_version(void) { return VLLM_VERSION_STRING; }

void vllm_free(void *p) { free(p); }

const char *vllm_status_string(vllm_status s) {
    switch (s) {
    case VLLM_OK: return "ok";
    case VLLM_ERR_INVALID_ARGUMENT: return "invalid argument";
    case VLLM_ERR_IO: return "i/o error";
    case VLLM_ERR_FORMAT: return "format error";
    case VLLM_ERR_UNSUPPORTED: return "unsupported";
    case VLLM_ERR_OUT_OF_MEMORY: return "out of memory";
    case VLLM_ERR_TOO_LONG: return "too long";
    case VLLM_ERR_QUEUE_FULL: return "queue full";
    case VLLM_ERR_CANCELLED: return "cancelled";
    case VLLM_ERR_BACKEND: return "backend error";
    case VLLM_ERR_INTERNAL: return "internal error";
    case VLLM_ERR_SHUTDOWN: return "shutting down";
    }
    return "unknown status";
}

const char *vllm_finish_reason_string(vllm_finish_reason r) {
    switch (r) {
    case VLLM_FINISH_NONE: return "none";
    case VLLM_FINISH_STOP: return "stop";
    case VLLM_FINISH_LENGTH: return "length";
    case VLLM_FINISH_EOS: return "eos";
    case VLLM_FINISH_ABORT: return "abort";
    case VLLM_FINISH_ERROR: return "error";
    }
    return "unknown";
}

static void oom(size_t n) {
    fprintf(stderr, "vllm: out of host memory allocating %zu bytes\n", n);
    abort();
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) oom(n);
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) oom(n * size);
    return p;
}

void *try_calloc(size_t n, size_t size, const char *what) {
    if (size && n > SIZE_MAX / size) {
        vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %s: %zu x %zu bytes overflows", what, n, size);
        return NULL;
    }
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %s (%zu bytes of host memory)", what, n * size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) oom(n);
    return p;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

void xgrow(void **p, int *cap, int need, size_t elt) {
    if (need <= *cap) return;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    *p = xrealloc(*p, (size_t)c * elt);
    *cap = c;
}

// Only regular files are read: a FIFO or device named config.json would
// block or never end. O_NONBLOCK makes the open itself return for a FIFO.
int read_file(const char *path, char **data, size_t *len) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return vllm_err(VLLM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return vllm_err(VLLM_ERR_IO, "%s is not a regular file", path);
    }
    if (st.st_size > VLLM_MAX_READ_FILE) {
        close(fd);
        return vllm_err(VLLM_ERR_IO, "%s: %lld bytes is more than the %d MiB a config, tokenizer or template file "
                        "may have", path, (long long)st.st_size, VLLM_MAX_READ_FILE >> 20);
    }
    size_t cap = (size_t)st.st_size + 2, n = 0; // one spare byte: a file that grows is noticed
    char *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 == cap) buf = xrealloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 || n + (size_t)MAX(r, 0) > VLLM_MAX_READ_FILE) {
            int e = r < 0 ? errno : EFBIG;
            close(fd);
            free(buf);
            return vllm_err(VLLM_ERR_IO, "error reading %s: %s", path, strerror(e));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *data = buf;
    if (len) *len = n;
    return VLLM_OK;
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = xmalloc(a + b + 2);
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// VLLM_DIAG is read once: diag_on is called on hot paths (every layer).
static char diag_env[256];
static pthread_once_t diag_once = PTHREAD_ONCE_INIT;
static void diag_read(void) {
    const char *v = getenv("VLLM_DIAG");
    if (v && strcmp(v, "0")) snprintf(diag_env, sizeof diag_env, "%s", v);
}

int diag_on(const char *name) {
    pthread_once(&diag_once, diag_read);
    const char *v = diag_env;
    if (!*v) return 0;
    size_t n = strlen(name);
    for (const char *p = v; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if ((len == n && !strncmp(p, name, n)) || (len == 3 && !strncmp(p, "all", 3))) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

void diag_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("[diag] ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}
