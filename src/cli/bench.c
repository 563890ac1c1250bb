// bench.c - `vllm bench`: offline throughput and latency through the C API.
//
// Per batch size B, B requests of --input-len random prompt tokens are
// submitted at once and each generates --output-len tokens (greedy, EOS
// ignored). Prefill tok/s counts prompt tokens until the last request has its
// first token; decode tok/s counts the remaining tokens over the time after
// that; TTFT and TPOT are means over requests. The decode roofline fraction
// takes the time of a step while all B requests decode (bench_steady_step),
// not TPOT, which also counts the steps that carry other requests' prefills.
//
// --quantization A,B,... runs the batch workload once per format, one engine
// at a time, and adds each figure as a multiple of the first format's.
//
// --workload throughput (vLLM's offline throughput benchmark): --num-prompts
// requests submitted at once, --max-num-seqs of them running at a time;
// output and total tok/s over the whole run, TTFT and TPOT percentiles.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "core/common.h"
#include "engine/engine.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: vllm bench --model DIR [options]\n\n"
            "  --batch-sizes LIST   concurrent requests per run (default 1,8,32)\n"
            "  --input-len N        prompt tokens per request (default 512)\n"
            "  --output-len N       generated tokens per request (default 128)\n"
            "  --warmup N           warm-up requests before the runs (default 1)\n"
            "  --json               print one JSON object instead of a table (a line per format)\n"
            "  --quantization A,B   (a list) each format loaded in turn, then decode and prefill tok/s\n"
            "                       side by side as multiples of the first's: none,fp8,nvfp4\n"
            "  --workload chat      multi-turn chat instead (bench_chat.c), prefix caching off then on:\n"
            "    --conversations N  (default 8)   --turns T (default 4)   --system-len N (default 2000)\n"
            "    --user-len N (default 100)       --reply-len N (default 100)\n"
            "  --workload throughput  --num-prompts N requests at once (default 1000), --max-num-seqs\n"
            "                       of them running at a time: output tok/s, TTFT / TPOT p50 and p99\n\n"
            "engine (a config-only directory works with --load-format dummy):\n%s",
            cli_engine_help);
}

struct breq {
    double t_submit, t_first, t_last;
    int n;      // tokens
    int nt;     // of them with their time in tt (the batch runs: up to out_len)
    double *tt;
};

struct bstate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, out_len;
};

struct bref {
    struct bstate *st;
    struct breq *r;
};

static void bench_cb(void *user, const struct vllm_output *o) {
    struct bref *ref = user;
    double t = now_s();
    pthread_mutex_lock(&ref->st->mu);
    if (o->num_token_ids) {
        struct breq *r = ref->r;
        if (!r->n) r->t_first = t;
        r->t_last = t;
        r->n += o->num_token_ids;
        for (int i = 0; i < o->num_token_ids && r->nt < ref->st->out_len; i++) r->tt[r->nt++] = t;
    }
    if (o->finish_reason != VLLM_FINISH_NONE) {
        ref->st->pending--;
        pthread_cond_signal(&ref->st->cv);
    }
    pthread_mutex_unlock(&ref->st->mu);
}

struct result {
    int batch;
    double prefill_tps, decode_tps, ttft_ms, tpot_ms, wall_s;
    double step_ms; // a decode step while all the batch decodes (0: none measured)
    double decode_bytes, decode_frac, prefill_flops, prefill_frac; // the roofline (frac < 0: limits not measured)
};

// The roofline of a run (struct model_cost): a decode step reads the dense
// weights once, each expert its tokens route to once (expected distinct
// experts of B tokens picking k of E: E (1 - (1 - k/E)^B)), every sequence's
// KV at the mean decode context and its state (read and written); a prefill
// token costs its weights' FLOPs and attention over half its prompt.
static void roofline(struct result *r, const struct model_cost *c, int kv_es, int in_len, int out_len, double bw,
                     double fl) {
    double B = r->batch, touched = 0;
    if (c->moe_layers) touched = c->experts * (1 - pow(1 - (double)c->top_k / c->experts, B));
    double ctx = in_len + out_len / 2.0;
    r->decode_bytes = c->dense_bytes + c->moe_layers * touched * c->expert_bytes +
                      B * (ctx * c->kv_elems_per_token * kv_es + 2.0 * c->state_bytes_per_seq);
    r->prefill_flops = c->dense_flops + c->moe_layers * c->top_k * c->expert_flops + c->attn_flops_per_ctx * in_len / 2.0;
    r->decode_frac = bw > 0 && r->step_ms > 0 ? r->decode_bytes / (r->step_ms * 1e-3) / bw : -1;
    r->prefill_frac = fl > 0 ? r->prefill_tps * r->prefill_flops / fl : -1;
}

