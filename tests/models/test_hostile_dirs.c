// test_hostile_dirs.c - `vllm generate` on a few hundred malformed model
// directories made from a fixture: truncated files, header lengths, non-JSON
// headers, offsets, overlaps, dtypes, shapes, missing / duplicate / extra
// tensors, config keys missing, mistyped, NaN, inf, negative or huge,
// sharded indexes that lie, and special files (FIFOs, devices, directories).
// Each must exit 1 or 2 with a message naming the file, tensor or key, or,
// where the input is valid, give the fixture's own tokens. No case may end
// by a signal or hang.
// usage: test_hostile_dirs VLLM_BINARY FIXTURE_DIR
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "proc.h"
#include "test.h"

#define RUN_TIMEOUT_S 30

static const char *vllm_bin, *fixture, *rope_fixture;
static char root[512];
static json_t *base_cfg;   // the fixture's config.json
static json_t *base_hdr;   // its model.safetensors header
static unsigned char *data; // and data region
static size_t data_len;
static char *want_out;     // the fixture's own output
static int n_cases, n_ok, n_signal, n_timeout;

// ------------------------------------------------------------- files --

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    b[*len] = 0;
    fclose(f);
    return b;
}

static void write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f) fwrite(p, 1, n, f), fclose(f);
}

// A safetensors file: header length (hlen_override unless ~0), header text, data.
static void write_st_raw(const char *dir, const char *name, const char *hdr, uint64_t hlen_override,
                         const void *d, size_t dn) {
    size_t hn = strlen(hdr);
    uint64_t hl = hlen_override != ~(uint64_t)0 ? hlen_override : hn;
    unsigned char *b = malloc(8 + hn + dn);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hl >> (8 * i));
    memcpy(b + 8, hdr, hn);
    if (dn) memcpy(b + 8 + hn, d, dn);
    write_file(dir, name, b, 8 + hn + dn);
    free(b);
}

static void write_st(const char *dir, const char *name, const json_t *hdr) {
    char *t = json_dumps(hdr, JSON_COMPACT);
    write_st_raw(dir, name, t, ~(uint64_t)0, data, data_len);
    free(t);
}

static void link_fixture(const char *dir, const char *name) {
    char src[PATH_MAX + 64], dst[PATH_MAX + 64];
    snprintf(src, sizeof src, "%s/%s", fixture, name);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    if (symlink(src, dst)) perror(dst);
}

// A fresh case directory.
static char *new_dir(void) {
    static char dir[600];
    snprintf(dir, sizeof dir, "%s/c%03d", root, n_cases);
    mkdir(dir, 0755);
    return dir;
}

// ------------------------------------------------------------- runs --

// Cases are written first and run afterwards, two at a time.
struct kase {
    char *what, *dir, *needles;
    int want_ok;
    long as_mb; // > 0: run under prlimit --as (MiB), so an allocation too big fails fast
    struct tu_proc p;
};
static struct kase *cases;
static int cap_cases;

// want_ok: the fixture's tokens; else exit 1 or 2 with every `|`-separated
// needle in the output.
static void run_case_as(const char *what, const char *dir, int want_ok, const char *needles, long as_mb) {
    if (n_cases == cap_cases) cases = realloc(cases, sizeof *cases * (cap_cases = cap_cases ? 2 * cap_cases : 256));
    cases[n_cases++] = (struct kase){strdup(what), strdup(dir), needles ? strdup(needles) : NULL, want_ok, as_mb, {0}};
}

static void run_case(const char *what, const char *dir, int want_ok, const char *needles) {
    run_case_as(what, dir, want_ok, needles, 0);
}

static int next_case;
static pthread_mutex_t next_mu = PTHREAD_MUTEX_INITIALIZER;

static void *runner(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&next_mu);
        int i = next_case++;
        pthread_mutex_unlock(&next_mu);
        if (i >= n_cases) return NULL;
        char as[64];
        snprintf(as, sizeof as, "--as=%ld", cases[i].as_mb << 20);
        char *argv[] = {"/usr/bin/prlimit", as, "--", (char *)vllm_bin, "generate", "--model", cases[i].dir,
                        "--prompt-ids", "1,2,3", "--max-tokens", "2", "--threads", "1", "--kv-cache-gb", "0.01", NULL};
        if (tu_run(cases[i].as_mb > 0 ? argv : argv + 3, RUN_TIMEOUT_S, &cases[i].p)) cases[i].p.exit_code = -2;
    }
}

