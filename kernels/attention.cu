// attention.cu: causal grouped-query attention, flash-attention 2 style, on
// the tensor cores through WMMA (16x16x16 bf16 fragments, fp32 accumulators).
// Semantics: src/backend/cuda/cuda_kernels.h and the CPU reference
// src/backend/cpu/cpu_attention.c; the T x T score matrix is never stored.
//
// Tiling: tiles of kTile = 64 query rows and 64 key rows (equal, so a tile
// pair is either fully visible, diagonal or fully masked); a 64-row tile is
// four 16-row blocks. D (16, 32, 64, 128) is a template parameter.
//
//   forward  block = (query tile, head, batch), 4 warps; warp w owns query
//            rows 16w..16w+15 of the tile. The block walks the key tiles
//            0..its own (causal), K and V staged in shared memory:
//              S = Q K^T         warp's 16 x 64 strip -> shared fp32
//              online softmax    two lanes per row (running max m, sum l, in
//                                the log2 domain); P -> shared bf16 and the
//                                row's rescale factor alpha -> shared
//              O = alpha O + P V O (16 x D per warp) stays in accumulator
//                                fragments, rescaled slot by slot (see map)
//            End: out = O / l (bf16, staged through shared memory),
//            lse = ln 2 * (m + log2 l), natural log of the scaled scores.
//   backward delta = rowsum(dout * out) (own kernel), then block = (key tile,
//            kv head, batch), 8 warps; K and V stay in shared memory, dK and
//            dV (64 x D) in accumulator fragments. For each query head of the
//            kv group and each query tile from the diagonal to T:
//              S = Q K^T, dP = dO V^T    16 fragments, 2 per warp, in registers
//              P = exp2(S scale log2e - lse log2e) (0 if masked),
//              dS = P (dP - delta)       -> shared bf16 (P and dS)
//              dV += P^T dO, dK += dS^T Q
//              dQ_tile = dS K            -> shared fp32 -> atomicAdd into the
//                                        fp32 workspace (several key tiles add
//                                        to one query row: dq is not bitwise
//                                        reproducible run to run)
//            End: dK * scale, dV -> bf16 (written once, no atomics: the block
//            owns its kv head). A last kernel writes dq = bf16(scale * dq_acc).
//
// Shared memory per block (bytes, D = 16 / 32 / 64 / 128): forward 36096 /
// 42240 / 54528 / 79104, backward 31232 / 39424 / 55808 / 88576; above 48 KB
// the launchers opt in with cudaFuncSetAttribute (fits sm_80's 163 KB too).
//
// Accumulator slot map: WMMA does not specify which (row, col) of a 16 x 16
// tile each slot x[i] of a thread's fp32 accumulator fragment holds, but it
// is fixed for a fragment type. build_accumulator_map loads a tile whose
// element (r, c) is 16 r + c and reads the slots back, so per-row factors
// (softmax rescale, lse, delta) and masks apply to fragments in registers.
//
// Out-of-range rows (>= T) of the last tile are zero-filled in shared memory
// and masked, so nothing NaN reaches what is written; a query row always sees
// key 0, so no visible row is empty. Global tensors must be 16-byte aligned
// (16-byte vector loads and stores): the launchers return
// cudaErrorMisalignedAddress otherwise.
#include <math.h>
#include <mma.h>
#include <stdint.h>

#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

using namespace nvcuda;

static constexpr int kTile = 64;            // query rows = key rows per tile
static constexpr int kBlocks = kTile / 16;  // 16-row blocks per tile
static constexpr int kFwdWarps = 4, kFwdThreads = 32 * kFwdWarps;
static constexpr int kBwdWarps = 8, kBwdThreads = 32 * kBwdWarps;
static constexpr float kLog2e = 1.4426950408889634f;
static constexpr float kLn2 = 0.69314718055994531f;

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragAcc;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> FragAT;  // A^T of a row-major tile
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragB;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBT;  // B^T of a row-major tile
static constexpr int kAccSlots = FragAcc::num_elements;

static constexpr size_t align128(size_t bytes) { return (bytes + 127) & ~(size_t)127; }

