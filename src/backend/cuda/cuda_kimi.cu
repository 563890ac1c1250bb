// cuda_kimi.cu - Kimi-Linear's ops on the GPU, each the CPU reference op of
// the same name (cpu_kimi.c) on the device: the KDA gated delta rule (decode
// token by token, prefill in chunks as fast_kimi.c's), its forget gate and
// gated output norm (MLA is in cuda_mla.cu).
#include "backend/cuda/cuda_common.cuh"

// ------------------------------------------------------------------ KDA --

struct kda_args {
    float *y;
    const float *proj, *g;
    float *state;
    int ld, H, K, seq0, decode;
    const int32_t *qsl, *ctx, *slots, *src, *ck_start, *ck_pos, *ck_slot;
    const int32_t *ck_dst; // decode: batch.ckpt_dst, the checkpoint that also gets the new state (NULL: none)
};

// Both kernels split a head's value columns over blocks (the delta rule
// never mixes them): KDA_BV columns a block, a lane each.
#define KDA_BV 32 // value columns per block: a warp's lanes
#define KDA_THREADS 256
#define KDA_WARPS (KDA_THREADS / 32)
#define KDA_KMAX CUDA_KDA_MAX_HEAD_DIM
#define KDA_NC (KDA_KMAX / 32)        // channels a lane owns at most: lane + 32 c
#define KDA_RS (KDA_KMAX / KDA_WARPS) // state rows per thread at most
static_assert(KDA_KMAX % 32 == 0 && KDA_KMAX % KDA_WARPS == 0, "KDA_KMAX: whole lanes' channels and warps' rows");

// ------------------------------------------------------------- KDA step --
// The recurrence token by token: every decode, and a prefill whose head
// size takes no chunks. Grid (sequence, head, K / KDA_BV rounded up): 128
// blocks for one sequence of Kimi-Linear-48B (32 heads of 128). A block's
// [K, KDA_BV] slice of the state lives in registers: warp w holds rows
// w * rs .. (rs = K / KDA_WARPS rounded up), lane c column j0 + c, all its
// loads issued at once. A token's q, k and g are loaded and normalized by
// every warp itself (lanes own channels lane + 32 m, rows come by shuffles),
// so one barrier a token remains: the column sums over the warps' rows of
//   mem_j = sum_i a_i S_ij k_i     and     P_j = sum_i a_i S_ij q_i,
// whence delta_j = beta (v_j - mem_j) and, with S' = diag(a) S + k delta^T,
//   y_j = sum_i S'_ij q_i = P_j + delta_j (k . q).
struct kda_tok {
    float q[KDA_NC], k[KDA_NC], g[KDA_NC], v, b; // lane's channels of q, k, g; column j's v; beta's logit
};

__device__ __forceinline__ void kda_tok_load(const kda_args &a, kda_tok &x, int64_t t, int h, int j) {
    int K = a.K, HK = a.H * K, lane = threadIdx.x & 31;
    const float *row = a.proj + t * a.ld, *gr = a.g + t * HK + h * K;
#pragma unroll
    for (int c = 0; c < KDA_NC; c++) {
        bool in = lane + 32 * c < K; // zeros past K leave the norms and k . q alone
        x.q[c] = in ? row[h * K + lane + 32 * c] : 0.0f;
        x.k[c] = in ? row[HK + h * K + lane + 32 * c] : 0.0f;
        x.g[c] = in ? gr[lane + 32 * c] : 0.0f;
    }
    x.v = j < K ? row[2 * HK + h * K + j] : 0.0f;
    x.b = row[3 * HK + h];
}

// v[c] for a warp-uniform c (a select chain: no local memory)
__device__ __forceinline__ float kda_pick(const float (&v)[KDA_NC], int c) {
    float r = v[0];
#pragma unroll
    for (int m = 1; m < KDA_NC; m++) r = c == m ? v[m] : r;
    return r;
}

// Copies the thread's rows of the slice to slot `slot` (a.state [slots, H, K, K]).
__device__ __forceinline__ void kda_rows_store(const kda_args &a, const float (&st)[KDA_RS], int slot, int h,
                                               int i0, int nr, int j) {
    float *p = a.state + ((int64_t)slot * a.H + h) * a.K * a.K + (int64_t)i0 * a.K + j;
#pragma unroll
    for (int x = 0; x < KDA_RS; x++)
        if (x < nr) p[(int64_t)x * a.K] = st[x];
}

