// engine.c - load, the engine thread, and step() = schedule, run, postprocess.
#include <math.h>
#include <time.h>

#include "core/common.h"
#include "core/json.h"
#include "engine/engine.h"
#include "models/quant.h"
#include "tokenizer/tokenizer.h"

// ------------------------------------------------------------------ load --

void vllm_engine_params_default(struct vllm_engine_params *p) {
    memset(p, 0, sizeof *p);
    p->device = "cpu";
    p->dtype = "auto";
    p->kv_cache_dtype = "auto";
    p->load_format = "auto";
    p->block_size = 16;
    p->max_num_seqs = 64;
    p->max_num_batched_tokens = 2048;
    p->tensor_parallel_size = 1;
    p->seed = 0;
    p->async_scheduling = -1;
}

static int is_cuda(const char *device) { return device && !strcmp(device, "cuda"); }

// The weights' format: auto is bf16 on CUDA, fp32 on the CPU.
static int parse_dtype(const char *s, const char *device, enum wfmt *out) {
    if (!s || !strcmp(s, "auto")) *out = is_cuda(device) ? WF_BF16 : WF_F32;
    else if (!strcmp(s, "float32") || !strcmp(s, "fp32") || !strcmp(s, "float")) *out = WF_F32;
    else if (!strcmp(s, "bfloat16") || !strcmp(s, "bf16")) *out = WF_BF16;
    else if (!strcmp(s, "float16") || !strcmp(s, "fp16") || !strcmp(s, "half")) *out = WF_F16;
    else return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "unknown dtype '%s' (expected auto, float32, bfloat16 or float16)", s);
    return VLLM_OK;
}

// The KV cache's element type, its own setting: auto follows 16-bit weights
// on CUDA (bf16 for bf16 and fp16 weights) and is fp32 otherwise; fp8 is
// vLLM's e4m3 cache with the checkpoint's k_scale / v_scale (enum dtype).
static int parse_kv_dtype(const char *s, const char *device, enum wfmt w, enum dtype *out) {
    if (!s || !strcmp(s, "auto")) *out = is_cuda(device) && w != WF_F32 ? DT_BF16 : DT_F32;
    else if (!strcmp(s, "float32") || !strcmp(s, "fp32") || !strcmp(s, "float")) *out = DT_F32;
    else if (!strcmp(s, "bfloat16") || !strcmp(s, "bf16")) *out = DT_BF16;
    else if (!strcmp(s, "fp8") || !strcmp(s, "fp8_e4m3")) *out = DT_FP8;
    else
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "unknown kv_cache_dtype '%s' (expected auto, float32, bfloat16, fp8 "
                        "or fp8_e4m3)", s);
    return VLLM_OK;
}

static int check_params(const struct vllm_engine_params *p) {
    if (!p || !p->model || !*p->model) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "no model directory given");
    if (p->block_size < 1 || p->block_size > 1024)
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "block_size %d is out of range [1, 1024]", p->block_size);
    if (p->max_num_seqs < 1 || p->max_num_seqs > 4096)
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "max_num_seqs %d is out of range [1, 4096]", p->max_num_seqs);
    if (p->max_num_batched_tokens < 1)
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "max_num_batched_tokens must be >= 1");
    if (!(p->gpu_memory_utilization >= 0 && p->gpu_memory_utilization <= 1))
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "gpu_memory_utilization %g is not in (0, 1]", p->gpu_memory_utilization);
    if (p->max_model_len < 0 || p->num_kv_blocks < 0 || p->kv_cache_bytes < 0 || p->max_queued < 0 ||
        p->prefix_state_bytes < 0 || p->state_checkpoint_interval < 0)
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "negative engine parameter");
    if (p->tensor_parallel_size < 0 || p->tensor_parallel_size > 64)
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "tensor_parallel_size %d is out of range [1, 64]",
                        p->tensor_parallel_size);
    if (p->load_format && strcmp(p->load_format, "auto") && strcmp(p->load_format, "safetensors") &&
        strcmp(p->load_format, "dummy"))
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "unknown load_format '%s' (expected auto, safetensors or dummy)",
                        p->load_format);
    enum quant_mode qm;
    TRY(quant_mode_parse(p->quantization, &qm));
    if (p->async_scheduling < -1 || p->async_scheduling > 1)
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "async_scheduling %d is not -1 (auto), 0 or 1", p->async_scheduling);
    if (p->scheduling_policy && strcmp(p->scheduling_policy, "fcfs") && strcmp(p->scheduling_policy, "priority"))
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "unknown scheduling_policy '%s' (expected fcfs or priority)",
                        p->scheduling_policy);
    return VLLM_OK;
}

