// moe.cu: the mixture-of-experts kernels of the CUDA model
// (src/model/cuda/cuda_model_moe.c), each the device form of a step of the
// CPU's src/model/moe_layer.c. A = N*k assignments (token n's j-th expert is
// assignment n*k + j); "rows" are the assignments sorted expert by expert
// (expert-major, assignments ascending within an expert), the order the
// expert products read.
//   route           scores, lse, top-k (+ selection bias), raw scores, combine weights
//   tile count / scan / place
//                   a stable counting sort of the assignments into rows: per
//                   tile of 256 assignments a histogram, the prefix sums over
//                   tiles and experts (one block), each assignment's row (its
//                   rank among the tile's earlier assignments of its expert)
//   capacity        per expert, keep the `capacity` highest raw scores (ties to
//                   the earlier assignment), zero the dropped weights
//   gather          rows[r] = x[token of r]
//   combine         out[n] = resid[n] (+ shared[n]) + sum_j weight * y[row of (n, j)]   (one kernel with scatter)
//   combine bwd     d_rows[row] = weight * dy[n], d_w = dy[n] . y[row]
//   scatter         dx[n] += sum_j d_rows[row of (n, j)] (+ the router's fp32 part)
//   router bwd      d_logits from d_w (through the renormalisation), the
//                   load-balancing loss and the z-loss
//   row counts, prob sums
//                   the load-balancing statistics: assignments and sum of
//                   probabilities per (row group, expert)
// Deterministic: no floating-point atomics; the integer atomics count.
#include <math.h>

#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

static const int kTile = MT_MOE_TILE;

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// ---- router: one warp per token ---------------------------------------------

__global__ void moe_route_kernel(const float *__restrict__ logits, const float *__restrict__ bias,
                                 float *__restrict__ scores, float *__restrict__ lse, float *__restrict__ score_sum,
                                 int32_t *__restrict__ selected, float *__restrict__ raw, float *__restrict__ weight,
                                 int N, int E, int k, int sigmoid, int renorm) {
    const int n = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (n >= N) return;
    const float *l = logits + (size_t)n * E;
    float *s = scores + (size_t)n * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) sum += expf(l[e] - mx);
    sum = warp_sum(sum);
    float ssum = 0.0f;
    for (int e = lane; e < E; e += 32) {
        const float v = sigmoid ? 1.0f / (1.0f + expf(-l[e])) : expf(l[e] - mx) / sum;
        s[e] = v;
        ssum += v;
    }
    ssum = warp_sum(ssum);
    if (lane == 0) {
        lse[n] = mx + logf(sum);
        score_sum[n] = ssum;
    }
    __syncwarp(); // the row's scores, written by every lane, are read by every lane below
    // top-k: lane owns experts lane, lane + 32, ... (E <= 1024: a bit per owned expert)
    unsigned taken = 0;
    float chosen_sum = 0.0f;
    for (int j = 0; j < k; j++) {
        float best_v = -INFINITY;
        int best = -1;
        for (int i = 0, e = lane; e < E; i++, e += 32) {
            if (taken >> i & 1u) continue;
            const float v = s[e] + (bias ? bias[e] : 0.0f);
            if (best < 0 || v > best_v) { // ascending e: ties keep the lower index
                best_v = v;
                best = e;
            }
        }
        for (int off = 16; off > 0; off >>= 1) { // the highest value, ties to the lower index
            const float ov = __shfl_xor_sync(0xffffffffu, best_v, off);
            const int oe = __shfl_xor_sync(0xffffffffu, best, off);
            if (oe >= 0 && (best < 0 || ov > best_v || (ov == best_v && oe < best))) {
                best_v = ov;
                best = oe;
            }
        }
        if ((best & 31) == lane) taken |= 1u << (best >> 5);
        const float r = s[best];
        chosen_sum += r;
        if (lane == 0) {
            selected[(size_t)n * k + j] = best;
            raw[(size_t)n * k + j] = r;
        }
    }
    __syncwarp(); // lane 0 wrote raw
    for (int j = lane; j < k; j += 32) {
        const float r = raw[(size_t)n * k + j];
        weight[(size_t)n * k + j] = renorm ? r / chosen_sum : r;
    }
}

