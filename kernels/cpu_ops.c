/* Matrix products with GGUF block-quantized weights on a CPU: y[M, N] = x[M, K] W^T, fp32 activations, fp32
 * accumulation, the weights read as they are stored (4 or 8 bits plus a scale per 32) instead of dequantized fp32.
 * At one row (a decode step) the product streams the weights once, so reading 5 or 8.5 bits a weight instead of 32
 * is the gain; what then bounds the Q4_1 matrices is unpacking and converting the blocks (~10-13 GMAC/s a core,
 * under the bytes' rate), hence the widest vectors the machine has. kernels/cpu_ops.py builds this file with the
 * machine's compiler and explains the layout.
 *
 * Every row n of W is nb = K / 32 blocks. For block b of row n (i = n * nb + b):
 *   Q4_1: w[k] = d[i] * q + mn[i], q the low nibble of qs[16 i + k] for k < 16, the high nibble of qs[16 i + k - 16]
 *         for k >= 16 (ggml's order), so that sum_k w[k] x[k] = d[i] * sum_k q[k] x[k] + mn[i] * sum_k x[k];
 *   Q8_0: w[k] = d[i] * qs[32 i + k] (signed).
 * One row of x takes the right-hand form (a scale per block); several rows take the left (each weight made once).
 * The scales arrive as fp32 (converted from the file's fp16 once, at load). Rows are split over the OpenMP threads
 * of the process: the library links libgomp.so.1, which resolves to the copy torch already loaded, so it shares
 * torch's thread count and pool. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#define HAVE_VEC 1
#endif

#define QK 32
#define MAX_ROWS 16 /* rows of x per pass over W; more rows make more passes */

/* Ask for the blocks a few KB ahead of block i, where a row or two of x makes the product wait on memory. Each thread
 * walks its rows of W in order, yet at one row the hardware's prefetchers alone left the embedded model's matmuls
 * reading ~13 GB/s on a 2-core AVX-512 Xeon, where a plain sum reads ~20: with this the same matmuls run 1.23x
 * (1 thread) to 1.37x (2 threads) faster (2048 to 8192 bytes ahead alike; asking for the scales too gained
 * nothing; the AVX2 build 1.19x at 2 threads). With more rows, or without vectors, the product is bound by its
 * arithmetic, and asking gained nothing (4 and 16 rows: 0.95-1.04x). */
#define PREFETCH_BYTES 4096
static inline void prefetch_block(int q4, const uint8_t *qs, int64_t i) {
    __builtin_prefetch(qs + (q4 ? 16 : 32) * i + PREFETCH_BYTES, 0, 3);
}

/* A block's 32 weights as NW vectors of floats: with AVX-512 two of 16, half the conversions and products of AVX2's
 * four of 8 (with the two accumulators below, the embedded model's matmuls at one row ~15% faster on a 2-core
 * AVX-512 Xeon, 1 and 2 threads; docs/benchmarks.md). */
#if defined(__AVX512F__)
typedef __m512 vec;
#define NW 2
#define VW 16
#define WEIGHTS_ROWS 2 /* block_rows below: making a block's weights is one instruction more */
#define vzero() _mm512_setzero_ps()
#define vload(p) _mm512_loadu_ps(p)
#define vstore(p, v) _mm512_storeu_ps(p, v)
#define vmul(a, b) _mm512_mul_ps(a, b)
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vset1(s) _mm512_set1_ps(s)
#define hsum(v) _mm512_reduce_add_ps(v)
#define vadd(a, b) _mm512_add_ps(a, b)
#define vsub(a, b) _mm512_sub_ps(a, b)
#define vmax(a, b) _mm512_max_ps(a, b)
#define vmin(a, b) _mm512_min_ps(a, b)
#define vdiv(a, b) _mm512_div_ps(a, b)
#define vif_neg(x, a, b) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, vzero(), _CMP_LT_OQ), a, b) /* x < 0 ? b : a */
#define vround(a) _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vscale2(p, n) _mm512_scalef_ps(p, n) /* p * 2^n */

