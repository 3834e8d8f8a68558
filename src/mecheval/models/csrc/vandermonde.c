/* H3's diagonal SSM kernel as a Vandermonde product, forward and backward, for
 * models/ops/h3.py (vandermonde):
 *
 *   K[h, l] = 2 Re sum_n cb[h, n] z[h, n]^l,   z = exp(w),   l = 0 .. L - 1
 *
 * with cb given as real and imaginary parts [H, N], and z = exp(w) the same way in double
 * precision (the caller computes it, vectorised, and keeps it for the backward). The powers are carried by
 * multiplying by z once per l, in double precision whatever the build (a product of l
 * factors accumulates l roundings, which double keeps far below float32's), and every
 * inner loop runs over the N contiguous modes.
 * Built twice by mecheval.models.native: float and, with -DREAL_DOUBLE, double.
 */
#include "real.h"

/* The running power p = z^0 = 1 for one row of N modes. */
static void start_powers(int64_t N, double *p_re, double *p_im) {
    for (int64_t n = 0; n < N; n++) {
        p_re[n] = 1.0;
        p_im[n] = 0.0;
    }
}

static inline void advance(int64_t n, const double *z_re, const double *z_im, double *p_re,
                           double *p_im) {
    double re = p_re[n] * z_re[n] - p_im[n] * z_im[n];
    p_im[n] = p_re[n] * z_im[n] + p_im[n] * z_re[n];
    p_re[n] = re;
}

/* K [H, L]. Returns 0, or 1 if memory ran out. */
int vandermonde_forward(int64_t H, int64_t N, int64_t L, const real *cb_re, const real *cb_im,
                        const double *z_re_all, const double *z_im_all, real *K) {
    double *buffer = malloc(sizeof(double) * 2 * N);
    if (!buffer) return 1;
    double *p_re = buffer, *p_im = buffer + N;
    for (int64_t h = 0; h < H; h++) {
        const real *cr = cb_re + h * N, *ci = cb_im + h * N;
        const double *z_re = z_re_all + h * N, *z_im = z_im_all + h * N;
        start_powers(N, p_re, p_im);
        for (int64_t l = 0; l < L; l++) {
            double sum = 0.0;
#pragma omp simd reduction(+ : sum)
            for (int64_t n = 0; n < N; n++) {
                sum += (double)cr[n] * p_re[n] - (double)ci[n] * p_im[n];
                advance(n, z_re, z_im, p_re, p_im);
            }
            K[h * L + l] = (real)(2.0 * sum);
        }
    }
    free(buffer);
    return 0;
}

/* Gradients of sum(gK * K): with G = sum_l gK[l] z^l and D = sum_l gK[l] l z^l,
 * d/d cb_re = 2 Re G, d/d cb_im = -2 Im G, d/d w_re = 2 Re(cb D), d/d w_im = -2 Im(cb D)
 * (d z^l / dw = l z^l). Returns 0, or 1 if memory ran out. */
int vandermonde_backward(int64_t H, int64_t N, int64_t L, const real *cb_re, const real *cb_im,
                         const double *z_re_all, const double *z_im_all, const real *gK,
                         real *g_cb_re, real *g_cb_im, real *g_w_re, real *g_w_im) {
    double *buffer = malloc(sizeof(double) * 6 * N);
    if (!buffer) return 1;
    double *p_re = buffer, *p_im = buffer + N, *G_re = buffer + 2 * N, *G_im = buffer + 3 * N;
    double *D_re = buffer + 4 * N, *D_im = buffer + 5 * N;
    for (int64_t h = 0; h < H; h++) {
        const double *z_re = z_re_all + h * N, *z_im = z_im_all + h * N;
        start_powers(N, p_re, p_im);
        for (int64_t n = 0; n < N; n++) G_re[n] = G_im[n] = D_re[n] = D_im[n] = 0.0;
        for (int64_t l = 0; l < L; l++) {
            double g = (double)gK[h * L + l], gl = g * (double)l;
#pragma omp simd
            for (int64_t n = 0; n < N; n++) {
                G_re[n] += g * p_re[n];
                G_im[n] += g * p_im[n];
                D_re[n] += gl * p_re[n];
                D_im[n] += gl * p_im[n];
                advance(n, z_re, z_im, p_re, p_im);
            }
        }
        for (int64_t n = 0; n < N; n++) {
            int64_t i = h * N + n;
            double cr = (double)cb_re[i], ci = (double)cb_im[i];
            g_cb_re[i] = (real)(2.0 * G_re[n]);
            g_cb_im[i] = (real)(-2.0 * G_im[n]);
            g_w_re[i] = (real)(2.0 * (cr * D_re[n] - ci * D_im[n]));
            g_w_im[i] = (real)(-2.0 * (cr * D_im[n] + ci * D_re[n]));
        }
    }
    free(buffer);
    return 0;
}
