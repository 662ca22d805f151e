// test_emu_checks.cu: the emulator's own checks (tests/gpu/emu/README.md, "Checks"), each against a kernel that
// breaks its rule on purpose, so that a check that stopped working fails here rather than letting a kernel of
// kernels/ pass that a GPU would fail. Compiled only for the emulator (cu2cpp.py, then g++: it calls the PTX
// helpers of emu_device.h directly); tests/integration/test_gpu_emu.sh runs each case and checks what it prints or
// the message it aborts with:
//   order        two missing barriers: a broadcast from thread 0 read without __syncthreads (wrong only when
//                higher threads run first: EMU_ORDER=reverse) and thread 0 reading thread 255's write without one
//                (wrong only in the default ascending order); block 1 reading block 0's global write (a race
//                between blocks: wrong only in reverse). Prints the wrong values of each.
//   cp_async_oob a cp.async whose 16 bytes run past the end of a cudaMalloc allocation: aborts; the same copy
//                predicated off (zero fill) passes first.
//   smem_optin   a launch with 64 KB of dynamic shared memory: refused (cudaErrorInvalidValue) until
//                cudaFuncSetAttribute raises the kernel's limit, then it runs.
//   warp_mask    a shuffle whose mask leaves out running lanes: aborts.
//   misaligned   a 16-byte vector load from a bf16 pointer one element in: aborts (x86 would load it).
//   oob_write    a kernel writing one float past the end of its cudaMalloc allocation: only the EMU_SANITIZE
//                build (AddressSanitizer) stops it (make test-gpu-emu-asan); it prints "not stopped" elsewhere.
//   deadlock     some threads at __syncthreads, the rest of a warp at an exchange that waits for them: aborts.
//   fresh_stacks one host thread runs a kernel and ends, then a second maps its fibre stacks (usually at the
//                addresses the first unmapped): under AddressSanitizer they must carry none of the first thread's
//                stack marks, which read as a stack-use-after-scope in a fibre that never did one (seen once in
//                CI in test_cuda_parallel_model's rank threads). Prints "clean" or where the first mark is.
//   host_arg, copy_kind, copy_overlap, memset_host, gemm_overlap, grouped_host
//                what the runtime, cuBLAS calls and kernels must be given, each broken (call_case): aborts.
//   staged_copy  a host-to-device copy staged at the call, landing in its stream's order (EMU_STREAMS=lazy):
//                prints what a stream without an event and one after the copy's event saw.
//   stream_query cudaStreamQuery on a stream with queued work: "not ready" until it is done, one piece a question
//                (EMU_STREAMS=lazy); prints how many times.
//   racecheck K  the racecheck build's (ThreadSanitizer) cases, K one of: broadcast (thread 0's shared write read
//                by the others with no barrier), cp_async (a cp.async issued into a buffer another warp reads in
//                the same barrier interval, waited for in the next: only the record at its issue shows it), ldmatrix
//                (rows written by one warp, read by another's ldmatrix with no barrier), cp_async_late (a cp.async
//                issued before a barrier and waited for after the next, its buffer read between: only its record
//                after the barrier shows it), blocks (two blocks adding to one global cell without an atomic: a lost
//                update on a GPU, which the emulator's blocks, one after another, never lose), blocks_barrier (block
//                0's write before its barriers, __syncwarp and cp.async stage read by block 1 after its own: none
//                of them orders another block), streams (a kernel on one stream reading a buffer that a kernel on
//                another wrote, with no event between), each a data race whatever the order; none (barriers, __syncwarp, shuffles, atomics in shared and global
//                memory, a cp.async pipeline, shared memory reused by later blocks, ten blocks on four sets of
//                thread slots, then launches of 64 and 1024 threads and the ten blocks again, and the streams case
//                with its event, all correct: no report). Prints "ran".
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <pthread.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

static const int kThreads = 256;

__global__ void order_kernel(int *broadcast_seen, int *last_seen) {
    __shared__ int cell[2];  // [0] from thread 0, [1] from the last thread
    if (threadIdx.x == 0) cell[0] = 42;
    if (threadIdx.x == kThreads - 1) cell[1] = 7;
    // no __syncthreads here: both reads race with the writes above
    broadcast_seen[threadIdx.x] = cell[0];
    if (threadIdx.x == 0) *last_seen = cell[1];
}