// Per slot, the recurrent state bytes of one rank's layers.
static int64_t state_bytes_per_slot(const struct model_spec *sp) {
    int64_t per = 0;
    for (int i = 0; i < sp->num_layers; i++)
        for (int j = 0; j < sp->layers[i].num_states; j++) per += (int64_t)sizeof(float) * sp->layers[i].states[j].floats;
    return per;
}

// The KV budget under gpu_memory_utilization: per rank, util * total less
// what is in use now (weights, workspace, other processes), the state slots,
// and a reserve for the runner's buffers, graphs and libraries; with prefix
// caching on a state model and no prefix_state_bytes, a fifth of it goes to
// the state checkpoints (their default: a quarter of the KV budget).
static int kv_budget_from_util(struct vllm_engine *e, int64_t *budget) {
    const struct vllm_engine_params *p = &e->params;
    float u = p->gpu_memory_utilization;
    if (!(u > 0 && u <= 1)) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "gpu_memory_utilization %g is not in (0, 1]", u);
    *budget = INT64_MAX;
    for (int k = 0; k < e->tp; k++) {
        const struct model_spec *sp = &e->model[k]->spec;
        int64_t free_b, total, state = state_bytes_per_slot(sp) * (p->max_num_seqs + 1);
        backend_bind(e->be[k]);
        e->be[k]->ops->mem_info(e->be[k], &free_b, &total);
        int64_t reserve = ((int64_t)1 << 29) + (int64_t)p->max_num_seqs * sp->vocab_size * 8 +
                          (int64_t)(p->max_num_seqs + 1) * e->max_model_len * 4;
        int64_t used = total - free_b, avail = (int64_t)((double)u * total) - used - state - reserve;
        if (avail <= 0)
            return vllm_err(VLLM_ERR_OUT_OF_MEMORY,
                            "gpu_memory_utilization %.2f leaves no room for the KV cache: of %.1f GiB (%s, rank %d), "
                            "%.1f GiB are in use (weights, workspace, other processes), %.2f GiB go to state slots "
                            "and %.2f GiB to buffers", u, total / 1073741824.0, e->be[k]->ops->name, k,
                            used / 1073741824.0, state / 1073741824.0, reserve / 1073741824.0);
        if (p->enable_prefix_caching && state && !p->prefix_state_bytes) avail = avail / 5 * 4;
        else avail -= p->prefix_state_bytes;
        *budget = MIN(*budget, avail);
    }
    backend_bind(e->be[0]);
    if (*budget <= 0)
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "prefix_state_bytes leaves gpu_memory_utilization %.2f no KV cache", u);
    return VLLM_OK;
}

// KV blocks from the budget (of each rank: every rank holds every block, of
// its own KV heads); max_model_len shrinks to what fits if it was not asked
// for explicitly.
static int size_kv(struct vllm_engine *e, const struct model_spec *sp, int *num_blocks) {
    const struct vllm_engine_params *p = &e->params;
    int64_t per_block = 0;
    for (int i = 0; i < sp->num_layers; i++)
        per_block += (int64_t)p->block_size * (sp->layers[i].k_per_token + sp->layers[i].v_per_token) *
                     (int64_t)dtype_size(e->be[0]->kv_dtype);
    *num_blocks = 0;
    if (!per_block) return VLLM_OK;
    int64_t cap = (int64_t)p->max_num_seqs * CDIV(e->max_model_len, p->block_size);
    int64_t budget = e->kv_budget;
    int64_t n = p->num_kv_blocks ? p->num_kv_blocks : MIN(budget / per_block, cap);
    if (n < 1) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "the KV budget of %lld bytes holds no block of %lld bytes",
                               (long long)budget, (long long)per_block);
    if (n > (1 << 30)) n = 1 << 30;
    int64_t tokens = n * p->block_size;
    if (tokens < e->max_model_len) {
        if (p->max_model_len)
            return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "max_model_len %d needs %d KV blocks; the pool has %lld",
                            e->max_model_len, CDIV(e->max_model_len, p->block_size), (long long)n);
        e->max_model_len = (int)tokens;
    }
    *num_blocks = (int)n;
    return VLLM_OK;
}

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