extern "C" cudaError_t cuda_moe_route(const float *logits, const float *bias, float *scores, float *lse,
                                      float *score_sum, int32_t *selected, float *raw, float *weight, int N, int E,
                                      int k, int sigmoid, int renorm, cudaStream_t stream) {
    if (N == 0) return cudaSuccess;
    if (E > 1024 || k > E) return cudaErrorInvalidValue;
    const int warps_per_block = 8;
    moe_route_kernel<<<(N + warps_per_block - 1) / warps_per_block, 32 * warps_per_block, 0, stream>>>(
        logits, bias, scores, lse, score_sum, selected, raw, weight, N, E, k, sigmoid, renorm);
    return cudaGetLastError();
}

// ---- the counting sort into rows ------------------------------------------

__global__ void moe_tile_count_kernel(const int32_t *__restrict__ selected, const uint8_t *__restrict__ keep,
                                      int32_t *__restrict__ tile_hist, int A, int E) {
    extern __shared__ int32_t hist[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
    const int i = blockIdx.x * kTile + threadIdx.x;
    if (i < A && (!keep || keep[i])) atomicAdd(&hist[selected[i]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) tile_hist[(size_t)blockIdx.x * E + e] = hist[e];
}

// One block: tile_hist (tiles, E) counts -> each tile's first row per expert; offsets (E + 1).
__global__ void moe_scan_kernel(int32_t *__restrict__ tile_hist, int32_t *__restrict__ offsets, int tiles, int E) {
    extern __shared__ int32_t total[]; // E + 1
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t running = 0;
        for (int t = 0; t < tiles; t++) {
            const int32_t c = tile_hist[(size_t)t * E + e];
            tile_hist[(size_t)t * E + e] = running;
            running += c;
        }
        total[e] = running;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t running = 0;
        for (int e = 0; e < E; e++) {
            const int32_t c = total[e];
            total[e] = running;
            offsets[e] = running;
            running += c;
        }
        offsets[E] = running;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int t = 0; t < tiles; t++) tile_hist[(size_t)t * E + e] += total[e];
}

__global__ void moe_place_kernel(const int32_t *__restrict__ selected, const uint8_t *__restrict__ keep,
                                 const int32_t *__restrict__ tile_base, int32_t *__restrict__ position,
                                 int32_t *__restrict__ token, int32_t *__restrict__ row_slot, int A, int k, int E) {
    __shared__ int32_t sel[MT_MOE_TILE];
    const int i = blockIdx.x * kTile + threadIdx.x;
    sel[threadIdx.x] = i < A && (!keep || keep[i]) ? selected[i] : -1;
    __syncthreads();
    if (i >= A) return;
    const int e = sel[threadIdx.x];
    if (e < 0) {
        position[i] = -1;
        return;
    }
    int rank = 0;
    for (int t = 0; t < (int)threadIdx.x; t++) rank += sel[t] == e;
    const int row = tile_base[(size_t)blockIdx.x * E + e] + rank;
    position[i] = row;
    token[row] = i / k;
    row_slot[row] = i;
}

extern "C" cudaError_t cuda_moe_sort(const int32_t *selected, const uint8_t *keep, int32_t *tile_hist,
                                     int32_t *offsets, int32_t *position, int32_t *token, int32_t *row_slot, int A,
                                     int k, int E, cudaStream_t stream) {
    if (A == 0) return cudaMemsetAsync(offsets, 0, (size_t)(E + 1) * sizeof(int32_t), stream);
    const int tiles = (A + kTile - 1) / kTile;
    moe_tile_count_kernel<<<tiles, kTile, (size_t)E * sizeof(int32_t), stream>>>(selected, keep, tile_hist, A, E);
    moe_scan_kernel<<<1, 1024, (size_t)(E + 1) * sizeof(int32_t), stream>>>(tile_hist, offsets, tiles, E);
    moe_place_kernel<<<tiles, kTile, 0, stream>>>(selected, keep, tile_hist, position, token, row_slot, A, k, E);
    return cudaGetLastError();
}

// One block per expert over its rows (sorted with every assignment kept): keep[i] says whether assignment i is
// among the expert's `capacity` highest raw scores (ties to the earlier assignment: the earlier row); a dropped
// assignment's combine weight becomes 0.
__global__ void moe_capacity_kernel(const float *__restrict__ raw, const int32_t *__restrict__ row_slot,
                                    const int32_t *__restrict__ offsets, uint8_t *__restrict__ keep,
                                    float *__restrict__ weight, long capacity) {
    const int e = blockIdx.x, begin = offsets[e], end = offsets[e + 1];
    for (int r = begin + threadIdx.x; r < end; r += blockDim.x) {
        const int i = row_slot[r];
        bool kept = true;
        if ((long)(end - begin) > capacity) {
            const float v = raw[i];
            long rank = 0;
            for (int q = begin; q < end; q++) {
                const float w = raw[row_slot[q]];
                rank += w > v || (w == v && q < r);
            }
            kept = rank < capacity;
        }
        keep[i] = kept;
        if (!kept) weight[i] = 0.0f;
    }
}

extern "C" cudaError_t cuda_moe_capacity(const float *raw, const int32_t *row_slot, const int32_t *offsets,
                                         uint8_t *keep, float *weight, int E, long capacity, cudaStream_t stream) {
    moe_capacity_kernel<<<E, 256, 0, stream>>>(raw, row_slot, offsets, keep, weight, capacity);
    return cudaGetLastError();
}

// ---- rows in and out ------------------------------------------------------

__global__ void moe_gather_kernel(bf16 *__restrict__ rows, const bf16 *__restrict__ x, const int32_t *__restrict__ token,
                                  int R, int C) {
    const int per_row = C / 8;
    const size_t total = (size_t)R * per_row;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / per_row, c = (i % per_row) * 8;
        *reinterpret_cast<uint4 *>(rows + r * C + c) =
            *reinterpret_cast<const uint4 *>(x + (size_t)token[r] * C + c);
    }
}

