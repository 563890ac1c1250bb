// util.c - temp dirs, files and safetensors writing for tests.
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "core/json.h"
#include "util.h"

char *tu_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/vllm_test_XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    return d ? xstrdup(d) : NULL;
}

void tu_rmdir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = path_join(dir, e->d_name);
        unlink(p);
        free(p);
    }
    closedir(d);
    rmdir(dir);
}

int tu_write(const char *dir, const char *name, const void *data, size_t len) {
    char *p = path_join(dir, name);
    FILE *f = fopen(p, "wb");
    free(p);
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    fclose(f);
    return w == len ? 0 : -1;
}

int tu_copy(const char *src_dir, const char *dst_dir, const char *name) {
    char *p = path_join(src_dir, name), *data;
    size_t len;
    int rc = read_file(p, &data, &len);
    free(p);
    if (rc) return rc;
    rc = tu_write(dst_dir, name, data, len);
    free(data);
    return rc;
}

char *tu_fixture(const char *rel) {
    const char *base = getenv("VLLM_FIXTURES");
    return path_join(base && *base ? base : "tests/fixtures", rel);
}

static json_t *fixture_json(const char *fx, const char *file) {
    char rel[128];
    snprintf(rel, sizeof rel, "%s/%s", fx, file);
    char *p = tu_fixture(rel);
    json_t *j = NULL;
    json_load_path(p, &j);
    free(p);
    return j;
}
json_t *tu_fixture_config(const char *fx) { return fixture_json(fx, "config.json"); }
json_t *tu_fixture_golden(const char *fx) { return fixture_json(fx, "golden.json"); }

int tu_write_raw_safetensors(const char *path, const char *header, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint64_t h = strlen(header);
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(h >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(header, 1, h, f);
    if (len) fwrite(data, 1, len, f);
    fclose(f);
    return 0;
}

int tu_write_safetensors(const char *path, const struct tu_tensor *t, int n) {
    json_t *hdr = json_object();
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *e = json_object(), *shape = json_array();
        json_object_set_new(e, "dtype", json_string(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + t[i].nbytes)));
        json_object_set_new(hdr, t[i].name, e);
        off += t[i].nbytes;
    }
    char *h = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    unsigned char *data = xmalloc(off ? off : 1);
    size_t o = 0;
    for (int i = 0; i < n; i++) memcpy(data + o, t[i].data, t[i].nbytes), o += t[i].nbytes;
    int rc = tu_write_raw_safetensors(path, h, data, off);
    free(h);
    free(data);
    return rc;
}

char *tu_model_copy(const char *fixture, void (*edit)(json_t *cfg)) {
    char *src = tu_fixture(fixture), *dst = tu_tmpdir();
    if (!dst) {
        free(src);
        return NULL;
    }
    tu_copy(src, dst, "model.safetensors");
    char *cp = path_join(src, "config.json");
    json_error_t err;
    json_t *cfg = json_load_file(cp, 0, &err);
    free(cp);
    if (cfg && edit) edit(cfg);
    char *txt = cfg ? json_dumps(cfg, JSON_INDENT(2)) : NULL;
    if (txt) tu_write(dst, "config.json", txt, strlen(txt));
    free(txt);
    json_decref(cfg);
    free(src);
    return dst;
}

int tu_fixture_list(const char *env, char ***names) {
    const char *v = getenv(env);
    int n = 0;
    *names = NULL;
    if (!v || !*v) return 0;
    char *copy = xstrdup(v), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        *names = xrealloc(*names, sizeof(char *) * (n + 1));
        (*names)[n++] = xstrdup(t);
    }
    free(copy);
    return n;
}

void tu_list_free(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

char *tu_mamba2_dir(void) {
    char *dir = tu_tmpdir();
    const char *cfg = "{\"architectures\": [\"Mamba2ForCausalLM\"], \"vocab_size\": 256, \"hidden_size\": 32, "
                      "\"num_hidden_layers\": 2, \"layer_norm_epsilon\": 1e-5, \"num_heads\": 4, \"head_dim\": 8, "
                      "\"state_size\": 8, \"n_groups\": 2, \"conv_kernel\": 4, \"chunk_size\": 8, \"expand\": 1, "
                      "\"use_conv_bias\": true, \"use_bias\": false, \"max_position_embeddings\": 4096}";
    if (dir && tu_write(dir, "config.json", cfg, strlen(cfg))) {
        tu_rmdir(dir);
        free(dir);
        return NULL;
    }
    return dir;
}
