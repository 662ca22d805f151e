// emu.cpp: kernels/moe_gemm.cu's kernel run on the CPU (tests/gpu/moe_gemm_emu/run.sh builds and runs it): one
// std::thread per CUDA thread, the PTX primitives emulated from their documented semantics (cp.async groups
// completing at wait_group, ldmatrix (.trans), mma.m16n8k16 fragment layouts); the three products checked
// against a double-precision reference, that nothing lands outside the outputs and no copy reads outside a buffer.
#include <algorithm>
#include <barrier>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

using std::min;
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidConfiguration = 9 };
typedef void *cudaStream_t;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict

struct bf16 { uint16_t x; };
struct __nv_bfloat162 { bf16 x, y; };
struct float2 { float x, y; };
static inline float b2f(bf16 h) { uint32_t u = (uint32_t)h.x << 16; float f; memcpy(&f, &u, 4); return f; }
static inline bf16 f2b(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16{(uint16_t)(u >> 16)};
}
static inline float2 __bfloat1622float2(__nv_bfloat162 v) { return float2{b2f(v.x), b2f(v.y)}; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162{f2b(a), f2b(b)}; }
static inline bf16 *as_bf16(uint16_t *p) { return reinterpret_cast<bf16 *>(p); }
static inline const bf16 *as_bf16(const uint16_t *p) { return reinterpret_cast<const bf16 *>(p); }

struct Idx { int x; };
thread_local Idx threadIdx, blockIdx;

// ---- memory registry: every pointer a copy reads must lie in a registered buffer ----
struct Range { const char *lo, *hi; };
static std::vector<Range> ranges;
static std::mutex fail_lock;
static long failures;
static void fail(const char *what) {
    std::lock_guard<std::mutex> g(fail_lock);
    if (failures++ < 20) fprintf(stderr, "EMU FAIL: %s (block %d thread %d)\n", what, blockIdx.x, threadIdx.x);
}
static bool in_ranges(const void *p, size_t bytes) {
    const char *c = (const char *)p;
    for (auto &r : ranges) if (c >= r.lo && c + bytes <= r.hi) return true;
    return false;
}

struct BlockCtx {
    std::barrier<> block_bar{256};
    std::unique_ptr<std::barrier<>> warp_bar[8];
    alignas(128) unsigned char smem[96 * 1024];
    uint64_t slot[8][32][12];
    const void *addr[8][32];
    float D[8][16][8];
    BlockCtx() { for (auto &w : warp_bar) w.reset(new std::barrier<>(32)); }
};
thread_local BlockCtx *cur;
static inline int lane_id() { return threadIdx.x & 31; }
static inline int warp_id() { return threadIdx.x >> 5; }
static inline void warp_sync() { cur->warp_bar[warp_id()]->arrive_and_wait(); }
static inline void __syncthreads() { cur->block_bar.arrive_and_wait(); }
static unsigned char *emu_smem() { return cur->smem; }

static int __shfl_up_sync(unsigned, int v, int d) {
    const int w = warp_id(), l = lane_id();
    cur->slot[w][l][0] = (uint64_t)(int64_t)v;
    warp_sync();
    const int r = l >= d ? (int)(int64_t)cur->slot[w][l - d][0] : v;
    warp_sync();
    return r;
}
static int __shfl_sync(unsigned, int v, int src) {
    const int w = warp_id(), l = lane_id();
    cur->slot[w][l][0] = (uint64_t)(int64_t)v;
    warp_sync();
    const int r = (int)(int64_t)cur->slot[w][src][0];
    warp_sync();
    return r;
}
static unsigned __ballot_sync(unsigned, bool pred) {
    const int w = warp_id(), l = lane_id();
    cur->slot[w][l][0] = pred;
    warp_sync();
    unsigned r = 0;
    for (int i = 0; i < 32; i++) if (cur->slot[w][i][0]) r |= 1u << i;
    warp_sync();
    return r;
}
static int __ffs(unsigned x) { return __builtin_ffs((int)x); }

