/* test_emu_nccl.c: the emulator's NCCL (emu_nccl.c) against sums computed here, under mpirun with any number of
 * ranks (tests/integration/test_gpu_emu_nccl.sh runs 3). Each rank fills its buffers from its rank and the index,
 * so every result is known:
 *   - all-reduce sum and average, fp32 and bf16, in place and not, at sizes that cross the ring (256 KB) and the
 *     reduction chunk (2^20 elements), and of zero elements;
 *   - reduce-scatter sum (out of place and in place at rank * count) and all-gather (both ways);
 *   - an all-to-all of uneven counts, some zero, as a group of ncclSend/ncclRecv (comm_nccl.c's pattern);
 *   - groups that send two messages to the same peer and receive two from the same peer (the interleaved
 *     pipeline's pattern at pp 2), the first larger than the ring, matched in the order they were posted;
 *   - two communicators (the world and a pair) used one after the other;
 *   - every rank gets bit-identical sums.
 * With an argument, one hazard instead, each of which the emulator must stop (the script checks its message):
 *   mismatch     rank 0 calls an all-gather where the others call an all-reduce;
 *   cross_order  two communicators of all ranks: rank 0 all-reduces on the first, then the second, the others
 *                the other way round (a hang);
 *   sends_first  ranks 0 and 1 each send one float to the other, then receive, outside a group (a hang: a send
 *                waits for its receiver);
 *   overlap      ranks 0 and 1 each send a buffer to the other and receive into the same buffer in one group (on
 *                a GPU the receive overwrites what the send is still reading): refused at ncclGroupEnd;
 *   shifted      an all-reduce whose receive buffer is its send buffer one float on (in place only as NCCL
 *                allows it: the same buffer): aborts;
 *   two_streams  every rank launches an all-reduce on one communicator and stream, then one on a second
 *                communicator and stream, in the same order, then synchronizes the second stream first. Under
 *                EMU_STREAMS=lazy,eager the lazy ranks run the second one first: a hang, unless
 *                NCCL_LAUNCH_ORDER_IMPLICIT=1 makes them keep the launch order (then it passes). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "../../../src/core/float16.h"

static int rank, size, failures;

#define CHECK(cond, ...)                                      \
    do {                                                      \
        if (!(cond)) {                                        \
            fprintf(stderr, "rank %d: FAIL: ", rank);         \
            fprintf(stderr, __VA_ARGS__);                     \
            fprintf(stderr, "\n");                            \
            failures++;                                       \
        }                                                     \
    } while (0)

static ncclComm_t make_comm(MPI_Comm group) {
    int r, n;
    MPI_Comm_rank(group, &r);
    MPI_Comm_size(group, &n);
    ncclUniqueId id;
    if (r == 0 && ncclGetUniqueId(&id) != ncclSuccess) abort();
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, group);
    ncclComm_t c;
    if (ncclCommInitRank(&c, n, id, r) != ncclSuccess) abort();
    return c;
}

/* Small integers, so that fp32 sums are exact and bf16 ones exact below 256. */
static float value(int r, size_t i) { return (float)((r + 1) * (int)(i % 7) + (int)(i % 3)); }

static void all_reduce(ncclComm_t c, size_t count, ncclDataType_t t, ncclRedOp_t op, int in_place) {
    const size_t eb = t == ncclFloat32 ? 4 : 2;
    unsigned char *s = malloc(count * eb + 1), *out = in_place ? s : malloc(count * eb + 1);
    for (size_t i = 0; i < count; i++) {
        if (t == ncclFloat32) ((float *)s)[i] = value(rank, i);
        else ((uint16_t *)s)[i] = f32_to_bf16(value(rank, i));
    }
    CHECK(ncclAllReduce(s, out, count, t, op, c, NULL) == ncclSuccess, "ncclAllReduce returned an error");
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < size; r++) want += value(r, i);
        if (op == ncclAvg) want /= (float)size;
        const float got = t == ncclFloat32 ? ((float *)out)[i] : bf16_to_f32(((uint16_t *)out)[i]);
        const float expect = t == ncclFloat32 ? want : bf16_to_f32(f32_to_bf16(want));
        bad += got != expect;
    }
    CHECK(bad == 0, "all-reduce %s of %zu %s elements%s: %zu wrong", op == ncclAvg ? "avg" : "sum", count,
          t == ncclFloat32 ? "fp32" : "bf16", in_place ? " in place" : "", bad);
    /* every rank holds the same bits */
    unsigned char *first = malloc(count * eb + 1);
    memcpy(first, out, count * eb);
    MPI_Bcast(first, (int)(count * eb), MPI_BYTE, 0, MPI_COMM_WORLD);
    CHECK(memcmp(first, out, count * eb) == 0, "all-reduce of %zu elements differs from rank 0's", count);
    free(first);
    if (!in_place) free(out);
    free(s);
}