/* Byte j of a Q4_1 block's 16 in lane j. vpermps reads only the low 4 bits of an index, so a table of the 16
 * values a nibble stands for turns the low nibbles, then the nibbles shifted down, into floats: no mask and no
 * conversion. Bitwise the same products; at one row the embedded model's matmuls 1.04-1.07x faster on a 2-core
 * AVX-512 Xeon, where they mostly wait on memory, 1.1-1.3x on matrices that fit its cache, and 1.11-1.12x on a
 * 16-core Xeon's two cores. The table is 0..15 for the quants themselves, d * (0..15) + m for the block's weights. */
static inline void nibbles(const uint8_t *qs, int64_t i, __m512 table, vec w[NW]) {
    const __m512i raw = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 16 * i)));
    w[0] = _mm512_permutexvar_ps(raw, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(raw, 4), table);
}

#define IOTA16 _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)

static inline void unpack(int q4, const uint8_t *qs, int64_t i, vec w[NW]) {
    if (q4) {
        nibbles(qs, i, IOTA16, w);
    } else {
        const int8_t *q = (const int8_t *)qs + 32 * i;
        w[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
        w[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
    }
}

static inline void block_weights(int q4, const uint8_t *qs, const float *d, const float *mn, int64_t i,
                                 vec w[NW]) {
    if (q4) {
        nibbles(qs, i, _mm512_fmadd_ps(_mm512_set1_ps(d[i]), IOTA16, _mm512_set1_ps(mn[i])), w);
    } else {
        unpack(q4, qs, i, w);
        for (int j = 0; j < NW; j++) w[j] = vmul(vset1(d[i]), w[j]);
    }
}
#elif defined(__AVX2__)
typedef __m256 vec;
#define NW 4
#define VW 8
#define WEIGHTS_ROWS 5 /* four instructions more: slower than the scale at 2-4 rows, faster from 5 */
#define vzero() _mm256_setzero_ps()
#define vload(p) _mm256_loadu_ps(p)
#define vstore(p, v) _mm256_storeu_ps(p, v)
#define vmul(a, b) _mm256_mul_ps(a, b)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define vset1(s) _mm256_set1_ps(s)
#define vadd(a, b) _mm256_add_ps(a, b)
#define vsub(a, b) _mm256_sub_ps(a, b)
#define vmax(a, b) _mm256_max_ps(a, b)
#define vmin(a, b) _mm256_min_ps(a, b)
#define vdiv(a, b) _mm256_div_ps(a, b)
#define vif_neg(x, a, b) _mm256_blendv_ps(a, b, x) /* x's sign bit set ? b : a */
#define vround(a) _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* p * 2^n for an integral n in [-127, 127]: n added to p's exponent */
#define vscale2(p, n) \
    _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23)))

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline void unpack(int q4, const uint8_t *qs, int64_t i, vec w[NW]) {
    if (q4) {
        const __m128i raw = _mm_loadu_si128((const __m128i *)(qs + 16 * i));
        const __m128i mask = _mm_set1_epi8(0x0F);
        const __m128i lo = _mm_and_si128(raw, mask);
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
        w[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
        w[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
        w[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
        w[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
    } else {
        const int8_t *q = (const int8_t *)qs + 32 * i;
        for (int j = 0; j < 4; j++)
            w[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * j))));
    }
}

static inline void block_weights(int q4, const uint8_t *qs, const float *d, const float *mn, int64_t i,
                                 vec w[NW]) {
    unpack(q4, qs, i, w);
    for (int j = 0; j < NW; j++) w[j] = q4 ? vfma(vset1(d[i]), w[j], vset1(mn[i])) : vmul(vset1(d[i]), w[j]);
}
#endif

#ifdef HAVE_VEC
/* sum_k w[k] x[k] over one block, as a vector of partial sums */
static inline vec dot_block(const vec w[NW], const float *xb) {
    vec t = vmul(w[0], vload(xb));
    for (int j = 1; j < NW; j++) t = vfma(w[j], vload(xb + VW * j), t);
    return t;
}
#endif

/* One row of x times row n of W (a decode step's case; kept apart from the general case below so the compiler
 * keeps everything in registers: 1.3-1.5x faster at one row on the LM head's matrix, 1 and 2 threads). */
static float row1(int q4, const float *x, int64_t K, const uint8_t *qs, const float *d, const float *mn,
                  const float *xs, int64_t n) {
    const int64_t nb = K / QK;
#ifdef HAVE_VEC
    /* Consecutive blocks alternate between two accumulators (and so does Q4_1's minimum term): at one row the loop
     * is bound by the latency of its accumulating adds, not by their count. */
    vec acc = vzero(), other = vzero();
    float sm = 0.0f, sm_other = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t i = n * nb + b;
        vec w[NW];
        prefetch_block(q4, qs, i);
        unpack(q4, qs, i, w);
        const vec next = vfma(vset1(d[i]), dot_block(w, x + b * QK), acc);
        const float next_sm = q4 ? sm + mn[i] * xs[b] : sm;
        acc = other, other = next;
        sm = sm_other, sm_other = next_sm;
    }
    return hsum(acc) + hsum(other) + (sm + sm_other);
#else
    float s = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t i = n * nb + b;
        float t = 0.0f;
        for (int k = 0; k < QK; k++) {
            float q;
            if (q4)
                q = (float)(k < 16 ? (qs[16 * i + k] & 0x0F) : (qs[16 * i + k - 16] >> 4));
            else
                q = (float)((const int8_t *)qs)[32 * i + k];
            t += q * x[b * QK + k];
        }
        s += d[i] * t;
    }
    if (q4)
        for (int64_t b = 0; b < nb; b++) s += mn[n * nb + b] * xs[b];
    return s;