// Shared memory of the forward block (byte offsets, all 128-byte aligned).
template <int D>
struct FwdSmem {
    static constexpr int kLdQ = D + 8;      // bf16 Q, K, V tiles (padded against bank conflicts)
    static constexpr int kLdS = kTile + 4;  // fp32 scores
    static constexpr int kLdP = kTile + 8;  // bf16 probabilities
    static constexpr int kLdO = D + 4;      // fp32 output staging
    static constexpr size_t kQ = 0;
    static constexpr size_t kK = kQ + align128((size_t)kTile * kLdQ * 2);
    static constexpr size_t kV = kK + align128((size_t)kTile * kLdQ * 2);
    static constexpr size_t kS = kV + align128((size_t)kTile * kLdQ * 2);
    static constexpr size_t kP = kS + align128((size_t)kTile * kLdS * 4);
    static constexpr size_t kRow = kP + align128((size_t)kTile * kLdP * 2);  // per-row factor
    static constexpr size_t kBytes = kRow + align128((size_t)kTile * 4);
    static constexpr size_t kO = kK;  // after the key loop the staging reuses K and V
    static_assert(kO + (size_t)kTile * kLdO * 4 <= kS, "output staging must fit in K and V");
};

// Shared memory of the backward block.
template <int D>
struct BwdSmem {
    static constexpr int kLdQ = D + 8;      // bf16 K, V, Q, dO tiles
    static constexpr int kLdP = kTile + 8;  // bf16 P and dS
    static constexpr int kLdO = D + 4;      // fp32 staging of dQ, dK, dV
    static constexpr size_t kK = 0;
    static constexpr size_t kV = kK + align128((size_t)kTile * kLdQ * 2);
    static constexpr size_t kQ = kV + align128((size_t)kTile * kLdQ * 2);
    static constexpr size_t kDO = kQ + align128((size_t)kTile * kLdQ * 2);
    static constexpr size_t kP = kDO + align128((size_t)kTile * kLdQ * 2);
    static constexpr size_t kDS = kP + align128((size_t)kTile * kLdP * 2);
    static constexpr size_t kLse = kDS + align128((size_t)kTile * kLdP * 2);
    static constexpr size_t kDelta = kLse + align128((size_t)kTile * 4);
    static constexpr size_t kBytes = kDelta + align128((size_t)kTile * 4);
    static constexpr size_t kStage = kQ;  // reuses Q and dO once a query tile's products are done
    static_assert(kStage + (size_t)kTile * kLdO * 4 <= kP, "staging must fit in Q and dO");
};

// Slot i of this thread's FragAcc holds element (row, col) = (at(i) >> 4,
// at(i) & 15) of the 16 x 16 tile; 8 bits per slot, packed (fewer registers).
struct AccMap {
    static_assert(kAccSlots <= 8, "two words of four slots");
    unsigned packed[2];
    __device__ __forceinline__ int at(int i) const { return (int)((packed[i >> 2] >> (8 * (i & 3))) & 255u); }
};

// The AccMap of the calling thread. scratch: 256 floats of shared memory,
// free on entry and on return. Whole block.
__device__ __forceinline__ AccMap build_accumulator_map(float *scratch) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) scratch[i] = (float)i;
    __syncthreads();
    FragAcc f;
    wmma::load_matrix_sync(f, scratch, 16, wmma::mem_row_major);
    AccMap map = {{0u, 0u}};
#pragma unroll
    for (int i = 0; i < kAccSlots; i++) map.packed[i >> 2] |= (unsigned)f.x[i] << (8 * (i & 3));
    __syncthreads();
    return map;
}

// Rows row0.. row0 + kTile - 1 of a (T, stride) bf16 matrix (D columns used)
// into a kTile x D shared tile with leading dimension ld; rows >= T are zero.
template <int D, int kThreads>
__device__ __forceinline__ void load_tile(bf16 *dst, int ld, const bf16 *src, size_t stride, int row0, int T) {
    constexpr int kVecs = D / 8;  // 16-byte vectors per row
    for (int e = threadIdx.x; e < kTile * kVecs; e += kThreads) {
        const int r = e / kVecs, c = (e % kVecs) * 8;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < T) val = *reinterpret_cast<const uint4 *>(src + (size_t)(row0 + r) * stride + c);
        *reinterpret_cast<uint4 *>(dst + r * ld + c) = val;
    }
}

// A kTile x D fp32 shared tile (leading dimension ld) times `scale` into
// rows row0.. (those < T) of a (T, stride) bf16 matrix.
template <int D, int kThreads>
__device__ __forceinline__ void store_tile(bf16 *dst, size_t stride, const float *src, int ld, int row0, int T) {
    constexpr int kVecs = D / 8;
    for (int e = threadIdx.x; e < kTile * kVecs; e += kThreads) {
        const int r = e / kVecs, c = (e % kVecs) * 8;
        if (row0 + r < T) store8(dst + (size_t)(row0 + r) * stride + c, src + r * ld + c);
    }
}