__global__ void __launch_bounds__(KDA_THREADS, 2) k_kda_step(kda_args a) {
    __shared__ float part[2][2][KDA_WARPS][KDA_BV]; // [token parity][mem | P][warp][column]
    int K = a.K, HK = a.H * K, s = a.seq0 + blockIdx.x, h = blockIdx.y;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, j = blockIdx.z * KDA_BV + lane;
    int rs = (K + KDA_WARPS - 1) / KDA_WARPS, i0 = w * rs, nr = j < K ? min(rs, K - i0) : 0; // nr <= 0: no rows
    int t0 = a.qsl[s], L = a.qsl[s + 1] - t0, p0 = a.ctx[s], own = a.slots[s];
    int src = a.decode ? own : a.src[s]; // a decode continues its own slot
    float st[KDA_RS];
    const float *sp = a.state + ((int64_t)max(src, 0) * a.H + h) * K * K + (int64_t)i0 * K + j;
#pragma unroll
    for (int x = 0; x < KDA_RS; x++) st[x] = src >= 0 && x < nr ? sp[(int64_t)x * K] : 0.0f; // a fresh slot: zeros
    kda_tok cur;
    if (L > 0) kda_tok_load(a, cur, t0, h, j);
    int kc = a.decode ? 0 : a.ck_start[s], k1 = a.decode ? 0 : a.ck_start[s + 1];
    for (int i = 0; i < L; i++) {
        kda_tok nx = cur; // the next token's loads in flight under this one's work
        if (i + 1 < L) kda_tok_load(a, nx, t0 + i + 1, h, j);
        float sq = 0, sk = 0, kq = 0, av[KDA_NC];
#pragma unroll
        for (int c = 0; c < KDA_NC; c++) {
            sq += cur.q[c] * cur.q[c], sk += cur.k[c] * cur.k[c], kq += cur.q[c] * cur.k[c];
            av[c] = expf(cur.g[c]);
        }
        sq = warp_sum(sq), sk = warp_sum(sk), kq = warp_sum(kq);
        float rq = (1.0f / sqrtf((float)K)) / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f);
        float kr[KDA_RS], pm = 0, pp = 0;
#pragma unroll
        for (int x = 0; x < KDA_RS; x++)
            if (x < rs && i0 + x < K) { // warp-uniform: every lane shuffles
                int r = i0 + x, c = r >> 5;
                float qv = __shfl_sync(0xffffffffu, kda_pick(cur.q, c), r & 31) * rq;
                float ar = __shfl_sync(0xffffffffu, kda_pick(av, c), r & 31);
                kr[x] = __shfl_sync(0xffffffffu, kda_pick(cur.k, c), r & 31) * rk;
                st[x] *= ar;
                pm += st[x] * kr[x], pp += st[x] * qv;
            }
        float (*pb)[KDA_WARPS][KDA_BV] = part[i & 1]; // two buffers: a token's reads end before the next but one writes
        pb[0][w][lane] = pm, pb[1][w][lane] = pp;
        __syncthreads();
        float mem = 0, P = 0;
#pragma unroll
        for (int u = 0; u < KDA_WARPS; u++) mem += pb[0][u][lane], P += pb[1][u][lane];
        float delta = (cur.v - mem) / (1.0f + expf(-cur.b));
        if (w == 0 && j < K) a.y[(t0 + i) * (int64_t)HK + h * K + j] = P + delta * (kq * rq * rk);
#pragma unroll
        for (int x = 0; x < KDA_RS; x++)
            if (x < nr) st[x] += kr[x] * delta;
        for (; kc < k1 && a.ck_pos[kc] <= p0 + i + 1; kc++) // the state after position ckpt_pos - 1
            if (a.ck_pos[kc] == p0 + i + 1) kda_rows_store(a, st, a.ck_slot[kc], h, i0, nr, j);
        cur = nx;
    }
    kda_rows_store(a, st, own, h, i0, nr, j);
    int dst = a.decode && a.ck_dst ? a.ck_dst[s] : -1; // a decode's checkpoint: the state after its token
    if (dst >= 0) kda_rows_store(a, st, dst, h, i0, nr, j);
}