#endif
}

/* `rows` rows of x (at most MAX_ROWS) times row n of W; xs holds each row's block sums (Q4_1's minimum term) or is
 * NULL. From WEIGHTS_ROWS rows on, each block's weights are made once, exactly as the file defines them (d * q + m:
 * d came from fp16, so d * q is exact in fp32 and the sum rounds once, as in the dequantized matrix), and serve every
 * row with one product each instead of a product, a sum and a scale per row: the embedded model's matmuls 1.4-1.65x
 * faster at 4 and 16 rows with AVX-512 on a 2-core Xeon, 1.1-1.2x at 8-16 rows with AVX2; on a 16-core Xeon's two
 * cores 1.1-1.25x at 4 rows and 0.98-1.03x at 16 (presumably bound there by reading x, not by the arithmetic).
 * Below it, making the weights costs more than it saves, so the block's scale multiplies each row's sum, as in
 * `row1`. */
static void block_rows(int q4, const float *x, int64_t rows, int64_t K, const uint8_t *qs, const float *d,
                       const float *mn, const float *xs, int64_t n, float *y, int64_t ldy) {
    const int64_t nb = K / QK;
#ifdef HAVE_VEC
    vec acc[MAX_ROWS];
    for (int64_t m = 0; m < rows; m++) acc[m] = vzero();
    if (rows >= WEIGHTS_ROWS) {
        for (int64_t b = 0; b < nb; b++) {
            vec w[NW];
            block_weights(q4, qs, d, mn, n * nb + b, w);
            for (int64_t m = 0; m < rows; m++)
                for (int j = 0; j < NW; j++) acc[m] = vfma(w[j], vload(x + m * K + b * QK + VW * j), acc[m]);
        }
        for (int64_t m = 0; m < rows; m++) y[m * ldy + n] = hsum(acc[m]);
        return;
    }
    for (int64_t b = 0; b < nb; b++) {
        const int64_t i = n * nb + b;
        vec w[NW];
        prefetch_block(q4, qs, i);
        unpack(q4, qs, i, w);
        const vec scale = vset1(d[i]);
        for (int64_t m = 0; m < rows; m++) acc[m] = vfma(scale, dot_block(w, x + m * K + b * QK), acc[m]);
    }
    for (int64_t m = 0; m < rows; m++) {
        float s = hsum(acc[m]);
        if (q4)
            for (int64_t b = 0; b < nb; b++) s += mn[n * nb + b] * xs[m * nb + b];
        y[m * ldy + n] = s;
    }
#else
    for (int64_t m = 0; m < rows; m++)
        y[m * ldy + n] = row1(q4, x + m * K, K, qs, d, mn, xs ? xs + m * nb : NULL, n);
#endif
}