extern "C" cudaError_t cuda_moe_gather(uint16_t *rows, const uint16_t *x, const int32_t *token, int R, int C,
                                       cudaStream_t stream) {
    if (R == 0) return cudaSuccess;
    if (C % 8) return cudaErrorInvalidValue;
    moe_gather_kernel<<<elementwise_blocks((size_t)R * C / 8), kElementwiseThreads, 0, stream>>>(
        as_bf16(rows), as_bf16(x), token, R, C);
    return cudaGetLastError();
}

// out[n] = bf16((base[n]) (+ add16[n]) (+ add32[n]) + sum_j (weight ? weight[n, j] : 1) * rows[position[n, j]]):
// the forward's combine (base the residual, NULL under tensor parallel; add16 the shared expert; weighted) and
// the backward's scatter (base the input gradient so far, add32 the router's fp32 part, unweighted).
__global__ void moe_sum_rows_kernel(bf16 *out, const bf16 *base, // may be the same rows (each thread reads its own first)
                                    const bf16 *__restrict__ add16, const float *__restrict__ add32,
                                    const bf16 *__restrict__ rows, const int32_t *__restrict__ position,
                                    const float *__restrict__ weight, int N, int k, int C) {
    const int per_row = C / 8;
    const size_t total = (size_t)N * per_row;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = i / per_row, c = (i % per_row) * 8;
        float acc[8], v[8];
        if (base) load8(base + n * C + c, acc);
        else
#pragma unroll
            for (int q = 0; q < 8; q++) acc[q] = 0.0f;
        if (add16) {
            load8(add16 + n * C + c, v);
#pragma unroll
            for (int q = 0; q < 8; q++) acc[q] += v[q];
        }
        if (add32)
#pragma unroll
            for (int q = 0; q < 8; q++) acc[q] += add32[n * C + c + q];
        for (int j = 0; j < k; j++) {
            const int32_t r = position[n * k + j];
            if (r < 0) continue;
            const float w = weight ? weight[n * k + j] : 1.0f;
            load8(rows + (size_t)r * C + c, v);
#pragma unroll
            for (int q = 0; q < 8; q++) acc[q] += w * v[q];
        }
        store8(out + n * C + c, acc);
    }
}