// ------------------------------------------------------- KDA in chunks --
// The prefill in chunks, as the CPU fast path's (fast_kimi.c, whose comment
// derives it): pieces of n <= KDA_CS tokens end at absolute multiples of
// KDA_CS and at each checkpoint position; per piece entering with S0,
//   Qg = q o P, Kg = k o P, P_t = a_0 o ... o a_t        [n, K]
//   Mkk[t][j] = k_t . (k_j o a_j+1 ... a_t) (j < t), Mqk the same with q_t (j <= t)
//   u_t = beta_t (v_t - (Kg S0)_t - sum_j<t Mkk[t][j] u_j)  (forward substitution)
//   y = Qg S0 + Mqk U,  S = diag(P_n-1) S0 + Kend^T U       Kend_j = k_j o a_j+1 ... a_n-1
// The pairwise decays are running products of exp(g) (never exp(-G)).
// Value columns of the state are independent in the delta rule, so a block
// takes KDA_BV of them: grid (sequence, head, K / KDA_BV rounded up), 128
// blocks for one sequence of Kimi-Linear-48B (32 heads of 128), each with
// its [K, KDA_BV] slice of the state in shared memory. Each block recomputes the piece's
// [n, n] products (n^2 K / 2 a block, against 3 n K KDA_BV for its GEMMs).
// Takes K a multiple of 16 up to KDA_KMAX (lanes own channels lane + 32 m;
// a block's columns past K are zeros it never stores); other head sizes run
// k_kda_step.
#ifndef VLLM_KDA_CS
#define VLLM_KDA_CS 16
#endif
#define KDA_CS VLLM_KDA_CS // tokens per chunk (a multiple of KDA_WARPS)
#define KDA_RC (KDA_CS / KDA_WARPS) // piece rows per thread: r = warp + KDA_WARPS m
static_assert(KDA_CS % KDA_WARPS == 0 && KDA_CS >= KDA_WARPS, "KDA_CS: a multiple of the block's warps");

static int kda_chunked(int K) { return K % 16 == 0 && K >= 16 && K <= KDA_KMAX; }

static size_t kda_chunk_smem(int K) {
    size_t C = KDA_CS, BV = KDA_BV;
    return sizeof(float) * ((size_t)K * BV + 4 * C * K + 2 * C * C + 2 * C * BV + C + K);
}

size_t cuda_kda_smem(int K) { return kda_chunked(K) ? kda_chunk_smem(K) : 0; }

// The chunk kernel's shared memory: the block's state slice and one piece.
struct kda_sm {
    float *S;               // [K, KDA_BV] state slice (key i, value column c)
    float *qn, *kn, *av;    // [KDA_CS, K] normalized q, k (then Qg, Kg), exp(g)
    float *ke;              // [KDA_CS, K] Kend
    float *mkk, *mqk;       // [KDA_CS, KDA_CS] row t, column j
    float *bw, *u;          // [KDA_CS, KDA_BV] v, then v - Kg S0; U
    float *beta, *p;        // [KDA_CS], [K] P_n-1
};

// Phase 1: warp w takes the piece's rows r = w + KDA_WARPS x, two at a time:
// it loads their q, k, g, b and the block's v columns (every load before
// any use: one trip to memory for the two), then normalizes q and k and
// takes exp(g) and beta.
__device__ void kda_piece_load(const kda_args &a, const kda_sm &m, int64_t t0, int n, int h, int j0) {
    int K = a.K, HK = a.H * K, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int x0 = 0; x0 < KDA_RC; x0 += 2) {
        float qv[2][KDA_NC], kv[2][KDA_NC], gv[2][KDA_NC], vv[2], bl[2];
#pragma unroll
        for (int x = 0; x < 2; x++) {
            int r = w + KDA_WARPS * (x0 + x);
            if (r >= n) break;
            const float *row = a.proj + (t0 + r) * a.ld, *gr = a.g + (t0 + r) * HK + h * K;
#pragma unroll
            for (int c = 0; c < KDA_NC; c++)
                if (lane + 32 * c < K) {
                    qv[x][c] = row[h * K + lane + 32 * c], kv[x][c] = row[HK + h * K + lane + 32 * c];
                    gv[x][c] = gr[lane + 32 * c];
                }
            vv[x] = j0 + lane < K ? row[2 * HK + h * K + j0 + lane] : 0.0f;
            bl[x] = row[3 * HK + h];
        }
#pragma unroll
        for (int x = 0; x < 2; x++) {
            int r = w + KDA_WARPS * (x0 + x);
            if (r >= n) break;
            float sq = 0, sk = 0;
#pragma unroll
            for (int c = 0; c < KDA_NC; c++)
                if (lane + 32 * c < K) sq += qv[x][c] * qv[x][c], sk += kv[x][c] * kv[x][c];
            sq = warp_sum(sq), sk = warp_sum(sk);
            float rq = (1.0f / sqrtf((float)K)) / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f);
#pragma unroll
            for (int c = 0; c < KDA_NC; c++)
                if (lane + 32 * c < K) {
                    int i = r * K + lane + 32 * c;
                    m.qn[i] = qv[x][c] * rq, m.kn[i] = kv[x][c] * rk, m.av[i] = expf(gv[x][c]);
                }
            m.bw[r * KDA_BV + lane] = vv[x];
            if (lane == 0) m.beta[r] = 1.0f / (1.0f + expf(-bl[x]));
        }
    }
}