// keep: the per-request times, handed to the caller (NULL: freed)
static int run_batch(struct vllm_engine *e, int B, int in_len, int out_len, int vocab, uint64_t seed, struct result *res,
                     struct breq **keep) {
    int rec = keep ? 0 : out_len; // token times: the batch runs' roofline (not the throughput workload's)
    struct bstate st = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, B, rec};
    struct breq *rq = xcalloc(B, sizeof *rq);
    double *tt = xcalloc((size_t)B * rec + 1, sizeof *tt); // [B][rec]
    int *nts = xcalloc(B, sizeof *nts);
    for (int b = 0; b < B; b++) rq[b].tt = tt + (size_t)b * rec;
    struct bref *refs = xcalloc(B, sizeof *refs);
    struct vllm_request **h = xcalloc(B, sizeof *h);
    int32_t *ids = xmalloc(sizeof(int32_t) * in_len);
    struct vllm_sampling_params sp;
    vllm_sampling_params_default(&sp);
    sp.temperature = 0;
    sp.ignore_eos = 1;
    sp.max_tokens = out_len;
    int rc = 0;
    double t0 = now_s();
    for (int b = 0; b < B && !rc; b++) {
        for (int i = 0; i < in_len; i++) { // distinct random prompts
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((seed >> 33) % (uint64_t)vocab);
        }
        struct vllm_prompt p;
        vllm_prompt_default(&p);
        p.token_ids = ids;
        p.num_token_ids = in_len;
        refs[b] = (struct bref){&st, &rq[b]};
        rq[b].t_submit = now_s();
        rc = vllm_submit(e, &p, &sp, bench_cb, &refs[b], &h[b]);
        if (rc) {
            pthread_mutex_lock(&st.mu);
            st.pending -= B - b;
            pthread_mutex_unlock(&st.mu);
        }
    }
    pthread_mutex_lock(&st.mu);
    while (st.pending > 0) pthread_cond_wait(&st.cv, &st.mu);
    pthread_mutex_unlock(&st.mu);
    double first_all = 0, last_all = 0, ttft = 0, tpot = 0;
    for (int b = 0; b < B; b++) {
        if (h[b]) vllm_request_free(h[b]);
        first_all = MAX(first_all, rq[b].t_first);
        last_all = MAX(last_all, rq[b].t_last);
        ttft += rq[b].t_first - rq[b].t_submit;
        if (rq[b].n > 1) tpot += (rq[b].t_last - rq[b].t_first) / (rq[b].n - 1);
    }
    res->batch = B;
    res->prefill_tps = (double)B * in_len / (first_all - t0);
    res->decode_tps = out_len > 1 ? (double)B * (out_len - 1) / (last_all - first_all) : 0;
    res->ttft_ms = 1e3 * ttft / B;
    res->tpot_ms = 1e3 * tpot / B;
    res->wall_s = last_all - t0;
    for (int b = 0; b < B; b++) nts[b] = rq[b].nt, rq[b].tt = NULL; // tt is freed here
    res->step_ms = 1e3 * bench_steady_step(tt, rec, nts, B);
    if (keep) *keep = rq;
    else free(rq);
    free(refs), free(h), free(ids), free(tt), free(nts);
    return rc;
}

// --workload throughput: n requests at once on a loaded engine.
static int run_throughput(struct vllm_engine *e, int n, int in_len, int out_len, int vocab, int json) {
    struct result r;
    struct breq *rq = NULL;
    int rc = run_batch(e, n, in_len, out_len, vocab, 2000, &r, &rq);
    if (rc) {
        fprintf(stderr, "vllm bench: %s\n", vllm_last_error());
        free(rq);
        return 1;
    }
    double *ttft = xcalloc(n, sizeof *ttft), *tpot = xcalloc(n, sizeof *tpot);
    int64_t out = 0;
    for (int i = 0; i < n; i++) {
        ttft[i] = 1e3 * (rq[i].t_first - rq[i].t_submit);
        tpot[i] = rq[i].n > 1 ? 1e3 * (rq[i].t_last - rq[i].t_first) / (rq[i].n - 1) : 0;
        out += rq[i].n;
    }
    double out_tps = out / r.wall_s, tot_tps = ((double)n * in_len + out) / r.wall_s;
    double t50 = bench_pct(ttft, n, 0.5), t99 = bench_pct(ttft, n, 0.99);
    double p50 = bench_pct(tpot, n, 0.5), p99 = bench_pct(tpot, n, 0.99);
    if (json)
        printf("{\"workload\": \"throughput\", \"num_prompts\": %d, \"input_len\": %d, \"output_len\": %d, "
               "\"output_tokens\": %lld, \"wall_s\": %.3f, \"requests_per_s\": %.3f, \"output_tok_s\": %.2f, \"total_tok_s\": %.2f, "
               "\"ttft_p50_ms\": %.2f, \"ttft_p99_ms\": %.2f, \"tpot_p50_ms\": %.3f, \"tpot_p99_ms\": %.3f}\n",
               n, in_len, out_len, (long long)out, r.wall_s, n / r.wall_s, out_tps, tot_tps, t50, t99, p50, p99);
    else
        printf("throughput: %d requests of %d + %d tokens in %.2f s: %.2f req/s, %.1f output tok/s, %.1f total tok/s\n"
               "TTFT p50 %.1f ms, p99 %.1f ms; TPOT p50 %.2f ms, p99 %.2f ms\n",
               n, in_len, out_len, r.wall_s, n / r.wall_s, out_tps, tot_tps, t50, t99, p50, p99);
    free(ttft), free(tpot), free(rq);
    return 0;
}