static void matmul(int q4, const float *x, int64_t M, int64_t K, const uint8_t *qs, const float *d, const float *mn,
                   int64_t N, float *y) {
    const int64_t nb = K / QK;
    float *xs = NULL;
    if (q4) {
        xs = malloc(sizeof(float) * M * nb);
        for (int64_t m = 0; m < M; m++)
            for (int64_t b = 0; b < nb; b++) {
                float s = 0.0f;
                for (int k = 0; k < QK; k++) s += x[m * K + b * QK + k];
                xs[m * nb + b] = s;
            }
    }
    for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {
        const int64_t rows = M - m0 < MAX_ROWS ? M - m0 : MAX_ROWS;
        if (rows == 1) {
#pragma omp parallel for schedule(static)
            for (int64_t n = 0; n < N; n++) y[m0 * N + n] = row1(q4, x + m0 * K, K, qs, d, mn, xs ? xs + m0 * nb : NULL, n);
        } else {
#pragma omp parallel for schedule(static)
            for (int64_t n = 0; n < N; n++)
                block_rows(q4, x + m0 * K, rows, K, qs, d, mn, xs ? xs + m0 * nb : NULL, n, y + m0 * N, N);
        }
    }
    free(xs);
}

void q4_1_matmul(const float *x, int64_t M, int64_t K, const uint8_t *qs, const float *d, const float *mn,
                 int64_t N, float *y) {
    matmul(1, x, M, K, qs, d, mn, N, y);
}

void q8_0_matmul(const float *x, int64_t M, int64_t K, const int8_t *qs, const float *d, int64_t N, float *y) {
    matmul(0, x, M, K, (const uint8_t *)qs, d, NULL, N, y);
}

/* ---- dense fp32 weights ----------------------------------------------------------------------------------------
 * y[M, N] = x[M, K] W^T (+ bias) with W stored transposed, wt = W^T as [K, N] rows (the CPU layout engine/layers.py
 * gives dense weights), for the few rows of a decode step. torch's fp32 GEMM on this layout took 56-72 ms at 4-16
 * rows for the embedded model's matrices on a 2-core AMD EPYC against 27 ms at one row: twice the time or more for
 * the same bytes. Here each thread owns a range of DW-column panels and walks K in blocks of DK rows: for each panel
 * a tile of DR rows by DW columns sits in registers through the block's DK rows of wt (DK sequential streams, which
 * the prefetchers follow; walking a panel down all of K instead, 64 bytes a row, read ~14 GB/s where a plain sum
 * reads ~28), then goes back to y, which holds the sums between blocks; DG panels at a time, so that their sums stay
 * in L1 (8 and 4 panels, or 8 and 32 rows, measured slower). Columns past the last whole panel take a scalar loop. */