// Phase 2: a warp per column j runs e = k_j o a_j+1 ... a_t down the rows t
// (lanes own channels lane + 32 c) for Mkk, Mqk and, at the last row, Kend.
// Phase 3: a thread per channel scales q, k by the prefix decays P.
__device__ void kda_piece_pairs(const kda_args &a, const kda_sm &m, int n) {
    int K = a.K, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int x = w; x < n; x += KDA_WARPS) {
        // column j runs n - 1 - j rows: odd rounds of the warps take the
        // columns in reverse, so warp w takes about n - 1 rows in all
        int b = x / KDA_WARPS * KDA_WARPS, j = (x / KDA_WARPS) % 2 ? b + min(KDA_WARPS, n - b) - 1 - (x - b) : x;
        float e[KDA_NC], dq = 0;
#pragma unroll
        for (int c = 0; c < KDA_NC; c++)
            if (lane + 32 * c < K) e[c] = m.kn[j * K + lane + 32 * c], dq += m.qn[j * K + lane + 32 * c] * e[c];
        dq = warp_sum(dq);
        if (lane == 0) m.mqk[j * KDA_CS + j] = dq;
        for (int t = j + 1; t < n; t++) {
            float dk = 0;
            dq = 0;
#pragma unroll
            for (int c = 0; c < KDA_NC; c++)
                if (lane + 32 * c < K) {
                    int i = t * K + lane + 32 * c;
                    e[c] *= m.av[i];
                    dk += m.kn[i] * e[c], dq += m.qn[i] * e[c];
                }
            dk = warp_sum(dk), dq = warp_sum(dq);
            if (lane == 0) m.mkk[t * KDA_CS + j] = dk, m.mqk[t * KDA_CS + j] = dq;
        }
#pragma unroll
        for (int c = 0; c < KDA_NC; c++)
            if (lane + 32 * c < K) m.ke[j * K + lane + 32 * c] = e[c];
    }
    __syncthreads(); // phase 3 overwrites qn, kn
    int i = threadIdx.x;
    if (i < K) {
        float p = 1.0f;
        for (int t = 0; t < n; t++) {
            p *= m.av[t * K + i];
            m.qn[t * K + i] *= p, m.kn[t * K + i] *= p;
        }
        m.p[i] = p;
    }
}