struct int_flag {
    const char *flag;
    int *v;
};

// A --workload chat option: 1 when argv[*i] is one (*bad set on a bad value).
static int chat_flag(int argc, char **argv, int *i, const struct int_flag *o, int n, int *bad) {
    for (int k = 0; k < n; k++)
        if (!strcmp(argv[*i], o[k].flag)) {
            const char *v = cli_value(argc, argv, i);
            *bad = !v || cli_int(o[k].flag, v, 1, 1 << 20, o[k].v);
            return 1;
        }
    return 0;
}

// The loaded engine's table: a JSON object, or the text table.
static void bench_print(const struct vllm_engine_params *ep, const struct vllm_model_info *info, double tl, int in_len,
                        int out_len, double bw, double fl, const struct result *res, int nb, int json) {
    const char *quant = ep->quantization ? ep->quantization : "auto";
    if (json) {
        printf("{\"model\": \"%s\", \"architecture\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", \"quantization\": \"%s\", "
               "\"threads\": %d, \"tensor_parallel_size\": %d, \"load_format\": \"%s\", \"weight_bytes\": %lld, "
               "\"load_s\": %.3f, \"kv_cache_dtype\": \"%s\", \"num_kv_blocks\": %d, \"kv_cache_bytes\": %lld, "
               "\"input_len\": %d, \"output_len\": %d, \"device_bytes_per_s\": %.4g, \"device_flops_per_s\": %.4g, "
               "\"results\": [",
               info->model_name, info->architecture, ep->device, ep->dtype, quant, ep->num_threads,
               MAX(ep->tensor_parallel_size, 1), ep->load_format, (long long)info->weight_bytes, tl,
               info->kv_cache_dtype, info->num_kv_blocks, (long long)info->kv_cache_bytes, in_len, out_len, bw, fl);
        for (int i = 0; i < nb; i++)
            printf("%s{\"batch_size\": %d, \"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"ttft_ms\": %.3f, "
                   "\"tpot_ms\": %.3f, \"decode_step_ms\": %.3f, \"wall_s\": %.3f, \"decode_bytes_per_step\": %.0f, "
                   "\"decode_roofline_frac\": %.4f, \"prefill_flops_per_token\": %.0f, \"prefill_peak_frac\": %.4f}",
                   i ? ", " : "", res[i].batch, res[i].prefill_tps, res[i].decode_tps, res[i].ttft_ms, res[i].tpot_ms,
                   res[i].step_ms, res[i].wall_s, res[i].decode_bytes, res[i].decode_frac, res[i].prefill_flops,
                   res[i].prefill_frac);
        printf("]}\n");
        return;
    }
    printf("model %s (%s), device %s x %d, dtype %s, quantization %s, weights %.1f MB, loaded in %.2f s\n",
           info->model_name, info->architecture, ep->device, MAX(ep->tensor_parallel_size, 1), ep->dtype, quant,
           info->weight_bytes / 1e6, tl);
    printf("KV cache %s: %d blocks x %d tokens (%lld tokens, %.1f MB)\n", info->kv_cache_dtype, info->num_kv_blocks,
           info->block_size, (long long)info->num_kv_blocks * info->block_size, info->kv_cache_bytes / 1e6);
    printf("input %d, output %d tokens per request; device limits measured now: %.3g GB/s copy, %.3g TFLOP/s "
           "16-bit GEMM\n", in_len, out_len, bw / 1e9, fl / 1e12);
    printf("%6s %14s %14s %10s %10s %10s %8s %12s %8s\n", "batch", "prefill tok/s", "decode tok/s", "TTFT ms",
           "TPOT ms", "MB/step", "of BW", "GFLOP/tok", "of peak");
    for (int i = 0; i < nb; i++) {
        char df[16] = "-", pf[16] = "-"; // no fraction: no decode step (output 1), or limits not measured
        if (res[i].decode_frac >= 0) snprintf(df, sizeof df, "%.1f%%", 100 * res[i].decode_frac);
        if (res[i].prefill_frac >= 0) snprintf(pf, sizeof pf, "%.1f%%", 100 * res[i].prefill_frac);
        printf("%6d %14.1f %14.1f %10.1f %10.2f %10.1f %8s %12.2f %8s\n", res[i].batch, res[i].prefill_tps,
               res[i].decode_tps, res[i].ttft_ms, res[i].tpot_ms, res[i].decode_bytes / 1e6, df,
               res[i].prefill_flops / 1e9, pf);
    }
}