static void reduce_scatter(ncclComm_t c, size_t count, int in_place) {
    float *s = malloc((size_t)size * count * sizeof *s + 4);
    for (size_t i = 0; i < (size_t)size * count; i++) s[i] = value(rank, i);
    float *out = in_place ? s + (size_t)rank * count : malloc(count * sizeof *out + 4);
    CHECK(ncclReduceScatter(s, out, count, ncclFloat32, ncclSum, c, NULL) == ncclSuccess, "ncclReduceScatter");
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < size; r++) want += value(r, (size_t)rank * count + i);
        bad += out[i] != want;
    }
    CHECK(bad == 0, "reduce-scatter of %zu a rank%s: %zu wrong", count, in_place ? " in place" : "", bad);
    if (!in_place) free(out);
    free(s);
}

static void all_gather(ncclComm_t c, size_t count, int in_place) {
    uint16_t *out = malloc((size_t)size * count * 2 + 2);
    uint16_t *s = in_place ? out + (size_t)rank * count : malloc(count * 2 + 2);
    for (size_t i = 0; i < count; i++) s[i] = (uint16_t)(rank * 1000 + i % 999);
    CHECK(ncclAllGather(s, out, count, ncclBfloat16, c, NULL) == ncclSuccess, "ncclAllGather");
    size_t bad = 0;
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < count; i++) bad += out[(size_t)r * count + i] != (uint16_t)(r * 1000 + i % 999);
    CHECK(bad == 0, "all-gather of %zu a rank%s: %zu wrong", count, in_place ? " in place" : "", bad);
    if (!in_place) free(s);
    free(out);
}

/* Rank a sends (a + 2b) * 70001 % 300001 floats to rank b (none when that is a multiple of 5): crosses the ring. */
static long a2a_count(int a, int b) {
    const long n = (long)(a + 2 * b) * 70001 % 300001;
    return n % 5 == 0 ? 0 : n;
}

static void all_to_all(ncclComm_t c) {
    long send_total = 0, recv_total = 0;
    for (int p = 0; p < size; p++) send_total += a2a_count(rank, p), recv_total += a2a_count(p, rank);
    float *send = malloc((size_t)send_total * 4 + 4), *recv = malloc((size_t)recv_total * 4 + 4);
    long at = 0;
    for (int p = 0; p < size; p++)
        for (long i = 0; i < a2a_count(rank, p); i++) send[at++] = (float)(rank * 1000003L + p * 1009L + i % 1000);
    ncclGroupStart();
    long s_at = 0, r_at = 0;
    for (int p = 0; p < size; p++) {
        if (a2a_count(rank, p) > 0)
            ncclSend(send + s_at, (size_t)a2a_count(rank, p), ncclFloat32, p, c, NULL);
        if (a2a_count(p, rank) > 0) ncclRecv(recv + r_at, (size_t)a2a_count(p, rank), ncclFloat32, p, c, NULL);
        s_at += a2a_count(rank, p);
        r_at += a2a_count(p, rank);
    }
    CHECK(ncclGroupEnd() == ncclSuccess, "ncclGroupEnd");
    size_t bad = 0;
    at = 0;
    for (int p = 0; p < size; p++)
        for (long i = 0; i < a2a_count(p, rank); i++) bad += recv[at++] != (float)(p * 1000003L + rank * 1009L + i % 1000);
    CHECK(bad == 0, "all-to-all: %zu of %ld received values wrong", bad, recv_total);
    free(send);
    free(recv);
}

/* Each rank sends two messages to the next rank and receives two from the previous one, in one group, `rounds`
 * times: the first message (2.4 MB) crosses the ring (256 KB) many times, so the second receive, stepped while the
 * first is still arriving, must wait for it (NCCL matches a peer's sends and receives in the order posted). */