// Phases 4 to 6 of a piece (after phase 3's barrier): W = Kg S0 and Qg S0
// (a thread per value column and KDA_RC rows), U by forward substitution
// (warp 0, a lane per column), then y = Qg S0 + Mqk U and the state slice
// S = diag(P) S0 + Kend^T U (a thread per column and K / KDA_WARPS rows:
// the rows the checkpoint and final writes take from it).
__device__ void kda_piece_apply(const kda_args &a, const kda_sm &m, int64_t t0, int n, int h, int j0) {
    int K = a.K, HK = a.H * K, c = threadIdx.x & 31, w = threadIdx.x >> 5, rs = K / KDA_WARPS;
    float wa[KDA_RC], ya[KDA_RC];
#pragma unroll
    for (int x = 0; x < KDA_RC; x++) wa[x] = ya[x] = 0.0f;
    for (int i = 0; i < K; i += 4) {
        float s0 = m.S[i * KDA_BV + c], s1 = m.S[(i + 1) * KDA_BV + c];
        float s2 = m.S[(i + 2) * KDA_BV + c], s3 = m.S[(i + 3) * KDA_BV + c];
#pragma unroll
        for (int x = 0; x < KDA_RC; x++) {
            int r = w + KDA_WARPS * x;
            if (r >= n) break;
            float4 kg = *(const float4 *)&m.kn[r * K + i], qg = *(const float4 *)&m.qn[r * K + i];
            wa[x] += kg.x * s0 + kg.y * s1 + kg.z * s2 + kg.w * s3;
            ya[x] += qg.x * s0 + qg.y * s1 + qg.z * s2 + qg.w * s3;
        }
    }
#pragma unroll
    for (int x = 0; x < KDA_RC; x++) {
        int r = w + KDA_WARPS * x;
        if (r < n) m.bw[r * KDA_BV + c] -= wa[x];
    }
    __syncthreads();
    if (w == 0) { // U's column in registers: only the FMAs' chain is serial
        float uc[KDA_CS];
#pragma unroll
        for (int r = 0; r < KDA_CS; r++) {
            if (r >= n) break;
            float v = m.bw[r * KDA_BV + c];
#pragma unroll
            for (int j = 0; j < r; j++) v -= m.mkk[r * KDA_CS + j] * uc[j];
            uc[r] = m.beta[r] * v;
            m.u[r * KDA_BV + c] = uc[r];
        }
    }
    __syncthreads();
#pragma unroll
    for (int x = 0; x < KDA_RC; x++) {
        int r = w + KDA_WARPS * x;
        if (r >= n) break;
        float y = ya[x];
        for (int j = 0; j <= r; j++) y += m.mqk[r * KDA_CS + j] * m.u[j * KDA_BV + c];
        if (j0 + c < K) a.y[(t0 + r) * HK + h * K + j0 + c] = y;
    }
    float st[KDA_RS];
    int i0 = w * rs;
#pragma unroll
    for (int x = 0; x < KDA_RS; x++)
        if (x < rs) st[x] = m.S[(i0 + x) * KDA_BV + c] * m.p[i0 + x];
    for (int t = 0; t < n; t++) {
        float ut = m.u[t * KDA_BV + c];
        if (rs % 4 == 0) { // K a multiple of 32: the rows in float4 reads
#pragma unroll
            for (int x = 0; x < KDA_RS; x += 4)
                if (x < rs) {
                    float4 k4 = *(const float4 *)&m.ke[t * K + i0 + x];
                    st[x] += k4.x * ut, st[x + 1] += k4.y * ut, st[x + 2] += k4.z * ut, st[x + 3] += k4.w * ut;
                }
        } else {
#pragma unroll
            for (int x = 0; x < KDA_RS; x++)
                if (x < rs) st[x] += m.ke[t * K + i0 + x] * ut;
        }
    }
#pragma unroll
    for (int x = 0; x < KDA_RS; x++)
        if (x < rs) m.S[(i0 + x) * KDA_BV + c] = st[x];
}

// One block per (sequence, head, KDA_BV value columns); pieces as fast_kimi.c's.
__global__ void __launch_bounds__(KDA_THREADS) k_kda_chunk(kda_args a) {
    extern __shared__ __align__(16) float smem[]; // float4 reads of the [*, K] rows
    int K = a.K, H = a.H, s = a.seq0 + blockIdx.x, h = blockIdx.y, j0 = blockIdx.z * KDA_BV;
    int c = threadIdx.x & 31, i0 = (threadIdx.x >> 5) * (K / KDA_WARPS), rs = K / KDA_WARPS;
    kda_sm m;
    m.S = smem, m.qn = m.S + K * KDA_BV, m.kn = m.qn + KDA_CS * K, m.av = m.kn + KDA_CS * K;
    m.ke = m.av + KDA_CS * K, m.mkk = m.ke + KDA_CS * K, m.mqk = m.mkk + KDA_CS * KDA_CS;
    m.bw = m.mqk + KDA_CS * KDA_CS, m.u = m.bw + KDA_CS * KDA_BV, m.beta = m.u + KDA_CS * KDA_BV;
    m.p = m.beta + KDA_CS;
    int t0 = a.qsl[s], L = a.qsl[s + 1] - t0, p0 = a.ctx[s], src = a.src[s];
    int64_t hs = (int64_t)K * K;
    bool col = j0 + c < K;
    for (int x = 0; x < rs; x++) // a thread's own rows, as phase 6 writes them
        m.S[(i0 + x) * KDA_BV + c] =
            src < 0 || !col ? 0.0f : a.state[((int64_t)src * H + h) * hs + (int64_t)(i0 + x) * K + j0 + c];
    int kc = a.ck_start[s], k1 = a.ck_start[s + 1];
    for (; kc < k1 && a.ck_pos[kc] <= p0; kc++) {} // the state before the prefill: never written (as the reference)
    for (int i = 0; i < L;) {
        int n = min(L - i, KDA_CS - (p0 + i) % KDA_CS);
        if (kc < k1) n = min(n, a.ck_pos[kc] - (p0 + i));
        __syncthreads(); // the last piece's readers of qn, kn, mqk, u and the slice are done
        kda_piece_load(a, m, t0 + i, n, h, j0);
        __syncthreads();
        kda_piece_pairs(a, m, n);
        __syncthreads();
        kda_piece_apply(a, m, t0 + i, n, h, j0);
        i += n;
        for (; kc < k1 && a.ck_pos[kc] <= p0 + i; kc++) // the state after position ckpt_pos - 1
            if (a.ck_pos[kc] == p0 + i && col) {
                float *ck = a.state + ((int64_t)a.ck_slot[kc] * H + h) * hs + j0 + c;
                for (int x = 0; x < rs; x++) ck[(int64_t)(i0 + x) * K] = m.S[(i0 + x) * KDA_BV + c];
            }
    }
    int own = a.slots[s];
    for (int x = 0; x < rs && col; x++)
        a.state[((int64_t)own * H + h) * hs + (int64_t)(i0 + x) * K + j0 + c] = m.S[(i0 + x) * KDA_BV + c];
}