static void check_case(struct kase *k) {
    struct tu_proc *p = &k->p;
    if (p->timed_out) n_timeout++;
    else if (p->signal) n_signal++;
    int ok;
    if (k->want_ok) {
        ok = !p->timed_out && p->exit_code == 0 && p->out && want_out && !strcmp(p->out, want_out);
    } else {
        ok = !p->timed_out && !p->signal && (p->exit_code == 1 || p->exit_code == 2) && p->out;
        char buf[256];
        for (const char *s = k->needles; ok && s && *s;) {
            const char *e = strchr(s, '|');
            size_t n = e ? (size_t)(e - s) : strlen(s);
            snprintf(buf, sizeof buf, "%.*s", (int)n, s);
            ok = strstr(p->out, buf) != NULL;
            s = e ? e + 1 : NULL;
        }
    }
    n_ok += ok;
    CHECKF(ok, "%s (%s): exit %d, signal %d, timed out %d, want %s [%s]; output: %.400s", k->what, k->dir, p->exit_code,
           p->signal, p->timed_out, k->want_ok ? "the fixture's tokens" : "exit 1/2 naming", k->needles ? k->needles : "",
           p->out ? p->out : "");
    tu_proc_free(p);
    free(k->what), free(k->dir), free(k->needles);
}

// ------------------------------------------------------------ config --

// config.json with key = value (JSON text as Python writes it, so bare NaN
// and Infinity too; NULL: the key is removed).
static void config_case(const char *key, const char *value, int want_ok) {
    json_t *cfg = json_deep_copy(base_cfg);
    json_object_del(cfg, key);
    char *t = json_dumps(cfg, JSON_COMPACT), *out = malloc(strlen(t) + strlen(key) + (value ? strlen(value) : 0) + 16);
    if (value) sprintf(out, "{\"%s\": %s%s%s", key, value, json_object_size(cfg) ? ", " : "", t + 1);
    else strcpy(out, t);
    char *dir = new_dir();
    write_file(dir, "config.json", out, strlen(out));
    link_fixture(dir, "model.safetensors");
    char what[256], needle[160];
    snprintf(what, sizeof what, "config %s = %s", key, value ? value : "(missing)");
    // the registry says "architecture"
    snprintf(needle, sizeof needle, "config.json|%s", !strcmp(key, "architectures") ? "architecture" : key);
    run_case(what, dir, want_ok, needle);
    free(out), free(t);
    json_decref(cfg);
}

static void config_cases(void) {
    static const char *const keys[] = {"vocab_size", "hidden_size", "layer_norm_epsilon", "mamba_num_heads",
                                       "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel", "chunk_size",
                                       "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                                       "max_position_embeddings", "eos_token_id", "time_step_limit", "use_conv_bias",
                                       "mlp_bias", "layers_block_type"};
    static const char *const values[] = {"NaN", "Infinity", "-1", "0", "1000000000", "\"64\"", "4096.5", "true", "null"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
            const char *key = keys[k], *val = values[v];
            int ok = (!strcmp(val, "null") && (!strcmp(key, "max_position_embeddings") ||
                                               !strcmp(key, "eos_token_id") || !strcmp(key, "time_step_limit"))) ||
                     (!strcmp(val, "0") && !strcmp(key, "eos_token_id")) ||
                     (!strcmp(val, "true") && !strcmp(key, "use_conv_bias")); // the fixture's own value
            config_case(key, val, ok);
        }
        // absent: optional keys run as before
        int optional = !strcmp(keys[k], "max_position_embeddings") || !strcmp(keys[k], "eos_token_id") ||
                       !strcmp(keys[k], "time_step_limit");
        config_case(keys[k], NULL, optional);
    }
    config_case("time_step_limit", "[NaN, -1]", 0);
    config_case("time_step_limit", "[0.5, 0.1]", 0);
    config_case("time_step_limit", "[0.0, Infinity]", 1);
    config_case("eos_token_id", "[1, 2, 3, 4, 5, 6, 7, 8, 9]", 0);
    config_case("eos_token_id", "[2, 256]", 0);
    config_case("eos_token_id", "[2, 3]", 1);
    config_case("layers_block_type", "[\"mamba\", \"conv\"]", 0);
    config_case("architectures", "[\"LlamaForNothing\"]", 0);
    config_case("architectures", "\"NemotronHForCausalLM\"", 0);
    config_case("architectures", NULL, 0);
    // in range, but not the weights' shapes: the message names the tensor
    static const char *const misfit[][3] = {{"hidden_size", "65", "backbone.embeddings.weight"},
                                            {"vocab_size", "300", "backbone.embeddings.weight"},
                                            {"intermediate_size", "97", "backbone.layers.2.mixer.up_proj.weight"},
                                            {"mamba_num_heads", "16", "backbone.layers.0.mixer.in_proj.weight"},
                                            {"conv_kernel", "3", "backbone.layers.0.mixer.conv1d.weight"},
                                            {"head_dim", "8", "backbone.layers.1.mixer.q_proj.weight"}};
    for (size_t i = 0; i < sizeof misfit / sizeof misfit[0]; i++) {
        json_t *cfg = json_deep_copy(base_cfg);
        json_object_set_new(cfg, misfit[i][0], json_integer(atoi(misfit[i][1])));
        char *t = json_dumps(cfg, JSON_COMPACT), *dir = new_dir(), what[128], needle[160];
        write_file(dir, "config.json", t, strlen(t));
        link_fixture(dir, "model.safetensors");
        snprintf(what, sizeof what, "config %s = %s (the weights disagree)", misfit[i][0], misfit[i][1]);
        snprintf(needle, sizeof needle, "model.safetensors|%s", misfit[i][2]);
        run_case(what, dir, 0, needle);
        free(t);
        json_decref(cfg);
    }
    // whole-file damage
    static const char *const texts[] = {"", "{", "[1, 2]", "\"config\"", "{\"architectures\": [\"NemotronHForCausalLM\"]}",
                                        "\xff\xfe{}", "{\"vocab_size\": 99999999999999999999999}"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        char *dir = new_dir();
        write_file(dir, "config.json", texts[i], strlen(texts[i]));
        link_fixture(dir, "model.safetensors");
        char what[64];
        snprintf(what, sizeof what, "config.json text #%zu", i);
        run_case(what, dir, 0, "config.json");
    }
}