// ---- cp.async: copies queue per thread and land at wait_group ----
struct Copy { bf16 *dst; const bf16 *src; bool pred; };
thread_local std::vector<std::vector<Copy>> groups;
thread_local std::vector<Copy> open_group;
static void cp_async16(bf16 *dst, const bf16 *src, bool pred) {
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) fail("cp.async misaligned");
    if ((unsigned char *)dst < cur->smem || (unsigned char *)dst + 16 > cur->smem + sizeof cur->smem)
        fail("cp.async destination outside shared memory");
    if (pred && !ranges.empty() && !in_ranges(src, 16)) fail("cp.async reads outside every buffer");
    open_group.push_back(Copy{dst, src, pred});
}
static void cp_async_commit() { groups.push_back(open_group); open_group.clear(); }
template <int N>
static void cp_async_wait() {
    while ((int)groups.size() > N) {
        for (auto &c : groups.front()) {
            if (c.pred) memcpy(c.dst, c.src, 16);
            else memset(c.dst, 0, 16);
        }
        groups.erase(groups.begin());
    }
}

// ---- ldmatrix: lane l gives the row address of row l % 8 of matrix l / 8 ----
static void check_smem_row(const void *p) {
    if ((uintptr_t)p % 16) fail("ldmatrix row misaligned");
    if ((unsigned char *)p < cur->smem || (unsigned char *)p + 16 > cur->smem + sizeof cur->smem)
        fail("ldmatrix outside shared memory");
}
static void ldmatrix_x4(unsigned r[4], const bf16 *p) {
    const int w = warp_id(), l = lane_id();
    check_smem_row(p);
    cur->addr[w][l] = p;
    warp_sync();
    for (int i = 0; i < 4; i++) {
        const bf16 *row = (const bf16 *)cur->addr[w][i * 8 + (l >> 2)];
        r[i] = (unsigned)row[2 * (l & 3)].x | ((unsigned)row[2 * (l & 3) + 1].x << 16);
    }
    warp_sync();
}
static void ldmatrix_x4_trans(unsigned r[4], const bf16 *p) {
    const int w = warp_id(), l = lane_id();
    check_smem_row(p);
    cur->addr[w][l] = p;
    warp_sync();
    for (int i = 0; i < 4; i++) {
        const bf16 *r0 = (const bf16 *)cur->addr[w][i * 8 + 2 * (l & 3)];
        const bf16 *r1 = (const bf16 *)cur->addr[w][i * 8 + 2 * (l & 3) + 1];
        r[i] = (unsigned)r0[l >> 2].x | ((unsigned)r1[l >> 2].x << 16);
    }
    warp_sync();
}
static float lo(unsigned v) { return b2f(bf16{(uint16_t)(v & 0xffff)}); }
static float hi(unsigned v) { return b2f(bf16{(uint16_t)(v >> 16)}); }
// mma.m16n8k16.row.col: g = lane / 4, q = lane % 4.
static void mma_bf16(float d[4], const unsigned a[4], const unsigned b0, const unsigned b1) {
    const int w = warp_id(), l = lane_id();
    uint64_t *s = cur->slot[w][l];
    for (int i = 0; i < 4; i++) s[i] = a[i];
    s[4] = b0; s[5] = b1;
    for (int i = 0; i < 4; i++) { uint32_t u; memcpy(&u, &d[i], 4); s[6 + i] = u; }
    warp_sync();
    if (l == 0) {
        float A[16][16], B[16][8], C[16][8];
        for (int t = 0; t < 32; t++) {
            const int g = t >> 2, q = t & 3;
            const uint64_t *x = cur->slot[w][t];
            A[g][2 * q] = lo(x[0]); A[g][2 * q + 1] = hi(x[0]);
            A[g + 8][2 * q] = lo(x[1]); A[g + 8][2 * q + 1] = hi(x[1]);
            A[g][2 * q + 8] = lo(x[2]); A[g][2 * q + 9] = hi(x[2]);
            A[g + 8][2 * q + 8] = lo(x[3]); A[g + 8][2 * q + 9] = hi(x[3]);
            B[2 * q][g] = lo(x[4]); B[2 * q + 1][g] = hi(x[4]);
            B[2 * q + 8][g] = lo(x[5]); B[2 * q + 9][g] = hi(x[5]);
            float c[4];
            for (int i = 0; i < 4; i++) { uint32_t u = (uint32_t)x[6 + i]; memcpy(&c[i], &u, 4); }
            C[g][2 * q] = c[0]; C[g][2 * q + 1] = c[1]; C[g + 8][2 * q] = c[2]; C[g + 8][2 * q + 1] = c[3];
        }
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 8; j++) {
                float acc = C[i][j];
                for (int k = 0; k < 16; k++) acc += A[i][k] * B[k][j];
                cur->D[w][i][j] = acc;
            }
    }
    warp_sync();
    const int g = l >> 2, q = l & 3;
    d[0] = cur->D[w][g][2 * q]; d[1] = cur->D[w][g][2 * q + 1];
    d[2] = cur->D[w][g + 8][2 * q]; d[3] = cur->D[w][g + 8][2 * q + 1];
    warp_sync();
}