// ---- forward -------------------------------------------------------------

template <int D>
__global__ void __launch_bounds__(kFwdThreads)
    attention_forward_kernel(bf16 *__restrict__ out, float *__restrict__ lse, const bf16 *__restrict__ q,
                             const bf16 *__restrict__ k, const bf16 *__restrict__ v, int T, int H, int KVH,
                             float scale_log2) {
    typedef FwdSmem<D> L;
    constexpr int kDF = D / 16;  // 16-column blocks of a head
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *q_s = reinterpret_cast<bf16 *>(smem + L::kQ);
    bf16 *k_s = reinterpret_cast<bf16 *>(smem + L::kK);
    bf16 *v_s = reinterpret_cast<bf16 *>(smem + L::kV);
    float *s_s = reinterpret_cast<float *>(smem + L::kS);
    bf16 *p_s = reinterpret_cast<bf16 *>(smem + L::kP);
    float *row_s = reinterpret_cast<float *>(smem + L::kRow);
    float *o_s = reinterpret_cast<float *>(smem + L::kO);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int q_tile = gridDim.x - 1 - blockIdx.x;  // longest rows first
    const int h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (H / KVH);
    const int q0 = q_tile * kTile;
    const size_t q_stride = (size_t)H * D, kv_stride = (size_t)KVH * D;
    const bf16 *q_bh = q + (size_t)b * T * q_stride + (size_t)h * D;
    const bf16 *k_bh = k + (size_t)b * T * kv_stride + (size_t)kvh * D;
    const bf16 *v_bh = v + (size_t)b * T * kv_stride + (size_t)kvh * D;

    const AccMap map = build_accumulator_map(s_s);

    load_tile<D, kFwdThreads>(q_s, L::kLdQ, q_bh, q_stride, q0, T);
    __syncthreads();
    FragA qf[kDF];
#pragma unroll
    for (int kk = 0; kk < kDF; kk++) wmma::load_matrix_sync(qf[kk], q_s + warp * 16 * L::kLdQ + kk * 16, L::kLdQ);
    FragAcc of[kDF];
#pragma unroll
    for (int f = 0; f < kDF; f++) wmma::fill_fragment(of[f], 0.0f);

    float *s_w = s_s + warp * 16 * L::kLdS;  // this warp's 16 rows
    bf16 *p_w = p_s + warp * 16 * L::kLdP;
    float *row_w = row_s + warp * 16;
    // softmax: lanes 2r and 2r + 1 own row r of the warp's strip, columns
    // 4c + 2 half, 4c + 2 half + 1 (c = 0..15)
    const int r = lane >> 1, half = lane & 1;
    const int q_row = q0 + warp * 16 + r;
    const float *s_row = s_w + r * L::kLdS;
    bf16 *p_row = p_w + r * L::kLdP;
    float m = -INFINITY, l = 0.0f;  // running max (log2 domain) and sum

    for (int kt = 0; kt <= q_tile; kt++) {
        const int k0 = kt * kTile;
        // on the diagonal tile, key blocks past the warp's own are fully masked
        const int kb_end = kt == q_tile ? warp + 1 : kBlocks;
        __syncthreads();  // every warp is done with the previous K, V
        load_tile<D, kFwdThreads>(k_s, L::kLdQ, k_bh, kv_stride, k0, T);
        load_tile<D, kFwdThreads>(v_s, L::kLdQ, v_bh, kv_stride, k0, T);
        __syncthreads();

        // S = Q K^T for the warp's 16 rows
#pragma unroll
        for (int kb = 0; kb < kBlocks; kb++) {
            if (kb < kb_end) {
                FragAcc sf;
                wmma::fill_fragment(sf, 0.0f);
#pragma unroll
                for (int kk = 0; kk < kDF; kk++) {
                    FragBT kf;
                    wmma::load_matrix_sync(kf, k_s + kb * 16 * L::kLdQ + kk * 16, L::kLdQ);
                    wmma::mma_sync(sf, qf[kk], kf, sf);
                }
                wmma::store_matrix_sync(s_w + kb * 16, sf, L::kLdS, wmma::mem_row_major);
            }
        }
        __syncwarp();

        // online softmax of row q_row over this key tile (masked scores -> -inf;
        // columns of skipped blocks hold stale values and are always masked)
        float x[32];
        float tile_max = -INFINITY;
#pragma unroll
        for (int c = 0; c < 16; c++) {
            const int col = 4 * c + 2 * half;
            const float2 sv = *reinterpret_cast<const float2 *>(s_row + col);
            const int kv = k0 + col;
            x[2 * c] = (kv <= q_row && kv < T) ? sv.x * scale_log2 : -INFINITY;
            x[2 * c + 1] = (kv + 1 <= q_row && kv + 1 < T) ? sv.y * scale_log2 : -INFINITY;
            tile_max = fmaxf(tile_max, fmaxf(x[2 * c], x[2 * c + 1]));
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        const float m_new = fmaxf(m, tile_max);
        const float base = m_new == -INFINITY ? 0.0f : m_new;  // never -inf in practice (key 0 is visible)
        const float alpha = exp2f(m - base);                   // 0 on the first tile
        float sum = 0.0f;
#pragma unroll
        for (int c = 0; c < 16; c++) {
            const float p0 = exp2f(x[2 * c] - base), p1 = exp2f(x[2 * c + 1] - base);
            sum += p0 + p1;
            *reinterpret_cast<__nv_bfloat162 *>(p_row + 4 * c + 2 * half) = __floats2bfloat162_rn(p0, p1);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * alpha + sum;
        m = m_new;
        if (half == 0) row_w[r] = alpha;
        __syncwarp();

        // O = alpha O + P V
#pragma unroll
        for (int f = 0; f < kDF; f++)
#pragma unroll
            for (int i = 0; i < kAccSlots; i++) of[f].x[i] *= row_w[map.at(i) >> 4];
#pragma unroll
        for (int kb = 0; kb < kBlocks; kb++) {
            if (kb < kb_end) {
                FragA pf;
                wmma::load_matrix_sync(pf, p_w + kb * 16, L::kLdP);
#pragma unroll
                for (int f = 0; f < kDF; f++) {
                    FragB vf;
                    wmma::load_matrix_sync(vf, v_s + kb * 16 * L::kLdQ + f * 16, L::kLdQ);
                    wmma::mma_sync(of[f], pf, vf, of[f]);
                }
            }
        }
    }

    // out = O / l, lse = ln(sum exp(scaled scores)) = ln 2 * (m + log2 l)
    __syncwarp();  // the last rescale has read row_w
    if (half == 0) {
        row_w[r] = 1.0f / l;
        if (q_row < T) lse[((size_t)b * H + h) * T + q_row] = (m + log2f(l)) * kLn2;
    }
    __syncwarp();
#pragma unroll
    for (int f = 0; f < kDF; f++)
#pragma unroll
        for (int i = 0; i < kAccSlots; i++) of[f].x[i] *= row_w[map.at(i) >> 4];
    __syncthreads();  // every warp is done with K and V: the staging reuses them
    float *o_w = o_s + warp * 16 * L::kLdO;
#pragma unroll
    for (int f = 0; f < kDF; f++) wmma::store_matrix_sync(o_w + f * 16, of[f], L::kLdO, wmma::mem_row_major);
    __syncwarp();
    bf16 *out_bh = out + (size_t)b * T * q_stride + (size_t)h * D;
    for (int e = lane; e < 16 * (D / 8); e += 32) {
        const int rr = e / (D / 8), c = (e % (D / 8)) * 8;
        const int row = q0 + warp * 16 + rr;
        if (row < T) store8(out_bh + (size_t)row * q_stride + c, o_w + rr * L::kLdO + c);
    }
}

// ---- backward ------------------------------------------------------------

// delta[b, h, t] = sum_d dout * out over the (B, T, H) rows of D values; D/8
// threads per row (8 bf16 each), summed with shuffles.
template <int D>
__global__ void attention_delta_kernel(float *__restrict__ delta, const bf16 *__restrict__ dout,
                                       const bf16 *__restrict__ out, size_t rows, int T, int H) {
    constexpr int kLanes = D / 8;
    // a warp-uniform trip count, so every lane reaches the shuffles
    const size_t total = (rows * kLanes + 31) / 32 * 32;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t row = i / kLanes;
        const int c = (int)(i % kLanes) * 8;
        float sum = 0.0f;
        if (row < rows) {
            float a[8], o[8];
            load8(dout + row * D + c, a);
            load8(out + row * D + c, o);
#pragma unroll
            for (int j = 0; j < 8; j++) sum += a[j] * o[j];
        }
#pragma unroll
        for (int offset = kLanes / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        if (row < rows && c == 0) {
            const size_t bt = row / H;  // b * T + t
            const int h = (int)(row % H);
            const size_t b = bt / T;
            const int t = (int)(bt % T);
            delta[(b * H + h) * T + t] = sum;
        }
    }
}

__device__ __forceinline__ void atomic_add4(float *dst, float4 val) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4 *>(dst), val);  // one vector reduction (sm_90)
#else
    atomicAdd(dst, val.x);
    atomicAdd(dst + 1, val.y);
    atomicAdd(dst + 2, val.z);
    atomicAdd(dst + 3, val.w);
#endif
}

