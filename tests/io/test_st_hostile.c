// test_st_hostile.c - safetensors headers and directories a hostile user
// writes: overlaps an empty tensor used to hide, duplicate keys, header
// lengths, misaligned data, special files, indexes that lie, and headers of
// 200k tensors (parsing is linear; the bound below only guards against the
// quadratic parse coming back, which took minutes at this size).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "core/json.h"
#include "io/dtype.h"
#include "io/safetensors.h"
#include "test.h"
#include "util.h"

static int raw_err(const char *path, const char *hdr, size_t data_len, const char *must) {
    static unsigned char data[256];
    tu_write_raw_safetensors(path, hdr, data, data_len);
    struct st_set *s = NULL;
    int rc = st_open_file(path, &s);
    st_close(s);
    const char *e = vllm_last_error();
    int ok = rc == VLLM_ERR_FORMAT && strstr(e, path) && strstr(e, must);
    if (!ok) fprintf(stderr, "  %s: rc %d, error: %s\n", hdr, rc, e);
    return ok;
}

static void headers(const char *dir) {
    char *bad = path_join(dir, "bad.safetensors");
    // an empty tensor between two overlapping ones hid the overlap
    CHECK(raw_err(bad, "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
                       " \"e\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 8]},"
                       " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}", 16, "overlaps"));
    // one tensor inside another's span, past a neighbour that does not overlap
    CHECK(raw_err(bad, "{\"a\": {\"dtype\": \"F32\", \"shape\": [8], \"data_offsets\": [0, 32]},"
                       " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]},"
                       " \"c\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [16, 20]}}", 32, "overlaps"));
    CHECK(raw_err(bad, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                       " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8, "duplicate"));
    CHECK(raw_err(bad, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 16]}}", 32, "24 bytes"));
    CHECK(raw_err(bad, "{\"a\": {\"dtype\": \"BF16\", \"shape\": [1099511627776, 1099511627776],"
                       " \"data_offsets\": [0, 2]}}", 8, "2^50"));
    CHECK(raw_err(bad, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]}}", 8, "shape[0]"));
    CHECK(raw_err(bad, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, \"8\"]}}", 8, "data_offsets"));
    CHECK(raw_err(bad, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [-8, 0]}}", 8, "data_offsets"));
    CHECK(raw_err(bad, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8, "data_offsets"));
    CHECK(raw_err(bad, "{\"a\": 5}", 8, "tensor a"));
    CHECK(raw_err(bad, "[1, 2]", 8, "not a JSON object"));
    CHECK(raw_err(bad, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", 8,
                  "dims"));
    tu_write_raw_safetensors(bad, "{}", NULL, 0); // an empty checkpoint is a valid file
    struct st_set *e = NULL;
    CHECK(st_open_file(bad, &e) == 0 && st_count(e) == 0);
    st_close(e);

    // header lengths: 0, 1, past the end, 2^63
    uint64_t lens[] = {0, 1, 64, (uint64_t)1 << 63};
    for (int i = 0; i < 4; i++) {
        unsigned char b[16] = "xxxxxxxx{}      ";
        for (int k = 0; k < 8; k++) b[k] = (unsigned char)(lens[i] >> (8 * k));
        tu_write(dir, "bad.safetensors", b, sizeof b);
        struct st_set *s = NULL;
        int rc = st_open_file(bad, &s);
        st_close(s);
        CHECKF(rc == VLLM_ERR_FORMAT && strstr(vllm_last_error(), "header length"), "hlen %llu: %s",
               (unsigned long long)lens[i], vllm_last_error());
    }

    // odd data_offsets: bf16 read without a misaligned access (UBSan checks)
    unsigned char data[9] = {0};
    uint16_t h = f32_to_bf16(-3.5f);
    memcpy(data + 1, &h, 2);
    memcpy(data + 3, &h, 2);
    tu_write_raw_safetensors(bad, "{\"p\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
                                  " \"q\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [1, 5]}}", data, 9);
    struct st_set *s = NULL;
    CHECK(st_open_file(bad, &s) == 0);
    if (s) {
        float out[2] = {0};
        CHECK(st_read_f32(st_find(s, "q"), out) == 0 && out[0] == -3.5f && out[1] == -3.5f);
        st_close(s);
    }
    free(bad);
}

static void special_files(const char *dir) {
    char *d = path_join(dir, "fifo_model");
    mkdir(d, 0755);
    char *st = path_join(d, "model.safetensors"), *cfg = path_join(d, "config.json");
    CHECK(mkfifo(st, 0644) == 0 && mkfifo(cfg, 0644) == 0);
    struct st_set *s = NULL;
    CHECK(st_open_dir(d, &s) == VLLM_ERR_IO && strstr(vllm_last_error(), "not a regular file") &&
          strstr(vllm_last_error(), "model.safetensors"));
    char *data = NULL;
    CHECK(read_file(cfg, &data, NULL) == VLLM_ERR_IO && strstr(vllm_last_error(), "config.json") &&
          strstr(vllm_last_error(), "not a regular file"));
    json_t *j = NULL;
    CHECK(json_load_path(cfg, &j) == VLLM_ERR_IO);
    // a device and a directory under the names read
    unlink(st);
    CHECK(symlink("/dev/zero", st) == 0);
    CHECK(st_open_dir(d, &s) == VLLM_ERR_IO && strstr(vllm_last_error(), "not a regular file"));
    CHECK(read_file("/dev/zero", &data, NULL) == VLLM_ERR_IO);
    CHECK(read_file(dir, &data, NULL) == VLLM_ERR_IO);
    unlink(st);
    // a FIFO index
    char *idx = path_join(d, "model.safetensors.index.json");
    CHECK(mkfifo(idx, 0644) == 0);
    CHECK(st_open_dir(d, &s) == VLLM_ERR_IO && strstr(vllm_last_error(), "index.json"));
    unlink(idx);
    unlink(cfg);
    free(idx), free(st), free(cfg), free(d);
}

