// safetensors.c - parse and validate safetensors headers, mmap the data.
//
// File layout: u64 little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the data region; offsets are relative to its start.
#include <dirent.h>
#include <errno.h>
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
    int mapped; // 0: the caller's buffer (st_open_buffer)
};

struct st_set {
    struct st_file *files;
    int num_files;
    struct st_tensor *tensors;
    int num_tensors, cap_tensors;
    int *hash; // open addressing over tensor indices, -1 empty; at most half full
    int hash_cap;
};

// The safetensors format's own bound on the header (its Rust reader's).
#define ST_MAX_HEADER 100000000u

static const struct {
    const char *name;
    enum st_dtype dt;
    size_t size;
} dtypes[] = {
    {"F32", ST_F32, 4}, {"BF16", ST_BF16, 2}, {"F16", ST_F16, 2}, {"I64", ST_I64, 8},
    {"I32", ST_I32, 4}, {"U8", ST_U8, 1},     {"BOOL", ST_BOOL, 1}, {"F8_E4M3", ST_F8_E4M3, 1},
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

// Inserts tensor i into the hash, doubling it when half full (amortized
// O(1): parsing a header of n tensors is O(n)). Returns the index of a tensor
// of the same name already present, else -1.
static int hash_insert(struct st_set *s, int i) {
    if (2 * (i + 1) > s->hash_cap) {
        int cap = s->hash_cap ? s->hash_cap * 2 : 64;
        free(s->hash);
        s->hash = xmalloc(sizeof(int) * cap);
        s->hash_cap = cap;
        for (int k = 0; k < cap; k++) s->hash[k] = -1;
        for (int k = 0; k < i; k++) {
            uint32_t h = hash_str(s->tensors[k].name) & (cap - 1);
            while (s->hash[h] >= 0) h = (h + 1) & (cap - 1);
            s->hash[h] = k;
        }
    }
    uint32_t h = hash_str(s->tensors[i].name) & (s->hash_cap - 1);
    for (; s->hash[h] >= 0; h = (h + 1) & (s->hash_cap - 1))
        if (!strcmp(s->tensors[s->hash[h]].name, s->tensors[i].name)) return s->hash[h];
    s->hash[h] = i;
    return -1;
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

// A JSON integer in [0, max].
static int get_u64(const json_t *v, uint64_t max, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

// Parses one tensor entry of the header and appends it to s. Its dtype size
// times its shape must be exactly its byte span, inside the data region, so
// that nothing read later can go past the file.
static int parse_entry(struct st_set *s, int file, const char *name, json_t *v, uint64_t data_len) {
    const char *path = s->files[file].path;
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
        json_array_size(jo) != 2)
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: entry needs dtype, shape and data_offsets [begin, end]",
                        path, name);
    struct st_tensor t = {0};
    int found = 0;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(json_string_value(jd), dtypes[i].name)) t.dtype = dtypes[i].dt, found = 1;
    if (!found)
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: unsupported dtype %.32s", path, name, json_string_value(jd));
    if (json_array_size(js) > 8) return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: more than 8 dims", path, name);
    t.ndim = (int)json_array_size(js);
    t.numel = 1;
    for (int d = 0; d < t.ndim; d++) {
        uint64_t dim;
        if (get_u64(json_array_get(js, d), (uint64_t)1 << 40, &dim))
            return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: shape[%d] is not an integer in [0, 2^40]", path, name, d);
        t.shape[d] = (int64_t)dim;
        if (t.shape[d] && t.numel > ((int64_t)1 << 50) / t.shape[d])
            return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: more than 2^50 elements", path, name);
        t.numel *= t.shape[d];
    }
    uint64_t begin, end;
    if (get_u64(json_array_get(jo, 0), UINT64_MAX >> 1, &begin) || get_u64(json_array_get(jo, 1), UINT64_MAX >> 1, &end) ||
        end < begin)
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: data_offsets must be integers 0 <= begin <= end", path, name);
    if (end > data_len)
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: data_offsets [%llu, %llu] past the end of the data (%llu bytes)",
                        path, name, (unsigned long long)begin, (unsigned long long)end, (unsigned long long)data_len);
    uint64_t need = (uint64_t)t.numel * st_dtype_size(t.dtype);
    if (need != end - begin)
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: %lld elements of %s need %llu bytes, data_offsets give %llu",
                        path, name, (long long)t.numel, st_dtype_name(t.dtype), (unsigned long long)need,
                        (unsigned long long)(end - begin));
    t.name = xstrdup(name);
    t.nbytes = end - begin;
    t.file = file;
    t.path = path;
    t.offset = begin; // data is set once the data region's start is known
    xgrow((void **)&s->tensors, &s->cap_tensors, s->num_tensors + 1, sizeof *s->tensors);
    s->tensors[s->num_tensors] = t;
    int dup = hash_insert(s, s->num_tensors);
    if (dup >= 0) {
        free(t.name);
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s appears twice (also in %s)", path, name,
                        s->files[s->tensors[dup].file].path);
    }
    s->num_tensors++;
    return VLLM_OK;
}