#define DK 16
#define DG 16
#ifdef HAVE_VEC
#define DW (2 * VW)
#define DR 6
static inline __attribute__((always_inline)) void dense_tile(const int rows, const float *x, int64_t ldx, int64_t kb,
                                                             const float *wt, int64_t N, int first, const float *bias,
                                                             int64_t j, float *y) {
    vec acc[DR][2];
    for (int r = 0; r < rows; r++) {
        acc[r][0] = first ? (bias ? vload(bias + j) : vzero()) : vload(y + r * N + j);
        acc[r][1] = first ? (bias ? vload(bias + j + VW) : vzero()) : vload(y + r * N + j + VW);
    }
    for (int64_t k = 0; k < kb; k++) {
        const vec w0 = vload(wt + k * N + j), w1 = vload(wt + k * N + j + VW);
        for (int r = 0; r < rows; r++) {
            const vec xv = vset1(x[r * ldx + k]);
            acc[r][0] = vfma(xv, w0, acc[r][0]);
            acc[r][1] = vfma(xv, w1, acc[r][1]);
        }
    }
    for (int r = 0; r < rows; r++) {
        vstore(y + r * N + j, acc[r][0]);
        vstore(y + r * N + j + VW, acc[r][1]);
    }
}
#else
#define DW 16
#define DR 1
#endif

void dense_matmul_f32(const float *x, int64_t M, int64_t K, int64_t ldx, const float *wt, int64_t N,
                      const float *bias, float *y) {
    const int64_t panels = N / DW;
#pragma omp parallel
    {
        const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t lo = panels * tid / nth, hi = panels * (tid + 1) / nth;
        for (int64_t g = lo; g < hi; g += DG) {
            const int64_t g_hi = g + DG < hi ? g + DG : hi;
            for (int64_t k0 = 0; k0 < K; k0 += DK) {
                const int64_t kb = K - k0 < DK ? K - k0 : DK;
                const float *w = wt + k0 * N;
                for (int64_t p = g; p < g_hi; p++)
                    for (int64_t m0 = 0; m0 < M; m0 += DR) {
                        const float *xm = x + m0 * ldx + k0;
                        float *ym = y + m0 * N;
#ifdef HAVE_VEC
                        switch (M - m0 < DR ? M - m0 : DR) { /* constant row counts: the loops unroll into registers */
                        case 1: dense_tile(1, xm, ldx, kb, w, N, k0 == 0, bias, p * DW, ym); break;
                        case 2: dense_tile(2, xm, ldx, kb, w, N, k0 == 0, bias, p * DW, ym); break;
                        case 3: dense_tile(3, xm, ldx, kb, w, N, k0 == 0, bias, p * DW, ym); break;
                        case 4: dense_tile(4, xm, ldx, kb, w, N, k0 == 0, bias, p * DW, ym); break;
                        case 5: dense_tile(5, xm, ldx, kb, w, N, k0 == 0, bias, p * DW, ym); break;
                        default: dense_tile(DR, xm, ldx, kb, w, N, k0 == 0, bias, p * DW, ym); break;
                        }
#else
                        for (int64_t j = p * DW; j < p * DW + DW; j++) {
                            float s = k0 == 0 ? (bias ? bias[j] : 0.0f) : ym[j];
                            for (int64_t k = 0; k < kb; k++) s += xm[k] * w[k * N + j];
                            ym[j] = s;
                        }
#endif
                    }
            }
        }
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = panels * DW; j < N; j++) {
            float s = bias ? bias[j] : 0.0f;
            for (int64_t k = 0; k < K; k++) s += x[m * ldx + k] * wt[k * N + j];
            y[m * N + j] = s;
        }
}

/* ---- small fused ops of a decoder layer (fp32, rows of a [T, width] tensor) --------------------------------------
 * Each replaces several eager torch ops whose fixed cost (~3-10 us each at one row) made up half of a single-stream
 * decode step once the matmuls read quantized blocks. Rows are split over the threads only when there are many. */

/* out = (x + res) * rsqrt(mean((x + res)^2) + eps) * w, and res = x + res in place; res NULL: norm of x alone. The
 * T * G rows of H values: row (t, g) at x + t * ldx + g * H (G > 1: the heads of a [T, G, H] view of q or k, for
 * Qwen3's per-head norms; res only with G = 1), out and res contiguous. */