extern "C" cudaError_t cuda_moe_combine(uint16_t *out, const uint16_t *resid, const uint16_t *shared,
                                        const uint16_t *y, const int32_t *position, const float *weight, int N, int k,
                                        int C, cudaStream_t stream) {
    if (N == 0) return cudaSuccess;
    if (C % 8) return cudaErrorInvalidValue;
    moe_sum_rows_kernel<<<elementwise_blocks((size_t)N * C / 8), kElementwiseThreads, 0, stream>>>(
        as_bf16(out), as_bf16(resid), as_bf16(shared), NULL, as_bf16(y), position, weight, N, k, C);
    return cudaGetLastError();
}

// One warp per assignment.
__global__ void moe_combine_backward_kernel(bf16 *__restrict__ d_rows, float *__restrict__ d_w,
                                            const bf16 *__restrict__ dy, const bf16 *__restrict__ y,
                                            const int32_t *__restrict__ position, const float *__restrict__ weight,
                                            int A, int k, int C) {
    const int i = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (i >= A) return;
    const int32_t r = position[i];
    if (r < 0) {
        if (lane == 0) d_w[i] = 0.0f;
        return;
    }
    const size_t n = (size_t)(i / k);
    const float w = weight[i];
    float dot = 0.0f;
    for (int c = lane * 8; c < C; c += 256) {
        float g[8], v[8], d[8];
        load8(dy + n * C + c, g);
        load8(y + (size_t)r * C + c, v);
#pragma unroll
        for (int q = 0; q < 8; q++) {
            dot += g[q] * v[q];
            d[q] = w * g[q];
        }
        store8(d_rows + (size_t)r * C + c, d);
    }
    dot = warp_sum(dot);
    if (lane == 0) d_w[i] = dot;
}

