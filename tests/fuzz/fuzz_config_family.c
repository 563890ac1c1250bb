// fuzz_config_family.c - libFuzzer harness: the input is a config.json of
// any registered family (its "architectures" picks the family: Qwen3,
// Qwen3-MoE, Llama, Qwen2, Mamba2, Kimi-Linear, NemotronH). It goes through
// the family's whole load with --load-format dummy into a model spec, on a
// backend that allocates nothing (so a config asking for 16 GiB matrices
// costs nothing here) but counts the weights' bytes against a device of
// FUZZ_DEVICE_BYTES, refusing past it as a real one would: the vectors a
// load fills on the host grow with layers x hidden, and a 4,096-layer
// model of hidden 2^20 (2.6T parameters) filled 34 GB of them, over the
// fuzzer's 10 s. The load is refused with an error, or the spec it
// gives is sane: positive sizes within models/config_reader.h's limits, EOS
// ids in the vocabulary, per-token cache sizes that fit the limits.
// Seeds: tests/fixtures/*/config.json and variants, tests/fuzz/corpus/config_family/.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/common.h"
#include "core/json.h"
#include "models/config_reader.h"
#include "models/model.h"

// A device that holds nothing: every buffer is one sentinel that is never
// read (a dummy load only allocates, fills on the device and frees).
static char sentinel[64];

static void *null_alloc(struct backend *be, size_t bytes) {
    (void)be, (void)bytes;
    return sentinel;
}
static void null_free(struct backend *be, void *p) { (void)be, (void)p; }
static void null_upload(struct backend *be, void *dst, const void *src, size_t bytes) {
    (void)be, (void)dst, (void)src, (void)bytes;
}
#define FUZZ_DEVICE_BYTES ((int64_t)16 << 30)
static int64_t weight_bytes; // of this input's load
static int null_weight_alloc(struct backend *be, struct weight *w, enum wfmt fmt, int64_t rows, int64_t cols) {
    (void)be;
    if (rows < 1 || cols < 1) abort(); // a model asked for an empty or negative weight
    weight_bytes += wfmt_weight_bytes(fmt, rows, cols);
    if (weight_bytes > FUZZ_DEVICE_BYTES)
        return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "fuzz: the weights pass the harness's %lld-byte device",
                        (long long)FUZZ_DEVICE_BYTES);
    memset(w, 0, sizeof *w);
    w->data = sentinel, w->fmt = fmt, w->rows = rows, w->cols = cols;
    return VLLM_OK;
}
static int null_weight_random(struct backend *be, struct weight *w, uint64_t seed, float std) {
    (void)be, (void)w, (void)seed, (void)std;
    return VLLM_OK;
}

static void check_spec(const struct model_spec *s) {
    if (!s->arch || s->vocab_size < 1 || s->vocab_size > CFG_MAX_VOCAB) abort();
    if (s->hidden_size < 1 || s->hidden_size > CFG_MAX_HIDDEN) abort();
    if (s->num_layers < 0 || s->num_layers > CFG_MAX_LAYERS || (s->num_layers && !s->layers)) abort();
    if (s->max_position_embeddings < 0 || s->max_position_embeddings > CFG_MAX_POSITION) abort();
    if (s->num_eos < 0 || s->num_eos > 8 || s->weight_bytes <= 0) abort();
    for (int i = 0; i < s->num_eos; i++)
        if (s->eos_ids[i] < 0 || s->eos_ids[i] >= s->vocab_size) abort();
    for (int i = 0; i < s->num_layers; i++) {
        const struct layer_cache_spec *l = &s->layers[i];
        if (l->k_per_token < 0 || l->k_per_token > CFG_MAX_WIDTH || l->v_per_token < 0 || l->v_per_token > CFG_MAX_WIDTH)
            abort();
        if (l->num_states < 0 || l->num_states > MAX_STATE_BUFS || l->state_align < 0) abort();
        for (int j = 0; j < l->num_states; j++)
            // 0 floats is valid: conv_kernel 1 keeps no conv history
            if (!l->states[j].name || l->states[j].floats < 0 || l->states[j].floats > CFG_MAX_STATE) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct backend *be;
    static struct backend_ops ops;
    if (!be) {
        if (backend_cpu_create(1, DT_F32, &be)) abort();
        ops = *be->ops;
        ops.alloc = null_alloc, ops.free = null_free, ops.upload = null_upload;
        ops.weight_alloc = null_weight_alloc, ops.weight_random = null_weight_random;
        be->ops = &ops;
    }
    weight_bytes = 0;
    json_t *j = NULL;
    if (json_parse_python((const char *)data, size, "fuzz/config.json", &j)) return 0;
    // Small step shapes, so that the host-side tables (RoPE: [max_seq_len, head_dim]) stay small.
    struct model_load_opts o = {.weight_fmt = WF_F32, .dummy = 1, .seed = 1, .max_tokens = 4, .max_logit_rows = 2,
                                .max_seq_len = 64};
    struct model *m = NULL;
    if (!model_load("fuzz", j, &o, be, &m)) {
        check_spec(&m->spec);
        model_free(m);
    } else if (!vllm_last_error()[0]) abort(); // a refusal always says why
    json_decref(j);
    return 0;
}
