// attention.cu: causal grouped-query attention, flash-attention 2 style, on
// the tensor cores through mma.sync.m16n8k16 (bf16 in, fp32 accumulators),
// operands staged by cp.async (double-buffered) and read with ldmatrix.
// Semantics: src/backend/cuda/cuda_kernels.h and the CPU reference
// src/backend/cpu/cpu_attention.c; the T x T score matrix is never stored.
// D (16, 32, 64, 128) and the tile shapes are template parameters (the
// configurations per D are the ATTN_* macros below).
//
// Fragments (PTX ISA, mma.m16n8k16): lane = 4 g + t4 holds rows g and g + 8,
// columns 2 t4 and 2 t4 + 1 of each 16 x 8 accumulator tile (slots 0, 1: row
// g; 2, 3: row g + 8). Two neighbouring accumulator tiles, rounded to bf16,
// are exactly the A fragment of a 16 x 16 operand with the same rows, so
// probabilities go from the score accumulators into the next product without
// leaving registers.
//
//   forward  block = (query tile of 16 * MB * NW rows, head, batch), NW
//            warps; warp w owns MB blocks of 16 query rows. Blocks are
//            ordered longest rows first. The block walks the key tiles
//            (BC keys) from 0 to its last row, K and V in a two-stage
//            cp.async pipeline (tile kt + 1 loads while kt is used):
//              S = Q K^T        MB x (BC / 8) accumulator tiles per warp
//              online softmax   per row in the log2 domain; the four lanes of
//                               a quad hold a row (max by shuffles; the sum
//                               stays per lane until the end)
//              O = alpha O + P V   P straight from the S registers
//            Tiles after all of a warp's rows are skipped by that warp.
//            End: out = O / l (bf16), lse = ln 2 * (m + log2 l), natural log
//            of the scaled scores.
//   backward delta = rowsum(dout * out) (own kernel), then block = (key tile
//            of 16 * NW keys, kv head, batch), NW warps, key tile 0 (most
//            work) first; warp w owns keys 16 w .. 16 w + 15 and keeps their
//            dK, dV (16 x D) in accumulators. K, V stay in shared memory (and,
//            AREG, as A fragments in registers). For each query head of the
//            kv group and each query tile (BR rows) from the diagonal to T,
//            Q, dO, lse, delta in a two-stage cp.async pipeline:
//              S^T = K Q^T, dP^T = V dO^T   per warp, its 16 keys x BR
//              P^T = exp2(S^T scale log2e - lse log2e) (0 if masked),
//              dS^T = P^T (dP^T - delta)
//              dV += P^T dO, dK += dS^T Q   A operands from the registers
//              dS^T -> shared bf16; dQ_tile = dS K, split over the warps in
//                     16 x 16 units -> atomicAdd (4 fp32 after a swap
//                     between neighbouring lanes) into the
//                     workspace (several key tiles add to one query row: dq
//                     is not bitwise reproducible run to run)
//            End: dK * scale, dV -> bf16 (written once, no atomics: the block
//            owns its kv head's key rows). A last kernel writes
//            dq = bf16(scale * dq_acc).
//
// Shared memory: tiles are padded to D + 8 bf16 per row (ldmatrix rows are
// then conflict-free); see FwdCfg / BwdCfg. Above 48 KB the launchers opt in
// with cudaFuncSetAttribute; every configuration fits sm_80's 163 KB.
//
// Attention at positions (template flag AT; context parallel: a rank's Tq
// query rows, two load-balanced chunks of the sequence, against all Tk keys):
// the same kernels with a row's position read from q_pos (non-decreasing)
// instead of being its index. What changes: the forward's last key tile and
// each warp's skip test come from the positions of the block's and the
// warp's last rows, its mask from each row's position (kept in registers);
// the backward's first query tile is the one holding the first row whose
// position reaches the block's first key (a binary search in q_pos), a
// tile's positions travel with its lse and delta (a third cp.async array),
// and a key block no row sees writes zeros. dK and dV are written in fp32
// for the reduce-scatter over the cp ranks. At positions 0..T-1 it computes
// what the dense kernels compute in the same order (test_cuda_ops checks the
// bits); the dense instantiations compile to the register counts they had
// before the flag.
//
// Out-of-range rows (>= T) of a last tile are zero-filled (cp.async with a
// source size of 0) and masked, so nothing NaN reaches what is written; a
// query row always sees key 0, so no visible row is empty. Global tensors
// must be 16-byte aligned (16-byte cp.async): the launchers return
// cudaErrorMisalignedAddress otherwise.
#include <math.h>
#include <stdint.h>

#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

// Tile configurations (-D overrides are for benchmarking variants; with
// nvcc, escape the commas: '-DATTN_BWD_SMALL=4\,64\,false\,2'). Chosen on an
// H100 among 2-8 warps, query tiles 32-128, key tiles 32-128, fragments in
// registers or reloaded (tests/gpu/attention_selftest.cu timings, T = 4096):
//   H=32 KVH=8 D=64    forward 0.234 ms 293 TFLOP/s   backward 0.90 ms 190 TFLOP/s
//   H=16 KVH=8 D=128   forward 0.218 ms 315 TFLOP/s   backward 0.80 ms 214 TFLOP/s
// (the WMMA version before: 0.73 / 0.78 ms forward, 3.38 / 3.04 ms backward).
// Forward: warps, 16-row blocks per warp (query tile = 16 * blocks * warps),
// key tile, Q fragments kept in registers, minimum blocks per SM.
#ifndef ATTN_FWD_SMALL  // D = 16, 32, 64
#define ATTN_FWD_SMALL 4, 2, 64, true, 2
#endif
#ifndef ATTN_FWD_LARGE  // D = 128
#define ATTN_FWD_LARGE 4, 2, 32, false, 1
#endif
// Backward: warps (key tile = 16 * warps), query tile, K and V fragments kept
// in registers, minimum blocks per SM.
#ifndef ATTN_BWD_SMALL  // D = 16, 32, 64
#define ATTN_BWD_SMALL 4, 64, false, 2
#endif
#ifndef ATTN_BWD_LARGE  // D = 128
#define ATTN_BWD_LARGE 8, 64, false, 1
#endif

