/* device_comm.c: device collectives over NCCL or staged through the host
 * (see device_comm.h). The whole file is CUDA-only. */
#ifdef MT_CUDA
#include "device_comm.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/float16.h"
#include "../core/error.h"
#include "dp_sync.h"

#define DEVICE_CHECK(call)                                                                                    \
    do {                                                                                                      \
        cudaError_t e_ = (call);                                                                              \
        if (e_ != cudaSuccess) mt_die(MT_EXIT_FAILURE, "device comm: %s: %s", #call, cudaGetErrorString(e_)); \
    } while (0)

int device_comm_create(DeviceComm *out, const Comm *group, bool staged, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    out->group = group;
    out->staged = staged;
    out->rank = group->rank;
    out->size = group->size;
    return staged ? 0 : nccl_comm_create(&out->nccl, group, err, errlen);
}

void device_comm_create_threads(DeviceComm *out, ThreadGroup *threads, int rank) {
    memset(out, 0, sizeof *out);
    out->threads = threads;
    out->staged = true;
    out->rank = rank;
    out->size = thread_group_size(threads);
}

void device_comm_destroy(DeviceComm *c) {
    if (!c) return;
    nccl_comm_destroy(&c->nccl);
    free(c->host);
    free(c->host_f32);
    memset(c, 0, sizeof *c);
}

int device_comm_check(DeviceComm *c, char *err, size_t errlen) {
    return c->staged ? 0 : nccl_check_async_error(&c->nccl, err, errlen);
}

static size_t type_bytes(NcclDtype type) { return type == NCCL_DTYPE_BF16 ? 2 : 4; }

/* ---- staged through the host ---------------------------------------------- */

static void *host_bytes(DeviceComm *c, size_t bytes) {
    if (bytes > c->host_bytes) {
        c->host = mt_realloc(c->host, bytes);
        c->host_bytes = bytes;
    }
    return c->host;
}

static float *host_floats(DeviceComm *c, size_t count) {
    if (count > c->host_f32_count) {
        c->host_f32 = mt_realloc(c->host_f32, count * sizeof(float));
        c->host_f32_count = count;
    }
    return c->host_f32;
}

/* Copies on `stream`, finished on return (the stream is non-blocking: a plain cudaMemcpy is not ordered with it). */
static void copy_sync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream) {
    DEVICE_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
    DEVICE_CHECK(cudaStreamSynchronize(stream));
}

/* count elements of `src` (device) as floats on the host. */
static float *download_floats(DeviceComm *c, const void *src, size_t count, NcclDtype type, cudaStream_t stream) {
    float *f = host_floats(c, count);
    if (type == NCCL_DTYPE_FLOAT) {
        copy_sync(f, src, count * sizeof(float), cudaMemcpyDeviceToHost, stream);
        return f;
    }
    uint16_t *raw = host_bytes(c, count * 2);
    copy_sync(raw, src, count * 2, cudaMemcpyDeviceToHost, stream);
    for (size_t i = 0; i < count; i++) f[i] = bf16_to_f32(raw[i]);
    return f;
}

static void upload_floats(DeviceComm *c, void *dst, const float *f, size_t count, NcclDtype type,
                          cudaStream_t stream) {
    if (type == NCCL_DTYPE_FLOAT) {
        copy_sync(dst, f, count * sizeof(float), cudaMemcpyHostToDevice, stream);
        return;
    }
    uint16_t *raw = host_bytes(c, count * 2);
    for (size_t i = 0; i < count; i++) raw[i] = f32_to_bf16(f[i]);
    copy_sync(dst, raw, count * 2, cudaMemcpyHostToDevice, stream);
}

/* The host collectives of the staged transport: MPI's or the threads'. */
static void host_sum(DeviceComm *c, float *buf, size_t count, float scale) {
    if (c->threads) thread_group_sum(c->threads, c->rank, buf, count, scale);
    else comm_sum_identical(c->group, buf, count, scale);
}

static void host_all_gather(DeviceComm *c, const void *send, void *recv, size_t bytes) {
    if (c->threads) thread_group_all_gather(c->threads, c->rank, send, recv, bytes);
    else comm_all_gather(c->group, send, recv, bytes, COMM_BYTE);
}

static void host_reduce_scatter(DeviceComm *c, const float *send, float *recv, size_t count) {
    if (c->threads) thread_group_reduce_scatter(c->threads, c->rank, send, recv, count);
    else comm_reduce_scatter_sum_float(c->group, send, recv, count);
}

double device_comm_sum_double(DeviceComm *c, double value) {
    if (c->size <= 1) return value;
    return c->threads ? thread_group_sum_double(c->threads, c->rank, value) : dp_sum_double(c->group, value);
}