void rmsnorm_f32(const float *x, float *res, const float *w, float eps, int64_t T, int64_t G, int64_t H, int64_t ldx,
                 float *out) {
#pragma omp parallel for schedule(static) if (T * G > 32)
    for (int64_t t = 0; t < T * G; t++) {
        const float *xt = x + (t / G) * ldx + (t % G) * H;
        float *rt = res ? res + t * H : NULL;
        float *ot = out + t * H;
        double ss = 0.0;
        for (int64_t j = 0; j < H; j++) {
            float v = rt ? xt[j] + rt[j] : xt[j];
            if (rt) rt[j] = v;
            ot[j] = v;
            ss += (double)v * v;
        }
        const float r = (float)(1.0 / __builtin_sqrt(ss / (double)H + (double)eps));
        for (int64_t j = 0; j < H; j++) ot[j] = ot[j] * r * w[j];
    }
}

/* Rotate-half (neox) rotary embedding in place: heads of D values at x + t * ldx + h * D, by cos|sin of pos[t]
 * (cos_sin rows: D/2 cos then D/2 sin). */
void rope_f32(float *x, int64_t T, int64_t heads, int64_t D, int64_t ldx, const float *cos_sin, const int64_t *pos) {
    const int64_t half = D / 2;
#pragma omp parallel for schedule(static) if (T > 32)
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos_sin + pos[t] * D, *s = c + half;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + t * ldx + h * D;
            for (int64_t j = 0; j < half; j++) {
                const float a = v[j], b = v[j + half];
                v[j] = a * c[j] - b * s[j];
                v[j + half] = b * c[j] + a * s[j];
            }
        }
    }
}

#ifdef HAVE_VEC
/* e^x for x <= 0 (a softmax's shifted scores), within 1 ulp of e^x from -87 to 0: x = n ln2 + r, |r| <= ln2 / 2,
 * e^r by Cephes' expf polynomial, times 2^n. Below -87 (e^x under fp32's smallest normal) it returns ~e^-87, which
 * next to the row's maximum, e^0 = 1, adds nothing. */
static inline vec vexp(vec x) {
    x = vmax(x, vset1(-87.0f));
    const vec n = vround(vmul(x, vset1(1.44269504088896341f)));
    vec r = vfma(n, vset1(-0.693359375f), x);
    r = vfma(n, vset1(2.12194440e-4f), r);
    vec p = vset1(1.9875691500e-4f);
    p = vfma(p, r, vset1(1.3981999507e-3f));
    p = vfma(p, r, vset1(8.3334519073e-3f));
    p = vfma(p, r, vset1(4.1665795894e-2f));
    p = vfma(p, r, vset1(1.6666665459e-1f));
    p = vfma(p, r, vset1(5.0000001201e-1f));
    p = vadd(vfma(p, vmul(r, r), r), vset1(1.0f));
    return vscale2(p, n);
}

/* One (sequence, head) whose d values are NV vectors, NV a constant at each call: the query and the output row stay in
 * registers, each score is NV products and one horizontal sum, each value row NV multiply-adds (1.2-1.7x the plain
 * loops below at SmolLM2's and Llama's shapes, 1 and 2 threads). */
