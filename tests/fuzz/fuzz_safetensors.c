// fuzz_safetensors.c - libFuzzer harness: the input is a safetensors file.
// It is refused with an error, or every tensor it declares lies inside it
// and reads (float ones as fp32) without going past its bytes.
// Seeds in tests/fuzz/corpus/safetensors/.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct st_set *s = NULL;
    if (st_open_buffer(data, size, "fuzz.safetensors", &s)) return 0;
    for (int i = 0; i < st_count(s); i++) {
        const struct st_tensor *t = st_at(s, i);
        if (st_find(s, t->name) != t) abort(); // the index finds every tensor
        if ((const uint8_t *)t->data < data || (const uint8_t *)t->data + t->nbytes > data + size) abort();
        if (t->numel > (int64_t)size) abort(); // dtype size * shape == the byte span
        float *f = malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1));
        st_read_f32(t, f);
        free(f);
    }
    st_close(s);
    return 0;
}
