/* pipeline_transfers.c: a rank's steps with their paired transfers, and the
 * rendezvous simulation that checks them (pipeline_transfers.h). */
#include "pipeline_transfers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

/* Rank s's chunk v is virtual stage g = v * pp + s. */
static bool first_virtual(int pp, int stage, int chunk) { return chunk * pp + stage == 0; }
static bool last_virtual(int pp, int vpp, int stage, int chunk) { return chunk * pp + stage == pp * vpp - 1; }

/* What op sends when it is done: a forward its output to virtual stage g + 1, a backward its input's
 * gradient to g - 1. False for the last forward and the first backward. */
static bool send_of(int pp, int vpp, int s, PipeOp op, PipeXfer *x) {
    const int v = op.chunk;
    if (op.forward) {
        if (last_virtual(pp, vpp, s, v)) return false;
        *x = (PipeXfer){(s + 1) % pp, op.micro, false, v, s == pp - 1 ? v + 1 : v};
    } else {
        if (first_virtual(pp, s, v)) return false;
        *x = (PipeXfer){(s - 1 + pp) % pp, op.micro, true, v, s == 0 ? v - 1 : v};
    }
    return true;
}

/* What op receives before it runs: a forward its input from g - 1, a backward its output's gradient from g + 1. */
static bool recv_of(int pp, int vpp, int s, PipeOp op, PipeXfer *x) {
    const int v = op.chunk;
    if (op.forward) {
        if (first_virtual(pp, s, v)) return false;
        *x = (PipeXfer){(s - 1 + pp) % pp, op.micro, false, v, s == 0 ? v - 1 : v};
    } else {
        if (last_virtual(pp, vpp, s, v)) return false;
        *x = (PipeXfer){(s + 1) % pp, op.micro, true, v, s == pp - 1 ? v + 1 : v};
    }
    return true;
}

int pipeline_steps(int pp, int vpp, int stage, int M, bool forward_only, PipeStep *steps) {
    PipeOp *ops = mt_malloc(((size_t)M * 2 * (size_t)vpp + 1) * sizeof *ops);
    const int n = pipeline_schedule(pp, vpp, stage, M, forward_only, ops);
    if (n < 0) {
        free(ops);
        return -1;
    }
    /* op i >= warmup alternates forward, backward: with vpp > 1, each such forward and its backward are one
     * step (Megatron's interleaved steady state); with vpp 1 every op is its own step */
    const int warmup = pipeline_warmup(pp, vpp, stage, M, forward_only);
    int k = 0;
    for (int i = 0; i <= n;) {
        PipeStep *st = &steps[k];
        memset(st, 0, sizeof *st);
        if (k > 0) /* the previous step's ops' sends */
            for (int j = 0; j < steps[k - 1].num_ops; j++) {
                PipeXfer x;
                if (send_of(pp, vpp, stage, steps[k - 1].ops[j], &x)) st->sends[st->num_sends++] = x;
            }
        k++;
        if (i == n) break;
        /* this step's ops: one, or a forward and the backward right after it */
        st->ops[st->num_ops++] = ops[i++];
        if (vpp > 1 && st->ops[0].forward && i > warmup && i < n && !ops[i].forward) st->ops[st->num_ops++] = ops[i++];
        for (int j = 0; j < st->num_ops; j++) {
            PipeXfer x;
            if (recv_of(pp, vpp, stage, st->ops[j], &x)) st->recvs[st->num_recvs++] = x;
        }
    }
    free(ops);
    return k;
}

/* Transfers numbered over all ranks' steps: rank s's step i's j-th send (or receive) is at
 * offset[s] + i * PIPE_STEP_MAX + j of the arrays below. */
typedef struct Pairing {
    int *offset;
    int *send_peer_step, *send_peer_index; /* a send's receive: its step on the peer and its place there */
    int *recv_peer_step;                   /* a receive's send: its step on the peer */
} Pairing;

static int *slot(int *a, const int *offset, int s, int i, int j) { return &a[offset[s] + i * PIPE_STEP_MAX + j]; }

/* Walk rank a's sends to b and b's receives from a in order: they must be the same transfers. */
static int pair_ranks(int a, int b, PipeStep *const *steps, const int *n, Pairing *p, char *why, size_t whylen) {
    int i = 0, x = 0, j = 0, y = 0; /* rank a's step i, its send x; rank b's step j, its receive y */
    for (;;) {
        for (; i < n[a]; i++, x = 0) {
            while (x < steps[a][i].num_sends && steps[a][i].sends[x].peer != b) x++;
            if (x < steps[a][i].num_sends) break;
        }
        for (; j < n[b]; j++, y = 0) {
            while (y < steps[b][j].num_recvs && steps[b][j].recvs[y].peer != a) y++;
            if (y < steps[b][j].num_recvs) break;
        }
        if (i == n[a] && j == n[b]) return 0;
        if (i == n[a] || j == n[b]) {
            snprintf(why, whylen, "rank %d sends %s transfers to rank %d than rank %d receives from it", a,
                     i == n[a] ? "fewer" : "more", b, b);
            return -1;
        }
        const PipeXfer *s = &steps[a][i].sends[x], *r = &steps[b][j].recvs[y];
        if (s->micro != r->micro || s->backward != r->backward || s->chunk != r->peer_chunk ||
            s->peer_chunk != r->chunk) {
            snprintf(why, whylen, "rank %d's next send to rank %d is micro-batch %d chunk %d -> %d (%s), but rank %d's "
                     "next receive from it is micro-batch %d chunk %d -> %d (%s)", a, b, s->micro, s->chunk,
                     s->peer_chunk, s->backward ? "gradient" : "activation", b, r->micro, r->peer_chunk, r->chunk,
                     r->backward ? "gradient" : "activation");
            return -1;
        }
        *slot(p->send_peer_step, p->offset, a, i, x) = j;
        *slot(p->send_peer_index, p->offset, a, i, x++) = y;
        *slot(p->recv_peer_step, p->offset, b, j, y++) = i;
    }
}

