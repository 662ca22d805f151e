/* cuda_device.c: queries the CUDA runtime, cuBLASLt and NCCL for what this
 * machine offers (see cuda_device.h). Nothing here allocates on a GPU. */
#include "cuda_device.h"

#include <stdarg.h>
#include <stdio.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

/* Append printf-style text at *used without overflowing buf. */
static void append(char *buf, size_t n, size_t *used, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void append(char *buf, size_t n, size_t *used, const char *fmt, ...) {
    if (!buf || n == 0 || *used >= n - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int wrote = vsnprintf(buf + *used, n - *used, fmt, ap);
    va_end(ap);
    if (wrote > 0) *used += (size_t)wrote < n - *used ? (size_t)wrote : n - *used - 1;
}

/* "12.8" from CUDA's 12080-style version numbers. */
static void cuda_version_text(int version, char *out, size_t n) {
    snprintf(out, n, "%d.%d", version / 1000, (version % 1000) / 10);
}

/* NCCL >= 2.9 codes versions as major*10000 + minor*100 + patch, older ones as major*1000 + minor*100 + patch. */
static void nccl_version_text(int code, char *out, size_t n) {
    if (code >= 20900) snprintf(out, n, "%d.%d.%d", code / 10000, (code % 10000) / 100, code % 100);
    else snprintf(out, n, "%d.%d.%d", code / 1000, (code % 1000) / 100, code % 100);
}

int cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError(); /* so a later cudaGetLastError does not report it */
        return 0;
    }
    return count;
}

int cuda_describe_devices(char *buf, size_t n) {
    size_t used = 0;
    if (buf && n) buf[0] = '\0';

    int runtime = 0, driver = 0, nccl = 0;
    char runtime_text[32] = "?", driver_text[32] = "none", nccl_text[32] = "?";
    if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) cuda_version_text(runtime, runtime_text, sizeof runtime_text);
    if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0)
        cuda_version_text(driver, driver_text, sizeof driver_text);
    if (ncclGetVersion(&nccl) == ncclSuccess) nccl_version_text(nccl, nccl_text, sizeof nccl_text);
    size_t lt = cublasLtGetVersion();
    append(buf, n, &used, "CUDA runtime %s, driver %s, cuBLASLt %zu.%zu.%zu, NCCL %s\n", runtime_text, driver_text,
           lt / 10000, (lt % 10000) / 100, lt % 100, nccl_text);

    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        (void)cudaGetLastError();
        append(buf, n, &used, "no usable GPU: %s (%s)\n", cudaGetErrorString(status), cudaGetErrorName(status));
        return -1;
    }
    if (count == 0) {
        append(buf, n, &used, "no usable GPU: the driver reports 0 devices\n");
        return -1;
    }
    for (int d = 0; d < count; d++) {
        struct cudaDeviceProp prop;
        status = cudaGetDeviceProperties(&prop, d);
        if (status != cudaSuccess) {
            append(buf, n, &used, "GPU %d: cannot read properties: %s\n", d, cudaGetErrorString(status));
            continue;
        }
        append(buf, n, &used, "GPU %d: %s, compute capability %d.%d, %.1f GiB, %d SMs, bus %04x:%02x:%02x\n", d,
               prop.name, prop.major, prop.minor, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
               prop.multiProcessorCount, prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
    }
    return count;
}