static constexpr float kLog2e = 1.4426950408889634f;
static constexpr float kLn2 = 0.69314718055994531f;

// ---- PTX helpers (sm_80+) --------------------------------------------------

__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, asynchronous; zero-filled when !pred (nothing read).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(pred ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool pred) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(pred ? 4 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Four 8 x 8 bf16 matrices; lane i gives the address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void ldsm4(unsigned (&r)[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm4t(unsigned (&r)[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// c += a b (16 x 16 bf16 times 16 x 8 bf16, fp32 accumulators)
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x (MUFU, flushes denormal results to 0; 2^-inf = 0)
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// two fp32 -> bf16x2 (lo in the low half: the lower column of a fragment)
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned *>(&v);
}

// The A fragment (16 x 16, rows of the accumulator tiles) of accumulator
// tiles c0 (columns 0..7) and c1 (columns 8..15), rounded to bf16.
__device__ __forceinline__ void acc_to_a(unsigned (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack_bf16(c0[0], c0[1]);
    a[1] = pack_bf16(c0[2], c0[3]);
    a[2] = pack_bf16(c1[0], c1[1]);
    a[3] = pack_bf16(c1[2], c1[3]);
}

// Rows row0 .. row0 + ROWS - 1 of a (T, stride) bf16 matrix (D columns) into
// a ROWS x D shared tile with leading dimension D + 8, asynchronously; rows
// >= T are zero-filled.
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void cp_tile(bf16 *dst, const bf16 *src, size_t stride, int row0, int T) {
    constexpr int kVecs = D / 8, kTotal = ROWS * kVecs;
#pragma unroll
    for (int i = 0; i < (kTotal + THREADS - 1) / THREADS; i++) {
        const int e = (int)threadIdx.x + i * THREADS;
        if (kTotal % THREADS == 0 || e < kTotal) {
            const int r = e / kVecs, c = (e % kVecs) * 8;
            const bool in = row0 + r < T;
            cp_async16(dst + r * (D + 8) + c, src + (size_t)(in ? row0 + r : 0) * stride + c, in);
        }
    }
}

// The position of query row `row` (< Tq): its index (dense) or q_pos[row]
// (attention at positions).
template <bool AT>
__device__ __forceinline__ int row_pos(const int32_t *q_pos, int row) {
    if constexpr (AT)
        return __ldg(q_pos + row);
    else
        return row;
}

// ---- forward -------------------------------------------------------------

template <int D, int NW, int MB, int BC>
struct FwdCfg {
    static constexpr int kThreads = 32 * NW;
    static constexpr int kBr = 16 * MB * NW;  // query rows per block
    static constexpr int kLd = D + 8;         // bf16 tiles, padded: conflict-free ldmatrix rows
    static constexpr size_t kQ = 0;
    static constexpr size_t kK = kQ + (size_t)kBr * kLd * 2;
    static constexpr size_t kV = kK + (size_t)2 * BC * kLd * 2;  // K, V: two stages each
    static constexpr size_t kBytes = kV + (size_t)2 * BC * kLd * 2;
};

template <int D, int NW, int MB, int BC, bool QREG, int MINB, bool AT>
__global__ void __launch_bounds__(32 * NW, MINB)
    attention_forward_kernel(bf16 *__restrict__ out, float *__restrict__ lse, const bf16 *__restrict__ q,
                             const bf16 *__restrict__ k, const bf16 *__restrict__ v,
                             const int32_t *__restrict__ q_pos, int B, int Tq, int Tk, int H, int KVH,
                             float scale_log2) {
    typedef FwdCfg<D, NW, MB, BC> C;
    if constexpr (!AT) Tk = Tq;  // one value for the compiler (dense: the launcher passes T twice)
    constexpr int kLd = C::kLd, kBr = C::kBr, kThreads = C::kThreads;
    constexpr int kKC = D / 16;  // 16-wide chunks of a head
    constexpr int kSN = BC / 8;  // 8-column tiles of a score strip
    constexpr int kON = D / 8;   // 8-column tiles of an output strip
    static_assert(BC % 16 == 0, "key tile");
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *q_s = reinterpret_cast<bf16 *>(smem + C::kQ);
    bf16 *k_s = reinterpret_cast<bf16 *>(smem + C::kK);
    bf16 *v_s = reinterpret_cast<bf16 *>(smem + C::kV);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;  // fragment row (and row + 8), column pair 2 t4
    const int num_q_tiles = (Tq + kBr - 1) / kBr;
    const int bh = (int)(blockIdx.x % (unsigned)(H * B));
    const int q_tile = num_q_tiles - 1 - (int)(blockIdx.x / (unsigned)(H * B));  // longest rows first
    const int h = bh % H, b = bh / H;
    const int kvh = h / (H / KVH);
    const int q0 = q_tile * kBr;
    const size_t q_stride = (size_t)H * D, kv_stride = (size_t)KVH * D;
    const bf16 *q_bh = q + (size_t)b * Tq * q_stride + (size_t)h * D;
    const bf16 *k_bh = k + (size_t)b * Tk * kv_stride + (size_t)kvh * D;
    const bf16 *v_bh = v + (size_t)b * Tk * kv_stride + (size_t)kvh * D;
    const int n_kt = row_pos<AT>(q_pos, min(q0 + kBr, Tq) - 1) / BC + 1;  // key tiles up to the block's last row

    cp_tile<D, kBr, kThreads>(q_s, q_bh, q_stride, q0, Tq);
    cp_tile<D, BC, kThreads>(k_s, k_bh, kv_stride, 0, Tk);
    cp_tile<D, BC, kThreads>(v_s, v_bh, kv_stride, 0, Tk);
    cp_async_commit();

    const int wrow = warp * 16 * MB;  // the warp's first row in the tile
    // The positions of the warp's first and last rows (its rows past Tq
    // aside: they are never written); a warp with no row skips every tile.
    // Dense: the rows' own indices, as if every row existed.
    const bool w_rows = !AT || q0 + wrow < Tq;
    const int w_first = w_rows ? row_pos<AT>(q_pos, q0 + wrow) : -1;
    const int w_last = !AT ? q0 + wrow + 16 * MB - 1 : w_rows ? row_pos<AT>(q_pos, min(q0 + wrow + 16 * MB, Tq) - 1) : -1;
    // this thread's rows' positions (rows g and g + 8 of each 16-row block), for the mask
    int pos_r[AT ? MB : 1][2];
    if constexpr (AT) {
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int row = q0 + wrow + mb * 16 + g + 8 * hh;
                pos_r[mb][hh] = row < Tq ? q_pos[row] : -1;  // a row past Tq sees nothing
            }
    }
    // ldmatrix lane addresses: A (and B from a [k][n] tile, .trans) rows a_row,
    // column a_col; B from an [n][k] tile rows b_row, column b_col
    const int a_row = lane & 15, a_col = (lane >> 4) * 8;
    const int b_row = (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;

    unsigned qf[QREG ? MB : 1][QREG ? kKC : 1][4];
    float o[MB][kON][4];
    float m_r[MB][2], l_r[MB][2];  // running max (log2 domain), this thread's part of the running sum
#pragma unroll
    for (int mb = 0; mb < MB; mb++) {
#pragma unroll
        for (int n = 0; n < kON; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) o[mb][n][i] = 0.0f;
        m_r[mb][0] = m_r[mb][1] = -INFINITY;
        l_r[mb][0] = l_r[mb][1] = 0.0f;
    }

    for (int kt = 0; kt < n_kt; kt++) {
        cp_async_wait_all();
        __syncthreads();  // tile kt has landed; every warp is done with tile kt - 1
        if (kt + 1 < n_kt) {
            const int st = (kt + 1) & 1;
            cp_tile<D, BC, kThreads>(k_s + st * BC * kLd, k_bh, kv_stride, (kt + 1) * BC, Tk);
            cp_tile<D, BC, kThreads>(v_s + st * BC * kLd, v_bh, kv_stride, (kt + 1) * BC, Tk);
        }
        cp_async_commit();
        if constexpr (QREG) {
            if (kt == 0) {
#pragma unroll
                for (int mb = 0; mb < MB; mb++)
#pragma unroll
                    for (int kc = 0; kc < kKC; kc++)
                        ldsm4(qf[mb][kc], q_s + (wrow + mb * 16 + a_row) * kLd + kc * 16 + a_col);
            }
        }
        const int k0 = kt * BC;
        if (k0 > w_last) continue;  // every key after every row of the warp
        const bf16 *k_t = k_s + (kt & 1) * BC * kLd;
        const bf16 *v_t = v_s + (kt & 1) * BC * kLd;

        // S = Q K^T
        float s[MB][kSN][4];
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int n = 0; n < kSN; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) s[mb][n][i] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < kKC; kc++) {
            unsigned a[MB][4];
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
                if constexpr (QREG) {
#pragma unroll
                    for (int i = 0; i < 4; i++) a[mb][i] = qf[mb][kc][i];
                } else {
                    ldsm4(a[mb], q_s + (wrow + mb * 16 + a_row) * kLd + kc * 16 + a_col);
                }
            }
#pragma unroll
            for (int np = 0; np < kSN / 2; np++) {
                unsigned bb[4];
                ldsm4(bb, k_t + (np * 16 + b_row) * kLd + kc * 16 + b_col);
#pragma unroll
                for (int mb = 0; mb < MB; mb++) {
                    mma16816(s[mb][2 * np], a[mb], bb[0], bb[1]);
                    mma16816(s[mb][2 * np + 1], a[mb], bb[2], bb[3]);
                }
            }
        }

        // causal mask and keys past Tk (-inf: probability 0); under positions
        // a key past Tk is after every row's position
        if (k0 + BC - 1 > w_first || k0 + BC > Tk) {
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int n = 0; n < kSN; n++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int col = k0 + n * 8 + 2 * t4 + (i & 1);
                        if constexpr (AT) {
                            if (col > pos_r[mb][i >> 1]) s[mb][n][i] = -INFINITY;
                        } else {
                            const int row = q0 + wrow + mb * 16 + g + ((i >> 1) << 3);
                            if (col > row || col >= Tk) s[mb][n][i] = -INFINITY;
                        }
                    }
        }

        // online softmax: rows g (slots 0, 1) and g + 8 (slots 2, 3), the
        // four lanes of a quad hold a row's columns
#pragma unroll
        for (int mb = 0; mb < MB; mb++) {
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                float mx = -INFINITY;
#pragma unroll
                for (int n = 0; n < kSN; n++) mx = fmaxf(mx, fmaxf(s[mb][n][2 * hh], s[mb][n][2 * hh + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m_r[mb][hh], mx * scale_log2);
                const float base = m_new == -INFINITY ? 0.0f : m_new;  // never -inf in practice (key 0 is visible)
                const float alpha = fast_exp2(m_r[mb][hh] - base);     // 0 on the first tile
                m_r[mb][hh] = m_new;
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < kSN; n++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const float p = fast_exp2(fmaf(s[mb][n][2 * hh + j], scale_log2, -base));
                        s[mb][n][2 * hh + j] = p;
                        sum += p;
                    }
                l_r[mb][hh] = l_r[mb][hh] * alpha + sum;
#pragma unroll
                for (int n = 0; n < kON; n++) {
                    o[mb][n][2 * hh] *= alpha;
                    o[mb][n][2 * hh + 1] *= alpha;
                }
            }
        }

        // O += P V (P from the score registers, rounded to bf16)
#pragma unroll
        for (int kc = 0; kc < BC / 16; kc++) {
            unsigned a[MB][4];
#pragma unroll
            for (int mb = 0; mb < MB; mb++) acc_to_a(a[mb], s[mb][2 * kc], s[mb][2 * kc + 1]);
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                unsigned bb[4];
                ldsm4t(bb, v_t + (kc * 16 + a_row) * kLd + dp * 16 + a_col);
#pragma unroll
                for (int mb = 0; mb < MB; mb++) {
                    mma16816(o[mb][2 * dp], a[mb], bb[0], bb[1]);
                    mma16816(o[mb][2 * dp + 1], a[mb], bb[2], bb[3]);
                }
            }
        }
    }

    // out = O / l, lse = ln(sum exp(scaled scores)) = ln 2 * (m + log2 l)
    bf16 *out_bh = out + (size_t)b * Tq * q_stride + (size_t)h * D;
#pragma unroll
    for (int mb = 0; mb < MB; mb++) {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            float l = l_r[mb][hh];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = 1.0f / l;
            const int row = q0 + wrow + mb * 16 + g + 8 * hh;
            if (row < Tq) {
                bf16 *orow = out_bh + (size_t)row * q_stride + 2 * t4;
#pragma unroll
                for (int n = 0; n < kON; n++)
                    *reinterpret_cast<__nv_bfloat162 *>(orow + n * 8) =
                        __floats2bfloat162_rn(o[mb][n][2 * hh] * inv, o[mb][n][2 * hh + 1] * inv);
                if (t4 == 0) lse[((size_t)b * H + h) * Tq + row] = (m_r[mb][hh] + log2f(l)) * kLn2;
            }
        }
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
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900) || defined(MT_EMULATED_SM)  // the emulator runs sm_90's
    atomicAdd(reinterpret_cast<float4 *>(dst), val);  // one vector reduction (sm_90)
