// nh_cost.c - what a NemotronH config costs per token on the CPU:
// - the bytes one decode step of one sequence reads: the numerator of the
//   decode roofline (bytes per token / read bandwidth, bench/membw.c);
// - the GEMM FLOPs one prefill token takes (2 x the active projection and
//   expert parameters: the matmul kernels' work; lm_head runs once per prompt
//   and is left out), for prefill FLOP/s against the kernel's peak.
//
// Usage: nh_cost MODEL_DIR [bf16|fp32] [CONTEXT]
// Prints the breakdown, then two lines: decode bytes, prefill GEMM FLOPs.
// Counts what the fast path reads per token: every active matrix once
// (Mamba in/out projections, attention qkv/o, the MoE router in fp32, top-k
// routed experts and the shared expert, lm_head) in the weight dtype; the
// vectors (norms, conv, dt_bias, A, D) and the token's embedding row in fp32;
// the SSM and conv states (fp32); the KV cache of CONTEXT positions (fp32).
// Writes (the states written back) are printed but not counted.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/json.h"
#include "models/nemotron_h.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: nh_cost MODEL_DIR [bf16|fp32] [CONTEXT]\n");
        return 2;
    }
    double wb = argc > 2 && !strcmp(argv[2], "fp32") ? 4 : 2;
    long ctx = argc > 3 ? atol(argv[3]) : 512;
    char *path = path_join(argv[1], "config.json");
    json_t *j;
    struct nh_config c;
    if (json_load_path(path, &j) || nh_config_parse(j, path, &c)) {
        fprintf(stderr, "nh_cost: %s\n", vllm_last_error());
        return 1;
    }
    double D = c.hidden, I = (double)c.m_heads * c.m_head_dim, GN = (double)c.m_groups * c.m_state;
    double L = c.latent ? c.latent : D;
    double mat = 0, vec = 0, state = 0, kv = 0, router = 0;
    for (int i = 0; i < c.num_layers; i++) {
        vec += 4 * D; // the layer's norm
        switch (c.kinds[i]) {
        case NH_MAMBA: {
            double conv = I + 2 * GN;
            mat += wb * (D * (2 * I + 2 * GN + c.m_heads) + I * D);
            vec += 4 * (conv * c.m_conv + conv * c.conv_bias + 3.0 * c.m_heads + I);
            state += 4 * (I * c.m_state + (c.m_conv - 1) * conv);
            break;
        }
        case NH_ATTN: {
            double q = (double)c.heads * c.head_dim, k = (double)c.kv_heads * c.head_dim;
            mat += wb * (D * (q + 2 * k) + q * D);
            kv += 4.0 * 2 * k * ctx;
            break;
        }
        case NH_MLP: mat += wb * 2 * D * c.mlp_inter; break;
        case NH_MOE:
            router += 4 * D * c.experts + 4.0 * c.experts;
            mat += wb * (c.top_k * 2 * L * c.moe_inter + 2 * D * c.shared_inter + (c.latent ? 2 * D * L : 0));
            break;
        }
    }
    double gemm = 2 * (mat + router / 4 * wb) / wb; // per prefill token, before lm_head
    mat += wb * D * c.vocab; // lm_head
    vec += 4 * D * 2;        // norm_f, the embedding row
    double total = mat + router + vec + state + kv;
    printf("decode bytes per token (batch 1, %s weights, context %ld): %.1f MB = matrices %.1f + router %.2f + "
           "vectors %.2f + recurrent state %.2f + KV %.2f (states written back: %.2f MB more)\n",
           wb == 2 ? "bf16" : "fp32", ctx, total / 1e6, mat / 1e6, router / 1e6, vec / 1e6, state / 1e6, kv / 1e6,
           state / 1e6);
    printf("prefill GEMM FLOPs per token: %.1f M (2 x the active projection, router and expert parameters)\n", gemm / 1e6);
    printf("%.0f\n%.0f\n", total, gemm);
    nh_config_free(&c);
    json_decref(j);
    free(path);
    return 0;
}