/* Where the simulation stands: rank s is in the group of step pos[s] and has completed got[s] of its receives. */
typedef struct Progress {
    int *pos, *got;
} Progress;

/* A send is posted once its rank reaches its step (all of a group's sends go first). */
static bool send_posted(const Progress *g, int rank, int step) { return g->pos[rank] >= step; }

/* A receive is posted once the receives before it in its group have completed (they block in order). */
static bool recv_posted(const Progress *g, int rank, int step, int index) {
    return g->pos[rank] > step || (g->pos[rank] == step && g->got[rank] >= index);
}

/* Advance rank s as far as it can; returns whether it moved. */
static bool advance(int s, PipeStep *const *steps, const int *n, const Pairing *p, Progress *g) {
    bool moved = false;
    while (g->pos[s] < n[s]) {
        const int i = g->pos[s];
        const PipeStep *st = &steps[s][i];
        while (g->got[s] < st->num_recvs &&
               send_posted(g, st->recvs[g->got[s]].peer, *slot(p->recv_peer_step, p->offset, s, i, g->got[s]))) {
            g->got[s]++;
            moved = true;
        }
        if (g->got[s] < st->num_recvs) break;
        bool sent = true;
        for (int x = 0; x < st->num_sends && sent; x++)
            sent = recv_posted(g, st->sends[x].peer, *slot(p->send_peer_step, p->offset, s, i, x),
                               *slot(p->send_peer_index, p->offset, s, i, x));
        if (!sent) break;
        g->pos[s]++;
        g->got[s] = 0;
        moved = true;
    }
    return moved;
}

/* Why stuck rank s waits: its blocked receive, or the first of its sends not yet matched. */
static void explain(int s, PipeStep *const *steps, const Pairing *p, const Progress *g, char *why, size_t whylen) {
    const int i = g->pos[s];
    const PipeStep *st = &steps[s][i];
    const PipeXfer *x = NULL;
    bool is_send = false;
    if (g->got[s] < st->num_recvs) x = &st->recvs[g->got[s]];
    for (int k = 0; !x && k < st->num_sends; k++)
        if (!recv_posted(g, st->sends[k].peer, *slot(p->send_peer_step, p->offset, s, i, k),
                         *slot(p->send_peer_index, p->offset, s, i, k))) {
            x = &st->sends[k];
            is_send = true;
        }
    char what[96];
    if (st->num_ops == 0) snprintf(what, sizeof what, "its closing sends");
    else snprintf(what, sizeof what, "before its %s of micro-batch %d, chunk %d",
                  st->ops[0].forward ? "forward" : "backward", st->ops[0].micro, st->ops[0].chunk);
    snprintf(why, whylen, "rank %d waits forever at step %d (%s) for rank %d to %s micro-batch %d's %s", s, i, what,
             x->peer, is_send ? "receive" : "send", x->micro, x->backward ? "gradient" : "activation");
}

int pipeline_steps_check(int pp, PipeStep *const *steps, const int *n, char *why, size_t whylen) {
    Pairing p;
    p.offset = mt_malloc((size_t)(pp + 1) * sizeof(int));
    p.offset[0] = 0;
    for (int s = 0; s < pp; s++) p.offset[s + 1] = p.offset[s] + n[s] * PIPE_STEP_MAX;
    const size_t bytes = (size_t)p.offset[pp] * sizeof(int) + 1;
    p.send_peer_step = mt_malloc(bytes);
    p.send_peer_index = mt_malloc(bytes);
    p.recv_peer_step = mt_malloc(bytes);
    int rc = 0;
    for (int a = 0; a < pp && rc == 0; a++)
        for (int b = 0; b < pp && rc == 0; b++) rc = pair_ranks(a, b, steps, n, &p, why, whylen);
    Progress g = {mt_calloc((size_t)pp, sizeof(int)), mt_calloc((size_t)pp, sizeof(int))};
    for (bool moved = rc == 0; moved;) {
        moved = false;
        for (int s = 0; s < pp; s++) moved = advance(s, steps, n, &p, &g) || moved;
    }
    for (int s = 0; s < pp && rc == 0; s++)
        if (g.pos[s] < n[s]) {
            explain(s, steps, &p, &g, why, whylen);
            rc = -1;
        }
    free(g.pos);
    free(g.got);
    free(p.send_peer_step);
    free(p.send_peer_index);
    free(p.recv_peer_step);
    free(p.offset);
    return rc;
}

int pipeline_transfers_check(int pp, int vpp, int M, bool forward_only, char *why, size_t whylen) {
    PipeStep **steps = mt_malloc((size_t)pp * sizeof *steps);
    int *n = mt_malloc((size_t)pp * sizeof *n), rc = 0;
    for (int s = 0; s < pp; s++) {
        steps[s] = mt_malloc(((size_t)M * 2 * (size_t)vpp + 1) * sizeof **steps);
        n[s] = pipeline_steps(pp, vpp, s, M, forward_only, steps[s]);
        if (n[s] < 0 && rc == 0) {
            snprintf(why, whylen, "the schedule refuses pp %d, vpp %d with %d micro-batches", pp, vpp, M);
            rc = -1;
        }
    }
    if (rc == 0) rc = pipeline_steps_check(pp, steps, n, why, whylen);
    for (int s = 0; s < pp; s++) free(steps[s]);
    free(steps);
    free(n);
    return rc;
}
