// prompt_logprobs.c - the prompt's log-probs in the answers, as vLLM gives
// them: the "prompt_logprobs" field ([null, {"id": {"logprob", "rank",
// "decoded_token"}}, ...]: in each choice on /v1/completions, at the top
// level on chat), and /v1/completions' echo with logprobs, where the prompt's
// tokens lead "logprobs" (the first one's null). The engine computes them
// (vllm_sampling_params.prompt_logprobs) and sends them with the first token.
#include <math.h>

#include "core/common.h"
#include "server/server_internal.h"

struct prompt_lp {
    int n, k; // n: prompt tokens - 1 (entry i is about prompt token i + 1)
    float *lp, *top_lp;
    int32_t *rank, *top_ids;
};

// "prompt_logprobs" (k in [0, 20]; not streamed, as in vLLM), and echo with
// logprobs, which asks for the prompt's log-probs with the logprobs' k.
int prompt_lp_parse(const json_t *body, struct gen_params *gp, struct api_error *err) {
    json_t *v = json_object_get(body, "prompt_logprobs");
    gp->prompt_logprobs = -1;
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > VLLM_MAX_LOGPROBS)
            return api_fail(err, 400, "prompt_logprobs", "'prompt_logprobs' must be an integer in [0, %d]",
                            VLLM_MAX_LOGPROBS);
        if (gp->stream)
            return api_fail(err, 400, "prompt_logprobs", "'prompt_logprobs' is not available when 'stream' is true");
        gp->prompt_logprobs = (int)json_integer_value(v);
    }
    gp->echo_logprobs = gp->echo && gp->logprobs >= 0;
    if (gp->echo_logprobs && gp->prompt_logprobs < 0) gp->prompt_logprobs = gp->logprobs; // vLLM's default for echo
    gp->sp.prompt_logprobs = MAX(gp->prompt_logprobs, gp->echo_logprobs ? gp->logprobs : -1);
    return 0;
}

void prompt_lp_capture(struct gen_choice *c, const struct vllm_output *o) {
    if (c->plp) return;
    struct prompt_lp *p = c->plp = xcalloc(1, sizeof *p);
    size_t n = (size_t)o->num_prompt_logprobs, k = (size_t)o->num_prompt_top_logprobs;
    p->n = (int)n, p->k = (int)k;
    p->lp = xmalloc(sizeof(float) * (n + 1));
    p->rank = xmalloc(sizeof(int32_t) * (n + 1));
    p->top_ids = xmalloc(sizeof(int32_t) * (n * k + 1));
    p->top_lp = xmalloc(sizeof(float) * (n * k + 1));
    memcpy(p->lp, o->prompt_logprobs, sizeof(float) * n);
    memcpy(p->rank, o->prompt_ranks, sizeof(int32_t) * n);
    memcpy(p->top_ids, o->prompt_top_ids, sizeof(int32_t) * n * k);
    memcpy(p->top_lp, o->prompt_top_logprobs, sizeof(float) * n * k);
}

void prompt_lp_free(struct prompt_lp *p) {
    if (!p) return;
    free(p->lp), free(p->rank), free(p->top_ids), free(p->top_lp);
    free(p);
}

static json_t *lp_json(float lp) { return json_real(isfinite(lp) ? lp : -9999.0); } // OpenAI's -inf

static json_t *piece_json(struct server *s, int32_t id) {
    const char *piece = server_piece(s, id);
    return json_text(piece, strlen(piece));
}

void prompt_lp_echo(struct gen_choice *c, json_t *logprobs) {
    struct gen *g = c->g;
    struct server *s = g->srv;
    const struct prompt_lp *p = c->plp;
    const struct gen_prompt *pr = &g->p.prompts[c->prompt];
    int k = MIN(g->p.logprobs, p->k);
    for (int i = 0; i < pr->num && i <= p->n; i++) {
        int32_t id = pr->ids[i];
        const char *piece = server_piece(s, id);
        json_array_append_new(json_object_get(logprobs, "tokens"), json_text(piece, strlen(piece)));
        json_array_append_new(json_object_get(logprobs, "text_offset"), json_integer((json_int_t)c->text_offset));
        c->text_offset += strlen(piece);
        if (i == 0) { // the first token has no context, so no log-prob
            json_array_append_new(json_object_get(logprobs, "token_logprobs"), json_null());
            json_array_append_new(json_object_get(logprobs, "top_logprobs"), json_null());
            continue;
        }
        int e = i - 1;
        json_t *top = json_object();
        for (int j = 0; j < k; j++) {
            int32_t t = p->top_ids[(size_t)e * p->k + j];
            if (t >= 0) json_object_set_new(top, server_piece(s, t), lp_json(p->top_lp[(size_t)e * p->k + j]));
        }
        if (!json_object_get(top, piece)) json_object_set_new(top, piece, lp_json(p->lp[e]));
        json_array_append_new(json_object_get(logprobs, "token_logprobs"), lp_json(p->lp[e]));
        json_array_append_new(json_object_get(logprobs, "top_logprobs"), top);
    }
}

static json_t *entry_json(struct server *s, int32_t id, float lp, int rank) {
    return json_pack("{s:o,s:i,s:o}", "logprob", lp_json(lp), "rank", rank, "decoded_token", piece_json(s, id));
}

// vLLM's list: null, then per prompt token {"id": entry} for the token and
// the k most likely.
static json_t *vllm_list(struct gen_choice *c) {
    struct gen *g = c->g;
    const struct prompt_lp *p = c->plp;
    const struct gen_prompt *pr = &g->p.prompts[c->prompt];
    json_t *list = json_pack("[n]");
    int k = MIN(g->p.prompt_logprobs, p->k);
    for (int e = 0; e < p->n && e + 1 < pr->num; e++) {
        json_t *d = json_object();
        char key[16];
        int32_t id = pr->ids[e + 1];
        snprintf(key, sizeof key, "%d", id);
        json_object_set_new(d, key, entry_json(g->srv, id, p->lp[e], p->rank[e]));
        for (int j = 0; j < k; j++) {
            int32_t t = p->top_ids[(size_t)e * p->k + j];
            snprintf(key, sizeof key, "%d", t);
            if (t >= 0 && !json_object_get(d, key))
                json_object_set_new(d, key, entry_json(g->srv, t, p->top_lp[(size_t)e * p->k + j], j + 1));
        }
        json_array_append_new(list, d);
    }
    return list;
}

void prompt_lp_attach(struct gen_choice *c, json_t *response, json_t *choice) {
    const struct gen *g = c->g;
    if (g->p.prompt_logprobs < 0 || !c->plp) return;
    if (g->p.kind == API_CHAT) { // one prompt: every choice's list is the same
        if (!json_object_get(response, "prompt_logprobs")) json_object_set_new(response, "prompt_logprobs", vllm_list(c));
    } else {
        json_object_set_new(choice, "prompt_logprobs", vllm_list(c));
    }
}
