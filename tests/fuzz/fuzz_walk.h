// fuzz_walk.h - the byte walk the grammar harnesses share: at each step the
// first byte, in the order start + kmul * i, that keeps the text a viable
// prefix of g; where none does, the text must be complete (pruning keeps only
// viable states). The walk is one simulation advanced a byte at a time (a
// replay from the start for every candidate made the harness quadratic: 10 s
// on `0}({?){499}` under the fuzzer's instrumentation), and the candidates
// are read off the states' edges. Then a matcher must
// accept the text and agree on whether it is complete. Aborts on a mismatch.
#ifndef VLLM_TESTS_FUZZ_WALK_H
#define VLLM_TESTS_FUZZ_WALK_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "structured/sg_internal.h"

struct fuzz_walk_cfg {
    int steps;               // bytes at most
    unsigned kmul;           // candidate order: start + kmul * i
    unsigned smul, sadd;     // the next step's start: start * smul + sadd
};

static void fuzz_walk(const struct sg_grammar *g, unsigned start, const struct fuzz_walk_cfg *c) {
    char text[128];
    size_t n = 0;
    struct sg_frames f;
    sg_frames_init(&f);
    struct sg_set cur = {0}, closed = {0}, next = {0};
    sg_set_add(&cur, sg_frame(&f, g->rule_start[g->root], 0));
    int complete = 0;
    sg_close(g, &f, &cur, &closed, &complete, -1); // closed: the states after text[0, n)
    for (int step = 0; step < c->steps && n < sizeof text; step++) {
        // The bytes some state has an edge on: one pass over the states (a
        // sg_step per candidate byte cost 256 steps: 6 s on `0}({?){499}`).
        uint8_t on[256] = {0};
        for (int i = 0; i < closed.n; i++) {
            const struct sg_node *nd = &g->nodes[f.node[closed.v[i]]];
            for (const struct sg_edge *e = g->edges + nd->edge0, *end = e + nd->n_edges; e < end; e++)
                memset(on + e->lo, 1, (size_t)e->hi - e->lo + 1);
        }
        int found = 0;
        for (unsigned k = 0; k < 256 && !found; k++) {
            uint8_t b = (uint8_t)((start + k * c->kmul) & 255);
            if (on[b]) text[n] = (char)b, found = 1;
        }
        if (!found) {
            if (!complete) abort(); // a dead end must be a complete text
            break;
        }
        sg_step(g, &f, &closed, (uint8_t)text[n], &next);
        if (next.n == 0) abort(); // a byte with an edge must lead somewhere
        n++;
        struct sg_set t = cur;
        cur = next, next = t;
        complete = 0;
        sg_close(g, &f, &cur, &closed, &complete, -1);
        start = start * c->smul + c->sadd;
    }
    sg_set_free(&cur);
    sg_set_free(&closed);
    sg_set_free(&next);
    sg_frames_free(&f);
    struct sg_matcher *m = sg_matcher_create(g, NULL);
    int acc;
    if (!sg_matcher_accept_bytes(m, text, n)) abort();
    if (!sg_grammar_viable(g, text, n, &acc) || acc != sg_matcher_is_accepting(m)) abort();
    sg_matcher_free(m);
}

#endif
