/* The GLA recurrence (models/mixers/gla.py), forward and backward, for the training step on a
 * CPU, per batch row and head:
 *
 *   S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t,   S_{-1} = 0
 *
 * q, k, g [batch, H, T, dk]; v, o [batch, H, T, dv] (row-major, contiguous); S [dk][dv].
 * The states are a few KB per head, so the recurrence itself is cheap: the chunked PyTorch
 * form spends a training step in many small products of per-channel decays. Inner loops run
 * over the dv contiguous value channels. The backward recomputes the head's states into a
 * [T][dk][dv] buffer and walks time in reverse with the adjoint
 *   dS_t = q_t do_t^T + diag(exp(g_{t+1})) dS_{t+1}.
 * Built twice by mecheval.models.native: float and, with -DREAL_DOUBLE, double.
 */
#include <math.h>
#include <string.h>

#include "real.h"

#ifdef REAL_DOUBLE
#define EXP exp
#else
#define EXP expf
#endif

/* o. Returns 0, or 1 if memory ran out. */
int gla_forward(int64_t rows, int64_t T, int64_t dk, int64_t dv, const real *q, const real *k,
                const real *v, const real *g, real *o) {
    real *S = malloc(sizeof(real) * dk * dv);
    if (!S) return 1;
    for (int64_t r = 0; r < rows; r++) {
        memset(S, 0, sizeof(real) * dk * dv);
        for (int64_t t = 0; t < T; t++) {
            const real *qt = q + (r * T + t) * dk, *kt = k + (r * T + t) * dk;
            const real *gt = g + (r * T + t) * dk, *vt = v + (r * T + t) * dv;
            real *ot = o + (r * T + t) * dv;
            memset(ot, 0, sizeof(real) * dv);
            for (int64_t i = 0; i < dk; i++) {
                const real a = EXP(gt[i]), ki = kt[i], qi = qt[i];
                real *Si = S + i * dv;
#pragma omp simd
                for (int64_t j = 0; j < dv; j++) {
                    real s = a * Si[j] + ki * vt[j];
                    Si[j] = s;
                    ot[j] += qi * s;
                }
            }
        }
    }
    free(S);
    return 0;
}

/* Gradients of sum(do * o) with respect to q, k, v and g. Returns 0, or 1 if memory ran
 * out. */
int gla_backward(int64_t rows, int64_t T, int64_t dk, int64_t dv, const real *q, const real *k,
                 const real *v, const real *g, const real *dout, real *dq, real *dk_out,
                 real *dv_out, real *dg) {
    int64_t slab = dk * dv;
    real *S = malloc(sizeof(real) * T * slab), *dS = malloc(sizeof(real) * slab);
    real *zero = calloc(slab, sizeof(real)), *carry = malloc(sizeof(real) * dk);
    if (!S || !dS || !zero || !carry) {
        free(S);
        free(dS);
        free(zero);
        free(carry);
        return 1;
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t t = 0; t < T; t++) {
            const real *kt = k + (r * T + t) * dk, *gt = g + (r * T + t) * dk;
            const real *vt = v + (r * T + t) * dv;
            const real *prev = t ? S + (t - 1) * slab : zero;
            real *St = S + t * slab;
            for (int64_t i = 0; i < dk; i++) {
                const real a = EXP(gt[i]), ki = kt[i];
#pragma omp simd
                for (int64_t j = 0; j < dv; j++) St[i * dv + j] = a * prev[i * dv + j] + ki * vt[j];
            }
        }
        memset(dS, 0, sizeof(real) * slab);
        for (int64_t i = 0; i < dk; i++) carry[i] = 0; /* exp(g_{t+1}), 0 past the end */
        for (int64_t t = T - 1; t >= 0; t--) {
            int64_t at_k = (r * T + t) * dk, at_v = (r * T + t) * dv;
            const real *qt = q + at_k, *kt = k + at_k, *gt = g + at_k, *vt = v + at_v;
            const real *dot = dout + at_v;
            const real *St = S + t * slab, *prev = t ? S + (t - 1) * slab : zero;
            real *dvt = dv_out + at_v;
            memset(dvt, 0, sizeof(real) * dv);
            for (int64_t i = 0; i < dk; i++) {
                const real qi = qt[i], ki = kt[i], ci = carry[i];
                real *dSi = dS + i * dv;
                const real *Si = St + i * dv, *Pi = prev + i * dv;
                real sum_q = 0, sum_k = 0, sum_g = 0;
#pragma omp simd reduction(+ : sum_q, sum_k, sum_g)
                for (int64_t j = 0; j < dv; j++) {
                    real d = ci * dSi[j] + qi * dot[j];
                    dSi[j] = d;
                    sum_q += Si[j] * dot[j];
                    sum_k += d * vt[j];
                    sum_g += d * Pi[j];
                    dvt[j] += d * ki;
                }
                const real a = EXP(gt[i]);
                dq[at_k + i] = sum_q;
                dk_out[at_k + i] = sum_k;
                dg[at_k + i] = a * sum_g;
                carry[i] = a;
            }
        }
    }
    free(S);
    free(dS);
    free(zero);
    free(carry);
    return 0;
}
