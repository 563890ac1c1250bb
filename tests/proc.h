// proc.h - running a command under a deadline, for tests that check what a
// `vllm` subcommand prints and how it exits.
#ifndef VLLM_TESTS_PROC_H
#define VLLM_TESTS_PROC_H

#include <stddef.h>

struct tu_proc {
    int exit_code;  // -1 unless it exited
    int signal;     // the signal that ended it, or 0
    int timed_out;  // killed at the deadline (signal is then SIGKILL)
    char *out;      // stdout and stderr together (NUL-terminated, malloc'd)
    size_t out_len;
    double wall_s;
};

// Runs argv (argv[0] a path) with stdin from /dev/null and waits at most
// timeout_s. Returns 0 when it could be started.
int tu_run(char *const argv[], double timeout_s, struct tu_proc *p);
void tu_proc_free(struct tu_proc *p);

#endif