// No two tensors of one file share a byte. Sorted by offset, each non-empty
// span must start at or after the furthest end so far (an empty tensor
// occupies nothing, so it can neither overlap nor hide an overlap).
static int check_overlaps(struct st_set *s, int first, const char *path) {
    int n = s->num_tensors - first, m = 0, rc = VLLM_OK;
    struct span *sp = xmalloc(sizeof *sp * (n ? n : 1));
    for (int i = 0; i < n; i++) {
        const struct st_tensor *t = &s->tensors[first + i];
        if (t->nbytes) sp[m++] = (struct span){t->offset, t->offset + t->nbytes, t->name};
    }
    qsort(sp, m, sizeof *sp, cmp_span);
    for (int i = 1, far = 0; i < m; i++) {
        if (sp[i].begin < sp[far].end) {
            rc = vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s [%llu, %llu) overlaps tensor %s [%llu, %llu)", path,
                          sp[i].name, (unsigned long long)sp[i].begin, (unsigned long long)sp[i].end, sp[far].name,
                          (unsigned long long)sp[far].begin, (unsigned long long)sp[far].end);
            break;
        }
        if (sp[i].end > sp[far].end) far = i;
    }
    free(sp);
    return rc;
}

// Parses the file image s->files[file] and appends its tensors.
static int parse_image(struct st_set *s, int file) {
    const struct st_file *f = &s->files[file];
    const uint8_t *map = f->map;
    if (f->size < 8) return vllm_err(VLLM_ERR_FORMAT, "%s: too short to be a safetensors file", f->path);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)map[i] << (8 * i);
    if (hlen > f->size - 8)
        return vllm_err(VLLM_ERR_FORMAT, "%s: header length %llu exceeds the file size %zu", f->path,
                        (unsigned long long)hlen, f->size);
    if (hlen > ST_MAX_HEADER || hlen < 2)
        return vllm_err(VLLM_ERR_FORMAT, "%s: header length %llu is not in [2, %u]", f->path, (unsigned long long)hlen,
                        ST_MAX_HEADER);
    json_t *hdr;
    TRY(json_parse_python_flags((const char *)map + 8, hlen, JSON_REJECT_DUPLICATES, f->path, &hdr));
    if (!json_is_object(hdr)) {
        json_decref(hdr);
        return vllm_err(VLLM_ERR_FORMAT, "%s: header is not a JSON object", f->path);
    }
    uint64_t data_len = f->size - 8 - hlen;
    int first = s->num_tensors, rc = VLLM_OK;
    const char *name;
    json_t *v;
    json_object_foreach(hdr, name, v) {
        if (!strcmp(name, "__metadata__")) continue;
        if ((rc = parse_entry(s, file, name, v, data_len))) break;
    }
    json_decref(hdr);
    if (rc) return rc;
    for (int i = first; i < s->num_tensors; i++) s->tensors[i].data = map + 8 + hlen + s->tensors[i].offset;
    return check_overlaps(s, first, f->path);
}

static int add_image(struct st_set *s, const char *path, uint8_t *map, size_t size, int mapped) {
    s->files = xrealloc(s->files, sizeof *s->files * (s->num_files + 1));
    s->files[s->num_files] = (struct st_file){xstrdup(path), map, size, mapped};
    return parse_image(s, s->num_files++);
}

// Maps one file and appends its tensors. Only a regular file is opened
// (O_NONBLOCK: a FIFO named *.safetensors must not block the open).
static int add_file(struct st_set *s, const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return vllm_err(VLLM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return vllm_err(VLLM_ERR_IO, "%s is not a regular file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return vllm_err(VLLM_ERR_FORMAT, "%s: too short to be a safetensors file (%lld bytes)", path,
                        (long long)st.st_size);
    }
    uint8_t *map = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return vllm_err(VLLM_ERR_IO, "cannot mmap %s: %s", path, strerror(errno));
    return add_image(s, path, map, (size_t)st.st_size, 1);
}

static struct st_set *st_new(void) { return xcalloc(1, sizeof(struct st_set)); }

int st_open_file(const char *path, struct st_set **out) {
    struct st_set *s = st_new();
    int rc = add_file(s, path);
    if (rc) {
        st_close(s);
        return rc;
    }
    *out = s;
    return VLLM_OK;
}