static int dir_err(const char *dir, const char *index, int want_rc, const char *must1, const char *must2) {
    tu_write(dir, "model.safetensors.index.json", index, strlen(index));
    struct st_set *s = NULL;
    int rc = st_open_dir(dir, &s);
    st_close(s);
    const char *e = vllm_last_error();
    int ok = rc == want_rc && strstr(e, must1) && (!must2 || strstr(e, must2));
    if (!ok) fprintf(stderr, "  index %s: rc %d, error: %s\n", index, rc, e);
    return ok;
}

static void lying_index(void) {
    char *sh = tu_tmpdir();
    float f[4] = {1, 2, 3, 4};
    struct tu_tensor a = {"a", "F32", 1, {2}, f, 8}, b = {"b", "F32", 1, {2}, f + 2, 8};
    char *p1 = path_join(sh, "s1.safetensors"), *p2 = path_join(sh, "s2.safetensors");
    tu_write_safetensors(p1, &a, 1);
    tu_write_safetensors(p2, &b, 1);
    CHECK(dir_err(sh, "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\", \"ghost\": \"s2.safetensors\"}}",
                  VLLM_ERR_FORMAT, "ghost", "s2.safetensors"));
    CHECK(dir_err(sh, "{\"weight_map\": {\"a\": \"s2.safetensors\", \"b\": \"s2.safetensors\"}}", VLLM_ERR_FORMAT,
                  "tensor a", "s2.safetensors"));
    CHECK(dir_err(sh, "{\"weight_map\": {\"a\": \"s2.safetensors\", \"b\": \"s1.safetensors\"}}", VLLM_ERR_FORMAT,
                  "tensor a is listed in s2.safetensors but is in s1.safetensors", NULL));
    CHECK(dir_err(sh, "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s3.safetensors\"}}", VLLM_ERR_IO,
                  "s3.safetensors", NULL));
    CHECK(dir_err(sh, "{\"weight_map\": {\"a\": \"../s1.safetensors\"}}", VLLM_ERR_FORMAT, "weight_map", NULL));
    CHECK(dir_err(sh, "{\"weight_map\": {\"a\": \"..\"}}", VLLM_ERR_FORMAT, "weight_map", NULL));
    CHECK(dir_err(sh, "{\"weight_map\": {\"a\": 7}}", VLLM_ERR_FORMAT, "weight_map", NULL));
    CHECK(dir_err(sh, "{\"weight_map\": [\"s1.safetensors\"]}", VLLM_ERR_FORMAT, "weight_map", NULL));
    CHECK(dir_err(sh, "{\"weight_map\": {}}", VLLM_ERR_IO, "index.json", NULL));
    CHECK(dir_err(sh, "{\"weight_map\": {\"a\": \"s1.safetensors\"", VLLM_ERR_FORMAT, "index.json", NULL));
    // the truth parses; a tensor the index does not list is still found
    CHECK(dir_err(sh, "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\"}}", VLLM_OK, "", NULL));
    tu_rmdir(sh);
    free(p1), free(p2), free(sh);
}

// A header of n one-element tensors, as a file image in memory.
static unsigned char *many_tensors(int n, size_t *len) {
    size_t cap = (size_t)n * 128 + 64, k = 8;
    unsigned char *b = xmalloc(cap + 4 * (size_t)n);
    b[k++] = '{';
    for (int i = 0; i < n; i++)
        k += snprintf((char *)b + k, cap - k, "%s\"model.layers.%d.w\": {\"dtype\": \"F32\", \"shape\": [1], "
                      "\"data_offsets\": [%d, %d]}", i ? ", " : "", i, 4 * i, 4 * i + 4);
    b[k++] = '}';
    uint64_t h = k - 8;
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(h >> (8 * i));
    memset(b + k, 0, 4 * (size_t)n);
    *len = k + 4 * (size_t)n;
    return b;
}

static void big_header(void) {
    size_t len;
    int n = 200000;
    unsigned char *img = many_tensors(n, &len);
    struct st_set *s = NULL;
    double t0 = now_s();
    int rc = st_open_buffer(img, len, "big.safetensors", &s);
    double dt = now_s() - t0;
    CHECKF(rc == 0, "%s", vllm_last_error());
    if (s) {
        CHECK(st_count(s) == n && st_find(s, "model.layers.123456.w") && !st_find(s, "model.layers.200000.w"));
        st_close(s);
    }
    printf("st_hostile: %d tensors parsed in %.3f s\n", n, dt);
    CHECKF(dt < 20, "200k tensors took %.1f s: is the header parse quadratic again?", dt);
    free(img);
}

int main(void) {
    char *dir = tu_tmpdir();
    CHECK(dir != NULL);
    if (!dir) return test_summary("st_hostile");
    headers(dir);
    special_files(dir);
    lying_index();
    big_header();
    tu_rmdir(dir);
    free(dir);
    return test_summary("st_hostile");
}
