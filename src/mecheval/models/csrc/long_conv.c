/* The causal depthwise ("long") convolution of models/ops/long_conv.py, forward and
 * backward, for the training step on a CPU:
 *
 *   y[b, t, c] = sum_{j = 0 .. min(t, L - 1)} k[c, j] u[b, t - j, c]
 *
 * u, y, gy [batch, T, C]; k [C, L] with L <= T taps. Every inner loop runs over the C
 * contiguous channels; the taps are read transposed, [L][C]. The output at t reads inputs
 * at positions <= t only, so the form is causal to the bit, as the intervention tests
 * demand. Built twice by mecheval.models.native: float and, with -DREAL_DOUBLE, double.
 */
#include <string.h>

#include "real.h"

/* y. Returns 0, or 1 if memory ran out. */
int long_conv_forward(int64_t batch, int64_t T, int64_t C, int64_t L, const real *u,
                      const real *k, real *y) {
    real *kt = transposed(k, C, L); /* [L][C] */
    if (!kt) return 1;
    for (int64_t b = 0; b < batch; b++) {
        const real *ub = u + b * T * C;
        for (int64_t t = 0; t < T; t++) {
            real *yt = y + (b * T + t) * C;
            memset(yt, 0, sizeof(real) * C);
            int64_t taps = t + 1 < L ? t + 1 : L;
            for (int64_t j = 0; j < taps; j++) {
                const real *kj = kt + j * C, *us = ub + (t - j) * C;
#pragma omp simd
                for (int64_t c = 0; c < C; c++) yt[c] += kj[c] * us[c];
            }
        }
    }
    free(kt);
    return 0;
}

/* Gradients of sum(gy * y): gu[b, s] = sum_j k[j] gy[b, s + j], gk[c, j] = sum_{b, t}
 * gy[b, t, c] u[b, t - j, c]. Returns 0, or 1 if memory ran out. */
int long_conv_backward(int64_t batch, int64_t T, int64_t C, int64_t L, const real *u,
                       const real *k, const real *gy, real *gu, real *gk) {
    real *kt = transposed(k, C, L); /* [L][C] */
    real *gkt = calloc(L * C, sizeof(real));
    if (!kt || !gkt) {
        free(kt);
        free(gkt);
        return 1;
    }
    for (int64_t b = 0; b < batch; b++) {
        const real *ub = u + b * T * C, *gb = gy + b * T * C;
        for (int64_t s = 0; s < T; s++) {
            real *gus = gu + (b * T + s) * C;
            memset(gus, 0, sizeof(real) * C);
            int64_t taps = T - s < L ? T - s : L;
            for (int64_t j = 0; j < taps; j++) {
                const real *kj = kt + j * C, *gt = gb + (s + j) * C;
#pragma omp simd
                for (int64_t c = 0; c < C; c++) gus[c] += kj[c] * gt[c];
            }
        }
        for (int64_t j = 0; j < L; j++) {
            real *gkj = gkt + j * C;
            for (int64_t t = j; t < T; t++) {
                const real *gt = gb + t * C, *us = ub + (t - j) * C;
#pragma omp simd
                for (int64_t c = 0; c < C; c++) gkj[c] += gt[c] * us[c];
            }
        }
    }
    for (int64_t c = 0; c < C; c++)
        for (int64_t j = 0; j < L; j++) gk[c * L + j] = gkt[j * C + c];
    free(kt);
    free(gkt);
    return 0;
}