struct bench_run {
    const int32_t *bs; // batch sizes
    int nb, in_len, out_len, warmup, nprompts, json;
};

// One engine, loaded from ep: the warm-up, then the throughput workload, or
// each batch size and its roofline (res [nb]); prints its table. 0, or with
// the error said 2 (the load failed) or 1.
static int bench_engine(const struct vllm_engine_params *ep, const struct bench_run *b, struct result *res) {
    struct vllm_engine *e;
    double tl = now_s();
    if (vllm_engine_load(ep, &e)) {
        fprintf(stderr, "vllm bench: %s\n", vllm_last_error());
        return 2;
    }
    tl = now_s() - tl;
    struct vllm_model_info info;
    vllm_engine_info(e, &info);
    int rc = 0;
    if (b->warmup) {
        struct result w;
        rc = run_batch(e, b->warmup, MIN(b->in_len, 64), MIN(b->out_len, 4), info.vocab_size, 7, &w, NULL);
    }
    if (!rc && b->nprompts) {
        rc = run_throughput(e, b->nprompts, b->in_len, b->out_len, info.vocab_size, b->json);
        vllm_engine_free(e);
        return rc;
    }
    for (int i = 0; i < b->nb && !rc; i++)
        rc = run_batch(e, b->bs[i], b->in_len, b->out_len, info.vocab_size, 1000 + i, &res[i], NULL);
    double bw = 0, fl = 0; // measured in this run, after the timed ones
    if (!rc && engine_peaks(e, &bw, &fl)) bw = fl = 0;
    struct model_cost cost;
    int kv_es;
    engine_cost(e, &cost, &kv_es);
    for (int i = 0; i < b->nb && !rc; i++) roofline(&res[i], &cost, kv_es, b->in_len, b->out_len, bw, fl);
    if (rc) fprintf(stderr, "vllm bench: %s\n", vllm_last_error());
    else bench_print(ep, &info, tl, b->in_len, b->out_len, bw, fl, res, b->nb, b->json);
    vllm_engine_free(e);
    return rc ? 1 : 0;
}

// The entries of a comma-separated list, n of them, in one copy of s
// (v[0] owns it: free(v[0]), free(v)); an empty entry is "".
static char **split_list(const char *s, int *n) {
    char *c = xstrdup(s);
    *n = 1;
    for (const char *p = c; *p; p++) *n += *p == ',';
    char **v = xcalloc(*n, sizeof *v);
    v[0] = c;
    for (int i = 1; i < *n; i++) {
        c = strchr(c, ',');
        *c++ = 0;
        v[i] = c;
    }
    return v;
}

static void free_list(char **v) {
    if (v) free(v[0]);
    free(v);
}

// --quantization A,B,...: each format's engine in turn (one at a time: the
// last is freed before the next loads), then decode and prefill tok/s of
// every format side by side, each as a multiple of the first's: the ratios
// taken in one run.
static void bench_compare(char **quants, int nq, const struct bench_run *b, const struct result *res) {
    const char *what[2] = {"decode", "prefill"};
    for (int m = 0; m < 2; m++) {
        printf("\n%s tok/s by --quantization (x %s):\n%6s", what[m], quants[0], "batch");
        for (int q = 0; q < nq; q++) printf(" %19s", quants[q]);
        printf("\n");
        for (int i = 0; i < b->nb; i++) {
            printf("%6d", b->bs[i]);
            for (int q = 0; q < nq; q++) {
                const struct result *r = &res[q * b->nb + i], *r0 = &res[i];
                double v = m ? r->prefill_tps : r->decode_tps, v0 = m ? r0->prefill_tps : r0->decode_tps;
                printf(" %12.1f %5.2fx", v, v0 > 0 ? v / v0 : 0.0);
            }
            printf("\n");
        }
    }
}