// Prefix caching's recurrent side: the checkpoint interval, a multiple of
// block_size (a checkpoint is keyed by the hash of the block that ends at it)
// and of every state layer's alignment (the SSD chunk: the scan has the state
// at chunk boundaries only); so any shared prefix of at least one interval
// hits at its last multiple of the interval. Decode steps add one at each
// block boundary of a reply (scheduler.c: plan_ckpts). The pool:
// prefix_state_bytes (default a quarter of the KV budget) of checkpoints of
// every state layer on every rank, at most one per KV block (a checkpoint is
// keyed by the block ending at it, and a hit needs the blocks of its prefix).
static int size_ckpts(struct vllm_engine *e, int num_blocks, int *interval, int *num, int64_t *bytes) {
    const struct vllm_engine_params *p = &e->params;
    int align = 0;
    int64_t per = 0;
    for (int k = 0; k < e->tp; k++)
        for (int i = 0; i < e->model[k]->spec.num_layers; i++) {
            const struct layer_cache_spec *ls = &e->model[k]->spec.layers[i];
            for (int j = 0; j < ls->num_states; j++) per += (int64_t)sizeof(float) * ls->states[j].floats;
            if (ls->state_align) align = align ? align / gcd(align, ls->state_align) * ls->state_align : ls->state_align;
        }
    *interval = *num = 0;
    *bytes = 0;
    if (!p->enable_prefix_caching || !align) return VLLM_OK;
    int base = align / gcd(align, p->block_size) * p->block_size;
    if (p->state_checkpoint_interval && p->state_checkpoint_interval % base)
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT,
                        "state_checkpoint_interval %d is not a multiple of %d (block_size %d and the state's chunk %d)",
                        p->state_checkpoint_interval, base, p->block_size, align);
    *interval = p->state_checkpoint_interval ? p->state_checkpoint_interval : base;
    int64_t budget = p->prefix_state_bytes ? p->prefix_state_bytes : e->kv_budget / 4;
    int64_t n = per ? budget / per : 0;
    int64_t cap = num_blocks ? num_blocks : (int64_t)p->max_num_seqs * CDIV(e->max_model_len, p->block_size);
    n = MIN(MIN(n, cap), 1 << 20);
    *num = (int)n;
    *bytes = n * per;
    return VLLM_OK;
}

static int load_text(struct vllm_engine *e) {
    char *tj = path_join(e->model_dir, "tokenizer.json");
    int has = file_exists(tj), rc = VLLM_OK;
    free(tj);
    if (has) {
        rc = tok_load(e->model_dir, &e->tok);
        if (rc) return vllm_err_prefix(rc, "loading the tokenizer");
    }
    rc = chat_template_load(e->model_dir, &e->chat);
    if (rc == VLLM_ERR_IO) rc = VLLM_OK, e->chat = NULL; // no template: chat is unavailable, not an error
    return rc ? vllm_err_prefix(rc, "loading the chat template") : VLLM_OK;
}

static void fill_info(struct vllm_engine *e, int num_blocks) {
    struct vllm_model_info *in = &e->info;
    const struct model_spec *sp = &e->model[0]->spec;
    in->architecture = sp->arch;
    in->model_name = e->model_name;
    in->vocab_size = sp->vocab_size;
    in->max_model_len = e->max_model_len;
    in->num_eos_token_ids = e->num_eos;
    in->eos_token_ids = e->eos;
    in->generation_defaults = e->gen_defaults;
    in->has_tokenizer = e->tok != NULL;
    in->has_chat_template = e->chat != NULL;
    in->num_kv_blocks = num_blocks;
    in->block_size = e->params.block_size;
    in->kv_cache_dtype = dtype_name(e->be[0]->kv_dtype);
    in->num_state_slots = e->sched.cfg.num_slots;
    in->kv_cache_bytes = runner_cache_bytes(e->runner, &in->state_bytes);
    in->weight_bytes = 0;
    for (int k = 0; k < e->tp; k++) in->weight_bytes += e->model[k]->spec.weight_bytes; // over all ranks
    in->prefix_caching = e->sched.cfg.prefix_caching;
    in->num_state_checkpoints = e->sched.ckpts.total;
    in->state_checkpoint_interval = e->sched.cfg.ckpt_interval;
}

// Whether any cache layer keeps recurrent state (then requests take slots).
static int has_state(const struct model_spec *sp) {
    for (int i = 0; i < sp->num_layers; i++)
        if (sp->layers[i].num_states) return 1;
    return 0;
}

