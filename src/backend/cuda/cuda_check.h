/* cuda_check.h: the CUDA backend's fatal-error checks. A failed CUDA or
 * cuBLASLt call in the middle of a step cannot be recovered from, so these
 * end the program (MT_EXIT_FAILURE) with the call, the error and the place. */
#ifndef MT_BACKEND_CUDA_CHECK_H
#define MT_BACKEND_CUDA_CHECK_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "../../core/error.h"

#define CUDA_CHECK(call)                                                                                          \
    do {                                                                                                          \
        cudaError_t status_ = (call);                                                                             \
        if (status_ != cudaSuccess)                                                                               \
            mt_die(MT_EXIT_FAILURE, "CUDA: %s failed at %s:%d: %s (%s)", #call, __FILE__, __LINE__,                \
                   cudaGetErrorString(status_), cudaGetErrorName(status_));                                       \
    } while (0)

#define CUBLAS_CHECK(call)                                                                                        \
    do {                                                                                                          \
        cublasStatus_t status_ = (call);                                                                          \
        if (status_ != CUBLAS_STATUS_SUCCESS)                                                                     \
            mt_die(MT_EXIT_FAILURE, "cuBLASLt: %s failed at %s:%d: %s", #call, __FILE__, __LINE__,                 \
                   cublasLtGetStatusString(status_));                                                             \
    } while (0)

#endif
