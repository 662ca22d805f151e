/* fake_lt_stubs.c: the cuBLASLt calls cuda_gemm.c links but test_cuda_moe_gemm never makes (fake_cuda.c), apart
 * from the CUDA headers, whose prototypes these do not match. */
#include <stdio.h>
#include <stdlib.h>
#define NOT_HERE(name) void name(void); void name(void) { fprintf(stderr, "FAKE: " #name " called\n"); abort(); }
NOT_HERE(cublasLtMatmul) NOT_HERE(cublasLtMatmulAlgoGetHeuristic) NOT_HERE(cublasLtMatmulDescCreate)
NOT_HERE(cublasLtMatmulDescDestroy) NOT_HERE(cublasLtMatmulDescSetAttribute) NOT_HERE(cublasLtMatmulPreferenceCreate)
NOT_HERE(cublasLtMatmulPreferenceDestroy) NOT_HERE(cublasLtMatmulPreferenceSetAttribute)
NOT_HERE(cublasLtMatrixLayoutCreate) NOT_HERE(cublasLtMatrixLayoutDestroy)

