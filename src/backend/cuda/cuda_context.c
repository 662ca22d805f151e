/* cuda_context.c: creates and releases a rank's CUDA state (device, stream,
 * cuBLASLt and cuBLAS handles, workspace); see cuda_context.h. */
#include "cuda_context.h"

#include <stdint.h>
#include <string.h>

#include "../../core/error.h"

static int cuda_failed(cudaError_t status, const char *call, int device, char *err, size_t errlen) {
    mt_set_error(err, errlen, "CUDA device %d: %s failed: %s (%s)", device, call, cudaGetErrorString(status),
                 cudaGetErrorName(status));
    return -1;
}

int cuda_context_create(CudaContext *ctx, int device, char *err, size_t errlen) {
    memset(ctx, 0, sizeof *ctx);
    ctx->device = device;
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver) { /* no GPU, or no driver at all */
        mt_set_error(err, errlen, "CUDA device %d: no usable GPU here: %s (%s); `nvidia-smi` shows what the driver "
                     "sees, and run.device: cpu trains without one", device, cudaGetErrorString(status),
                     cudaGetErrorName(status));
        return -1;
    }
    if (status != cudaSuccess) return cuda_failed(status, "cudaGetDeviceCount", device, err, errlen);
    if (device < 0 || device >= count) {
        mt_set_error(err, errlen, "CUDA device %d: this machine has %d GPU(s) (ordinals 0..%d)", device, count,
                     count - 1);
        return -1;
    }
    status = cudaSetDevice(device);
    if (status != cudaSuccess) return cuda_failed(status, "cudaSetDevice", device, err, errlen);
    status = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
    if (status != cudaSuccess) {
        ctx->stream = NULL;
        return cuda_failed(status, "cudaStreamCreateWithFlags", device, err, errlen);
    }
    /* Stream-ordered allocations (a MoE layer's expert side beyond the arena's room under ep, cuBLAS's grouped
     * pointer arrays) go back to the device's pool when freed and stay there for the next, rather than back to the
     * driver at every synchronisation (the pool's default) */
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    cublasStatus_t lt_status = cublasLtCreate(&ctx->blaslt);
    if (lt_status != CUBLAS_STATUS_SUCCESS) {
        ctx->blaslt = NULL;
        mt_set_error(err, errlen, "CUDA device %d: cublasLtCreate failed: %s", device,
                     cublasLtGetStatusString(lt_status));
        cuda_context_destroy(ctx);
        return -1;
    }
    status = cudaMalloc(&ctx->blaslt_workspace, MT_CUBLASLT_WORKSPACE_BYTES);
    if (status != cudaSuccess) {
        ctx->blaslt_workspace = NULL;
        cuda_failed(status, "cudaMalloc (cuBLASLt workspace)", device, err, errlen);
        cuda_context_destroy(ctx);
        return -1;
    }
    ctx->blaslt_workspace_bytes = MT_CUBLASLT_WORKSPACE_BYTES;
    cublasStatus_t blas_status = cublasCreate(&ctx->blas);
    if (blas_status == CUBLAS_STATUS_SUCCESS) blas_status = cublasSetStream(ctx->blas, ctx->stream);
    if (blas_status == CUBLAS_STATUS_SUCCESS)
        blas_status = cublasSetWorkspace(ctx->blas, ctx->blaslt_workspace, ctx->blaslt_workspace_bytes);
    if (blas_status != CUBLAS_STATUS_SUCCESS) {
        mt_set_error(err, errlen, "CUDA device %d: creating the cuBLAS handle failed: %s", device,
                     cublasLtGetStatusString(blas_status));
        cuda_context_destroy(ctx);
        return -1;
    }
    return 0;
}

void cuda_context_destroy(CudaContext *ctx) {
    if (!ctx) return;
    if (ctx->stream || ctx->blaslt || ctx->blaslt_workspace) cudaSetDevice(ctx->device);
    if (ctx->stream) cudaStreamSynchronize(ctx->stream);
    if (ctx->blaslt_workspace) cudaFree(ctx->blaslt_workspace);
    if (ctx->blaslt) cublasLtDestroy(ctx->blaslt);
    if (ctx->blas) cublasDestroy(ctx->blas);
    ctx->blas = NULL;
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    ctx->blaslt_workspace = NULL;
    ctx->blaslt_workspace_bytes = 0;
    ctx->blaslt = NULL;
    ctx->stream = NULL;
}