// ------------------------------------------------------- safetensors --

static json_t *entry(json_t *hdr, const char *name) { return json_object_get(hdr, name); }

// One tensor's entry changed by `mutate`; the rest as in the fixture.
static void tensor_case(const char *name, const char *how, void (*mutate)(json_t *hdr, json_t *e), const char *needles) {
    json_t *hdr = json_deep_copy(base_hdr);
    mutate(hdr, entry(hdr, name));
    char *dir = new_dir();
    write_st(dir, "model.safetensors", hdr);
    link_fixture(dir, "config.json");
    char what[256], where[1024];
    snprintf(what, sizeof what, "tensor %s: %s", name, how);
    // every message also names where: the file's path, or (a tensor that
    // is missing) the model directory
    snprintf(where, sizeof where, "%s|%s", needles, dir);
    run_case(what, dir, 0, where);
    json_decref(hdr);
}

static json_t *offs(json_t *e, int i) { return json_array_get(json_object_get(e, "data_offsets"), i); }
static void m_delete(json_t *hdr, json_t *e) {
    (void)e;
    const char *k;
    json_t *v;
    json_object_foreach(hdr, k, v) if (v == e) { json_object_del(hdr, k); return; }
}
static void m_dtype_f16(json_t *hdr, json_t *e) { (void)hdr, json_object_set_new(e, "dtype", json_string("F16")); }
static void m_dtype_i32(json_t *hdr, json_t *e) { (void)hdr, json_object_set_new(e, "dtype", json_string("I32")); }
static void m_dtype_q4(json_t *hdr, json_t *e) { (void)hdr, json_object_set_new(e, "dtype", json_string("Q4_K")); }
static void m_dtype_num(json_t *hdr, json_t *e) { (void)hdr, json_object_set_new(e, "dtype", json_integer(7)); }
static void m_shape_grow(json_t *hdr, json_t *e) {
    (void)hdr;
    json_t *s = json_object_get(e, "shape");
    json_array_set_new(s, 0, json_integer(json_integer_value(json_array_get(s, 0)) + 1));
}
static void m_shape_swap(json_t *hdr, json_t *e) { // same bytes, another shape: the loader refuses it
    (void)hdr;
    json_t *s = json_object_get(e, "shape");
    size_t last = json_array_size(s) - 1; // first and last ([C, 1, K]: the 1 would not count)
    json_int_t a = json_integer_value(json_array_get(s, 0));
    if (last >= 1) {
        json_int_t b = json_integer_value(json_array_get(s, last));
        json_array_set_new(s, 0, json_integer(b));
        json_array_set_new(s, last, json_integer(a));
    } else {
        json_array_set_new(s, 0, json_integer(a / 2));
        json_array_append_new(s, json_integer(2));
    }
}
static void m_shape_neg(json_t *hdr, json_t *e) { (void)hdr, json_array_set_new(json_object_get(e, "shape"), 0, json_integer(-4)); }
static void m_shape_huge(json_t *hdr, json_t *e) {
    (void)hdr, json_array_set_new(json_object_get(e, "shape"), 0, json_integer((json_int_t)1 << 40));
}
static void m_shape_str(json_t *hdr, json_t *e) { (void)hdr, json_object_set_new(e, "shape", json_string("[64]")); }
static void m_off_shift(json_t *hdr, json_t *e) { // same length, 4 bytes on: overlaps a neighbour
    (void)hdr;
    json_t *o = json_object_get(e, "data_offsets");
    json_int_t b = json_integer_value(offs(e, 0)), en = json_integer_value(offs(e, 1));
    json_int_t d = b >= 4 ? -4 : 4;
    json_array_set_new(o, 0, json_integer(b + d));
    json_array_set_new(o, 1, json_integer(en + d));
}
static void m_off_past(json_t *hdr, json_t *e) {
    (void)hdr;
    json_t *o = json_object_get(e, "data_offsets");
    json_int_t len = json_integer_value(offs(e, 1)) - json_integer_value(offs(e, 0));
    json_array_set_new(o, 0, json_integer((json_int_t)data_len));
    json_array_set_new(o, 1, json_integer((json_int_t)data_len + len));
}
static void m_off_rev(json_t *hdr, json_t *e) {
    (void)hdr;
    json_t *o = json_object_get(e, "data_offsets");
    json_t *b = json_incref(offs(e, 0));
    json_array_set(o, 0, offs(e, 1));
    json_array_set_new(o, 1, b);
}
static void m_off_float(json_t *hdr, json_t *e) {
    (void)hdr, json_array_set_new(json_object_get(e, "data_offsets"), 0, json_real(0.5));
}
static void m_off_one(json_t *hdr, json_t *e) { (void)hdr, json_object_set_new(e, "data_offsets", json_pack("[i]", 0)); }
static void m_not_obj(json_t *hdr, json_t *e) {
    const char *k;
    json_t *v;
    json_object_foreach(hdr, k, v) if (v == e) { json_object_set_new(hdr, k, json_string("weights")); return; }
}

