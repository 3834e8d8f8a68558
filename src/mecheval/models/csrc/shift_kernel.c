/* H3's shift-SSM kernel as a direct correlation, forward and backward, for
 * models/ops/h3.py (shift_kernel_direct):
 *
 *   K[ch, j] = sum_m b[ch, m] c[ch, m + j],   j < lags, c zero beyond its N slots
 *
 * b, c [C, N]; K [C, lags]. Inner loops run over the N contiguous slots.
 * Built twice by mecheval.models.native: float and, with -DREAL_DOUBLE, double.
 */
#include <string.h>

#include "real.h"

int shift_kernel_forward(int64_t C, int64_t N, int64_t lags, const real *b, const real *c,
                         real *K) {
    for (int64_t ch = 0; ch < C; ch++) {
        const real *bc = b + ch * N, *cc = c + ch * N;
        for (int64_t j = 0; j < lags; j++) {
            real sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t m = 0; m < N - j; m++) sum += bc[m] * cc[m + j];
            K[ch * lags + j] = sum;
        }
    }
    return 0;
}

/* Gradients of sum(gK * K): gb[m] = sum_j gK[j] c[m + j], gc[i] = sum_j gK[j] b[i - j]. */
int shift_kernel_backward(int64_t C, int64_t N, int64_t lags, const real *b, const real *c,
                          const real *gK, real *gb, real *gc) {
    for (int64_t ch = 0; ch < C; ch++) {
        const real *bc = b + ch * N, *cc = c + ch * N, *g = gK + ch * lags;
        real *gbc = gb + ch * N, *gcc = gc + ch * N;
        memset(gbc, 0, sizeof(real) * N);
        memset(gcc, 0, sizeof(real) * N);
        for (int64_t j = 0; j < lags; j++) {
            const real gj = g[j];
#pragma omp simd
            for (int64_t m = 0; m < N - j; m++) {
                gbc[m] += gj * cc[m + j];
                gcc[m + j] += gj * bc[m];
            }
        }
    }
    return 0;
}
