// moe_gemm.cu: the grouped expert products of the MoE layer in one launch
// each (cuda_gemm.c's cuda_grouped_*, MEGATRAIN_MOE_GEMM=kernel). Rows are
// grouped by expert: group e's rows are offsets[e] .. offsets[e+1] (DEVICE
// memory: the host needs no counts, only a bound on the total rows to size
// the grid). Group e's weight is W_e = [W0_e; W1_e], (OC0 + OC1) x IC bf16,
// its row j in stack 0 (w0 + (e * OC0 + j) * IC) when j < OC0, else in
// stack 1 (w1 + (e * OC1 + j - OC0) * IC): gate and up are the two stacks
// of one product, down a single stack (OC1 = 0). Row-major throughout:
//   forward          out_e  = in_e @ W_e^T            (n_e x OC, bf16)
//   backward input   din_e  = dout_e @ W_e (+ din_e)  (n_e x IC, bf16)
//   backward weight  dW_e  += dout_e^T @ in_e         (OC x IC, fp32)
// Every product is a C[M x N] = A[M x K] B[K x N] on bf16 tensor cores
// (mma.sync m16n8k16, fp32 accumulation):
//   forward          M rows, N OC, K IC: A = in (K contiguous), B^T = W (K contiguous)
//   backward input   M rows, N IC, K OC: A = dout (K contiguous), B = W (N contiguous)
//   backward weight  M OC, N IC, K rows: A^T = dout (M contiguous), B = in (N contiguous)
// Tiles of 128 x 128 x 32, 8 warps (2 along M x 4 along N, 64 x 32 each),
// a 4-stage cp.async pipeline; the shared-memory rows are padded by 16
// bytes so that ldmatrix reads 8 rows from 8 different bank groups.
// Ragged edges: loads past a bound are zero-filled (cp.async with 0 source
// bytes), stores are masked. Needs every dimension and leading dimension a
// multiple of 8 and 16-byte aligned pointers (cuda_gemm.c checks, and falls
// back to cuBLAS otherwise): then a 16-byte chunk is wholly in or out.
//
// Which tile a block computes:
//   forward, backward input: block b is column tile b % n_tiles of row tile
//   t = b / n_tiles; row tiles are numbered group after group (group e has
//   ceil(n_e / 128)), and each warp finds t's group by scanning the offsets
//   (32 groups per step, a warp prefix sum). The grid holds a bound on the
//   row tiles, max_rows / 128 + min(groups, max_rows), since
//   sum_e ceil(n_e / 128) <= sum_e floor(n_e / 128) + #{e : n_e > 0};
//   blocks past the last tile return at once.
//   backward weight: block b is (group, M tile, N tile) in that order and
//   loops over its group's rows; an empty group's blocks return at once
//   (its gradient gets nothing added).
// Deterministic: each output element is written by one thread, no atomics.
#include <limits.h>

#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 4, kThreads = 256;
constexpr int kPad = 8;                    // bf16 per shared row of padding (16 bytes)
constexpr int kLdK = kBK + kPad;           // a K-contiguous tile: 128 rows of 32 (+8)
constexpr int kLdMN = kBM + kPad;          // an M- or N-contiguous tile: 32 rows of 128 (+8)
constexpr int kTileElems = kBM * kLdK;     // 5120 >= kBK * kLdMN = 4352: room for either layout
constexpr int kStageElems = 2 * kTileElems;
constexpr size_t kSmemBytes = (size_t)kStages * kStageElems * sizeof(bf16);  // 80 KiB
static_assert(kBM == kBN, "the operand tiles share one layout size");
static_assert(kTileElems >= kBK * kLdMN, "a tile holds either layout");
static_assert(kBM * kBK / 8 == 2 * kThreads, "each thread copies two 16-byte chunks per operand and stage");

enum Mode { kForward = 0, kBackwardInput = 1, kBackwardWeight = 2 };

struct Args {
    const int32_t *offsets;  // groups + 1 (device)
    int groups;
    const bf16 *a;           // forward: in; backward: dout
    int lda;
    const bf16 *b;           // backward weight: in
    int ldb;
    const bf16 *w0, *w1;     // forward, backward input: the weight stacks
    bf16 *c;                 // forward, backward input: the output
    int ldc, accumulate;
    float *g0, *g1;          // backward weight: the gradient stacks
    int oc0, oc1, ic;
    int m_tiles, n_tiles;    // tiles along M (backward weight only) and N
};

