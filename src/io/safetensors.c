// safetensors.c - parse and validate safetensors headers, mmap the data.
//
// File layout: u64 little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the data region; offsets are relative to its start.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "core/json.h"
#include "io/dtype.h"
#include "io/safetensors.h"

struct st_file {
    char *path;
    uint8_t *map;
    size_t size;
};

struct st_set {
    struct st_file *files;
    int num_files;
    struct st_tensor *tensors;
    int num_tensors, cap_tensors;
    int *hash; // open addressing over tensor indices, -1 empty
    int hash_cap;
};

static const struct {
    const char *name;
    enum st_dtype dt;
    size_t size;
} dtypes[] = {
    {"F32", ST_F32, 4}, {"BF16", ST_BF16, 2}, {"F16", ST_F16, 2}, {"I64", ST_I64, 8},
    {"I32", ST_I32, 4}, {"U8", ST_U8, 1},     {"BOOL", ST_BOOL, 1},
};

size_t st_dtype_size(enum st_dtype d) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dt == d) return dtypes[i].size;
    return 0;
}

const char *st_dtype_name(enum st_dtype d) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dt == d) return dtypes[i].name;
    return "?";
}

static uint32_t hash_str(const char *s) {
    uint32_t h = 2166136261u; // FNV-1a
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static void index_tensors(struct st_set *s) {
    free(s->hash);
    s->hash_cap = 16;
    while (s->hash_cap < 2 * s->num_tensors) s->hash_cap *= 2;
    s->hash = xmalloc(sizeof(int) * s->hash_cap);
    for (int i = 0; i < s->hash_cap; i++) s->hash[i] = -1;
    for (int i = 0; i < s->num_tensors; i++) {
        uint32_t h = hash_str(s->tensors[i].name) & (s->hash_cap - 1);
        while (s->hash[h] >= 0) h = (h + 1) & (s->hash_cap - 1);
        s->hash[h] = i;
    }
}

const struct st_tensor *st_find(const struct st_set *s, const char *name) {
    if (!s->hash) return NULL;
    uint32_t h = hash_str(name) & (s->hash_cap - 1);
    for (; s->hash[h] >= 0; h = (h + 1) & (s->hash_cap - 1))
        if (!strcmp(s->tensors[s->hash[h]].name, name)) return &s->tensors[s->hash[h]];
    return NULL;
}

int st_count(const struct st_set *s) { return s->num_tensors; }
const struct st_tensor *st_at(const struct st_set *s, int i) { return &s->tensors[i]; }
const char *st_file_path(const struct st_set *s, int file) { return s->files[file].path; }

struct span {
    uint64_t begin, end;
    const char *name;
};

static int cmp_span(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end < y->end ? -1 : x->end > y->end);
}

// Parses one tensor entry of the header and appends it to s.
static int parse_entry(struct st_set *s, int file, const char *name, json_t *v, uint64_t data_len) {
    const char *path = s->files[file].path;
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
        json_array_size(jo) != 2)
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: entry needs dtype, shape and data_offsets", path, name);
    struct st_tensor t = {0};
    int found = 0;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(json_string_value(jd), dtypes[i].name)) t.dtype = dtypes[i].dt, found = 1;
    if (!found)
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: unsupported dtype %s", path, name, json_string_value(jd));
    if (json_array_size(js) > 8) return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: more than 8 dims", path, name);
    t.ndim = (int)json_array_size(js);
    t.numel = 1;
    for (int d = 0; d < t.ndim; d++) {
        json_t *e = json_array_get(js, d);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > ((int64_t)1 << 40))
            return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: bad shape", path, name);
        t.shape[d] = json_integer_value(e);
        if (t.shape[d] && t.numel > ((int64_t)1 << 50) / t.shape[d])
            return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: shape too large", path, name);
        t.numel *= t.shape[d];
    }
    json_t *b = json_array_get(jo, 0), *e = json_array_get(jo, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b))
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: bad data_offsets", path, name);
    uint64_t begin = json_integer_value(b), end = json_integer_value(e);
    if (end > data_len)
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: data_offsets [%llu, %llu] past the end of the data (%llu bytes)",
                        path, name, (unsigned long long)begin, (unsigned long long)end, (unsigned long long)data_len);
    if ((uint64_t)t.numel * st_dtype_size(t.dtype) != end - begin)
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: %lld elements of %s need %llu bytes, data_offsets give %llu",
                        path, name, (long long)t.numel, st_dtype_name(t.dtype),
                        (unsigned long long)(t.numel * st_dtype_size(t.dtype)), (unsigned long long)(end - begin));
    if (st_find(s, name)) return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s appears twice", path, name);
    t.name = xstrdup(name);
    t.nbytes = end - begin;
    t.file = file;
    t.offset = begin; // data is set once the data region's start is known
    xgrow((void **)&s->tensors, &s->cap_tensors, s->num_tensors + 1, sizeof *s->tensors);
    s->tensors[s->num_tensors++] = t;
    return VLLM_OK;
}