static void tensor_cases(void) {
    static const char *const names[] = {"backbone.embeddings.weight", "backbone.layers.0.mixer.in_proj.weight",
                                        "backbone.layers.3.mixer.A_log", "backbone.layers.0.mixer.conv1d.weight",
                                        "backbone.layers.1.mixer.k_proj.weight", "lm_head.weight"};
    static const struct {
        const char *how;
        void (*fn)(json_t *, json_t *);
        int names; // 1: the file and the tensor; 0: the file (an overlap names a neighbour too); 2: the tensor
    } muts[] = {
        {"deleted", m_delete, 2},           {"dtype F16", m_dtype_f16, 1},      {"dtype I32", m_dtype_i32, 1},
        {"dtype Q4_K", m_dtype_q4, 1},      {"dtype 7", m_dtype_num, 1},        {"shape +1", m_shape_grow, 1},
        {"shape swapped", m_shape_swap, 1}, {"shape -4", m_shape_neg, 1},       {"shape 2^40", m_shape_huge, 1},
        {"shape a string", m_shape_str, 1}, {"offsets +-4", m_off_shift, 0},   {"offsets past the end", m_off_past, 1},
        {"offsets reversed", m_off_rev, 1}, {"offset 0.5", m_off_float, 1},    {"one offset", m_off_one, 1},
        {"entry a string", m_not_obj, 1},
    };
    for (size_t n = 0; n < sizeof names / sizeof names[0]; n++)
        for (size_t m = 0; m < sizeof muts / sizeof muts[0]; m++) {
            char needles[256];
            // a shifted span overlaps its neighbour: the message names both, one of them maybe this one
            if (muts[m].names == 2) snprintf(needles, sizeof needles, "%s", names[n]);
            else snprintf(needles, sizeof needles, "model.safetensors%s%s", muts[m].names ? "|" : "",
                          muts[m].names ? names[n] : "");
            tensor_case(names[n], muts[m].how, muts[m].fn, needles);
        }
}

