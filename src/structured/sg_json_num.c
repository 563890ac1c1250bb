// sg_json_num.c - JSON numbers within bounds, as IR. Integers in [lo, hi]
// become exact digit patterns (the classic range-to-regex split by digit
// count and leading digit). A bounded `number` is an allowed integer, or
// k.fraction with the whole interval [k, k+1] (or [-(k+1), -k]) inside the
// bounds: tighter than the schema near a fractional bound, never looser.
// Bounded numbers have no exponent; unbounded ones keep JSON's full syntax
// with at most 16 integer and fraction digits and a 2-digit exponent (so
// that every value parses as a finite double).
#include <math.h>

#include "core/common.h"
#include "structured/sg_internal.h"

static struct sg_expr *digits(struct sg_ir *ir, char lo, char hi) {
    uint32_t r[2] = {(uint32_t)lo, (uint32_t)hi};
    return sg_class(ir, r, 1, 0);
}

// Decimal strings of equal length n from a to b (a <= b, digit strings).
static struct sg_expr *same_len(struct sg_ir *ir, const char *a, const char *b, int n) {
    if (n == 0) return sg_empty(ir);
    int all_lo = 1, all_hi = 1; // a's tail all '0', b's tail all '9'
    for (int i = 1; i < n; i++) all_lo &= a[i] == '0', all_hi &= b[i] == '9';
    if (a[0] == b[0]) return sg_seqv(ir, sg_lit(ir, a, 1), same_len(ir, a + 1, b + 1, n - 1), NULL);
    if (all_lo && all_hi) return sg_seqv(ir, digits(ir, a[0], b[0]), sg_rep(ir, digits(ir, '0', '9'), n - 1, n - 1), NULL);
    struct sg_expr *alt = sg_alt(ir);
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    char lo0 = a[0], hi0 = b[0];
    if (all_lo) sg_push(alt, sg_seqv(ir, digits(ir, a[0], a[0]), sg_rep(ir, digits(ir, '0', '9'), n - 1, n - 1), NULL));
    else sg_push(alt, sg_seqv(ir, sg_lit(ir, a, 1), same_len(ir, a + 1, nines, n - 1), NULL));
    if (lo0 + 1 <= hi0 - 1)
        sg_push(alt, sg_seqv(ir, digits(ir, (char)(lo0 + 1), (char)(hi0 - 1)), sg_rep(ir, digits(ir, '0', '9'), n - 1, n - 1), NULL));
    if (all_hi) sg_push(alt, sg_seqv(ir, digits(ir, b[0], b[0]), sg_rep(ir, digits(ir, '0', '9'), n - 1, n - 1), NULL));
    else sg_push(alt, sg_seqv(ir, sg_lit(ir, b, 1), same_len(ir, zeros, b + 1, n - 1), NULL));
    return alt;
}

// Non-negative integers in [a, b] without leading zeros; b < 0: no bound.
static struct sg_expr *nonneg(struct sg_ir *ir, int64_t a, int64_t b) {
    struct sg_expr *alt = sg_alt(ir);
    char as[24], bs[24];
    int la = snprintf(as, sizeof as, "%lld", (long long)a);
    int lb = b >= 0 ? snprintf(bs, sizeof bs, "%lld", (long long)b) : 99;
    for (int len = la; len <= MIN(lb, 19); len++) {
        char lo[24], hi[24];
        if (len == la) memcpy(lo, as, (size_t)len + 1);
        else {
            memset(lo, '0', (size_t)len);
            lo[0] = '1';
            lo[len] = 0;
        }
        if (len == lb) memcpy(hi, bs, (size_t)len + 1);
        else if (b < 0 && len > la) { // every longer length: one pattern
            sg_push(alt, sg_seqv(ir, digits(ir, '1', '9'), sg_rep(ir, digits(ir, '0', '9'), len - 1, 15), NULL));
            break;
        } else {
            memset(hi, '9', (size_t)len);
            hi[len] = 0;
        }
        if (len == 1 && lo[0] == '0' && hi[0] == '0') sg_push(alt, sg_lits(ir, "0"));
        else sg_push(alt, same_len(ir, lo, hi, len));
    }
    return alt;
}

