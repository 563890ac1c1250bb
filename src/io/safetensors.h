// safetensors.h - memory-mapped safetensors checkpoints (single file or
// sharded with model.safetensors.index.json), validated on open.
#ifndef VLLM_IO_SAFETENSORS_H
#define VLLM_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

enum st_dtype { ST_F32, ST_BF16, ST_F16, ST_I64, ST_I32, ST_U8, ST_BOOL, ST_F8_E4M3 };

struct st_tensor {
    char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[8];
    int64_t numel;
    const void *data; // inside the file's mapping
    size_t nbytes;
    uint64_t offset;  // of data in the file's data region
    int file;         // index into st_set.files
    const char *path; // that file's path (for messages)
};

struct st_set;

// Opens every tensor of a model directory: model.safetensors.index.json if
// present, else every *.safetensors file. VLLM_ERR_IO when none exists or
// one is not a regular file; VLLM_ERR_FORMAT, naming the file and tensor, for
// any header violation (dtype size * shape != byte span, overlaps, a tensor
// twice) and for an index that lists a tensor its file does not hold.
int st_open_dir(const char *dir, struct st_set **out);
// Opens one file (for tests and tools).
int st_open_file(const char *path, struct st_set **out);
// Parses a file image in memory, which must outlive the set (for fuzzing);
// `name` stands for the path in messages.
int st_open_buffer(const void *data, size_t len, const char *name, struct st_set **out);
void st_close(struct st_set *s);

const struct st_tensor *st_find(const struct st_set *s, const char *name);
int st_count(const struct st_set *s);
const struct st_tensor *st_at(const struct st_set *s, int i);
const char *st_file_path(const struct st_set *s, int file);
size_t st_dtype_size(enum st_dtype d);
const char *st_dtype_name(enum st_dtype d);

// Converts a float tensor (F32 / BF16 / F16) to fp32: dst holds t->numel.
int st_read_f32(const struct st_tensor *t, float *dst);

#endif
