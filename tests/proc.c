// proc.c - tu_run: fork + exec with a pipe for the output and a deadline.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/common.h"
#include "proc.h"

int tu_run(char *const argv[], double timeout_s, struct tu_proc *p) {
    memset(p, 0, sizeof *p);
    p->exit_code = -1;
    int fds[2];
    if (pipe(fds)) return -1;
    double t0 = now_s();
    pid_t pid = fork();
    if (pid < 0) return close(fds[0]), close(fds[1]), -1;
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    size_t cap = 4096;
    p->out = xmalloc(cap);
    int open_pipe = 1;
    while (open_pipe) {
        double left = timeout_s - (now_s() - t0);
        if (left <= 0) {
            kill(pid, SIGKILL);
            p->timed_out = 1;
            break;
        }
        struct pollfd pf = {fds[0], POLLIN, 0};
        int r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        if (p->out_len + 4097 > cap) p->out = xrealloc(p->out, cap *= 2);
        ssize_t n = read(fds[0], p->out + p->out_len, 4096);
        if (n <= 0) open_pipe = 0;
        else p->out_len += (size_t)n;
    }
    close(fds[0]);
    p->out[p->out_len] = 0;
    int st;
    // the pipe closes at exit, but a child may have closed it early: wait with the deadline too
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (now_s() - t0 > timeout_s && !p->timed_out) {
            kill(pid, SIGKILL);
            p->timed_out = 1;
        }
        usleep(2000);
    }
    p->wall_s = now_s() - t0;
    if (WIFEXITED(st)) p->exit_code = WEXITSTATUS(st);
    if (WIFSIGNALED(st)) p->signal = WTERMSIG(st);
    return 0;
}

void tu_proc_free(struct tu_proc *p) {
    free(p->out);
    p->out = NULL;
}
