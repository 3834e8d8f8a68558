/* Shared by the kernels in this folder: the element type of the build (float, or double with
 * -DREAL_DOUBLE; mecheval.models.native builds both) and a transposed copy of a matrix. */
#ifndef MECHEVAL_REAL_H
#define MECHEVAL_REAL_H

#include <stdint.h>
#include <stdlib.h>

#ifdef REAL_DOUBLE
typedef double real;
#else
typedef float real;
#endif

/* Row-major [rows][cols] -> a new [cols][rows] (the caller frees it), NULL if memory ran out. */
static inline real *transposed(const real *a, int64_t rows, int64_t cols) {
    real *t = malloc(sizeof(real) * rows * cols);
    if (t)
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) t[j * rows + i] = a[i * cols + j];
    return t;
}

#endif