static long blocks_run;
template <class Kernel, class A>
static void emu_launch(Kernel kernel, long blocks, const A &p, size_t smem_bytes) {
    if (smem_bytes > sizeof(BlockCtx::smem)) { fail("shared memory too large for the emulator"); return; }
    for (long b = 0; b < blocks; b++) {
        auto ctx = std::make_unique<BlockCtx>();
        std::vector<std::thread> threads;
        for (int t = 0; t < 256; t++)
            threads.emplace_back([&, t]() {
                threadIdx.x = t;
                blockIdx.x = (int)b;
                cur = ctx.get();
                groups.clear();
                open_group.clear();
                kernel(p);
                if (!open_group.empty()) fail("uncommitted cp.async at exit");
                for (auto &g : groups) if (!g.empty()) fail("non-empty cp.async group pending at exit");
                groups.clear();
            });
        for (auto &t : threads) t.join();
        blocks_run++;
    }
}

#include "emu_kernel.inc"

#ifdef EMU_LIBRARY  // for fake_cuda.c: the launchers as extern "C" emu_moe_gemm_* (gen.py --library), no harness
static struct Report {
    ~Report() { fprintf(stderr, "EMU: %ld blocks emulated, %ld emulator failures\n", blocks_run, failures); }
} report;
#else
// ---- harness -----------------------------------------------------------------------------------------------
static uint64_t rs = 88172645463325252ull;
static float urand() {
    rs ^= rs >> 12; rs ^= rs << 25; rs ^= rs >> 27;
    return (float)((double)((rs * 0x2545F4914F6CDD1DULL) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}
static const uint16_t kSent = 0x4442;  // bf16 776
static const size_t kGuard = 64;       // elements of guard either side

// A host buffer standing for device memory: 256-byte aligned, registered (reads are checked against it), with
// guard elements either side that must keep their fill value.
template <class T> struct ABuf {
    T *raw, *p; size_t n; T fillv;
    ABuf(size_t n_, T f) : n(n_), fillv(f) {
        raw = (T *)aligned_alloc(256, ((n + 2 * kGuard) * sizeof(T) + 255) / 256 * 256);
        for (size_t i = 0; i < n + 2 * kGuard; i++) raw[i] = f;
        p = raw + kGuard;
        ranges.push_back(Range{(const char *)p, (const char *)(p + n)});
    }
    ~ABuf() { free(raw); }
    bool guards_ok() const {
        for (size_t i = 0; i < kGuard; i++)
            if (memcmp(&raw[i], &fillv, sizeof(T)) || memcmp(&raw[kGuard + n + i], &fillv, sizeof(T))) return false;
        return true;
    }
};
static uint16_t tb(float f) { return f2b(f).x; }
static float fb(uint16_t h) { return b2f(bf16{h}); }

static int npass, nfail;
static void expect(const char *what, bool ok) {
    printf("  %-60s %s\n", what, ok ? "ok" : "FAIL");
    if (ok) npass++; else nfail++;
}

static void run_case(const char *name, int E, const std::vector<int> &counts, int IC, int OC0, int OC1, int pad) {
    const int OC = OC0 + OC1;
    std::vector<int32_t> off(E + 1, 0);
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    const int R = off[E], Ra = R + 3, ld_in = IC + pad, ld_out = OC + pad, ld_din = IC + pad;
    printf("%s: E=%d rows=%d IC=%d OC=%d+%d pad=%d\n", name, E, R, IC, OC0, OC1, pad);
    ranges.clear();
    ABuf<uint16_t> inp((size_t)Ra * ld_in, 0), dout((size_t)Ra * ld_out, 0), w0((size_t)E * OC0 * IC, 0),
        w1((size_t)E * (OC1 ? OC1 : 1) * IC, 0);
    ABuf<int32_t> d_off(E + 1, 0);
    for (size_t i = 0; i < inp.n; i++) inp.p[i] = tb(urand());
    for (size_t i = 0; i < dout.n; i++) dout.p[i] = tb(urand());
    for (size_t i = 0; i < w0.n; i++) w0.p[i] = tb(urand() * 0.2f);
    for (size_t i = 0; i < w1.n; i++) w1.p[i] = tb(urand() * 0.2f);
    memcpy(d_off.p, off.data(), (E + 1) * 4);
    auto W = [&](int e, int j, int k) -> float {  // row j of [W0_e; W1_e]
        return j < OC0 ? fb(w0.p[((size_t)e * OC0 + j) * IC + k]) : fb(w1.p[((size_t)e * OC1 + j - OC0) * IC + k]);
    };
    auto expert_of = [&](int r) { int e = 0; while (off[e + 1] <= r) e++; return e; };
    const uint16_t *w1p = OC1 ? w1.p : nullptr;
    // forward
    {
        ABuf<uint16_t> out((size_t)Ra * ld_out, kSent);
        cuda_moe_gemm_forward(out.p, ld_out, inp.p, ld_in, w0.p, w1p, d_off.p, E, R, IC, OC0, OC1, nullptr);
        double err = 0, scale = 0; bool outside = true;
        for (int r = 0; r < Ra; r++)
            for (int c = 0; c < ld_out; c++) {
                const float got = fb(out.p[(size_t)r * ld_out + c]);
                if (r < R && c < OC) {
                    const int e = expert_of(r);
                    double ref = 0;
                    for (int k = 0; k < IC; k++) ref += (double)fb(inp.p[(size_t)r * ld_in + k]) * W(e, c, k);
                    err = std::max(err, fabs(got - ref)); scale = std::max(scale, fabs(ref));
                } else if (out.p[(size_t)r * ld_out + c] != kSent) outside = false;
            }
        char w[128];
        snprintf(w, sizeof w, "forward rel_max %.2e", scale > 0 ? err / scale : err);
        expect(w, scale > 0 ? err / scale < 1e-2 : err == 0);
        expect("forward: nothing written outside, guards intact", outside && out.guards_ok());
    }
    for (int acc = 0; acc < 2; acc++) {
        ABuf<uint16_t> din((size_t)Ra * ld_din, kSent);
        std::vector<float> init(din.n);
        for (int r = 0; r < R; r++) for (int c = 0; c < IC; c++) din.p[(size_t)r * ld_din + c] = tb(urand());
        for (size_t i = 0; i < din.n; i++) init[i] = fb(din.p[i]);
        cuda_moe_gemm_backward_input(din.p, ld_din, dout.p, ld_out, w0.p, w1p, d_off.p, E, R, IC, OC0, OC1, acc,
                                     nullptr);
        double err = 0, scale = 0; bool outside = true;
        for (int r = 0; r < Ra; r++)
            for (int c = 0; c < ld_din; c++) {
                const float got = fb(din.p[(size_t)r * ld_din + c]);
                if (r < R && c < IC) {
                    const int e = expert_of(r);
                    double ref = acc ? init[(size_t)r * ld_din + c] : 0.0;
                    for (int j = 0; j < OC; j++) ref += (double)fb(dout.p[(size_t)r * ld_out + j]) * W(e, j, c);
                    err = std::max(err, fabs(got - ref)); scale = std::max(scale, fabs(ref));
                } else if (din.p[(size_t)r * ld_din + c] != kSent) outside = false;
            }
        char w[128];
        snprintf(w, sizeof w, "backward input%s rel_max %.2e", acc ? " (acc)" : "", scale > 0 ? err / scale : err);
        expect(w, scale > 0 ? err / scale < 1e-2 : err == 0);
        expect("backward input: nothing written outside, guards intact", outside && din.guards_ok());
    }
    {
        ABuf<float> g0((size_t)E * OC0 * IC, -5.0f), g1((size_t)E * (OC1 ? OC1 : 1) * IC, -5.0f);
        for (size_t i = 0; i < g0.n; i++) g0.p[i] = urand();
        for (size_t i = 0; i < g1.n; i++) g1.p[i] = urand();
        std::vector<float> i0(g0.p, g0.p + g0.n), i1(g1.p, g1.p + g1.n);
        cuda_moe_gemm_backward_weight(g0.p, OC1 ? g1.p : nullptr, dout.p, ld_out, inp.p, ld_in, d_off.p, E, IC, OC0,
                                      OC1, nullptr);
        double err = 0, scale = 0; bool empty_same = true;
        for (int e = 0; e < E; e++)
            for (int j = 0; j < OC; j++)
                for (int k = 0; k < IC; k++) {
                    const size_t at = j < OC0 ? ((size_t)e * OC0 + j) * IC + k : ((size_t)e * OC1 + j - OC0) * IC + k;
                    const float got = j < OC0 ? g0.p[at] : g1.p[at];
                    double ref = j < OC0 ? i0[at] : i1[at];
                    if (counts[e] == 0 && got != ref) empty_same = false;
                    for (int r = off[e]; r < off[e + 1]; r++)
                        ref += (double)fb(dout.p[(size_t)r * ld_out + j]) * fb(inp.p[(size_t)r * ld_in + k]);
                    err = std::max(err, fabs(got - ref)); scale = std::max(scale, fabs(ref));
                }
        char w[128];
        snprintf(w, sizeof w, "backward weight rel_max %.2e", scale > 0 ? err / scale : err);
        expect(w, scale > 0 ? err / scale < 1e-5 : err == 0);
        expect("backward weight: empty experts unchanged, guards intact", empty_same && g0.guards_ok() && g1.guards_ok());
    }
}

int main(int argc, char **argv) {
    const int which = argc > 1 ? atoi(argv[1]) : -1;
    auto layer = [&](int id, const char *name, int E, std::vector<int> c, int C, int Ie, int pad) {
        if (which >= 0 && which != id) return;
        char b[160];
        snprintf(b, sizeof b, "%s, gate|up", name);
        run_case(b, E, c, C, Ie, Ie, pad);
        snprintf(b, sizeof b, "%s, down", name);
        run_case(b, E, c, Ie, C, 0, pad);
    };
    layer(0, "tiny, ragged", 8, {0, 1, 5, 0, 130, 17, 0, 3}, 64, 32, 0);
    layer(1, "tiny, Ie 48, padded", 8, {0, 1, 5, 0, 130, 17, 0, 3}, 64, 48, 8);
    layer(2, "one expert has all rows", 4, {0, 0, 300, 0}, 64, 48, 0);
    layer(3, "one expert, one row", 1, {1}, 64, 32, 8);
    layer(4, "no rows", 4, {0, 0, 0, 0}, 64, 32, 0);
    {
        std::vector<int> c(40);
        for (int e = 0; e < 40; e++) c[e] = e % 7 == 0 ? 0 : (int)((urand() + 1) * 40);
        c[39] = 1;
        layer(5, "40 experts", 40, c, 128, 96, 0);
    }
    layer(6, "C 256 Ie 160 (tiles along N and K)", 5, {0, 200, 1, 70, 129}, 256, 160, 8);
    printf("\nemulated blocks %ld; %d passed, %d failed, %ld emulator failures\n", blocks_run, npass, nfail, failures);
    return nfail || failures;
}
#endif