int st_open_buffer(const void *data, size_t len, const char *name, struct st_set **out) {
    struct st_set *s = st_new();
    int rc = add_image(s, name, (uint8_t *)data, len, 0);
    if (rc) {
        st_close(s);
        return rc;
    }
    *out = s;
    return VLLM_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// The distinct shard files the index's weight_map names (sorted).
static int index_shards(const char *idx, const json_t *wm, char ***files, int *n) {
    size_t cap = json_object_size(wm), k = 0;
    char **all = xmalloc(sizeof(char *) * (cap ? cap : 1));
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)wm, name, v) {
        const char *f = json_string_value(v);
        if (!f || !*f || strchr(f, '/') || !strcmp(f, ".") || !strcmp(f, "..")) {
            free(all);
            return vllm_err(VLLM_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a file name", idx, name);
        }
        all[k++] = (char *)f;
    }
    qsort(all, k, sizeof(char *), cmp_str);
    *files = xmalloc(sizeof(char *) * (k ? k : 1));
    *n = 0;
    for (size_t i = 0; i < k; i++)
        if (!i || strcmp(all[i], all[i - 1])) (*files)[(*n)++] = xstrdup(all[i]);
    free(all);
    return VLLM_OK;
}

// The shard files of a directory: from the index's weight_map (kept in *wm to
// check against the files), else every *.safetensors (sorted, so loading is
// deterministic).
static int list_shards(const char *dir, char ***files, int *n, json_t **wm_out) {
    char *idx = path_join(dir, "model.safetensors.index.json");
    struct stat st;
    *files = NULL;
    *n = 0;
    *wm_out = NULL;
    int rc = VLLM_OK;
    if (stat(idx, &st) == 0) { // present: read_file refuses it unless a regular file
        json_t *j;
        rc = json_load_path(idx, &j);
        if (!rc) {
            json_t *wm = json_object_get(j, "weight_map");
            if (!json_is_object(wm)) rc = vllm_err(VLLM_ERR_FORMAT, "%s: no weight_map object", idx);
            else if (!(rc = index_shards(idx, wm, files, n))) *wm_out = json_incref(wm);
            json_decref(j);
        }
    } else {
        DIR *d = opendir(dir);
        if (!d) rc = vllm_err(VLLM_ERR_IO, "cannot open model directory %s", dir);
        struct dirent *e;
        int cap = 0;
        while (d && (e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors") && e->d_name[0] != '.') {
                xgrow((void **)files, &cap, *n + 1, sizeof(char *));
                (*files)[(*n)++] = xstrdup(e->d_name);
            }
        }
        if (d) closedir(d);
        if (*n) qsort(*files, *n, sizeof(char *), cmp_str);
    }
    if (!rc && *n == 0) rc = vllm_err(VLLM_ERR_IO, "%s: no *.safetensors files", *wm_out ? idx : dir);
    free(idx);
    return rc;
}

// Every tensor the index lists is in the file it names.
static int check_index(const struct st_set *s, const char *dir, const json_t *wm) {
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)wm, name, v) {
        const struct st_tensor *t = st_find(s, name);
        const char *want = json_string_value(v), *got = t ? strrchr(s->files[t->file].path, '/') : NULL;
        got = got ? got + 1 : t ? s->files[t->file].path : NULL;
        if (!t)
            return vllm_err(VLLM_ERR_FORMAT, "%s/model.safetensors.index.json: tensor %s is listed in %s, which has "
                            "no such tensor", dir, name, want);
        if (strcmp(got, want))
            return vllm_err(VLLM_ERR_FORMAT, "%s/model.safetensors.index.json: tensor %s is listed in %s but is in %s",
                            dir, name, want, got);
    }
    return VLLM_OK;
}

int st_open_dir(const char *dir, struct st_set **out) {
    char **files;
    int n;
    json_t *wm;
    int rc = list_shards(dir, &files, &n, &wm);
    struct st_set *s = st_new();
    for (int i = 0; i < n && !rc; i++) {
        char *p = path_join(dir, files[i]);
        rc = add_file(s, p);
        free(p);
    }
    if (!rc && wm) rc = check_index(s, dir, wm);
    json_decref(wm);
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
    if (rc) {
        st_close(s);
        return rc;
    }
    *out = s;
    return VLLM_OK;
}

void st_close(struct st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->num_files; i++) {
        if (s->files[i].mapped) munmap(s->files[i].map, s->files[i].size);
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
    // data_offsets need not be even: elements are read with memcpy, never
    // through a misaligned uint16_t pointer
    case ST_BF16: {
        const uint8_t *src = t->data;
        for (int64_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = bf16_to_f32(h);
        }
        return VLLM_OK;
    }
    case ST_F16: {
        const uint8_t *src = t->data;
        for (int64_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = f16_to_f32(h);
        }
        return VLLM_OK;
    }
    case ST_F8_E4M3: { // scales of quantized checkpoints
        const uint8_t *src = t->data;
        for (int64_t i = 0; i < t->numel; i++) dst[i] = fp8e4m3_to_f32(src[i]);
        return VLLM_OK;
    }
    default:
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s: dtype %s is not a float type", t->path ? t->path : "?", t->name,
                        st_dtype_name(t->dtype));
    }
}
