/* blas_rows.c: does the OpenBLAS kernel set in use give each row of an sgemm
 * product the same bits whatever the number of rows? tests/run_tests.sh's
 * choice of the tests' kernel set rests on this (a few fp32 tolerances, e.g.
 * test_packing's packed row against its samples, assume it). It computes
 * C = A B, A B^T and A^T B for 1 to 256 rows at a grid of K and N, and
 * compares each with the rows computed one at a time.
 *
 *   cc -O2 tests/blas_rows.c -lopenblas -o /tmp/blas_rows
 *   OPENBLAS_CORETYPE=NEHALEM /tmp/blas_rows     # exit 0: every product row-invariant
 *
 * Measured on 2026-11-25 (OpenBLAS 0.3.21, 2 threads): NEHALEM 0 of 16,080
 * products differ, SKYLAKEX 2,172 (A B^T only), HASWELL and ZEN 12,543,
 * SANDYBRIDGE 1,044, PRESCOTT 15,096. On aarch64 (Debian 12's arm64 OpenBLAS 0.3.21
 * under qemu-user, 1 thread): every core type (ARMV8, CORTEXA57, CORTEXA72,
 * NEOVERSEN1, NEOVERSEV1, NEOVERSEN2, THUNDERX2T99) 1,044, all of them at
 * K 1000 (each of the three forms, 348). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_ROWS = 256 };

static float next(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* rows [first, first + m) of the product `form` (0: A B, 1: A B^T, 2: A^T B) into c */
static void product(int form, int first, int m, int n, int k, const float *a, const float *b, float *c) {
    if (form == 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, a + first * k, k, b, n, 0, c, n);
    else if (form == 1)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1, a + first * k, k, b, k, 0, c, n);
    else /* A^T: the columns first.. of a k x MAX_ROWS matrix */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1, a + first, MAX_ROWS, b, n, 0, c, n);
}

int main(void) {
    static const int ks[] = {16, 32, 48, 64, 96, 128, 200, 256, 512, 1000};
    static const int ns[] = {8, 16, 24, 48, 64, 100, 128, 256};
    static const int ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 31, 32, 33, 64, 100, 256};
    static const char *const forms[] = {"A B", "A B^T", "A^T B"};
    long differ = 0, total = 0;
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (int form = 0; form < 3; form++) {
                const int k = ks[ki], n = ns[ni];
                float *a = malloc(sizeof(float) * MAX_ROWS * k), *b = malloc(sizeof(float) * k * n);
                float *one = malloc(sizeof(float) * MAX_ROWS * n), *c = malloc(sizeof(float) * MAX_ROWS * n);
                unsigned s = (unsigned)(k * 7 + n);
                for (int i = 0; i < MAX_ROWS * k; i++) a[i] = next(&s);
                for (int i = 0; i < k * n; i++) b[i] = next(&s);
                for (int r = 0; r < MAX_ROWS; r++) product(form, r, 1, n, k, a, b, one + r * n);
                for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
                    const int m = ms[mi];
                    for (int first = 0; first + m <= MAX_ROWS; first += m > 64 ? m : 64) {
                        product(form, first, m, n, k, a, b, c);
                        total++;
                        if (memcmp(c, one + first * n, sizeof(float) * m * n) != 0 && differ++ < 5)
                            printf("differs: %s, %d rows from row %d, K %d, N %d\n", forms[form], m, first, k, n);
                    }
                }
                free(a), free(b), free(one), free(c);
            }
    printf("%ld of %ld products differ from their rows computed one at a time\n", differ, total);
    return differ != 0;
}