#else
    atomicAdd(dst, val.x);
    atomicAdd(dst + 1, val.y);
    atomicAdd(dst + 2, val.z);
    atomicAdd(dst + 3, val.w);
#endif
}

// Backward, one warp's 16 keys x kSN * 8 rows in accumulator layout: S^T -> P^T
// (0 where masked: key after the row's position, or row >= Tq), dP^T -> dS^T =
// P^T (dP^T - delta). key: the thread's first key (its second is key + 8);
// pos_t: the tile's rows' positions (AT; else a row's position is its index).
template <bool MASK, bool AT, int kSN>
__device__ __forceinline__ void probs_and_dscores(float (&sacc)[kSN][4], float (&pacc)[kSN][4], const float *lse_t,
                                                  const float *delta_t, const int *pos_t, float scale_log2, int t4,
                                                  int key, int q0, int Tq) {
#pragma unroll
    for (int n = 0; n < kSN; n++) {
        const int c = n * 8 + 2 * t4;
        const float2 lv = *reinterpret_cast<const float2 *>(lse_t + c);
        const float2 dl = *reinterpret_cast<const float2 *>(delta_t + c);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float lsev = (i & 1) ? lv.y : lv.x, dlv = (i & 1) ? dl.y : dl.x;
            float p = fast_exp2(fmaf(sacc[n][i], scale_log2, -lsev * kLog2e));
            if (MASK) {
                const int row = q0 + c + (i & 1);
                const int pos = AT ? pos_t[c + (i & 1)] : row;
                if (key + ((i >> 1) << 3) > pos || row >= Tq) p = 0.0f;
            }
            pacc[n][i] = p * (pacc[n][i] - dlv);
            sacc[n][i] = p;
        }
    }
}

