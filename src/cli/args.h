// args.h - flags shared by the `vllm` subcommands.
#ifndef VLLM_CLI_ARGS_H
#define VLLM_CLI_ARGS_H

#include <stdint.h>

#include "vllm.h"

// If argv[*i] is an engine flag, consumes it (and its value) and returns 1;
// returns 0 if it is not one, -1 (after printing why) if its value is bad.
int cli_engine_flag(int argc, char **argv, int *i, struct vllm_engine_params *p);
extern const char *const cli_engine_help;
// vLLM's default for the server and the benchmarks: on CUDA, with no KV size
// given, the KV pool takes 0.9 of the device's memory (the library's own
// default, 2 GiB, is for embedders and tests sharing one GPU).
void cli_device_memory_default(struct vllm_engine_params *p);

// The value of flag argv[*i] (advancing *i), or NULL after printing an error.
const char *cli_value(int argc, char **argv, int *i);
// A flag's value in a range, or -1 after printing a message naming the flag
// and the range: decimal only (no spaces, hex, nan, inf or trailing junk).
int cli_int(const char *flag, const char *v, long min, long max, int *out);
// [min, max], or (min, max] with min_open.
int cli_number(const char *flag, const char *v, double min, double max, int min_open, double *out);
int cli_float(const char *flag, const char *v, double min, double max, float *out); // [min, max]
// "1,2,3" -> ids (malloc'd). Returns the count, -1 on a bad list.
int cli_ids(const char *s, int32_t **ids);

#endif