static void header_cases(void) {
    char *hdr_text = json_dumps(base_hdr, JSON_COMPACT);
    size_t hn = strlen(hdr_text);
    // header lengths that lie
    uint64_t lens[] = {0, 1, 2, hn - 1, hn + 1, hn + data_len + 1, (uint64_t)1 << 63, ~(uint64_t)1};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        char *dir = new_dir();
        write_st_raw(dir, "model.safetensors", hdr_text, lens[i], data, data_len);
        link_fixture(dir, "config.json");
        char what[96];
        snprintf(what, sizeof what, "header length %llu (true %zu)", (unsigned long long)lens[i], hn);
        run_case(what, dir, 0, "model.safetensors");
    }
    // truncations
    size_t total = 8 + hn + data_len;
    size_t cuts[] = {0, 3, 8, 9, 8 + hn / 2, 8 + hn - 1, 8 + hn, 8 + hn + 1, 8 + hn + data_len / 2, total - 1};
    unsigned char *whole = malloc(total);
    for (int i = 0; i < 8; i++) whole[i] = (unsigned char)((uint64_t)hn >> (8 * i));
    memcpy(whole + 8, hdr_text, hn);
    memcpy(whole + 8 + hn, data, data_len);
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char *dir = new_dir();
        write_file(dir, "model.safetensors", whole, cuts[i]);
        link_fixture(dir, "config.json");
        char what[96];
        snprintf(what, sizeof what, "truncated to %zu of %zu bytes", cuts[i], total);
        run_case(what, dir, 0, "model.safetensors");
    }
    // non-JSON and wrong JSON headers of the same length
    static const char *const bad[] = {"[]", "{", "null", "\"x\"", "{\"a\": 1,}", "{\"__metadata__\": 5}", "\x01\x02\x03"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *dir = new_dir();
        char *h = malloc(hn + 1);
        memset(h, ' ', hn);
        h[hn] = 0;
        memcpy(h, bad[i], strlen(bad[i]));
        write_st_raw(dir, "model.safetensors", h, ~(uint64_t)0, data, data_len);
        link_fixture(dir, "config.json");
        char what[96];
        snprintf(what, sizeof what, "header '%s'", bad[i]);
        int ok_meta = !strcmp(bad[i], "{\"__metadata__\": 5}"); // a valid header with no tensors: the loader names one
        run_case(what, dir, 0, ok_meta ? "checkpoint has no tensor" : "model.safetensors");
        free(h);
    }
    // a duplicate key (the JSON text repeats one entry)
    {
        const char *first = strchr(hdr_text, '{') + 1, *name = "\"backbone.norm_f.weight\":";
        const char *at = strstr(hdr_text, name);
        const char *end = at ? strchr(at, '}') + 1 : NULL;
        if (end && *end == '}') end++; // data_offsets ] } : the entry's closing brace
        size_t elen = end ? (size_t)(end - at) : 0;
        char *dup = malloc(hn + elen + 4);
        size_t k = (size_t)(first - hdr_text);
        memcpy(dup, hdr_text, k);
        memcpy(dup + k, at, elen);
        dup[k + elen] = ',';
        strcpy(dup + k + elen + 1, first);
        char *dir = new_dir();
        write_st_raw(dir, "model.safetensors", dup, ~(uint64_t)0, data, data_len);
        link_fixture(dir, "config.json");
        run_case("a tensor twice in one header", dir, 0, "model.safetensors|duplicate");
        free(dup);
    }
    // overlaps: two tensors on one span; one hidden behind an empty tensor
    {
        json_t *hdr = json_deep_copy(base_hdr);
        json_t *a = entry(hdr, "backbone.layers.0.mixer.D"), *b = entry(hdr, "backbone.layers.0.mixer.dt_bias");
        json_object_set(b, "data_offsets", json_object_get(a, "data_offsets"));
        char *dir = new_dir();
        write_st(dir, "model.safetensors", hdr);
        link_fixture(dir, "config.json");
        run_case("two tensors on one span", dir, 0, "model.safetensors|overlaps");
        json_object_set_new(hdr, "zz.empty", json_pack("{s:s,s:[i],s:[I,I]}", "dtype", "F32", "shape", 0, "data_offsets",
                                                       json_integer_value(offs(a, 0)) + 4,
                                                       json_integer_value(offs(a, 0)) + 4));
        dir = new_dir();
        write_st(dir, "model.safetensors", hdr);
        link_fixture(dir, "config.json");
        run_case("an overlap behind an empty tensor", dir, 0, "model.safetensors|overlaps");
        json_decref(hdr);
    }
    // extra tensors the model does not use: valid; an extra one with a bad span: not
    {
        json_t *hdr = json_deep_copy(base_hdr);
        json_object_set_new(hdr, "model.unused.weight", json_pack("{s:s,s:[i],s:[i,i]}", "dtype", "F32", "shape", 4,
                                                                  "data_offsets", 0, 16));
        char *dir = new_dir();
        write_st(dir, "model.safetensors", hdr); // it overlaps the embedding's bytes
        link_fixture(dir, "config.json");
        run_case("an extra tensor overlapping another", dir, 0, "model.safetensors|overlaps");
        json_decref(hdr);
        hdr = json_deep_copy(base_hdr);
        json_object_set_new(hdr, "model.unused.empty", json_pack("{s:s,s:[i,i],s:[I,I]}", "dtype", "BF16", "shape", 0, 7,
                                                                 "data_offsets", (json_int_t)data_len, (json_int_t)data_len));
        json_object_set_new(hdr, "__metadata__", json_pack("{s:s,s:s}", "format", "pt", "note", "extra"));
        dir = new_dir();
        write_st(dir, "model.safetensors", hdr);
        link_fixture(dir, "config.json");
        run_case("an extra empty tensor and metadata", dir, 1, NULL);
        json_decref(hdr);
    }
    free(whole);
    free(hdr_text);
}