template <int D, int NW, int BR>
struct BwdCfg {
    static constexpr int kThreads = 32 * NW;
    static constexpr int kBc = 16 * NW;    // keys per block, 16 per warp
    static constexpr int kLd = D + 8;      // bf16 K, V, Q, dO tiles
    static constexpr int kLdS = BR + 8;    // bf16 dS^T (key rows, query columns)
    static constexpr size_t kK = 0;
    static constexpr size_t kV = kK + (size_t)kBc * kLd * 2;
    static constexpr size_t kQ = kV + (size_t)kBc * kLd * 2;      // two stages
    static constexpr size_t kDO = kQ + (size_t)2 * BR * kLd * 2;  // two stages
    static constexpr size_t kLse = kDO + (size_t)2 * BR * kLd * 2;
    static constexpr size_t kDelta = kLse + (size_t)2 * BR * 4;
    static constexpr size_t kDS = kDelta + (size_t)2 * BR * 4;
    static constexpr size_t kPos = kDS + (size_t)kBc * kLdS * 2;  // attention at positions: two stages
    static constexpr size_t bytes(bool at) { return kPos + (at ? (size_t)2 * BR * 4 : 0); }
};

// The first row t of q_pos (non-decreasing, Tq rows) with q_pos[t] >= key;
// Tq if none.
__device__ __forceinline__ int first_row_seeing(const int32_t *q_pos, int Tq, int key) {
    int lo = 0, hi = Tq;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (__ldg(q_pos + mid) >= key)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

// Two fp32 values to a dK / dV row: bf16 (dense) or fp32 (attention at
// positions, summed over the context-parallel ranks afterwards).
__device__ __forceinline__ void store_pair(bf16 *p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store_pair(float *p, float a, float b) {
    *reinterpret_cast<float2 *>(p) = make_float2(a, b);
}

template <int D, int NW, int BR, bool AREG, int MINB, bool AT, typename GradT>
__global__ void __launch_bounds__(32 * NW, MINB)
    attention_backward_kernel(GradT *__restrict__ dk, GradT *__restrict__ dv, float *__restrict__ dq_acc,
                              const bf16 *__restrict__ dout, const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                              const bf16 *__restrict__ v, const float *__restrict__ lse,
                              const float *__restrict__ delta, const int32_t *__restrict__ q_pos, int B, int Tq,
                              int Tk, int H, int KVH, float scale, float scale_log2) {
    typedef BwdCfg<D, NW, BR> C;
    if constexpr (!AT) Tk = Tq;  // one value for the compiler (dense: the launcher passes T twice)
    constexpr int kLd = C::kLd, kLdS = C::kLdS, kBc = C::kBc, kThreads = C::kThreads;
    constexpr int kKC = D / 16;  // 16-wide chunks of a head
    constexpr int kSN = BR / 8;  // 8-column tiles of a (transposed) score strip
    constexpr int kON = D / 8;   // 8-column tiles of a dK / dV strip
    constexpr int kRB = BR / 16, kUnits = kRB * (D / 16), kUPW = (kUnits + NW - 1) / NW;  // dQ 16 x 16 units
    static_assert(BR % 16 == 0, "query tile");
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *k_s = reinterpret_cast<bf16 *>(smem + C::kK);
    bf16 *v_s = reinterpret_cast<bf16 *>(smem + C::kV);
    bf16 *q_s = reinterpret_cast<bf16 *>(smem + C::kQ);
    bf16 *do_s = reinterpret_cast<bf16 *>(smem + C::kDO);
    float *lse_s = reinterpret_cast<float *>(smem + C::kLse);
    float *delta_s = reinterpret_cast<float *>(smem + C::kDelta);
    bf16 *ds_s = reinterpret_cast<bf16 *>(smem + C::kDS);
    int *pos_s = reinterpret_cast<int *>(smem + C::kPos);  // AT only

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int bh = (int)(blockIdx.x % (unsigned)(KVH * B));
    const int k_tile = (int)(blockIdx.x / (unsigned)(KVH * B));  // k_tile 0 (most work) first
    const int kvh = bh % KVH, b = bh / KVH;
    const int group = H / KVH;
    const int k0 = k_tile * kBc;
    const int num_q_tiles = (Tq + BR - 1) / BR;
    int qt_begin = k0 / BR;  // first query tile with a row at or after k0
    if constexpr (AT) {
        const int first = first_row_seeing(q_pos, Tq, k0);
        qt_begin = first < Tq ? first / BR : num_q_tiles;  // no tile at all: dK, dV are 0
    }
    const int per_head = num_q_tiles - qt_begin;
    const int total = group * per_head;
    const size_t q_stride = (size_t)H * D, kv_stride = (size_t)KVH * D;

    auto load_stage = [&](int it, int st) {
        const int h = kvh * group + it / per_head, q0 = (qt_begin + it % per_head) * BR;
        const size_t off = (size_t)b * Tq * q_stride + (size_t)h * D;
        cp_tile<D, BR, kThreads>(q_s + st * BR * kLd, q + off, q_stride, q0, Tq);
        cp_tile<D, BR, kThreads>(do_s + st * BR * kLd, dout + off, q_stride, q0, Tq);
        const float *lse_bh = lse + ((size_t)b * H + h) * Tq, *delta_bh = delta + ((size_t)b * H + h) * Tq;
        for (int i = threadIdx.x; i < BR; i += kThreads) {
            const bool in = q0 + i < Tq;
            cp_async4(lse_s + st * BR + i, lse_bh + (in ? q0 + i : 0), in);
            cp_async4(delta_s + st * BR + i, delta_bh + (in ? q0 + i : 0), in);
            if constexpr (AT) cp_async4(pos_s + st * BR + i, q_pos + (in ? q0 + i : 0), in);
        }
    };

    if (!AT || total > 0) {  // else no query sees these keys: dK, dV are 0
        cp_tile<D, kBc, kThreads>(k_s, k + (size_t)b * Tk * kv_stride + (size_t)kvh * D, kv_stride, k0, Tk);
        cp_tile<D, kBc, kThreads>(v_s, v + (size_t)b * Tk * kv_stride + (size_t)kvh * D, kv_stride, k0, Tk);
        load_stage(0, 0);
        cp_async_commit();
    }

    const int a_row = lane & 15, a_col = (lane >> 4) * 8;
    const int b_row = (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;
    const int kw = warp * 16;  // the warp's keys: rows kw .. kw + 15 of the tile
    const int kw0 = k0 + kw;

    float dk_r[kON][4], dv_r[kON][4];
#pragma unroll
    for (int n = 0; n < kON; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) dk_r[n][i] = dv_r[n][i] = 0.0f;
    unsigned kf[AREG ? kKC : 1][4], vf[AREG ? kKC : 1][4];

    for (int it = 0; it < total; it++) {
        const int st = it & 1;
        const int h = kvh * group + it / per_head, q0 = (qt_begin + it % per_head) * BR;
        cp_async_wait_all();
        __syncthreads();  // stage it has landed; every warp is done with iteration it - 1 (dS, stage it + 1)
        if (it + 1 < total) load_stage(it + 1, st ^ 1);
        cp_async_commit();
        if constexpr (AREG) {
            if (it == 0) {
#pragma unroll
                for (int kc = 0; kc < kKC; kc++) {
                    ldsm4(kf[kc], k_s + (kw + a_row) * kLd + kc * 16 + a_col);
                    ldsm4(vf[kc], v_s + (kw + a_row) * kLd + kc * 16 + a_col);
                }
            }
        }
        const bf16 *q_t = q_s + st * BR * kLd, *do_t = do_s + st * BR * kLd;
        const float *lse_t = lse_s + st * BR, *delta_t = delta_s + st * BR;
        const int *pos_t = pos_s + st * BR;
        const int q_end = min(q0 + BR, Tq);  // rows q0 .. q_end - 1 exist
        // the positions of the tile's first and last rows (positions never decrease)
        const int first_pos = AT ? pos_t[0] : q0, last_pos = AT ? pos_t[q_end - 1 - q0] : q_end - 1;

        if (kw0 <= last_pos) {  // else every key of the warp is after every row (or past Tk): nothing to add
            // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys
            float sacc[kSN][4], pacc[kSN][4];
#pragma unroll
            for (int n = 0; n < kSN; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) sacc[n][i] = pacc[n][i] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < kKC; kc++) {
                unsigned ak[4], av[4];
                if constexpr (AREG) {
#pragma unroll
                    for (int i = 0; i < 4; i++) ak[i] = kf[kc][i], av[i] = vf[kc][i];
                } else {
                    ldsm4(ak, k_s + (kw + a_row) * kLd + kc * 16 + a_col);
                    ldsm4(av, v_s + (kw + a_row) * kLd + kc * 16 + a_col);
                }
#pragma unroll
                for (int np = 0; np < kSN / 2; np++) {
                    unsigned bb[4];
                    ldsm4(bb, q_t + (np * 16 + b_row) * kLd + kc * 16 + b_col);
                    mma16816(sacc[2 * np], ak, bb[0], bb[1]);
                    mma16816(sacc[2 * np + 1], ak, bb[2], bb[3]);
                    ldsm4(bb, do_t + (np * 16 + b_row) * kLd + kc * 16 + b_col);
                    mma16816(pacc[2 * np], av, bb[0], bb[1]);
                    mma16816(pacc[2 * np + 1], av, bb[2], bb[3]);
                }
            }
            // P^T = exp2(S^T scale log2e - lse log2e) (0 if masked), dS^T = P^T (dP^T - delta);
            // the mask tests only where some key of the warp is after some row or rows pass T
            if (kw0 + 15 > first_pos || q0 + BR > Tq)
                probs_and_dscores<true, AT>(sacc, pacc, lse_t, delta_t, pos_t, scale_log2, t4, kw0 + g, q0, Tq);
            else
                probs_and_dscores<false, AT>(sacc, pacc, lse_t, delta_t, pos_t, scale_log2, t4, kw0 + g, q0, Tq);
            // dV += P^T dO, dK += dS^T Q; dS^T -> shared (bf16) for dQ
#pragma unroll
            for (int kc = 0; kc < BR / 16; kc++) {
                unsigned ap[4], ad[4];
                acc_to_a(ap, sacc[2 * kc], sacc[2 * kc + 1]);
                acc_to_a(ad, pacc[2 * kc], pacc[2 * kc + 1]);
#pragma unroll
                for (int dp = 0; dp < D / 16; dp++) {
                    unsigned bb[4];
                    ldsm4t(bb, do_t + (kc * 16 + a_row) * kLd + dp * 16 + a_col);
                    mma16816(dv_r[2 * dp], ap, bb[0], bb[1]);
                    mma16816(dv_r[2 * dp + 1], ap, bb[2], bb[3]);
                    ldsm4t(bb, q_t + (kc * 16 + a_row) * kLd + dp * 16 + a_col);
                    mma16816(dk_r[2 * dp], ad, bb[0], bb[1]);
                    mma16816(dk_r[2 * dp + 1], ad, bb[2], bb[3]);
                }
                bf16 *ds_w = ds_s + (kw + g) * kLdS + kc * 16 + 2 * t4;
                *reinterpret_cast<unsigned *>(ds_w) = ad[0];
                *reinterpret_cast<unsigned *>(ds_w + 8 * kLdS) = ad[1];
                *reinterpret_cast<unsigned *>(ds_w + 8) = ad[2];
                *reinterpret_cast<unsigned *>(ds_w + 8 * kLdS + 8) = ad[3];
            }
        }
        __syncthreads();  // dS^T complete

        // dQ (BR x D) += dS K over the key chunks that have a visible key
        // (the rows of inactive warps were not written and are not read)
        const int kc_end = AT && last_pos < k0 ? 0 : (last_pos - k0) / 16 + 1;
        float dq_r[kUPW][2][4];
#pragma unroll
        for (int j = 0; j < kUPW; j++)
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) dq_r[j][n][i] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < NW; kc++) {
            if (kc < kc_end) {
#pragma unroll
                for (int j = 0; j < kUPW; j++) {
                    const int u = warp + j * NW;
                    if (kUnits % NW == 0 || u < kUnits) {
                        const int rb = u % kRB, dc = u / kRB;
                        unsigned a[4], bb[4];
                        ldsm4t(a, ds_s + (kc * 16 + b_row) * kLdS + rb * 16 + b_col);
                        ldsm4t(bb, k_s + (kc * 16 + a_row) * kLd + dc * 16 + a_col);
                        mma16816(dq_r[j][0], a, bb[0], bb[1]);
                        mma16816(dq_r[j][1], a, bb[2], bb[3]);
                    }
                }
            }
        }
        // lanes 2m and 2m + 1 of a quad swap halves so that each adds 4
        // consecutive columns of one row: the even lane row g, the odd lane
        // row g + 8, columns 2 (t4 & ~1) .. + 3
        float *dq_bh = dq_acc + (size_t)b * Tq * q_stride + (size_t)h * D;
        const bool odd = t4 & 1;
#pragma unroll
        for (int j = 0; j < kUPW; j++) {
            const int u = warp + j * NW;
            if (kUnits % NW == 0 || u < kUnits) {
                const int rb = u % kRB, dc = u / kRB;
                const int row = q0 + rb * 16 + g + (odd ? 8 : 0);
#pragma unroll
                for (int n = 0; n < 2; n++) {
                    const float *c = dq_r[j][n];
                    const float r0 = __shfl_xor_sync(0xffffffffu, odd ? c[0] : c[2], 1);
                    const float r1 = __shfl_xor_sync(0xffffffffu, odd ? c[1] : c[3], 1);
                    if (row < Tq)
                        atomic_add4(dq_bh + (size_t)row * q_stride + dc * 16 + n * 8 + 2 * (t4 & ~1),
                                    odd ? make_float4(r0, r1, c[2], c[3]) : make_float4(c[0], c[1], r0, r1));
                }
            }
        }
    }

    // dK * scale, dV (the block owns these key rows of its kv head: written once, no atomics)
    GradT *dk_b = dk + (size_t)b * Tk * kv_stride + (size_t)kvh * D + 2 * t4;
    GradT *dv_b = dv + (size_t)b * Tk * kv_stride + (size_t)kvh * D + 2 * t4;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int key = kw0 + g + 8 * hh;
        if (key < Tk) {
#pragma unroll
            for (int n = 0; n < kON; n++) {
                store_pair(dk_b + (size_t)key * kv_stride + n * 8, dk_r[n][2 * hh] * scale, dk_r[n][2 * hh + 1] * scale);
                store_pair(dv_b + (size_t)key * kv_stride + n * 8, dv_r[n][2 * hh], dv_r[n][2 * hh + 1]);
            }
        }
    }
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