static inline void attend_head_vec(const int NV, const float *qv, const float *k_pool, const float *v_pool,
                                   const int64_t *slots, int64_t n, int64_t row, int64_t off, float scale, float *s,
                                   float *o) {
    vec qr[8], acc[8];
    for (int c = 0; c < NV; c++) qr[c] = vload(qv + c * VW), acc[c] = vzero();
    float mx = -__builtin_inff();
    for (int64_t j = 0; j < n; j++) {
        const float *kv = k_pool + slots[j] * row + off;
        vec a = vmul(qr[0], vload(kv));
        for (int c = 1; c < NV; c++) a = vfma(qr[c], vload(kv + c * VW), a);
        s[j] = hsum(a) * scale;
        mx = s[j] > mx ? s[j] : mx;
    }
    /* the softmax's exponentials VW at a time (libm's expf one at a time was a fifth of the head's time) */
    const vec vmx = vset1(mx);
    vec vsum = vzero();
    int64_t j = 0;
    for (; j + VW <= n; j += VW) {
        const vec e = vexp(vsub(vload(s + j), vmx));
        vstore(s + j, e);
        vsum = vadd(vsum, e);
    }
    float sum = hsum(vsum);
    for (; j < n; j++) {
        s[j] = __builtin_expf(s[j] - mx);
        sum += s[j];
    }
    for (int64_t j = 0; j < n; j++) {
        const float *vv = v_pool + slots[j] * row + off;
        const vec p = vset1(s[j]);
        for (int c = 0; c < NV; c++) acc[c] = vfma(p, vload(vv + c * VW), acc[c]);
    }
    const vec inv = vset1(1.0f / sum);
    for (int c = 0; c < NV; c++) vstore(o + c * VW, vmul(acc[c], inv));
}
#endif

/* out[t] = silu(x[t, :I]) * x[t, I:], silu(g) = g * sigmoid(g) with sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e)
 * below, e = e^-|g| <= 1 (no overflow). At one row of SmolLM2's width libm's expf, one value at a time, made a call
 * ~16 us; the vector exp (vexp, within 1 ulp) does the row VW at a time, ~2 us. */
static inline float silu1(float g) {
    const float e = __builtin_expf(-__builtin_fabsf(g));
    return g * (g < 0.0f ? e : 1.0f) / (1.0f + e);
}

void silu_mul_f32(const float *x, int64_t T, int64_t I, float *out) {
#pragma omp parallel for schedule(static) if (T > 32)
    for (int64_t t = 0; t < T; t++) {
        const float *g = x + t * 2 * I, *u = g + I;
        float *o = out + t * I;
        int64_t j = 0;
#ifdef HAVE_VEC
        const vec one = vset1(1.0f);
        for (; j + VW <= I; j += VW) {
            const vec gv = vload(g + j), e = vexp(vmin(gv, vsub(vzero(), gv)));
            vstore(o + j, vmul(vdiv(vmul(gv, vif_neg(gv, one, e)), vadd(one, e)), vload(u + j)));
        }
#endif
        for (; j < I; j++) o[j] = silu1(g[j]) * u[j];
    }
}

/* Decode attention over the paged KV pool, one new token per sequence (fp32). First the new tokens' K/V go to
 * their pool slots (slot s holds kvh * d values at pool + s * kvh * d), then each (sequence b, head h) attends
 * over the slots idx[b, 0 .. lens[b]) in order: scores q.k * scale, softmax, sum of p v. Query head h reads KV head
 * h / (heads / kvh) (grouped-query attention). `scratch` holds B * heads * max_kv scores. */
void decode_attention_f32(const float *q, int64_t ldq, const float *k_new, int64_t ldk, const float *v_new,
                          int64_t ldv, const int64_t *out_slots, float *k_pool, float *v_pool, const int64_t *idx,
                          int64_t max_kv, const int64_t *lens, int64_t B, int64_t heads, int64_t kvh, int64_t d,
                          float scale, float *out, float *scratch) {
    const int64_t row = kvh * d;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t j = 0; j < row; j++) {
            k_pool[out_slots[b] * row + j] = k_new[b * ldk + j];
            v_pool[out_slots[b] * row + j] = v_new[b * ldv + j];
        }
    }
    const int64_t group = heads / kvh;