void device_comm_host_all_to_all(DeviceComm *c, const void *send, void *recv, size_t bytes) {
    if (!c->threads) {
        comm_all_to_all(c->group, send, recv, bytes, COMM_BYTE);
        return;
    }
    long *sizes = mt_malloc((size_t)c->size * sizeof(long));
    for (int r = 0; r < c->size; r++) sizes[r] = (long)bytes;
    thread_group_all_to_all_v(c->threads, c->rank, send, sizes, recv, sizes);
    free(sizes);
}

void device_comm_sum_doubles(DeviceComm *c, double *values, size_t n) {
    if (c->size <= 1 || n == 0) return;
    if (!c->threads) {
        comm_all_reduce_sum_double(c->group, values, n);
        return;
    }
    for (size_t i = 0; i < n; i++) values[i] = thread_group_sum_double(c->threads, c->rank, values[i]);
}

/* ---- the collectives ---------------------------------------------------------- */

void device_all_reduce(DeviceComm *c, void *buf, size_t count, NcclDtype type, bool average, cudaStream_t stream) {
    if (count == 0) return;
    if (!c->staged) {
        if (average && type == NCCL_DTYPE_FLOAT) nccl_all_reduce_avg_float(&c->nccl, buf, count, stream);
        else if (!average) nccl_all_reduce_sum(&c->nccl, buf, count, type, stream);
        else mt_die(MT_EXIT_FAILURE, "device comm: an average is only taken of fp32 buffers");
        return;
    }
    if (c->size == 1) return;
    float *f = download_floats(c, buf, count, type, stream);
    host_sum(c, f, count, average ? 1.0f / (float)c->size : 1.0f);
    upload_floats(c, buf, f, count, type, stream);
}

void device_all_gather(DeviceComm *c, const void *send, void *recv, size_t count, NcclDtype type,
                       cudaStream_t stream) {
    if (count == 0) return;
    if (!c->staged) {
        nccl_all_gather(&c->nccl, send, recv, count, type, stream);
        return;
    }
    const size_t bytes = count * type_bytes(type);
    char *host = host_bytes(c, bytes * (size_t)(c->size + 1));
    copy_sync(host, send, bytes, cudaMemcpyDeviceToHost, stream);
    host_all_gather(c, host, host + bytes, bytes);
    copy_sync(recv, host + bytes, bytes * (size_t)c->size, cudaMemcpyHostToDevice, stream);
}

void device_reduce_scatter_sum(DeviceComm *c, const void *send, void *recv, size_t count, NcclDtype type,
                               cudaStream_t stream) {
    if (count == 0) return;
    if (!c->staged) {
        nccl_reduce_scatter_sum(&c->nccl, send, recv, count, type, stream);
        return;
    }
    const size_t total = count * (size_t)c->size;
    float *all = download_floats(c, send, total, type, stream);
    float *mine = mt_malloc(count * sizeof(float));
    host_reduce_scatter(c, all, mine, count);
    upload_floats(c, recv, mine, count, type, stream);
    free(mine);
}

void device_all_to_all_v(DeviceComm *c, const void *send, const long *send_counts, void *recv,
                         const long *recv_counts, NcclDtype type, cudaStream_t stream) {
    if (!c->staged) {
        nccl_all_to_all_v(&c->nccl, send, send_counts, recv, recv_counts, type, stream);
        return;
    }
    const size_t elem = type_bytes(type);
    size_t sent = 0, received = 0;
    for (int r = 0; r < c->size; r++) sent += (size_t)send_counts[r], received += (size_t)recv_counts[r];
    char *host = host_bytes(c, (sent + received) * elem);
    if (sent > 0) copy_sync(host, send, sent * elem, cudaMemcpyDeviceToHost, stream);
    /* MPI moves bytes whatever the type: as 4-byte words when every block is whole words (MPI counts are ints,
     * so four times as much fits), else as bytes */
    long *sc = mt_malloc(2 * (size_t)c->size * sizeof(long)), *rc = sc + c->size;
    bool whole_words = true;
    for (int r = 0; r < c->size; r++) {
        sc[r] = send_counts[r] * (long)elem, rc[r] = recv_counts[r] * (long)elem;
        whole_words = whole_words && sc[r] % 4 == 0 && rc[r] % 4 == 0;
    }
    if (c->threads) {
        thread_group_all_to_all_v(c->threads, c->rank, host, sc, host + sent * elem, rc);
    } else {
        if (whole_words)
            for (int r = 0; r < c->size; r++) sc[r] /= 4, rc[r] /= 4;
        comm_all_to_all_v(c->group, host, sc, host + sent * elem, rc, whole_words ? COMM_FLOAT : COMM_BYTE);
    }
    free(sc);
    if (received > 0) copy_sync(recv, host + sent * elem, received * elem, cudaMemcpyHostToDevice, stream);
}

void device_p2p_group(DeviceComm *c, const NcclP2p *ops, int n, cudaStream_t stream) {
    if (c->staged) mt_die(MT_EXIT_FAILURE, "device comm: point-to-point groups go over NCCL only (a staged group sends "
                          "through the host)");
    nccl_p2p_group(&c->nccl, ops, n, stream);
}
#endif
