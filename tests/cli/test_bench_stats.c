// test_bench_stats.c - bench_steady_step (src/cli/bench_stats.c): the decode
// step of a batch that decodes together, from token times shaped as a
// chunked-prefill run makes them: requests finish their prefills a few slow
// steps apart, and those mixed steps must not count as decode steps.
#include <math.h>

#include "cli/cli.h"
#include "test.h"

#define B 4
#define OUT 20

int main(void) {
    // Steps: request b's prefill ends at step 2b (its first token); steps up
    // to the last prefill's (2B - 2) carry prefill chunks and take 50 ms,
    // later ones 10 ms. Request
    // b's tokens come at steps 2b .. 2b + OUT - 1; a callback of step s
    // reaches request b at step_end(s) + 1e-6 * b (delivery order).
    double step_end[2 * B + OUT], t = 0, tt[B][OUT];
    for (int s = 0; s < 2 * B + OUT; s++) step_end[s] = t += s <= 2 * B - 2 ? 0.050 : 0.010;
    int n[B];
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < OUT; i++) tt[b][i] = step_end[2 * b + i] + 1e-6 * b;
        n[b] = OUT;
    }
    double step = bench_steady_step(&tt[0][0], OUT, n, B);
    printf("steady step %.4f s (10 ms steps after mixed 50 ms ones)\n", step);
    CHECKF(fabs(step - 0.010) < 1e-5, "steady step %.6f s, want 0.010", step);
    // the TPOT mean would count the mixed steps: above 10 ms for request 0
    CHECKF((tt[0][OUT - 1] - tt[0][0]) / (OUT - 1) > 0.015, "the fixture's mixed steps do not slow TPOT");
    // one request: its TPOT
    double one = bench_steady_step(&tt[0][0], OUT, n, 1);
    CHECKF(fabs(one - (tt[0][OUT - 1] - tt[0][0]) / (OUT - 1)) < 1e-12, "one request: %.6f, not its TPOT", one);
    // no window: request 0 ends before request 3's first token
    n[0] = 3;
    CHECKF(bench_steady_step(&tt[0][0], OUT, n, B) == 0, "a run with no common decode step gave a step");
    // a request with no token
    n[0] = 0;
    CHECKF(bench_steady_step(&tt[0][0], OUT, n, B) == 0, "a request without tokens gave a step");
    return test_summary("bench stats");
}