extern "C" cudaError_t cuda_moe_combine_backward(uint16_t *d_rows, float *d_w, const uint16_t *dy, const uint16_t *y,
                                                 const int32_t *position, const float *weight, int A, int k, int C,
                                                 cudaStream_t stream) {
    if (A == 0) return cudaSuccess;
    if (C % 8) return cudaErrorInvalidValue;
    const int warps_per_block = 8;
    moe_combine_backward_kernel<<<(A + warps_per_block - 1) / warps_per_block, 32 * warps_per_block, 0, stream>>>(
        as_bf16(d_rows), d_w, as_bf16(dy), as_bf16(y), position, weight, A, k, C);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_moe_scatter(uint16_t *dx, const uint16_t *d_rows, const int32_t *position,
                                        const float *extra, int N, int k, int C, cudaStream_t stream) {
    if (N == 0) return cudaSuccess;
    if (C % 8) return cudaErrorInvalidValue;
    moe_sum_rows_kernel<<<elementwise_blocks((size_t)N * C / 8), kElementwiseThreads, 0, stream>>>(
        as_bf16(dx), as_bf16(dx), NULL, extra, as_bf16(d_rows), position, NULL, N, k, C);
    return cudaGetLastError();
}

// ---- router backward: one warp per token --------------------------------------

__global__ void moe_router_backward_kernel(float *__restrict__ d_logits, const float *__restrict__ d_w,
                                           const float *__restrict__ logits, const float *__restrict__ scores,
                                           const float *__restrict__ score_sum, const float *__restrict__ lse,
                                           const int32_t *__restrict__ selected, const float *__restrict__ raw,
                                           const float *__restrict__ weight, const float *__restrict__ aux_coef,
                                           int aux_span, float aux_mult, float z_mult, int N, int E, int k,
                                           int sigmoid, int renorm) {
    const int n = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (n >= N) return;
    const float *s = scores + (size_t)n * E;
    float *dl = d_logits + (size_t)n * E;
    // d scores from the load-balancing loss: d aux / d p[n, e] = aux_mult * aux_coef[row of n, e]
    const float *coef = aux_coef ? aux_coef + (size_t)(n / aux_span) * E : NULL;
    float S = score_sum[n], dot = 0.0f;
    if (coef && sigmoid) { // p = s / sum(s): back to s
        for (int e = lane; e < E; e += 32) dot += aux_mult * coef[e] * s[e] / S;
        dot = warp_sum(dot);
    }
    for (int e = lane; e < E; e += 32) {
        const float dp = coef ? aux_mult * coef[e] : 0.0f;
        dl[e] = sigmoid ? (dp - dot) / S : dp;
    }
    __syncwarp();
    // through the renormalisation to the selected scores (distinct experts: one lane each)
    float chosen = 0.0f, dw_w = 0.0f;
    for (int j = 0; j < k; j++) {
        chosen += raw[(size_t)n * k + j];
        dw_w += d_w[(size_t)n * k + j] * weight[(size_t)n * k + j];
    }
    for (int j = lane; j < k; j += 32) {
        const float g = d_w[(size_t)n * k + j];
        dl[selected[(size_t)n * k + j]] += renorm ? (g - dw_w) / chosen : g;
    }
    __syncwarp();
    // scores -> logits
    dot = 0.0f;
    if (!sigmoid) {
        for (int e = lane; e < E; e += 32) dot += dl[e] * s[e];
        dot = warp_sum(dot);
    }
    const float *lg = logits + (size_t)n * E;
    const float z = z_mult * lse[n];
    for (int e = lane; e < E; e += 32) {
        float g = sigmoid ? dl[e] * s[e] * (1.0f - s[e]) : s[e] * (dl[e] - dot);
        if (z_mult != 0.0f) g += z * expf(lg[e] - lse[n]);
        dl[e] = g;
    }
}

extern "C" cudaError_t cuda_moe_router_backward(float *d_logits, const float *d_w, const float *logits,
                                                const float *scores, const float *score_sum, const float *lse,
                                                const int32_t *selected, const float *raw, const float *weight,
                                                const float *aux_coef, int aux_span, float aux_mult, float z_mult,
                                                int N, int E, int k, int sigmoid, int renorm, cudaStream_t stream) {
    if (N == 0) return cudaSuccess;
    const int warps_per_block = 8;
    moe_router_backward_kernel<<<(N + warps_per_block - 1) / warps_per_block, 32 * warps_per_block, 0, stream>>>(
        d_logits, d_w, logits, scores, score_sum, lse, selected, raw, weight, aux_coef, aux_span, aux_mult, z_mult, N,
        E, k, sigmoid, renorm);
    return cudaGetLastError();
}

// ---- load-balancing statistics ----------------------------------------------

__global__ void moe_row_counts_kernel(int32_t *__restrict__ counts, const int32_t *__restrict__ selected, int A, int k,
                                      int span, int E) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < A; i += gridDim.x * blockDim.x)
        atomicAdd(&counts[(size_t)(i / k / span) * E + selected[i]], 1);
}

// Grid (rows, experts / 256): thread e of row group g sums p[n, e] over the group's tokens, in order (double).
__global__ void moe_prob_sums_kernel(double *__restrict__ psum, const float *__restrict__ scores,
                                     const float *__restrict__ score_sum, int span, int E, int sigmoid) {
    const int g = blockIdx.x, e = blockIdx.y * blockDim.x + threadIdx.x;
    if (e >= E) return;
    double sum = 0.0;
    for (int t = g * span; t < (g + 1) * span; t++) {
        const double p = scores[(size_t)t * E + e];
        sum += sigmoid ? p / score_sum[t] : p;
    }
    psum[(size_t)g * E + e] = sum;
}

extern "C" cudaError_t cuda_moe_balance_stats(int32_t *counts, double *psum, const int32_t *selected,
                                              const float *scores, const float *score_sum, int N, int E, int k,
                                              int span, int want_psum, int sigmoid, cudaStream_t stream) {
    const int rows = N / span;
    cudaError_t status = cudaMemsetAsync(counts, 0, (size_t)rows * E * sizeof(int32_t), stream);
    if (status != cudaSuccess || N == 0) return status;
    const size_t A = (size_t)N * k;
    moe_row_counts_kernel<<<elementwise_blocks(A), kElementwiseThreads, 0, stream>>>(counts, selected, (int)A, k,
                                                                                    span, E);
    if (want_psum) {
        dim3 grid(rows, (E + 255) / 256);
        moe_prob_sums_kernel<<<grid, 256, 0, stream>>>(psum, scores, score_sum, span, E, sigmoid);
    }
    return cudaGetLastError();
}