static int engine_init(struct vllm_engine *e) {
    struct vllm_engine_params *p = &e->params;
    enum wfmt wfmt = WF_F32;
    enum dtype kvdt = DT_F32;
    TRY(parse_dtype(p->dtype, p->device, &wfmt));
    TRY(parse_kv_dtype(p->kv_cache_dtype, p->device, wfmt, &kvdt));
    e->tp = p->tensor_parallel_size ? p->tensor_parallel_size : 1;
    e->async = p->async_scheduling < 0 ? is_cuda(p->device) : p->async_scheduling;
    e->be = xcalloc(e->tp, sizeof *e->be);
    e->model = xcalloc(e->tp, sizeof *e->model);
    TRY(backend_create_group(p->device, e->tp, p->num_threads, kvdt, e->be));
    for (int k = 0; k < e->tp; k++) e->be[k]->weight_dtype = wfmt;
    enum quant_mode qm = QUANT_AUTO;
    TRY(quant_mode_parse(p->quantization, &qm));
    struct model_load_opts o = {wfmt, p->load_format && !strcmp(p->load_format, "dummy"), p->seed,
                                p->max_num_batched_tokens, p->max_num_seqs, p->max_model_len, (int)qm};
    for (int k = 0; k < e->tp; k++) { // rank k loads its shards onto its device
        backend_bind(e->be[k]);
        TRY(model_load(e->model_dir, NULL, &o, e->be[k], &e->model[k]));
    }
    backend_bind(e->be[0]);
    const struct model_spec *sp = &e->model[0]->spec;
    e->max_model_len = p->max_model_len ? p->max_model_len : sp->max_position_embeddings ? sp->max_position_embeddings : 4096;
    e->kv_budget = p->kv_cache_bytes ? p->kv_cache_bytes : (int64_t)2 << 30;
    if (p->gpu_memory_utilization && !p->kv_cache_bytes && !p->num_kv_blocks) TRY(kv_budget_from_util(e, &e->kv_budget));
    int num_blocks;
    TRY(size_kv(e, sp, &num_blocks));
    int slots = has_state(sp) ? p->max_num_seqs : 0, interval, ckpts;
    int64_t ckpt_bytes;
    TRY(size_ckpts(e, num_blocks, &interval, &ckpts, &ckpt_bytes));
    struct sched_config sc = {p->max_num_seqs, p->max_num_batched_tokens, p->block_size, num_blocks, slots,
                              p->enable_prefix_caching != 0, ckpts, interval, e->priority};
    struct runner_config rc = {p->max_num_seqs, e->max_model_len, p->max_num_batched_tokens,
                               p->block_size, num_blocks, slots, VLLM_MAX_LOGPROBS, !getenv("VLLM_NO_GRAPHS"),
                               ckpts, sched_max_ckpt_writes(&sc)};
    TRY(runner_create(e->tp, e->be, e->model, &rc, &e->runner));
    TRY(sched_init(&e->sched, &sc));
    TRY(load_text(e));
    TRY(engine_generation_config(e));
    fill_info(e, num_blocks);
    e->info.checkpoint_bytes = ckpt_bytes;
    e->info.state_bytes -= ckpt_bytes; // the checkpoints are slots of the same buffers
    e->stats.state_checkpoints_total = ckpts;
    e->stats.kv_blocks_total = num_blocks;
    e->stats.state_slots_total = slots;
    return VLLM_OK;
}

static void engine_destroy(struct vllm_engine *e) {
    if (e->tok) tok_free(e->tok);
    if (e->chat) chat_template_free(e->chat);
    if (e->runner) {
        runner_free(e->runner);
        sched_release(&e->sched);
    }
    for (int k = e->tp - 1; k >= 0; k--) { // rank 0 last: it stays bound
        backend_bind(e->be[k]);
        model_free(e->model[k]);
        backend_free(e->be[k]);
    }
    free(e->model);
    free(e->be);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e->model_dir);
    free(e->model_name);
    free((char *)e->params.device);
    free((char *)e->params.dtype);
    free((char *)e->params.load_format);
    free((char *)e->params.quantization);
    free((char *)e->params.kv_cache_dtype);
    free(e->gen_defaults);
    free(e);
}