// Registers: D <= 64 fits 128 per thread without spills, so two blocks share
// an SM; D = 128 (dK, dV, dQ fragments alone take 96) runs one block per SM.
template <int D>
__global__ void __launch_bounds__(kBwdThreads, D <= 64 ? 2 : 1)
    attention_backward_kernel(bf16 *__restrict__ dk, bf16 *__restrict__ dv, float *__restrict__ dq_acc,
                              const bf16 *__restrict__ dout, const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                              const bf16 *__restrict__ v, const float *__restrict__ lse,
                              const float *__restrict__ delta, int T, int H, int KVH, float scale,
                              float scale_log2) {
    typedef BwdSmem<D> L;
    constexpr int kDF = D / 16;
    constexpr int kOutFrags = kBlocks * kDF;  // 16 x 16 blocks of a kTile x D tile
    constexpr int kOutPerWarp = (kOutFrags + kBwdWarps - 1) / kBwdWarps;
    constexpr int kScorePerWarp = kBlocks * kBlocks / kBwdWarps;  // 16 x 16 blocks of a kTile x kTile tile
    static_assert(kBlocks * kBlocks % kBwdWarps == 0, "score blocks must split evenly over the warps");
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *k_s = reinterpret_cast<bf16 *>(smem + L::kK);
    bf16 *v_s = reinterpret_cast<bf16 *>(smem + L::kV);
    bf16 *q_s = reinterpret_cast<bf16 *>(smem + L::kQ);
    bf16 *do_s = reinterpret_cast<bf16 *>(smem + L::kDO);
    bf16 *p_s = reinterpret_cast<bf16 *>(smem + L::kP);
    bf16 *ds_s = reinterpret_cast<bf16 *>(smem + L::kDS);
    float *lse_s = reinterpret_cast<float *>(smem + L::kLse);  // lse * log2e
    float *delta_s = reinterpret_cast<float *>(smem + L::kDelta);
    float *stage = reinterpret_cast<float *>(smem + L::kStage);

    const int warp = threadIdx.x >> 5;
    const int k_tile = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;  // k_tile 0 (most work) first
    const int group = H / KVH;
    const int k0 = k_tile * kTile;
    const int num_q_tiles = (T + kTile - 1) / kTile;
    const size_t q_stride = (size_t)H * D, kv_stride = (size_t)KVH * D;

    const AccMap map = build_accumulator_map(reinterpret_cast<float *>(p_s));

    load_tile<D, kBwdThreads>(k_s, L::kLdQ, k + (size_t)b * T * kv_stride + (size_t)kvh * D, kv_stride, k0, T);
    load_tile<D, kBwdThreads>(v_s, L::kLdQ, v + (size_t)b * T * kv_stride + (size_t)kvh * D, kv_stride, k0, T);

    // warp's output blocks j: blk = warp + j * kBwdWarps (if < kOutFrags),
    // row block blk / kDF, column block blk % kDF
    FragAcc dk_f[kOutPerWarp], dv_f[kOutPerWarp];
#pragma unroll
    for (int j = 0; j < kOutPerWarp; j++) {
        wmma::fill_fragment(dk_f[j], 0.0f);
        wmma::fill_fragment(dv_f[j], 0.0f);
    }

    for (int hh = 0; hh < group; hh++) {
        const int h = kvh * group + hh;
        const bf16 *q_bh = q + (size_t)b * T * q_stride + (size_t)h * D;
        const bf16 *do_bh = dout + (size_t)b * T * q_stride + (size_t)h * D;
        float *dq_bh = dq_acc + (size_t)b * T * q_stride + (size_t)h * D;
        const float *lse_bh = lse + ((size_t)b * H + h) * T;
        const float *delta_bh = delta + ((size_t)b * H + h) * T;

        for (int qt = k_tile; qt < num_q_tiles; qt++) {
            const int q0 = qt * kTile;
            const bool diag = qt == k_tile;
            __syncthreads();  // the previous tile's staging (and K, V on entry) is done
            load_tile<D, kBwdThreads>(q_s, L::kLdQ, q_bh, q_stride, q0, T);
            load_tile<D, kBwdThreads>(do_s, L::kLdQ, do_bh, q_stride, q0, T);
            for (int i = threadIdx.x; i < kTile; i += kBwdThreads) {
                const bool in = q0 + i < T;
                lse_s[i] = in ? lse_bh[q0 + i] * kLog2e : 0.0f;
                delta_s[i] = in ? delta_bh[q0 + i] : 0.0f;
            }
            __syncthreads();

            // P and dS, one 16 x 16 block (query block qb, key block kb) at a time
            // (not unrolled: one block's fragments live at a time, which keeps D <= 64 within 128 registers)
#pragma unroll 1
            for (int j = 0; j < kScorePerWarp; j++) {
                const int blk = warp + j * kBwdWarps;
                const int qb = blk / kBlocks, kb = blk % kBlocks;
                FragAcc sf, dpf;
                wmma::fill_fragment(sf, 0.0f);
                wmma::fill_fragment(dpf, 0.0f);
                if (!diag || kb <= qb) {  // else the block is above the diagonal: all masked
#pragma unroll
                    for (int kk = 0; kk < kDF; kk++) {
                        FragA af;
                        FragBT bf;
                        wmma::load_matrix_sync(af, q_s + qb * 16 * L::kLdQ + kk * 16, L::kLdQ);
                        wmma::load_matrix_sync(bf, k_s + kb * 16 * L::kLdQ + kk * 16, L::kLdQ);
                        wmma::mma_sync(sf, af, bf, sf);
                        wmma::load_matrix_sync(af, do_s + qb * 16 * L::kLdQ + kk * 16, L::kLdQ);
                        wmma::load_matrix_sync(bf, v_s + kb * 16 * L::kLdQ + kk * 16, L::kLdQ);
                        wmma::mma_sync(dpf, af, bf, dpf);
                    }
                }
#pragma unroll
                for (int i = 0; i < kAccSlots; i++) {
                    const int row = qb * 16 + (map.at(i) >> 4), col = kb * 16 + (map.at(i) & 15);
                    const bool visible = k0 + col <= q0 + row && q0 + row < T;
                    const float p = visible ? exp2f(sf.x[i] * scale_log2 - lse_s[row]) : 0.0f;
                    const float ds = p * (dpf.x[i] - delta_s[row]);
                    p_s[row * L::kLdP + col] = __float2bfloat16_rn(p);
                    ds_s[row * L::kLdP + col] = __float2bfloat16_rn(ds);
                }
            }
            __syncthreads();

            // dV += P^T dO and dK += dS^T Q for the warp's (key block, column block)s
#pragma unroll
            for (int j = 0; j < kOutPerWarp; j++) {
                const int blk = warp + j * kBwdWarps;
                if (blk < kOutFrags) {
                    const int kb = blk / kDF, dc = blk % kDF;
#pragma unroll
                    for (int qb = 0; qb < kBlocks; qb++) {
                        if (diag && qb < kb) continue;  // masked on the diagonal
                        FragAT at;
                        FragB bf;
                        wmma::load_matrix_sync(at, p_s + qb * 16 * L::kLdP + kb * 16, L::kLdP);
                        wmma::load_matrix_sync(bf, do_s + qb * 16 * L::kLdQ + dc * 16, L::kLdQ);
                        wmma::mma_sync(dv_f[j], at, bf, dv_f[j]);
                        wmma::load_matrix_sync(at, ds_s + qb * 16 * L::kLdP + kb * 16, L::kLdP);
                        wmma::load_matrix_sync(bf, q_s + qb * 16 * L::kLdQ + dc * 16, L::kLdQ);
                        wmma::mma_sync(dk_f[j], at, bf, dk_f[j]);
                    }
                }
            }

            // dQ tile = dS K for the warp's (query block, column block)s
            FragAcc dq_f[kOutPerWarp];
#pragma unroll
            for (int j = 0; j < kOutPerWarp; j++) {
                wmma::fill_fragment(dq_f[j], 0.0f);
                const int blk = warp + j * kBwdWarps;
                if (blk < kOutFrags) {
                    const int qb = blk / kDF, dc = blk % kDF;
#pragma unroll
                    for (int kb = 0; kb < kBlocks; kb++) {
                        if (diag && kb > qb) continue;  // masked on the diagonal
                        FragA af;
                        FragB bf;
                        wmma::load_matrix_sync(af, ds_s + qb * 16 * L::kLdP + kb * 16, L::kLdP);
                        wmma::load_matrix_sync(bf, k_s + kb * 16 * L::kLdQ + dc * 16, L::kLdQ);
                        wmma::mma_sync(dq_f[j], af, bf, dq_f[j]);
                    }
                }
            }
            __syncthreads();  // Q and dO are no longer read: the staging reuses them
#pragma unroll
            for (int j = 0; j < kOutPerWarp; j++) {
                const int blk = warp + j * kBwdWarps;
                if (blk < kOutFrags)
                    wmma::store_matrix_sync(stage + (blk / kDF) * 16 * L::kLdO + (blk % kDF) * 16, dq_f[j], L::kLdO,
                                            wmma::mem_row_major);
            }
            __syncthreads();
            for (int e = threadIdx.x; e < kTile * (D / 4); e += kBwdThreads) {
                const int rr = e / (D / 4), c = (e % (D / 4)) * 4;
                if (q0 + rr < T)
                    atomic_add4(dq_bh + (size_t)(q0 + rr) * q_stride + c,
                                *reinterpret_cast<const float4 *>(stage + rr * L::kLdO + c));
            }
        }
    }

    // dV, then dK * scale, through the staging area to bf16
    bf16 *dk_b = dk + (size_t)b * T * kv_stride + (size_t)kvh * D;
    bf16 *dv_b = dv + (size_t)b * T * kv_stride + (size_t)kvh * D;
    __syncthreads();  // the last atomics have read the staging
#pragma unroll
    for (int j = 0; j < kOutPerWarp; j++) {
        const int blk = warp + j * kBwdWarps;
        if (blk < kOutFrags)
            wmma::store_matrix_sync(stage + (blk / kDF) * 16 * L::kLdO + (blk % kDF) * 16, dv_f[j], L::kLdO,
                                    wmma::mem_row_major);
    }
    __syncthreads();
    store_tile<D, kBwdThreads>(dv_b, kv_stride, stage, L::kLdO, k0, T);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kOutPerWarp; j++) {
        const int blk = warp + j * kBwdWarps;
        if (blk < kOutFrags) {
#pragma unroll
            for (int i = 0; i < kAccSlots; i++) dk_f[j].x[i] *= scale;
            wmma::store_matrix_sync(stage + (blk / kDF) * 16 * L::kLdO + (blk % kDF) * 16, dk_f[j], L::kLdO,
                                    wmma::mem_row_major);
        }
    }
    __syncthreads();
    store_tile<D, kBwdThreads>(dk_b, kv_stride, stage, L::kLdO, k0, T);
}

