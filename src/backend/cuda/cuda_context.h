/* cuda_context.h: the per-rank CUDA state the backend works in: the chosen
 * GPU, one stream, a cuBLASLt handle and its workspace, and a cuBLAS handle
 * (products whose shape changes every call: cuda_gemm.h's cuda_gemm_rows_*). Host C11; compiled
 * only with `make CUDA=1`. */
#ifndef MT_BACKEND_CUDA_CONTEXT_H
#define MT_BACKEND_CUDA_CONTEXT_H

#include <stddef.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

/* cuBLASLt workspace per context (32 MiB covers Hopper's largest kernels). */
#define MT_CUBLASLT_WORKSPACE_BYTES ((size_t)32 << 20)

typedef struct CudaContext {
    int device;                /* ordinal passed to cudaSetDevice */
    cudaStream_t stream;       /* every kernel and GEMM of this rank runs here */
    cublasLtHandle_t blaslt;   /* NULL until created */
    void *blaslt_workspace;    /* device memory, MT_CUBLASLT_WORKSPACE_BYTES */
    size_t blaslt_workspace_bytes;
    cublasHandle_t blas;       /* on `stream`, sharing the workspace (the stream runs one product at a time) */
} CudaContext;

/* Select `device`, create the stream, the cuBLASLt and cuBLAS handles and the workspace.
 * Returns 0, or -1 with a message naming the failing call in err (ctx is
 * then left released, safe to pass to cuda_context_destroy). */
int cuda_context_create(CudaContext *ctx, int device, char *err, size_t errlen);

/* Wait for the stream, then release everything created (NULL-safe, idempotent). */
void cuda_context_destroy(CudaContext *ctx);

#endif