// Integers in [lo, hi] (INT64_MIN / INT64_MAX: unbounded); never "-0".
struct sg_expr *sg_json_int_range(struct sg_ir *ir, int64_t lo, int64_t hi) {
    struct sg_expr *alt = sg_alt(ir);
    if (lo > hi) return alt;
    if (lo < 0) { // negatives: "-" and magnitudes in [max(1, -hi), -lo]
        int64_t mlo = hi < 0 ? (hi == INT64_MIN ? INT64_MAX : -hi) : 1;
        int64_t mhi = lo == INT64_MIN ? -1 : -lo;
        sg_push(alt, sg_seqv(ir, sg_lits(ir, "-"), nonneg(ir, mlo, mhi), NULL));
    }
    if (hi >= 0) sg_push(alt, nonneg(ir, MAX(lo, 0), hi == INT64_MAX ? -1 : hi));
    return alt;
}

static struct sg_expr *fraction(struct sg_ir *ir) {
    return sg_seqv(ir, sg_lits(ir, "."), sg_rep(ir, digits(ir, '0', '9'), 1, 16), NULL);
}

struct sg_expr *sg_json_number_any(struct sg_ir *ir, int integer) {
    struct sg_expr *in = sg_seqv(ir, sg_opt(ir, sg_lits(ir, "-")),
                                 sg_altv(ir, sg_lits(ir, "0"),
                                         sg_seqv(ir, digits(ir, '1', '9'), sg_rep(ir, digits(ir, '0', '9'), 0, 15), NULL),
                                         NULL),
                                 NULL);
    if (integer) return in;
    uint32_t e[4] = {'E', 'E', 'e', 'e'}, pm[4] = {'+', '+', '-', '-'};
    struct sg_expr *ex = sg_seqv(ir, sg_class(ir, e, 2, 0), sg_opt(ir, sg_class(ir, pm, 2, 0)),
                                 sg_rep(ir, digits(ir, '0', '9'), 1, 2), NULL);
    return sg_seqv(ir, in, sg_opt(ir, fraction(ir)), sg_opt(ir, ex), NULL);
}

// Bounds as doubles (+-INFINITY: none); ex_*: exclusive.
static int64_t clamp_i64(double x) {
    if (x <= -9.2e18) return INT64_MIN;
    if (x >= 9.2e18) return INT64_MAX;
    return (int64_t)x;
}

// The smallest integer allowed by the lower bound, the largest by the upper.
static int64_t int_lo(double lo, int ex) {
    if (isinf(lo)) return INT64_MIN;
    double c = ceil(lo);
    if (ex && c == lo) c += 1;
    return clamp_i64(c);
}

static int64_t int_hi(double hi, int ex) {
    if (isinf(hi)) return INT64_MAX;
    double f = floor(hi);
    if (ex && f == hi) f -= 1;
    return clamp_i64(f);
}

struct sg_expr *sg_json_number_range(struct sg_ir *ir, int integer, double lo, int ex_lo, double hi, int ex_hi) {
    int64_t a = int_lo(lo, ex_lo), b = int_hi(hi, ex_hi);
    struct sg_expr *ints = sg_json_int_range(ir, a, b);
    if (integer) return ints;
    struct sg_expr *alt = sg_altv(ir, ints, NULL);
    // k.fraction (k >= 0) lies in [k, k+1): it needs k allowed as an integer
    // and k + 1 <= hi; -k.fraction lies in (-(k+1), -k]: it needs -k allowed
    // and -(k+1) >= lo.
    int64_t ka = MAX(0, a), kb = isinf(hi) ? INT64_MAX : clamp_i64(floor(hi)) - 1;
    if (ka <= kb) sg_push(alt, sg_seqv(ir, nonneg(ir, ka, kb == INT64_MAX ? -1 : kb), fraction(ir), NULL));
    int64_t na = isinf(hi) ? 0 : MAX(0, int_lo(-hi, ex_hi));
    int64_t nb = isinf(lo) ? INT64_MAX : clamp_i64(floor(-lo)) - 1;
    if (na <= nb) sg_push(alt, sg_seqv(ir, sg_lits(ir, "-"), nonneg(ir, na, nb == INT64_MAX ? -1 : nb), fraction(ir), NULL));
    return alt;
}