vllm_status vllm_engine_load(const struct vllm_engine_params *p, struct vllm_engine **out) {
    vllm_err_clear();
    if (!out) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    int rc = check_params(p);
    if (rc) return rc;
    struct vllm_engine *e = xcalloc(1, sizeof *e);
    e->params = *p;
    e->params.device = xstrdup(p->device ? p->device : "cpu");
    e->params.dtype = xstrdup(p->dtype ? p->dtype : "auto");
    e->params.load_format = xstrdup(p->load_format ? p->load_format : "auto");
    e->params.quantization = xstrdup(p->quantization ? p->quantization : "auto");
    e->params.kv_cache_dtype = xstrdup(p->kv_cache_dtype ? p->kv_cache_dtype : "auto");
    e->priority = p->scheduling_policy && !strcmp(p->scheduling_policy, "priority");
    e->params.scheduling_policy = NULL; // the caller's string is not kept
    e->model_dir = xstrdup(p->model);
    e->params.model = e->model_dir;
    size_t n = strlen(e->model_dir);
    while (n > 1 && e->model_dir[n - 1] == '/') e->model_dir[--n] = 0;
    const char *base = strrchr(e->model_dir, '/');
    e->model_name = xstrdup(base ? base + 1 : e->model_dir);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->next_id = 1;
    e->inflight_step = -1;
    rc = engine_init(e);
    e->params.generation_config = NULL; // the caller's string: read by engine_init only
    if (rc) {
        engine_destroy(e);
        return rc;
    }
    engine_thread_start(e);
    *out = e;
    return VLLM_OK;
}

void vllm_engine_free(struct vllm_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    engine_abort_all(e);
    engine_destroy(e);
}

vllm_status vllm_engine_info(struct vllm_engine *e, struct vllm_model_info *out) {
    if (!e || !out) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "NULL argument");
    *out = e->info;
    return VLLM_OK;
}

vllm_status vllm_engine_stats(struct vllm_engine *e, struct vllm_stats *out) {
    if (!e || !out) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "NULL argument");
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    out->num_waiting += e->num_inbox;
    pthread_mutex_unlock(&e->mu);
    return VLLM_OK;
}

static vllm_status set_paused(struct vllm_engine *e, int paused) {
    if (!e) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "NULL engine");
    pthread_mutex_lock(&e->mu);
    e->paused = paused;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return VLLM_OK;
}

vllm_status vllm_engine_pause(struct vllm_engine *e) { return set_paused(e, 1); }
vllm_status vllm_engine_resume(struct vllm_engine *e) { return set_paused(e, 0); }

void engine_cost(const struct vllm_engine *e, struct model_cost *c, int *kv_elem_bytes) {
    *c = e->model[0]->spec.cost;
    *kv_elem_bytes = (int)dtype_size(e->be[0]->kv_dtype);
}