// One call's shapes: Tq query rows against Tk keys; q_pos null (dense: Tq ==
// Tk, a row's position is its index) or the rows' positions (AT).
struct AttnShape {
    int B, Tq, Tk, H, KVH;
    const int32_t *q_pos;
};

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

template <bool AT, int D, int NW, int MB, int BC, bool QREG, int MINB>
static cudaError_t attention_forward_run(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                                         const AttnShape &a, cudaStream_t stream) {
    typedef FwdCfg<D, NW, MB, BC> C;
    const auto kernel = attention_forward_kernel<D, NW, MB, BC, QREG, MINB, AT>;
    cudaError_t err = allow_smem(kernel, C::kBytes);
    if (err != cudaSuccess) return err;
    const float scale = (float)(1.0 / sqrt((double)D));
    const size_t blocks = (size_t)((a.Tq + C::kBr - 1) / C::kBr) * a.H * a.B;
    if (blocks > 0x7fffffffu) return cudaErrorInvalidValue;
    kernel<<<(unsigned)blocks, C::kThreads, C::kBytes, stream>>>(out, lse, q, k, v, a.q_pos, a.B, a.Tq, a.Tk, a.H,
                                                                 a.KVH, scale * kLog2e);
    return cudaGetLastError();
}

template <bool AT, int D>
static cudaError_t attention_forward_launch(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                                            const AttnShape &a, cudaStream_t stream) {
    if constexpr (D <= 64)
        return attention_forward_run<AT, D, ATTN_FWD_SMALL>(out, lse, q, k, v, a, stream);
    else
        return attention_forward_run<AT, D, ATTN_FWD_LARGE>(out, lse, q, k, v, a, stream);
}