#pragma omp parallel for schedule(static) if (B * heads > 8)
    for (int64_t bh = 0; bh < B * heads; bh++) {
        const int64_t b = bh / heads, h = bh % heads, g = h / group, n = lens[b];
        const float *qv = q + b * ldq + h * d;
        const int64_t *slots = idx + b * max_kv;
        float *s = scratch + bh * max_kv;
        float *o = out + bh * d;
#ifdef HAVE_VEC
        if (d == 4 * VW || d == 8 * VW) { /* head dims 64 and 128 with AVX-512, 32 and 64 with AVX2 */
            if (d == 4 * VW)
                attend_head_vec(4, qv, k_pool, v_pool, slots, n, row, g * d, scale, s, o);
            else
                attend_head_vec(8, qv, k_pool, v_pool, slots, n, row, g * d, scale, s, o);
            continue;
        }
#endif
        float mx = -__builtin_inff();
        for (int64_t j = 0; j < n; j++) {
            const float *kv = k_pool + slots[j] * row + g * d;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t e = 0; e < d; e++) acc += qv[e] * kv[e];
            s[j] = acc * scale;
            if (s[j] > mx) mx = s[j];
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            s[j] = __builtin_expf(s[j] - mx);
            sum += s[j];
        }
        for (int64_t e = 0; e < d; e++) o[e] = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            const float *vv = v_pool + slots[j] * row + g * d;
            const float p = s[j] / sum;
            for (int64_t e = 0; e < d; e++) o[e] += p * vv[e];
        }
    }
}

/* out[t] = w[ids[t]]: rows of an embedding [V, H] whose element (v, j) sits at w + v * s0 + j * s1 (the engine may
 * store a weight transposed, kernels' cpu_weight_layout). */
void embedding_f32(const float *w, int64_t s0, int64_t s1, const int64_t *ids, int64_t T, int64_t H, float *out) {
    for (int64_t t = 0; t < T; t++) {
        const float *row = w + ids[t] * s0;
        float *o = out + t * H;
        if (s1 == 1)
            for (int64_t j = 0; j < H; j++) o[j] = row[j];
        else
            for (int64_t j = 0; j < H; j++) o[j] = row[j * s1];
    }
}

/* ---- a recorded step, replayed in one call ------------------------------------------------------------------------
 * kernels/cpu_ops.py records the calls one decode forward makes (a Tape) and replays them here: each call is
 * TAPE_WIDTH int64s, its function's number (the order of TAPE_OPS there) and its arguments in order, pointers as
 * addresses and floats as their 32 bits. A forward of a small model made ~300 calls from Python at ~10-30 us of
 * interpreter, ctypes and allocation each, a third of a one-row step's time. */
#define TAPE_WIDTH 20
#define P(i) ((void *)(intptr_t)a[i])

static float f32_bits(int64_t v) {
    union {
        uint32_t u;
        float f;
    } c = {(uint32_t)v};
    return c.f;
}

void run_tape(const int64_t *calls, int64_t n) {
    for (int64_t c = 0; c < n; c++) {
        const int64_t *a = calls + c * TAPE_WIDTH + 1;
        switch (calls[c * TAPE_WIDTH]) {
        case 0:
            q4_1_matmul(P(0), a[1], a[2], P(3), P(4), P(5), a[6], P(7));
            break;
        case 1:
            q8_0_matmul(P(0), a[1], a[2], P(3), P(4), a[5], P(6));
            break;
        case 2:
            rmsnorm_f32(P(0), P(1), P(2), f32_bits(a[3]), a[4], a[5], a[6], a[7], P(8));
            break;
        case 3:
            rope_f32(P(0), a[1], a[2], a[3], a[4], P(5), P(6));
            break;
        case 4:
            silu_mul_f32(P(0), a[1], a[2], P(3));
            break;
        case 5:
            decode_attention_f32(P(0), a[1], P(2), a[3], P(4), a[5], P(6), P(7), P(8), P(9), a[10], P(11), a[12],
                                 a[13], a[14], a[15], f32_bits(a[16]), P(17), P(18));
            break;
        case 6:
            embedding_f32(P(0), a[1], a[2], P(3), a[4], a[5], P(6));
            break;
        case 7:
            dense_matmul_f32(P(0), a[1], a[2], a[3], P(4), a[5], P(6), P(7));
            break;
        }
    }
}