int engine_peaks(struct vllm_engine *e, double *bytes_per_s, double *flops_per_s) {
    struct backend *be = e->be[0];
    if (!be->ops->peaks) return vllm_err(VLLM_ERR_UNSUPPORTED, "backend %s does not measure its limits", be->ops->name);
    pthread_mutex_lock(&e->mu); // between steps: the engine thread waits for work
    backend_bind(be);
    int rc = be->ops->peaks(be, bytes_per_s, flops_per_s);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

void engine_set_logits_hook(struct vllm_engine *e, runner_logits_hook fn, void *user) {
    pthread_mutex_lock(&e->mu);
    runner_set_logits_hook(e->runner, fn, user);
    pthread_mutex_unlock(&e->mu);
}

// ---------------------------------------------------------- postprocess --

static void emit(struct request *r, const int32_t *ids, int n, const char *text, size_t text_len,
                 vllm_finish_reason reason, int status, const char *error, const struct step_out *so, int k) {
    if (!r->cb) return;
    struct vllm_output o = {0};
    o.request_id = r->id;
    o.token_ids = ids;
    o.num_token_ids = n;
    o.text = text ? text : "";
    o.text_len = text ? text_len : 0;
    if (so && n && r->sp.logprobs >= 0) {
        o.logprobs = &so->logprobs[k];
        o.num_top_logprobs = MIN(r->sp.logprobs, so->max_top);
        o.top_ids = &so->top_ids[(size_t)k * so->max_top];
        o.top_logprobs = &so->top_logprobs[(size_t)k * so->max_top];
    }
    o.num_prompt_tokens = r->num_prompt;
    o.num_output_tokens = r->delivered;
    o.finish_reason = reason;
    o.status = status;
    o.error = error;
    o.ttft_s = r->t_first > 0 ? r->t_first - r->t_submit : 0;
    o.num_cached_tokens = MAX(r->num_cached, 0);
    o.queue_s = r->t_sched > 0 ? r->t_sched - r->t_submit : 0;
    o.stop_token_id = -1;
    if (reason == VLLM_FINISH_STOP) {
        o.stop_token_id = r->stop_token;
        o.stop_str = r->stop_token < 0 && r->ts ? text_stream_stop(r->ts) : NULL;
    }
    if (n && r->sp.prompt_logprobs >= 0 && !r->plp_sent) { // with the first output token, once
        r->plp_sent = 1;
        o.num_prompt_logprobs = r->num_prompt - 1;
        o.prompt_logprobs = r->plp_lp;
        o.prompt_ranks = r->plp_rank;
        o.num_prompt_top_logprobs = r->sp.prompt_logprobs;
        o.prompt_top_ids = r->plp_top_ids;
        o.prompt_top_logprobs = r->plp_top_lp;
    }
    r->cb(r->user, &o);
}

// Gives a finished request's resources back (the scheduler's one place) once
// no launched step uses them, and drops the engine's reference.
static void release(struct vllm_engine *e, struct request *r) {
    sched_free_resources(&e->sched, r);
    pthread_mutex_lock(&e->mu);
    request_release(e, r);
    pthread_mutex_unlock(&e->mu);
}

// Takes r out of scheduling and sends its last event; its resources go back
// when the steps in flight that use them are done.
static void finish(struct vllm_engine *e, struct request *r, vllm_finish_reason reason, int status, const char *error) {
    sched_unschedule(&e->sched, r);
    char *text = NULL;
    size_t len = 0;
    if (r->ts && reason != VLLM_FINISH_ABORT && reason != VLLM_FINISH_ERROR) text_stream_flush(r->ts, &text, &len);
    emit(r, NULL, 0, text, len, reason, status, error, NULL, 0);
    free(text);
    pthread_mutex_lock(&e->mu);
    r->finished = 1;
    e->stats.requests_finished++;
    pthread_mutex_unlock(&e->mu);
    if (r->inflight == 0) release(e, r);
}

static int is_eos(const struct vllm_engine *e, int32_t id) {
    for (int i = 0; i < e->info.num_eos_token_ids; i++)
        if (e->info.eos_token_ids[i] == id) return 1;
    return 0;
}

static vllm_finish_reason stop_reason(struct vllm_engine *e, struct request *r, int32_t id, int num_output) {
    if (num_output >= r->sp.min_tokens) {
        for (int i = 0; i < r->sp.num_stop_token_ids; i++)
            if (r->stop_ids[i] == id) {
                r->stop_token = id; // vLLM's stop_reason
                return VLLM_FINISH_STOP;
            }
        if (!r->sp.ignore_eos && is_eos(e, id)) return VLLM_FINISH_EOS;
    }
    return VLLM_FINISH_NONE;
}

// The sampled token at r->tokens[pos] arrived: stream it, and finish the
// request if it stops. Later tokens of r may already be in flight.
static void on_token(struct vllm_engine *e, struct request *r, int pos, const struct step_out *so, int k) {
    int32_t id = r->tokens[pos];
    int num_output = pos + 1 - r->num_prompt;
    double now = now_s();
    if (r->t_first == 0) r->t_first = now;
    r->t_last = now;
    if (r->has_cons && r->cons.accept && r->cons.accept(r->cons.user, id)) {
        r->delivered = num_output - 1;
        finish(e, r, VLLM_FINISH_ERROR, VLLM_ERR_INTERNAL, "the sampled token is not allowed by the request's constraint");
        return;
    }
    vllm_finish_reason reason = stop_reason(e, r, id, num_output);
    char *text = NULL;
    size_t len = 0;
    if (r->ts && reason == VLLM_FINISH_NONE && text_stream_push(r->ts, id, &text, &len)) reason = VLLM_FINISH_STOP;
    if (reason == VLLM_FINISH_NONE && (num_output >= r->max_tokens || pos + 1 >= e->max_model_len))
        reason = VLLM_FINISH_LENGTH;
    r->delivered = num_output;
    emit(r, &id, 1, text, len, VLLM_FINISH_NONE, VLLM_OK, NULL, so, k);
    free(text);
    if (reason != VLLM_FINISH_NONE) finish(e, r, reason, VLLM_OK, NULL);
}

// Requests the caller cancelled leave within this step.
static void handle_cancels(struct vllm_engine *e) {
    struct request *list[64];
    for (;;) {
        int n = 0;
        pthread_mutex_lock(&e->mu);
        if (e->num_cancel > 0) {
            for (int i = 0; i < e->sched.num_running && n < 64; i++)
                if (e->sched.running[i]->cancel) list[n++] = e->sched.running[i];
            for (struct request *q = e->sched.wait_head; q && n < 64; q = q->next)
                if (q->cancel) list[n++] = q;
            e->num_cancel -= n;
            if (n == 0) e->num_cancel = 0;
        }
        pthread_mutex_unlock(&e->mu);
        if (!n) return;
        for (int i = 0; i < n; i++) finish(e, list[i], VLLM_FINISH_ABORT, VLLM_ERR_CANCELLED, "cancelled");
    }
}

// The step's counters, published before any of its tokens go out (so a
// request's finish sees its own prompt tokens and cache hits counted).
static void count_step(struct vllm_engine *e, const struct sched_output *so, int launched) {
    pthread_mutex_lock(&e->mu);
    struct vllm_stats *st = &e->stats;
    st->num_steps++;
    for (int i = 0; i < so->num_entries; i++)
        if (!so->entries[i].is_decode) st->prompt_tokens_total += so->entries[i].num_tokens;
    if (launched && so->num_tokens > 0) {
        static const int bounds[VLLM_NUM_ITERATION_BOUNDS] = VLLM_ITERATION_TOKEN_BOUNDS;
        int k = 0;
        while (k < VLLM_NUM_ITERATION_BOUNDS && so->num_tokens > bounds[k]) k++;
        st->iteration_tokens[k]++;
        st->iteration_tokens_sum += (uint64_t)so->num_tokens;
    }
    st->num_preemptions = e->sched.num_preemptions;
    st->prefix_cache_queries = e->sched.prefix_queries;
    st->prefix_cache_hits = e->sched.prefix_hits;
    pthread_mutex_unlock(&e->mu);
}

// The pools' gauges, after the step's postprocessing has released what it could.
static void update_gauges(struct vllm_engine *e) {
    pthread_mutex_lock(&e->mu);
    struct vllm_stats *st = &e->stats;
    st->num_running = e->sched.num_running;
    st->num_waiting = e->sched.num_waiting;
    st->kv_blocks_used = kv_pool_used(&e->sched.blocks);
    st->state_slots_used = id_pool_used(&e->sched.slots);
    st->state_checkpoints_used = kv_pool_occupied(&e->sched.ckpts);
    pthread_mutex_unlock(&e->mu);
}

// What a launch changes at once: tokens computed, and for each request that
// samples, a placeholder for its token (its value arrives with the step).
static void account_launch(struct vllm_engine *e, const struct sched_output *so) {
    double now = now_s();
    for (int i = 0; i < so->num_entries; i++) {
        struct request *r = so->entries[i].req;
        if (r->t_sched == 0) r->t_sched = now; // its first admission: the end of its queue time
        r->num_computed += so->entries[i].num_tokens;
        r->inflight++;
        if (r->num_computed != r->num_tokens) continue;
        if (r->num_tokens == r->cap_tokens) xgrow((void **)&r->tokens, &r->cap_tokens, r->num_tokens + 1, sizeof(int32_t));
        r->tokens[r->num_tokens++] = -1;
        if (req_num_output(r) >= r->max_tokens || r->num_tokens >= e->max_model_len) r->length_done = 1;
    }
}

// The step's prompt log-probs into their requests (before the tokens: the
// step that samples a request's first token also computed its last prompt
// rows).
static void store_prompt_logprobs(const struct step_out *out) {
    for (int i = 0; i < out->num_plp; i++) {
        struct request *r = out->plp_reqs[i];
        int j = out->plp_pos[i] - 1, k = r->sp.prompt_logprobs;
        if (r->finished || r->plp_sent) continue;
        r->plp_lp[j] = out->plp_lp[i];
        r->plp_rank[j] = out->plp_rank[i];
        memcpy(r->plp_top_ids + (size_t)j * k, out->plp_top_ids + (size_t)i * out->plp_k, sizeof(int32_t) * k);
        memcpy(r->plp_top_lp + (size_t)j * k, out->plp_top_lp + (size_t)i * out->plp_k, sizeof(float) * k);
    }
}

// A step's sampled ids are on the host: stream them, check stops, release
// the requests no launched step uses any more.
static void postprocess(struct vllm_engine *e, const struct step_out *out) {
    pthread_mutex_lock(&e->mu);
    e->stats.generation_tokens_total += out->num;
    pthread_mutex_unlock(&e->mu);
    store_prompt_logprobs(out);
    for (int k = 0; k < out->num; k++) {
        struct request *r = out->reqs[k];
        r->tokens[out->pos[k]] = out->ids[k];
        if (!r->finished) on_token(e, r, out->pos[k], out, k); // a finished request's later tokens are dropped
    }
    for (int i = 0; i < out->num_scheduled; i++) {
        struct request *r = out->scheduled[i];
        if (--r->inflight == 0 && r->finished) release(e, r);
    }
}

// Waits for a launched step's results and postprocesses them.
static void wait_step(struct vllm_engine *e, int handle) {
    struct step_out out;
    runner_wait(e->runner, handle, &out);
    postprocess(e, &out);
}

// A step that failed on the device fails the requests it ran.
static void fail_step(struct vllm_engine *e, const struct sched_output *so, int rc) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", vllm_last_error());
    int nf = so->num_entries;
    struct request *failed[nf > 0 ? nf : 1];
    for (int i = 0; i < nf; i++) failed[i] = so->entries[i].req;
    for (int i = 0; i < nf; i++) finish(e, failed[i], VLLM_FINISH_ERROR, rc, msg);
}