static void kda_step_launch(struct backend *be, kda_args a, int nseq) {
    if (nseq <= 0) return;
    k_kda_step<<<dim3(nseq, a.H, (a.K + KDA_BV - 1) / KDA_BV), KDA_THREADS, 0, cu(be)->stream>>>(a);
    LAUNCH_CHECK();
}

// Prefill in chunks where the head size allows (cu_supports checked the
// chunk kernel's shared memory), else token by token (k_kda_step).
void cuda_kda_prefill(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                      const struct batch *b, int seq0, int seq1, const struct kda_dims *d) {
    kda_args a = {y, proj, g, state, ld, d->heads, d->head_dim, seq0, 0, b->query_start_loc, b->context_lens,
                  b->state_slots, b->state_src, b->ckpt_start, b->ckpt_pos, b->ckpt_slot, NULL};
    if (seq1 <= seq0) return;
    if (!kda_chunked(d->head_dim)) {
        kda_step_launch(be, a, seq1 - seq0);
        return;
    }
    size_t sm = kda_chunk_smem(d->head_dim);
    CUDA_CHECK(cudaFuncSetAttribute(k_kda_chunk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    dim3 grid(seq1 - seq0, d->heads, (d->head_dim + KDA_BV - 1) / KDA_BV);
    k_kda_chunk<<<grid, KDA_THREADS, sm, cu(be)->stream>>>(a);
    LAUNCH_CHECK();
}

void cuda_kda_decode(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                     const struct batch *b, const struct kda_dims *d) {
    kda_args a = {y, proj, g, state, ld, d->heads, d->head_dim, 0, 1, b->query_start_loc, b->context_lens,
                  b->state_slots, b->state_src, b->ckpt_start, b->ckpt_pos, b->ckpt_slot, b->ckpt_dst};
    kda_step_launch(be, a, b->num_decodes);
}

__global__ void k_kda_gate(float *g, const float *A_log, const float *dt_bias, int64_t n, int H, int K) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int c = (int)(i % ((int64_t)H * K)), h = c / K;
    g[i] = -expf(A_log[h]) * softplus_th(g[i] + dt_bias[c]);
}

void cuda_kda_gate(struct backend *be, float *g, const float *A_log, const float *dt_bias, int n,
                   const struct kda_dims *d) {
    int64_t total = (int64_t)n * d->heads * d->head_dim;
    if (total <= 0) return;
    k_kda_gate<<<cdiv(total, 256), 256, 0, cu(be)->stream>>>(g, A_log, dt_bias, total, d->heads, d->head_dim);
    LAUNCH_CHECK();
}

// One block per (row, head): y = rmsnorm(y) * w * sigmoid(gate).
__global__ void k_head_norm_gate(float *y, const float *gate, const float *w, int D, float eps) {
    __shared__ float red[32];
    int64_t off = ((int64_t)blockIdx.x * gridDim.y + blockIdx.y) * D;
    float *x = y + off;
    const float *z = gate + off;
    float ss = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss += x[i] * x[i];
    ss = block_sum(ss, red);
    float inv = 1.0f / sqrtf(ss / D + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) x[i] = w[i] * (x[i] * inv) / (1.0f + expf(-z[i]));
}

void cuda_head_norm_gate(struct backend *be, float *y, const float *gate, const float *w, int n, int heads,
                         int head_dim, float eps) {
    if (n <= 0) return;
    k_head_norm_gate<<<dim3(n, heads), 128, 0, cu(be)->stream>>>(y, gate, w, head_dim, eps);
    LAUNCH_CHECK();
}
