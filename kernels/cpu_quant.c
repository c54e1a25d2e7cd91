/* Matrix products with GGUF block-quantized weights on a CPU: y[M, N] = x[M, K] W^T, fp32 activations, fp32
 * accumulation, the weights read as they are stored (4 or 8 bits plus a scale per 32) instead of dequantized fp32.
 * At one row (a decode step) the product streams the weights once, so reading 5 or 8.5 bits a weight instead of 32
 * is the whole gain (kernels/cpu_quant.py builds this file with the machine's compiler and explains the layout).
 *
 * Every row n of W is nb = K / 32 blocks. For block b of row n (i = n * nb + b):
 *   Q4_1: w[k] = d[i] * q + mn[i], q the low nibble of qs[16 i + k] for k < 16, the high nibble of qs[16 i + k - 16]
 *         for k >= 16 (ggml's order), so that sum_k w[k] x[k] = d[i] * sum_k q[k] x[k] + mn[i] * sum_k x[k];
 *   Q8_0: w[k] = d[i] * qs[32 i + k] (signed).
 * The scales arrive as fp32 (converted from the file's fp16 once, at load). Rows are split over the OpenMP threads
 * of the process: the library links libgomp.so.1, which resolves to the copy torch already loaded, so it shares
 * torch's thread count and pool. */
#include <stdint.h>
#include <stdlib.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define QK 32
#define MAX_ROWS 16 /* rows of x per pass over W; more rows make more passes */

#ifdef __AVX2__
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 32 weights of one block as 4 vectors of 8 floats (before scaling). */
static inline void unpack_q4(const uint8_t *qs, __m256 out[4]) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(raw, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    out[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    out[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

static inline void unpack_q8(const int8_t *qs, __m256 out[4]) {
    for (int j = 0; j < 4; j++)
        out[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * j))));
}

static inline __m256 dot_block(const __m256 w[4], const float *xb) {
    __m256 t = _mm256_mul_ps(w[0], _mm256_loadu_ps(xb));
    t = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), t);
    t = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), t);
    return _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), t);
}
#endif

/* One row of x times row n of W (a decode step's case; kept apart from the general case below so the compiler
 * keeps everything in registers: 2x faster at one row). */
static float row1(int q4, const float *x, int64_t K, const uint8_t *qs, const float *d, const float *mn,
                  const float *xs, int64_t n) {
    const int64_t nb = K / QK;
    float s = 0.0f;
#ifdef __AVX2__
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int64_t i = n * nb + b;
        __m256 w[4];
        if (q4)
            unpack_q4(qs + 16 * i, w);
        else
            unpack_q8((const int8_t *)qs + 32 * i, w);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d[i]), dot_block(w, x + b * QK), acc);
    }
    s = hsum(acc);
#else
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
#endif
    if (q4)
        for (int64_t b = 0; b < nb; b++) s += mn[n * nb + b] * xs[b];
    return s;
}

/* `rows` rows of x (at most MAX_ROWS) times row n of W, each block unpacked once for all of them; xs holds each
 * row's block sums (Q4_1's minimum term) or is NULL. */
static void block_rows(int q4, const float *x, int64_t rows, int64_t K, const uint8_t *qs, const float *d,
                       const float *mn, const float *xs, int64_t n, float *y, int64_t ldy) {
    const int64_t nb = K / QK;
#ifdef __AVX2__
    __m256 acc[MAX_ROWS];
    for (int64_t m = 0; m < rows; m++) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int64_t i = n * nb + b;
        __m256 w[4];
        if (q4)
            unpack_q4(qs + 16 * i, w);
        else
            unpack_q8((const int8_t *)qs + 32 * i, w);
        const __m256 scale = _mm256_set1_ps(d[i]);
        for (int64_t m = 0; m < rows; m++) acc[m] = _mm256_fmadd_ps(scale, dot_block(w, x + m * K + b * QK), acc[m]);
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