// Maps one file and appends its tensors. `only` (may be NULL): a set of
// names the index assigns to this file; others are an error.
static int add_file(struct st_set *s, const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return vllm_err(VLLM_ERR_IO, "cannot open %s", path);
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 8) {
        close(fd);
        return vllm_err(VLLM_ERR_FORMAT, "%s: too short to be a safetensors file", path);
    }
    uint8_t *map = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return vllm_err(VLLM_ERR_IO, "cannot mmap %s", path);
    int file = s->num_files++;
    s->files = xrealloc(s->files, sizeof *s->files * s->num_files);
    s->files[file] = (struct st_file){xstrdup(path), map, (size_t)st.st_size};

    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)map[i] << (8 * i);
    if (hlen > (uint64_t)st.st_size - 8)
        return vllm_err(VLLM_ERR_FORMAT, "%s: header length %llu exceeds the file size %lld", path,
                        (unsigned long long)hlen, (long long)st.st_size);
    json_t *hdr;
    TRY(json_parse_python((const char *)map + 8, hlen, path, &hdr));
    if (!json_is_object(hdr)) {
        json_decref(hdr);
        return vllm_err(VLLM_ERR_FORMAT, "%s: header is not a JSON object", path);
    }
    uint64_t data_len = st.st_size - 8 - hlen;
    int first = s->num_tensors, rc = VLLM_OK;
    const char *name;
    json_t *v;
    json_object_foreach(hdr, name, v) {
        if (!strcmp(name, "__metadata__")) continue;
        if ((rc = parse_entry(s, file, name, v, data_len))) break;
        index_tensors(s); // keeps st_find exact for the duplicate check
    }
    json_decref(hdr);
    if (rc) return rc;

    int n = s->num_tensors - first;
    struct span *sp = xmalloc(sizeof *sp * (n ? n : 1));
    for (int i = 0; i < n; i++) {
        struct st_tensor *t = &s->tensors[first + i];
        uint64_t b = t->offset;
        sp[i] = (struct span){b, b + t->nbytes, t->name};
        t->data = map + 8 + hlen + b;
    }
    qsort(sp, n, sizeof *sp, cmp_span);
    for (int i = 1; i < n; i++)
        if (sp[i].begin < sp[i - 1].end && sp[i].end > sp[i].begin) {
            rc = vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s overlaps tensor %s", path, sp[i].name, sp[i - 1].name);
            break;
        }
    free(sp);
    return rc;
}

static struct st_set *st_new(void) { return xcalloc(1, sizeof(struct st_set)); }

int st_open_file(const char *path, struct st_set **out) {
    struct st_set *s = st_new();
    int rc = add_file(s, path);
    if (rc) {
        st_close(s);
        return rc;
    }
    index_tensors(s);
    *out = s;
    return VLLM_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// The shard files of a directory: from the index's weight_map, else every
// *.safetensors (sorted, so loading is deterministic).
static int list_shards(const char *dir, char ***files, int *n) {
    char *idx = path_join(dir, "model.safetensors.index.json");
    *files = NULL;
    *n = 0;
    int cap = 0;
    if (file_exists(idx)) {
        json_t *j;
        int rc = json_load_path(idx, &j);
        if (rc) return free(idx), rc;
        json_t *wm = json_object_get(j, "weight_map");
        if (!json_is_object(wm)) {
            json_decref(j);
            rc = vllm_err(VLLM_ERR_FORMAT, "%s: no weight_map object", idx);
            free(idx);
            return rc;
        }
        const char *k;
        json_t *v;
        json_object_foreach(wm, k, v) {
            const char *f = json_string_value(v);
            if (!f || strchr(f, '/')) {
                json_decref(j);
                rc = vllm_err(VLLM_ERR_FORMAT, "%s: weight_map[%s] is not a file name", idx, k);
                free(idx);
                return rc;
            }
            int seen = 0;
            for (int i = 0; i < *n && !seen; i++) seen = !strcmp((*files)[i], f);
            if (!seen) {
                xgrow((void **)files, &cap, *n + 1, sizeof(char *));
                (*files)[(*n)++] = xstrdup(f);
            }
        }
        json_decref(j);
    } else {
        DIR *d = opendir(dir);
        if (!d) return free(idx), vllm_err(VLLM_ERR_IO, "cannot open model directory %s", dir);
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors") && e->d_name[0] != '.') {
                xgrow((void **)files, &cap, *n + 1, sizeof(char *));
                (*files)[(*n)++] = xstrdup(e->d_name);
            }
        }
        closedir(d);
    }
    free(idx);
    if (*n == 0) return vllm_err(VLLM_ERR_IO, "%s: no *.safetensors files", dir);
    qsort(*files, *n, sizeof(char *), cmp_str);
    return VLLM_OK;
}

int st_open_dir(const char *dir, struct st_set **out) {
    char **files;
    int n;
    TRY(list_shards(dir, &files, &n));
    struct st_set *s = st_new();
    int rc = VLLM_OK;
    for (int i = 0; i < n && !rc; i++) {
        char *p = path_join(dir, files[i]);
        rc = add_file(s, p);
        free(p);
    }
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
    if (rc) {
        st_close(s);
        return rc;
    }
    index_tensors(s);
    *out = s;
    return VLLM_OK;
}

void st_close(struct st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->num_files; i++) {
        if (s->files[i].map) munmap(s->files[i].map, s->files[i].size);
        free(s->files[i].path);
    }
    for (int i = 0; i < s->num_tensors; i++) free(s->tensors[i].name);
    free(s->files);
    free(s->tensors);
    free(s->hash);
    free(s);
}

int st_read_f32(const struct st_tensor *t, float *dst) {
    switch (t->dtype) {
    case ST_F32: memcpy(dst, t->data, t->nbytes); return VLLM_OK;
    case ST_BF16: {
        const uint16_t *src = t->data;
        for (int64_t i = 0; i < t->numel; i++) dst[i] = bf16_to_f32(src[i]);
        return VLLM_OK;
    }
    case ST_F16: {
        const uint16_t *src = t->data;
        for (int64_t i = 0; i < t->numel; i++) dst[i] = f16_to_f32(src[i]);
        return VLLM_OK;
    }
    default:
        return vllm_err(VLLM_ERR_FORMAT, "tensor %s: dtype %s is not a float type", t->name, st_dtype_name(t->dtype));
    }
}