template <bool AT>
static cudaError_t attention_forward_any(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                         const uint16_t *v, const AttnShape &a, int D, cudaStream_t stream) {
    if (!aligned16(out) || !aligned16(q) || !aligned16(k) || !aligned16(v)) return cudaErrorMisalignedAddress;
    bf16 *o = as_bf16(out);
    const bf16 *qb = as_bf16(q), *kb = as_bf16(k), *vb = as_bf16(v);
    switch (D) {
        case 16: return attention_forward_launch<AT, 16>(o, lse, qb, kb, vb, a, stream);
        case 32: return attention_forward_launch<AT, 32>(o, lse, qb, kb, vb, a, stream);
        case 64: return attention_forward_launch<AT, 64>(o, lse, qb, kb, vb, a, stream);
        default: return attention_forward_launch<AT, 128>(o, lse, qb, kb, vb, a, stream);
    }
}

template <bool AT, typename GradT, int D, int NW, int BR, bool AREG, int MINB>
static cudaError_t attention_backward_run(GradT *dk, GradT *dv, float *dq_acc, const bf16 *dout, const bf16 *q,
                                          const bf16 *k, const bf16 *v, const float *lse, const float *delta,
                                          const AttnShape &a, float scale, cudaStream_t stream) {
    typedef BwdCfg<D, NW, BR> C;
    const auto kernel = attention_backward_kernel<D, NW, BR, AREG, MINB, AT, GradT>;
    const size_t smem = C::bytes(AT);
    cudaError_t err = allow_smem(kernel, smem);
    if (err != cudaSuccess) return err;
    const size_t blocks = (size_t)((a.Tk + C::kBc - 1) / C::kBc) * a.KVH * a.B;
    if (blocks > 0x7fffffffu) return cudaErrorInvalidValue;
    kernel<<<(unsigned)blocks, C::kThreads, smem, stream>>>(dk, dv, dq_acc, dout, q, k, v, lse, delta, a.q_pos, a.B,
                                                            a.Tq, a.Tk, a.H, a.KVH, scale, scale * kLog2e);
    return cudaGetLastError();
}

