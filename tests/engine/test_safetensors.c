// test_safetensors.c - dtypes, shards, and a clear error naming the file and
// tensor for every header violation.
#include <math.h>
#include <sys/stat.h>

#include "core/common.h"
#include "io/dtype.h"
#include "io/safetensors.h"
#include "test.h"
#include "util.h"

static int open_err(const char *path, const char *must1, const char *must2) {
    struct st_set *s = NULL;
    int rc = st_open_file(path, &s);
    st_close(s);
    const char *e = vllm_last_error();
    int ok = rc == VLLM_ERR_FORMAT && strstr(e, path) && (!must1 || strstr(e, must1)) && (!must2 || strstr(e, must2));
    if (!ok) fprintf(stderr, "  rc %d, error: %s\n", rc, e);
    return ok;
}

int main(void) {
    char *dir = tu_tmpdir();
    CHECK(dir != NULL);
    if (!dir) return test_summary("safetensors");
    char *good = path_join(dir, "good.safetensors");
    float f32[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    uint16_t bf[3] = {f32_to_bf16(1.5f), f32_to_bf16(-2.25f), f32_to_bf16(1e4f)};
    uint16_t f16[2] = {0x3c00, 0xc500}; // 1.0, -5.0
    struct tu_tensor ts[] = {
        {"a", "F32", 2, {2, 3}, f32, sizeof f32},
        {"b", "BF16", 1, {3}, bf, sizeof bf},
        {"c", "F16", 1, {2}, f16, sizeof f16},
    };
    CHECK(tu_write_safetensors(good, ts, 3) == 0);
    struct st_set *s = NULL;
    CHECK(st_open_file(good, &s) == 0);
    if (s) {
        float out[6];
        const struct st_tensor *t = st_find(s, "a");
        CHECK(t && t->ndim == 2 && t->shape[1] == 3 && st_read_f32(t, out) == 0 && out[2] == 3.5f && out[5] == -7);
        t = st_find(s, "b");
        CHECK(t && st_read_f32(t, out) == 0 && out[0] == 1.5f && out[1] == -2.25f && out[2] == 9984.0f);
        t = st_find(s, "c");
        CHECK(t && st_read_f32(t, out) == 0 && out[0] == 1.0f && out[1] == -5.0f);
        CHECK(st_find(s, "zzz") == NULL && st_count(s) == 3);
        st_close(s);
    }

    char *bad = path_join(dir, "bad.safetensors");
    unsigned char data[64] = {0};
    tu_write_raw_safetensors(bad, "{\"x\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", data, 8);
    CHECKF(open_err(bad, "x", "past the end"), "offsets past the end");
    tu_write_raw_safetensors(bad, "{\"x\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 16]}}", data, 16);
    CHECKF(open_err(bad, "x", "elements"), "numel * dtype size != bytes");
    tu_write_raw_safetensors(bad, "{\"x\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
                                  " \"y\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}", data, 16);
    CHECKF(open_err(bad, "overlaps", NULL), "overlapping tensors");
    tu_write_raw_safetensors(bad, "{\"x\": {\"dtype\": \"Q4\", \"shape\": [4], \"data_offsets\": [0, 16]}}", data, 16);
    CHECKF(open_err(bad, "x", "dtype"), "unknown dtype");
    tu_write_raw_safetensors(bad, "{\"x\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [16, 0]}}", data, 16);
    CHECKF(open_err(bad, "x", "data_offsets"), "reversed offsets");
    tu_write_raw_safetensors(bad, "{\"x\": {\"dtype\": \"F32\", \"shape\": [-4], \"data_offsets\": [0, 16]}}", data, 16);
    CHECKF(open_err(bad, "x", "shape"), "negative dim");
    tu_write_raw_safetensors(bad, "{\"x\": [1, 2", data, 16);
    CHECKF(open_err(bad, "JSON", NULL), "broken JSON header");
    // header length beyond the file
    FILE *f = fopen(bad, "wb");
    unsigned char hl[8] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
    fwrite(hl, 1, 8, f);
    fwrite("{}", 1, 2, f);
    fclose(f);
    CHECKF(open_err(bad, "header length", NULL), "header length");
    tu_write(dir, "bad.safetensors", "abc", 3);
    CHECKF(open_err(bad, "too short", NULL), "truncated file");

    // sharded checkpoint with an index
    char *sh = tu_tmpdir();
    char *p1 = path_join(sh, "model-00001-of-00002.safetensors"), *p2 = path_join(sh, "model-00002-of-00002.safetensors");
    tu_write_safetensors(p1, ts, 1);
    tu_write_safetensors(p2, ts + 1, 2);
    const char *idx = "{\"metadata\": {}, \"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\","
                      " \"b\": \"model-00002-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\"}}";
    tu_write(sh, "model.safetensors.index.json", idx, strlen(idx));
    CHECK(st_open_dir(sh, &s) == 0);
    if (s) {
        CHECK(st_count(s) == 3 && st_find(s, "a") && st_find(s, "c"));
        st_close(s);
    }
    const char *idx2 = "{\"weight_map\": {\"a\": \"missing.safetensors\"}}";
    tu_write(sh, "model.safetensors.index.json", idx2, strlen(idx2));
    CHECK(st_open_dir(sh, &s) == VLLM_ERR_IO && strstr(vllm_last_error(), "missing.safetensors"));
    // a tensor in two shards
    tu_write_safetensors(p2, ts, 2);
    tu_write(sh, "model.safetensors.index.json", idx, strlen(idx));
    CHECK(st_open_dir(sh, &s) == VLLM_ERR_FORMAT && strstr(vllm_last_error(), "twice"));
    char *empty = tu_tmpdir();
    CHECK(st_open_dir(empty, &s) == VLLM_ERR_IO && strstr(vllm_last_error(), "no *.safetensors"));
    CHECK(st_open_dir("/nonexistent/dir", &s) == VLLM_ERR_IO);
    tu_rmdir(empty);
    tu_rmdir(sh);
    tu_rmdir(dir);
    free(empty), free(sh), free(p1), free(p2), free(bad), free(good), free(dir);
    return test_summary("safetensors");
}