int cli_bench(int argc, char **argv) {
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    const char *sizes = "1,8,32", *v;
    int in_len = 512, out_len = 128, json = 0, warmup = 1, chat = 0, nprompts = 0, throughput = 0;
    struct chat_opts co = {8, 4, 2000, 100, 100};
    struct int_flag copts[] = {{"--conversations", &co.conversations}, {"--turns", &co.turns},
        {"--system-len", &co.system_len}, {"--user-len", &co.user_len}, {"--reply-len", &co.reply_len}};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int r = cli_engine_flag(argc, argv, &i, &ep);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) return usage(stdout), 0;
        else if (!strcmp(f, "--batch-sizes")) { if (!(sizes = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(f, "--input-len")) { if (!(v = cli_value(argc, argv, &i)) || cli_int(f, v, 1, 1 << 24, &in_len)) return 2; }
        else if (!strcmp(f, "--output-len")) { if (!(v = cli_value(argc, argv, &i)) || cli_int(f, v, 1, 1 << 24, &out_len)) return 2; }
        else if (!strcmp(f, "--warmup")) { if (!(v = cli_value(argc, argv, &i)) || cli_int(f, v, 0, 100, &warmup)) return 2; }
        else if (!strcmp(f, "--json")) json = 1;
        else if (!strcmp(f, "--workload")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!strcmp(v, "chat")) chat = 1;
            else if (!strcmp(v, "throughput")) throughput = 1;
            else return fprintf(stderr, "vllm bench: unknown workload '%s' (expected chat or throughput)\n", v), 2;
        } else if (!strcmp(f, "--num-prompts")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_int(f, v, 1, 1 << 20, &nprompts)) return 2;
        } else if (chat_flag(argc, argv, &i, copts, 5, &r)) {
            if (r) return 2;
        }
        else {
            fprintf(stderr, "vllm bench: unknown option '%s'\n", f);
            usage(stderr);
            return 2;
        }
    }
    if (!ep.model) return usage(stderr), 2;
    char **quants = NULL;
    int nq = 1;
    if (ep.quantization && strchr(ep.quantization, ',')) {
        if (chat || throughput)
            return fprintf(stderr, "vllm bench: a list of --quantization goes with the batch workload\n"), 2;
        quants = split_list(ep.quantization, &nq);
        for (int q = 0; q < nq; q++)
            if (!*quants[q]) {
                fprintf(stderr, "vllm bench: --quantization: '%s' has an empty entry\n", ep.quantization);
                free_list(quants);
                return 2;
            }
    }
    if (chat) {
        cli_device_memory_default(&ep);
        if (ep.max_num_seqs < co.conversations) ep.max_num_seqs = co.conversations;
        if (!ep.max_model_len) ep.max_model_len = co.system_len + co.turns * (co.user_len + co.reply_len) + 1;
        return bench_chat(&ep, &co, json);
    }
    if (nprompts && !throughput) return fprintf(stderr, "vllm bench: --num-prompts goes with --workload throughput\n"), 2;
    if (throughput && !nprompts) nprompts = 1000;
    int32_t *bs;
    int nb = cli_ids(sizes, &bs), bad = nb <= 0;
    for (int i = 0; i < nb; i++) bad |= bs[i] < 1 || bs[i] > 4096;
    if (bad) {
        fprintf(stderr, "vllm bench: --batch-sizes: '%s' is not a comma-separated list of sizes in [1, 4096]\n", sizes);
        free_list(quants);
        free(bs);
        return 2;
    }
    int maxb = 0;
    for (int i = 0; i < nb; i++) maxb = MAX(maxb, bs[i]);
    if (ep.max_num_seqs < maxb && !nprompts) ep.max_num_seqs = maxb; // throughput: --max-num-seqs as given
    if (!ep.max_model_len) ep.max_model_len = in_len + out_len;
    cli_device_memory_default(&ep);
    struct bench_run b = {bs, nb, in_len, out_len, warmup, nprompts, json};
    struct result *res = xcalloc((size_t)nq * nb, sizeof *res);
    int rc = 0;
    for (int q = 0; q < nq && !rc; q++) {
        if (quants) ep.quantization = quants[q];
        if (q && !json) printf("\n");
        rc = bench_engine(&ep, &b, res + (size_t)q * nb);
    }
    if (!rc && nq > 1 && !json) bench_compare(quants, nq, &b, res);
    free_list(quants);
    free(res);
    free(bs);
    return rc;
}
