// test_tp_config.c - a model that does not split over the ranks asked for
// is refused with an error naming the config key, before anything loads:
// heads, KV heads, Mamba heads and groups, widths narrower than the ranks;
// and the engine's own range check, a backend without collectives, and a
// device that cannot host the group.
#include "backend/backend.h"
#include "core/common.h"
#include "models/model.h"
#include "models/nemotron_h.h"
#include "test.h"
#include "tp_model.h"
#include "util.h"
#include "vllm.h"

// Parses c's config and checks it for tp ranks: VLLM_OK, or the error
// status with `must` in its message.
static int check(const struct tpm_cfg *c, int tp, int status, const char *must) {
    json_t *j = tpm_config(c);
    struct nh_config nc;
    int rc = nh_config_parse(j, "config.json", &nc);
    if (!rc) {
        rc = nh_config_check_tp(&nc, tp, "config.json");
        nh_config_free(&nc);
    }
    json_decref(j);
    int ok = rc == status && (!must || strstr(vllm_last_error(), must));
    if (!ok) fprintf(stderr, "  %s at tp %d: rc %d '%s' (wanted %d, '%s')\n", c->pattern, tp, rc,
                     rc ? vllm_last_error() : "", status, must ? must : "");
    return ok;
}

static void test_config_checks(void) {
    const int U = VLLM_ERR_UNSUPPORTED;
    struct tpm_cfg c = tpm_default("M*-E"); // widths split over 2 and 4
    for (int tp = 1; tp <= 4; tp *= 2) CHECK(check(&c, tp, VLLM_OK, NULL));
    CHECK(check(&c, 3, U, "mamba_num_heads (8) is not divisible by tensor_parallel_size 3"));
    c.m_groups = 2;
    CHECK(check(&c, 4, U, "n_groups (2) is not divisible by tensor_parallel_size 4"));
    CHECK(check(&c, 2, VLLM_OK, NULL));

    c = tpm_default("*");
    CHECK(check(&c, 8, VLLM_OK, NULL)); // 2 KV heads, each replicated on 4 ranks
    c.heads = 6, c.kv_heads = 3;
    CHECK(check(&c, 3, VLLM_OK, NULL));
    CHECK(check(&c, 2, U, "num_key_value_heads (3) and tensor_parallel_size 2: one must divide the other"));
    CHECK(check(&c, 4, U, "num_attention_heads (6) is not divisible by tensor_parallel_size 4"));
    c.heads = 12;
    CHECK(check(&c, 4, U, "num_key_value_heads (3)"));
    CHECK(check(&c, 6, VLLM_OK, NULL)); // 3 KV heads on 6 ranks: each on 2

    c = tpm_default("-");
    c.mlp_inter = 3;
    CHECK(check(&c, 3, VLLM_OK, NULL));
    CHECK(check(&c, 4, U, "intermediate_size (3) is smaller than tensor_parallel_size 4"));
    c = tpm_default("E");
    c.moe_inter = 2;
    CHECK(check(&c, 4, U, "moe_intermediate_size (2)"));
    c.moe_inter = 12, c.shared_inter = 3;
    CHECK(check(&c, 4, U, "moe_shared_expert_intermediate_size (3)"));
    c = tpm_default("-");
    c.vocab = 3;
    CHECK(check(&c, 4, U, "vocab_size (3)"));
}

static int engine_fails(const char *dir, const char *device, int tp, int status, const char *must) {
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    ep.model = dir;
    ep.device = device;
    ep.num_threads = 1;
    ep.tensor_parallel_size = tp;
    struct vllm_engine *e = NULL;
    int rc = vllm_engine_load(&ep, &e);
    vllm_engine_free(e);
    int ok = rc == status && !e && strstr(vllm_last_error(), must);
    if (!ok) fprintf(stderr, "  engine %s tp %d: rc %d '%s' (wanted %d, '%s')\n", dir, tp, rc, vllm_last_error(), status, must);
    return ok;
}

static void test_engine(void) {
    char *dir = tu_fixture("nh_dense");
    CHECK(engine_fails(dir, "cpu", 4, VLLM_ERR_UNSUPPORTED, "n_groups (2) is not divisible by tensor_parallel_size 4"));
    CHECK(engine_fails(dir, "cpu", 3, VLLM_ERR_UNSUPPORTED, "mamba_num_heads (8)"));
    CHECK(engine_fails(dir, "cpu", 65, VLLM_ERR_INVALID_ARGUMENT, "tensor_parallel_size 65 is out of range"));
    CHECK(engine_fails(dir, "cpu", -1, VLLM_ERR_INVALID_ARGUMENT, "tensor_parallel_size -1 is out of range"));
    CHECK(engine_fails(dir, "cpu", -1, VLLM_ERR_INVALID_ARGUMENT, "out of range"));
    // no machine here shows 64 GPUs; a build without CUDA or NCCL says so
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    ep.model = dir, ep.device = "cuda", ep.tensor_parallel_size = 64;
    struct vllm_engine *e = NULL;
    int rc = vllm_engine_load(&ep, &e);
    const char *msg = vllm_last_error();
    CHECKF(rc && !e && (strstr(msg, "needs 64 GPUs") || strstr(msg, "no CUDA backend") || strstr(msg, "no NCCL")),
           "cuda at tp 64: rc %d '%s'", rc, msg);
    vllm_engine_free(e);

    // a rank on a backend without collectives
    struct backend *be;
    CHECK(backend_create("cpu", 1, DT_F32, &be) == 0);
    struct backend_ops ops = *be->ops;
    const struct backend_ops *saved = be->ops;
    ops.all_reduce = NULL;
    be->ops = &ops;
    be->tp_size = 2;
    struct model_load_opts o = {WF_F32, 0, 0, 8, 1, 0, 0};
    struct model *m = NULL;
    rc = model_load(dir, NULL, &o, be, &m);
    CHECKF(rc == VLLM_ERR_UNSUPPORTED && !m && strstr(vllm_last_error(), "has no collectives"), "rc %d '%s'", rc,
           vllm_last_error());
    model_free(m);
    be->ops = saved;
    backend_free(be);
    free(dir);
}

int main(void) {
    test_config_checks();
    test_engine();
    return test_summary("tp_config");
}