__global__ void blocks_kernel(int *cells) {
    if (threadIdx.x != 0) return;
    if (blockIdx.x == 0) cells[0] = 1;
    else cells[1] = cells[0];  // block 1 reads block 0's write: nothing orders blocks
}

__global__ void cp_async_kernel(float *out, const float *src, int pred) {
    extern __shared__ float tile[];
    if (threadIdx.x == 0) {
        cp_async16(tile, src, pred != 0);
        cp_async_commit();
        cp_async_wait_all();
        out[0] = tile[0];
    }
}

__global__ void big_smem_kernel(float *out) {
    extern __shared__ float big[];
    big[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = big[kThreads - 1];
}

__global__ void misaligned_kernel(float *out, const __nv_bfloat16 *x) {
    const uint4 v = *reinterpret_cast<const uint4 *>(x + 1);
    out[threadIdx.x] = (float)v.x;
}

__global__ void oob_write_kernel(float *out, int n) { out[n] = 1.0f; }

__global__ void warp_mask_kernel(float *out) {
    out[threadIdx.x] = __shfl_sync(0x0000ffffu, (float)threadIdx.x, 0);  // lanes 16-31 run but are left out
}

// Warp 1's lanes 0-15 wait at a full-warp shuffle that lanes 16-31 never reach (they wait at __syncthreads, which
// lanes 0-15 never reach).
__global__ void deadlock_kernel(float *out) {
    if (threadIdx.x >= 32 && threadIdx.x < 48) out[threadIdx.x] = __shfl_sync(0xffffffffu, 1.0f, 0);
    else __syncthreads();
}

// ---- racecheck: each kernel but race_none_kernel has one data race ----
__global__ void race_broadcast_kernel(int *out) {
    __shared__ int cell[1];
    if (threadIdx.x == 0) cell[0] = 42;
    out[threadIdx.x] = cell[0];  // no __syncthreads before it
}

// Warp 0 reads the buffer while warp 1's cp.async refills it, in the same interval; warp 1 waits after the barrier.
__global__ void race_cp_async_kernel(float *out, const float *src) {
    extern __shared__ float buf[];
    buf[threadIdx.x] = 1.0f;
    __syncthreads();
    if (threadIdx.x < 4) out[threadIdx.x] = buf[threadIdx.x];
    if (threadIdx.x == 32) {
        cp_async16(buf, src, true);
        cp_async_commit();
    }
    __syncthreads();
    if (threadIdx.x == 32) cp_async_wait_all();
    __syncthreads();
}

// Warp 1's cp.async, issued before a barrier and waited for after the next, may land while warp 0 reads the buffer
// between them: only the copy's record after each barrier it is pending across shows it.
__global__ void race_cp_async_late_kernel(float *out, const float *src) {
    extern __shared__ float buf[];
    buf[threadIdx.x] = 1.0f;
    __syncthreads();
    if (threadIdx.x == 32) {
        cp_async16(buf, src, true);
        cp_async_commit();
    }
    __syncthreads();
    if (threadIdx.x < 4) out[threadIdx.x] = buf[threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 32) cp_async_wait_all();
    __syncthreads();
}

// Warp 1 writes the rows that warp 0's ldmatrix reads, with no barrier between.
__global__ void race_ldmatrix_kernel(float *out) {
    extern __shared__ __nv_bfloat16 rows[];  // 32 rows of 8
    if (threadIdx.x >= 32)
        for (int i = 0; i < 8; i++) rows[(threadIdx.x - 32) * 8 + i] = __float2bfloat16((float)i);
    if (threadIdx.x < 32) {
        unsigned r[4];
        ldmatrix_x4(r, rows + threadIdx.x * 8);
        out[threadIdx.x] = (float)r[0];
    }
}

// Two blocks (the first thread of each) add to one global cell: nothing orders blocks, so one add can be lost.
__global__ void race_blocks_kernel(float *out) {
    if (threadIdx.x == 0) out[0] += 1.0f;
}

// Block 0 writes a cell before its barriers, block 1 reads it after its own: a block's barriers, __syncwarp and
// cp.async stage order nothing in another block (if two sets shared a barrier, block 1 would be ordered after
// block 0 when block 0 runs first, and nothing would be reported in the ascending order).
__global__ void race_blocks_barrier_kernel(float *out, const float *src) {
    extern __shared__ float stage[];  // 64 floats
    const int t = threadIdx.x;
    if (t < 16) cp_async16(stage + t * 4, src + t * 4, true);
    cp_async_commit();
    cp_async_wait_all();
    if (t == 0 && blockIdx.x == 0) out[0] = stage[0] + 1.0f;  // its own copy, landed at its wait
    __syncthreads();
    __syncwarp();
    if (t == 0 && blockIdx.x == 1) out[1] = out[0];
    __syncthreads();
}

// Every way of ordering threads that the racecheck models, used correctly: no report.
__global__ void race_none_kernel(float *out, const float *src, int *blocks_seen) {
    extern __shared__ float stage[];  // two stages of 64 floats
    __shared__ float partial[kThreads];
    __shared__ int count[1];
    const int t = threadIdx.x, lane = t % 32;
    if (t == 0) count[0] = 0;
    partial[t] = (float)(t + blockIdx.x);  // shared memory other blocks also wrote: a block's own on a GPU
    __syncthreads();
    atomicAdd(count, 1);
    if (t == 0) atomicAdd(blocks_seen, 1);  // global memory every block adds to
    float v = partial[(t + 1) % kThreads];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    __syncthreads();  // every read of partial above before the writes below
    partial[t] = v;
    __syncwarp();  // orders the warp's write above and its reads below
    v += partial[(t & ~31) + (lane + 1) % 32];
    if (t < 32) cp_async16(stage + t * 4, src + (t % 16) * 4, true);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    v += stage[t % 128];
    out[blockIdx.x * kThreads + t] = v;
}

// dst = src + 1: launched on one stream to write a buffer and on another to read it (racecheck streams).
__global__ void race_streams_kernel(float *dst, const float *src) { dst[threadIdx.x] = src[threadIdx.x] + 1.0f; }

// Correct at any block size: the launches between race_none_kernel's change the sets and the thread slots' roles.
__global__ void race_none_sizes_kernel(float *out, int *blocks_seen) {
    __shared__ float cell[1024];
    const int t = threadIdx.x, n = blockDim.x;
    cell[t] = (float)(t + blockIdx.x);
    __syncthreads();
    const float v = cell[(t + 1) % n];
    if (t == 0) atomicAdd(blocks_seen, 1);
    out[blockIdx.x * n + t] = v;
}

#define CHECK_CUDA(call)                                                                            \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "test_emu_checks: %s: %s\n", #call, cudaGetErrorString(e_));           \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

static int order_case() {
    int *d_seen, *d_last, *d_cells;
    CHECK_CUDA(cudaMalloc((void **)&d_seen, kThreads * sizeof(int)));
    CHECK_CUDA(cudaMalloc((void **)&d_last, sizeof(int)));
    CHECK_CUDA(cudaMalloc((void **)&d_cells, 2 * sizeof(int)));
    CHECK_CUDA(cudaMemset(d_cells, 0, 2 * sizeof(int)));
    order_kernel<<<1, kThreads>>>(d_seen, d_last);
    blocks_kernel<<<2, 32>>>(d_cells);
    CHECK_CUDA(cudaGetLastError());
    int seen[kThreads], last, cells[2];
    CHECK_CUDA(cudaMemcpy(seen, d_seen, sizeof seen, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(&last, d_last, sizeof last, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(cells, d_cells, sizeof cells, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int i = 0; i < kThreads; i++) wrong += seen[i] != 42;
    printf("broadcast read wrong by %d threads; thread 0 read %s; block 1 read %s\n", wrong,
           last == 7 ? "7 (right)" : "before the write", cells[1] == 1 ? "1 (right)" : "before the write");
    return 0;
}

static int cp_async_case() {
    float *src, *out;
    CHECK_CUDA(cudaMalloc((void **)&src, 6 * sizeof(float)));  // 24 bytes: 16 from src + 4 run 8 past the end
    CHECK_CUDA(cudaMalloc((void **)&out, sizeof(float)));
    cp_async_kernel<<<1, 32, 64>>>(out, src + 4, 0);
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("predicated off: passed\n");
    fflush(stdout);
    cp_async_kernel<<<1, 32, 64>>>(out, src + 4, 1);
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("cp.async past the end: not stopped\n");
    return 1;
}

static int smem_optin_case() {
    float *out;
    CHECK_CUDA(cudaMalloc((void **)&out, sizeof(float)));
    const size_t bytes = 64 * 1024;
    big_smem_kernel<<<1, kThreads, bytes>>>(out);
    const cudaError_t before = cudaGetLastError();
    CHECK_CUDA(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    big_smem_kernel<<<1, kThreads, bytes>>>(out);
    const cudaError_t after = cudaGetLastError();
    float got = 0;
    CHECK_CUDA(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost));
    printf("64 KB without the attribute: %s; with it: %s, result %g\n", cudaGetErrorName(before),
           cudaGetErrorName(after), got);
    return 0;
}

__global__ void deep_kernel(float *out) {
    float row[64];  // a local array: its frame has AddressSanitizer's marks
    for (int i = 0; i < 64; i++) row[i] = (float)(threadIdx.x + i);
    __syncthreads();
    out[threadIdx.x] = row[threadIdx.x % 64];
}

static void *run_deep_kernel(void *arg) {
    deep_kernel<<<4, kThreads>>>((float *)arg);
    CHECK_CUDA(cudaDeviceSynchronize());
    return nullptr;
}

static void *probe_fresh_stacks(void *arg) {
    *(const void **)arg = emu_fibre_stacks_poisoned();
    return nullptr;
}

static int racecheck_case(const char *k) {
    float *out, *src;
    int *iout;
    CHECK_CUDA(cudaMalloc((void **)&out, 10 * kThreads * sizeof(float)));
    CHECK_CUDA(cudaMalloc((void **)&src, 64 * sizeof(float)));
    CHECK_CUDA(cudaMalloc((void **)&iout, kThreads * sizeof(int)));
    CHECK_CUDA(cudaMemset(src, 0, 64 * sizeof(float)));
    if (strcmp(k, "broadcast") == 0) race_broadcast_kernel<<<1, kThreads>>>(iout);
    else if (strcmp(k, "cp_async") == 0) race_cp_async_kernel<<<1, 64, 64 * sizeof(float)>>>(out, src);
    else if (strcmp(k, "cp_async_late") == 0) race_cp_async_late_kernel<<<1, 64, 64 * sizeof(float)>>>(out, src);
    else if (strcmp(k, "ldmatrix") == 0) race_ldmatrix_kernel<<<1, 64, 32 * 8 * sizeof(__nv_bfloat16)>>>(out);
    else if (strcmp(k, "blocks") == 0) race_blocks_kernel<<<2, kThreads>>>(out);
    else if (strcmp(k, "blocks_barrier") == 0) race_blocks_barrier_kernel<<<2, kThreads, 64 * sizeof(float)>>>(out, src);
    else if (strcmp(k, "streams") == 0 || strcmp(k, "none") == 0) {
        if (k[0] == 'n') {  // first: the legacy stream's pool of thread slots takes four sets (the fibre budget)
            race_none_kernel<<<10, kThreads, 128 * sizeof(float)>>>(out, src, iout);
            race_none_sizes_kernel<<<6, 64>>>(out, iout);
            race_none_sizes_kernel<<<2, 1024>>>(out, iout);
            race_none_kernel<<<10, kThreads, 128 * sizeof(float)>>>(out, src, iout);
            CHECK_CUDA(cudaDeviceSynchronize());  // non-blocking streams are not ordered after the legacy one's work
        }
        // two non-blocking streams, as megatrain's compute and communication streams: one writes a buffer, the
        // other reads it, after the writer's event (none) or with no event between (streams: a race)
        cudaStream_t s1, s2;
        cudaEvent_t written;
        CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
        CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
        CHECK_CUDA(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
        race_streams_kernel<<<1, 64, 0, s1>>>(out + 64, src);
        if (k[0] == 'n') {
            CHECK_CUDA(cudaEventRecord(written, s1));
            CHECK_CUDA(cudaStreamWaitEvent(s2, written, 0));
        }
        race_streams_kernel<<<1, 64, 0, s2>>>(out + 128, out + 64);
        CHECK_CUDA(cudaStreamSynchronize(s2));
        CHECK_CUDA(cudaStreamSynchronize(s1));
    }
    else return 2;
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    float first[kThreads];
    CHECK_CUDA(cudaMemcpy(first, out, sizeof first, cudaMemcpyDeviceToHost));  // the host reads after the kernel
    printf("ran\n");
    return 0;
}

static int fresh_stacks_case() {
    float *out;
    CHECK_CUDA(cudaMalloc((void **)&out, kThreads * sizeof(float)));
    pthread_t t;
    const void *poisoned = nullptr;
    if (pthread_create(&t, nullptr, run_deep_kernel, out) != 0 || pthread_join(t, nullptr) != 0) return 2;
    if (pthread_create(&t, nullptr, probe_fresh_stacks, &poisoned) != 0 || pthread_join(t, nullptr) != 0) return 2;
    if (poisoned) printf("a fresh thread's fibre stacks are poisoned at %p\n", poisoned);
    else printf("clean\n");
    return poisoned ? 1 : 0;
}

__global__ void copy_kernel(float *dst, const float *src) { dst[threadIdx.x] = src[threadIdx.x]; }

// What the runtime, cuBLAS and NCCL calls must be given (emu_runtime.c's device_pointer and friends), each broken
// on purpose: `host_arg` a kernel given a host buffer; `copy_kind` a host-to-device copy into a host buffer;
// `copy_overlap` a device-to-device copy onto itself shifted by one float; `memset_host` a cudaMemsetAsync of a host
// buffer; `gemm_overlap` a product whose D overlaps its A; `grouped_host` a grouped product given its pointer arrays
// in host memory. Each aborts with the emulator's message.
static int call_case(const char *c) {
    static float host[64];
    float *dev;
    CHECK_CUDA(cudaMalloc((void **)&dev, 256 * sizeof(float)));
    CHECK_CUDA(cudaMemset(dev, 0, 256 * sizeof(float)));
    if (strcmp(c, "host_arg") == 0) copy_kernel<<<1, 32>>>(dev, host);
    else if (strcmp(c, "copy_kind") == 0) CHECK_CUDA(cudaMemcpyAsync(host, dev, 64, cudaMemcpyHostToDevice, 0));
    else if (strcmp(c, "copy_overlap") == 0) CHECK_CUDA(cudaMemcpyAsync(dev + 1, dev, 64, cudaMemcpyDeviceToDevice, 0));
    else if (strcmp(c, "memset_host") == 0) CHECK_CUDA(cudaMemsetAsync(host, 0, sizeof host, 0));
    else {
        cublasHandle_t h;
        if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 2;
        const float one = 1.0f, zero = 0.0f;
        if (strcmp(c, "gemm_overlap") == 0) {  // D = A B with D at A + 8 floats: 8 x 8 matrices
            cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, dev, CUDA_R_32F, 8, dev + 128, CUDA_R_32F, 8, &zero,
                         dev + 8, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        } else if (strcmp(c, "grouped_host") == 0) {
            const void *a[1] = {dev}, *b[1] = {dev + 64};
            void *d[1] = {dev + 128};
            const cublasOperation_t op[1] = {CUBLAS_OP_N};
            const int n8[1] = {8}, one_group[1] = {1};
            cublasGemmGroupedBatchedEx(h, op, op, n8, n8, n8, &one, a, CUDA_R_32F, n8, b, CUDA_R_32F, n8, &zero, d,
                                       CUDA_R_32F, n8, 1, one_group, CUBLAS_COMPUTE_32F);
        } else {
            return 2;
        }
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("%s: not stopped\n", c);
    return 1;
}

// A host-to-device copy is staged at the call and lands in its stream's order (emu_runtime.c): under
// EMU_STREAMS=lazy, the host's buffer changed after the call does not reach the device, and another stream that
// reads the destination with no event between sees what was there before (the allocation's poison, -1 as an int);
// after an event, the copy's value. Prints what each saw.
static int staged_copy_case() {
    int *dst, *seen;
    int host = 1, got[2] = {0, 0};
    cudaStream_t s1, s2;
    cudaEvent_t landed;
    CHECK_CUDA(cudaMalloc((void **)&dst, sizeof(int)));
    CHECK_CUDA(cudaMalloc((void **)&seen, 2 * sizeof(int)));
    CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CHECK_CUDA(cudaEventCreateWithFlags(&landed, cudaEventDisableTiming));
    CHECK_CUDA(cudaMemcpyAsync(dst, &host, sizeof host, cudaMemcpyHostToDevice, s1));
    host = 2;  // the host may reuse its buffer once the call returns
    CHECK_CUDA(cudaMemcpyAsync(seen, dst, sizeof(int), cudaMemcpyDeviceToDevice, s2));  // no event: a race
    CHECK_CUDA(cudaStreamSynchronize(s2));
    CHECK_CUDA(cudaEventRecord(landed, s1));
    CHECK_CUDA(cudaStreamWaitEvent(s2, landed, 0));
    CHECK_CUDA(cudaMemcpyAsync(seen + 1, dst, sizeof(int), cudaMemcpyDeviceToDevice, s2));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(got, seen, sizeof got, cudaMemcpyDeviceToHost));
    printf("without an event: %d; after the copy's event: %d\n", got[0], got[1]);
    return 0;
}

// A stream's queued work makes cudaStreamQuery say "not ready", each question moving it on by one piece, as a GPU
// works through a stream while its host polls (EMU_STREAMS=lazy: two copies queued; eager: none left). Prints how
// many times it was not ready.
static int stream_query_case() {
    int *a, *b, host = 5, got = 0, not_ready = 0;
    cudaStream_t s;
    CHECK_CUDA(cudaMalloc((void **)&a, sizeof(int)));
    CHECK_CUDA(cudaMalloc((void **)&b, sizeof(int)));
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_CUDA(cudaMemcpyAsync(a, &host, sizeof host, cudaMemcpyHostToDevice, s));
    CHECK_CUDA(cudaMemcpyAsync(b, a, sizeof(int), cudaMemcpyDeviceToDevice, s));
    cudaError_t status;
    while ((status = cudaStreamQuery(s)) == cudaErrorNotReady && not_ready < 100) not_ready++;
    CHECK_CUDA(status);
    CHECK_CUDA(cudaMemcpy(&got, b, sizeof got, cudaMemcpyDeviceToHost));
    printf("not ready %d times, then ready with %d\n", not_ready, got);
    return 0;
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "";
    if (strcmp(c, "stream_query") == 0) return stream_query_case();
    if (strcmp(c, "host_arg") == 0 || strncmp(c, "copy_", 5) == 0 || strcmp(c, "memset_host") == 0 ||
        strcmp(c, "gemm_overlap") == 0 || strcmp(c, "grouped_host") == 0)
        return call_case(c);
    if (strcmp(c, "staged_copy") == 0) return staged_copy_case();
    float *out;
    if (strcmp(c, "order") == 0) return order_case();
    if (strcmp(c, "cp_async_oob") == 0) return cp_async_case();
    if (strcmp(c, "smem_optin") == 0) return smem_optin_case();
    if (strcmp(c, "fresh_stacks") == 0) return fresh_stacks_case();
    if (strcmp(c, "racecheck") == 0 && argc > 2) return racecheck_case(argv[2]);
    if (strcmp(c, "oob_write") == 0) {
        CHECK_CUDA(cudaMalloc((void **)&out, 10 * sizeof(float)));
        oob_write_kernel<<<1, 1>>>(out, 10);
        CHECK_CUDA(cudaDeviceSynchronize());
        printf("oob_write: not stopped\n");
        return 1;
    }
    if (strcmp(c, "warp_mask") == 0 || strcmp(c, "deadlock") == 0 || strcmp(c, "misaligned") == 0) {
        __nv_bfloat16 *x;
        CHECK_CUDA(cudaMalloc((void **)&out, kThreads * sizeof(float)));
        CHECK_CUDA(cudaMalloc((void **)&x, 64 * sizeof *x));
        if (c[0] == 'w') warp_mask_kernel<<<1, 32>>>(out);
        else if (c[0] == 'd') deadlock_kernel<<<1, 64>>>(out);
        else misaligned_kernel<<<1, 32>>>(out, x);
        CHECK_CUDA(cudaDeviceSynchronize());
        printf("%s: not stopped\n", c);
        return 1;
    }
    fprintf(stderr, "usage: test_emu_checks order|cp_async_oob|smem_optin|warp_mask|misaligned|oob_write|deadlock|fresh_stacks|"
                    "host_arg|copy_kind|copy_overlap|memset_host|gemm_overlap|grouped_host|staged_copy|racecheck "
                    "broadcast|cp_async|cp_async_late|ldmatrix|blocks|blocks_barrier|streams|none\n");
    return 2;
}