static void same_peer(ncclComm_t c, int rounds) {
    const size_t big = 600000, small = 1000;
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    float *send = malloc((big + small) * sizeof *send), *recv = malloc((big + small) * sizeof *recv);
    for (int round = 0; round < rounds; round++) {
        for (size_t i = 0; i < big + small; i++) send[i] = (float)(rank * 1000003L + round * 7919L + (long)(i % 100003));
        memset(recv, 0, (big + small) * sizeof *recv);
        ncclGroupStart();
        ncclSend(send, big, ncclFloat32, next, c, NULL);
        ncclSend(send + big, small, ncclFloat32, next, c, NULL);
        ncclRecv(recv, big, ncclFloat32, prev, c, NULL);
        ncclRecv(recv + big, small, ncclFloat32, prev, c, NULL);
        CHECK(ncclGroupEnd() == ncclSuccess, "ncclGroupEnd");
        size_t bad = 0;
        for (size_t i = 0; i < big + small; i++)
            bad += recv[i] != (float)(prev * 1000003L + round * 7919L + (long)(i % 100003));
        CHECK(bad == 0, "two messages from one peer, round %d: %zu of %zu values wrong", round, bad, big + small);
    }
    free(send);
    free(recv);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ncclComm_t world = make_comm(MPI_COMM_WORLD);
    if (argc > 1 && strcmp(argv[1], "mismatch") == 0) {
        float buf[3 * 64] = {0};
        if (rank == 0) ncclAllGather(buf, buf, 64, ncclFloat32, world, NULL);
        else ncclAllReduce(buf, buf, 64, ncclFloat32, ncclSum, world, NULL);
        MPI_Finalize();
        return 0; /* not reached: the emulator aborts */
    }
    if (argc > 1 && strcmp(argv[1], "cross_order") == 0) {
        ncclComm_t other = make_comm(MPI_COMM_WORLD);
        float x = 1;
        ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, rank == 0 ? world : other, NULL);
        ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, rank == 0 ? other : world, NULL);
        MPI_Finalize();
        return 0; /* not reached */
    }
    if (argc > 1 && strcmp(argv[1], "sends_first") == 0) {
        float x = (float)rank, y = 0;
        if (rank < 2) {
            ncclSend(&x, 1, ncclFloat32, 1 - rank, world, NULL);
            ncclRecv(&y, 1, ncclFloat32, 1 - rank, world, NULL);
        }
        /* the others wait for ranks 0 and 1, which abort: a rank that finalizes while its peers abort can leave
         * Open MPI's mpirun waiting forever */
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Finalize();
        return 0; /* not reached */
    }
    if (argc > 1 && strcmp(argv[1], "overlap") == 0) {
        float buf[4] = {0};
        ncclResult_t r = ncclSuccess;
        if (rank < 2) {
            ncclGroupStart();
            ncclSend(buf, 4, ncclFloat32, 1 - rank, world, NULL);
            ncclRecv(buf + 2, 2, ncclFloat32, 1 - rank, world, NULL);
            r = ncclGroupEnd();
        }
        if (rank < 2 && r == ncclSuccess) failures++;
        int total = 0;
        MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (rank == 0) printf(total ? "overlap: a group was not refused\n" : "overlap: refused\n");
        MPI_Finalize();
        return total != 0;
    }
    if (argc > 1 && strcmp(argv[1], "shifted") == 0) { /* an all-reduce into its own input, one float on */
        float buf[65] = {0};
        ncclAllReduce(buf, buf + 1, 64, ncclFloat32, ncclSum, world, NULL);
        MPI_Finalize();
        return 0; /* not reached: the emulator aborts */
    }
    if (argc > 1 && strcmp(argv[1], "two_streams") == 0) {
        ncclComm_t other = make_comm(MPI_COMM_WORLD);
        cudaStream_t first, second;
        cudaStreamCreate(&first);
        cudaStreamCreate(&second);
        float x = (float)(rank + 1), y = (float)(10 * (rank + 1));
        ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, world, first);
        ncclAllReduce(&y, &y, 1, ncclFloat32, ncclSum, other, second);
        cudaStreamSynchronize(second);
        cudaStreamSynchronize(first);
        const float n = (float)size * (float)(size + 1) / 2;
        CHECK(x == n && y == 10 * n, "two streams: sums %g and %g, expected %g and %g", x, y, n, 10 * n);
        ncclCommDestroy(other);
        ncclCommDestroy(world);
        int total = 0;
        MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (rank == 0) printf(total ? "%d failures\n" : "emu NCCL: two streams in launch order on %d ranks\n",
                              total ? total : size);
        MPI_Finalize();
        return total != 0;
    }
    const size_t sizes[] = {0, 1, 1000, 70000, (1u << 20) + 12345};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        all_reduce(world, sizes[k], ncclFloat32, ncclSum, 0);
        all_reduce(world, sizes[k], ncclFloat32, ncclAvg, 1);
        all_reduce(world, sizes[k], ncclBfloat16, ncclSum, 1);
        reduce_scatter(world, sizes[k], 0);
        reduce_scatter(world, sizes[k], 1);
        all_gather(world, sizes[k], 0);
        all_gather(world, sizes[k], 1);
    }
    all_to_all(world);
    same_peer(world, 20);
    /* a second communicator: ranks 0 and 1 (the others a communicator of their own) */
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : 1 + rank, rank, &pair);
    ncclComm_t sub = make_comm(pair);
    float x = (float)(rank + 1);
    ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, sub, NULL);
    CHECK(x == (rank < 2 ? 3.0f : (float)(rank + 1)), "the pair's sum: %g", x);
    all_to_all(world); /* the world's communicator still in step after the pair's */
    ncclCommDestroy(sub);
    ncclCommDestroy(world);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf(total ? "%d failures\n" : "emu NCCL: all checks passed on %d ranks\n", total ? total : size);
    MPI_Finalize();
    return total != 0;
}
