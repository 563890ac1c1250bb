// cli.h - the `vllm` command's subcommands.
#ifndef VLLM_CLI_H
#define VLLM_CLI_H

int cli_generate(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_serve(int argc, char **argv);

#include "vllm.h"

// `vllm bench --workload chat` (bench_chat.c): caching off, then on.
struct chat_opts {
    int conversations, turns, system_len, user_len, reply_len;
};
int bench_chat(const struct vllm_engine_params *base, const struct chat_opts *o, int json);
// The p-quantile (p in [0, 1]) of v[0..n), nearest rank; sorts v. 0 for n = 0.
double bench_pct(double *v, int n, double p);
// The time of a decode step (s) while all B requests decode at once, from
// each request's token times tt[b * stride + 0 .. n[b]) (the first: its first
// token, the end of its prefill): 0 when no two steps fit between the last
// request's first token and the first request's last.
double bench_steady_step(const double *tt, int stride, const int *n, int B);

#endif