// delta, then dK and dV (and dQ's fp32 sums in the workspace), then dq.
template <bool AT, typename GradT, int D>
static cudaError_t attention_backward_launch(bf16 *dq, GradT *dk, GradT *dv, const bf16 *dout, const bf16 *out,
                                             const float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                                             const AttnShape &a, float *workspace, cudaStream_t stream) {
    const size_t n = (size_t)a.B * a.Tq * a.H * D;
    float *dq_acc = workspace;
    float *delta = workspace + n;
    const float scale = (float)(1.0 / sqrt((double)D));
    cudaError_t err = cudaMemsetAsync(dq_acc, 0, n * sizeof(float), stream);
    if (err != cudaSuccess) return err;

    const size_t rows = (size_t)a.B * a.Tq * a.H;
    attention_delta_kernel<D><<<elementwise_blocks(rows * (D / 8)), kElementwiseThreads, 0, stream>>>(
        delta, dout, out, rows, a.Tq, a.H);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;

    if constexpr (D <= 64)
        err = attention_backward_run<AT, GradT, D, ATTN_BWD_SMALL>(dk, dv, dq_acc, dout, q, k, v, lse, delta, a, scale,
                                                                   stream);
    else
        err = attention_backward_run<AT, GradT, D, ATTN_BWD_LARGE>(dk, dv, dq_acc, dout, q, k, v, lse, delta, a, scale,
                                                                   stream);
    if (err != cudaSuccess) return err;

    attention_dq_kernel<<<elementwise_blocks(n / 4), kElementwiseThreads, 0, stream>>>(dq, dq_acc, n / 4, scale);
    return cudaGetLastError();
}

