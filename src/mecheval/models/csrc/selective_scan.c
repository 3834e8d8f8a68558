/* Mamba's selective scan on the CPU, forward and backward, for models/ops/selective_scan.py.
 *
 *   h_t = exp(dt_t A) * h_{t-1} + dt_t x_t B_t      per channel d and state n, h_{-1} = 0
 *   y_t = sum_n C_t[n] h_t[n]
 *
 * Layout as the model holds it: x, dt, y [batch, T, D]; B, C [batch, T, N]; A [D, N].
 * One batch row at a time, the state kept as [N][D] so that every inner loop runs over the
 * D contiguous channels (vectorised by the compiler). The backward recomputes the row's
 * states and decays into a [T][N][D] buffer (a few hundred KB, cache-resident) instead of
 * storing them in the forward, and walks time in reverse with the adjoint
 *   g_t = gy_t C_t + exp(dt_{t+1} A) g_{t+1}.
 * Built twice by mecheval.models.native: float (the default) and, with -DREAL_DOUBLE,
 * double (the precision the tests hold it to the reference in).
 */
#include <math.h>
#include <string.h>

#include "real.h"

#ifdef REAL_DOUBLE
static inline real exp_r(real x) { return exp(x); }
#else
/* exp without a library call, so that the loops vectorise: 2^k e^r with k = round(x / ln 2)
 * and |r| <= ln(2) / 2, e^r by Cephes' expf polynomial (about 1 ulp). Inputs are clamped to
 * the normal range (a decay below 1e-38 counts as 1e-38); NaN passes through. Written
 * without branches or library calls (floorf, or a result computed in one arm of a
 * conditional, would keep gcc from vectorising the loops that call it): k is rounded by
 * adding and subtracting 1.5 * 2^23. The comparisons still need -fno-trapping-math (native.py
 * builds with it) before gcc turns them into selects and vectorises the loops. */
static inline real exp_r(real x) {
    real c = x > 88.0f ? 88.0f : (x < -87.0f ? -87.0f : x);
    c = c == c ? c : 0.0f;
    real k = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    real r = c - k * 0.693359375f + k * 2.12194440e-4f;
    real p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;
    real scale;
    memcpy(&scale, &bits, sizeof scale);
    real out = p * scale;
    return x == x ? out : x;
}
#endif

/* y = scan(x, dt, A, B, C). Returns 0, or 1 if memory ran out. */
int selective_scan_forward(int64_t batch, int64_t T, int64_t D, int64_t N, const real *x, const real *dt,
                 const real *A, const real *B, const real *C, real *y) {
    real *At = transposed(A, D, N);
    real *h = malloc(sizeof(real) * N * D);
    if (!At || !h) {
        free(At);
        free(h);
        return 1;
    }
    for (int64_t b = 0; b < batch; b++) {
        memset(h, 0, sizeof(real) * N * D);
        for (int64_t t = 0; t < T; t++) {
            int64_t row = b * T + t;
            const real *xt = x + row * D, *dtt = dt + row * D;
            const real *bt = B + row * N, *ct = C + row * N;
            real *yt = y + row * D;
            memset(yt, 0, sizeof(real) * D);
            for (int64_t n = 0; n < N; n++) {
                const real bn = bt[n], cn = ct[n], *an = At + n * D;
                real *hn = h + n * D;
#pragma omp simd
                for (int64_t d = 0; d < D; d++) {
                    real state = exp_r(dtt[d] * an[d]) * hn[d] + dtt[d] * xt[d] * bn;
                    hn[d] = state;
                    yt[d] += cn * state;
                }
            }
        }
    }
    free(At);
    free(h);
    return 0;
}

/* Gradients of sum(gy * y) with respect to x, dt, A, B and C. Returns 0, or 1 if memory ran
 * out. */
int selective_scan_backward(int64_t batch, int64_t T, int64_t D, int64_t N, const real *x, const real *dt,
                  const real *A, const real *B, const real *C, const real *gy, real *dx,
                  real *ddt, real *dA, real *dB, real *dC) {
    int64_t slab = N * D;
    real *At = transposed(A, D, N);
    real *H = malloc(sizeof(real) * T * slab), *decay = malloc(sizeof(real) * T * slab);
    real *zero = calloc(slab, sizeof(real)), *carry = malloc(sizeof(real) * slab);
    real *dAt = calloc(slab, sizeof(real)), *du = malloc(sizeof(real) * D);
    int failed = !At || !H || !decay || !zero || !carry || !dAt || !du;
    for (int64_t b = 0; b < batch && !failed; b++) {
        for (int64_t t = 0; t < T; t++) {
            int64_t row = b * T + t;
            const real *xt = x + row * D, *dtt = dt + row * D, *bt = B + row * N;
            for (int64_t n = 0; n < N; n++) {
                const real bn = bt[n], *an = At + n * D;
                const real *prev = t ? H + (t - 1) * slab + n * D : zero;
                real *hn = H + t * slab + n * D, *dn = decay + t * slab + n * D;
#pragma omp simd
                for (int64_t d = 0; d < D; d++) {
                    real a = exp_r(dtt[d] * an[d]);
                    dn[d] = a;
                    hn[d] = a * prev[d] + dtt[d] * xt[d] * bn;
                }
            }
        }
        memset(carry, 0, sizeof(real) * slab);
        for (int64_t t = T - 1; t >= 0; t--) {
            int64_t row = b * T + t;
            const real *xt = x + row * D, *dtt = dt + row * D, *gyt = gy + row * D;
            const real *bt = B + row * N, *ct = C + row * N;
            real *ddtt = ddt + row * D;
            memset(du, 0, sizeof(real) * D);
            memset(ddtt, 0, sizeof(real) * D);
            for (int64_t n = 0; n < N; n++) {
                const real bn = bt[n], cn = ct[n], *an = At + n * D;
                const real *hn = H + t * slab + n * D, *dn = decay + t * slab + n * D;
                const real *prev = t ? H + (t - 1) * slab + n * D : zero;
                real *cr = carry + n * D, *dAn = dAt + n * D;
                real sum_b = 0, sum_c = 0;
#pragma omp simd reduction(+ : sum_b, sum_c)
                for (int64_t d = 0; d < D; d++) {
                    real g = gyt[d] * cn + cr[d];
                    du[d] += g * bn;
                    sum_b += g * (dtt[d] * xt[d]);
                    sum_c += gyt[d] * hn[d];
                    real decayed = g * dn[d];
                    cr[d] = decayed;
                    real dlog = decayed * prev[d];
                    ddtt[d] += dlog * an[d];
                    dAn[d] += dlog * dtt[d];
                }
                dB[row * N + n] = sum_b;
                dC[row * N + n] = sum_c;
            }
            real *dxt = dx + row * D;
            for (int64_t d = 0; d < D; d++) {
                dxt[d] = du[d] * dtt[d];
                ddtt[d] += du[d] * xt[d];
            }
        }
    }
    if (!failed)
        for (int64_t d = 0; d < D; d++)
            for (int64_t n = 0; n < N; n++) dA[d * N + n] = dAt[n * D + d];
    free(At);
    free(H);
    free(decay);
    free(zero);
    free(carry);
    free(dAt);
    free(du);
    return failed;
}