// dq = bf16(scale * dq_acc), 4 elements per step (n is a multiple of 16).
__global__ void attention_dq_kernel(bf16 *__restrict__ dq, const float *__restrict__ dq_acc, size_t n4, float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 a = reinterpret_cast<const float4 *>(dq_acc)[i];
        __nv_bfloat162 pair[2] = {__floats2bfloat162_rn(a.x * scale, a.y * scale),
                                  __floats2bfloat162_rn(a.z * scale, a.w * scale)};
        reinterpret_cast<uint2 *>(dq)[i] = *reinterpret_cast<const uint2 *>(pair);
    }
}

// ---- launchers -----------------------------------------------------------

static bool attention_shape_ok(int B, int T, int H, int KVH, int D) {
    return B >= 1 && T >= 1 && H >= 1 && KVH >= 1 && H % KVH == 0 && B <= 65535 && H <= 65535 &&
           (D == 16 || D == 32 || D == 64 || D == 128);
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// Dynamic shared memory above the default 48 KB needs an opt-in per kernel.
template <typename Kernel>
static cudaError_t allow_smem(Kernel kernel, size_t bytes) {
    if (bytes <= 48u * 1024u) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <int D>
static cudaError_t attention_forward_launch(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                                            int B, int T, int H, int KVH, cudaStream_t stream) {
    const size_t smem = FwdSmem<D>::kBytes;
    cudaError_t err = allow_smem(attention_forward_kernel<D>, smem);
    if (err != cudaSuccess) return err;
    const float scale = (float)(1.0 / sqrt((double)D));
    const dim3 grid((unsigned)((T + kTile - 1) / kTile), (unsigned)H, (unsigned)B);
    attention_forward_kernel<D><<<grid, kFwdThreads, smem, stream>>>(out, lse, q, k, v, T, H, KVH, scale * kLog2e);
    return cudaGetLastError();
}

template <int D>
static cudaError_t attention_backward_launch(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *out,
                                             const float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B,
                                             int T, int H, int KVH, float *workspace, cudaStream_t stream) {
    const size_t n = (size_t)B * T * H * D;
    float *dq_acc = workspace;
    float *delta = workspace + n;
    const float scale = (float)(1.0 / sqrt((double)D));
    cudaError_t err = cudaMemsetAsync(dq_acc, 0, n * sizeof(float), stream);
    if (err != cudaSuccess) return err;

    const size_t rows = (size_t)B * T * H;
    attention_delta_kernel<D><<<elementwise_blocks(rows * (D / 8)), kElementwiseThreads, 0, stream>>>(
        delta, dout, out, rows, T, H);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;

    const size_t smem = BwdSmem<D>::kBytes;
    if ((err = allow_smem(attention_backward_kernel<D>, smem)) != cudaSuccess) return err;
    const dim3 grid((unsigned)((T + kTile - 1) / kTile), (unsigned)KVH, (unsigned)B);
    attention_backward_kernel<D><<<grid, kBwdThreads, smem, stream>>>(dk, dv, dq_acc, dout, q, k, v, lse, delta, T,
                                                                      H, KVH, scale, scale * kLog2e);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;

    attention_dq_kernel<<<elementwise_blocks(n / 4), kElementwiseThreads, 0, stream>>>(dq, dq_acc, n / 4, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_attention_forward(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                              const uint16_t *v, int B, int T, int H, int KVH, int D,
                                              cudaStream_t stream) {
    if (B == 0 || T == 0) return cudaSuccess;
    if (!attention_shape_ok(B, T, H, KVH, D) || !lse) return cudaErrorInvalidValue;
    if (!aligned16(out) || !aligned16(q) || !aligned16(k) || !aligned16(v)) return cudaErrorMisalignedAddress;
    bf16 *o = as_bf16(out);
    const bf16 *qb = as_bf16(q), *kb = as_bf16(k), *vb = as_bf16(v);
    switch (D) {
        case 16: return attention_forward_launch<16>(o, lse, qb, kb, vb, B, T, H, KVH, stream);
        case 32: return attention_forward_launch<32>(o, lse, qb, kb, vb, B, T, H, KVH, stream);
        case 64: return attention_forward_launch<64>(o, lse, qb, kb, vb, B, T, H, KVH, stream);
        default: return attention_forward_launch<128>(o, lse, qb, kb, vb, B, T, H, KVH, stream);
    }
}

extern "C" size_t cuda_attention_workspace_bytes(int B, int T, int H, int KVH, int D) {
    (void)KVH;
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return 0;
    // fp32 dq accumulator (B, T, H, D), then delta (B, H, T)
    return ((size_t)B * T * H * D + (size_t)B * H * T) * sizeof(float);
}

extern "C" cudaError_t cuda_attention_backward(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout,
                                               const uint16_t *out, const float *lse, const uint16_t *q,
                                               const uint16_t *k, const uint16_t *v, int B, int T, int H, int KVH,
                                               int D, void *workspace, cudaStream_t stream) {
    if (B == 0 || T == 0) return cudaSuccess;
    if (!attention_shape_ok(B, T, H, KVH, D) || !workspace || !lse) return cudaErrorInvalidValue;
    if (!aligned16(dq) || !aligned16(dk) || !aligned16(dv) || !aligned16(dout) || !aligned16(out) ||
        !aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(workspace))
        return cudaErrorMisalignedAddress;
    bf16 *dqb = as_bf16(dq), *dkb = as_bf16(dk), *dvb = as_bf16(dv);
    const bf16 *dob = as_bf16(dout), *ob = as_bf16(out), *qb = as_bf16(q), *kb = as_bf16(k), *vb = as_bf16(v);
    float *ws = static_cast<float *>(workspace);
    switch (D) {
        case 16:
            return attention_backward_launch<16>(dqb, dkb, dvb, dob, ob, lse, qb, kb, vb, B, T, H, KVH, ws, stream);
        case 32:
            return attention_backward_launch<32>(dqb, dkb, dvb, dob, ob, lse, qb, kb, vb, B, T, H, KVH, ws, stream);
        case 64:
            return attention_backward_launch<64>(dqb, dkb, dvb, dob, ob, lse, qb, kb, vb, B, T, H, KVH, ws, stream);
        default:
            return attention_backward_launch<128>(dqb, dkb, dvb, dob, ob, lse, qb, kb, vb, B, T, H, KVH, ws, stream);
    }
}