template <bool AT, typename GradT>
static cudaError_t attention_backward_any(uint16_t *dq, GradT *dk, GradT *dv, const uint16_t *dout,
                                          const uint16_t *out, const float *lse, const uint16_t *q, const uint16_t *k,
                                          const uint16_t *v, const AttnShape &a, int D, void *workspace,
                                          cudaStream_t stream) {
    if (!workspace || !lse) return cudaErrorInvalidValue;
    if (!aligned16(dq) || !aligned16(dk) || !aligned16(dv) || !aligned16(dout) || !aligned16(out) ||
        !aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(workspace))
        return cudaErrorMisalignedAddress;
    bf16 *dqb = as_bf16(dq);
    const bf16 *dob = as_bf16(dout), *ob = as_bf16(out), *qb = as_bf16(q), *kb = as_bf16(k), *vb = as_bf16(v);
    float *ws = static_cast<float *>(workspace);
    switch (D) {
        case 16: return attention_backward_launch<AT, GradT, 16>(dqb, dk, dv, dob, ob, lse, qb, kb, vb, a, ws, stream);
        case 32: return attention_backward_launch<AT, GradT, 32>(dqb, dk, dv, dob, ob, lse, qb, kb, vb, a, ws, stream);
        case 64: return attention_backward_launch<AT, GradT, 64>(dqb, dk, dv, dob, ob, lse, qb, kb, vb, a, ws, stream);
        default:
            return attention_backward_launch<AT, GradT, 128>(dqb, dk, dv, dob, ob, lse, qb, kb, vb, a, ws, stream);
    }
}

extern "C" cudaError_t cuda_attention_forward(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                              const uint16_t *v, int B, int T, int H, int KVH, int D,
                                              cudaStream_t stream) {
    if (B == 0 || T == 0) return cudaSuccess;
    if (!attention_shape_ok(B, T, H, KVH, D) || !lse) return cudaErrorInvalidValue;
    return attention_forward_any<false>(out, lse, q, k, v, AttnShape{B, T, T, H, KVH, nullptr}, D, stream);
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
    if (!attention_shape_ok(B, T, H, KVH, D)) return cudaErrorInvalidValue;
    return attention_backward_any<false>(dq, as_bf16(dk), as_bf16(dv), dout, out, lse, q, k, v,
                                         AttnShape{B, T, T, H, KVH, nullptr}, D, workspace, stream);
}

// ---- attention at positions (context parallel) ----------------------------

static bool attention_at_ok(int B, int Tq, int Tk, int H, int KVH, int D, const int32_t *q_pos) {
    return attention_shape_ok(B, Tq, H, KVH, D) && Tk >= 1 && q_pos && ((uintptr_t)q_pos & 3u) == 0;
}

extern "C" cudaError_t cuda_attention_forward_at(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                                 const uint16_t *v, const int32_t *q_pos, int B, int Tq, int Tk,
                                                 int H, int KVH, int D, cudaStream_t stream) {
    if (B == 0 || Tq == 0) return cudaSuccess;
    if (!attention_at_ok(B, Tq, Tk, H, KVH, D, q_pos) || !lse) return cudaErrorInvalidValue;
    return attention_forward_any<true>(out, lse, q, k, v, AttnShape{B, Tq, Tk, H, KVH, q_pos}, D, stream);
}

extern "C" cudaError_t cuda_attention_backward_at(uint16_t *dq, float *dk, float *dv, const uint16_t *dout,
                                                  const uint16_t *out, const float *lse, const uint16_t *q,
                                                  const uint16_t *k, const uint16_t *v, const int32_t *q_pos, int B,
                                                  int Tq, int Tk, int H, int KVH, int D, void *workspace,
                                                  cudaStream_t stream) {
    if (B == 0 || Tq == 0) return cudaSuccess;
    if (!attention_at_ok(B, Tq, Tk, H, KVH, D, q_pos)) return cudaErrorInvalidValue;
    return attention_backward_any<true>(dq, dk, dv, dout, out, lse, q, k, v, AttnShape{B, Tq, Tk, H, KVH, q_pos}, D,
                                        workspace, stream);
}