// The requests of a launched step that wanted prompt log-probs the runner
// could not allocate buffers for fail; the others run on.
static void fail_prompt_logprobs(struct vllm_engine *e, const struct sched_output *so) {
    char msg[512];
    snprintf(msg, sizeof msg, "prompt_logprobs: %s", vllm_last_error());
    for (int i = 0; i < so->num_entries; i++) {
        struct request *r = so->entries[i].req;
        if (r->sp.prompt_logprobs >= 0 && !r->plp_sent && !r->finished)
            finish(e, r, VLLM_FINISH_ERROR, VLLM_ERR_OUT_OF_MEMORY, msg);
    }
}

// step() = schedule, run, postprocess. With async scheduling the step just
// launched runs on the device while the host postprocesses the one before
// it; without, it is postprocessed here (its tokens go out before the next
// step is scheduled).
static void step(struct vllm_engine *e) {
    handle_cancels(e);
    const struct sched_output *so = sched_schedule(&e->sched);
    int launched = -1;
    if (so->num_entries) {
        int rc = runner_launch(e->runner, so, &launched);
        if (rc) sched_launch_failed(&e->sched, so), fail_step(e, so, rc), launched = -1;
        else account_launch(e, so);
        if (!rc && runner_plp_failed(e->runner)) fail_prompt_logprobs(e, so);
    }
    count_step(e, so, launched >= 0);
    if (e->inflight_step >= 0) wait_step(e, e->inflight_step);
    // A constrained row's mask needs the tokens just postprocessed: its
    // step's sampler is queued now, behind the forward the device is running.
    if (launched >= 0 && runner_needs_sample(e->runner, launched)) runner_sample(e->runner, launched);
    int done = launched >= 0 && !e->async;
    if (done) wait_step(e, launched);
    if (e->inflight_step < 0 && launched < 0) { // nothing could run and nothing is in flight: do not spin
        pthread_mutex_lock(&e->mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 1000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        pthread_mutex_unlock(&e->mu);
    }
    e->inflight_step = done ? -1 : launched;
    update_gauges(e);
}

// Waits for the step in flight, if any (shutdown).
static void drain(struct vllm_engine *e) {
    if (e->inflight_step < 0) return;
    wait_step(e, e->inflight_step);
    e->inflight_step = -1;
}

// --------------------------------------------------------------- thread --

static void *engine_main(void *arg) {
    struct vllm_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        while (e->inbox_head) { // the scheduler is touched only by this thread
            struct request *r = e->inbox_head;
            e->inbox_head = r->next;
            if (!e->inbox_head) e->inbox_tail = NULL;
            e->num_inbox--;
            sched_add(&e->sched, r);
        }
        e->stats.num_waiting = e->sched.num_waiting;
        if (e->paused || (!sched_has_work(&e->sched) && e->inflight_step < 0)) {
            pthread_cond_wait(&e->cv, &e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        step(e);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    drain(e);
    return NULL;
}

void engine_thread_start(struct vllm_engine *e) { pthread_create(&e->thread, NULL, engine_main, e); }

void engine_abort_all(struct vllm_engine *e) {
    pthread_mutex_lock(&e->mu);
    while (e->inbox_head) {
        struct request *r = e->inbox_head;
        e->inbox_head = r->next;
        e->num_inbox--;
        sched_add(&e->sched, r);
    }
    e->inbox_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    while (e->sched.num_running) finish(e, e->sched.running[0], VLLM_FINISH_ABORT, VLLM_ERR_SHUTDOWN, "engine shut down");
    while (e->sched.wait_head) finish(e, e->sched.wait_head, VLLM_FINISH_ABORT, VLLM_ERR_SHUTDOWN, "engine shut down");
}