// ---- PTX primitives (sm_80+) ----
__device__ __forceinline__ unsigned smem_addr(const void *p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared, or 16 zero bytes when !pred (nothing is read then).
__device__ __forceinline__ void cp_async16(bf16 *dst, const bf16 *src, bool pred) {
    const int bytes = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
// Plain: register i of lane l holds matrix i's (row l / 4, columns 2 (l % 4), +1).
// Transposed: (rows 2 (l % 4), +1, column l / 4).
__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

// d += a (16x16, row) * b (16x8, col), bf16 in, fp32 accumulation. With g = lane / 4, q = lane % 4:
// a: {a0: (g, 2q..), a1: (g+8, 2q..), a2: (g, 2q+8..), a3: (g+8, 2q+8..)}; b: {b0: (k 2q.., n g), b1: (k 2q+8.., n g)};
// d: {d0, d1: (g, 2q, 2q+1), d2, d3: (g+8, 2q, 2q+1)}.
__device__ __forceinline__ void mma_bf16(float d[4], const unsigned a[4], const unsigned b0, const unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// ---- end of PTX primitives ----

// Row j of group e's weight [W0_e; W1_e] (j < oc0 + oc1).
__device__ __forceinline__ const bf16 *weight_row(const Args &p, int e, int j) {
    return j < p.oc0 ? p.w0 + ((size_t)e * p.oc0 + j) * p.ic : p.w1 + ((size_t)e * p.oc1 + (j - p.oc0)) * p.ic;
}

// Row tile t (numbered group after group, ceil(n_e / kBM) for group e) -> its group, first row and row count;
// false when t is past the last. Every lane of the warp gets the same answer (the whole block does).
__device__ bool find_row_tile(const int32_t *__restrict__ offsets, int groups, int t, int &group, int &row0,
                              int &rows) {
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    int base = 0;  // row tiles of the groups before this step's 32
    for (int e0 = 0; e0 < groups; e0 += 32) {
        const int e = e0 + lane;
        int first = 0, n = 0;
        if (e < groups) {
            first = offsets[e];
            n = offsets[e + 1] - first;
        }
        const int tiles = n > 0 ? (n + kBM - 1) / kBM : 0;
        int incl = tiles;  // inclusive prefix sum over the lanes
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int v = __shfl_up_sync(full, incl, d);
            if (lane >= d) incl += v;
        }
        const int start = base + incl - tiles;
        const unsigned hit = __ballot_sync(full, t >= start && t < start + tiles);
        if (hit) {
            const int src = __ffs(hit) - 1;
            const int s = __shfl_sync(full, start, src), f = __shfl_sync(full, first, src);
            const int cnt = __shfl_sync(full, n, src);
            group = e0 + src;
            row0 = f + (t - s) * kBM;
            rows = min(kBM, f + cnt - row0);
            return true;
        }
        base += __shfl_sync(full, incl, 31);
    }
    return false;
}

template <int MODE>
__global__ void __launch_bounds__(kThreads, 2) moe_gemm_kernel(const Args p) {
    constexpr bool a_kmajor = MODE != kBackwardWeight;  // A stored M x K (else K x M)
    constexpr bool b_kmajor = MODE == kForward;          // B stored N x K (else K x N)
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *smem = reinterpret_cast<bf16 *>(smem_raw);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp & 1, warp_n = warp >> 1;  // warp tile: rows warp_m * 64 .., columns warp_n * 32 ..
    const int bid = blockIdx.x;

    // The block's tile: group e; first = the group's first activation row of the tile (forward, backward input:
    // the tile's rows are first .. first + m_lim) or of the group (backward weight: the K rows first .. first + K);
    // m0, n0 the tile's origin in M (backward weight) and N.
    int e, first, m_lim, m0 = 0, n0, N, K;
    if (MODE != kBackwardWeight) {
        const int t = bid / p.n_tiles;
        n0 = (bid % p.n_tiles) * kBN;
        if (!find_row_tile(p.offsets, p.groups, t, e, first, m_lim)) return;
        N = MODE == kForward ? p.oc0 + p.oc1 : p.ic;
        K = MODE == kForward ? p.ic : p.oc0 + p.oc1;
    } else {
        const int per_group = p.m_tiles * p.n_tiles, rem = bid % per_group;
        e = bid / per_group;
        m0 = (rem / p.n_tiles) * kBM;
        n0 = (rem % p.n_tiles) * kBN;
        first = p.offsets[e];
        K = p.offsets[e + 1] - first;
        if (K <= 0) return;
        m_lim = p.oc0 + p.oc1 - m0;  // valid rows of the tile: m < m_lim
        N = p.ic;
    }
    const int k_tiles = (K + kBK - 1) / kBK;

    // Stage s <- k tile kt: two 16-byte chunks per thread and operand.
    auto load_tile = [&](int s, int kt) {
        bf16 *As = smem + s * kStageElems, *Bs = As + kTileElems;
        const int k0 = kt * kBK;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int c = tid + i * kThreads;
            if (a_kmajor) {  // As[m][k]: 128 rows x 4 chunks; activation row first + m, column k
                const int r = c >> 2, kc = (c & 3) * 8, gk = k0 + kc;
                const bool ok = r < m_lim && gk < K;
                cp_async16(As + r * kLdK + kc, ok ? p.a + (size_t)(first + r) * p.lda + gk : p.a, ok);
            } else {  // As[k][m]: 32 rows x 16 chunks; activation row first + k, column m0 + m
                const int r = c >> 4, mc = (c & 15) * 8, gk = k0 + r;
                const bool ok = gk < K && mc < m_lim;
                cp_async16(As + r * kLdMN + mc, ok ? p.a + (size_t)(first + gk) * p.lda + m0 + mc : p.a, ok);
            }
            if (b_kmajor) {  // Bs[n][k]: weight row n0 + n, column k
                const int r = c >> 2, kc = (c & 3) * 8, gn = n0 + r, gk = k0 + kc;
                const bool ok = gn < N && gk < K;
                cp_async16(Bs + r * kLdK + kc, ok ? weight_row(p, e, gn) + gk : p.w0, ok);
            } else if (MODE == kBackwardInput) {  // Bs[k][n]: weight row k, column n0 + n
                const int r = c >> 4, nc = (c & 15) * 8, gk = k0 + r, gn = n0 + nc;
                const bool ok = gk < K && gn < N;
                cp_async16(Bs + r * kLdMN + nc, ok ? weight_row(p, e, gk) + gn : p.w0, ok);
            } else {  // Bs[k][n]: activation row first + k, column n0 + n
                const int r = c >> 4, nc = (c & 15) * 8, gk = k0 + r, gn = n0 + nc;
                const bool ok = gk < K && gn < N;
                cp_async16(Bs + r * kLdMN + nc, ok ? p.b + (size_t)(first + gk) * p.ldb + gn : p.b, ok);
            }
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int v = 0; v < 4; v++) acc[i][j][v] = 0.0f;

    // Prologue: tiles 0 .. kStages - 2, one commit group each (empty past the last), so that group g is tile g.
#pragma unroll
    for (int s = 0; s < kStages - 1; s++) {
        if (s < k_tiles) load_tile(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < k_tiles; kt++) {
        // kStages - 1 + kt groups committed; at most kStages - 2 pending means tile kt has landed (this thread's
        // copies); the barrier makes it every thread's, and says every warp is done with tile kt - 1's stage,
        // which the prefetch below overwrites.
        cp_async_wait<kStages - 2>();
        __syncthreads();
        const int next = kt + kStages - 1;
        if (next < k_tiles) load_tile(next % kStages, next);
        cp_async_commit();

        const bf16 *As = smem + (kt % kStages) * kStageElems, *Bs = As + kTileElems;
#pragma unroll
        for (int kk = 0; kk < kBK; kk += 16) {
            unsigned af[4][4], bfr[4][2];
#pragma unroll
            for (int i = 0; i < 4; i++) {  // the warp's four 16-row slices
                const int mr = warp_m * 64 + i * 16;
                if (a_kmajor)  // matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15)
                    ldmatrix_x4(af[i], As + (mr + (lane & 15)) * kLdK + kk + (lane >> 4) * 8);
                else  // stored [k][m], transposed: matrices (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7), (k 8-15, m 8-15)
                    ldmatrix_x4_trans(af[i], As + (kk + (lane & 7) + ((lane >> 4) << 3)) * kLdMN + mr +
                                                  (((lane >> 3) & 1) << 3));
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {  // pairs of 8-column slices
                const int nc = warp_n * 32 + j * 16;
                unsigned r[4];
                if (b_kmajor)  // stored [n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
                    ldmatrix_x4(r, Bs + (nc + (lane & 7) + ((lane >> 4) << 3)) * kLdK + kk + (((lane >> 3) & 1) << 3));
                else  // stored [k][n], transposed: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
                    ldmatrix_x4_trans(r, Bs + (kk + (lane & 7) + (((lane >> 3) & 1) << 3)) * kLdMN + nc +
                                             ((lane >> 4) << 3));
                bfr[2 * j][0] = r[0];
                bfr[2 * j][1] = r[1];
                bfr[2 * j + 1][0] = r[2];
                bfr[2 * j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) mma_bf16(acc[i][j], af[i], bfr[j][0], bfr[j][1]);
        }
    }
    cp_async_wait<0>();  // only empty groups can be pending here

    // Epilogue, straight from the registers: acc[i][j] holds rows warp_m * 64 + i * 16 + lane / 4 (+ 8) and columns
    // warp_n * 32 + j * 8 + 2 (lane % 4) (+ 1) of the tile. N is even, so a pair is wholly in or out.
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int m = warp_m * 64 + i * 16 + (lane >> 2) + h * 8;
                const int n = n0 + warp_n * 32 + j * 8 + (lane & 3) * 2;
                if (m >= m_lim || n >= N) continue;
                float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                if (MODE != kBackwardWeight) {
                    __nv_bfloat162 *dst = reinterpret_cast<__nv_bfloat162 *>(p.c + (size_t)(first + m) * p.ldc + n);
                    if (p.accumulate) {
                        const float2 old = __bfloat1622float2(*dst);
                        v0 += old.x;
                        v1 += old.y;
                    }
                    *dst = __floats2bfloat162_rn(v0, v1);
                } else {
                    const int row = m0 + m;  // row of [W0_e; W1_e]
                    float *g = row < p.oc0 ? p.g0 + ((size_t)e * p.oc0 + row) * p.ic
                                           : p.g1 + ((size_t)e * p.oc1 + (row - p.oc0)) * p.ic;
                    float2 *dst = reinterpret_cast<float2 *>(g + n);
                    float2 old = *dst;
                    old.x += v0;
                    old.y += v1;
                    *dst = old;
                }
            }
}

template <int MODE>
cudaError_t launch(const Args &p, long blocks, cudaStream_t stream) {
    if (blocks <= 0) return cudaSuccess;
    if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
    // per launch: the attribute belongs to the current device, and a process may drive several
    cudaError_t status =
        cudaFuncSetAttribute(moe_gemm_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes);
    if (status != cudaSuccess) return status;
    moe_gemm_kernel<MODE><<<(unsigned)blocks, kThreads, kSmemBytes, stream>>>(p);
    return cudaGetLastError();
}

// Blocks along the row tiles: a bound on sum_e ceil(n_e / kBM) for rows totalling at most max_rows.
long row_tile_bound(int groups, int max_rows) {
    if (max_rows <= 0 || groups <= 0) return 0;
    return (long)(max_rows / kBM) + (groups < max_rows ? groups : max_rows);
}

}  // namespace

cudaError_t cuda_moe_gemm_forward(uint16_t *out, int ldo, const uint16_t *inp, int ld_inp, const uint16_t *w0,
                                  const uint16_t *w1, const int32_t *offsets, int groups, int max_rows, int IC,
                                  int OC0, int OC1, cudaStream_t stream) {
    Args p = {};
    p.offsets = offsets;
    p.groups = groups;
    p.a = as_bf16(inp);
    p.lda = ld_inp;
    p.w0 = as_bf16(w0);
    p.w1 = w1 ? as_bf16(w1) : as_bf16(w0);
    p.c = as_bf16(out);
    p.ldc = ldo;
    p.oc0 = OC0;
    p.oc1 = w1 ? OC1 : 0;
    p.ic = IC;
    p.n_tiles = (p.oc0 + p.oc1 + kBN - 1) / kBN;
    return launch<kForward>(p, row_tile_bound(groups, max_rows) * p.n_tiles, stream);
}

cudaError_t cuda_moe_gemm_backward_input(uint16_t *dinp, int ld_dinp, const uint16_t *dout, int ld_dout,
                                         const uint16_t *w0, const uint16_t *w1, const int32_t *offsets, int groups,
                                         int max_rows, int IC, int OC0, int OC1, int accumulate,
                                         cudaStream_t stream) {
    Args p = {};
    p.offsets = offsets;
    p.groups = groups;
    p.a = as_bf16(dout);
    p.lda = ld_dout;
    p.w0 = as_bf16(w0);
    p.w1 = w1 ? as_bf16(w1) : as_bf16(w0);
    p.c = as_bf16(dinp);
    p.ldc = ld_dinp;
    p.accumulate = accumulate;
    p.oc0 = OC0;
    p.oc1 = w1 ? OC1 : 0;
    p.ic = IC;
    p.n_tiles = (IC + kBN - 1) / kBN;
    return launch<kBackwardInput>(p, row_tile_bound(groups, max_rows) * p.n_tiles, stream);
}

cudaError_t cuda_moe_gemm_backward_weight(float *g0, float *g1, const uint16_t *dout, int ld_dout,
                                          const uint16_t *inp, int ld_inp, const int32_t *offsets, int groups, int IC,
                                          int OC0, int OC1, cudaStream_t stream) {
    Args p = {};
    p.offsets = offsets;
    p.groups = groups;
    p.a = as_bf16(dout);
    p.lda = ld_dout;
    p.b = as_bf16(inp);
    p.ldb = ld_inp;
    p.g0 = g0;
    p.g1 = g1 ? g1 : g0;
    p.oc0 = OC0;
    p.oc1 = g1 ? OC1 : 0;
    p.ic = IC;
    p.m_tiles = (p.oc0 + p.oc1 + kBM - 1) / kBM;
    p.n_tiles = (IC + kBN - 1) / kBN;
    return launch<kBackwardWeight>(p, (long)groups * p.m_tiles * p.n_tiles, stream);
}
