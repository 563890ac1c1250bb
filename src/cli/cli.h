// cli.h - the `vllm` command's subcommands.
#ifndef VLLM_CLI_H
#define VLLM_CLI_H

int cli_generate(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_serve(int argc, char **argv);

#endif