// ---------------------------------------------------------- sharding --

// A tensor whose dtype shard_case sets to I32 in whichever shard holds it
// (NULL: none); the error must name that shard and the tensor.
static const char *shard_bad;
static int shard_bad_in[2]; // cases whose bad tensor is in the first / second shard

// Splits the fixture into two shards (tensors before / after `split`) and
// writes an index from `weight_map` (NULL: the true one).
static void shard_case(const char *what, const char *index_text, int want_ok, const char *needles, int dup_tensor) {
    json_t *h1 = json_object(), *h2 = json_object(), *wm = json_object();
    const char *k;
    json_t *v;
    size_t i = 0, half = json_object_size(base_hdr) / 2, o1 = 0, o2 = 0;
    unsigned char *d1 = malloc(data_len), *d2 = malloc(data_len);
    json_object_foreach(base_hdr, k, v) {
        if (!strcmp(k, "__metadata__")) continue;
        json_int_t b = json_integer_value(offs(v, 0)), e = json_integer_value(offs(v, 1));
        int second = i++ >= half;
        size_t *o = second ? &o2 : &o1;
        unsigned char *d = second ? d2 : d1;
        json_t *c = json_deep_copy(v);
        json_object_set_new(c, "data_offsets", json_pack("[I,I]", (json_int_t)*o, (json_int_t)(*o + (e - b))));
        memcpy(d + *o, data + b, (size_t)(e - b));
        *o += (size_t)(e - b);
        json_object_set_new(second ? h2 : h1, k, c);
        json_object_set_new(wm, k, json_string(second ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors"));
        if (dup_tensor && !second && i == 1) { // the first tensor in both shards
            json_t *c2 = json_deep_copy(c);
            json_object_set_new(c2, "data_offsets", json_pack("[I,I]", (json_int_t)o2, (json_int_t)(o2 + (e - b))));
            memcpy(d2 + o2, data + b, (size_t)(e - b));
            o2 += (size_t)(e - b);
            json_object_set_new(h2, k, c2);
        }
    }
    char bad_needles[512];
    if (shard_bad) {
        int second = !json_object_get(h1, shard_bad);
        json_t *e = json_object_get(second ? h2 : h1, shard_bad);
        CHECKF(e != NULL, "no tensor %s in the fixture", shard_bad);
        if (e) json_object_set_new(e, "dtype", json_string("I32")), shard_bad_in[second]++;
        snprintf(bad_needles, sizeof bad_needles, "model-0000%d-of-00002.safetensors|%s", second + 1, shard_bad);
        needles = bad_needles;
    }
    char *dir = new_dir();
    char *t1 = json_dumps(h1, JSON_COMPACT), *t2 = json_dumps(h2, JSON_COMPACT);
    write_st_raw(dir, "model-00001-of-00002.safetensors", t1, ~(uint64_t)0, d1, o1);
    write_st_raw(dir, "model-00002-of-00002.safetensors", t2, ~(uint64_t)0, d2, o2);
    if (index_text && strcmp(index_text, "-")) {
        write_file(dir, "model.safetensors.index.json", index_text, strlen(index_text));
    } else if (!index_text) {
        json_t *idx = json_pack("{s:{s:I},s:O}", "metadata", "total_size", (json_int_t)data_len, "weight_map", wm);
        char *t = json_dumps(idx, JSON_INDENT(1));
        write_file(dir, "model.safetensors.index.json", t, strlen(t));
        free(t);
        json_decref(idx);
    }
    link_fixture(dir, "config.json");
    run_case(what, dir, want_ok, needles);
    free(t1), free(t2), free(d1), free(d2);
    json_decref(h1), json_decref(h2), json_decref(wm);
}

static void shard_cases(void) {
    // a bad tensor in either shard: the message names its shard
    static const char *const bad[] = {"backbone.embeddings.weight", "lm_head.weight",
                                      "backbone.layers.1.mixer.k_proj.weight", "backbone.layers.3.mixer.A_log"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char what[160];
        snprintf(what, sizeof what, "two shards, %s is I32", bad[i]);
        shard_bad = bad[i];
        shard_case(what, NULL, 0, NULL, 0);
    }
    shard_bad = NULL;
    CHECKF(shard_bad_in[0] && shard_bad_in[1], "bad tensors in shard 1: %d, shard 2: %d", shard_bad_in[0], shard_bad_in[1]);
    shard_case("two shards with a true index", NULL, 1, NULL, 0);
    shard_case("two shards, no index", "-", 1, NULL, 0);
    shard_case("two shards, a tensor in both", NULL, 0, "twice|backbone.embeddings.weight", 1);
    shard_case("an index listing a tensor no shard has",
               "{\"weight_map\": {\"backbone.embeddings.weight\": \"model-00001-of-00002.safetensors\", "
               "\"lm_head.weight\": \"model-00002-of-00002.safetensors\", \"ghost.weight\": \"model-00001-of-00002.safetensors\"}}",
               0, "index.json|ghost.weight", 0);
    shard_case("an index naming a shard that is missing",
               "{\"weight_map\": {\"backbone.embeddings.weight\": \"model-00001-of-00002.safetensors\", "
               "\"lm_head.weight\": \"model-00003-of-00002.safetensors\"}}",
               0, "model-00003-of-00002.safetensors", 0);
    shard_case("an index putting a tensor in the wrong shard",
               "{\"weight_map\": {\"backbone.embeddings.weight\": \"model-00002-of-00002.safetensors\", "
               "\"lm_head.weight\": \"model-00001-of-00002.safetensors\"}}",
               0, "index.json|backbone.embeddings.weight", 0);
    shard_case("an index naming only one shard", "{\"weight_map\": {\"lm_head.weight\": \"model-00002-of-00002.safetensors\"}}",
               0, "backbone.embeddings.weight", 0);
    shard_case("an index with a path", "{\"weight_map\": {\"lm_head.weight\": \"../model-00002-of-00002.safetensors\"}}", 0,
               "index.json|weight_map", 0);
    shard_case("an index with a non-string file", "{\"weight_map\": {\"lm_head.weight\": 2}}", 0, "index.json|weight_map", 0);
    shard_case("an index whose weight_map is a list", "{\"weight_map\": [\"model-00001-of-00002.safetensors\"]}", 0,
               "index.json|weight_map", 0);
    shard_case("an index with an empty weight_map", "{\"weight_map\": {}}", 0, "index.json", 0);
    shard_case("an index that is not JSON", "{\"weight_map\": ", 0, "index.json", 0);
    shard_case("an empty index", "", 0, "index.json", 0);
}

// ----------------------------------------------------- special files --

static void special_cases(void) {
    static const struct {
        const char *name, *kind, *needle;
    } cases[] = {
        {"model.safetensors", "fifo", "model.safetensors"},  {"config.json", "fifo", "config.json"},
        {"model.safetensors", "dev", "model.safetensors"},   {"config.json", "dev", "config.json"},
        {"model.safetensors", "dir", "model.safetensors"},   {"config.json", "dir", "config.json"},
        {"model.safetensors.index.json", "fifo", "index.json"},
        {"model.safetensors.index.json", "dir", "index.json"},
        {"config.json", "missing", "config.json"},           {"model.safetensors", "missing", "safetensors"},
        {"model.safetensors", "dangling", "model.safetensors"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = new_dir();
        const char *other = !strcmp(cases[i].name, "config.json") ? "model.safetensors" : "config.json";
        link_fixture(dir, other);
        if (strstr(cases[i].name, "index")) link_fixture(dir, "model.safetensors");
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/%s", dir, cases[i].name);
        if (!strcmp(cases[i].kind, "fifo")) mkfifo(path, 0644);
        else if (!strcmp(cases[i].kind, "dev")) { if (symlink("/dev/zero", path)) perror(path); }
        else if (!strcmp(cases[i].kind, "dir")) mkdir(path, 0755);
        else if (!strcmp(cases[i].kind, "dangling")) { if (symlink("/nonexistent/model.safetensors", path)) perror(path); }
        char what[128];
        snprintf(what, sizeof what, "%s is %s", cases[i].name, cases[i].kind);
        run_case(what, dir, 0, cases[i].needle);
    }
}

// ------------------------------------------------------- allocations --

// Sizes that pass every range check but whose product is more memory than
// the process may have (ALLOC_AS_MB of address space): a clean error naming
// what was being allocated, never an abort. The bound makes a failing
// allocation fail at once instead of swapping.
#define ALLOC_AS_MB 1536L

// fx's config.json with key = value (JSON text), the fixture's weights: refused
// with every needle named, under prlimit --as as_mb MiB (0: no limit).
static void fx_case(const char *fx, const char *key, const char *value, const char *needles, long as_mb) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/config.json", fx);
    json_t *cfg = json_load_file(path, 0, NULL), *v = json_loads(value, JSON_DECODE_ANY, NULL);
    CHECKF(cfg && v, "%s: cannot read it", path);
    if (!cfg || !v) return;
    json_object_set_new(cfg, key, v);
    char *t = json_dumps(cfg, JSON_COMPACT), *dir = new_dir(), src[PATH_MAX + 64], dst[PATH_MAX + 64];
    write_file(dir, "config.json", t, strlen(t));
    snprintf(src, sizeof src, "%s/model.safetensors", fx);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    if (symlink(src, dst)) perror(dst);
    char what[256];
    int k = snprintf(what, sizeof what, "%s config %s = %s", fx, key, value);
    if (as_mb > 0 && k > 0 && (size_t)k < sizeof what)
        snprintf(what + k, sizeof what - k, " under prlimit --as %ld MiB", as_mb);
    run_case_as(what, dir, 0, needles, as_mb);
    free(t);
    json_decref(cfg);
}

// ASan's shadow needs terabytes of address space: under prlimit --as an
// ASan-built vllm cannot start, so these cases run in the plain build only.
#if defined(__SANITIZE_ADDRESS__)
#define VLLM_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define VLLM_TEST_ASAN 1
#endif
#endif

static void alloc_cases(void) {
#ifdef VLLM_TEST_ASAN
    return;
#endif
    // A 2^24-token model length: the attention scratch for one such sequence (NemotronH, NoPE).
    fx_case(fixture, "max_position_embeddings", "16777216", "cannot allocate|attention", ALLOC_AS_MB);
    // RoPE's [max_seq_len, head_dim] table is made on the host at load (Qwen3).
    if (rope_fixture)
        fx_case(rope_fixture, "max_position_embeddings", "16777216", "cannot allocate the RoPE table|max_seq_len",
                ALLOC_AS_MB);
}

// A decoder family's (Qwen3's) layer_types: one entry per layer, as
// transformers requires; a list of another length described another model
// (a fuzzed 4,096-layer config loaded for seconds behind a 4-entry list).
static void family_cases(void) {
    if (!rope_fixture) return;
    fx_case(rope_fixture, "layer_types", "[\"full_attention\", \"full_attention\", \"full_attention\"]",
            "layer_types|num_hidden_layers 4", 0);
    fx_case(rope_fixture, "layer_types", "\"full_attention\"", "layer_types|one type per layer", 0);
}

// ---------------------------------------------------------------- main --

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *f) {
    (void)st, (void)flag, (void)f;
    return remove(p);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s VLLM_BINARY FIXTURE_DIR [ROPE_FIXTURE_DIR]\n", argv[0]);
        return 2;
    }
    static char fx[PATH_MAX];
    vllm_bin = argv[1];
    fixture = realpath(argv[2], fx) ? fx : argv[2]; // the cases link to it
    static char rfx[PATH_MAX];
    if (argc > 3) rope_fixture = realpath(argv[3], rfx) ? rfx : argv[3];
    // OpenBLAS's threads spin retrying mmap when the address space runs out
    // (under prlimit --as); the cases run with --threads 1 anyway.
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/config.json", fixture);
    base_cfg = json_load_file(path, 0, NULL);
    size_t n;
    snprintf(path, sizeof path, "%s/model.safetensors", fixture);
    unsigned char *st = (unsigned char *)slurp(path, &n);
    CHECK(base_cfg && st && n > 8);
    if (!base_cfg || !st) return test_summary("hostile_dirs");
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)st[i] << (8 * i);
    base_hdr = json_loadb((const char *)st + 8, hl, 0, NULL);
    data = st + 8 + hl;
    data_len = n - 8 - hl;
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(root, sizeof root, "%s/vllm_hostile_XXXXXX", tmp);
    CHECK(mkdtemp(root) != NULL);

    char *argv0[] = {(char *)vllm_bin, "generate", "--model", (char *)fixture, "--prompt-ids", "1,2,3", "--max-tokens",
                     "2", "--threads", "1", "--kv-cache-gb", "0.01", NULL};
    struct tu_proc p;
    CHECK(tu_run(argv0, RUN_TIMEOUT_S, &p) == 0 && p.exit_code == 0);
    want_out = p.out; // the fixture's own tokens
    config_cases();
    tensor_cases();
    header_cases();
    shard_cases();
    special_cases();
    alloc_cases();
    family_cases();
    double t0 = now_s();
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, runner, NULL);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < n_cases; i++) check_case(&cases[i]);
    free(cases);
    printf("hostile_dirs: %d cases in %.1f s: %d as expected, %d ended by a signal, %d timed out\n", n_cases,
           now_s() - t0, n_ok, n_signal, n_timeout);
    CHECKF(n_cases >= 200, "only %d cases", n_cases);
    CHECKF(n_signal == 0 && n_timeout == 0, "%d signals, %d timeouts", n_signal, n_timeout);
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(want_out);
    free(st);
    json_decref(base_cfg);
    json_decref(base_hdr);
    return test_summary("hostile_dirs");
}
